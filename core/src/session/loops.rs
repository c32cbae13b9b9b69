//! Loops a continue cannot break: repeated continues, and tools called the same way
//! again and again.
//!
//! Pure bookkeeping the core consults; it never decides what to send. (The runaway loop
//! of empty model calls lives in the core, next to the message handling it needs.)
//!
//! - [`ContinueHistory`]: `recovery.repeated_continue_count` continues within
//!   `recovery.repeated_continue_window` without real progress means a fourth will not
//!   help; the core escalates instead ([`Escalation`]), once per progress period.
//! - [`ToolSpin`]: the same tool with the same input called `loops.spin_count` times in
//!   a row within `loops.spin_window` is spinning: reported once per run, and its
//!   completions are not real progress.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// What Shepherd does instead of another continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalation {
    /// Abort, compact the session (`POST /summarize`), then continue the compacted session.
    Compact,
    /// Hand the work to a fresh session (the hand-off procedure, which aborts the turn
    /// first). Chosen when `handoff.enabled`.
    HandOff,
}

impl Escalation {
    pub fn as_str(self) -> &'static str {
        match self {
            Escalation::Compact => "compact",
            Escalation::HandOff => "hand_off",
        }
    }
}

/// Continues sent to one session since its last real progress.
#[derive(Debug, Default)]
pub struct ContinueHistory {
    /// A `Vec` (24 bytes, a `VecDeque` is 32): only pushed at the back and filtered.
    sent: Vec<Instant>,
    /// An escalation was already made in this progress period.
    escalated: bool,
}

impl ContinueHistory {
    /// A continue reached the session.
    pub fn on_continue(&mut self, at: Instant) {
        self.sent.push(at);
    }

    /// Real progress: the continues worked.
    pub fn on_progress(&mut self) {
        self.sent.clear();
        self.escalated = false;
    }

    /// Continues within `window` before `now`.
    pub fn recent(&mut self, now: Instant, window: Duration) -> u32 {
        self.sent.retain(|at| now.saturating_duration_since(*at) <= window);
        self.sent.len() as u32
    }

    /// The number of recent continues when they reached `count` and no escalation was
    /// made since the last progress: time to escalate instead of continuing again.
    pub fn escalation_due(&mut self, now: Instant, count: u32, window: Duration) -> Option<u32> {
        let n = self.recent(now, window);
        (n >= count && !self.escalated).then_some(n)
    }

    pub fn mark_escalated(&mut self) {
        self.escalated = true;
    }
}

/// The current run of identical tool calls.
#[derive(Debug, Default)]
pub struct ToolSpin {
    /// `(tool, input hash)` of the run (`Box<str>`: replaced whole, never grown).
    call: Option<(Box<str>, u64)>,
    /// When each call of the run finished.
    run: VecDeque<Instant>,
    reported: bool,
}

/// What one finished tool call means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinVerdict {
    /// A different call, or not yet often enough.
    Normal,
    /// The run just reached the threshold: report it (once per run).
    Spinning { repeats: u32 },
    /// Still the same spinning run (already reported).
    StillSpinning,
}

impl ToolSpin {
    /// A tool call finished (completed or failed) with this input.
    pub fn on_call(&mut self, tool: &str, input: u64, now: Instant, count: usize, window: Duration) -> SpinVerdict {
        let same = self.call.as_ref().is_some_and(|(t, i)| **t == *tool && *i == input);
        if !same {
            self.call = Some((tool.into(), input));
            self.run.clear();
            self.reported = false;
        }
        self.run.retain(|at| now.saturating_duration_since(*at) <= window);
        // Only whether the run reached `count` matters: room is made before the push, so
        // the ring never grows past `count` entries.
        while self.run.len() >= count.max(1) {
            self.run.pop_front();
        }
        self.run.push_back(now);
        if self.run.len() < count {
            return SpinVerdict::Normal;
        }
        if self.reported {
            return SpinVerdict::StillSpinning;
        }
        self.reported = true;
        SpinVerdict::Spinning { repeats: self.run.len() as u32 }
    }

    /// The latest run is at or past the threshold (its calls are not progress).
    pub fn is_spinning(&self, count: usize) -> bool {
        self.run.len() >= count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(600);

    #[test]
    fn escalation_is_due_at_the_count_within_the_window_once_per_progress_period() {
        let t0 = Instant::now();
        let mut h = ContinueHistory::default();
        h.on_continue(t0);
        h.on_continue(t0 + Duration::from_secs(60));
        assert_eq!(h.escalation_due(t0 + Duration::from_secs(120), 3, W), None);
        h.on_continue(t0 + Duration::from_secs(120));
        assert_eq!(h.escalation_due(t0 + Duration::from_secs(180), 3, W), Some(3));
        h.mark_escalated();
        assert_eq!(h.escalation_due(t0 + Duration::from_secs(190), 3, W), None, "once");
        h.on_progress();
        assert_eq!(h.recent(t0 + Duration::from_secs(200), W), 0);
    }

    #[test]
    fn continues_older_than_the_window_do_not_count() {
        let t0 = Instant::now();
        let mut h = ContinueHistory::default();
        for i in 0..3 {
            h.on_continue(t0 + Duration::from_secs(i * 400));
        }
        assert_eq!(h.escalation_due(t0 + Duration::from_secs(900), 3, W), None, "the first is 15 min old");
    }

    #[test]
    fn the_same_call_repeated_is_reported_once_per_run() {
        let t0 = Instant::now();
        let mut s = ToolSpin::default();
        let at = |i: u64| t0 + Duration::from_secs(i);
        assert_eq!(s.on_call("bash", 1, at(0), 3, W), SpinVerdict::Normal);
        assert_eq!(s.on_call("bash", 1, at(1), 3, W), SpinVerdict::Normal);
        assert_eq!(s.on_call("bash", 1, at(2), 3, W), SpinVerdict::Spinning { repeats: 3 });
        assert!(s.is_spinning(3));
        assert_eq!(s.on_call("bash", 1, at(3), 3, W), SpinVerdict::StillSpinning);
        // A different call breaks the run.
        assert_eq!(s.on_call("edit", 7, at(4), 3, W), SpinVerdict::Normal);
        assert!(!s.is_spinning(3));
    }

    #[test]
    fn the_same_tool_with_different_inputs_is_not_spinning() {
        let t0 = Instant::now();
        let mut s = ToolSpin::default();
        for i in 0..6 {
            assert_eq!(s.on_call("read", i, t0, 3, W), SpinVerdict::Normal);
        }
    }
}
