//! Table `handoff_snapshot`: one row per hand-off, the sealed [`Snapshot`] as JSON and
//! the session it was restored into (the claim: a snapshot is restored once); a
//! readable copy goes to `handoffs/ID.md` beside the ledger file.

use std::path::Path;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use shepherd_actors::ids;
use shepherd_actors::ledger::{Claim, LedgerError, Snapshot, SnapshotStore};

use super::{storage_error, Command, SqliteLedger};
use crate::private_state;

#[async_trait]
impl SnapshotStore for SqliteLedger {
    async fn save_snapshot(&self, snapshot: &Snapshot) -> Result<Option<String>, LedgerError> {
        // The file name comes from a validated id, or its hash: never a path from the wire.
        let name = format!("{}.md", ids::file_stem(&snapshot.id));
        let readable = self.path.as_deref().and_then(Path::parent).map(|d| d.join("handoffs").join(name));
        let snapshot = Box::new(snapshot.clone());
        let shown = readable.as_ref().map(|p| p.display().to_string());
        self.ask(|reply| Command::SaveSnapshot { snapshot, readable, reply }).await?;
        Ok(shown)
    }

    async fn snapshots(&self, server: &str, session: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
        let (server, session) = (server.to_string(), session.to_string());
        self.ask(|reply| Command::Snapshots { server, session, reply }).await
    }

    async fn snapshot(&self, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
        let id = id.to_string();
        self.ask(|reply| Command::Snapshot { id, reply }).await
    }

    async fn claim(&self, id: &str, session: &str) -> Result<Claim, LedgerError> {
        let (id, session) = (id.to_string(), session.to_string());
        self.ask(|reply| Command::Claim { id, session, reply }).await
    }
}

pub(super) fn save_snapshot(conn: &Connection, s: &Snapshot, readable: Option<&Path>) -> Result<(), LedgerError> {
    let at = || format!("storing hand-off snapshot {}", s.id);
    let json = serde_json::to_string(s).map_err(|e| LedgerError::Storage(format!("{}: {e}", at())))?;
    conn.prepare_cached(
        "INSERT INTO handoff_snapshot (id, server, session, created_ms, snapshot_json) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (id) DO UPDATE SET snapshot_json = excluded.snapshot_json",
    )
    .and_then(|mut st| st.execute(params![s.id, s.server, s.session, s.created_ms, json]))
    .map_err(|e| storage_error(&at(), e))?;
    if let Some(path) = readable {
        // The readable copy is a convenience: failing to write it is logged, not fatal.
        if let Err(e) = private_state::write_file(path, s.continuation.as_bytes()) {
            tracing::warn!(path = %path.display(), error = %e, "could not write the readable copy of a hand-off snapshot");
        }
    }
    Ok(())
}

fn parse_snapshot(id: &str, json: &str) -> Result<Snapshot, LedgerError> {
    serde_json::from_str(json).map_err(|e| LedgerError::Corrupt(format!("hand-off snapshot {id}: {e}")))
}

pub(super) fn snapshots(
    conn: &Connection,
    server: &str,
    session: &str,
) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
    let rows: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT id, snapshot_json FROM handoff_snapshot WHERE server = ?1 AND session = ?2
             ORDER BY created_ms DESC, rowid DESC",
        )
        .and_then(|mut st| st.query_map(params![server, session], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(|e| storage_error(&format!("reading the hand-off snapshots of {server}/{session}"), e))?;
    Ok(rows.iter().map(|(id, json)| parse_snapshot(id, json)).collect())
}

pub(super) fn snapshot(conn: &Connection, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
    let json: Option<String> = conn
        .prepare_cached("SELECT snapshot_json FROM handoff_snapshot WHERE id = ?1")
        .and_then(|mut st| st.query_row(params![id], |r| r.get(0)).optional())
        .map_err(|e| storage_error(&format!("reading hand-off snapshot {id}"), e))?;
    Ok(json.map(|j| parse_snapshot(id, &j)))
}

pub(super) fn claim(conn: &Connection, id: &str, session: &str) -> Result<Claim, LedgerError> {
    let at = || format!("claiming hand-off snapshot {id}");
    let claimed: Option<Option<String>> = conn
        .prepare_cached("SELECT claimed_by FROM handoff_snapshot WHERE id = ?1")
        .and_then(|mut st| st.query_row(params![id], |r| r.get(0)).optional())
        .map_err(|e| storage_error(&at(), e))?;
    match claimed {
        None => Err(LedgerError::Storage(format!("{}: no such snapshot", at()))),
        Some(Some(by)) if by != session => Ok(Claim::Taken { by }),
        Some(_) => {
            conn.prepare_cached("UPDATE handoff_snapshot SET claimed_by = ?2 WHERE id = ?1")
                .and_then(|mut st| st.execute(params![id, session]))
                .map_err(|e| storage_error(&at(), e))?;
            Ok(Claim::Granted)
        }
    }
}
