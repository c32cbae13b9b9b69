//! Hand-off: the core's side of `session::handoff`'s phases — the note, the start at
//! the end of a turn, each step ordered and its report taken, manual requests and
//! snapshots resumed.

use super::*;

impl SessionCore {
    /// Where the session's hand-off stands (status, control API).
    pub fn handoff(&self) -> &Rollover {
        &self.rollover
    }

    /// A new context reading: the hand-off thresholds may have been crossed.
    pub(super) fn on_context_reading(&mut self, now: Now) -> Vec<Effect> {
        let Some(share) = self.context_share() else { return Vec::new() };
        if self.pause.is_some() {
            return Vec::new();
        }
        let busy = self.busy != RunState::Idle;
        let steps = self.rollover.on_reading(share, busy, &self.cfg.handoff, now.mono);
        steps.into_iter().flat_map(|step| self.on_rollover_step(step, now)).collect()
    }

    pub(super) fn context_numbers(&self) -> Numbers {
        Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() }
    }

    pub(super) fn on_rollover_step(&mut self, step: Step, now: Now) -> Vec<Effect> {
        match step {
            Step::SoftNote { share } => {
                let percent = format!("{:.0}", share * 100.0);
                let mut order = self.continue_when_idle("handoff-soft", now);
                order.kind = PromptKind::Note;
                order.template = self.cfg.handoff.soft_message.replace("{percent}", &percent);
                order.template_without_open_todos = None;
                order.require_idle = true;
                order.tool_text_scan = None; // a note, not a continue
                let numbers = Numbers { phase: Some(Phase::Preparing.as_str().into()), ..self.context_numbers() };
                vec![
                    self.record(
                        Action::Handoff,
                        Outcome::Done,
                        "past handoff.soft: a note asks the model to keep its todos current",
                        numbers,
                        now,
                    ),
                    Effect::Prompt(order),
                ]
            }
            Step::Entered { phase, reason } => {
                let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
                vec![self.record(Action::Handoff, Outcome::Done, &reason, numbers, now)]
            }
            Step::LoopGuard { share } => {
                let reason = format!(
                    "this session was created by a hand-off and its first reading is already {:.0}% of the window, past handoff.soft: \
                     the limits are below a fresh session's size, so it is not handed off again",
                    share * 100.0
                );
                let numbers = Numbers { phase: Some(Phase::Failed.as_str().into()), ..self.context_numbers() };
                vec![self.record(Action::Handoff, Outcome::Declined, &reason, numbers, now)]
            }
            Step::Start { abort_first, reason } => {
                let id = format!("hf_{}_{}", self.id.trim_start_matches("ses_"), now.wall_ms);
                let mode = self.cfg.handoff.mode;
                self.start_handoff(id, mode, Phase::Persisting, abort_first, &reason, now)
            }
        }
    }

    pub(super) fn start_handoff(
        &mut self,
        id: String,
        mode: crate::config::HandoffMode,
        phase: Phase,
        abort_first: bool,
        reason: &str,
        now: Now,
    ) -> Vec<Effect> {
        self.rollover.begin(id, mode, phase, abort_first, reason, now.wall_ms);
        self.held_prompt = None;
        let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
        let why = format!("hand-off ({}) starts: {reason}", mode.as_str());
        vec![
            self.record(Action::Handoff, Outcome::Done, &why, numbers, now),
            Effect::HandOff(self.handoff_order(phase)),
        ]
    }

    pub(super) fn handoff_order(&self, step: Phase) -> HandoffOrder {
        HandoffOrder {
            id: self.rollover.id().unwrap_or_default().to_string(),
            server: self.server.to_string(),
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            mode: self.rollover.mode().unwrap_or(self.cfg.handoff.mode),
            step,
            abort_first: step == Phase::Persisting && self.rollover.interrupted().is_some_and(|(_, a)| a),
            known_todos: self.todos.to_vec(),
            known_turn: self.turn.clone(),
            children: self.family.as_ref().map(|f| f.children().cloned().collect()).unwrap_or_default(),
            context: (self.context_tokens, self.window),
            target: self.rollover.new_session().map(str::to_string),
        }
    }

    /// A person asked for a hand-off now (`shepherd handoff SESSION`).
    pub fn request_handoff(&mut self, now: Now) -> Result<Vec<Effect>, String> {
        if self.rollover.suspends_automation() && self.rollover.phase().is_running() {
            return Err(format!("a hand-off is already under way ({})", self.rollover.phase().as_str()));
        }
        let busy = self.busy != RunState::Idle;
        let step = self
            .rollover
            .request(busy, "requested through the control API")
            .ok_or("a hand-off is already under way")?;
        Ok(self.on_rollover_step(step, now))
    }

    /// Restores a stored snapshot into a fresh session (`shepherd handoff --resume ID`).
    pub fn resume_snapshot(&mut self, id: &str, now: Now) -> Result<Vec<Effect>, String> {
        if self.rollover.phase().is_running() {
            return Err(format!("a hand-off is already under way ({})", self.rollover.phase().as_str()));
        }
        let mode = crate::config::HandoffMode::Fresh;
        Ok(self.start_handoff(id.to_string(), mode, Phase::HandingOver, false, "resuming a stored snapshot", now))
    }

    /// After a restart: a hand-off that was running goes on at the step it was in.
    pub fn resume_interrupted_handoff(&mut self, now: Now) -> Vec<Effect> {
        if self.rollover.interrupted().is_none() {
            return Vec::new();
        }
        let phase = self.rollover.phase();
        let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
        vec![
            self.record(
                Action::Handoff,
                Outcome::Done,
                "resuming the hand-off that was under way when Shepherd stopped",
                numbers,
                now,
            ),
            Effect::HandOff(self.handoff_order(phase)),
        ]
    }

    /// One step of the hand-off procedure ended.
    pub fn on_handoff_step(&mut self, order: &HandoffOrder, report: &StepReport, now: Now) -> Vec<Effect> {
        if self.rollover.id() != Some(order.id.as_str()) {
            return Vec::new(); // a step of an older hand-off
        }
        let (next, reason, outcome) = match report {
            StepReport::Persisted { reused, readable, chars, model_account } => {
                let what = if *reused { "the stored snapshot is intact and reused" } else { "continuation persisted" };
                let file = readable.as_deref().map(|p| format!("; readable copy {p}")).unwrap_or_default();
                let account = if *model_account { "with" } else { "without" };
                let base = format!("{what} ({chars} characters, {account} the model's own account{file})");
                if order.mode == crate::config::HandoffMode::Manual {
                    let r = format!("{base}; mode manual: resume it with `shepherd handoff --resume {}`", order.id);
                    (Phase::AwaitingManual, r, Outcome::Done)
                } else {
                    (Phase::HandingOver, base, Outcome::Done)
                }
            }
            StepReport::HandedOver { target, created } => {
                self.rollover.advance(Phase::Resuming, Some(target), None);
                let how = if *created { "created" } else { "found" };
                (Phase::Resuming, format!("continuation delivered to {target} ({how})"), Outcome::Done)
            }
            StepReport::Resumed { target } => (
                Phase::Completed,
                format!("the work continues in {target}; this session is left untouched"),
                Outcome::Done,
            ),
            StepReport::Failed { step, error } => (
                Phase::Failed,
                format!("hand-off failed while {}: {error}; the session goes on as before", step.as_str()),
                Outcome::Failed,
            ),
        };
        self.rollover.advance(next, None, Some(&reason));
        let numbers = Numbers { phase: Some(next.as_str().into()), ..self.context_numbers() };
        let mut out = vec![self.record(Action::Handoff, outcome, &reason, numbers, now)];
        self.rollover.rearm_after_compact_mode();
        if next.is_running() {
            out.push(Effect::HandOff(self.handoff_order(next)));
        } else if next == Phase::Failed && self.busy == RunState::Idle {
            // Follow-ups held back during the hand-off get their turn now.
            self.followup.on_idle_edge(now.mono, &self.todos, false, &self.cfg.nudge, &self.cfg.review);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn a_filling_session_gets_a_soft_note_then_is_handed_off_when_its_turn_ends() {
        let mut r = rules();
        r.compaction.enabled = false; // here the window only grows
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["in_progress", "pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        assert!(b.feed_ms(20_000, &tokens_json("msg_2", 152_000)).is_empty(), "76%: the note waits for idle");
        let soft = b.idle_ms(21_000);
        assert_eq!(phases(&soft), vec!["preparing"]);
        let note = soft.iter().find_map(|e| if let Effect::Prompt(o) = e { Some(o.clone()) } else { None }).unwrap();
        assert_eq!(note.kind, PromptKind::Note);
        assert!(note.require_idle && note.template.contains("76% used"), "{note:?}");
        b.busy(22);
        let ready = b.feed_ms(30_000, &tokens_json("msg_3", 164_000)); // 82%
        assert_eq!(phases(&ready), vec!["ready"]);
        assert!(handoffs(&ready).is_empty(), "not mid-turn");
        let idle = b.idle_ms(40_000);
        let orders = handoffs(&idle);
        assert_eq!(orders.len(), 1, "{idle:?}");
        assert_eq!(orders[0].step, Phase::Persisting);
        assert!(!orders[0].abort_first);
        assert!(compactions(&idle).is_empty(), "the hand-off goes first");
        // Nothing else acts on the session while the hand-off runs.
        assert!(b.core.deadline().is_none() || prompts(&b.tick_ms(50_000)).is_empty());
        let order = orders[0].clone();
        let persisted = StepReport::Persisted { reused: false, readable: None, chars: 900, model_account: true };
        let next = b.core.on_handoff_step(&order, &persisted, b.at_ms(41_000));
        assert_eq!(handoffs(&next)[0].step, Phase::HandingOver);
        let over = StepReport::HandedOver { target: "ses_new".into(), created: true };
        let next = b.core.on_handoff_step(&handoffs(&next)[0], &over, b.at_ms(42_000));
        let resume = handoffs(&next);
        assert_eq!(resume[0].step, Phase::Resuming);
        assert_eq!(resume[0].target.as_deref(), Some("ses_new"));
        let done =
            b.core.on_handoff_step(&resume[0], &StepReport::Resumed { target: "ses_new".into() }, b.at_ms(43_000));
        assert_eq!(phases(&done), vec!["completed"]);
        assert_eq!(b.core.handoff().new_session(), Some("ses_new"));
        // The old session is left alone afterwards: no nudge for its open todos.
        let later = b.tick_ms(120_000);
        assert!(prompts(&later).is_empty(), "{later:?}");
    }

    #[test]
    fn a_compaction_at_the_idle_edge_makes_the_soft_note_moot_and_rearms_the_thresholds() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 152_000)); // 76%: past proactive and soft
        let idle = b.idle_ms(100);
        assert_eq!(compactions(&idle).len(), 1);
        assert!(prompts(&idle).is_empty(), "no note beside the compaction: {idle:?}");
        let Some(Effect::Compact(order)) = idle.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!()
        };
        b.core.on_compaction_finished(&order, Ok(()), b.at_ms(2_000));
        assert_eq!(b.core.handoff().phase(), Phase::Monitoring, "watched afresh after the compaction");
    }

    #[test]
    fn past_hard_mid_turn_the_turn_drains_and_then_the_hand_off_aborts_it() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        let effects = b.feed_ms(1_000, &tokens_json("msg_2", 180_000)); // 90%
        assert_eq!(phases(&effects), vec!["ready", "ready"]);
        let drain = b.core.cfg.handoff.drain;
        assert!(handoffs(&b.tick_ms(1_000 + ms(drain) - 1)).is_empty());
        b.feed_ms(
            1_000 + ms(drain) - 1,
            r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#,
        );
        let at = 1_000 + ms(drain) + 1;
        let orders = handoffs(&b.tick_ms(at));
        assert_eq!(orders.len(), 1);
        assert!(orders[0].abort_first, "the turn is still running: it is aborted first");
    }

    #[test]
    fn the_abort_of_a_hand_off_is_not_taken_for_the_persons() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(1_000, &tokens_json("msg_1", 180_000)); // 90%, mid-turn: drain, then abort
        let at = 1_000 + ms(b.core.cfg.handoff.drain);
        assert!(handoffs(&b.tick_ms(at))[0].abort_first);
        let aborted =
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#;
        assert!(b.feed_ms(at + 10, aborted).is_empty());
        assert_eq!(b.core.pause(), None);
    }

    #[test]
    fn the_drain_past_hard_does_not_abort_while_a_person_is_asked() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: drain, then abort
        b.feed_ms(20, r#"{"type":"permission.asked","properties":{"id":"per_1","sessionID":"ses_A"}}"#);
        let at = 10 + ms(b.core.cfg.handoff.drain);
        assert_eq!(b.core.deadline(), None, "nothing to do until the person answers");
        assert!(handoffs(&b.tick_ms(at)).is_empty());
        b.feed_ms(at + 5, r#"{"type":"permission.replied","properties":{"requestID":"per_1","sessionID":"ses_A"}}"#);
        assert!(handoffs(&b.tick_ms(at + 5))[0].abort_first, "then the drain is over");
    }

    #[test]
    fn a_paused_session_past_hard_is_neither_aborted_nor_handed_off_until_the_person_writes() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: drain, then abort
        b.feed_ms(
            20,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(b.core.deadline(), None);
        assert!(handoffs(&b.tick_ms(10 + ms(b.core.cfg.handoff.drain))).is_empty());
        assert!(handoffs(&b.idle_ms(200_000)).is_empty(), "not at the end of the turn either");
        b.feed_ms(201_000, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(201_000, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pu","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"go on"}}}"#);
        b.busy(202);
        assert_eq!(
            handoffs(&b.idle_ms(203_000)).len(),
            1,
            "the person wrote: the hand-off goes at the end of the turn"
        );
    }

    #[test]
    fn a_soft_note_due_at_the_end_of_the_turn_is_not_sent_once_the_session_is_paused_or_handed_off() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 152_000)); // 76% mid-turn: the note waits for idle
        b.feed_ms(
            20,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(b.core.pause(), Some(Pause::UserAbort));
        assert!(prompts(&b.idle_ms(30)).is_empty(), "paused: no note");

        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: a note due, and a drain
        let at = 10 + ms(b.core.cfg.handoff.drain);
        assert_eq!(handoffs(&b.tick_ms(at)).len(), 1, "the hand-off starts");
        assert!(prompts(&b.idle_ms(at + 10)).is_empty(), "no note during the hand-off");
    }

    #[test]
    fn a_failed_hand_off_gives_the_session_back_to_the_usual_automation() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 164_000));
        let order = handoffs(&b.idle_ms(100))[0].clone();
        let failed = StepReport::Failed { step: Phase::HandingOver, error: "server unreachable".into() };
        let effects = b.core.on_handoff_step(&order, &failed, b.at_ms(200));
        assert_eq!(phases(&effects), vec!["failed"]);
        assert!(!b.core.handoff().suspends_automation());
        let later = b.tick_ms(10_000);
        // The nudge goes out again — behind a compaction, since the window is still full.
        assert_eq!(compactions(&later), vec!["past compaction.opportunistic, idle: compacting before the nudge"]);
    }

    #[test]
    fn a_hand_off_under_way_survives_a_restart_and_resumes_at_its_step() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 164_000));
        let order = handoffs(&b.idle_ms(100))[0].clone();
        let persisted = StepReport::Persisted { reused: false, readable: None, chars: 10, model_account: false };
        b.core.on_handoff_step(&order, &persisted, b.at_ms(200));
        let saved = b.core.export(b.at_ms(300));
        let mut again = bench_with_rules(rules());
        again.core.restore(&saved, again.at_ms(0));
        let resumed = again.core.resume_interrupted_handoff(again.at_ms(1));
        let orders = handoffs(&resumed);
        assert_eq!(orders.len(), 1);
        assert_eq!((orders[0].id.as_str(), orders[0].step), (order.id.as_str(), Phase::HandingOver));
        assert!(again.core.request_handoff(again.at_ms(2)).is_err(), "no second hand-off");
    }
}
