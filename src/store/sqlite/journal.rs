//! Table `journal`: append-only, one row per [`ActionRecord`], read back by
//! `shepherd history` (and by the notifier's catch-up, `super::super::notified`).
//! Shepherd never updates or deletes a row.

use rusqlite::{params, Connection};
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::ledger::LedgerError;

use super::storage_error;

pub(super) fn append(conn: &Connection, r: &ActionRecord) -> Result<(), LedgerError> {
    let at = || format!("appending to the journal of {}/{}", r.server, r.session);
    let numbers = serde_json::to_string(&r.numbers).map_err(|e| LedgerError::Storage(format!("{}: {e}", at())))?;
    conn.prepare_cached(
        "INSERT INTO journal (server, session, at_ms, action, outcome, reason, numbers_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut st| {
        st.execute(params![r.server, r.session, r.at_ms, r.action.as_str(), r.outcome.as_str(), r.reason, numbers])
    })
    .map(drop)
    .map_err(|e| storage_error(&at(), e))
}

/// One journal row as stored, before its text columns are parsed.
pub(in crate::store) struct JournalRow {
    id: i64,
    server: String,
    session: String,
    at_ms: i64,
    action: String,
    outcome: String,
    reason: String,
    numbers_json: String,
}

pub(super) fn history(conn: &Connection, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
    let rows: Vec<JournalRow> = conn
        .prepare_cached(
            "SELECT id, server, session, at_ms, action, outcome, reason, numbers_json
             FROM journal WHERE session = ?1 ORDER BY id DESC LIMIT ?2",
        )
        .and_then(|mut st| st.query_map(params![session, i64::from(limit)], JournalRow::read)?.collect())
        .map_err(|e| storage_error(&format!("reading the journal of {session}"), e))?;
    rows.into_iter().rev().map(JournalRow::into_record).collect()
}

impl JournalRow {
    pub(in crate::store) fn at_ms(&self) -> i64 {
        self.at_ms
    }

    /// A row of `SELECT id, server, session, at_ms, action, outcome, reason, numbers_json`.
    pub(in crate::store) fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<JournalRow> {
        Ok(JournalRow {
            id: r.get(0)?,
            server: r.get(1)?,
            session: r.get(2)?,
            at_ms: r.get(3)?,
            action: r.get(4)?,
            outcome: r.get(5)?,
            reason: r.get(6)?,
            numbers_json: r.get(7)?,
        })
    }

    pub(in crate::store) fn into_record(self) -> Result<ActionRecord, LedgerError> {
        let corrupt = |what: &str, e: serde_json::Error| {
            LedgerError::Corrupt(format!(
                "journal row {} (server {:?} session {:?}): {what}: {e}",
                self.id, self.server, self.session
            ))
        };
        let action: Action = serde_json::from_value(self.action.clone().into()).map_err(|e| corrupt("action", e))?;
        let outcome: Outcome =
            serde_json::from_value(self.outcome.clone().into()).map_err(|e| corrupt("outcome", e))?;
        let numbers: Numbers = serde_json::from_str(&self.numbers_json).map_err(|e| corrupt("numbers", e))?;
        Ok(ActionRecord {
            server: self.server,
            session: self.session,
            action,
            outcome,
            reason: self.reason,
            numbers,
            at_ms: self.at_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use shepherd_actors::ledger::Ledger;

    use super::super::SqliteLedger;
    use super::*;

    #[tokio::test]
    async fn every_action_and_outcome_reads_back_as_written() {
        let ledger = SqliteLedger::open_in_memory().unwrap();
        let actions = [
            Action::StallDetected,
            Action::Recover,
            Action::Abort,
            Action::Continue,
            Action::Backoff,
            Action::Pause,
            Action::Resume,
            Action::GiveUp,
            Action::Nudge,
            Action::Review,
            Action::Prompt,
        ];
        let outcomes = [Outcome::Done, Outcome::Declined, Outcome::Failed];
        let mut written = Vec::new();
        for (i, action) in actions.into_iter().enumerate() {
            let r = ActionRecord {
                server: "s".into(),
                session: "ses".into(),
                action,
                outcome: outcomes[i % outcomes.len()],
                reason: format!("r{i}"),
                numbers: Numbers { attempt: Some(i as u32), ..Numbers::default() },
                at_ms: i as i64,
            };
            ledger.append(&r).await.unwrap();
            written.push(r);
        }
        assert_eq!(ledger.history("ses", 100).await.unwrap(), written);
    }
}
