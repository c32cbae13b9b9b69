//! The session core's memory of advice: a consultation under way, the once-only
//! postponement of a stall's abort, and the part types the session stalled on. Pure.
//!
//! The rules it applies ("the model advises, rules decide"):
//! - before a stall's abort, advice `wait` at least `wait_confidence` sure postpones the
//!   abort by `postpone` — once per stall: when the postponed deadline comes the abort
//!   goes ahead without asking again; any activity of the session ends the stall and
//!   with it the postponement;
//! - before a nudge, `wait` at least `wait_confidence` or `abort` at least
//!   `abort_confidence` sure skips it — once per idle spell: the nudge is considered
//!   again after `postpone` and then goes without asking (advice may delay a nudge,
//!   never strand a session with open todos).

use std::collections::VecDeque;

use tokio::time::Instant;

use crate::advisor::{About, Advice, AdviceAction, Consulted, Situation};
use crate::config::AdvisorConfig;
use crate::event::PartKind;

/// How many earlier stalls' part types are remembered.
const STALL_MEMORY: usize = 4;

/// Asked of the advisor actor: the situation, and what the answer resumes.
#[derive(Debug, Clone, PartialEq)]
pub struct AdviceRequest {
    pub situation: Situation,
    /// The nudge's round, for a nudge (the decision waiting for the answer).
    pub round: u32,
}

/// What a piece of advice does to the decision it was sought for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The decision goes ahead as the rules made it.
    GoAhead,
    /// The abort waits (once) for `advisor.postpone`.
    Postpone,
    /// The nudge is not sent.
    Skip,
}

/// The rules deciding with the advice in hand.
pub fn verdict(about: About, advice: &Advice, cfg: &AdvisorConfig) -> Verdict {
    let wait = advice.action == AdviceAction::Wait && advice.confidence >= cfg.wait_confidence;
    let abort = advice.action == AdviceAction::Abort && advice.confidence >= cfg.abort_confidence;
    match about {
        About::Abort if wait => Verdict::Postpone,
        About::Nudge if wait || abort => Verdict::Skip,
        _ => Verdict::GoAhead,
    }
}

/// A journal reason for a consultation and its verdict (no secrets: the source's text
/// is built by the actor from status codes and parse errors only).
pub fn describe(about: About, c: &Consulted, v: Verdict, cfg: &AdvisorConfig) -> String {
    let what = match (about, v) {
        (About::Abort, Verdict::Postpone) => format!("abort postponed once by {:?}", cfg.postpone),
        (About::Nudge, Verdict::Skip) => {
            format!("nudge skipped, considered again in {:?} without asking", cfg.postpone)
        }
        (about, _) => format!("the {} goes ahead", about.as_str()),
    };
    format!("advisor before the {}: {} says {} ({}): {what}", about.as_str(), c.source, c.advice, c.why)
}

/// The advice state of one session.
#[derive(Debug, Clone, Default)]
pub struct AdviceGate {
    pending: Option<About>,
    postponed_until: Option<Instant>,
    /// The advice for this stall was heard and the abort may go ahead.
    abort_cleared: bool,
    /// A nudge was skipped on advice in this idle spell: the next one goes unasked.
    nudge_skipped: bool,
    part: Option<String>,
    /// The part types of the last [`STALL_MEMORY`] stalls. Boxed: most sessions never
    /// stall, and every session carries a gate (memory per session is a scale target).
    #[allow(clippy::box_collection)] // the box is the point: 8 bytes inline, not 32
    stall_parts: Option<Box<VecDeque<String>>>,
}

impl AdviceGate {
    /// A part of the session (not Shepherd's): what it was last working on.
    pub fn on_part(&mut self, kind: &PartKind) {
        let name = match kind {
            PartKind::Text { .. } => "text".to_string(),
            PartKind::Reasoning => "reasoning".to_string(),
            PartKind::Tool { tool, .. } => format!("tool:{tool}"),
            PartKind::Compaction => "compaction".to_string(),
            PartKind::StepStart | PartKind::StepFinish => return, // bookkeeping, not work
            PartKind::Other(other) => other.clone(),
        };
        self.part = Some(name);
    }

    /// Activity ends a stall (its postponement and its cleared advice go with it) and
    /// an idle spell (a later nudge is asked about afresh).
    pub fn on_activity(&mut self) {
        self.postponed_until = None;
        self.abort_cleared = false;
        self.nudge_skipped = false;
    }

    /// A consultation about `about` is under way.
    pub fn pending(&self) -> Option<About> {
        self.pending
    }

    /// The stall deadline, pushed back by a postponement.
    pub fn postponed(&self, stall_at: Instant) -> Instant {
        self.postponed_until.map_or(stall_at, |p| p.max(stall_at))
    }

    /// Before a stall's abort: `true` when advice must be sought first (and marks it
    /// pending); `false` when the abort goes ahead (advice already heard, or this stall
    /// was already postponed once).
    pub fn ask_before_abort(&mut self) -> bool {
        if self.abort_cleared || self.postponed_until.is_some() || self.pending.is_some() {
            return false;
        }
        self.pending = Some(About::Abort);
        true
    }

    /// Before a nudge: `true` when advice must be sought first (and marks it pending);
    /// `false` when a nudge was already skipped in this idle spell and goes ahead.
    pub fn ask_before_nudge(&mut self) -> bool {
        if std::mem::take(&mut self.nudge_skipped) {
            return false;
        }
        self.pending = Some(About::Nudge);
        true
    }

    /// The nudge was skipped on advice; the retry goes without asking.
    pub fn nudge_skipped(&mut self) {
        self.nudge_skipped = true;
    }

    /// The answer arrived.
    pub fn answered(&mut self) {
        self.pending = None;
    }

    pub fn postpone(&mut self, until: Instant) {
        self.postponed_until = Some(until);
    }

    pub fn clear_abort(&mut self, cleared: bool) {
        self.abort_cleared = cleared;
    }

    /// The abort goes ahead: this stall's part type joins the memory, the stall's
    /// advice state is spent.
    pub fn on_abort(&mut self) {
        if let Some(part) = &self.part {
            let stall_parts = self.stall_parts.get_or_insert_with(Default::default);
            if stall_parts.len() == STALL_MEMORY {
                stall_parts.pop_front();
            }
            stall_parts.push_back(part.clone());
        }
        self.postponed_until = None;
        self.abort_cleared = false;
    }

    pub fn part(&self) -> Option<String> {
        self.part.clone()
    }

    pub fn stall_parts(&self) -> Vec<String> {
        self.stall_parts.iter().flat_map(|p| p.iter().cloned()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn advice(action: AdviceAction, confidence: f64) -> Advice {
        Advice { action, confidence }
    }

    #[test]
    fn a_sure_wait_postpones_an_abort_and_anything_else_lets_it_go_ahead() {
        let cfg = AdvisorConfig::default();
        assert_eq!(verdict(About::Abort, &advice(AdviceAction::Wait, 0.9), &cfg), Verdict::Postpone);
        assert_eq!(verdict(About::Abort, &advice(AdviceAction::Wait, 0.69), &cfg), Verdict::GoAhead);
        assert_eq!(verdict(About::Abort, &advice(AdviceAction::Continue, 1.0), &cfg), Verdict::GoAhead);
    }

    #[test]
    fn a_sure_wait_or_abort_skips_a_nudge() {
        let cfg = AdvisorConfig::default();
        assert_eq!(verdict(About::Nudge, &advice(AdviceAction::Wait, 0.7), &cfg), Verdict::Skip);
        assert_eq!(verdict(About::Nudge, &advice(AdviceAction::Abort, 0.6), &cfg), Verdict::Skip);
        assert_eq!(verdict(About::Nudge, &advice(AdviceAction::Abort, 0.59), &cfg), Verdict::GoAhead);
        assert_eq!(verdict(About::Nudge, &advice(AdviceAction::Continue, 0.9), &cfg), Verdict::GoAhead);
    }

    #[test]
    fn an_abort_is_postponed_once_per_stall() {
        let mut g = AdviceGate::default();
        assert!(g.ask_before_abort());
        assert!(!g.ask_before_abort(), "one consultation at a time");
        g.answered();
        let t = Instant::now();
        g.postpone(t + Duration::from_secs(60));
        assert_eq!(g.postponed(t), t + Duration::from_secs(60));
        assert!(!g.ask_before_abort(), "the second time the abort goes ahead");
        g.on_abort();
        assert!(g.ask_before_abort(), "a new stall is asked about again");
    }

    #[test]
    fn activity_ends_the_postponement() {
        let mut g = AdviceGate::default();
        let t = Instant::now();
        g.postpone(t + Duration::from_secs(60));
        g.on_activity();
        assert_eq!(g.postponed(t), t);
    }

    #[test]
    fn stall_part_types_are_remembered_boundedly() {
        let mut g = AdviceGate::default();
        for i in 0..6 {
            g.on_part(&PartKind::Tool {
                tool: format!("t{i}"),
                status: crate::event::ToolStatus::Running,
                child_session: None,
                input: None,
            });
            g.on_part(&PartKind::StepFinish);
            g.on_abort();
        }
        assert_eq!(g.stall_parts(), vec!["tool:t2", "tool:t3", "tool:t4", "tool:t5"]);
        assert_eq!(g.part().as_deref(), Some("tool:t5"));
    }
}
