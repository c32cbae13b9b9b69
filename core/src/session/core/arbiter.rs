//! The arbiter: which behaviour acts first, stated in one place.
//!
//! - **At the idle edge** ([`SessionCore::on_idle_edge`]): a hand-off that is due
//!   starts and nothing else happens; otherwise a compaction may start, then the soft
//!   hand-off note (unless a compaction just started or the session is paused), then
//!   the follow-ups (nudge/review) are armed, then a provider outage is counted.
//!   Nothing is decided at the edge Shepherd's own recovery caused.
//! - **At a deadline** ([`SessionCore::on_deadline`]): a timed hold that ends now lets
//!   every other clock decide in the same moment; a lost answer's verification comes
//!   before the stall clock; while blind no clock that measures silence runs; then
//!   follow-ups, the orphan wait, the provider resume and the stall, in that order; the
//!   hand-off's drain past `hard` last (it waits while a person is asked or the session
//!   is paused).
//! - **The next deadline** ([`SessionCore::deadline`]): the earliest of every clock's.

use super::*;

impl SessionCore {
    /// The busy→idle edge: the turn ended. Who acts, in order (see the module's docs).
    pub(super) fn on_idle_edge(&mut self, now: Now, out: &mut Vec<Effect>) {
        let ours = self.recovering.is_some();
        self.busy = RunState::Idle;
        self.idle_edge_since_blind = true;
        // OpenCode's own compaction ends with the turn (also when our abort
        // ended it: its bound must not outlive it into the next turn).
        self.compacting = None;
        // Paused: no hand-off starts (it waits for the person to write).
        let mut step = if ours || self.pause.is_some() { None } else { self.rollover.on_idle() };
        let note = step.take_if(|s| matches!(s, Step::SoftNote { .. }));
        if let Some(start) = step {
            // The hand-off goes first: no compaction, nudge or review now.
            out.extend(self.on_rollover_step(start, now));
        } else {
            if !ours && !self.compaction_in_flight && !self.rollover.suspends_automation() {
                out.extend(self.consider_compaction(now));
            }
            // A compaction starting now makes the soft note moot (and a note
            // stored during it would make OpenCode run a turn to answer it).
            // Nor is a note for a paused session.
            if let Some(note) = note.filter(|_| !self.compaction_in_flight && self.pause.is_none()) {
                out.extend(self.on_rollover_step(note, now));
            }
            self.followup.on_idle_edge(now.mono, &self.todos, ours, &self.cfg.nudge, &self.cfg.review);
            if !ours {
                out.extend(self.on_turn_ended(now));
            }
        }
    }

    /// When [`SessionCore::on_deadline`] should next be called, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        // Blind: no clock that measures the session's silence (the hand-off's drain
        // bounds a turn, not a silence: it runs on).
        let watched = !self.blind;
        [
            self.stall_deadline(),
            self.followup.deadline().filter(|_| watched),
            self.family.as_ref().and_then(|f| f.deadline()).filter(|_| watched),
            // The drain past `hard` ends in an abort: it waits while a person is asked
            // or automation is paused.
            self.rollover.deadline().filter(|_| self.waiting_on_person.is_empty() && self.pause.is_none()),
            self.verify.at(),
            self.hold_deadline(),
            self.outage.as_ref().and_then(|o| o.deadline()).filter(|_| watched),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Called when [`SessionCore::deadline`] has passed: decides whether the session
    /// is stalled and what to do about it.
    pub fn on_deadline(&mut self, now: Now) -> Vec<Effect> {
        // A timed hold that ends now lets every other clock decide in this same moment.
        let mut out = self.on_hold_deadline(now);
        // First: while the ledger is read, the stall clock waits (see `stall_deadline`).
        if self.verify.at().is_some_and(|at| at <= now.mono) {
            self.verify = Verify::Finding;
            out.push(Effect::FindIntents);
        }
        if !self.blind {
            out.extend(self.on_watched_deadlines(now));
        }
        // The drain past `hard` ends in an abort: it waits while a person is asked or
        // automation is paused.
        if self.waiting_on_person.is_empty() && self.pause.is_none() {
            if let Some(step) = self.rollover.on_deadline(self.busy != RunState::Idle, now.mono) {
                out.extend(self.on_rollover_step(step, now));
            }
        }
        out
    }

    /// The deadlines of the clocks that measure the session's silence (none while blind).
    pub(super) fn on_watched_deadlines(&mut self, now: Now) -> Vec<Effect> {
        let facts = Facts {
            idle: self.busy == RunState::Idle,
            pause: self.pause,
            busy_with_other_work: self.recovering.is_some()
                || self.is_compacting()
                || self.rollover.suspends_automation(),
            waiting_on_person: !self.waiting_on_person.is_empty(),
            last_reply: &self.last_reply,
            todos: &self.todos,
        };
        let decisions = self.followup.on_deadline(now.mono, &facts, &self.cfg.nudge, &self.cfg.review);
        let mut out: Vec<Effect> = decisions.into_iter().flat_map(|d| self.decision_effects(d, now)).collect();
        out.extend(self.on_orphan_deadline(now));
        out.extend(self.on_resume_deadline(now));
        out.extend(self.on_stall_deadline(now));
        out
    }
}
