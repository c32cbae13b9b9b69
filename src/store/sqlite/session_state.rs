//! Table `session_state`: one row per `(server, session)`, the session core's
//! [`DurableState`] as JSON — what an evicted, rediscovered or restarted session resumes
//! from — and the sessions a restart must pick up again (an unfinished hand-off, a
//! scheduled resume).

use rusqlite::{params, Connection, OptionalExtension};
use shepherd_actors::ledger::{DurableState, LedgerError, HANDOFF_RUNNING_PHASES};

use super::storage_error;

pub(super) fn load(conn: &Connection, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
    let json: Option<String> = conn
        .prepare_cached("SELECT state_json FROM session_state WHERE server = ?1 AND session = ?2")
        .and_then(|mut st| st.query_row(params![server, session], |r| r.get(0)).optional())
        .map_err(|e| storage_error(&format!("loading {server}/{session}"), e))?;
    json.map(|json| {
        serde_json::from_str(&json)
            .map_err(|e| LedgerError::Corrupt(format!("session_state of server {server:?} session {session:?}: {e}")))
    })
    .transpose()
}

pub(super) fn save(
    conn: &Connection,
    server: &str,
    session: &str,
    state_json: &str,
    updated_ms: i64,
) -> Result<(), LedgerError> {
    conn.prepare_cached(
        "INSERT INTO session_state (server, session, state_json, updated_ms)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (server, session)
         DO UPDATE SET state_json = excluded.state_json, updated_ms = excluded.updated_ms",
    )
    .and_then(|mut st| st.execute(params![server, session, state_json, updated_ms]))
    .map(drop)
    .map_err(|e| storage_error(&format!("saving {server}/{session}"), e))
}

pub(super) fn unfinished_handoffs(conn: &Connection, server: &str) -> Result<Vec<String>, LedgerError> {
    let phases = HANDOFF_RUNNING_PHASES;
    conn.prepare_cached(
        "SELECT session FROM session_state WHERE server = ?1
         AND json_extract(state_json, '$.handoff.phase') IN (?2, ?3, ?4)",
    )
    .and_then(|mut st| st.query_map(params![server, phases[0], phases[1], phases[2]], |r| r.get(0))?.collect())
    .map_err(|e| storage_error(&format!("finding unfinished hand-offs of {server}"), e))
}

pub(super) fn scheduled_resumes(conn: &Connection, server: &str) -> Result<Vec<String>, LedgerError> {
    conn.prepare_cached(
        "SELECT session FROM session_state WHERE server = ?1
         AND json_extract(state_json, '$.outage.due_ms') IS NOT NULL",
    )
    .and_then(|mut st| st.query_map(params![server], |r| r.get(0))?.collect())
    .map_err(|e| storage_error(&format!("finding scheduled resumes of {server}"), e))
}
