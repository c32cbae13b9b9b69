//! The hand-off ("rollover") of one session: when to move its work to a fresh session.
//! Pure; part of the session core.
//!
//! Phases, each journalled and kept in the ledger so a Shepherd restart resumes the
//! same hand-off (never a second one):
//!
//! ```text
//! monitoring ─soft─▶ preparing ─prepare─▶ ready ─turn ends (or hard + drain)─▶ persisting
//!   ─▶ handing_over ─▶ resuming ─▶ completed          (failed / awaiting_manual on the way)
//! ```
//!
//! - **soft**: one `noReply` note asks the model to keep its todos current. It is
//!   delivered while the session is idle: a note stored mid-turn makes OpenCode's loop
//!   answer it at once (one more model call on an already full window).
//! - **prepare**: the hand-off starts at the end of the current turn (busy→idle).
//! - **hard** mid-turn: the turn may drain for `handoff.drain`; then it is aborted and
//!   the hand-off starts.
//! - While a hand-off runs (persisting … resuming) stall recovery, nudges, reviews and
//!   compaction of the session are suspended.
//! - A fresh session created by a hand-off whose first reading is already past `soft`
//!   is not handed off again ("limits below a fresh session's size"): it would roll
//!   over forever.

use tokio::time::Instant;

use crate::config::{HandoffConfig, HandoffMode};
use crate::ledger::HandoffMemory;

/// Where a session's hand-off stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Monitoring,
    Preparing,
    Ready,
    Persisting,
    HandingOver,
    Resuming,
    Completed,
    Failed,
    AwaitingManual,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Monitoring => "monitoring",
            Phase::Preparing => "preparing",
            Phase::Ready => "ready",
            Phase::Persisting => "persisting",
            Phase::HandingOver => "handing_over",
            Phase::Resuming => "resuming",
            Phase::Completed => "completed",
            Phase::Failed => "failed",
            Phase::AwaitingManual => "awaiting_manual",
        }
    }

    pub fn parse(s: &str) -> Phase {
        match s {
            "preparing" => Phase::Preparing,
            "ready" => Phase::Ready,
            "persisting" => Phase::Persisting,
            "handing_over" => Phase::HandingOver,
            "resuming" => Phase::Resuming,
            "completed" => Phase::Completed,
            "failed" => Phase::Failed,
            "awaiting_manual" => Phase::AwaitingManual,
            _ => Phase::Monitoring,
        }
    }

    /// The procedure is under way (or was, when Shepherd stopped).
    pub fn is_running(self) -> bool {
        matches!(self, Phase::Persisting | Phase::HandingOver | Phase::Resuming)
    }

    /// Nothing more will happen automatically.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed | Phase::AwaitingManual)
    }
}

/// What the core should do about the hand-off.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Send the soft note (once).
    SoftNote { share: f64 },
    /// The phase moved (journal it).
    Entered { phase: Phase, reason: String },
    /// Start the procedure now (`abort_first`: the turn is still running).
    Start { abort_first: bool, reason: String },
    /// A fresh session already too full for the limits: no hand-off for it.
    LoopGuard { share: f64 },
}

/// The hand-off state of one session.
#[derive(Debug, Clone)]
pub struct Rollover {
    phase: Phase,
    /// The loop guard was checked on this session's first reading.
    first_reading_seen: bool,
    /// The soft note waits for the turn to end.
    note_due: Option<f64>,
    /// Past `hard` mid-turn: start (aborting) at this moment if the turn has not ended.
    drain_until: Option<Instant>,
    /// What a hand-off (or its origin) is about. Boxed: most sessions never get one,
    /// and every session carries a `Rollover` (memory per session is a scale target).
    run: Option<Box<Run>>,
}

/// The particulars of this session's hand-off, and where the session came from.
#[derive(Debug, Clone, Default)]
struct Run {
    id: Option<String>,
    reason: Option<String>,
    new_session: Option<String>,
    abort_first: bool,
    started_ms: Option<i64>,
    /// This session was created by a hand-off from that one.
    from: Option<String>,
    mode: Option<HandoffMode>,
}

impl Default for Rollover {
    fn default() -> Self {
        Rollover { phase: Phase::Monitoring, first_reading_seen: false, note_due: None, drain_until: None, run: None }
    }
}

impl Rollover {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    fn run(&self) -> Option<&Run> {
        self.run.as_deref()
    }

    fn run_mut(&mut self) -> &mut Run {
        self.run.get_or_insert_with(Box::default)
    }

    pub fn id(&self) -> Option<&str> {
        self.run()?.id.as_deref()
    }

    pub fn new_session(&self) -> Option<&str> {
        self.run()?.new_session.as_deref()
    }

    pub fn from(&self) -> Option<&str> {
        self.run()?.from.as_deref()
    }

    pub fn reason(&self) -> Option<&str> {
        self.run()?.reason.as_deref()
    }

    /// Stall recovery, follow-ups and compaction wait while this is true: while the
    /// procedure runs, and after the work moved on (until the person writes here again).
    pub fn suspends_automation(&self) -> bool {
        self.phase.is_running() || self.phase == Phase::Completed
    }

    /// A hand-off that compacted this same session: the work goes on here, so the
    /// session is watched again like any other.
    pub fn rearm_after_compact_mode(&mut self) {
        if self.phase == Phase::Completed && self.mode() == Some(HandoffMode::Compact) {
            self.phase = Phase::Monitoring;
            self.note_due = None;
            self.drain_until = None;
        }
    }

    /// The person wrote in this session: whatever hand-off ended, it is watched again.
    pub fn on_person_wrote(&mut self) {
        if self.phase.is_final() {
            self.phase = Phase::Monitoring;
            self.drain_until = None;
        }
    }

    pub fn mode(&self) -> Option<HandoffMode> {
        self.run()?.mode
    }

    /// The session was created by a hand-off (from its metadata or the ledger).
    pub fn set_from(&mut self, from: &str) {
        self.run_mut().from = Some(from.to_string());
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.drain_until
    }

    /// A new context reading (`share` of the window) after a finished model call.
    pub fn on_reading(&mut self, share: f64, busy: bool, cfg: &HandoffConfig, now: Instant) -> Vec<Step> {
        if !self.first_reading_seen {
            self.first_reading_seen = true;
            if self.from().is_some() && share >= cfg.soft && self.phase == Phase::Monitoring {
                self.phase = Phase::Failed;
                self.run_mut().reason = Some("a fresh session is already past handoff.soft".into());
                return vec![Step::LoopGuard { share }];
            }
        }
        if !cfg.enabled || self.phase.is_running() || self.phase.is_final() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if share >= cfg.soft && self.phase == Phase::Monitoring {
            self.phase = Phase::Preparing;
            if busy {
                self.note_due = Some(share);
            } else {
                out.push(Step::SoftNote { share });
            }
        }
        if share >= cfg.prepare && matches!(self.phase, Phase::Monitoring | Phase::Preparing) {
            self.phase = Phase::Ready;
            let reason =
                format!("past handoff.prepare ({:.0}% of the window): handing off when this turn ends", share * 100.0);
            out.push(Step::Entered { phase: Phase::Ready, reason });
        }
        if share >= cfg.hard && busy && self.phase == Phase::Ready && self.drain_until.is_none() {
            self.drain_until = Some(now + cfg.drain);
            let reason = format!(
                "past handoff.hard ({:.0}% of the window) mid-turn: the turn may drain for handoff.drain, then it is aborted",
                share * 100.0
            );
            out.push(Step::Entered { phase: Phase::Ready, reason });
        }
        out
    }

    /// The turn ended: a ready hand-off starts now; else a soft note that waited goes out.
    pub fn on_idle(&mut self) -> Option<Step> {
        let note = self.note_due.take();
        if self.phase != Phase::Ready {
            return note.map(|share| Step::SoftNote { share });
        }
        self.drain_until = None;
        Some(Step::Start { abort_first: false, reason: "the turn ended past handoff.prepare".into() })
    }

    /// The drain past `hard` ran out with the turn still going.
    pub fn on_deadline(&mut self, busy: bool, now: Instant) -> Option<Step> {
        let due = self.drain_until.is_some_and(|d| d <= now);
        if !due || self.phase != Phase::Ready {
            return None;
        }
        self.drain_until = None;
        Some(Step::Start {
            abort_first: busy,
            reason: "past handoff.hard and the turn did not end within handoff.drain".into(),
        })
    }

    /// A person asked for a hand-off now (`shepherd handoff SESSION`), or an escalation did.
    pub fn request(&mut self, busy: bool, why: &str) -> Option<Step> {
        if self.phase.is_running() {
            return None;
        }
        self.drain_until = None;
        Some(Step::Start { abort_first: busy, reason: why.to_string() })
    }

    /// The procedure starts with this id (at `phase`: persisting, or handing over when a
    /// stored snapshot is resumed).
    pub fn begin(&mut self, id: String, mode: HandoffMode, phase: Phase, abort_first: bool, reason: &str, now_ms: i64) {
        self.phase = phase;
        self.note_due = None; // the hand-off itself is under way: a note is moot
        let run = self.run_mut();
        run.mode = Some(mode);
        run.id = Some(id);
        run.abort_first = abort_first;
        run.reason = Some(reason.to_string());
        run.started_ms = Some(now_ms);
        run.new_session = None;
    }

    /// A hand-off that was running when Shepherd stopped: `(id, abort_first)` to resume.
    pub fn interrupted(&self) -> Option<(String, bool)> {
        if !self.phase.is_running() {
            return None;
        }
        let run = self.run()?;
        run.id.clone().map(|id| (id, run.abort_first))
    }

    /// The procedure reported progress.
    pub fn advance(&mut self, phase: Phase, new_session: Option<&str>, reason: Option<&str>) {
        self.phase = phase;
        if new_session.is_none() && reason.is_none() {
            return;
        }
        let run = self.run_mut();
        if let Some(s) = new_session {
            run.new_session = Some(s.to_string());
        }
        if let Some(r) = reason {
            run.reason = Some(r.to_string());
        }
    }

    /// The session was compacted: its window is mostly free again, so the thresholds are
    /// watched afresh (after a failed hand-off too). A running or completed hand-off stays.
    pub fn on_compacted(&mut self) {
        if !self.phase.is_running() && self.phase != Phase::Completed {
            self.phase = Phase::Monitoring;
            self.note_due = None;
            self.drain_until = None;
        }
    }

    /// A hash of what [`Rollover::export`] and [`Rollover::from`] return, without
    /// building them: the session's durable generation includes it, so a hand-off step
    /// is written to the ledger without every mutation here having to say so.
    pub fn durable_fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::hasher();
        self.phase.as_str().hash(&mut h);
        if let Some(run) = self.run() {
            run.id.hash(&mut h);
            run.mode.map(|m| m.as_str()).hash(&mut h);
            run.new_session.hash(&mut h);
            run.reason.hash(&mut h);
            run.abort_first.hash(&mut h);
            run.started_ms.hash(&mut h);
            run.from.hash(&mut h);
        }
        h.finish()
    }

    pub fn export(&self) -> HandoffMemory {
        let run = self.run().cloned().unwrap_or_default();
        HandoffMemory {
            phase: self.phase.as_str().to_string(),
            id: run.id,
            mode: run.mode.map(|m| m.as_str().to_string()),
            new_session: run.new_session,
            reason: run.reason,
            abort_first: run.abort_first,
            started_ms: run.started_ms,
        }
    }

    pub fn restore(&mut self, m: &HandoffMemory, from: Option<&str>) {
        self.phase = Phase::parse(&m.phase);
        let mode = match m.mode.as_deref() {
            Some("fresh") => Some(HandoffMode::Fresh),
            Some("compact") => Some(HandoffMode::Compact),
            Some("manual") => Some(HandoffMode::Manual),
            _ => None,
        };
        let nothing = m.id.is_none() && m.new_session.is_none() && m.reason.is_none() && m.started_ms.is_none();
        if nothing && mode.is_none() && from.is_none() && self.run.is_none() {
            return; // the common case: never handed off, nothing to box
        }
        let run = self.run_mut();
        run.id.clone_from(&m.id);
        run.new_session.clone_from(&m.new_session);
        run.reason.clone_from(&m.reason);
        run.abort_first = m.abort_first;
        run.started_ms = m.started_ms;
        run.mode = mode;
        if let Some(f) = from {
            run.from = Some(f.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> HandoffConfig {
        HandoffConfig::default()
    }

    #[test]
    fn readings_move_the_phases_in_order_and_the_soft_note_is_sent_once() {
        let t = Instant::now();
        let mut r = Rollover::default();
        assert!(r.on_reading(0.5, true, &cfg(), t).is_empty());
        assert!(r.on_reading(0.76, true, &cfg(), t).is_empty(), "the note waits for the turn to end");
        assert_eq!(r.phase(), Phase::Preparing);
        assert_eq!(r.on_idle(), Some(Step::SoftNote { share: 0.76 }));
        assert!(r.on_reading(0.77, false, &cfg(), t).is_empty(), "the soft note is sent once");
        assert_eq!(r.on_idle(), None);
        let steps = r.on_reading(0.81, true, &cfg(), t);
        assert!(matches!(steps.as_slice(), [Step::Entered { phase: Phase::Ready, .. }]), "{steps:?}");
        assert!(r.on_reading(0.82, true, &cfg(), t).is_empty());
        assert!(matches!(r.on_idle(), Some(Step::Start { abort_first: false, .. })));
    }

    #[test]
    fn past_hard_mid_turn_the_turn_drains_then_is_aborted() {
        let t = Instant::now();
        let mut r = Rollover::default();
        let steps = r.on_reading(0.9, true, &cfg(), t);
        assert_eq!(steps.len(), 2, "ready, drain: {steps:?}");
        assert_eq!(r.deadline(), Some(t + cfg().drain));
        assert_eq!(r.on_deadline(true, t + Duration::from_secs(1)), None);
        assert!(matches!(r.on_deadline(true, t + cfg().drain), Some(Step::Start { abort_first: true, .. })));
    }

    #[test]
    fn a_fresh_session_already_past_soft_is_not_handed_off_again() {
        let t = Instant::now();
        let mut r = Rollover::default();
        r.set_from("ses_old");
        assert_eq!(r.on_reading(0.8, false, &cfg(), t), vec![Step::LoopGuard { share: 0.8 }]);
        assert!(r.on_reading(0.9, false, &cfg(), t).is_empty());
        assert_eq!(r.on_idle(), None);
    }

    #[test]
    fn a_running_hand_off_survives_export_and_restore_and_is_resumed() {
        let mut r = Rollover::default();
        r.begin("hf_1".into(), HandoffMode::Fresh, Phase::Persisting, true, "why", 5);
        r.advance(Phase::HandingOver, None, None);
        let mut again = Rollover::default();
        again.restore(&r.export(), None);
        assert_eq!(again.phase(), Phase::HandingOver);
        assert!(again.suspends_automation());
        assert_eq!(again.interrupted(), Some(("hf_1".to_string(), true)));
        assert_eq!(again.request(false, "now"), None, "no second hand-off while one runs");
    }

    #[test]
    fn disabled_hand_off_only_keeps_the_loop_guard_quiet() {
        let t = Instant::now();
        let mut r = Rollover::default();
        let off = HandoffConfig { enabled: false, ..cfg() };
        assert!(r.on_reading(0.95, true, &off, t).is_empty());
        assert_eq!(r.on_idle(), None);
    }
}
