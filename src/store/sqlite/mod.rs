//! The SQLite ledger: the embedded, on-disk adapter of the [`Ledger`] port.
//!
//! What it stores, and why:
//! - `session_state` — one row per `(server, session)`: the session core's
//!   [`DurableState`] as JSON (counters, the pause flag, the last todo snapshot, nudge and
//!   review bookkeeping, the last action and its time) and when it was written. An
//!   evicted or rediscovered session, or a restarted Shepherd, loads it and resumes:
//!   no second nudge, review or continue for an edge already handled. JSON rather than
//!   columns because the state is the core's to shape: `DurableState` is
//!   `#[serde(default)]`, so fields can be added without a migration.
//! - `journal` — append-only, one row per [`ActionRecord`] (what, outcome, why, when,
//!   the numbers that decided it), read by `shepherd history`. Shepherd never updates or
//!   deletes a row.
//! - `handoff_snapshot` — one row per hand-off: the sealed [`Snapshot`] (the continuation
//!   a fresh session receives) as JSON, and the session it was restored into (the
//!   claim: a snapshot is restored once). A readable copy goes to `handoffs/ID.md` beside
//!   the ledger file. A row whose checksum does not verify is skipped for the newest
//!   intact one.
//! - `schema_version` — the migrations applied; [`SqliteLedger::open`] runs the missing
//!   ones and refuses a file written by a newer Shepherd.
//!
//! How it keeps the actors from blocking: one connection, owned by a dedicated thread
//! (`shepherd-ledger`). The async methods send a command over a channel and await a
//! one-shot reply, so no runtime thread — including actix's single-threaded one — ever
//! waits on the disk or on SQLite's lock. The thread takes everything queued and runs it
//! in one transaction (a group commit: a thousand sessions saving at once cost one
//! commit), replying after the commit. WAL mode lets `shepherd history`, another
//! process, read while the daemon writes; `synchronous = NORMAL` keeps the file
//! consistent after any crash (a power cut may lose the last commits, never corrupt).
//!
//! What it must not do: panic on what it reads. A row that does not parse is a
//! [`LedgerError::Corrupt`] naming the row; other rows still load.
//!
//! Parts: `writer` (the thread, its commands and the group commit), `schema` (the
//! migrations), and one module per table with its SQL and the port it serves:
//! `session_state`, `journal`, `handoff` (`handoff_snapshot`), `intent`, `setting`. The
//! `notified` table is `super::notified`; the log's checkpoints are `super::checkpoint`.
//!
//! [`Snapshot`]: shepherd_actors::ledger::Snapshot

mod handoff;
mod intent;
mod journal;
mod schema;
mod session_state;
mod setting;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::checkpoint;
use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use shepherd_actors::config::StoreConfig;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::ledger::{DurableState, Ledger, LedgerError};
use tokio::sync::oneshot;

use self::schema::migrate;
use self::writer::{serve, Reply, StateRow};
use crate::private_state;

pub(super) use self::journal::JournalRow;
pub(super) use self::writer::{Command, Finished, Job};

/// How long a statement waits for another connection's lock (e.g. a migration by a
/// second process) before failing. Not a tuning knob: with WAL, readers never block the
/// writer and Shepherd is the only writer, so this only bounds a pathological wait.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The ledger in one SQLite file (or in memory, for tests). Cheap to share behind an
/// `Arc`; dropping the last handle lets the writer thread finish what is queued and
/// close the file.
#[derive(Debug)]
pub struct SqliteLedger {
    commands: mpsc::Sender<Command>,
    path: Option<PathBuf>,
}

impl SqliteLedger {
    /// Opens (creating it and its folders if missing) the ledger at `path`, switches it
    /// to WAL and runs the missing migrations. Blocks while it does: call it at start-up
    /// or from `spawn_blocking`, not from an actor.
    pub fn open(path: &Path) -> Result<SqliteLedger, LedgerError> {
        Self::open_with_cache(path, StoreConfig::default().cache_kib)
    }

    /// [`SqliteLedger::open`] with a page cache of `cache_kib` KiB (`store.cache_kib`).
    pub fn open_with_cache(path: &Path, cache_kib: u32) -> Result<SqliteLedger, LedgerError> {
        let at = |e: rusqlite::Error| storage_error(&format!("{}", path.display()), e);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            private_state::create_dir(dir)
                .map_err(|e| LedgerError::Storage(format!("creating {}: {e}", dir.display())))?;
        }
        // Created 0600 (never through a link) before SQLite opens it: SQLite gives its
        // `-wal`, `-shm` and `-journal` files the database file's mode.
        private_state::ensure_file(path)
            .map_err(|e| LedgerError::Storage(format!("opening {}: {e}", path.display())))?;
        let flags = OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let mut conn = Connection::open_with_flags(path, flags).map_err(at)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(at)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(at)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "ledger: WAL mode refused; readers may wait for writes");
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL").map_err(at)?;
        // Negative: a size in KiB rather than in pages.
        conn.execute_batch(&format!("PRAGMA cache_size = -{cache_kib}")).map_err(at)?;
        migrate(&mut conn).map_err(|e| prefix(&path.display().to_string(), e))?;
        Self::start(conn, Some(path.to_path_buf()))
    }

    /// A ledger that lives and dies with this value: for tests.
    pub fn open_in_memory() -> Result<SqliteLedger, LedgerError> {
        let at = |e| storage_error("in-memory ledger", e);
        let mut conn = Connection::open_in_memory().map_err(at)?;
        migrate(&mut conn)?;
        Self::start(conn, None)
    }

    /// The file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn start(conn: Connection, path: Option<PathBuf>) -> Result<SqliteLedger, LedgerError> {
        let (commands, queue) = mpsc::channel();
        // A file's log is copied back, and read ahead of the writer, by two threads of
        // their own (see `checkpoint`); the writer tells them where it is in the log, and
        // that it has stopped by dropping its end.
        let mut checkpointer = None;
        if let Some(path) = &path {
            let at = |e| storage_error(&path.display().to_string(), e);
            conn.execute_batch("PRAGMA wal_autocheckpoint = 0").map_err(at)?;
            match checkpoint::start(path.clone(), &conn) {
                Ok(end) => checkpointer = Some(end),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ledger: no checkpointer thread; the writer checkpoints");
                    conn.execute_batch("PRAGMA wal_autocheckpoint = 1000").map_err(at)?;
                }
            }
        }
        std::thread::Builder::new()
            .name("shepherd-ledger".into())
            .spawn(move || serve(conn, queue, checkpointer))
            .map_err(|e| LedgerError::Storage(format!("starting the ledger thread: {e}")))?;
        Ok(SqliteLedger { commands, path })
    }

    pub(super) async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(make(reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

#[async_trait]
impl Ledger for SqliteLedger {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
        let (server, session) = (server.to_string(), session.to_string());
        self.ask(|reply| Command::Load { server, session, reply }).await
    }

    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError> {
        self.write(server, session, &[], Some(state)).await
    }

    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError> {
        self.write(&record.server, &record.session, std::slice::from_ref(record), None).await
    }

    async fn write(
        &self,
        server: &str,
        session: &str,
        records: &[ActionRecord],
        state: Option<&DurableState>,
    ) -> Result<(), LedgerError> {
        let state = match state {
            Some(state) => Some(Box::new(StateRow {
                state_json: serde_json::to_string(state)
                    .map_err(|e| LedgerError::Storage(format!("encoding the state of {server}/{session}: {e}")))?,
                server: server.to_string(),
                session: session.to_string(),
                updated_ms: now_ms(),
            })),
            None => None,
        };
        let records = records.to_vec();
        self.ask(|reply| Command::Write { records, state, reply }).await
    }

    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
        let session = session.to_string();
        self.ask(|reply| Command::History { session, limit, reply }).await
    }

    async fn unfinished_handoffs(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        let server = server.to_string();
        self.ask(|reply| Command::UnfinishedHandoffs { server, reply }).await
    }

    async fn scheduled_resumes(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        let server = server.to_string();
        self.ask(|reply| Command::ScheduledResumes { server, reply }).await
    }
}

/// A SQLite error as a ledger error: a damaged or foreign file is `Corrupt`, anything
/// else (I/O, locks, full disk) is `Storage`.
pub(super) fn storage_error(context: &str, e: rusqlite::Error) -> LedgerError {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => LedgerError::Corrupt(format!("{context}: {e}")),
        _ => LedgerError::Storage(format!("{context}: {e}")),
    }
}

fn prefix(context: &str, e: LedgerError) -> LedgerError {
    match e {
        LedgerError::Storage(m) => LedgerError::Storage(format!("{context}: {m}")),
        LedgerError::Corrupt(m) => LedgerError::Corrupt(format!("{context}: {m}")),
    }
}

fn stopped() -> LedgerError {
    LedgerError::Storage("the ledger thread has stopped".into())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_that_is_not_a_database_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite3");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let err = SqliteLedger::open(&path).unwrap_err();
        assert!(matches!(err, LedgerError::Corrupt(_)), "{err}");
    }
}
