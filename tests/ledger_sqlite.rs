//! The SQLite ledger as the daemon uses it: state that survives a restart, a journal that
//! keeps its order, corrupt rows reported (never a panic), many writers at once, and
//! use from inside an actix System without blocking its thread.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use shepherd::store::{open_ledger, SqliteLedger};
use shepherd_actors::config::{StoreBackend, StoreConfig};
use shepherd_actors::event::{Todo, TodoStatus};
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::ledger::{
    Claim, DurableState, HandoffMemory, Intent, IntentKind, IntentLog, IntentStep, Ledger, LedgerError, OutageMemory,
    Snapshot, SnapshotStore,
};
use shepherd_actors::ports::TurnSettings;

fn state(attempts: u32) -> DurableState {
    DurableState {
        attempts,
        auto_submits: 2,
        paused: Some("person".into()),
        paused_until_ms: Some(1_900_000_000_000),
        todos: vec![Todo {
            content: "write the ledger".into(),
            status: TodoStatus::InProgress,
            priority: Some("high".into()),
        }],
        nudges_without_progress: 1,
        nudge_snapshot: Some(vec![("write the ledger".into(), "in_progress".into())]),
        last_nudge_ms: Some(1_700_000_000_000),
        review_armed: true,
        review_rounds: 2,
        interrupted_continued: Some("msg_1".into()),
        last_action: Some("nudge".into()),
        last_action_ms: Some(1_700_000_000_500),
        handoff: HandoffMemory {
            phase: "handing_over".into(),
            id: Some("hf_a_1".into()),
            mode: Some("fresh".into()),
            new_session: None,
            reason: Some("past handoff.prepare".into()),
            abort_first: true,
            started_ms: Some(1_700_000_000_600),
        },
        handoff_from: Some("ses_older".into()),
        outage: OutageMemory {
            failures: 2,
            resumed_step: 1,
            due_ms: Some(1_700_000_060_000),
            counted: Some("msg_failed".into()),
            model_index: 1,
            model_since_ms: Some(1_700_000_000_700),
            failures_on_model: 1,
            primary: Some("fake/fake-model".into()),
        },
    }
}

fn record(session: &str, action: Action, at_ms: i64) -> ActionRecord {
    ActionRecord {
        server: "local".into(),
        session: session.into(),
        action,
        outcome: Outcome::Done,
        reason: format!("{} at {at_ms}", action.as_str()),
        numbers: Numbers { idle_for_ms: Some(at_ms as u64), attempt: Some(1), ..Numbers::default() },
        at_ms,
    }
}

fn ledger_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("state").join("shepherd").join("ledger.sqlite3")
}

/// Writes `sql` to the file through a connection of its own, as damage from outside.
fn tamper(path: &Path, sql: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(sql).unwrap();
}

#[tokio::test]
async fn saved_state_is_loaded_by_a_new_ledger_on_the_same_file_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    {
        let before = SqliteLedger::open(&path).unwrap();
        before.save("local", "ses_a", &state(1)).await.unwrap();
        before.save("local", "ses_a", &state(3)).await.unwrap();
        before.save("other", "ses_a", &state(7)).await.unwrap();
        before.append(&record("ses_a", Action::Nudge, 10)).await.unwrap();
    }
    let after = SqliteLedger::open(&path).unwrap();
    assert_eq!(after.load("local", "ses_a").await.unwrap(), Some(state(3)));
    assert_eq!(after.load("other", "ses_a").await.unwrap(), Some(state(7)), "identity is (server, session)");
    assert_eq!(after.load("local", "ses_unknown").await.unwrap(), None);
    assert_eq!(after.history("ses_a", 10).await.unwrap(), vec![record("ses_a", Action::Nudge, 10)]);
}

/// A session's records and the state naming the last of them are one write: after a
/// restart both are there, and a write refused part-way keeps neither — no state naming
/// a record the journal lacks, no record kept while the state beside it was lost.
#[tokio::test]
async fn a_sessions_records_and_its_state_are_written_together_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let first = [record("ses_a", Action::StallDetected, 10), record("ses_a", Action::Abort, 11)];
    let refused = [record("ses_a", Action::Continue, 12)];
    let alone = [record("ses_a", Action::Nudge, 13)];
    {
        let ledger = SqliteLedger::open(&path).unwrap();
        ledger.write("local", "ses_a", &first, Some(&state(1))).await.unwrap();
        // The state's row is refused (as a full disk or a damaged table would refuse it).
        tamper(&path, "CREATE TRIGGER refuse BEFORE INSERT ON session_state BEGIN SELECT RAISE(ABORT, 'refused'); END");
        let err = ledger.write("local", "ses_a", &refused, Some(&state(2))).await.unwrap_err();
        assert!(err.to_string().contains("refused"), "{err}");
        // Records without a state are not held back by it.
        ledger.write("local", "ses_a", &alone, None).await.unwrap();
    }
    tamper(&path, "DROP TRIGGER refuse");
    let after = SqliteLedger::open(&path).unwrap();
    assert_eq!(after.load("local", "ses_a").await.unwrap(), Some(state(1)), "the refused write's state is not there");
    let kept: Vec<ActionRecord> = first.iter().chain(&alone).cloned().collect();
    assert_eq!(after.history("ses_a", 10).await.unwrap(), kept, "nor its record");
}

/// `shepherd pause --all` survives a restart; `resume --all` removes it for good.
#[tokio::test]
async fn the_fleet_pause_is_kept_across_a_restart_until_it_is_lifted() {
    use shepherd_actors::ledger::{FleetPause, FleetSettings};
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let pause = FleetPause { by: "cli".into(), since_ms: 1_000, until_ms: Some(2_000) };
    {
        let ledger = SqliteLedger::open(&path).unwrap();
        assert_eq!(ledger.fleet_pause().await.unwrap(), None);
        ledger.set_fleet_pause(Some(&pause)).await.unwrap();
    }
    let again = SqliteLedger::open(&path).unwrap();
    assert_eq!(again.fleet_pause().await.unwrap(), Some(pause));
    again.set_fleet_pause(None).await.unwrap();
    drop(again);
    assert_eq!(SqliteLedger::open(&path).unwrap().fleet_pause().await.unwrap(), None);
}

/// Until when each server's stream was watched survives a restart, per server: what
/// the restarted daemon catches up with starts there.
#[tokio::test]
async fn until_when_each_server_was_watched_is_kept_across_a_restart() {
    use shepherd_actors::ledger::FleetSettings;
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    {
        let ledger = SqliteLedger::open(&path).unwrap();
        assert_eq!(ledger.watched_until("local").await.unwrap(), None, "a first start");
        ledger.set_watched_until("local", 1_000).await.unwrap();
        ledger.set_watched_until("local", 2_000).await.unwrap();
        ledger.set_watched_until("other", 5_000).await.unwrap();
    }
    let again = SqliteLedger::open(&path).unwrap();
    assert_eq!(again.watched_until("local").await.unwrap(), Some(2_000));
    assert_eq!(again.watched_until("other").await.unwrap(), Some(5_000));
    assert_eq!(again.watched_until("third").await.unwrap(), None);
}

#[tokio::test]
async fn the_journal_keeps_its_order_and_history_returns_the_newest_n_oldest_first() {
    let ledger = SqliteLedger::open_in_memory().unwrap();
    let actions = [Action::StallDetected, Action::Abort, Action::Continue, Action::Nudge, Action::Review];
    for (i, action) in actions.iter().enumerate() {
        ledger.append(&record("ses_a", *action, 100 + i as i64)).await.unwrap();
        ledger.append(&record("ses_b", Action::Pause, 100 + i as i64)).await.unwrap();
    }
    let all = ledger.history("ses_a", 100).await.unwrap();
    assert_eq!(all.iter().map(|r| r.action).collect::<Vec<_>>(), actions);
    let newest = ledger.history("ses_a", 2).await.unwrap();
    assert_eq!(newest, vec![record("ses_a", Action::Nudge, 103), record("ses_a", Action::Review, 104)]);
    assert!(ledger.history("ses_a", 0).await.unwrap().is_empty());
    assert!(ledger.history("ses_nobody", 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_corrupt_state_row_is_reported_naming_its_session_and_other_sessions_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger = SqliteLedger::open(&path).unwrap();
    ledger.save("local", "ses_good", &state(1)).await.unwrap();
    ledger.save("local", "ses_bad", &state(2)).await.unwrap();
    tamper(&path, "UPDATE session_state SET state_json = '{\"attempts\": \"many\"' WHERE session = 'ses_bad'");

    match ledger.load("local", "ses_bad").await {
        Err(LedgerError::Corrupt(msg)) => {
            assert!(msg.contains("ses_bad") && msg.contains("local"), "names server and session: {msg}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(ledger.load("local", "ses_good").await.unwrap(), Some(state(1)));
    ledger.save("local", "ses_bad", &state(4)).await.unwrap();
    assert_eq!(ledger.load("local", "ses_bad").await.unwrap(), Some(state(4)), "a new save repairs the row");
}

#[tokio::test]
async fn a_corrupt_journal_row_is_reported_and_other_sessions_journals_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger = SqliteLedger::open(&path).unwrap();
    ledger.append(&record("ses_bad", Action::Abort, 1)).await.unwrap();
    ledger.append(&record("ses_good", Action::Abort, 2)).await.unwrap();
    tamper(&path, "UPDATE journal SET action = 'explode' WHERE session = 'ses_bad'");

    let err = ledger.history("ses_bad", 10).await.unwrap_err();
    assert!(matches!(&err, LedgerError::Corrupt(m) if m.contains("ses_bad") && m.contains("explode")), "{err}");
    assert_eq!(ledger.history("ses_good", 10).await.unwrap(), vec![record("ses_good", Action::Abort, 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_saves_and_appends_from_many_tasks_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger: Arc<dyn Ledger> = Arc::new(SqliteLedger::open(&path).unwrap());
    let sessions = 300;
    let tasks: Vec<_> = (0..sessions)
        .map(|i| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let session = format!("ses_{i}");
                for attempt in 1..=3 {
                    ledger.save("local", &session, &state(attempt)).await.unwrap();
                    ledger.append(&record(&session, Action::Continue, i64::from(attempt))).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    drop(ledger);

    let reopened = SqliteLedger::open(&path).unwrap();
    for i in 0..sessions {
        let session = format!("ses_{i}");
        assert_eq!(reopened.load("local", &session).await.unwrap(), Some(state(3)), "{session}");
        let at: Vec<i64> = reopened.history(&session, 10).await.unwrap().iter().map(|r| r.at_ms).collect();
        assert_eq!(at, vec![1, 2, 3], "{session}: each task's appends in its order");
    }
}

/// A stand-in for a session actor: decides, then records and saves through the port.
struct SessionLike {
    ledger: Arc<dyn Ledger>,
}

impl Actor for SessionLike {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "Result<Option<DurableState>, LedgerError>")]
struct Decide {
    attempts: u32,
}

impl Handler<Decide> for SessionLike {
    type Result = ResponseFuture<Result<Option<DurableState>, LedgerError>>;

    fn handle(&mut self, msg: Decide, _: &mut Context<Self>) -> Self::Result {
        let ledger = self.ledger.clone();
        Box::pin(async move {
            ledger.append(&record("ses_actor", Action::Continue, i64::from(msg.attempts))).await?;
            ledger.save("local", "ses_actor", &state(msg.attempts)).await?;
            ledger.load("local", "ses_actor").await
        })
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Ping;

impl Handler<Ping> for SessionLike {
    type Result = ();

    fn handle(&mut self, _: Ping, _: &mut Context<Self>) {}
}

#[actix::test]
async fn an_actor_saves_and_loads_through_the_port_inside_an_actix_system() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig { backend: StoreBackend::Sqlite, path: ledger_file(&dir).display().to_string(), ..StoreConfig::default() };
    let ledger = open_ledger(&cfg).unwrap();
    let actor = SessionLike { ledger: ledger.clone() }.start();
    for attempts in 1..=3 {
        assert_eq!(actor.send(Decide { attempts }).await.unwrap().unwrap(), Some(state(attempts)));
    }
    assert_eq!(ledger.history("ses_actor", 10).await.unwrap().len(), 3);
}

#[actix::test]
async fn a_save_waiting_for_the_database_lock_does_not_block_the_actix_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger: Arc<dyn Ledger> = Arc::new(SqliteLedger::open(&path).unwrap());
    let actor = SessionLike { ledger: ledger.clone() }.start();

    // Another process holds the write lock until the test lets it go.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn({
        let path = path.clone();
        move || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv();
            conn.execute_batch("COMMIT").unwrap();
        }
    });
    locked_rx.recv().unwrap();

    let decision = actor.send(Decide { attempts: 1 });
    let decision = actix::spawn(decision);
    // The actor's decision waits for the lock; the thread the actors run on does not.
    for _ in 0..5 {
        actor.send(Ping).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!decision.is_finished(), "pings were answered while the save waited for the lock");
    release_tx.send(()).unwrap();
    assert_eq!(decision.await.unwrap().unwrap().unwrap(), Some(state(1)));
    holder.join().unwrap();
}

#[tokio::test]
async fn open_ledger_creates_the_configured_file_or_keeps_everything_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let sqlite = StoreConfig { backend: StoreBackend::Sqlite, path: path.display().to_string(), ..StoreConfig::default() };
    let ledger = open_ledger(&sqlite).unwrap();
    ledger.save("local", "ses_a", &state(1)).await.unwrap();
    assert!(path.is_file(), "the file and its folders are created");

    let memory = StoreConfig { backend: StoreBackend::Memory, path: String::new(), ..StoreConfig::default() };
    let ledger = open_ledger(&memory).unwrap();
    ledger.save("local", "ses_a", &state(2)).await.unwrap();
    assert_eq!(ledger.load("local", "ses_a").await.unwrap(), Some(state(2)));
}

/// Runs the `shepherd` binary in `dir` (so no `./shepherd.toml` is picked up).
fn shepherd(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

#[tokio::test]
async fn shepherd_history_prints_the_newest_entries_of_one_session_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger = SqliteLedger::open(&path).unwrap();
    for (i, action) in [Action::StallDetected, Action::Abort, Action::Continue].into_iter().enumerate() {
        ledger.append(&record("ses_cli", action, 1_767_225_600_000 + i as i64 * 1000)).await.unwrap();
    }
    ledger.append(&record("ses_other", Action::Review, 1_767_225_600_000)).await.unwrap();
    let set = format!("store.path={}", path.display());

    let out = shepherd(dir.path(), &["history", "ses_cli", "--limit", "2", "--set", &set]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "session ses_cli on local — 2 entries, oldest first");
    assert!(lines[1].starts_with("2026-01-01 00:00:01Z (") && lines[1].contains("  abort     done  "), "{text}");
    assert!(lines[1].ends_with("abort at 1767225601000  [attempt=1 idle_for_ms=1767225601000]"), "{text}");
    assert!(lines[2].contains("  continue  done  continue at"), "{text}");

    let out = shepherd(dir.path(), &["history", "ses_cli", "--json", "--set", &set]);
    let records: Vec<ActionRecord> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        records.iter().map(|r| r.action).collect::<Vec<_>>(),
        [Action::StallDetected, Action::Abort, Action::Continue]
    );
}

#[test]
fn shepherd_history_says_so_when_there_is_none_and_creates_no_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let set = format!("store.path={}", path.display());
    let out = shepherd(dir.path(), &["history", "ses_nobody", "--set", &set]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("no history for session ses_nobody in "), "{text}");
    assert!(!path.exists(), "reading history must not create a ledger");

    let out = shepherd(dir.path(), &["history", "ses_nobody", "--set", "store.backend=memory"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("store.backend is \"memory\""));
}

fn snapshot(id: &str, created_ms: i64, text: &str) -> Snapshot {
    Snapshot::seal(
        id.into(),
        "local".into(),
        "ses_old".into(),
        Some("/repo".into()),
        Some("refactor".into()),
        created_ms,
        &TurnSettings { agent: Some("build".into()), model: None },
        text.into(),
    )
}

#[tokio::test]
async fn a_hand_off_snapshot_survives_a_restart_keeps_a_readable_copy_and_is_restored_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let readable = {
        let before = SqliteLedger::open(&path).unwrap();
        before.save_snapshot(&snapshot("hf_1", 10, "# Continuation\n\nobjective")).await.unwrap().unwrap()
    };
    assert_eq!(std::fs::read_to_string(&readable).unwrap(), "# Continuation\n\nobjective", "{readable}");
    let after = SqliteLedger::open(&path).unwrap();
    let back = after.snapshot("hf_1").await.unwrap().unwrap().unwrap();
    assert!(back.is_intact());
    assert_eq!(after.claim("hf_1", "ses_new").await.unwrap(), Claim::Granted);
    assert_eq!(after.claim("hf_1", "ses_new").await.unwrap(), Claim::Granted, "idempotent for the same session");
    assert_eq!(after.claim("hf_1", "ses_other").await.unwrap(), Claim::Taken { by: "ses_new".into() });
}

#[tokio::test]
async fn a_torn_or_corrupt_snapshot_falls_back_to_the_previous_intact_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger = SqliteLedger::open(&path).unwrap();
    ledger.save_snapshot(&snapshot("hf_old", 10, "older continuation")).await.unwrap();
    ledger.save_snapshot(&snapshot("hf_new", 20, "newer continuation")).await.unwrap();
    let newest = Snapshot::newest_intact(ledger.snapshots("local", "ses_old").await.unwrap()).unwrap();
    assert_eq!(newest.id, "hf_new");
    // Altered text (the checksum no longer verifies), then a torn row (not even JSON).
    tamper(
        &path,
        "UPDATE handoff_snapshot SET snapshot_json = replace(snapshot_json, 'newer', 'forged') WHERE id = 'hf_new'",
    );
    let newest = Snapshot::newest_intact(ledger.snapshots("local", "ses_old").await.unwrap()).unwrap();
    assert_eq!(newest.id, "hf_old", "the altered snapshot does not verify");
    tamper(&path, "UPDATE handoff_snapshot SET snapshot_json = '{\"version\": 1, \"id\"' WHERE id = 'hf_new'");
    let all = ledger.snapshots("local", "ses_old").await.unwrap();
    assert!(matches!(&all[0], Err(LedgerError::Corrupt(m)) if m.contains("hf_new")), "{all:?}");
    assert_eq!(Snapshot::newest_intact(all).unwrap().id, "hf_old");
}

fn intent(server: &str, session: &str, decision: &str, started_ms: i64, step: IntentStep) -> Intent {
    Intent {
        server: server.into(),
        session: session.into(),
        decision: decision.into(),
        kind: IntentKind::Recover,
        step,
        instance: "i1".into(),
        started_ms,
        attempt: 2,
    }
}

#[tokio::test]
async fn an_open_intent_survives_a_restart_at_its_latest_step_and_is_gone_once_ended() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    {
        let before = SqliteLedger::open(&path).unwrap();
        before.put_intent(&intent("local", "ses_a", "ses_a-20", 20, IntentStep::Intended)).await.unwrap();
        before.put_intent(&intent("local", "ses_b", "ses_b-10", 10, IntentStep::Sending)).await.unwrap();
        before.put_intent(&intent("other", "ses_a", "ses_a-30", 30, IntentStep::Intended)).await.unwrap();
        before.put_intent(&intent("local", "ses_c", "ses_c-5", 5, IntentStep::Intended)).await.unwrap();
        // The next step replaces the same decision's row; an ended one is gone.
        before.put_intent(&intent("local", "ses_a", "ses_a-20", 20, IntentStep::Aborted)).await.unwrap();
        before.end_intent("local", "ses_c-5").await.unwrap();
    } // the process dies here: what was written is all there is
    let after = SqliteLedger::open(&path).unwrap();
    assert_eq!(
        after.open_intents("local", None).await.unwrap(),
        vec![
            intent("local", "ses_b", "ses_b-10", 10, IntentStep::Sending),
            intent("local", "ses_a", "ses_a-20", 20, IntentStep::Aborted),
        ],
        "oldest first, at the latest step, the ended one gone, per server"
    );
    assert_eq!(
        after.open_intents("local", Some("ses_a")).await.unwrap(),
        vec![intent("local", "ses_a", "ses_a-20", 20, IntentStep::Aborted)]
    );
    after.end_intent("local", "ses_a-20").await.unwrap();
    assert_eq!(after.open_intents("local", Some("ses_a")).await.unwrap(), vec![]);
    assert_eq!(after.open_intents("other", None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_unreadable_intent_row_is_skipped_and_the_others_are_still_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    {
        let ledger = SqliteLedger::open(&path).unwrap();
        ledger.put_intent(&intent("local", "ses_a", "ses_a-1", 1, IntentStep::Intended)).await.unwrap();
        ledger.put_intent(&intent("local", "ses_b", "ses_b-2", 2, IntentStep::Intended)).await.unwrap();
    }
    tamper(&path, "UPDATE intent SET intent_json = '{not json' WHERE decision = 'ses_a-1'");
    let ledger = SqliteLedger::open(&path).unwrap();
    let open = ledger.open_intents("local", None).await.unwrap();
    assert_eq!(open, vec![intent("local", "ses_b", "ses_b-2", 2, IntentStep::Intended)]);
}

#[tokio::test]
async fn sessions_with_a_scheduled_provider_resume_are_found_after_a_restart_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    {
        let before = SqliteLedger::open(&path).unwrap();
        before.save("local", "ses_due", &state(1)).await.unwrap();
        let mut sent = state(1);
        sent.outage.due_ms = None; // its step was sent: nothing to wake it for
        before.save("local", "ses_sent", &sent).await.unwrap();
        before.save("other", "ses_elsewhere", &state(1)).await.unwrap();
    }
    let after = SqliteLedger::open(&path).unwrap();
    assert_eq!(after.scheduled_resumes("local").await.unwrap(), vec!["ses_due".to_string()]);
    let memory = shepherd_actors::ledger::MemoryLedger::default();
    memory.save("local", "ses_due", &state(1)).await.unwrap();
    assert_eq!(memory.scheduled_resumes("local").await.unwrap(), vec!["ses_due".to_string()]);
    assert!(memory.scheduled_resumes("other").await.unwrap().is_empty());
}

#[tokio::test]
async fn the_database_file_itself_holds_the_journal_within_seconds_of_the_writes() {
    // The log is copied back off the writer's thread (`store::checkpoint`): a copy of
    // the bare database file — what a backup of `ledger.sqlite3` alone takes — soon
    // holds what was written, though far less than SQLite's own 1,000-page mark.
    let dir = tempfile::tempdir().unwrap();
    let path = ledger_file(&dir);
    let ledger = SqliteLedger::open(&path).unwrap();
    for i in 0..50 {
        ledger.append(&record("ses_A", Action::Nudge, 1_700_000_000_000 + i)).await.unwrap();
    }
    let copy = dir.path().join("copy.sqlite3");
    let deadline = Instant::now() + Duration::from_secs(10);
    let rows = loop {
        std::fs::copy(&path, &copy).unwrap();
        let rows: i64 = rusqlite::Connection::open(&copy)
            .unwrap()
            .query_row("SELECT count(*) FROM journal", [], |r| r.get(0))
            .unwrap_or(0);
        if rows == 50 || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rows, 50, "the records are still only in the write-ahead log");
    // And the ledger keeps working meanwhile.
    assert_eq!(ledger.history("ses_A", 100).await.unwrap().len(), 50);
}
