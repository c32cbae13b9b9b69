//! Table `intent`: the actions begun and not yet finished, one row per
//! `(server, decision)`, so a crash or a lost answer leaves something to finish.

use async_trait::async_trait;
use rusqlite::{params, Connection};
use shepherd_actors::ledger::{Intent, IntentLog, LedgerError};

use super::{storage_error, Command, SqliteLedger};

#[async_trait]
impl IntentLog for SqliteLedger {
    async fn put_intent(&self, intent: &Intent) -> Result<(), LedgerError> {
        let intent = Box::new(intent.clone());
        self.ask(|reply| Command::PutIntent { intent, reply }).await
    }

    async fn end_intent(&self, server: &str, decision: &str) -> Result<(), LedgerError> {
        let (server, decision) = (server.to_string(), decision.to_string());
        self.ask(|reply| Command::EndIntent { server, decision, reply }).await
    }

    async fn open_intents(&self, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
        let (server, session) = (server.to_string(), session.map(str::to_string));
        self.ask(|reply| Command::OpenIntents { server, session, reply }).await
    }
}

pub(super) fn put_intent(conn: &Connection, intent: &Intent) -> Result<(), LedgerError> {
    let at = || format!("writing intent {} of {}/{}", intent.decision, intent.server, intent.session);
    let json = serde_json::to_string(intent).map_err(|e| LedgerError::Storage(format!("{}: {e}", at())))?;
    conn.prepare_cached(
        "INSERT INTO intent (server, decision, session, started_ms, intent_json) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (server, decision) DO UPDATE SET intent_json = excluded.intent_json",
    )
    .and_then(|mut st| st.execute(params![intent.server, intent.decision, intent.session, intent.started_ms, json]))
    .map(drop)
    .map_err(|e| storage_error(&at(), e))
}

/// The open intents of a server (or one of its sessions), oldest first. A row that
/// does not parse is logged and skipped: it cannot be resumed, and must not stop the
/// others.
pub(super) fn end_intent(conn: &Connection, server: &str, decision: &str) -> Result<(), LedgerError> {
    conn.prepare_cached("DELETE FROM intent WHERE server = ?1 AND decision = ?2")
        .and_then(|mut st| st.execute(params![server, decision]))
        .map(drop)
        .map_err(|e| storage_error(&format!("closing intent {decision} of {server}"), e))
}

pub(super) fn open_intents(conn: &Connection, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
    let rows: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT decision, intent_json FROM intent WHERE server = ?1 AND (?2 IS NULL OR session = ?2)
             ORDER BY started_ms",
        )
        .and_then(|mut st| st.query_map(params![server, session], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
        .map_err(|e| storage_error(&format!("reading the open intents of {server}"), e))?;
    Ok(rows
        .into_iter()
        .filter_map(|(decision, json)| match serde_json::from_str(&json) {
            Ok(intent) => Some(intent),
            Err(e) => {
                tracing::warn!(server, decision = %decision, error = %e, "ledger: an unreadable intent is skipped");
                None
            }
        })
        .collect())
}
