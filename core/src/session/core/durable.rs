//! What survives: [`SessionCore::export`] and [`SessionCore::restore`] of the
//! [`DurableState`] the ledger keeps.

use super::*;

impl SessionCore {
    /// What must survive eviction and restarts (see [`DurableState`]).
    pub fn export(&self, now: Now) -> DurableState {
        let f = self.followup.export(now.mono);
        DurableState {
            attempts: self.attempts,
            auto_submits: self.auto_submits,
            paused: self.pause.map(|p| p.as_str().to_string()),
            paused_until_ms: self.hold_until.as_ref().map(|u| u.wall_ms),
            todos: self.todos.to_vec(),
            nudges_without_progress: f.nudges_without_progress,
            nudge_snapshot: f
                .nudge_snapshot
                .map(|snap| snap.into_iter().map(|(c, st)| (c, status_name(st).to_string())).collect()),
            last_nudge_ms: f.since_last_nudge.map(|d| now.wall_ms - ms(d) as i64),
            review_armed: f.review_armed,
            review_rounds: f.review_rounds,
            interrupted_continued: self.rare().and_then(|r| r.interrupted_continued.clone()),
            last_action: None,
            last_action_ms: None,
            handoff: self.rollover.export(),
            handoff_from: self.rollover.from().map(str::to_string),
            outage: self.outage.as_ref().map(|o| o.memory().clone()).unwrap_or_default(),
        }
    }

    /// Resumes from what the ledger remembered: counters, flags, the todo snapshot.
    pub fn restore(&mut self, d: &DurableState, now: Now) {
        self.touch();
        self.attempts = d.attempts;
        self.auto_submits = d.auto_submits;
        // A fleet pause is the supervisor's to give (it tells every actor it creates while
        // the fleet is paused): one remembered from before is not kept.
        self.pause = d.paused.as_deref().and_then(Pause::parse).filter(|p| *p != Pause::Fleet);
        self.hold_until = match (self.pause, d.paused_until_ms) {
            (Some(Pause::Person), Some(wall_ms)) => Some(Box::new(hold::HoldUntil::at(wall_ms, now))),
            _ => None,
        };
        self.todos = Arc::from(d.todos.as_slice());
        if d.interrupted_continued.is_some() || self.rare.is_some() {
            self.rare_mut().interrupted_continued.clone_from(&d.interrupted_continued);
        }
        self.rollover.restore(&d.handoff, d.handoff_from.as_deref());
        self.outage =
            (d.outage != OutageMemory::default()).then(|| Box::new(Outage::restore(&d.outage, now.mono, now.wall_ms)));
        let since_last_nudge =
            d.last_nudge_ms.map(|t| Duration::from_millis(now.wall_ms.saturating_sub(t).max(0) as u64));
        self.followup.restore(
            followup::FollowUpMemory {
                nudges_without_progress: d.nudges_without_progress,
                nudge_snapshot: d
                    .nudge_snapshot
                    .as_ref()
                    .map(|snap| snap.iter().filter_map(|(c, st)| Some((c.clone(), status_from_name(st)?))).collect()),
                since_last_nudge,
                review_armed: d.review_armed,
                review_rounds: d.review_rounds,
            },
            now.mono,
        );
        self.followup.resume_armed_review(now.mono, &self.cfg.review);
    }
}

pub(super) fn status_name(s: crate::event::TodoStatus) -> &'static str {
    use crate::event::TodoStatus::*;
    match s {
        Pending => "pending",
        InProgress => "in_progress",
        Completed => "completed",
        Cancelled => "cancelled",
    }
}

pub(super) fn status_from_name(s: &str) -> Option<crate::event::TodoStatus> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
}
