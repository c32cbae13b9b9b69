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

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use super::checkpoint;
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};
use shepherd_actors::config::StoreConfig;
use shepherd_actors::ids;
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::ledger::{
    Claim, DurableState, FleetPause, FleetSettings, Intent, IntentLog, Ledger, LedgerError, Snapshot, SnapshotStore,
    HANDOFF_RUNNING_PHASES,
};
use tokio::sync::oneshot;

use crate::private_state;

/// How long a statement waits for another connection's lock (e.g. a migration by a
/// second process) before failing. Not a tuning knob: with WAL, readers never block the
/// writer and Shepherd is the only writer, so this only bounds a pathological wait.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many queued commands share one transaction, so one reply is never held
/// back behind an unbounded queue.
const MAX_BATCH: usize = 512;

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

/// The `setting` key of the fleet-wide pause.
const FLEET_PAUSE_KEY: &str = "fleet_pause";

/// The ledger in one SQLite file (or in memory, for tests). Cheap to share behind an
/// `Arc`; dropping the last handle lets the writer thread finish what is queued and
/// close the file.
#[derive(Debug)]
pub struct SqliteLedger {
    commands: mpsc::Sender<Command>,
    path: Option<PathBuf>,
}

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

pub(super) enum Command {
    Load {
        server: String,
        session: String,
        reply: Reply<Option<DurableState>>,
    },
    Save {
        server: String,
        session: String,
        state_json: String,
        updated_ms: i64,
        reply: Reply<()>,
    },
    /// Boxed: a record is several times the size of the other commands.
    Append {
        record: Box<ActionRecord>,
        reply: Reply<()>,
    },
    History {
        session: String,
        limit: u32,
        reply: Reply<Vec<ActionRecord>>,
    },
    SaveSnapshot {
        snapshot: Box<Snapshot>,
        readable: Option<PathBuf>,
        reply: Reply<()>,
    },
    Snapshots {
        server: String,
        session: String,
        reply: Reply<Vec<Result<Snapshot, LedgerError>>>,
    },
    Snapshot {
        id: String,
        reply: Reply<Option<Result<Snapshot, LedgerError>>>,
    },
    Claim {
        id: String,
        session: String,
        reply: Reply<Claim>,
    },
    UnfinishedHandoffs {
        server: String,
        reply: Reply<Vec<String>>,
    },
    PutIntent {
        intent: Box<Intent>,
        reply: Reply<()>,
    },
    EndIntent {
        server: String,
        decision: String,
        reply: Reply<()>,
    },
    OpenIntents {
        server: String,
        session: Option<String>,
        reply: Reply<Vec<Intent>>,
    },
    ScheduledResumes {
        server: String,
        reply: Reply<Vec<String>>,
    },
    GetSetting {
        key: &'static str,
        reply: Reply<Option<String>>,
    },
    /// `None` removes the setting.
    PutSetting {
        key: &'static str,
        value_json: Option<String>,
        reply: Reply<()>,
    },
    /// A command of a port kept in a module of its own (`super::notified`).
    Job(Box<dyn Job>),
}

/// A command defined outside this file: run in the batch's transaction, or failed with it.
pub(super) trait Job: Send {
    fn run(self: Box<Self>, conn: &Connection) -> Finished;
    fn fail(self: Box<Self>, err: LedgerError);
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
        // A file's log is copied back by a thread of its own (see `checkpoint`); the
        // writer tells it it has stopped by dropping `done`.
        let (done, writer_done) = mpsc::channel::<()>();
        if let Some(path) = &path {
            let at = |e| storage_error(&path.display().to_string(), e);
            conn.execute_batch("PRAGMA wal_autocheckpoint = 0").map_err(at)?;
            if let Err(e) = checkpoint::start(path.clone(), writer_done) {
                tracing::warn!(path = %path.display(), error = %e, "ledger: no checkpointer thread; the writer checkpoints");
                conn.execute_batch("PRAGMA wal_autocheckpoint = 1000").map_err(at)?;
            }
        }
        std::thread::Builder::new()
            .name("shepherd-ledger".into())
            .spawn(move || {
                serve(conn, queue);
                drop(done);
            })
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
        let state_json = serde_json::to_string(state)
            .map_err(|e| LedgerError::Storage(format!("encoding the state of {server}/{session}: {e}")))?;
        let (server, session) = (server.to_string(), session.to_string());
        self.ask(|reply| Command::Save { server, session, state_json, updated_ms: now_ms(), reply }).await
    }

    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError> {
        let record = record.clone();
        self.ask(|reply| Command::Append { record: Box::new(record), reply }).await
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

#[async_trait]
impl FleetSettings for SqliteLedger {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
        let json = self.ask(|reply| Command::GetSetting { key: FLEET_PAUSE_KEY, reply }).await?;
        json.map(|j| serde_json::from_str(&j).map_err(|e| LedgerError::Storage(format!("setting {FLEET_PAUSE_KEY}: {e}"))))
            .transpose()
    }

    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError> {
        let value_json = pause
            .map(|p| serde_json::to_string(p).map_err(|e| LedgerError::Storage(format!("setting {FLEET_PAUSE_KEY}: {e}"))))
            .transpose()?;
        self.ask(|reply| Command::PutSetting { key: FLEET_PAUSE_KEY, value_json, reply }).await
    }
}

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

/// The writer thread: runs until every [`SqliteLedger`] handle is dropped.
fn serve(mut conn: Connection, queue: mpsc::Receiver<Command>) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        run_batch(&mut conn, batch);
    }
}

/// Runs `batch` in one transaction and replies once it is committed: a write is only
/// reported done when it is on disk. If the commit fails, every write in the batch gets
/// the error; reads keep their answers.
fn run_batch(conn: &mut Connection, batch: Vec<Command>) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let err = storage_error("ledger: starting a transaction", e);
            for command in batch {
                command.fail(err.clone());
            }
            return;
        }
    };
    let finished: Vec<Finished> = batch.into_iter().map(|command| command.run(&tx)).collect();
    let committed = tx.commit().map_err(|e| storage_error("ledger: commit", e));
    for done in finished {
        done.reply(committed.as_ref().err());
    }
}

/// A command that has run, waiting for its transaction to commit before it replies.
pub(super) enum Finished {
    Read(Box<dyn FnOnce() + Send>),
    Write(Reply<()>, Result<(), LedgerError>),
}

impl Finished {
    fn reply(self, commit_error: Option<&LedgerError>) {
        // A caller that stopped waiting (its future dropped) is not an error here.
        match self {
            Finished::Read(send) => send(),
            Finished::Write(reply, result) => {
                let _ = reply.send(match commit_error {
                    Some(e) => Err(e.clone()),
                    None => result,
                });
            }
        }
    }
}

impl Command {
    fn run(self, conn: &Connection) -> Finished {
        fn read<T: Send + 'static>(reply: Reply<T>, result: Result<T, LedgerError>) -> Finished {
            Finished::Read(Box::new(move || {
                let _ = reply.send(result);
            }))
        }
        match self {
            Command::Load { server, session, reply } => read(reply, load(conn, &server, &session)),
            Command::History { session, limit, reply } => read(reply, history(conn, &session, limit)),
            Command::Save { server, session, state_json, updated_ms, reply } => {
                let result = conn
                    .prepare_cached(
                        "INSERT INTO session_state (server, session, state_json, updated_ms)
                         VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (server, session)
                         DO UPDATE SET state_json = excluded.state_json, updated_ms = excluded.updated_ms",
                    )
                    .and_then(|mut st| st.execute(params![server, session, state_json, updated_ms]))
                    .map(drop)
                    .map_err(|e| storage_error(&format!("saving {server}/{session}"), e));
                Finished::Write(reply, result)
            }
            Command::Append { record, reply } => Finished::Write(reply, append(conn, &record)),
            Command::SaveSnapshot { snapshot, readable, reply } => {
                Finished::Write(reply, save_snapshot(conn, &snapshot, readable.as_deref()))
            }
            Command::Snapshots { server, session, reply } => read(reply, snapshots(conn, &server, &session)),
            Command::Snapshot { id, reply } => read(reply, snapshot(conn, &id)),
            Command::UnfinishedHandoffs { server, reply } => read(reply, unfinished_handoffs(conn, &server)),
            Command::PutIntent { intent, reply } => Finished::Write(reply, put_intent(conn, &intent)),
            Command::EndIntent { server, decision, reply } => {
                let result = conn
                    .prepare_cached("DELETE FROM intent WHERE server = ?1 AND decision = ?2")
                    .and_then(|mut st| st.execute(params![server, decision]))
                    .map(drop)
                    .map_err(|e| storage_error(&format!("closing intent {decision} of {server}"), e));
                Finished::Write(reply, result)
            }
            Command::OpenIntents { server, session, reply } => {
                read(reply, open_intents(conn, &server, session.as_deref()))
            }
            Command::ScheduledResumes { server, reply } => read(reply, scheduled_resumes(conn, &server)),
            Command::GetSetting { key, reply } => {
                let result = conn
                    .prepare_cached("SELECT value_json FROM setting WHERE key = ?1")
                    .and_then(|mut st| st.query_row(params![key], |row| row.get::<_, String>(0)).optional())
                    .map_err(|e| storage_error(&format!("reading setting {key}"), e));
                read(reply, result)
            }
            Command::PutSetting { key, value_json, reply } => {
                let result = match value_json {
                    Some(json) => conn
                        .prepare_cached(
                            "INSERT INTO setting (key, value_json) VALUES (?1, ?2)
                             ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json",
                        )
                        .and_then(|mut st| st.execute(params![key, json])),
                    None => conn.prepare_cached("DELETE FROM setting WHERE key = ?1").and_then(|mut st| st.execute(params![key])),
                }
                .map(drop)
                .map_err(|e| storage_error(&format!("writing setting {key}"), e));
                Finished::Write(reply, result)
            }
            Command::Job(job) => job.run(conn),
            Command::Claim { id, session, reply } => match claim(conn, &id, &session) {
                Ok(c) => read(reply, Ok(c)),
                Err(e) => read(reply, Err(e)),
            },
        }
    }

    fn fail(self, err: LedgerError) {
        // A caller that stopped waiting is not an error here.
        match self {
            Command::Load { reply, .. } => drop(reply.send(Err(err))),
            Command::Save { reply, .. } => drop(reply.send(Err(err))),
            Command::Append { reply, .. } => drop(reply.send(Err(err))),
            Command::History { reply, .. } => drop(reply.send(Err(err))),
            Command::SaveSnapshot { reply, .. } => drop(reply.send(Err(err))),
            Command::Snapshots { reply, .. } => drop(reply.send(Err(err))),
            Command::Snapshot { reply, .. } => drop(reply.send(Err(err))),
            Command::Claim { reply, .. } => drop(reply.send(Err(err))),
            Command::UnfinishedHandoffs { reply, .. } => drop(reply.send(Err(err))),
            Command::PutIntent { reply, .. } => drop(reply.send(Err(err))),
            Command::EndIntent { reply, .. } => drop(reply.send(Err(err))),
            Command::OpenIntents { reply, .. } => drop(reply.send(Err(err))),
            Command::ScheduledResumes { reply, .. } => drop(reply.send(Err(err))),
            Command::GetSetting { reply, .. } => drop(reply.send(Err(err))),
            Command::PutSetting { reply, .. } => drop(reply.send(Err(err))),
            Command::Job(job) => job.fail(err),
        }
    }
}

fn load(conn: &Connection, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
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

fn append(conn: &Connection, r: &ActionRecord) -> Result<(), LedgerError> {
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

fn save_snapshot(conn: &Connection, s: &Snapshot, readable: Option<&Path>) -> Result<(), LedgerError> {
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

fn unfinished_handoffs(conn: &Connection, server: &str) -> Result<Vec<String>, LedgerError> {
    let phases = HANDOFF_RUNNING_PHASES;
    conn.prepare_cached(
        "SELECT session FROM session_state WHERE server = ?1
         AND json_extract(state_json, '$.handoff.phase') IN (?2, ?3, ?4)",
    )
    .and_then(|mut st| st.query_map(params![server, phases[0], phases[1], phases[2]], |r| r.get(0))?.collect())
    .map_err(|e| storage_error(&format!("finding unfinished hand-offs of {server}"), e))
}

fn put_intent(conn: &Connection, intent: &Intent) -> Result<(), LedgerError> {
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
fn open_intents(conn: &Connection, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
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

fn scheduled_resumes(conn: &Connection, server: &str) -> Result<Vec<String>, LedgerError> {
    conn.prepare_cached(
        "SELECT session FROM session_state WHERE server = ?1
         AND json_extract(state_json, '$.outage.due_ms') IS NOT NULL",
    )
    .and_then(|mut st| st.query_map(params![server], |r| r.get(0))?.collect())
    .map_err(|e| storage_error(&format!("finding scheduled resumes of {server}"), e))
}

fn parse_snapshot(id: &str, json: &str) -> Result<Snapshot, LedgerError> {
    serde_json::from_str(json).map_err(|e| LedgerError::Corrupt(format!("hand-off snapshot {id}: {e}")))
}

fn snapshots(
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

fn snapshot(conn: &Connection, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
    let json: Option<String> = conn
        .prepare_cached("SELECT snapshot_json FROM handoff_snapshot WHERE id = ?1")
        .and_then(|mut st| st.query_row(params![id], |r| r.get(0)).optional())
        .map_err(|e| storage_error(&format!("reading hand-off snapshot {id}"), e))?;
    Ok(json.map(|j| parse_snapshot(id, &j)))
}

fn claim(conn: &Connection, id: &str, session: &str) -> Result<Claim, LedgerError> {
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

/// One journal row as stored, before its text columns are parsed.
pub(super) struct JournalRow {
    id: i64,
    server: String,
    session: String,
    at_ms: i64,
    action: String,
    outcome: String,
    reason: String,
    numbers_json: String,
}

fn history(conn: &Connection, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
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
    pub(super) fn at_ms(&self) -> i64 {
        self.at_ms
    }

    /// A row of `SELECT id, server, session, at_ms, action, outcome, reason, numbers_json`.
    pub(super) fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<JournalRow> {
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

    pub(super) fn into_record(self) -> Result<ActionRecord, LedgerError> {
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

/// Creates or upgrades the schema in one transaction.
fn migrate(conn: &mut Connection) -> Result<(), LedgerError> {
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

    #[tokio::test]
    async fn a_file_that_is_not_a_database_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite3");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let err = SqliteLedger::open(&path).unwrap_err();
        assert!(matches!(err, LedgerError::Corrupt(_)), "{err}");
    }
}
