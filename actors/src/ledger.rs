//! The ledger port: the traits the adapters (SQLite in the binary's `store`, memory
//! here) implement, and [`MemoryLedger`]. The records they keep — [`DurableState`],
//! [`Intent`], [`Snapshot`], … — are `shepherd_core::ledger`'s, re-exported here.

pub use shepherd_core::ledger::*;

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;

use crate::journal::ActionRecord;

mod notified;
pub use notified::NotifyLedger;

/// Durable per-session state, the action journal, hand-off snapshots and intents.
#[async_trait]
pub trait Ledger: SnapshotStore + IntentLog + FleetSettings {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError>;
    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError>;
    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError>;
    /// Writes records of one session and, when given, its state, as one write: a
    /// session's records and the state naming the last of them reach the ledger together,
    /// and it costs the caller one round trip instead of one per record plus one for the
    /// state (a recovery makes four records). An adapter that can makes it atomic (SQLite:
    /// both or neither); this default writes each in turn and reports the first failure.
    async fn write(
        &self,
        server: &str,
        session: &str,
        records: &[ActionRecord],
        state: Option<&DurableState>,
    ) -> Result<(), LedgerError> {
        let mut first_failure = None;
        for record in records {
            if let Err(e) = self.append(record).await {
                first_failure.get_or_insert(e);
            }
        }
        if let Some(state) = state {
            if let Err(e) = self.save(server, session, state).await {
                first_failure.get_or_insert(e);
            }
        }
        first_failure.map_or(Ok(()), Err)
    }
    /// The journal of one session, oldest first, at most `limit` newest entries.
    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError>;
    /// Sessions of `server` whose hand-off was under way when Shepherd stopped: they are
    /// resumed at start-up even if the session itself stays quiet.
    async fn unfinished_handoffs(&self, server: &str) -> Result<Vec<String>, LedgerError>;
    /// Sessions of `server` with a provider-outage resume scheduled (`outage.due_ms`):
    /// they get an actor at start-up, or nothing would wake them. A ledger that keeps
    /// no such state has none.
    async fn scheduled_resumes(&self, _server: &str) -> Result<Vec<String>, LedgerError> {
        Ok(Vec::new())
    }
}

/// A ledger in memory: for tests, and for `--ledger memory` runs that need no disk.
#[derive(Debug, Default)]
pub struct MemoryLedger {
    states: Mutex<HashMap<(String, String), DurableState>>,
    journal: Mutex<Vec<ActionRecord>>,
    /// Snapshots in the order written, with the session that claimed each.
    snapshots: Mutex<Vec<(Snapshot, Option<String>)>>,
    /// Open intents by (server, decision).
    intents: Mutex<HashMap<(String, String), Intent>>,
    fleet_pause: Mutex<Option<FleetPause>>,
    /// Notification keys and when each was sent (`NotifyLedger`).
    notified: Mutex<HashMap<String, i64>>,
    /// Server → until when its stream was watched (`FleetSettings::watched_until`).
    watched_until: Mutex<HashMap<String, i64>>,
}

#[async_trait]
impl FleetSettings for MemoryLedger {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
        Ok(self.fleet_pause.lock().map_err(|e| LedgerError::Storage(e.to_string()))?.clone())
    }

    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError> {
        *self.fleet_pause.lock().map_err(|e| LedgerError::Storage(e.to_string()))? = pause.cloned();
        Ok(())
    }

    async fn watched_until(&self, server: &str) -> Result<Option<i64>, LedgerError> {
        Ok(self.watched_until.lock().map_err(|e| LedgerError::Storage(e.to_string()))?.get(server).copied())
    }

    async fn set_watched_until(&self, server: &str, wall_ms: i64) -> Result<(), LedgerError> {
        self.watched_until.lock().map_err(|e| LedgerError::Storage(e.to_string()))?.insert(server.to_string(), wall_ms);
        Ok(())
    }
}

#[async_trait]
impl IntentLog for MemoryLedger {
    async fn put_intent(&self, intent: &Intent) -> Result<(), LedgerError> {
        let mut all = self.intents.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        all.insert((intent.server.clone(), intent.decision.clone()), intent.clone());
        Ok(())
    }

    async fn end_intent(&self, server: &str, decision: &str) -> Result<(), LedgerError> {
        let mut all = self.intents.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        all.remove(&(server.to_string(), decision.to_string()));
        Ok(())
    }

    async fn open_intents(&self, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
        let all = self.intents.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        let mut open: Vec<Intent> = all
            .values()
            .filter(|i| i.server == server && session.is_none_or(|s| s == i.session))
            .cloned()
            .collect();
        open.sort_by_key(|i| i.started_ms);
        Ok(open)
    }
}

#[async_trait]
impl SnapshotStore for MemoryLedger {
    async fn save_snapshot(&self, snapshot: &Snapshot) -> Result<Option<String>, LedgerError> {
        let mut all = self.snapshots.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        all.retain(|(s, _)| s.id != snapshot.id);
        all.push((snapshot.clone(), None));
        Ok(None)
    }

    async fn snapshots(&self, server: &str, session: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
        let all = self.snapshots.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(all
            .iter()
            .rev()
            .filter(|(s, _)| s.server == server && s.session == session)
            .map(|(s, _)| Ok(s.clone()))
            .collect())
    }

    async fn snapshot(&self, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
        let all = self.snapshots.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(all.iter().find(|(s, _)| s.id == id).map(|(s, _)| Ok(s.clone())))
    }

    async fn claim(&self, id: &str, session: &str) -> Result<Claim, LedgerError> {
        let mut all = self.snapshots.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        let Some((_, claimed)) = all.iter_mut().find(|(s, _)| s.id == id) else {
            return Err(LedgerError::Storage(format!("no snapshot {id}")));
        };
        match claimed {
            Some(by) if by != session => Ok(Claim::Taken { by: by.clone() }),
            _ => {
                *claimed = Some(session.to_string());
                Ok(Claim::Granted)
            }
        }
    }
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

    async fn unfinished_handoffs(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        let states = self.states.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(states
            .iter()
            .filter(|((srv, _), st)| srv == server && HANDOFF_RUNNING_PHASES.contains(&st.handoff.phase.as_str()))
            .map(|((_, id), _)| id.clone())
            .collect())
    }

    async fn scheduled_resumes(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        let states = self.states.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        Ok(states
            .iter()
            .filter(|((srv, _), st)| srv == server && st.outage.due_ms.is_some())
            .map(|((_, id), _)| id.clone())
            .collect())
    }

    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
        let journal = self.journal.lock().map_err(|e| LedgerError::Storage(e.to_string()))?;
        let all: Vec<_> = journal.iter().filter(|r| r.session == session).cloned().collect();
        let skip = all.len().saturating_sub(limit as usize);
        Ok(all.into_iter().skip(skip).collect())
    }
}

/// Where hand-off snapshots are kept: beside the ledger.
#[async_trait]
pub trait SnapshotStore: Send + Sync + 'static {
    /// Stores a snapshot (and, on disk, a readable `.md`, whose path is returned).
    async fn save_snapshot(&self, snapshot: &Snapshot) -> Result<Option<String>, LedgerError>;
    /// The snapshots of one session, newest first; unreadable rows are `Err`.
    async fn snapshots(&self, server: &str, session: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError>;
    /// One snapshot by id.
    async fn snapshot(&self, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError>;
    /// Claims a snapshot for the session it is restored into; idempotent per session.
    async fn claim(&self, id: &str, session: &str) -> Result<Claim, LedgerError>;
}

/// Settings of the whole fleet that survive restarts.
#[async_trait]
pub trait FleetSettings: Send + Sync + 'static {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError>;
    /// Sets (or with `None` lifts) the fleet-wide pause.
    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError>;
    /// Until when (wall ms) Shepherd last knew it saw every event of `server`'s stream:
    /// what the server's sessions did after it, no Shepherd saw ([`None`]: never
    /// recorded — a first start).
    async fn watched_until(&self, server: &str) -> Result<Option<i64>, LedgerError>;
    /// Records until when `server`'s stream was watched.
    async fn set_watched_until(&self, server: &str, wall_ms: i64) -> Result<(), LedgerError>;
}

/// Where intents are kept: beside the ledger, written (and awaited) before each step.
#[async_trait]
pub trait IntentLog: Send + Sync + 'static {
    /// Writes the intent, replacing the one with the same (server, decision).
    async fn put_intent(&self, intent: &Intent) -> Result<(), LedgerError>;
    /// The intent's outcome is known (and journaled): forget it.
    async fn end_intent(&self, server: &str, decision: &str) -> Result<(), LedgerError>;
    /// The open intents of a server (of one session when given), oldest first.
    async fn open_intents(&self, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError>;
}
