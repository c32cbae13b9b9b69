//! The ledger's one writer thread and the commands it takes: every call of a port
//! becomes a [`Command`] sent over a channel; the thread runs everything queued in one
//! transaction (a group commit) and replies once it is committed, so no runtime thread
//! ever waits on the disk or on SQLite's lock.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::ledger::{Claim, DurableState, Intent, LedgerError, Snapshot};
use tokio::sync::oneshot;

use crate::store::checkpoint::WriterEnd;
use super::{handoff, intent, journal, session_state, setting, storage_error};

/// At most this many queued commands share one transaction, so one reply is never held
/// back behind an unbounded queue.
const MAX_BATCH: usize = 512;

/// How long a batch of nothing but sessions' records and states waits for more before
/// it commits. Each transaction costs the writer its locks, the log's header and a
/// frame per page it touched — half of the writer's time in a burst of recoveries —
/// while nobody waits on these writes (a session's next state write follows when this
/// one is done, holding every change made meanwhile). Anything a caller waits on (an
/// intent before an abort, a load before a session's first event) ends the wait at
/// once. Not a tuning knob: a crash within it loses what a crash just before the
/// writes were sent would.
const LINGER: Duration = Duration::from_millis(2);

pub(super) type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

pub(in crate::store) enum Command {
    Load {
        server: String,
        session: String,
        reply: Reply<Option<DurableState>>,
    },
    /// Records of one session and, when given, its state: written as one (a savepoint:
    /// both or neither).
    Write {
        records: Vec<ActionRecord>,
        state: Option<Box<StateRow>>,
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
        key: String,
        reply: Reply<Option<String>>,
    },
    /// `None` removes the setting.
    PutSetting {
        key: String,
        value_json: Option<String>,
        reply: Reply<()>,
    },
    /// A command of a port kept in a module of its own (`crate::store::notified`).
    Job(Box<dyn Job>),
}

/// A session's state, encoded, as `session_state` keeps it.
pub(in crate::store) struct StateRow {
    pub(super) server: String,
    pub(super) session: String,
    pub(super) state_json: String,
    pub(super) updated_ms: i64,
}

/// [`Command::Write`]: inside a savepoint of the batch's transaction, so a failure of any
/// part leaves none of it (the rest of the batch still commits).
fn write(conn: &Connection, records: &[ActionRecord], state: Option<&StateRow>) -> Result<(), LedgerError> {
    let at = |e| storage_error("ledger: a savepoint", e);
    let run = |sql: &str| conn.prepare_cached(sql).and_then(|mut st| st.execute([])).map(drop).map_err(at);
    run("SAVEPOINT session_write")?;
    let written = records.iter().try_for_each(|r| journal::append(conn, r)).and_then(|()| match state {
        Some(s) => session_state::save(conn, &s.server, &s.session, &s.state_json, s.updated_ms),
        None => Ok(()),
    });
    if written.is_err() {
        run("ROLLBACK TO session_write")?;
    }
    run("RELEASE session_write")?;
    written
}

/// A command defined outside this module: run in the batch's transaction, or failed with it.
pub(in crate::store) trait Job: Send {
    fn run(self: Box<Self>, conn: &Connection) -> Finished;
    fn fail(self: Box<Self>, err: LedgerError);
}

/// The writer thread: runs until every [`SqliteLedger`](super::SqliteLedger) handle is
/// dropped; after each batch tells the checkpointer's threads, when there are any, where
/// it is in the log (and, by dropping its end, that it has stopped).
pub(super) fn serve(mut conn: Connection, queue: mpsc::Receiver<Command>, mut checkpointer: Option<WriterEnd>) {
    while let Ok(first) = queue.recv() {
        let mut batch = Vec::new();
        let mut may_wait = take(first, &queue, &mut batch);
        let until = Instant::now() + LINGER;
        while may_wait && batch.len() < MAX_BATCH {
            match queue.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(next) => may_wait = take(next, &queue, &mut batch),
                Err(_) => break,
            }
        }
        run_batch(&mut conn, batch);
        if let Some(end) = checkpointer.as_mut() {
            end.after_batch();
        }
    }
}

/// Adds `next` and what is queued now to `batch`, up to [`MAX_BATCH`]; whether every
/// command taken [may wait](Command::may_wait).
fn take(next: Command, queue: &mpsc::Receiver<Command>, batch: &mut Vec<Command>) -> bool {
    let mut may_wait = next.may_wait();
    batch.push(next);
    while batch.len() < MAX_BATCH {
        match queue.try_recv() {
            Ok(next) => {
                may_wait &= next.may_wait();
                batch.push(next);
            }
            Err(_) => break,
        }
    }
    may_wait
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
pub(in crate::store) enum Finished {
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
    /// Whether the caller can wait [`LINGER`] for this write to share a transaction:
    /// a session's records and state, written behind its back.
    fn may_wait(&self) -> bool {
        matches!(self, Command::Write { .. })
    }

    fn run(self, conn: &Connection) -> Finished {
        fn read<T: Send + 'static>(reply: Reply<T>, result: Result<T, LedgerError>) -> Finished {
            Finished::Read(Box::new(move || {
                let _ = reply.send(result);
            }))
        }
        match self {
            Command::Load { server, session, reply } => read(reply, session_state::load(conn, &server, &session)),
            Command::History { session, limit, reply } => read(reply, journal::history(conn, &session, limit)),
            Command::Write { records, state, reply } => Finished::Write(reply, write(conn, &records, state.as_deref())),
            Command::SaveSnapshot { snapshot, readable, reply } => {
                Finished::Write(reply, handoff::save_snapshot(conn, &snapshot, readable.as_deref()))
            }
            Command::Snapshots { server, session, reply } => read(reply, handoff::snapshots(conn, &server, &session)),
            Command::Snapshot { id, reply } => read(reply, handoff::snapshot(conn, &id)),
            Command::UnfinishedHandoffs { server, reply } => {
                read(reply, session_state::unfinished_handoffs(conn, &server))
            }
            Command::PutIntent { intent, reply } => Finished::Write(reply, intent::put_intent(conn, &intent)),
            Command::EndIntent { server, decision, reply } => {
                Finished::Write(reply, intent::end_intent(conn, &server, &decision))
            }
            Command::OpenIntents { server, session, reply } => {
                read(reply, intent::open_intents(conn, &server, session.as_deref()))
            }
            Command::ScheduledResumes { server, reply } => read(reply, session_state::scheduled_resumes(conn, &server)),
            Command::GetSetting { key, reply } => read(reply, setting::get_setting(conn, &key)),
            Command::PutSetting { key, value_json, reply } => {
                Finished::Write(reply, setting::put_setting(conn, &key, value_json.as_deref()))
            }
            Command::Job(job) => job.run(conn),
            Command::Claim { id, session, reply } => match handoff::claim(conn, &id, &session) {
                Ok(c) => read(reply, Ok(c)),
                Err(e) => read(reply, Err(e)),
            },
        }
    }

    fn fail(self, err: LedgerError) {
        // A caller that stopped waiting is not an error here.
        match self {
            Command::Load { reply, .. } => drop(reply.send(Err(err))),
            Command::Write { reply, .. } => drop(reply.send(Err(err))),
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
