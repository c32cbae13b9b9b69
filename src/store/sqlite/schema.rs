//! The schema: one migration per version, and [`migrate`], which applies the missing
//! ones at open and refuses a file written by a newer Shepherd.

use rusqlite::{params, Connection, TransactionBehavior};
use shepherd_actors::ledger::LedgerError;

use super::{now_ms, storage_error};

/// The schema, one step per version; `schema_version` records the steps applied.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE session_state (
         server     TEXT    NOT NULL,
         session    TEXT    NOT NULL,
         state_json TEXT    NOT NULL,
         updated_ms INTEGER NOT NULL,
         PRIMARY KEY (server, session)
     );
     CREATE TABLE journal (
         id           INTEGER PRIMARY KEY AUTOINCREMENT,
         server       TEXT    NOT NULL,
         session      TEXT    NOT NULL,
         at_ms        INTEGER NOT NULL,
         action       TEXT    NOT NULL,
         outcome      TEXT    NOT NULL,
         reason       TEXT    NOT NULL,
         numbers_json TEXT    NOT NULL
     );
     CREATE INDEX journal_session_id ON journal (session, id);",
    ),
    (
        2,
        "CREATE TABLE handoff_snapshot (
         id            TEXT    PRIMARY KEY,
         server        TEXT    NOT NULL,
         session       TEXT    NOT NULL,
         created_ms    INTEGER NOT NULL,
         snapshot_json TEXT    NOT NULL,
         claimed_by    TEXT
     );
     CREATE INDEX handoff_snapshot_session ON handoff_snapshot (server, session, created_ms);",
    ),
    (
        3,
        "CREATE TABLE intent (
         server      TEXT    NOT NULL,
         decision    TEXT    NOT NULL,
         session     TEXT    NOT NULL,
         started_ms  INTEGER NOT NULL,
         intent_json TEXT    NOT NULL,
         PRIMARY KEY (server, decision)
     );",
    ),
    (
        4,
        "CREATE TABLE setting (
         key        TEXT PRIMARY KEY,
         value_json TEXT NOT NULL
     );",
    ),
    (
        5,
        "CREATE TABLE notified (
         key   TEXT    PRIMARY KEY,
         at_ms INTEGER NOT NULL
     );
     CREATE INDEX notified_at ON notified (at_ms);",
    ),
];

/// Creates or upgrades the schema in one transaction.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), LedgerError> {
    let at = |e| storage_error("migrating the schema", e);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(at)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER PRIMARY KEY,
             applied_ms INTEGER NOT NULL
         )",
    )
    .map_err(at)?;
    let current: i64 =
        tx.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_version", [], |r| r.get(0)).map_err(at)?;
    let latest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if current > latest {
        return Err(LedgerError::Storage(format!(
            "schema version {current} was written by a newer Shepherd (this one knows up to {latest})"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.execute_batch(sql).map_err(at)?;
        tx.execute("INSERT INTO schema_version (version, applied_ms) VALUES (?1, ?2)", params![version, now_ms()])
            .map_err(at)?;
    }
    tx.commit().map_err(at)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;
    use shepherd_actors::ledger::LedgerError;

    use super::super::SqliteLedger;

    #[tokio::test]
    async fn a_file_from_a_newer_shepherd_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite3");
        drop(SqliteLedger::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.execute("INSERT INTO schema_version (version, applied_ms) VALUES (99, 0)", []).unwrap();
        drop(conn);
        let err = SqliteLedger::open(&path).unwrap_err();
        assert!(matches!(&err, LedgerError::Storage(m) if m.contains("newer")), "{err}");
    }
}
