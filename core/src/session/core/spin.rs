//! Spinning tools: the same tool call (tool + input hash) `loops.spin_count` times in a
//! row is reported once, and those calls are not real progress.

use super::*;

impl SessionCore {
    /// A tool call finished: is it part of a spinning run (same tool, same input, again
    /// and again)? Reported once per run; such calls are not progress.
    pub(super) fn on_tool_call_finished(&mut self, tool: &str, input: u64, now: Now, out: &mut Vec<Effect>) -> bool {
        let loops = &self.cfg.loops;
        let (count, window) = (loops.spin_count, loops.spin_window);
        match self.spin.on_call(tool, input, now.mono, count, window) {
            SpinVerdict::Normal => false,
            SpinVerdict::StillSpinning => true,
            SpinVerdict::Spinning { repeats } => {
                let reason = format!(
                    "spinning tool: {tool} called {repeats} times in a row with the same input within \
                     loops.spin_window; not counted as progress"
                );
                let numbers = Numbers { round: Some(repeats), window_ms: Some(ms(window)), ..Numbers::default() };
                out.push(self.record(Action::SpinningTool, Outcome::Done, &reason, numbers, now));
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn the_same_tool_call_repeated_is_reported_once_and_is_not_progress() {
        let mut b = bench(|r| {
            r.loops.spin_count = 3;
            r.recovery.max_recoveries = 10;
        });
        b.busy(0);
        order(&b.tick(180)).unwrap();
        b.recovered(180);
        assert_eq!(b.core.attempts(), 1);
        let mut reported = Vec::new();
        for i in 0..5 {
            reported.extend(b.tool(200 + i, &format!("prt_{i}"), "bash", "completed", r#"{"command":"ls"}"#));
        }
        let spins: Vec<_> = records(&reported).into_iter().filter(|(a, _)| *a == Action::SpinningTool).collect();
        assert_eq!(spins.len(), 1, "reported once per run");
        assert!(record(&reported, Action::SpinningTool).reason.contains("bash"));
        // The first two calls were progress; the spinning ones after them are not.
        order(&b.tick(204 + 180)).unwrap();
        assert_eq!(b.core.attempts(), 1, "no progress since the run started spinning");
    }

    #[test]
    fn a_different_call_in_between_is_not_spinning() {
        let mut b = bench(|r| r.loops.spin_count = 3);
        b.busy(0);
        let mut all = Vec::new();
        for i in 0..6 {
            let input = if i % 2 == 0 { r#"{"command":"cargo test"}"# } else { r#"{"path":"src/lib.rs"}"# };
            let tool = if i % 2 == 0 { "bash" } else { "edit" };
            all.extend(b.tool(i, &format!("prt_{i}"), tool, "completed", input));
        }
        assert!(records(&all).is_empty());
    }
}
