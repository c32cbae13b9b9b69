//! Nudge and review: the follow-ups `session::followup` decides, on their way out —
//! asked of the advisor first, held behind a compaction past the hard gate or the
//! opportunistic threshold, bounded in rounds — and what their delivery reports
//! change. A person's custom prompt takes the same road (`custom_order`).

use super::*;

impl SessionCore {
    /// Turns a follow-up decision into a prompt order or a record. The prompt waits
    /// behind a compaction past the hard threshold (the hard gate), or past
    /// `compaction.opportunistic` outside the cooldown (the session is idle anyway: a
    /// cheap moment to compact). Either way it is sent whatever the compaction gives, so
    /// the session is never stranded.
    pub(super) fn decision_effects(&mut self, d: Decision, now: Now) -> Vec<Effect> {
        if let Some(ask) = self.advice_before_nudge(&d, now) {
            return vec![ask];
        }
        self.decision_effects_advised(d, now)
    }

    pub(super) fn decision_effects_advised(&mut self, d: Decision, now: Now) -> Vec<Effect> {
        let mut effects = self.decision_effects_ungated(d, now);
        let back = match effects.as_mut_slice() {
            [Effect::Prompt(order)] => self.back_on_own_model(order, now),
            _ => None,
        };
        let gate = if self.compaction_in_flight {
            None
        } else if self.past_hard() {
            Some("past handoff.hard")
        } else if self.opportune_compaction(now) {
            Some("past compaction.opportunistic, idle")
        } else {
            None
        };
        let gated = match (gate, self.model.clone(), effects.as_slice()) {
            (Some(why), Some(model), [Effect::Prompt(order)]) => {
                self.held_prompt = Some(Box::new(order.clone()));
                self.compaction_in_flight = true;
                self.last_compaction = Some(now.mono);
                let reason = format!("{why}: compacting before the {}", order.kind.as_str());
                vec![Effect::Compact(CompactOrder { session_id: self.id.clone(), model, reason })]
            }
            _ => effects,
        };
        back.into_iter().chain(gated).collect()
    }

    pub(super) fn decision_effects_ungated(&self, d: Decision, now: Now) -> Vec<Effect> {
        match d {
            Decision::Send { kind, round } => {
                let template = match kind {
                    PromptKind::Review => self.cfg.review.message.clone(),
                    _ => self.cfg.nudge.message.clone(),
                };
                vec![Effect::Prompt(PromptOrder {
                    session_id: self.id.clone(),
                    directory: self.directory.clone(),
                    kind,
                    template,
                    template_without_open_todos: None,
                    facts: PromptFacts {
                        attempts: round,
                        max_attempts: self.max_rounds(kind),
                        context_summary: String::new(),
                    },
                    known_todos: self.todos.to_vec(),
                    known_turn: self.turn.clone(),
                    require_idle: true,
                    require_open_todos: kind == PromptKind::Nudge,
                    decision: format!("{}-{}-{}", self.id, kind.as_str(), now.wall_ms),
                    not_before_ms: None,
                    tool_text_scan: (kind == PromptKind::Nudge)
                        .then(|| ToolTextScan::from_config(&self.cfg.recovery))
                        .flatten(),
                    model: None,
                })]
            }
            Decision::Decline { kind, reason, round } => {
                let numbers = Numbers { round: Some(round), open_todos: Some(self.open_todos()), ..Numbers::default() };
                vec![self.record(action_of(kind), Outcome::Declined, &reason, numbers, now)]
            }
        }
    }

    pub(super) fn max_rounds(&self, kind: PromptKind) -> u32 {
        match kind {
            PromptKind::Review => self.cfg.review.max_rounds,
            PromptKind::Nudge => self.cfg.nudge.max_without_progress,
            _ => self.cfg.recovery.max_auto_submits,
        }
    }

    /// A delivery (nudge, review or custom prompt) ended.
    pub fn on_prompt_finished(&mut self, order: &PromptOrder, delivery: &Delivery, now: Now) -> Vec<Effect> {
        let sent = matches!(delivery, Delivery::Sent { .. });
        let retry_after_ms = match delivery {
            Delivery::Guarded { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        };
        let delivered = match (sent, retry_after_ms) {
            (true, _) => Delivered::Sent,
            (false, Some(ms)) => Delivered::Deferred { retry_at: now.mono + Duration::from_millis(ms.max(1)) },
            (false, None) => Delivered::NotSent,
        };
        self.followup.on_delivered(order.kind, delivered);
        let resume = self.on_resume_delivered(order, delivery, now);
        if sent && order.kind == PromptKind::Continue && !resume {
            self.continues.on_continue(now.mono);
        }
        let (outcome, reason) = match delivery {
            Delivery::Sent { tool_call_as_text: Some(found), .. } => (
                Outcome::Done,
                format!(
                    "{} sent as the tool-call-as-text prompt: the model wrote {} as text ({})",
                    order.kind.as_str(),
                    found.pattern,
                    found.excerpt
                ),
            ),
            Delivery::Sent { waited_ms: 0, .. } => (Outcome::Done, format!("{} sent", order.kind.as_str())),
            Delivery::Sent { waited_ms, .. } => {
                (Outcome::Done, format!("{} sent (held {waited_ms} ms by the guard's rate limit)", order.kind.as_str()))
            }
            Delivery::Skipped { reason, .. } => (Outcome::Declined, (*reason).to_string()),
            Delivery::Guarded { reason, .. } => (Outcome::Declined, reason.clone()),
            Delivery::Failed { error } => {
                self.verify_later(error, now);
                (Outcome::Failed, format!("could not send: {error}"))
            }
        };
        let open = match delivery {
            Delivery::Sent { todos, .. } | Delivery::Skipped { todos, .. } | Delivery::Guarded { todos, .. } => {
                todos.iter().filter(|t| t.status.is_open()).count() as u32
            }
            Delivery::Failed { .. } => self.open_todos(),
        };
        let numbers = Numbers {
            round: Some(order.facts.attempts),
            open_todos: Some(open),
            backoff_ms: retry_after_ms,
            ..Numbers::default()
        };
        vec![self.record(action_of(order.kind), outcome, &reason, numbers, now)]
    }

    /// A person's or tool's prompt through the control API: the order to deliver.
    pub fn custom_order(&self, template: String, now: Now) -> PromptOrder {
        PromptOrder {
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            kind: PromptKind::Custom,
            template,
            template_without_open_todos: None,
            facts: PromptFacts {
                attempts: self.attempts,
                max_attempts: self.cfg.recovery.max_auto_submits,
                context_summary: self.context_summary(now),
            },
            known_todos: self.todos.to_vec(),
            known_turn: self.turn.clone(),
            require_idle: false,
            require_open_todos: false,
            decision: format!("{}-custom-{}", self.id, now.wall_ms),
            not_before_ms: None,
            tool_text_scan: None,
            model: None,
        }
    }

    /// A short account of the session's state, for `{contextSummary}`.
    pub fn context_summary(&self, now: Now) -> String {
        let state = match (self.busy, self.pause) {
            (_, Some(p)) => format!("paused ({})", p.as_str()),
            (RunState::Idle, None) => "idle".to_string(),
            (RunState::Busy, None) => "busy".to_string(),
            (RunState::Retry, None) => "retrying a model call".to_string(),
        };
        let quiet_s = now.mono.duration_since(self.last_activity).as_secs();
        format!(
            "Session is {state}; last activity {quiet_s}s ago; {} of {} todos open; {} recovery attempt(s) since the last progress.",
            self.open_todos(),
            self.todos.len(),
            self.attempts
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;
    use crate::session::textual_tool_call::TextualToolCall;

    #[test]
    fn idle_with_open_todos_is_nudged_once_per_idle_edge_after_the_delay() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(600)));
        assert!(prompts(&b.tick_ms(599)).is_empty());
        b.idle_ms(550); // a repeated idle event does not re-arm
        let effects = b.tick_ms(600);
        assert_eq!(prompts(&effects), vec![PromptKind::Nudge]);
        let Effect::Prompt(order) = &effects[0] else { panic!() };
        assert!(order.require_idle && order.require_open_todos);
        assert_eq!(order.template, NudgeConfig::default().message);
        b.deliver(600, &effects);
        assert!(prompts(&b.tick_ms(5_000)).is_empty(), "no second nudge without a new edge");
    }

    #[test]
    fn a_nudge_due_while_the_stream_is_down_waits_for_the_reconciled_facts() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        b.core.on_blind();
        assert_eq!(b.core.deadline(), None, "no nudge timer while blind");
        assert!(prompts(&b.tick_ms(5_000)).is_empty());
        // The reconciliation found it busy again (the person wrote meanwhile): no nudge.
        let effects = b
            .feed_ms(6_000, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        let back = b.at_ms(6_000);
        b.core.on_sight(back);
        assert_eq!(declined(&effects), vec!["the session went busy again".to_string()]);
        assert!(prompts(&b.tick_ms(7_000)).is_empty());
    }

    #[test]
    fn a_nudge_that_fell_due_while_blind_is_sent_once_the_stream_is_back_and_the_session_still_idle() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        b.core.on_blind();
        let back = b.at_ms(6_000);
        b.core.on_sight(back);
        assert!(b.core.deadline().is_some_and(|d| d <= back.mono), "due at once");
        assert_eq!(prompts(&b.tick_ms(6_000)), vec![PromptKind::Nudge]);
    }

    #[test]
    fn a_session_that_goes_busy_again_is_not_nudged_and_that_is_logged() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "Next step.", "stop");
        let effects =
            b.feed_ms(300, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        assert_eq!(declined(&effects), vec!["the session went busy again".to_string()]);
        assert!(prompts(&b.tick_ms(600)).is_empty());
    }

    #[test]
    fn no_nudge_when_the_last_reply_asks_the_person_a_question() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "I can use SQLite or Postgres. Which do you prefer?", "stop");
        let effects = b.tick_ms(600);
        assert!(prompts(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["the last reply asks the person a question".to_string()]);
    }

    #[test]
    fn no_nudge_after_a_user_abort_until_the_person_writes() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.feed_ms(
            50,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        b.turn_ms(100, "msg_1", "Stopped.", "stop");
        let effects = b.tick_ms(600);
        assert!(prompts(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["automation is paused (user_abort)".to_string()]);
    }

    #[test]
    fn no_nudge_when_the_reply_did_not_finish_normally() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "partial", "length");
        assert!(declined(&b.tick_ms(600))[0].starts_with("the last reply did not finish normally"));
    }

    #[test]
    fn nudging_stops_after_max_without_progress_and_resumes_when_a_todo_changes() {
        let mut r = rules();
        r.nudge.cooldown = Duration::ZERO;
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["pending", "pending"]);
        let mut t = 100;
        for round in 1..=3 {
            b.turn_ms(t, &format!("msg_{round}"), "Still on it.", "stop");
            let effects = b.tick_ms(t + 500);
            assert_eq!(prompts(&effects), vec![PromptKind::Nudge], "round {round}");
            b.deliver(t + 500, &effects);
            t += 1000;
        }
        b.turn_ms(t, "msg_4", "Still on it.", "stop");
        let effects = b.tick_ms(t + 500);
        assert!(prompts(&effects).is_empty());
        assert!(declined(&effects)[0].contains("3 nudges without progress"));
        t += 1000;
        b.todos_ms(t, &["completed", "pending"]);
        b.turn_ms(t, "msg_5", "One done.", "stop");
        assert_eq!(prompts(&b.tick_ms(t + 500)), vec![PromptKind::Nudge], "progress resumes nudging");
    }

    #[test]
    fn the_nudge_cooldown_and_a_recent_person_hold_nudges_back() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "a", "stop");
        let effects = b.tick_ms(600);
        b.deliver(600, &effects);
        b.turn_ms(1000, "msg_2", "b", "stop");
        assert_eq!(declined(&b.tick_ms(1500)), vec!["within nudge.cooldown of the previous nudge".to_string()]);

        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.feed_ms(10, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(10, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pu","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"please"}}}"#);
        b.turn_ms(100, "msg_1", "ok", "stop");
        assert_eq!(declined(&b.tick_ms(600)), vec!["the person wrote within nudge.user_quiet".to_string()]);
    }

    #[test]
    fn review_fires_once_when_the_last_todo_is_done_and_again_after_new_todos() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.feed_ms(10, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        b.todos_ms(200, &["completed", "completed"]);
        b.turn_ms(300, "msg_1", "All done.", "stop");
        assert!(prompts(&b.tick_ms(799)).is_empty(), "debounced");
        let effects = b.tick_ms(800);
        assert_eq!(prompts(&effects), vec![PromptKind::Review]);
        b.deliver(800, &effects);
        b.turn_ms(2000, "msg_2", "Tests pass.", "stop");
        assert!(prompts(&b.tick_ms(3000)).is_empty(), "never twice for one edge");

        // The review found failures: new todos, then done again -> second round.
        b.todos_ms(4000, &["completed", "completed", "pending"]);
        b.todos_ms(4100, &["completed", "completed", "completed"]);
        b.idle_ms(4100);
        b.turn_ms(4200, "msg_3", "Fixed.", "stop");
        let effects = b.tick_ms(4700);
        assert_eq!(prompts(&effects), vec![PromptKind::Review]);
        let Effect::Prompt(order) = &effects[0] else { panic!() };
        assert_eq!(order.facts.attempts, 2, "round 2");
    }

    #[test]
    fn a_session_whose_todos_were_always_empty_is_never_reviewed() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &[]);
        b.turn_ms(100, "msg_1", "Done.", "stop");
        assert_eq!(b.core.deadline(), None);
        b.todos_ms(200, &["completed"]);
        b.idle_ms(300);
        assert!(prompts(&b.tick_ms(10_000)).is_empty(), "created already done: no open->done edge");
    }

    #[test]
    fn reviews_are_bounded_by_max_rounds() {
        let mut r = rules();
        r.review.max_rounds = 1;
        let mut b = bench_with_rules(r);
        let mut t = 0;
        for round in 0..2 {
            b.todos_ms(t, &["pending"]);
            b.todos_ms(t + 10, &["completed"]);
            b.turn_ms(t + 20, &format!("msg_{round}"), "Done.", "stop");
            let effects = b.tick_ms(t + 600);
            assert_eq!(prompts(&effects).len(), if round == 0 { 1 } else { 0 });
            b.deliver(t + 600, &effects);
            t += 1000;
        }
    }

    #[test]
    fn continues_and_nudges_carry_the_tool_call_as_text_scan_and_reviews_do_not() {
        let mut b = bench(|r| r.nudge.user_quiet = Duration::from_secs(1));
        b.busy(0);
        b.feed(
            0,
            r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"pending"}]}}"#,
        );
        b.feed(1, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_A","sessionID":"ses_A","role":"assistant","finish":"stop","time":{"created":1,"completed":2}}}}"#);
        b.feed(1, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
        let effects = b.tick(10);
        let nudge = effects
            .iter()
            .find_map(|e| match e {
                Effect::Prompt(o) if o.kind == PromptKind::Nudge => Some(o.clone()),
                _ => None,
            })
            .expect("a nudge");
        let scan = nudge.tool_text_scan.clone().expect("nudges look for tool calls written as text");
        assert_eq!(scan.messages, 20);
        // A sent nudge that found one says so in its record.
        let now = b.at(11);
        let found = TextualToolCall { pattern: "<function=", excerpt: "<function=bash>".into() };
        let done = b.core.on_prompt_finished(
            &nudge,
            &Delivery::Sent { text: "x".into(), todos: vec![], tool_call_as_text: Some(found), waited_ms: 0 },
            now,
        );
        assert!(record(&done, Action::Nudge).reason.contains("<function="));
        let review = b.core.custom_order("x".into(), b.at(12));
        assert_eq!(review.tool_text_scan, None);
    }
}
