//! The stall: a busy session silent for its timeout is aborted and continued.
//!
//! The stall clock (when it runs, its timeout — planning, a running tool's grace — and
//! the silence it measures, which blindness pauses), the recovery order it gives, and
//! what the recovery's report changes: attempts, back-off, giving up after
//! `max_auto_submits` or `max_session_age`, a turn cut off by a restart continued once.
//! Repeated continues escalate instead ([`escalation`](super::escalation)).

use super::*;

impl SessionCore {
    /// How long the session has been quiet: no activity, counted from when Shepherd last
    /// regained sight of it at the earliest (what the stall timer counts).
    pub fn quiet_for(&self, now: Now) -> Duration {
        now.mono.saturating_duration_since(self.silent_since())
    }

    /// Where the stall timer counts silence from: the last activity, or the moment the
    /// event stream came back if that is later (a session Shepherd could not see was not
    /// silent, only unseen).
    pub fn silent_since(&self) -> Instant {
        self.watched_since(self.last_activity)
    }

    /// `t`, or the moment sight came back if that is later.
    pub(super) fn watched_since(&self, t: Instant) -> Instant {
        self.sighted_at.map_or(t, |s| s.max(t))
    }

    /// The server's event stream went down: Shepherd is blind to this session. The
    /// clocks that measure its silence stop (stall, nudge, review, orphan) until
    /// [`SessionCore::on_sight`]; what the session does meanwhile is unknown, not quiet.
    pub fn on_blind(&mut self) {
        self.blind = true;
        self.idle_edge_since_blind = false;
    }

    /// The stream is back and the reconciliation has run (statuses applied, interrupted
    /// turns checked): silence is counted from now. Follow-ups and orphan waits that
    /// fell due while blind are decided now, on the reconciled facts.
    pub fn on_sight(&mut self, now: Now) {
        if self.blind {
            self.blind = false;
            self.sighted_at = Some(now.mono);
        }
    }

    /// The stall timeout in force while the stall timer runs — busy, not retrying, not
    /// paused, recovering, compacting, handed off, or waiting on a person — else `None`.
    /// A session past it that is still here is stalled (in back-off, postponed by
    /// advice, out of continues, or being looked at by the advisor).
    pub fn stall_clock(&self) -> Option<Duration> {
        let runs = self.busy == RunState::Busy
            && !self.blind
            && self.recovering.is_none()
            && self.pause.is_none()
            && self.waiting_on_person.is_empty()
            && !self.is_compacting()
            && !self.rollover.suspends_automation();
        runs.then(|| self.stall_timeout())
    }

    /// The session waits for a person: a question or permission is open, or it stopped
    /// with a reply that asks the person something.
    pub fn waits_on_person(&self) -> bool {
        !self.waiting_on_person.is_empty()
            || (self.busy == RunState::Idle && (self.last_reply.text_asks || self.last_reply.used_question_tool))
    }

    /// The stall timeout in force now.
    pub fn stall_timeout(&self) -> Duration {
        if self.waits_on_idle_children() {
            return self.cfg.orphan_wait;
        }
        if self.running_tools.is_empty() {
            if self.planning.active() {
                self.cfg.recovery.planning_timeout
            } else {
                self.cfg.recovery.stall_timeout
            }
        } else {
            self.cfg.recovery.stall_timeout.mul_f64(self.cfg.recovery.tool_grace_factor)
        }
    }

    pub(super) fn stall_deadline(&self) -> Option<Instant> {
        if self.compaction_in_flight || self.rollover.suspends_automation() {
            // Shepherd's own compaction is bounded by its call (`compaction.max_wait`); a
            // session being handed off is the hand-off's.
            return None;
        }
        if self.blind {
            return None; // unseen is not silent
        }
        if self.busy != RunState::Busy
            || self.recovering.is_some()
            || self.pause.is_some()
            || !self.waiting_on_person.is_empty()
        {
            return None;
        }
        if self.advice.pending() == Some(About::Abort) {
            return None; // the advisor is being asked
        }
        if self.rare().is_some_and(|r| !r.resuming.is_empty()) {
            return None; // an action left open is being finished: its outcome comes first
        }
        let stall_at = match self.compacting {
            // OpenCode's own compaction: bounded by `compaction.max_wait` from when it was
            // first seen; the summary's stream does not extend it (a summary is one model
            // call of bounded size, and one that streams forever must end too).
            Some(since) => self.watched_since(since) + self.cfg.compaction.max_wait,
            None => self.silent_since() + self.stall_timeout(),
        };
        let stall_at = self.advice.postponed(stall_at);
        // An action whose answer was lost is verified first: a new recovery before that
        // (`abort_poll_max` ≥ the stall timeout) and the verification could each send a
        // continue for the same stall.
        let stall_at = match self.verify {
            Verify::Nothing => stall_at,
            Verify::At(at) => at.max(stall_at),
            Verify::Finding => return None,
        };
        Some(self.backoff_until.map_or(stall_at, |b| b.max(stall_at)))
    }

    pub(super) fn on_stall_deadline(&mut self, now: Now) -> Vec<Effect> {
        let Some(deadline) = self.stall_deadline() else { return Vec::new() };
        if now.mono < deadline {
            return Vec::new();
        }
        let cfg = Arc::clone(&self.cfg);
        let idle_for = now.mono.saturating_duration_since(self.silent_since());
        // OpenCode's own compaction past its bound, measured from when it was first seen.
        let compacting_for = self.compacting.map(|since| now.mono.saturating_duration_since(since));
        let base = Numbers {
            idle_for_ms: Some(ms(idle_for)),
            timeout_ms: Some(ms(if compacting_for.is_some() { cfg.compaction.max_wait } else { self.stall_timeout() })),
            compacting_for_ms: compacting_for.map(ms),
            running_tools: Some(self.running_tools.len() as u32),
            attempt: Some(self.attempts + 1),
            max_attempts: Some(cfg.recovery.max_auto_submits),
            auto_submits: Some(self.auto_submits),
            last_part: self.last_part.clone(),
            late_ms: Some(ms(now.mono.saturating_duration_since(deadline))),
            ..Numbers::default()
        };

        let (count, window) = (cfg.recovery.repeated_continue_count, cfg.recovery.repeated_continue_window);
        if let Some(continues) = self.rare_mut().continues.escalation_due(now.mono, count, window) {
            // The escalation aborts too: it is asked about like any recovery's abort.
            if let Some(ask) = self.advice_before_abort(now) {
                return vec![ask];
            }
            return self.escalate(continues, base, now);
        }
        if self.attempts >= cfg.recovery.max_recoveries && self.backoff_until.is_none() {
            let exp = (self.attempts - cfg.recovery.max_recoveries).min(20);
            let backoff = cfg.recovery.cooldown.saturating_mul(1u32 << exp).min(cfg.recovery.max_backoff);
            self.backoff_until = Some(now.mono + backoff);
            let numbers = Numbers { backoff_ms: Some(ms(backoff)), ..base };
            return vec![self.record(
                Action::Backoff,
                Outcome::Done,
                "stalled again after max_recoveries recoveries: backing off before the next",
                numbers,
                now,
            )];
        }
        // Abandoned: no real progress for `max_session_age` (not how long ago it was
        // created: an agent that works for hours and then stalls is recovered). A time
        // Shepherd could not see the session counts as unknown, not as no progress.
        let without_progress = now.mono.saturating_duration_since(self.watched_since(self.progress_at));
        if without_progress > cfg.recovery.max_session_age {
            self.pause = Some(Pause::GaveUp);
            self.touch();
            let numbers = Numbers {
                without_progress_ms: Some(ms(without_progress)),
                age_ms: self.created_ms.map(|c| now.wall_ms.saturating_sub(c).max(0) as u64),
                ..base
            };
            return vec![self.record(
                Action::GiveUp,
                Outcome::Done,
                "stalled with no real progress for longer than max_session_age (abandoned): not recovering",
                numbers,
                now,
            )];
        }
        if self.auto_submits >= cfg.recovery.max_auto_submits {
            self.pause = Some(Pause::GaveUp);
            self.touch();
            return vec![self.record(
                Action::GiveUp,
                Outcome::Done,
                "stalled again after max_auto_submits continues without progress",
                base,
                now,
            )];
        }

        if let Some(ask) = self.advice_before_abort(now) {
            return vec![ask];
        }
        self.attempts += 1;
        self.auto_submits += 1;
        self.touch();
        self.backoff_until = None;
        let aborted_message = self.last_assistant.as_deref().map(str::to_string);
        self.recovering = Some(Box::new(Recovering { aborted_message, escalation: None }));
        let reason = if self.compacting.is_some() {
            "OpenCode's compaction ran past compaction.max_wait (counted from when it was first seen): treating it as a stall"
        } else if self.waits_on_idle_children() {
            "busy on a subagent task while every subagent is idle, for orphan_wait: the parent is orphaned"
        } else if self.running_tools.is_empty() && self.planning.active() {
            "planning with no progress for recovery.planning_timeout"
        } else if self.running_tools.is_empty() {
            "busy with no progress for the stall timeout"
        } else {
            "busy with a running tool and no progress for the stall timeout × tool_grace_factor"
        };
        vec![
            self.record(Action::StallDetected, Outcome::Done, reason, base, now),
            Effect::Recover(RecoveryOrder {
                compact_first: self
                    .past_hard()
                    .then(|| self.model.clone().map(|m| (m, self.cfg.compaction.max_wait)))
                    .flatten(),
                ..self.recovery_order(self.attempts, None, now)
            }),
        ]
    }

    /// The abort + continue order every recovery starts from: this session, the given
    /// attempt, what the core knows of its todos and turn, a decision id (`tag` names the
    /// kind when it is not a plain stall), an abort followed by its continue.
    pub(super) fn recovery_order(&self, attempt: u32, tag: Option<&str>, now: Now) -> RecoveryOrder {
        let decision = match tag {
            Some(tag) => format!("{}-{tag}-{}", self.id, now.wall_ms),
            None => format!("{}-{}", self.id, now.wall_ms),
        };
        RecoveryOrder {
            session_id: self.id.to_string(),
            directory: self.directory.as_deref().map(str::to_string),
            attempt,
            known_todos: self.todos.to_vec(),
            known_turn: self.turn.clone(),
            decision,
            decided_ms: now.wall_ms,
            compact_first: None,
            continue_after: true,
            planning: self.planning.active(),
            escalation: None,
        }
    }

    /// Feeds the recovery procedure's result in.
    pub fn on_recovery_finished(&mut self, report: &RecoveryReport, now: Now) -> Vec<Effect> {
        let (aborted, escalation) = match self.recovering.take() {
            Some(r) => (r.aborted_message, r.escalation),
            None => (None, None),
        };
        let numbers = Numbers {
            attempt: Some(self.attempts),
            max_attempts: Some(self.cfg.recovery.max_auto_submits),
            ..Numbers::default()
        };
        let mut out = Vec::new();
        match report {
            RecoveryReport::NotBusy
            | RecoveryReport::StatusUnavailable(_)
            | RecoveryReport::AbortFailed(_)
            | RecoveryReport::NotOurs(_)
            | RecoveryReport::Cancelled => {
                // Nothing reached the session: the attempt does not count.
                self.attempts = self.attempts.saturating_sub(1);
                self.auto_submits = self.auto_submits.saturating_sub(1);
                self.touch();
                self.activity(now);
                let (outcome, reason) = match report {
                    RecoveryReport::NotBusy if self.blind => {
                        // A server that restarted lists nothing: while the stream is down
                        // the reconciliation, not this answer, says how the turn ended.
                        (Outcome::Declined, "the status endpoint says the session is not busy, but the event stream is down: the reconciliation will tell".to_string())
                    }
                    RecoveryReport::NotBusy => {
                        // The turn ended unseen: what it ran or waited on ended with it
                        // (as at an idle event), or a stale request would hold the stall
                        // clock off through the next turn.
                        self.busy = RunState::Idle;
                        self.running_tools = Open::default();
                        self.waiting_on_person = Open::default();
                        (Outcome::Declined, "the status endpoint says the session is no longer busy".to_string())
                    }
                    RecoveryReport::StatusUnavailable(e) => {
                        (Outcome::Failed, format!("could not confirm the session is busy ({e}); not aborting"))
                    }
                    RecoveryReport::AbortFailed(e) => {
                        self.verify_later(e, now);
                        (Outcome::Failed, format!("abort request failed: {e}"))
                    }
                    RecoveryReport::NotOurs(holder) => {
                        // Its abort is about to arrive: not the person's.
                        self.recovery_ended = Some(Box::new((now.mono, aborted.clone())));
                        (Outcome::Declined, format!("another Shepherd instance ({holder}) acts for this session"))
                    }
                    _ => (Outcome::Declined, "shutting down: nothing was sent".to_string()),
                };
                out.push(self.record(Action::Recover, outcome, &reason, numbers, now));
            }
            RecoveryReport::Continued { idle_after_ms, open_todos, compacted, tool_call_as_text, waited_ms } => {
                self.recovery_ended = Some(Box::new((now.mono, aborted)));
                self.rare_mut().continues.on_continue(now.mono);
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                let abort_reason = match idle_after_ms {
                    Some(_) => "stalled session aborted; it went idle",
                    None => "stalled session aborted; still busy after abort_poll_max, continuing anyway",
                };
                out.push(self.record(Action::Abort, Outcome::Done, abort_reason, abort_numbers, now));
                if let Some(result) = compacted {
                    let n = Numbers {
                        context_tokens: self.context_tokens,
                        context_window: self.window,
                        ..Numbers::default()
                    };
                    let why = match escalation {
                        Some(_) => "escalation of repeated continues",
                        None => "past handoff.hard",
                    };
                    out.push(match result {
                        Ok(()) => {
                            self.context_tokens = None;
                            let reason = format!("{why}: compacted before the continue");
                            self.record(Action::Compact, Outcome::Done, &reason, n, now)
                        }
                        Err(e) => {
                            let reason =
                                format!("{why}: compaction before the continue failed ({e}); continuing anyway");
                            self.record(Action::Compact, Outcome::Failed, &reason, n, now)
                        }
                    });
                }
                let numbers = Numbers { open_todos: Some(*open_todos), ..numbers };
                let held = match waited_ms {
                    0 => String::new(),
                    ms => format!(" (held {ms} ms by the guard's rate limit)"),
                };
                let reason = match tool_call_as_text {
                    Some(found) => format!(
                        "tool-call-as-text prompt sent after the abort: the model wrote {} as text ({}){held}",
                        found.pattern, found.excerpt
                    ),
                    None => format!("continue sent after the abort{held}"),
                };
                out.push(self.record(Action::Continue, Outcome::Done, &reason, numbers, now));
            }
            RecoveryReport::AbortedOnly { idle_after_ms } => {
                self.recovery_ended = Some(Box::new((now.mono, aborted)));
                let numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers };
                out.push(self.record(
                    Action::Abort,
                    Outcome::Done,
                    "aborted; no continue (automation stopped for this session)",
                    numbers,
                    now,
                ));
            }
            RecoveryReport::ContinueDeclined { idle_after_ms, reason } => {
                self.recovery_ended = Some(Box::new((now.mono, aborted)));
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                out.push(self.record(Action::Abort, Outcome::Done, "stalled session aborted", abort_numbers, now));
                out.push(self.record(Action::Continue, Outcome::Declined, reason, numbers, now));
            }
            RecoveryReport::ContinueFailed { idle_after_ms, error } => {
                self.verify_later(error, now);
                self.recovery_ended = Some(Box::new((now.mono, aborted)));
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                out.push(self.record(Action::Abort, Outcome::Done, "stalled session aborted", abort_numbers, now));
                let reason = format!("abort sent but the continue was not: {error}");
                out.push(self.record(Action::Continue, Outcome::Failed, &reason, numbers, now));
            }
        }
        out
    }

    /// After a reconnect: this session was busy before, the server no longer says so,
    /// and its last assistant message was cut off mid-flight — OpenCode restarted under
    /// it. Continue it, once per interrupted message.
    pub fn on_interrupted(&mut self, message_id: &str, now: Now) -> Vec<Effect> {
        if self.rare().and_then(|r| r.interrupted_continued.as_deref()) == Some(message_id) {
            return Vec::new();
        }
        if let Some(p) = self.pause {
            let reason = format!("interrupted by a server restart, but automation is paused ({})", p.as_str());
            return vec![self.record(Action::Recover, Outcome::Declined, &reason, Numbers::default(), now)];
        }
        self.rare_mut().interrupted_continued = Some(message_id.to_string());
        self.touch();
        let order = self.continue_when_idle("interrupted", now);
        vec![
            self.record(
                Action::Recover,
                Outcome::Done,
                "the turn was cut off by a server restart (no completion, no error): continuing it once",
                Numbers { open_todos: Some(self.open_todos()), ..Numbers::default() },
                now,
            ),
            Effect::Prompt(order),
        ]
    }

    /// A continue for an idle session that was left hanging (orphaned parent, turn
    /// cut off by a restart): no abort needed, delivered only if still idle.
    pub(super) fn continue_when_idle(&self, why: &str, now: Now) -> PromptOrder {
        let planning = self.planning.active();
        let r = &self.cfg.recovery;
        PromptOrder {
            session_id: self.id.to_string(),
            directory: self.directory.as_deref().map(str::to_string),
            kind: PromptKind::Continue,
            template: if planning {
                r.continue_with_plan_message.clone()
            } else {
                r.continue_with_todos_message.clone()
            },
            template_without_open_todos: (!planning).then(|| r.continue_message.clone()),
            facts: PromptFacts {
                attempts: self.attempts + 1,
                max_attempts: self.cfg.recovery.max_auto_submits,
                context_summary: String::new(),
            },
            known_todos: self.todos.to_vec(),
            known_turn: self.turn.clone(),
            require_idle: true,
            require_open_todos: false,
            decision: format!("{}-{why}-{}", self.id, now.wall_ms),
            not_before_ms: None,
            tool_text_scan: ToolTextScan::from_config(&self.cfg.recovery),
            model: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn a_busy_session_silent_for_the_stall_timeout_is_recovered() {
        let mut b = Bench::new();
        b.busy(0);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(180)));
        assert!(b.tick(179).is_empty());
        let effects = b.tick(180);
        assert!(recovers(&effects));
        assert_eq!(actions(&effects), vec![Action::StallDetected]);
    }

    /// With `abort_poll_max` longer than the stall timeout, an abort whose answer was
    /// lost is verified before the session can be called stalled again: the verification
    /// and a second recovery would each send a continue for one stall.
    #[test]
    fn no_second_recovery_starts_while_a_lost_abort_is_being_verified() {
        let mut b = Bench::with(RecoveryConfig {
            stall_timeout: Duration::from_secs(60),
            abort_poll_max: Duration::from_secs(90),
            ..RecoveryConfig::default()
        });
        b.busy(0);
        assert!(recovers(&b.tick(60)));
        let lost = RecoveryReport::AbortFailed(EngineError::Unreachable("timed out".into()));
        b.core.on_recovery_finished(&lost, b.at(61));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(151)), "the verification comes first");
        assert!(!recovers(&b.tick(121)), "no recovery before the verification");
        let effects = b.tick(151);
        assert!(effects.iter().any(|e| matches!(e, Effect::FindIntents)));
        assert!(!recovers(&effects));
        assert_eq!(b.core.deadline(), None, "nothing until the ledger answers");
        // The intent was closed meanwhile (another path finished it): the stall clock runs again.
        assert!(b.core.on_open_intents(vec![], b.at(152)).is_empty());
        assert!(recovers(&b.tick(152)), "still stalled, recovered once the verification is over");
    }

    #[test]
    fn activity_pushes_the_stall_deadline_back() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(100, DELTA);
        assert!(b.tick(180).is_empty());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(280)));
    }

    #[test]
    fn a_running_tool_extends_the_timeout_by_the_grace_factor() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(0, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_T","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{"status":"running"}}}}"#);
        assert!(b.tick(180).is_empty());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(720)));
        assert!(recovers(&b.tick(720)));
    }

    #[test]
    fn a_pending_question_is_never_a_stall() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1, r#"{"type":"question.asked","properties":{"id":"que_1","sessionID":"ses_A","questions":[]}}"#);
        assert_eq!(b.core.deadline(), None);
        assert!(b.tick(10_000).is_empty());
        b.feed(
            20_000,
            r#"{"type":"question.replied","properties":{"sessionID":"ses_A","requestID":"que_1","answers":[["A"]]}}"#,
        );
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(20_180)));
    }

    #[test]
    fn the_stall_clock_runs_while_busy_and_stops_while_a_person_is_asked() {
        let mut b = Bench::new();
        assert_eq!(b.core.stall_clock(), None, "idle: no stall timer");
        b.busy(0);
        assert_eq!(b.core.stall_clock(), Some(Duration::from_secs(180)));
        assert_eq!(b.core.quiet_for(b.at(45)), Duration::from_secs(45));
        assert!(!b.core.waits_on_person());
        b.feed(50, r#"{"type":"question.asked","properties":{"id":"que_1","sessionID":"ses_A","questions":[]}}"#);
        assert_eq!(b.core.stall_clock(), None);
        assert!(b.core.waits_on_person());
        assert_eq!(b.core.quiet_for(b.at(60)), Duration::from_secs(10), "the question was activity");
    }

    #[test]
    fn retry_is_opencodes_own_wait_and_not_a_stall() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"retry","attempt":1,"message":"x","next":5}}}"#);
        assert_eq!(b.core.deadline(), None);
    }

    #[test]
    fn after_max_auto_submits_without_progress_shepherd_gives_up() {
        let mut b =
            Bench::with(RecoveryConfig { max_recoveries: 10, max_auto_submits: 2, ..RecoveryConfig::default() });
        b.busy(0);
        let mut t = 0;
        for _ in 0..2 {
            t += 180;
            assert!(recovers(&b.tick(t)));
            b.recovered(t);
        }
        t += 180;
        let effects = b.tick(t);
        assert_eq!(actions(&effects), vec![Action::GiveUp]);
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    #[test]
    fn after_max_recoveries_the_next_recovery_backs_off_exponentially() {
        let mut b =
            Bench::with(RecoveryConfig { max_recoveries: 1, max_auto_submits: 10, ..RecoveryConfig::default() });
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(180);
        let effects = b.tick(360);
        assert_eq!(actions(&effects), vec![Action::Backoff]);
        let Effect::Record(r) = &effects[0] else { panic!() };
        assert_eq!(r.numbers.backoff_ms, Some(60_000));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(420)));
        assert!(recovers(&b.tick(420)));
        b.recovered(420);
        let Effect::Record(r) = &b.tick(600)[0] else { panic!() };
        assert_eq!(r.numbers.backoff_ms, Some(120_000), "doubles");
    }

    #[test]
    fn real_progress_resets_the_attempts() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(180);
        b.feed(181, r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"completed","priority":"high"}]}}"#);
        assert_eq!(b.core.attempts(), 0);
    }

    #[test]
    fn a_session_created_three_hours_ago_that_progressed_a_minute_ago_and_stalls_is_recovered() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(3 * 3600 - 60, TODO_PROGRESS);
        let effects = b.tick(3 * 3600 - 60 + 180);
        assert!(recovers(&effects), "{effects:?}");
        assert_eq!(actions(&effects), vec![Action::StallDetected]);
    }

    #[test]
    fn a_session_without_real_progress_for_longer_than_max_session_age_is_given_up() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1000, TODO_PROGRESS);
        // Activity without progress (deltas) for more than two hours, then silence.
        b.feed(8300, DELTA);
        let effects = b.tick(8300 + 180);
        assert!(!recovers(&effects));
        let r = record_of(&effects, Action::GiveUp);
        assert!(r.reason.contains("no real progress") && r.reason.contains("max_session_age"), "{}", r.reason);
        assert_eq!(r.numbers.without_progress_ms, Some(7_480_000), "since the last progress");
        assert_eq!(r.numbers.age_ms, Some(8_480_000), "since creation");
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    #[test]
    fn a_stall_timer_that_would_fire_while_the_stream_is_down_does_not() {
        let mut b = Bench::new();
        b.busy(0);
        b.core.on_blind();
        assert_eq!(b.core.deadline(), None, "no timer while blind");
        assert!(b.tick(180).is_empty());
        assert!(b.tick(3600).is_empty());
        assert_eq!(b.core.stall_clock(), None, "not shown as stalled either");
    }

    #[test]
    fn after_the_stream_is_back_a_still_busy_silent_session_is_recovered_after_a_full_stall_timeout() {
        let mut b = Bench::new();
        b.busy(0);
        b.core.on_blind();
        let back = b.at(500);
        b.core.on_sight(back);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(500 + 180)));
        assert!(b.tick(679).is_empty());
        let effects = b.tick(680);
        assert!(recovers(&effects));
        let r = record_of(&effects, Action::StallDetected);
        assert_eq!(r.numbers.idle_for_ms, Some(180_000), "silence counted from the stream's return");
    }

    /// The record says how long after its deadline a stall was looked at: what the
    /// timer's lateness and the wait for stream time cost (`shepherd_stall_detection_delay_seconds`).
    #[test]
    fn a_stall_looked_at_after_its_deadline_records_how_late() {
        let mut b = Bench::new();
        b.busy(0);
        let on_time = b.tick(180);
        assert_eq!(record_of(&on_time, Action::StallDetected).numbers.late_ms, Some(0));

        let mut b = Bench::new();
        b.busy(0);
        let effects = b.tick_ms(180_250);
        let r = record_of(&effects, Action::StallDetected);
        assert_eq!(r.numbers.late_ms, Some(250));
        assert_eq!(r.numbers.idle_for_ms, Some(180_250));
    }

    #[test]
    fn a_turn_cut_off_while_blind_is_continued_even_if_a_recovery_then_finds_it_not_busy() {
        // The stall fired just before the stream broke; its status check reached the
        // restarted server, which lists nothing.
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.core.on_blind();
        let effects = b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(190));
        assert_eq!(actions(&effects), vec![Action::Recover]);
        assert!(b.core.is_busy(), "the reconciliation, not this answer, tells how the turn ended");
        // The reconciliation: the last turn was cut off.
        let effects = b.core.on_interrupted("msg_B", b.at(200));
        assert!(effects.iter().any(|e| matches!(e, Effect::Prompt(o) if o.kind == PromptKind::Continue)));
    }

    #[test]
    fn a_session_first_seen_long_after_its_creation_counts_from_first_sight() {
        let mut b = Bench::new();
        // Created five hours before Shepherd saw it (mid-flight, or after a restart).
        b.core.hydrate(&SessionInfo {
            id: "ses_A".into(),
            parent_id: None,
            directory: Some("/p".into()),
            title: None,
            time: crate::event::Times { created: Some(CREATED_MS - 5 * 3600 * 1000), ..Default::default() },
            metadata: None,
        });
        b.busy(0);
        assert!(recovers(&b.tick(180)), "not abandoned: Shepherd has watched it for three minutes");
    }

    #[test]
    fn a_recovery_that_found_the_session_idle_does_not_count_as_an_attempt() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        let effects = b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(181));
        assert_eq!(actions(&effects), vec![Action::Recover]);
        assert_eq!(b.core.attempts(), 0);
        assert!(!b.core.is_busy());
    }

    #[test]
    fn a_recovery_that_found_the_session_idle_forgets_what_the_turn_waited_on() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.feed(180, r#"{"type":"permission.asked","properties":{"id":"per_1","sessionID":"ses_A"}}"#);
        b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(181));
        b.busy(200);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(380)), "the next turn has its stall clock");
    }

    #[test]
    fn a_planning_session_gets_the_planning_timeout_and_the_plan_continue() {
        let mut b = bench(|r| {
            r.recovery.stall_timeout = Duration::from_secs(180);
            r.recovery.planning_timeout = Duration::from_secs(300);
        });
        b.user_turn(0, "msg_U", "plan");
        b.busy(0);
        assert!(b.core.is_planning());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(300)));
        assert!(order(&b.tick(180)).is_none(), "the stall timeout does not apply");
        let effects = b.tick(300);
        let o = order(&effects).expect("recovered at the planning timeout");
        assert!(o.planning, "the continue asks to finish the plan");
        assert!(record(&effects, Action::StallDetected).reason.contains("planning"));
    }

    #[test]
    fn stalls_record_the_last_part_type() {
        let mut b = bench(|_| {});
        b.busy(0);
        b.feed(1, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_r","messageID":"msg_A","sessionID":"ses_A","type":"reasoning","text":"hmm"}}}"#);
        let effects = b.tick(181);
        assert_eq!(record(&effects, Action::StallDetected).numbers.last_part.as_deref(), Some("reasoning"));
    }
}
