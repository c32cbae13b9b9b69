//! Escalation: repeated continues without real progress get a stronger remedy once per
//! progress period — a hand-off to a fresh session when enabled, else abort, compact and
//! continue; without either the escalation is declined and the stall handled as usual.

use super::*;

impl SessionCore {
    /// `repeated_continue_count` continues within the window did not bring progress:
    /// instead of another, hand the work to a fresh session (hand-off enabled), or abort
    /// and compact, then continue the compacted session. When neither is possible the
    /// escalation is declined (recorded) and the stall is handled as usual at the next
    /// deadline, which is already due.
    pub(super) fn escalate(&mut self, continues: u32, base: Numbers, now: Now) -> Vec<Effect> {
        self.rare_mut().continues.mark_escalated();
        let window = self.cfg.recovery.repeated_continue_window;
        let numbers = Numbers { round: Some(continues), window_ms: Some(ms(window)), ..base.clone() };
        // A fresh session is the stronger remedy: hand off when hand-off is enabled (the
        // hand-off aborts the stalled turn itself), else compact.
        if self.cfg.handoff.enabled {
            let reason = format!(
                "{continues} continues within recovery.repeated_continue_window without progress: another will \
                 not help; escalating ({})",
                Escalation::HandOff.as_str()
            );
            let why = format!("{continues} continues without progress (escalation)");
            if let Some(step) = self.rollover.request(true, &why) {
                let mut out = vec![
                    self.record(
                        Action::StallDetected,
                        Outcome::Done,
                        "stalled again after repeated continues",
                        base,
                        now,
                    ),
                    self.record(Action::Escalate, Outcome::Done, &reason, numbers, now),
                ];
                out.extend(self.on_rollover_step(step, now));
                return out;
            }
        }
        let escalation = Escalation::Compact;
        let model = match (self.cfg.compaction.enabled, self.model.clone()) {
            (true, Some(model)) => model,
            (enabled, _) => {
                let why = if enabled { "the session's model is not known yet" } else { "compaction is disabled" };
                let reason = format!(
                    "{continues} continues within recovery.repeated_continue_window without progress, but no \
                     escalation is possible ({why}; hand-off not available): recovering as usual"
                );
                return vec![self.record(Action::Escalate, Outcome::Declined, &reason, numbers, now)];
            }
        };
        self.attempts += 1;
        self.auto_submits += 1;
        self.touch();
        self.backoff_until = None;
        let aborted_message = self.last_assistant.as_deref().map(str::to_string);
        self.recovering = Some(Box::new(Recovering { aborted_message, escalation: Some(escalation) }));
        let reason = format!(
            "{continues} continues within recovery.repeated_continue_window without progress: another will \
             not help; escalating ({}: abort, compact, then continue)",
            escalation.as_str()
        );
        vec![
            self.record(Action::StallDetected, Outcome::Done, "stalled again after repeated continues", base, now),
            self.record(Action::Escalate, Outcome::Done, &reason, numbers, now),
            Effect::Recover(RecoveryOrder {
                compact_first: Some((model, self.cfg.compaction.max_wait)),
                escalation: Some(escalation),
                ..self.recovery_order(self.attempts, Some("escalate"), now)
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn three_continues_in_the_window_escalate_to_a_compaction_instead_of_a_fourth() {
        let mut b = bench(|r| {
            r.handoff.enabled = false;
            r.recovery.max_recoveries = 10;
            r.recovery.max_auto_submits = 10;
        });
        b.user_turn(0, "msg_U", "build");
        b.busy(0);
        b.assistant(0, "msg_A");
        let mut t = 0;
        for _ in 0..3 {
            t += 180;
            let o = order(&b.tick(t)).expect("a plain recovery");
            assert_eq!(o.escalation, None);
            assert_eq!(o.compact_first, None);
            b.recovered(t);
        }
        t += 180;
        let effects = b.tick(t);
        let o = order(&effects).expect("an escalation");
        assert_eq!(o.escalation, Some(Escalation::Compact));
        let (model, _) = o.compact_first.expect("compacts between the abort and the continue");
        assert_eq!(model.model_id, "m");
        let esc = record(&effects, Action::Escalate);
        assert_eq!(esc.outcome, Outcome::Done);
        assert_eq!(esc.numbers.round, Some(3), "the continues that did not help");
        assert_eq!(esc.numbers.window_ms, Some(600_000));

        // The escalation's own continue reports its compaction as the escalation's.
        let now = b.at(t);
        let after = b.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(20),
                open_todos: 0,
                compacted: Some(Ok(())),
                tool_call_as_text: None,
                waited_ms: 0,
            },
            now,
        );
        assert!(record(&after, Action::Compact).reason.contains("escalation of repeated continues"));
        // Once per progress period: the next stall is a plain recovery again.
        let o = order(&b.tick(t + 180)).expect("plain");
        assert_eq!(o.escalation, None);
    }

    #[test]
    fn with_hand_off_enabled_three_continues_escalate_to_a_hand_off() {
        let mut b = bench(|r| {
            r.handoff.enabled = true;
            r.recovery.max_recoveries = 10;
            r.recovery.max_auto_submits = 10;
        });
        b.user_turn(0, "msg_U", "build");
        b.busy(0);
        b.assistant(0, "msg_A");
        let mut t = 0;
        for _ in 0..3 {
            t += 180;
            order(&b.tick(t)).expect("a plain recovery");
            b.recovered(t);
        }
        let effects = b.tick(t + 180);
        assert!(order(&effects).is_none(), "no fourth continue");
        assert!(record(&effects, Action::Escalate).reason.contains("hand_off"));
        let handoff = effects
            .iter()
            .find_map(|e| match e {
                Effect::HandOff(o) => Some(o.clone()),
                _ => None,
            })
            .expect("the hand-off starts");
        assert!(handoff.abort_first, "the stalled turn is aborted first");
        assert_eq!(b.core.deadline(), None, "no stall recovery while the hand-off runs");
    }

    #[test]
    fn continues_spread_beyond_the_window_do_not_escalate() {
        let mut b = bench(|r| {
            r.recovery.max_recoveries = 10;
            r.recovery.max_auto_submits = 10;
            r.recovery.stall_timeout = Duration::from_secs(400);
        });
        b.user_turn(0, "msg_U", "build");
        b.busy(0);
        b.assistant(0, "msg_A");
        let mut t = 0;
        for _ in 0..4 {
            t += 400;
            let o = order(&b.tick(t)).expect("recovery");
            assert_eq!(o.escalation, None, "at {t}s only two continues lie within 10 minutes");
            b.recovered(t);
        }
    }

    #[test]
    fn real_progress_clears_the_continue_count() {
        let mut b = bench(|r| r.recovery.max_recoveries = 10);
        b.user_turn(0, "msg_U", "build");
        b.busy(0);
        b.assistant(0, "msg_A");
        for t in [180, 360] {
            order(&b.tick(t)).unwrap();
            b.recovered(t);
        }
        b.tool(400, "prt_1", "edit", "completed", r#"{"path":"a"}"#);
        for t in [580, 760] {
            let o = order(&b.tick(t)).unwrap();
            assert_eq!(o.escalation, None);
            b.recovered(t);
        }
    }

    #[test]
    fn without_a_known_model_the_escalation_is_declined_and_the_stall_recovered_as_usual() {
        let mut b = bench(|r| {
            r.handoff.enabled = false;
            r.recovery.max_recoveries = 10;
            r.recovery.max_auto_submits = 10;
        });
        b.busy(0);
        let mut t = 0;
        for _ in 0..3 {
            t += 180;
            order(&b.tick(t)).unwrap();
            b.recovered(t);
        }
        t += 180;
        let effects = b.tick(t);
        assert_eq!(records(&effects), vec![(Action::Escalate, Outcome::Declined)]);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(t)), "due again at once");
        let o = order(&b.tick(t)).expect("the usual recovery");
        assert_eq!(o.escalation, None);
    }
}
