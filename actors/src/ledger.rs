//! The ledger port: what Shepherd must not forget about a session — across actor
//! eviction, rediscovery and restarts — and the append-only journal of its actions.
//!
//! The core exports and restores a [`DurableState`]; the session actor saves it after
//! every decision and loads it when the actor is created. Adapters: SQLite (embedded
//! default, in the binary's `store` module) and an in-memory one for tests.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::event::Todo;
use crate::journal::ActionRecord;

/// What survives: counters, flags and the last todo snapshot. Times are wall-clock
/// epoch milliseconds (monotonic instants do not survive a restart).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DurableState {
    pub attempts: u32,
    pub auto_submits: u32,
    /// `user_abort` or `gave_up`.
    pub paused: Option<String>,
    pub todos: Vec<Todo>,
    pub nudges_without_progress: u32,
    /// The todo snapshot (`content`, `status`) at the last nudge.
    pub nudge_snapshot: Option<Vec<(String, String)>>,
    pub last_nudge_ms: Option<i64>,
    pub review_armed: bool,
    pub review_rounds: u32,
    /// The last assistant message Shepherd already continued after a server restart
    /// interrupted it (so it is continued once).
    pub interrupted_continued: Option<String>,
    pub last_action: Option<String>,
    pub last_action_ms: Option<i64>,
}

/// Why the ledger could not be read or written. Shepherd keeps running on errors
/// (they are logged and counted); a session then acts on what it has in memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger storage: {0}")]
    Storage(String),
    #[error("ledger data: {0}")]
    Corrupt(String),
}

/// Durable per-session state and the action journal.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError>;
    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError>;
    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError>;
    /// The journal of one session, oldest first, at most `limit` newest entries.
    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError>;
}

/// A ledger in memory: for tests, and for `--ledger memory` runs that need no disk.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    states: Mutex<HashMap<(String, String), DurableState>>,
    journal: Mutex<Vec<ActionRecord>>,
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
        let states = self.states.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(states.get(&(server.to_string(), session.to_string())).cloned())
    }

    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError> {
        let mut states = self.states.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        states.insert((server.to_string(), session.to_string()), state.clone());
        Ok(())
    }

    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError> {
        self.journal.lock().map_err(|e| LedgerError::Storage(e.to_string()))?.push(record.clone());
        Ok(())
    }

    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
        let journal = self.journal.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        let all: Vec<_> = journal.iter().filter(|r| r.session == session).cloned().collect();
        let skip = all.len().saturating_sub(limit as usize);
        Ok(all.into_iter().skip(skip).collect())
    }
}
