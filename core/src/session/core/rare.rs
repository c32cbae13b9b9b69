//! What a session rarely has: loop and crash memory that most sessions of a fleet never
//! fill. Kept in one box ([`SessionCore::rare`] reads, [`SessionCore::rare_mut`] makes it on
//! the first write): 8 bytes inline where the fields took 108 in every session (memory
//! per session is a scale target). Writes that only clear go through `rare.as_deref_mut()`
//! and make nothing.

use super::*;

#[derive(Debug, Default)]
pub(super) struct Rare {
    /// The interrupted assistant message already continued after a server restart.
    pub(super) interrupted_continued: Option<String>,
    /// Recent assistant messages that ended with `finish: "unknown"` and no output.
    pub(super) empty_finishes: Vec<(String, Instant)>,
    /// Runaway loops already broken for this session since the last real progress.
    pub(super) runaways: u32,
    /// Continues since the last real progress (repeated continues → escalation).
    pub(super) continues: ContinueHistory,
    /// Decisions of open intents being resumed (after a restart or reconnect).
    pub(super) resuming: Vec<String>,
}

impl SessionCore {
    pub(super) fn rare(&self) -> Option<&Rare> {
        self.rare.as_deref()
    }

    pub(super) fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }
}
