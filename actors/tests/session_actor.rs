//! The actors with a fake engine and paused tokio time: no sockets, no real waiting.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use shepherd_actors::config::{RecoveryConfig, SupervisorConfig};
use shepherd_actors::event::{decode, ModelRef, SessionInfo, Status, Todo};
use shepherd_actors::journal::{Action, ActionRecord, Journal, Outcome};
use shepherd_actors::ledger::{Ledger, MemoryLedger};
use shepherd_actors::ports::{Clock, Engine, EngineError, LastTurn, Prompt, TurnSettings};
use shepherd_actors::supervisor::{
    AttachServer, DetachServer, Ingest, InspectFleet, ReconfigureAll, Shutdown, StreamDown, StreamUp, Supervisor,
};

/// An OpenCode that records calls; a session is busy until aborted.
#[derive(Default)]
struct FakeEngine {
    calls: Mutex<Vec<String>>,
    busy: Mutex<HashMap<String, Status>>,
    prompts: Mutex<Vec<(String, Prompt)>>,
    todos: Mutex<Vec<Todo>>,
    /// This many `model_windows` reads fail first (a server still booting).
    windows_failures: std::sync::atomic::AtomicUsize,
    /// How every session's last assistant message ended (`None`: no message).
    last_turn: Mutex<Option<LastTurn>>,
}

impl FakeEngine {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn log(&self, c: String) {
        self.calls.lock().unwrap().push(c);
    }
}

#[async_trait]
impl Engine for FakeEngine {
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError> {
        self.log(format!("status {directory}"));
        Ok(self.busy.lock().unwrap().clone())
    }
    async fn list_sessions(&self, _: u32) -> Result<Vec<SessionInfo>, EngineError> {
        Ok(vec![])
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Ok(SessionInfo {
            id: id.into(),
            parent_id: None,
            directory: Some("/p".into()),
            title: None,
            time: Default::default(),
            metadata: None,
        })
    }
    async fn abort(&self, id: &str) -> Result<(), EngineError> {
        self.log(format!("abort {id}"));
        self.busy.lock().unwrap().remove(id);
        Ok(())
    }
    async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
        Ok(self.todos.lock().unwrap().clone())
    }
    async fn last_turn_settings(&self, _: &str) -> Result<TurnSettings, EngineError> {
        Ok(TurnSettings {
            agent: Some("plan".into()),
            model: Some(ModelRef { provider_id: "fake".into(), model_id: "fake-model-2".into() }),
        })
    }
    async fn last_turn(&self, id: &str) -> Result<Option<LastTurn>, EngineError> {
        self.log(format!("last_turn {id}"));
        Ok(self.last_turn.lock().unwrap().clone())
    }
    async fn summarize(&self, id: &str, _: &ModelRef) -> Result<(), EngineError> {
        self.log(format!("summarize {id}"));
        Ok(())
    }
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        self.log("windows".into());
        let failures = &self.windows_failures;
        if failures.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(EngineError::Unreachable("booting".into()));
        }
        Ok(HashMap::from([("fake/fake-model".to_string(), 200_000)]))
    }
    async fn prompt(&self, id: &str, p: &Prompt) -> Result<(), EngineError> {
        self.log(format!("prompt {id}"));
        self.prompts.lock().unwrap().push((id.into(), p.clone()));
        Ok(())
    }
}

struct PausedClock {
    start: tokio::time::Instant,
}
impl Clock for PausedClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        1_000_000 + self.start.elapsed().as_millis() as i64
    }
}

struct World {
    engine: Arc<FakeEngine>,
    supervisor: Addr<Supervisor>,
    records: tokio::sync::broadcast::Receiver<ActionRecord>,
}

fn world(cfg: RecoveryConfig) -> World {
    world_with_ledger(cfg, Arc::new(MemoryLedger::default()))
}

/// A supervisor with one server (`srv`, a fresh fake engine), a fresh journal and a
/// paused clock, over `ledger` (tests of eviction and restarts pass the same one twice).
fn world_with_ledger(cfg: RecoveryConfig, ledger: Arc<MemoryLedger>) -> World {
    let engine = Arc::new(FakeEngine::default());
    let journal = Journal::new();
    let records = journal.subscribe();
    let clock = Arc::new(PausedClock { start: tokio::time::Instant::now() });
    let supervisor =
        Supervisor::new(Arc::new(cfg.into()), SupervisorConfig::default(), ledger, clock, journal, "test".into())
            .start();
    supervisor.do_send(AttachServer {
        name: "srv".into(),
        engine: engine.clone(),
        list_limit: 10,
        retry_initial: Duration::from_millis(250),
        retry_max: Duration::from_secs(30),
    });
    World { engine, supervisor, records }
}

impl World {
    fn send(&self, json: &str) {
        let envelope = decode(json).expect("decodes");
        self.supervisor.do_send(Ingest { server: "srv".into(), envelope });
    }
    fn busy(&self, id: &str) {
        self.engine.busy.lock().unwrap().insert(id.into(), Status::Busy);
        self.send(&format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"busy"}}}}}}}}"#
        ));
    }
    fn drain(&mut self) -> Vec<(Action, Outcome)> {
        let mut out = Vec::new();
        while let Ok(r) = self.records.try_recv() {
            out.push((r.action, r.outcome));
        }
        out
    }
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn cfg() -> RecoveryConfig {
    RecoveryConfig { stall_timeout: Duration::from_secs(180), ..RecoveryConfig::default() }
}

#[actix::test]
async fn stalled_busy_session_is_aborted_then_continued_with_its_todos() {
    tokio::time::pause();
    let mut w = world(cfg());
    *w.engine.todos.lock().unwrap() = serde_json::from_str(
        r#"[{"content":"write parser","status":"in_progress"},{"content":"add tests","status":"pending"},{"content":"plan","status":"completed"}]"#,
    )
    .unwrap();
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(179)).await;
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "not before the timeout");

    tokio::time::sleep(Duration::from_secs(10)).await;
    settle().await;
    let calls = w.engine.calls();
    let abort = calls.iter().position(|c| c == "abort ses_A").expect("aborted");
    let prompt = calls.iter().position(|c| c == "prompt ses_A").expect("continued");
    assert!(abort < prompt);
    assert!(calls[..abort].iter().any(|c| c == "status /p"), "busy confirmed before abort");

    let (_, p) = w.engine.prompts.lock().unwrap()[0].clone();
    assert!(p.text.contains("write parser") && p.text.contains("add tests"), "{}", p.text);
    assert!(!p.text.contains("- [completed] plan"));
    assert_eq!(p.tag.kind, "continue");
    assert_eq!(p.turn.agent.as_deref(), Some("plan"));
    assert_eq!(p.turn.model.unwrap().model_id, "fake-model-2");
    assert_eq!(
        w.drain(),
        vec![
            // the heuristics advise before the abort (on by default, no model)
            (Action::Advise, Outcome::Done),
            (Action::StallDetected, Outcome::Done),
            (Action::Abort, Outcome::Done),
            (Action::Continue, Outcome::Done)
        ]
    );
}

#[actix::test]
async fn a_session_the_status_endpoint_calls_idle_is_not_aborted() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.busy("ses_A");
    settle().await;
    w.engine.busy.lock().unwrap().clear(); // the idle event was lost
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert!(!w.engine.calls().iter().any(|c| c.starts_with("abort")));
    assert_eq!(
        w.drain(),
        vec![
            (Action::Advise, Outcome::Done),
            (Action::StallDetected, Outcome::Done),
            (Action::Recover, Outcome::Declined)
        ]
    );
}

#[actix::test]
async fn reconnect_reconciliation_finds_a_busy_session_the_stream_never_mentioned() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.busy.lock().unwrap().insert("ses_Q".into(), Status::Busy);
    // The supervisor learns the directory from any event of the server.
    w.send(r#"{"directory":"/p","payload":{"type":"session.diff","properties":{"sessionID":"ses_other","diff":[]}}}"#);
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert!(fleet.sessions.iter().any(|s| s.id == "ses_Q" && s.busy));
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_Q".to_string()));
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
}

#[actix::test]
async fn context_windows_a_booting_server_did_not_give_are_read_again_with_the_reconnect_back_off() {
    tokio::time::pause();
    let w = world(cfg());
    w.engine.windows_failures.store(1, SeqCst);
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    let reply = |n: u32| {
        format!(
            r#"{{"directory":"/p","payload":{{"type":"message.updated","properties":{{"sessionID":"ses_W","info":{{"id":"msg_{n}","sessionID":"ses_W","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","time":{{"created":1,"completed":2}},"tokens":{{"input":50000,"output":10,"cache":{{"read":0,"write":0}}}}}}}}}}}}"#
        )
    };
    w.send(&reply(1));
    settle().await;
    let window = |fleet: shepherd_actors::supervisor::FleetView| {
        fleet.sessions.iter().find(|s| s.id == "ses_W").and_then(|s| s.context_window)
    };
    assert_eq!(window(w.supervisor.send(InspectFleet).await.unwrap()), None, "the first read failed");

    tokio::time::sleep(Duration::from_secs(1)).await; // past retry_initial (250 ms)
    settle().await;
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "windows").count(), 2);
    w.send(&reply(2));
    settle().await;
    assert_eq!(window(w.supervisor.send(InspectFleet).await.unwrap()), Some(200_000));
}

#[actix::test]
async fn shutdown_waits_for_a_recovery_under_way_to_send_its_continue() {
    tokio::time::pause();
    let w = world(RecoveryConfig { wait_after_abort: Duration::from_secs(30), ..cfg() });
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(181)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()));
    assert!(!w.engine.calls().contains(&"prompt ses_A".to_string()), "still waiting after the abort");
    let left = w.supervisor.send(Shutdown { grace: Duration::from_secs(60) }).await.unwrap();
    assert_eq!(left, 0);
    assert!(w.engine.calls().contains(&"prompt ses_A".to_string()), "the abort was followed by its continue");
}

#[actix::test]
async fn an_evicted_idle_session_resumes_with_its_counters_intact() {
    tokio::time::pause();
    let ledger = Arc::new(MemoryLedger::default());
    let mut w = world_with_ledger(cfg(), Arc::clone(&ledger));
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await; // stall -> recovery 1
    settle().await;
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
    w.send(r#"{"directory":"/p","payload":{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}}"#);
    settle().await;

    // Quiet for longer than idle_cleanup: the actor leaves memory.
    tokio::time::sleep(Duration::from_secs(11 * 60)).await;
    settle().await;
    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert!(fleet.sessions.iter().all(|s| s.id != "ses_A"), "evicted");
    assert_eq!(ledger.load("srv", "ses_A").await.unwrap().unwrap().attempts, 1);

    // It stalls again: a fresh actor resumes from the ledger, so this is attempt 2.
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await;
    settle().await;
    let prompts = w.engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 2);
    assert!(prompts[1].1.text.contains("attempt 2 of 3"), "{}", prompts[1].1.text);
}

#[actix::test]
async fn a_completion_seen_before_a_restart_is_reviewed_exactly_once_after_it() {
    tokio::time::pause();
    let ledger = Arc::new(MemoryLedger::default());
    let todos_open = r#"{"directory":"/p","payload":{"type":"todo.updated","properties":{"sessionID":"ses_R","todos":[{"content":"a","status":"in_progress"}]}}}"#;
    let todos_done = r#"{"directory":"/p","payload":{"type":"todo.updated","properties":{"sessionID":"ses_R","todos":[{"content":"a","status":"completed"}]}}}"#;
    let reply = |id: &str| {
        format!(
            r#"{{"directory":"/p","payload":{{"type":"message.updated","properties":{{"sessionID":"ses_R","info":{{"id":"{id}","sessionID":"ses_R","role":"assistant","finish":"stop","time":{{"created":1}}}}}}}}}}"#
        )
    };
    let idle = r#"{"directory":"/p","payload":{"type":"session.status","properties":{"sessionID":"ses_R","status":{"type":"idle"}}}}"#;
    let reviews = |w: &World| w.engine.prompts.lock().unwrap().iter().filter(|(_, p)| p.tag.kind == "review").count();

    // First Shepherd: sees the last todo done mid-turn, then stops before the turn ends.
    let w = world_with_ledger(cfg(), Arc::clone(&ledger));
    w.send(todos_open);
    w.busy("ses_R");
    w.send(todos_done);
    settle().await;
    w.supervisor.send(Shutdown { grace: Duration::from_secs(1) }).await.unwrap();
    assert_eq!(reviews(&w), 0);

    // Second Shepherd, same ledger: the turn ends; the completion is reviewed once.
    let w2 = world_with_ledger(cfg(), Arc::clone(&ledger));
    w2.busy("ses_R");
    w2.send(&reply("msg_1"));
    w2.engine.busy.lock().unwrap().clear();
    w2.send(idle);
    settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(reviews(&w2), 1);

    // The reviewed turn ends too: no second review for the same completion.
    w2.busy("ses_R");
    w2.send(&reply("msg_2"));
    w2.engine.busy.lock().unwrap().clear();
    w2.send(idle);
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(reviews(&w2), 1);
}

#[actix::test]
async fn a_reload_to_a_shorter_stall_timeout_recovers_at_the_new_deadline_not_the_old_one() {
    tokio::time::pause();
    let mut w = world(cfg()); // 180 s
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    settle().await;
    let short = RecoveryConfig { stall_timeout: Duration::from_secs(30), ..cfg() };
    w.supervisor
        .send(ReconfigureAll { rules: Arc::new(short.into()), fleet: SupervisorConfig::default() })
        .await
        .unwrap();
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await; // 25 s quiet: not yet
    settle().await;
    assert!(w.drain().is_empty(), "not before the new timeout");
    tokio::time::sleep(Duration::from_secs(10)).await; // 35 s quiet: past 30 s, long before 180 s
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()), "{:?}", w.engine.calls());
    let records = w.drain();
    assert!(records.contains(&(Action::StallDetected, Outcome::Done)), "{records:?}");
    assert!(records.contains(&(Action::Continue, Outcome::Done)), "{records:?}");
}

#[actix::test]
async fn a_session_seen_after_a_reload_decides_by_the_new_rules() {
    tokio::time::pause();
    let mut w = world(cfg()); // 180 s
    let short = RecoveryConfig { stall_timeout: Duration::from_secs(30), ..cfg() };
    w.supervisor.do_send(ReconfigureAll { rules: Arc::new(short.into()), fleet: SupervisorConfig::default() });
    w.busy("ses_B");
    settle().await;
    tokio::time::sleep(Duration::from_secs(35)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_B".to_string()), "{:?}", w.engine.calls());
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
}

#[actix::test]
async fn a_detached_server_s_sessions_save_their_state_stop_and_are_no_longer_supervised() {
    tokio::time::pause();
    let ledger = Arc::new(MemoryLedger::default());
    let mut w = world_with_ledger(cfg(), Arc::clone(&ledger));
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await; // one recovery: attempts = 1
    settle().await;
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
    w.busy("ses_A"); // busy again when the server is removed

    let released = w.supervisor.send(DetachServer { name: "srv".into() }).await.unwrap();
    assert_eq!(released, 1);
    assert_eq!(ledger.load("srv", "ses_A").await.unwrap().unwrap().attempts, 1, "state written before stopping");
    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert!(fleet.sessions.is_empty() && fleet.servers.is_empty(), "{fleet:?}");

    // Events that still arrive from it change nothing; no stall is ever handled.
    w.busy("ses_A");
    tokio::time::sleep(Duration::from_secs(400)).await;
    settle().await;
    assert!(w.drain().is_empty());
    assert_eq!(w.engine.calls().iter().filter(|c| c.starts_with("abort")).count(), 1);
}

#[actix::test]
async fn a_reload_to_a_shorter_discovery_interval_finds_a_missed_busy_session_sooner() {
    tokio::time::pause();
    let w = world(cfg()); // discovery every 60 s
    w.send(r#"{"directory":"/p","payload":{"type":"session.diff","properties":{"sessionID":"ses_other","diff":[]}}}"#);
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    w.engine.busy.lock().unwrap().insert("ses_Q".into(), Status::Busy); // its event was lost
    let fleet = SupervisorConfig { discovery_interval: Duration::from_secs(5), ..SupervisorConfig::default() };
    w.supervisor.send(ReconfigureAll { rules: Arc::new(cfg().into()), fleet }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    settle().await;
    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert!(fleet.sessions.iter().any(|s| s.id == "ses_Q" && s.busy), "found by discovery after 6 s, not 60 s");
}

/// OpenCode restarts ten seconds before the stall timer would fire: the stream breaks, the
/// restarted server lists nothing, and the turn was cut off. Nothing may be aborted on the
/// silence of a session Shepherd could not see; the reconciliation continues the turn once.
#[actix::test]
async fn a_server_restart_just_before_the_stall_timer_fires_continues_the_cut_off_turn_once_and_aborts_nothing() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(170)).await;
    settle().await;

    w.supervisor.do_send(StreamDown { server: "srv".into() });
    w.engine.busy.lock().unwrap().clear();
    *w.engine.last_turn.lock().unwrap() =
        Some(LastTurn { message_id: "msg_cut".into(), completed: false, errored: false, running_task: false });
    tokio::time::sleep(Duration::from_secs(60)).await; // past the stall deadline, still down
    settle().await;
    assert_eq!(w.drain(), vec![], "no stall decided while blind");

    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    assert_eq!(w.drain(), vec![(Action::Recover, Outcome::Done), (Action::Continue, Outcome::Done)]);
    tokio::time::sleep(Duration::from_secs(600)).await;
    settle().await;
    assert_eq!(w.drain(), vec![], "continued once, nothing more");
    let calls = w.engine.calls();
    assert!(!calls.iter().any(|c| c.starts_with("abort")), "{calls:?}");
    assert_eq!(calls.iter().filter(|c| *c == "prompt ses_A").count(), 1);
}

#[actix::test]
async fn after_a_stream_outage_a_still_busy_silent_session_is_recovered_a_full_stall_timeout_after_the_reconciliation()
{
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(100)).await;
    w.supervisor.do_send(StreamDown { server: "srv".into() });
    tokio::time::sleep(Duration::from_secs(200)).await; // the old deadline (180 s) passes unseen
    settle().await;
    assert!(!w.engine.calls().iter().any(|c| c.starts_with("abort")));

    w.supervisor.do_send(StreamUp { server: "srv".into() }); // still busy, still silent
    settle().await;
    tokio::time::sleep(Duration::from_secs(179)).await;
    settle().await;
    assert!(!w.engine.calls().iter().any(|c| c.starts_with("abort")), "not before a full stall timeout");
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()));
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
}
