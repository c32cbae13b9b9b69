//! Runaway loops: assistant messages ending with `finish: "unknown"` and no output,
//! `loops.runaway_count` within `loops.runaway_window` → abort and one continue; back
//! before real progress → abort and stop (paused, reported).

use super::*;

impl SessionCore {
    /// One more model call that ended with no finish reason and no output. N of them in
    /// the window is OpenCode's runaway loop: abort and continue once; if it comes back,
    /// abort and stop (paused, reported).
    pub(super) fn on_empty_finish(&mut self, message_id: &str, now: Now) -> Vec<Effect> {
        let window = self.cfg.loops.runaway_window;
        let rare = self.rare.get_or_insert_with(Box::default);
        rare.empty_finishes.retain(|(_, at)| now.mono.duration_since(*at) <= window);
        if rare.empty_finishes.iter().any(|(id, _)| id == message_id) {
            return Vec::new(); // the same message, re-emitted
        }
        rare.empty_finishes.push((message_id.to_string(), now.mono));
        if rare.empty_finishes.len() < self.cfg.loops.runaway_count || self.recovering.is_some() || self.pause.is_some()
        {
            return Vec::new();
        }
        rare.empty_finishes.clear();
        rare.runaways += 1;
        let runaways = rare.runaways;
        let again = runaways > 1;
        let numbers = Numbers {
            attempt: Some(runaways),
            round: Some(self.cfg.loops.runaway_count as u32),
            ..Numbers::default()
        };
        let reason = if again {
            "runaway loop again (model calls ending with no finish reason and no output): aborting and stopping"
        } else {
            "runaway loop (model calls ending with no finish reason and no output): aborting, then one continue"
        };
        if again {
            self.pause = Some(Pause::GaveUp);
            self.touch();
        }
        let aborted_message = Some(message_id.to_string());
        self.recovering = Some(Box::new(Recovering { aborted_message, escalation: None }));
        vec![
            self.record(Action::StallDetected, Outcome::Done, reason, numbers, now),
            Effect::Recover(RecoveryOrder {
                continue_after: !again,
                planning: false,
                ..self.recovery_order(self.attempts + 1, Some("runaway"), now)
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn a_runaway_loop_is_aborted_and_continued_once_then_stopped_if_it_comes_back() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        for i in 0..4 {
            assert!(!recovers(&empty_finish(&mut b, 100 + i * 300, &format!("msg_{i}"))));
            assert!(
                !recovers(&empty_finish(&mut b, 101 + i * 300, &format!("msg_{i}"))),
                "a re-emitted message counts once"
            );
        }
        let effects = empty_finish(&mut b, 1_300, "msg_4");
        let order = effects
            .iter()
            .find_map(|e| match e {
                Effect::Recover(o) => Some(o.clone()),
                _ => None,
            })
            .expect("abort");
        assert!(order.continue_after);
        b.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(10),
                open_todos: 0,
                compacted: None,
                tool_call_as_text: None,
                waited_ms: 0,
            },
            b.at_ms(2_000),
        );
        b.busy(3);
        let mut last = Vec::new();
        for i in 0..5 {
            last = empty_finish(&mut b, 3_000 + i * 300, &format!("msg_n{i}"));
        }
        let order = last
            .iter()
            .find_map(|e| match e {
                Effect::Recover(o) => Some(o.clone()),
                _ => None,
            })
            .expect("abort");
        assert!(!order.continue_after, "it came back: abort and stop");
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    #[test]
    fn empty_finishes_spread_out_in_time_are_not_a_runaway_loop() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        for i in 0..10 {
            assert!(!recovers(&empty_finish(&mut b, i * 5_000, &format!("msg_{i}"))));
        }
    }
}
