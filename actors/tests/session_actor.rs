//! The actors with a fake engine and paused tokio time: no sockets, no real waiting.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use shepherd_actors::config::{RecoveryConfig, SupervisorConfig};
use shepherd_actors::control::{
    ControlError, CustomPromptRequest, GetSession, ListSessions, PauseTarget, SendCustomPrompt, SessionDetail, SetPause, StartHandoff,
};
use shepherd_actors::session::actor::{Inspect, RefreshTodos, StopSession};
use shepherd_actors::stats::LiveSession;
use shepherd_actors::event::{decode, Event, ModelRef, Role, SessionInfo, Status, Todo};
use shepherd_actors::journal::{Action, ActionRecord, Journal, Outcome};
use shepherd_actors::ledger::{
    Claim, DurableState, FleetPause, FleetSettings, Intent, IntentLog, Ledger, LedgerError, MemoryLedger, Snapshot,
    SnapshotStore,
};
use shepherd_actors::ports::{
    Clock, Control, Discovery, Engine, EngineError, HistoryMessage, HistoryPart, LastTurn, Lifecycle, Prompt, Reads,
    TurnSettings,
};
use shepherd_actors::stream_clock::{ReadToken, StreamClock};
use shepherd_actors::supervisor::{
    AttachServer, DetachServer, Ingest, InspectFleet, InspectLiveSources, ReconfigureAll, Registry, RouteState, Routed,
    Shutdown, StreamDown, StreamUp, Supervisor,
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
    /// This many aborts / prompts take effect but their answer is lost (a timeout).
    lost_abort_answers: std::sync::atomic::AtomicUsize,
    lost_prompt_answers: std::sync::atomic::AtomicUsize,
    /// This many prompts time out without arriving at all.
    dropped_prompts: std::sync::atomic::AtomicUsize,
    /// This many `last_turn` reads fail with a 503 first.
    failing_last_turns: std::sync::atomic::AtomicUsize,
    /// This many `last_turn` reads time out first, after longer than `abort_poll_max`.
    timed_out_last_turns: std::sync::atomic::AtomicUsize,
    /// This many prompts are refused with a 503 (not carried out).
    refused_prompts: std::sync::atomic::AtomicUsize,
    /// Sessions aborted (their latest reply ends with `MessageAbortedError`).
    aborted: Mutex<Vec<String>>,
    /// How every session's last assistant message ended (`None`: no message).
    last_turn: Mutex<Option<LastTurn>>,
    /// The next prompt takes this long to arrive (and to be answered).
    slow_prompt: Mutex<Option<Duration>>,
    /// The next status reads are slow, one entry each.
    slow_statuses: Mutex<std::collections::VecDeque<SlowRead>>,
    /// The title a session's description gives (`None`: none).
    title: Mutex<Option<String>>,
    /// What `GET /experimental/session` lists.
    listed: Mutex<Vec<SessionInfo>>,
    /// What `GET /question` and `GET /permission` answer, as the events that asked.
    asks: Mutex<Vec<Event>>,
}

/// A slow `GET /session/status`.
#[derive(Clone, Copy)]
enum SlowRead {
    /// Answered this long after it was asked, from the server as it is then.
    ReadAfter(Duration),
    /// Answered from the server as it was when asked, this long later.
    AnsweredAfter(Duration),
    /// Fails this long after it was asked.
    Fails(Duration),
}

/// Takes one from a counter of planned faults; true if there was one.
fn take_fault(counter: &std::sync::atomic::AtomicUsize) -> bool {
    counter.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
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
impl Reads for FakeEngine {
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError> {
        self.log(format!("status {directory}"));
        let slow = self.slow_statuses.lock().unwrap().pop_front();
        match slow {
            None => Ok(self.busy.lock().unwrap().clone()),
            Some(SlowRead::ReadAfter(delay)) => {
                tokio::time::sleep(delay).await;
                Ok(self.busy.lock().unwrap().clone())
            }
            Some(SlowRead::AnsweredAfter(delay)) => {
                let answer = self.busy.lock().unwrap().clone();
                tokio::time::sleep(delay).await;
                Ok(answer)
            }
            Some(SlowRead::Fails(delay)) => {
                tokio::time::sleep(delay).await;
                Err(EngineError::Unreachable("the planted failure".into()))
            }
        }
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Ok(SessionInfo {
            id: id.into(),
            parent_id: None,
            directory: Some("/p".into()),
            title: self.title.lock().unwrap().clone(),
            time: Default::default(),
            metadata: None,
        })
    }
    async fn todos(&self, id: &str) -> Result<Vec<Todo>, EngineError> {
        self.log(format!("todos {id}"));
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
        if take_fault(&self.failing_last_turns) {
            return Err(EngineError::Http { status: 503, body: "restarting".into() });
        }
        if take_fault(&self.timed_out_last_turns) {
            tokio::time::sleep(cfg().abort_poll_max * 2).await;
            return Err(EngineError::Unconfirmed("timed out".into()));
        }
        Ok(self.last_turn.lock().unwrap().clone())
    }
    /// The session as OpenCode would list it: the stalled reply (aborted if it was),
    /// then every prompt it received, tagged as sent.
    async fn history(&self, id: &str, _: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        self.log(format!("history {id}"));
        let aborted = self.aborted.lock().unwrap().iter().any(|a| a == id);
        let mut out = vec![HistoryMessage {
            id: "msg_reply".into(),
            role: Role::Assistant,
            created_ms: Some(1),
            agent: None,
            error: aborted.then(|| "MessageAbortedError".to_string()),
            summary: false,
            parts: vec![],
        }];
        for (n, (_, p)) in self.prompts.lock().unwrap().iter().filter(|(s, _)| s == id).enumerate() {
            out.push(HistoryMessage {
                id: format!("msg_prompt_{n}"),
                role: Role::User,
                created_ms: Some(2 + n as i64),
                agent: None,
                error: None,
                summary: false,
                parts: vec![HistoryPart::Text {
                    text: p.text.clone(),
                    synthetic: true,
                    ignored: false,
                    shepherd: Some(p.tag.clone()),
                }],
            });
        }
        Ok(out)
    }
}

#[async_trait]
impl Control for FakeEngine {
    async fn abort(&self, id: &str) -> Result<(), EngineError> {
        self.log(format!("abort {id}"));
        self.busy.lock().unwrap().remove(id);
        self.aborted.lock().unwrap().push(id.into());
        if take_fault(&self.lost_abort_answers) {
            return Err(EngineError::Unreachable("timed out (the abort arrived)".into()));
        }
        Ok(())
    }
    async fn summarize(&self, id: &str, _: &ModelRef) -> Result<(), EngineError> {
        self.log(format!("summarize {id}"));
        Ok(())
    }
    async fn prompt(&self, id: &str, p: &Prompt) -> Result<(), EngineError> {
        if take_fault(&self.dropped_prompts) {
            return Err(EngineError::Unconfirmed("timed out (the prompt never arrived)".into()));
        }
        let slow = self.slow_prompt.lock().unwrap().take();
        if let Some(delay) = slow {
            tokio::time::sleep(delay).await;
        }
        self.log(format!("prompt {id}"));
        if take_fault(&self.refused_prompts) {
            return Err(EngineError::Http { status: 503, body: "busy".into() });
        }
        self.prompts.lock().unwrap().push((id.into(), p.clone()));
        if take_fault(&self.lost_prompt_answers) {
            return Err(EngineError::Unreachable("timed out (the prompt arrived)".into()));
        }
        Ok(())
    }
}

impl Lifecycle for FakeEngine {}

#[async_trait]
impl Discovery for FakeEngine {
    async fn list_sessions(&self, _: u32) -> Result<Vec<SessionInfo>, EngineError> {
        Ok(self.listed.lock().unwrap().clone())
    }
    async fn pending_asks(&self, directory: &str) -> Result<Vec<Event>, EngineError> {
        self.log(format!("asks {directory}"));
        Ok(self.asks.lock().unwrap().clone())
    }
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        self.log("windows".into());
        let failures = &self.windows_failures;
        if failures.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(EngineError::Unreachable("booting".into()));
        }
        Ok(HashMap::from([("fake/fake-model".to_string(), 200_000)]))
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
    /// The server's stream clock (no pump feeds it unless a test does).
    stream: Arc<StreamClock>,
    /// The server's sessions, as its pump would route through them.
    registry: Arc<Registry>,
    supervisor: Addr<Supervisor>,
    records: tokio::sync::broadcast::Receiver<ActionRecord>,
}

fn world(cfg: RecoveryConfig) -> World {
    world_with_ledger(cfg, Arc::new(MemoryLedger::default()))
}

/// A supervisor with one server (`srv`, a fresh fake engine), a fresh journal and a
/// paused clock, over `ledger` (tests of eviction and restarts pass the same one twice).
fn world_with_ledger(cfg: RecoveryConfig, ledger: Arc<dyn Ledger>) -> World {
    world_on(cfg, ledger, Vec::new())
}

/// The same, the server's sessions spread over `threads` (none: the test's own).
fn world_on(cfg: RecoveryConfig, ledger: Arc<dyn Ledger>, threads: Vec<ArbiterHandle>) -> World {
    world_with_engines(cfg, ledger, threads, Vec::new())
}

/// [`world_on`], the sessions on each thread calling the server through that thread's
/// engine (none: the server's).
fn world_with_engines(
    cfg: RecoveryConfig,
    ledger: Arc<dyn Ledger>,
    threads: Vec<ArbiterHandle>,
    thread_engines: Vec<Arc<FakeEngine>>,
) -> World {
    let engine = Arc::new(FakeEngine::default());
    let journal = Journal::new();
    let records = journal.subscribe();
    let clock = Arc::new(PausedClock { start: tokio::time::Instant::now() });
    let stream = Arc::new(StreamClock::default());
    let registry = Arc::new(Registry::default());
    let supervisor =
        Supervisor::new(Arc::new(cfg.into()), SupervisorConfig::default(), ledger, clock, journal, "test".into())
            .start();
    supervisor.do_send(AttachServer {
        name: "srv".into(),
        engine: engine.clone(),
        list_limit: 10,
        retry_initial: Duration::from_millis(250),
        retry_max: Duration::from_secs(30),
        stream: Arc::clone(&stream),
        registry: Arc::clone(&registry),
        threads,
        thread_engines: thread_engines.into_iter().map(|e| e as Arc<dyn Engine>).collect(),
    });
    World { engine, stream, registry, supervisor, records }
}

impl World {
    fn send(&self, json: &str) {
        let envelope = decode(json).expect("decodes");
        self.supervisor.do_send(Ingest { server: "srv".into(), envelope, read: None, seq: 0 });
    }
    fn busy(&self, id: &str) {
        self.engine.busy.lock().unwrap().insert(id.into(), Status::Busy);
        self.send(&format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"busy"}}}}}}}}"#
        ));
    }
    /// Routes a frame as the server's pump does; true when it went straight to the
    /// session's actor, false when the long way, through the supervisor.
    fn route(&self, state: &mut RouteState, json: &str, read: &ReadToken) -> bool {
        match self.registry.route_frame(state, json, read, tokio::time::Instant::now(), |_| {}).expect("decodes") {
            Routed::Straight => true,
            Routed::Long(long) => {
                let (envelope, seq, read) = (long.envelope, long.seq, Some(Arc::clone(read)));
                self.supervisor.do_send(Ingest { server: "srv".into(), envelope, read, seq });
                false
            }
            Routed::Skipped => panic!("an event the tests route is acted on: {json}"),
        }
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

/// The abort's idle, shown by the session's own events (OpenCode sends it ~60 ms after
/// the abort), ends the wait: no `/session/status` read between the abort and the
/// continue. The poll is left for a stream that does not show it (the test above).
#[actix::test]
async fn the_idle_the_sessions_events_show_after_its_abort_ends_the_wait_without_reading_its_status() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(cfg().stall_timeout + Duration::from_millis(10)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()));
    tokio::time::sleep(Duration::from_millis(60)).await;
    abort_events(&w, "ses_A");
    settle().await;
    tokio::time::sleep(cfg().wait_after_abort + Duration::from_millis(10)).await;
    settle().await;

    let calls = w.engine.calls();
    let abort = calls.iter().position(|c| c == "abort ses_A").expect("aborted");
    let prompt = calls.iter().position(|c| c == "prompt ses_A").expect("continued once idle and the pause after it passed");
    assert!(!calls[abort..prompt].iter().any(|c| c.starts_with("status")), "the events said idle: {calls:?}");
    assert_eq!(calls.iter().filter(|c| c.starts_with("status")).count(), 1, "only the check before the abort: {calls:?}");
    let records = w.drain();
    assert!(records.ends_with(&[(Action::Abort, Outcome::Done), (Action::Continue, Outcome::Done)]), "{records:?}");
}

#[actix::test]
async fn a_session_the_status_endpoint_calls_idle_is_not_aborted() {
    tokio::time::pause();
    let ledger = Arc::new(MemoryLedger::default());
    let mut w = world_with_ledger(cfg(), ledger.clone());
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
    // The intent written beside the status check is ended with the decline.
    assert_eq!(ledger.open_intents("srv", None).await.unwrap(), vec![]);
}

/// A CPU-starved Shepherd: the session kept working, but its events wait behind a read
/// the supervisor has not handled. Its stall deadline passes in wall time and falls due
/// only in stream time — once the backlog is handled, which moves it.
#[actix::test]
async fn a_deadline_passed_while_the_sessions_events_wait_unhandled_is_not_a_stall() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.busy("ses_A");
    settle().await;
    w.stream.connected(None);
    tokio::time::sleep(Duration::from_secs(10)).await;
    // At 10 s the pump reads a chunk the supervisor will not reach for 200 s.
    let park = w.stream.parked();
    w.stream.reading();
    let unhandled = w.stream.mark(w.stream.read_through(Some(park))).await;
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "{:?}", w.engine.calls());
    assert!(!w.drain().contains(&(Action::StallDetected, Outcome::Done)), "no stall while events wait");
    assert_eq!(w.stream.deferred(), 1, "the deadline waits on the stream");

    // The backlog is handled at 210 s: it held the session's work, and its mark.
    let envelope = decode(r#"{"directory":"/p","payload":{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_1","messageID":"msg_1","sessionID":"ses_A","type":"text","text":"still working"}}}}"#).unwrap();
    w.supervisor.do_send(Ingest { server: "srv".into(), envelope, read: Some(Arc::new(unhandled)), seq: 0 });
    w.stream.parked();
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "{:?}", w.engine.calls());

    // Caught up, a real stall is acted on at its deadline, 180 s after that work.
    tokio::time::sleep(Duration::from_secs(170)).await;
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "not before the stall timeout");
    tokio::time::sleep(Duration::from_secs(20)).await;
    settle().await;
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "abort ses_A").count(), 1);
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
}

fn status_frame(id: &str, status: &str) -> String {
    format!(
        r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"{status}"}}}}}}}}"#
    )
}

fn part_frame(id: &str, text: &str) -> String {
    format!(
        r#"{{"directory":"/p","payload":{{"type":"message.part.updated","properties":{{"sessionID":"{id}","part":{{"id":"prt_1","messageID":"msg_1","sessionID":"{id}","type":"text","text":"{text}"}}}}}}}}"#
    )
}

/// The pump's path: a session's first event goes through the supervisor, which makes
/// its actor; the events behind it follow it there until it is handled (order is
/// kept); from then on they go straight to the actor, which acts on them.
#[actix::test]
async fn once_tracked_a_sessions_events_go_straight_to_its_actor_in_order() {
    tokio::time::pause();
    let w = world(cfg());
    w.engine.busy.lock().unwrap().insert("ses_A".into(), Status::Busy);
    w.stream.connected(None);
    let mut route = RouteState::default();
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    assert!(!w.route(&mut route, &status_frame("ses_A", "busy"), &read), "first sight: the supervisor makes the actor");
    assert!(!w.route(&mut route, &part_frame("ses_A", "one"), &read), "behind an event still on the long way");
    drop(read);
    w.stream.parked();
    settle().await;
    // Work at 100 s and 200 s, each straight to the actor: the stall deadline moves.
    for text in ["two", "three"] {
        tokio::time::sleep(Duration::from_secs(100)).await;
        let read: ReadToken = Arc::new(w.stream.mark(None).await);
        assert!(w.route(&mut route, &part_frame("ses_A", text), &read), "tracked: straight to the actor");
        drop(read);
        w.stream.parked();
        settle().await;
    }
    tokio::time::sleep(Duration::from_secs(170)).await;
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "the actor had the work at 200 s");
    tokio::time::sleep(Duration::from_secs(20)).await;
    settle().await;
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "abort ses_A").count(), 1, "silent 180 s after it");
}

/// A pump apart from its sessions (`supervisor.pump_apart`) hands a read's straight
/// events over together: none reaches its session before the read is flushed, and an
/// event going the long way flushes those before it first, so the supervisor's sends
/// land behind them and a session's events keep their order. While the next read is
/// already waiting they wait for its events, eight reads at most.
#[actix::test]
async fn a_pump_apart_hands_a_reads_events_over_together_and_before_anything_goes_the_long_way() {
    tokio::time::pause();
    let w = world(cfg());
    w.stream.connected(None);
    let mut route = RouteState::new(true);
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    assert!(!w.route(&mut route, &status_frame("ses_A", "busy"), &read), "first sight: the long way");
    settle().await;
    assert!(assert_published_detail_is_the_actors(&w, "ses_A", "tracked").await.busy);

    assert!(w.route(&mut route, &status_frame("ses_A", "idle"), &read), "tracked: straight, with the read");
    settle().await;
    assert!(assert_published_detail_is_the_actors(&w, "ses_A", "routed, not flushed").await.busy, "not handed over yet");
    assert!(!w.route(&mut route, &status_frame("ses_B", "busy"), &read), "another session's first sight");
    settle().await;
    assert!(!assert_published_detail_is_the_actors(&w, "ses_A", "flushed").await.busy, "handed over before the long way");

    // The read ends with the next one already waiting: its events wait for that one's.
    assert!(w.route(&mut route, &status_frame("ses_A", "busy"), &read));
    w.registry.end_of_read(&mut route, true);
    settle().await;
    assert!(!assert_published_detail_is_the_actors(&w, "ses_A", "more waiting").await.busy, "held for the next read");
    // Nothing more waiting: they cross.
    w.registry.end_of_read(&mut route, false);
    settle().await;
    assert!(assert_published_detail_is_the_actors(&w, "ses_A", "end of the reads").await.busy);

    // While the stream stays hot, a batch still crosses after eight reads.
    for n in 1..=8 {
        let status = if n % 2 == 0 { "idle" } else { "busy" };
        assert!(w.route(&mut route, &status_frame("ses_A", status), &read));
        w.registry.end_of_read(&mut route, true);
        settle().await;
        let busy = assert_published_detail_is_the_actors(&w, "ses_A", "hot stream").await.busy;
        assert_eq!(busy, n < 8, "read {n}: crossed only at the eighth");
    }
    drop(read);
}

/// Polls `done` (real time: for actors on threads of their own) for up to ten seconds.
async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

/// A server's sessions are spread over its sessions' threads, each always on the one
/// [`Registry::thread_of`] names: its actor starts there, and the pump's batches and the
/// supervisor's sends for it go there, behind one another (its events keep their
/// order). Stopping one thread shows it: exactly the sessions it held stop, and the
/// others still get every event, straight or the long way.
#[actix::test]
async fn a_servers_sessions_are_spread_over_its_threads_each_always_on_the_same() {
    let threads: Vec<Arbiter> = (0..3).map(|_| Arbiter::new()).collect();
    let w = world_on(cfg(), Arc::new(MemoryLedger::default()), threads.iter().map(Arbiter::handle).collect());
    w.stream.connected(None);
    let mut route = RouteState::new(true);
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    let ids: Vec<String> = (0..60).map(|i| format!("ses_{i:03}")).collect();
    for id in &ids {
        assert!(!w.route(&mut route, &status_frame(id, "busy"), &read), "first sight: the long way");
    }
    eventually("every session tracked", async || ids.iter().all(|id| w.registry.is_published(id))).await;
    let on: Vec<usize> = ids.iter().map(|id| w.registry.thread_of(id)).collect();
    for t in 0..3 {
        assert!(on.contains(&t), "thread {t} holds sessions: {on:?}");
    }
    let busy = |id: &String| {
        let addr = w.registry.actor(id).expect("tracked");
        async move { addr.send(Inspect).await.map(|d| d.busy).ok() }
    };

    threads[1].stop();
    let live = |t: &usize| *t != 1;
    eventually("the stopped thread's sessions, and only those, stopped", async || {
        ids.iter().zip(&on).all(|(id, t)| w.registry.actor(id).is_some_and(|a| a.connected()) == live(t))
    })
    .await;
    assert_eq!(on, ids.iter().map(|id| w.registry.thread_of(id)).collect::<Vec<_>>(), "always the same thread");

    // Straight, in one batch per thread: every live session takes its idle.
    for (id, t) in ids.iter().zip(&on).filter(|(_, t)| live(t)) {
        assert!(w.route(&mut route, &status_frame(id, "idle"), &read), "{id} on thread {t}: straight");
    }
    w.registry.end_of_read(&mut route, false);
    for (id, _) in ids.iter().zip(&on).filter(|(_, t)| live(t)) {
        eventually(&format!("{id} idle"), async || busy(id).await == Some(false)).await;
    }
    // The long way (a directory the supervisor has not seen, one per session): its send
    // goes to the session's thread too.
    for (id, _) in ids.iter().zip(&on).filter(|(_, t)| live(t)) {
        let frame = status_frame(id, "busy").replace(r#""directory":"/p""#, &format!(r#""directory":"/q/{id}""#));
        assert!(!w.route(&mut route, &frame, &read), "{id}: a new directory goes the long way");
    }
    for (id, _) in ids.iter().zip(&on).filter(|(_, t)| live(t)) {
        eventually(&format!("{id} busy again"), async || busy(id).await == Some(true)).await;
    }
    drop(read);
    for t in &threads {
        t.stop();
    }
}

/// The sessions on each of a server's threads call the server through that thread's
/// engine (in Shepherd: connections of the thread's own, driven there and not by the
/// pump's thread), never another thread's nor the server's own.
#[actix::test]
async fn each_threads_sessions_call_the_server_through_that_threads_engine() {
    let threads: Vec<Arbiter> = (0..2).map(|_| Arbiter::new()).collect();
    let engines: Vec<Arc<FakeEngine>> = (0..2).map(|_| Arc::new(FakeEngine::default())).collect();
    let handles = threads.iter().map(Arbiter::handle).collect();
    let w = world_with_engines(cfg(), Arc::new(MemoryLedger::default()), handles, engines.clone());
    w.stream.connected(None);
    let mut route = RouteState::new(true);
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    let ids: Vec<String> = (0..20).map(|i| format!("ses_{i:03}")).collect();
    for id in &ids {
        w.route(&mut route, &status_frame(id, "busy"), &read);
    }
    eventually("every session tracked", async || ids.iter().all(|id| w.registry.is_published(id))).await;
    // A busy session re-reads its todos (as after a reconnect): through its engine.
    for id in &ids {
        let addr = w.registry.actor(id).expect("tracked");
        addr.send(RefreshTodos { listed_updated_ms: None, unwatched_since: None }).await.unwrap();
    }
    let read_by = |engine: &FakeEngine, id: &str| engine.calls.lock().unwrap().iter().any(|c| *c == format!("todos {id}"));
    for id in &ids {
        let on = w.registry.thread_of(id);
        eventually(&format!("{id} read through thread {on}'s engine"), async || read_by(&engines[on], id)).await;
        assert!(!read_by(&engines[1 - on], id), "{id}: not through the other thread's engine");
        assert!(!read_by(&w.engine, id), "{id}: not through the server's own");
    }
    assert!(ids.iter().any(|id| w.registry.thread_of(id) == 0) && ids.iter().any(|id| w.registry.thread_of(id) == 1));
    drop(read);
    for t in &threads {
        t.stop();
    }
}

/// A pump apart from the sessions (its events cross in batches) and a read's mark, with
/// session `id` already tracked: its first event (busy) went the long way and created
/// its actor.
async fn streaming_apart(w: &World, id: &str) -> (RouteState, ReadToken) {
    let mut route = RouteState::new(true);
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    assert!(!w.route(&mut route, &status_frame(id, "busy"), &read), "first sight: the long way");
    settle().await;
    (route, read)
}

fn delta_frame(id: &str, message: &str) -> String {
    format!(
        r#"{{"directory":"/p","payload":{{"type":"message.part.delta","properties":{{"sessionID":"{id}","messageID":"{message}","partID":"prt_1","field":"text","delta":"x"}}}}}}"#
    )
}

/// A delta only says the session is working: the pump notes it in the session's cell
/// instead of sending it, and the actor takes it in before it decides anything. Here
/// no batch ever crosses to the actor, so only that path can keep the session alive:
/// ten minutes of deltas (stall timeout three) are no stall; once they stop, the stall
/// is acted on one stall timeout after the last.
#[actix::test]
async fn a_sessions_deltas_reach_its_decisions_without_a_message_to_its_actor() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.busy.lock().unwrap().insert("ses_A".into(), Status::Busy);
    let (mut route, read) = streaming_apart(&w, "ses_A").await;
    let last_activity = |w: &World| {
        let w = w.supervisor.clone();
        async move { w.send(GetSession("ses_A".into())).await.unwrap().expect("known").last_activity_ms }
    };
    let mut seen = last_activity(&w).await;
    for minute in 0..10 {
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(w.route(&mut route, &delta_frame("ses_A", "msg_1"), &read), "minute {minute}: straight");
        assert_eq!(route.waiting(), 0, "minute {minute}: nothing to send");
        settle().await;
        let now = last_activity(&w).await;
        assert!(now - seen >= 59_000, "minute {minute}: readers see the delta ({seen} → {now})");
        seen = now;
    }
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "{:?}", w.engine.calls());
    assert!(!w.drain().contains(&(Action::StallDetected, Outcome::Done)));

    tokio::time::sleep(cfg().stall_timeout - Duration::from_secs(5)).await;
    settle().await;
    assert!(w.engine.calls().iter().all(|c| !c.starts_with("abort")), "not before the stall timeout");
    // Meanwhile the actor's timer took the last delta in: readers still see it.
    assert_eq!(last_activity(&w).await, seen, "the last delta is what readers see");
    tokio::time::sleep(Duration::from_secs(10)).await;
    settle().await;
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "abort ses_A").count(), 1, "{:?}", w.engine.calls());
    drop(read);
}

/// While one message's deltas are noted and not yet taken, a delta of another message
/// goes to the actor as an event (whether a message is Shepherd's own is decided per
/// message); once the actor has taken the noted ones, deltas are noted again.
#[actix::test]
async fn a_delta_of_another_message_while_one_is_noted_goes_to_the_actor() {
    tokio::time::pause();
    let w = world(cfg());
    let (mut route, read) = streaming_apart(&w, "ses_A").await;
    assert!(w.route(&mut route, &delta_frame("ses_A", "msg_1"), &read));
    // Spelled otherwise than OpenCode does, it is decoded first, and noted the same way.
    assert!(w.route(&mut route, &delta_frame("ses_A", "msg_1").replace(r#""field":"#, r#""field": "#), &read));
    assert_eq!(route.waiting(), 0, "noted, not sent");
    assert!(w.route(&mut route, &delta_frame("ses_A", "msg_2"), &read));
    assert_eq!(route.waiting(), 1, "another message's delta: sent");
    w.registry.end_of_read(&mut route, false);
    settle().await;
    assert!(w.route(&mut route, &delta_frame("ses_A", "msg_2"), &read));
    assert_eq!(route.waiting(), 0, "taken by the actor: noted again");
    drop(read);
}

/// A delta for a session whose actor has stopped (its slot still there) is not noted
/// where nothing would take it: it goes the long way, and the supervisor starts a new
/// actor, whose cell takes the next one.
#[actix::test]
async fn a_delta_for_a_stopped_actor_goes_the_long_way_and_a_new_actor_takes_the_next() {
    tokio::time::pause();
    let w = world(cfg());
    let (mut route, read) = streaming_apart(&w, "ses_A").await;
    let first = w.registry.actor("ses_A").expect("tracked");
    first.do_send(StopSession);
    settle().await;
    assert!(!first.connected(), "stopped");
    assert!(!w.route(&mut route, &delta_frame("ses_A", "msg_1"), &read), "not noted for a stopped actor");
    settle().await;
    let second = w.registry.actor("ses_A").expect("tracked again");
    assert!(second.connected(), "a new actor");
    assert!(w.route(&mut route, &delta_frame("ses_A", "msg_1"), &read), "noted for the new one");
    assert_eq!(route.waiting(), 0);
    drop(read);
}

/// A subagent's events go through the supervisor, which tells its parent too; a
/// deletion goes there as well (the supervisor forgets the session).
#[actix::test]
async fn a_subagents_events_and_a_deletion_go_the_long_way() {
    tokio::time::pause();
    let w = world(cfg());
    let mut route = RouteState::default();
    let read: ReadToken = Arc::new(w.stream.mark(None).await);
    let created = |id: &str, parent: &str| {
        format!(
            r#"{{"directory":"/p","payload":{{"type":"session.created","properties":{{"info":{{"id":"{id}","parentID":"{parent}","directory":"/p","title":"t","time":{{"created":1,"updated":1}}}}}}}}}}"#
        )
    };
    assert!(!w.route(&mut route, &status_frame("ses_P", "busy"), &read));
    settle().await;
    assert!(w.route(&mut route, &part_frame("ses_P", "x"), &read), "the parent is an ordinary session");
    assert!(!w.route(&mut route, &created("ses_C", "ses_P"), &read), "a family link to learn");
    settle().await;
    assert!(!w.route(&mut route, &part_frame("ses_C", "y"), &read), "a known child: its parent hears of it");
    settle().await;
    let deleted = r#"{"directory":"/p","payload":{"type":"session.deleted","properties":{"info":{"id":"ses_P","directory":"/p","title":"t","time":{"created":1,"updated":1}}}}}"#;
    assert!(!w.route(&mut route, deleted, &read));
    settle().await;
    assert!(!w.route(&mut route, &part_frame("ses_P", "z"), &read), "forgotten: first sight again");
    drop(read);
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
    let mut w = world_with_ledger(cfg(), ledger.clone());
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

/// Past `max_sessions_in_memory` the longest-quiet sessions leave memory first (their
/// state in the ledger), however recently the others spoke; under it, only age counts.
#[actix::test]
async fn past_the_cap_the_longest_quiet_sessions_leave_memory_first() {
    tokio::time::pause();
    let w = world(cfg());
    let fleet = SupervisorConfig { max_sessions_in_memory: 2, ..SupervisorConfig::default() };
    w.supervisor.send(ReconfigureAll { rules: Arc::new(cfg().into()), fleet }).await.unwrap();
    for id in ["ses_old", "ses_mid", "ses_new"] {
        w.send(&format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"idle"}}}}}}}}"#
        ));
        settle().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let tracked = |fleet: shepherd_actors::supervisor::FleetView| {
        let mut ids: Vec<String> = fleet.sessions.into_iter().map(|s| s.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(tracked(w.supervisor.send(InspectFleet).await.unwrap()), ["ses_mid", "ses_new", "ses_old"]);
    tokio::time::sleep(SupervisorConfig::default().cleanup_interval).await;
    settle().await;
    assert_eq!(
        tracked(w.supervisor.send(InspectFleet).await.unwrap()),
        ["ses_mid", "ses_new"],
        "one over the cap: the longest quiet left"
    );
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
    let w = world_with_ledger(cfg(), ledger.clone());
    w.send(todos_open);
    w.busy("ses_R");
    w.send(todos_done);
    settle().await;
    w.supervisor.send(Shutdown { grace: Duration::from_secs(1) }).await.unwrap();
    assert_eq!(reviews(&w), 0);

    // Second Shepherd, same ledger: the turn ends; the completion is reviewed once.
    let w2 = world_with_ledger(cfg(), ledger.clone());
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
    let mut w = world_with_ledger(cfg(), ledger.clone());
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

/// A session's idle event is lost while the stream stays up: the next periodic discovery
/// reads the statuses and tells it (it thinks it is busy), so it is not aborted as
/// stalled later. (Idle sessions the reading leaves out are not told: they know.)
#[actix::test]
async fn periodic_discovery_tells_a_session_that_missed_its_idle_event() {
    tokio::time::pause();
    let w = world(cfg()); // discovery every 60 s, stall timeout 180 s
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    let busy = |fleet: &shepherd_actors::supervisor::FleetView| fleet.sessions.iter().any(|s| s.id == "ses_A" && s.busy);
    assert!(busy(&w.supervisor.send(InspectFleet).await.unwrap()));
    w.engine.busy.lock().unwrap().clear(); // idle on the server; its event was lost
    tokio::time::sleep(SupervisorConfig::default().discovery_interval + Duration::from_secs(1)).await;
    settle().await;
    assert!(!busy(&w.supervisor.send(InspectFleet).await.unwrap()), "discovery told it");
    tokio::time::sleep(cfg().stall_timeout).await;
    settle().await;
    assert!(!w.engine.calls().iter().any(|c| c.starts_with("abort")), "{:?}", w.engine.calls());
}

/// A periodic discovery looks only at the sessions whose actor does not think them
/// idle (at 100,000 sessions a pass over all of them held the supervisor's thread):
/// each actor keeps its own entry as it learns its session busy or idle, and takes it
/// away when it stops.
#[actix::test]
async fn the_sessions_not_thought_idle_are_kept_as_their_actors_learn() {
    tokio::time::pause();
    let w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    let status = |id: &str, status: &str| {
        w.send(&format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"{status}"}}}}}}}}"#
        ));
    };
    status("ses_A", "busy");
    status("ses_B", "idle");
    status("ses_C", "busy");
    settle().await;
    assert_eq!(w.registry.len(), 3);
    assert_eq!(w.registry.not_idle().len(), 2, "the two busy ones");
    status("ses_A", "idle");
    settle().await;
    assert_eq!(w.registry.not_idle().len(), 1, "ses_C");
    status("ses_B", "busy");
    settle().await;
    assert_eq!(w.registry.not_idle().len(), 2, "ses_B and ses_C");
    w.registry.actor("ses_C").expect("tracked").do_send(StopSession);
    settle().await;
    assert_eq!(w.registry.not_idle().len(), 1, "a stopped actor leaves: ses_B");
}

/// A connected server (paused time) with one session, `id`, idle in `/p`.
async fn with_an_idle_session(id: &str) -> World {
    tokio::time::pause();
    let w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"idle"}}}}}}}}"#
    ));
    settle().await;
    w
}

/// The other way round: a tracked session's busy event is lost; the next periodic
/// discovery tells it (it thinks it is idle), and its stall is then seen.
#[actix::test]
async fn periodic_discovery_tells_an_idle_session_that_missed_its_busy_event() {
    let w = with_an_idle_session("ses_B").await;
    let busy = |fleet: &shepherd_actors::supervisor::FleetView| fleet.sessions.iter().any(|s| s.id == "ses_B" && s.busy);
    assert!(!busy(&w.supervisor.send(InspectFleet).await.unwrap()));
    w.engine.busy.lock().unwrap().insert("ses_B".into(), Status::Busy); // its event was lost
    tokio::time::sleep(SupervisorConfig::default().discovery_interval + Duration::from_secs(1)).await;
    settle().await;
    assert!(busy(&w.supervisor.send(InspectFleet).await.unwrap()), "discovery told it");
    tokio::time::sleep(cfg().stall_timeout + Duration::from_secs(1)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_B".to_string()), "its stall is seen: {:?}", w.engine.calls());
}

/// The abort's own events, as OpenCode sends them once it lands.
fn abort_events(w: &World, id: &str) {
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.error","properties":{{"sessionID":"{id}","error":{{"name":"MessageAbortedError","data":{{"message":"Aborted"}}}}}}}}}}"#
    ));
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"idle"}}}}}}}}"#
    ));
}

#[actix::test]
async fn an_abort_whose_answer_was_lost_is_checked_on_the_session_and_continued_once() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.lost_abort_answers.store(1, SeqCst);
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(181)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()));
    assert!(!w.engine.calls().contains(&"prompt ses_A".to_string()), "the abort's answer was lost: no continue yet");
    abort_events(&w, "ses_A"); // the abort did land: its events are ours, not the person's
    settle().await;
    // Once the abort had time to land (abort_poll_max), the session is read and the
    // missing continue sent.
    tokio::time::sleep(cfg().abort_poll_max + Duration::from_secs(1)).await;
    settle().await;
    let prompts = w.engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1, "one continue: {prompts:?}");
    assert_eq!(prompts[0].1.tag.kind, "continue");
    let records = w.drain();
    assert!(!records.contains(&(Action::Pause, Outcome::Done)), "our own abort did not pause the session: {records:?}");
    assert_eq!(
        records,
        vec![
            (Action::Advise, Outcome::Done),
            (Action::StallDetected, Outcome::Done),
            (Action::Recover, Outcome::Failed),
            (Action::Continue, Outcome::Done),
        ]
    );
    // Nothing more: a stall timeout later there is still one continue.
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 1);
}

#[actix::test]
async fn a_continue_whose_answer_was_lost_is_found_in_the_session_and_not_sent_again() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.lost_prompt_answers.store(1, SeqCst);
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await;
    settle().await;
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 1, "the continue went out (its answer was lost)");
    tokio::time::sleep(cfg().abort_poll_max + Duration::from_secs(1)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"history ses_A".to_string()), "the session was read");
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 1, "not sent again");
    let records: Vec<ActionRecord> = std::iter::from_fn(|| w.records.try_recv().ok()).collect();
    let last = records.last().expect("records");
    assert_eq!((last.action, last.outcome), (Action::Continue, Outcome::Done), "{records:?}");
    assert!(last.reason.contains("in the session already"), "{}", last.reason);
}

#[actix::test]
async fn a_continue_refused_with_a_server_error_is_checked_in_the_session_and_sent_once() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.refused_prompts.store(1, SeqCst);
    w.busy("ses_A");
    settle().await;
    // Stalled at 180 s, aborted, the continue tried after `wait_after_abort`.
    tokio::time::sleep(Duration::from_secs(180) + cfg().wait_after_abort + Duration::from_millis(500)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"prompt ses_A".to_string()), "the continue was tried");
    assert!(w.engine.prompts.lock().unwrap().is_empty(), "and refused (503)");
    // A 5xx is not a "no": once the request had time to land, the session is read and
    // the continue, missing there, sent once under the same decision.
    tokio::time::sleep(cfg().abort_poll_max + Duration::from_secs(1)).await;
    settle().await;
    assert!(w.engine.calls().contains(&"history ses_A".to_string()), "the session was read");
    let prompts = w.engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1, "one continue: {prompts:?}");
    assert_eq!(prompts[0].1.tag.kind, "continue");
    let records: Vec<ActionRecord> = std::iter::from_fn(|| w.records.try_recv().ok()).collect();
    let last = records.last().expect("records");
    assert_eq!((last.action, last.outcome), (Action::Continue, Outcome::Done), "{records:?}");
    assert!(last.reason.contains("sent it once"), "{}", last.reason);
    // Nothing more: a stall timeout later there is still one continue.
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 1);
}

/// A ledger whose first `failing` state writes fail (a full disk, a lock held too long).
struct FlakyLedger {
    inner: MemoryLedger,
    failing: std::sync::atomic::AtomicUsize,
    /// Held (written) by a test: state writes wait until it is released.
    gate: tokio::sync::RwLock<()>,
    /// State writes begun.
    saves: std::sync::atomic::AtomicUsize,
    /// Held (written) by a test: state loads wait until it is released.
    load_gate: tokio::sync::RwLock<()>,
    /// Each write's records, and whether the state went with them.
    writes: Mutex<Vec<(Vec<Action>, bool)>>,
}

impl FlakyLedger {
    fn new(failing: usize) -> Self {
        Self {
            inner: MemoryLedger::default(),
            failing: failing.into(),
            gate: Default::default(),
            saves: 0.into(),
            load_gate: Default::default(),
            writes: Default::default(),
        }
    }
}

#[async_trait]
impl SnapshotStore for FlakyLedger {
    async fn save_snapshot(&self, s: &Snapshot) -> Result<Option<String>, LedgerError> {
        self.inner.save_snapshot(s).await
    }
    async fn snapshots(&self, server: &str, session: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
        self.inner.snapshots(server, session).await
    }
    async fn snapshot(&self, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
        self.inner.snapshot(id).await
    }
    async fn claim(&self, id: &str, session: &str) -> Result<Claim, LedgerError> {
        self.inner.claim(id, session).await
    }
}

#[async_trait]
impl IntentLog for FlakyLedger {
    async fn put_intent(&self, intent: &Intent) -> Result<(), LedgerError> {
        self.inner.put_intent(intent).await
    }
    async fn end_intent(&self, server: &str, decision: &str) -> Result<(), LedgerError> {
        self.inner.end_intent(server, decision).await
    }
    async fn open_intents(&self, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
        self.inner.open_intents(server, session).await
    }
}

#[async_trait]
impl FleetSettings for FlakyLedger {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
        self.inner.fleet_pause().await
    }
    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError> {
        self.inner.set_fleet_pause(pause).await
    }
    async fn watched_until(&self, server: &str) -> Result<Option<i64>, LedgerError> {
        self.inner.watched_until(server).await
    }
    async fn set_watched_until(&self, server: &str, wall_ms: i64) -> Result<(), LedgerError> {
        self.inner.set_watched_until(server, wall_ms).await
    }
}

#[async_trait]
impl Ledger for FlakyLedger {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
        let _open = self.load_gate.read().await;
        self.inner.load(server, session).await
    }
    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError> {
        self.saves.fetch_add(1, SeqCst);
        let _open = self.gate.read().await;
        if take_fault(&self.failing) {
            return Err(LedgerError::Storage("disk full".into()));
        }
        self.inner.save(server, session, state).await
    }
    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError> {
        self.inner.append(record).await
    }
    async fn write(
        &self,
        server: &str,
        session: &str,
        records: &[ActionRecord],
        state: Option<&DurableState>,
    ) -> Result<(), LedgerError> {
        self.writes.lock().unwrap().push((records.iter().map(|r| r.action).collect(), state.is_some()));
        // As SQLite's: the state's write first, and the records only if it was kept (both
        // or neither).
        if let Some(state) = state {
            self.save(server, session, state).await?;
        }
        for record in records {
            self.inner.append(record).await?;
        }
        Ok(())
    }
    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
        self.inner.history(session, limit).await
    }
    async fn unfinished_handoffs(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        self.inner.unfinished_handoffs(server).await
    }
}

/// The actions of the records the journal told of since the last call, in order.
fn journal_actions(w: &mut World) -> Vec<Action> {
    std::iter::from_fn(|| w.records.try_recv().ok()).map(|r| r.action).collect()
}

impl FlakyLedger {
    /// Four state-write retries' time passes (no event comes to trigger a write): every
    /// planned failure has happened.
    async fn let_the_retries_run(&self) {
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            settle().await;
        }
        assert_eq!(self.failing.load(SeqCst), 0, "every planned failure happened");
    }

    /// The actions of `session`'s records in the ledger, oldest first.
    async fn actions(&self, session: &str) -> Vec<Action> {
        self.inner.history(session, 100).await.unwrap().iter().map(|r| r.action).collect()
    }
}

/// A recovery's records reach the ledger with the state that names the last of them,
/// in one write per step rather than one per record plus one per state: `shepherd
/// history` and a restart's resume agree on what was done, at a third of the round trips.
#[actix::test]
async fn a_recoverys_records_go_to_the_ledger_with_its_state_in_one_write_per_step() {
    tokio::time::pause();
    let ledger = Arc::new(FlakyLedger::new(0));
    let mut w = world_with_ledger(cfg(), ledger.clone());
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await; // stall -> recovery
    settle().await;
    assert!(w.engine.calls().contains(&"prompt ses_A".to_string()));
    let journal = journal_actions(&mut w);
    let kept = ledger.actions("ses_A").await;
    assert_eq!(kept, journal, "every record the journal told of is in the ledger, in order");
    let saved = ledger.inner.load("srv", "ses_A").await.unwrap().expect("written");
    let last = ledger.inner.history("ses_A", 1).await.unwrap().pop().expect("a record");
    assert_eq!(saved.last_action, Some(format!("{}:{}", last.action.as_str(), last.outcome.as_str())));
    let writes = ledger.writes.lock().unwrap().clone();
    let written: usize = writes.iter().map(|(records, _)| records.len()).sum();
    assert_eq!(written, journal.len(), "each record written once: {writes:?}");
    let with_records: Vec<_> = writes.iter().filter(|(records, _)| !records.is_empty()).collect();
    assert!(with_records.iter().all(|(_, state)| *state), "each went with the state: {writes:?}");
    assert!(with_records.len() < journal.len(), "records of one step share a write: {writes:?}");
}

#[actix::test]
async fn a_state_write_that_failed_is_retried_until_the_ledger_has_it() {
    tokio::time::pause();
    let ledger = Arc::new(FlakyLedger::new(3));
    let mut w = world_with_ledger(cfg(), ledger.clone());
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(190)).await; // stall -> recovery 1
    settle().await;
    assert!(w.engine.calls().contains(&"prompt ses_A".to_string()));
    // The writes of the recovery's state failed; no further event comes to trigger one.
    ledger.let_the_retries_run().await;
    let saved = ledger.inner.load("srv", "ses_A").await.unwrap().expect("written after the failures");
    assert_eq!(saved.attempts, 1, "the recovery's attempt is in the ledger: a restart does not repeat it");
    // The records of the writes that failed went with the retry: each once, in order.
    let journal = journal_actions(&mut w);
    let kept = ledger.actions("ses_A").await;
    assert_eq!(kept, journal, "no record lost with the state writes that failed");
}

/// The recovery's writes fail (a full disk) and succeed later: the records they held go
/// with the retry — each once, in order — so `shepherd history` keeps what was done.
#[actix::test]
async fn the_records_of_a_write_that_failed_go_with_its_retry() {
    tokio::time::pause();
    let ledger = Arc::new(FlakyLedger::new(0));
    let mut w = world_with_ledger(cfg(), ledger.clone());
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(170)).await;
    settle().await;
    ledger.failing.store(2, SeqCst);
    tokio::time::sleep(Duration::from_secs(20)).await; // stall -> recovery, its writes fail
    settle().await;
    assert!(w.engine.calls().contains(&"prompt ses_A".to_string()));
    ledger.let_the_retries_run().await;
    let failed_with_records = ledger.writes.lock().unwrap().iter().filter(|(records, _)| !records.is_empty()).count();
    assert!(failed_with_records > 2, "records were in the writes that failed and again in a later one");
    let journal = journal_actions(&mut w);
    assert!(journal.contains(&Action::StallDetected) && journal.contains(&Action::Continue), "{journal:?}");
    let kept = ledger.actions("ses_A").await;
    assert_eq!(kept, journal, "no record lost with the writes that failed");
}

/// A turn's changes come within milliseconds: while one state write is under way the
/// next ones wait and go as one, holding the latest state (no change is lost, none is
/// written on its own).
#[actix::test]
async fn changes_made_while_a_state_write_is_under_way_go_in_one_write_after_it() {
    tokio::time::pause();
    let ledger = Arc::new(FlakyLedger::new(0));
    let w = world_with_ledger(cfg(), ledger.clone());
    let todos = |status: &str| {
        format!(
            r#"{{"directory":"/p","payload":{{"type":"todo.updated","properties":{{"sessionID":"ses_A","todos":[{{"content":"a","status":"{status}"}}]}}}}}}"#
        )
    };
    w.busy("ses_A");
    settle().await;
    let held = ledger.gate.write().await;
    let before = ledger.saves.load(SeqCst);
    w.send(&todos("pending"));
    settle().await;
    assert_eq!(ledger.saves.load(SeqCst), before + 1, "the first change is written at once");
    w.send(&todos("in_progress"));
    w.send(&todos("completed"));
    settle().await;
    assert_eq!(ledger.saves.load(SeqCst), before + 1, "later changes wait for the write under way");
    drop(held);
    settle().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(ledger.saves.load(SeqCst), before + 2, "then one write carries both");
    let saved = ledger.inner.load("srv", "ses_A").await.unwrap().expect("written");
    assert_eq!(saved.todos[0].status, shepherd_actors::event::TodoStatus::Completed, "the latest state: {:?}", saved.todos);
}

/// A turn of `id` that ends on the provider's error after OpenCode's retries.
fn provider_failure(w: &World, id: &str) {
    w.busy(id);
    w.engine.busy.lock().unwrap().remove(id);
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.error","properties":{{"sessionID":"{id}","error":{{"name":"APIError","data":{{"message":"Rate limit reached","statusCode":429,"isRetryable":true}}}}}}}}}}"#
    ));
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"idle"}}}}}}}}"#
    ));
}

#[actix::test]
async fn a_fleet_outage_is_probed_by_one_session_and_the_others_resume_once_when_it_closes() {
    tokio::time::pause();
    let mut w = world(RecoveryConfig {
        provider_backoff: Duration::from_secs(60),
        breaker_sessions: 3,
        breaker_window: Duration::from_secs(120),
        ..cfg()
    });
    for id in ["ses_A", "ses_B", "ses_C"] {
        provider_failure(&w, id);
    }
    settle().await;
    let records = w.drain();
    assert_eq!(records.iter().filter(|r| **r == (Action::ProviderError, Outcome::Done)).count(), 3);
    assert!(records.contains(&(Action::Breaker, Outcome::Done)), "three sessions at once open the breaker");
    tokio::time::sleep(Duration::from_secs(59)).await;
    settle().await;
    assert!(w.engine.prompts.lock().unwrap().is_empty(), "nothing before the back-off");

    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    let prompts = w.engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1, "one session probes, the others wait: {prompts:?}");
    let probe = prompts[0].0.clone();
    assert_eq!(prompts[0].1.tag.kind, "continue");
    assert_eq!(prompts[0].1.turn.agent.as_deref(), Some("plan"), "the session's last agent");
    assert_eq!(w.drain().iter().filter(|r| **r == (Action::Breaker, Outcome::Declined)).count(), 2);

    // The probe's turn finishes normally: the breaker closes, the others resume at once.
    w.busy(&probe);
    w.engine.busy.lock().unwrap().remove(&probe);
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"message.updated","properties":{{"sessionID":"{probe}","info":{{"id":"msg_ok","sessionID":"{probe}","role":"assistant","finish":"stop","time":{{"created":1,"completed":2}}}}}}}}}}"#
    ));
    w.send(&format!(
        r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{probe}","status":{{"type":"idle"}}}}}}}}"#
    ));
    settle().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    settle().await;
    let mut sessions: Vec<String> = w.engine.prompts.lock().unwrap().iter().map(|(id, _)| id.clone()).collect();
    sessions.sort();
    assert_eq!(sessions, ["ses_A", "ses_B", "ses_C"], "every session resumed once");
    // An hour later nothing more was sent: once per step.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    settle().await;
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 3);
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
        Some(LastTurn { message_id: "msg_cut".into(), completed: false, errored: false, running_task: false, reply: None, running: Vec::new() });
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

/// A session no actor tracks (never seen, or evicted) runs a turn while the stream is
/// down: the reconnect's listing shows it updated since the stream went down, so it gets
/// an actor that reads its todo list and the turn's reply (and takes the turn's idle
/// edge). One last updated before the outage costs nothing; so does everything on a
/// first start, when nothing says since when nobody watched.
#[actix::test]
async fn a_session_without_an_actor_updated_while_the_stream_was_down_is_caught_up_after_the_reconnect() {
    tokio::time::pause();
    let ledger = Arc::new(MemoryLedger::default());
    let w = world_with_ledger(cfg(), ledger.clone());
    let listed = |id: &str, updated: i64| SessionInfo {
        id: id.into(),
        parent_id: None,
        directory: Some("/p".into()),
        title: None,
        time: shepherd_actors::event::Times { created: Some(1), updated: Some(updated), completed: None },
        metadata: None,
    };
    *w.engine.listed.lock().unwrap() = vec![listed("ses_before", 1_000)];
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    let tracked = |fleet: &shepherd_actors::supervisor::FleetView, id: &str| fleet.sessions.iter().any(|s| s.id == id);
    assert!(!tracked(&w.supervisor.send(InspectFleet).await.unwrap(), "ses_before"), "a first start catches up nothing");
    let reads = |id: &str| w.engine.calls().iter().filter(|c| **c == format!("todos {id}") || **c == format!("last_turn {id}")).count();
    tokio::time::sleep(Duration::from_secs(10)).await;

    w.supervisor.do_send(StreamDown { server: "srv".into() });
    settle().await;
    let down_ms = ledger.watched_until("srv").await.unwrap().expect("recorded as the stream went down");
    tokio::time::sleep(Duration::from_secs(30)).await;
    *w.engine.listed.lock().unwrap() = vec![listed("ses_before", down_ms - 60_000), listed("ses_U", down_ms + 20_000)];
    *w.engine.todos.lock().unwrap() = vec![serde_json::from_str(r#"{"content":"t","status":"pending"}"#).unwrap()];
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;

    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert!(tracked(&fleet, "ses_U") && !tracked(&fleet, "ses_before"), "{:?}", fleet.sessions);
    assert_eq!(reads("ses_U"), 2, "its list and its last turn: {:?}", w.engine.calls());
    assert_eq!(reads("ses_before"), 0);
    assert!(ledger.watched_until("srv").await.unwrap().unwrap() > down_ms, "watched again from the reconnect");
}

/// A busy session asks the person a question while the stream is down: the reconnect
/// reads the directory's pending asks, so the session is known to wait (busy and silent
/// by design) and is never aborted, however long it waits.
#[actix::test]
async fn a_question_asked_while_the_stream_was_down_keeps_its_session_from_being_aborted() {
    tokio::time::pause();
    let w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    w.supervisor.do_send(StreamDown { server: "srv".into() });
    *w.engine.asks.lock().unwrap() = vec![Event::QuestionAsked { id: "que_1".into(), session_id: "ses_A".into() }];
    tokio::time::sleep(Duration::from_secs(10)).await;
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    tokio::time::sleep(3 * cfg().stall_timeout).await;
    settle().await;
    let calls = w.engine.calls();
    assert!(calls.contains(&"asks /p".to_string()), "{calls:?}");
    assert!(!calls.iter().any(|c| c.starts_with("abort")), "{calls:?}");
}

/// The same, with the first read of the cut-off turn answered 503 after the reconnect:
/// the read is tried again, and the turn still continued once.
/// A periodic reading of the statuses is under way when OpenCode restarts; it is answered
/// by the restarted server (which lists nothing) while the stream is still down. Applied,
/// it would call the session idle without looking at its cut-off turn, and the
/// reconnect's own check would then find nothing busy to look at.
#[actix::test]
async fn a_periodic_reading_that_lands_while_the_stream_is_down_does_not_hide_the_cut_off_turn() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    w.engine.slow_statuses.lock().unwrap().push_back(SlowRead::ReadAfter(Duration::from_secs(10)));
    let discovery = SupervisorConfig::default().discovery_interval;
    tokio::time::sleep(discovery + Duration::from_secs(1)).await; // the reading is under way
    settle().await;

    w.supervisor.do_send(StreamDown { server: "srv".into() });
    w.engine.busy.lock().unwrap().clear();
    *w.engine.last_turn.lock().unwrap() =
        Some(LastTurn { message_id: "msg_cut".into(), completed: false, errored: false, running_task: false, reply: None, running: Vec::new() });
    tokio::time::sleep(Duration::from_secs(20)).await; // it lands, the stream still down
    settle().await;
    assert_eq!(w.drain(), vec![]);

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

/// A periodic reading of the statuses is answered late, from before a turn that the
/// stream announced meanwhile: the stream's word is newer. Applied, the reading would
/// call the working session idle, and its stall would never be seen.
#[actix::test]
async fn a_status_reading_older_than_the_stream_s_news_does_not_call_a_working_session_idle() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.send(r#"{"directory":"/p","payload":{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}}"#);
    settle().await;
    w.engine.slow_statuses.lock().unwrap().push_back(SlowRead::AnsweredAfter(Duration::from_secs(10)));
    let discovery = SupervisorConfig::default().discovery_interval;
    tokio::time::sleep(discovery + Duration::from_secs(1)).await; // asked while ses_A was idle
    settle().await;

    w.busy("ses_A"); // a turn starts, then the model goes silent
    settle().await;
    tokio::time::sleep(Duration::from_secs(20)).await; // the old answer lands
    settle().await;
    assert!(!w.engine.calls().iter().any(|c| c.starts_with("abort")));

    tokio::time::sleep(cfg().stall_timeout).await;
    settle().await;
    assert!(w.engine.calls().contains(&"abort ses_A".to_string()), "the stall is seen");
    assert!(w.drain().contains(&(Action::Continue, Outcome::Done)));
}

#[actix::test]
async fn a_cut_off_turn_whose_first_read_fails_after_the_reconnect_is_still_continued_once() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    w.supervisor.do_send(StreamDown { server: "srv".into() });
    w.engine.busy.lock().unwrap().clear();
    *w.engine.last_turn.lock().unwrap() =
        Some(LastTurn { message_id: "msg_cut".into(), completed: false, errored: false, running_task: false, reply: None, running: Vec::new() });
    w.engine.failing_last_turns.store(2, SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    let reads = |w: &World| w.engine.calls().iter().filter(|c| *c == "last_turn ses_A").count();
    let before = reads(&w); // the first connect's look at the busy session's turn

    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    tokio::time::sleep(cfg().abort_poll_interval * 3).await;
    settle().await;
    assert_eq!(w.drain(), vec![(Action::Recover, Outcome::Done), (Action::Continue, Outcome::Done)]);
    assert_eq!(reads(&w) - before, 3, "{:?}", w.engine.calls());
    tokio::time::sleep(Duration::from_secs(600)).await;
    settle().await;
    assert_eq!(w.drain(), vec![], "continued once, nothing more");
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "prompt ses_A").count(), 1);
}

/// The same with the first read timing out, later than `abort_poll_max`: still tried again.
#[actix::test]
async fn a_cut_off_turn_whose_first_read_times_out_after_the_reconnect_is_still_continued_once() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    w.supervisor.do_send(StreamDown { server: "srv".into() });
    w.engine.busy.lock().unwrap().clear();
    *w.engine.last_turn.lock().unwrap() =
        Some(LastTurn { message_id: "msg_cut".into(), completed: false, errored: false, running_task: false, reply: None, running: Vec::new() });
    w.engine.timed_out_last_turns.store(1, SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    let reads = |w: &World| w.engine.calls().iter().filter(|c| *c == "last_turn ses_A").count();
    let before = reads(&w); // the first connect's look at the busy session's turn

    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    tokio::time::sleep(cfg().abort_poll_max * 2 + cfg().abort_poll_interval * 2).await;
    settle().await;
    assert_eq!(w.drain(), vec![(Action::Recover, Outcome::Done), (Action::Continue, Outcome::Done)]);
    assert_eq!(reads(&w) - before, 2, "{:?}", w.engine.calls());
    tokio::time::sleep(Duration::from_secs(600)).await;
    settle().await;
    assert_eq!(w.drain(), vec![], "continued once, nothing more");
    assert_eq!(w.engine.calls().iter().filter(|c| *c == "prompt ses_A").count(), 1);
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

/// The retry of a lost continue is slow to land; a reconnect meanwhile looks for open
/// intents and finds the retry's (written before its send). That is the same action,
/// under way here: it is not finished a second time (which would read the session before
/// the retry landed and send it again).
#[actix::test]
async fn a_reconnect_while_a_retry_is_on_its_way_does_not_send_it_twice() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.engine.dropped_prompts.store(1, SeqCst);
    w.busy("ses_A");
    settle().await;
    tokio::time::sleep(Duration::from_secs(184)).await; // stalled, aborted, the continue lost
    settle().await;
    *w.engine.slow_prompt.lock().unwrap() = Some(Duration::from_secs(10));
    tokio::time::sleep(cfg().abort_poll_max + Duration::from_secs(1)).await; // the retry is on its way
    settle().await;
    assert!(w.engine.prompts.lock().unwrap().is_empty());

    w.supervisor.do_send(StreamDown { server: "srv".into() });
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    settle().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    let prompts = w.engine.prompts.lock().unwrap().clone();
    let decisions: Vec<&str> = prompts.iter().map(|(_, p)| p.tag.decision.as_str()).collect();
    assert_eq!(decisions.len(), 1, "one retry: {decisions:?}");
    assert!(decisions[0].ends_with("~retry"));
    drop(w.drain());
}

#[actix::test]
async fn a_continue_that_timed_out_and_never_arrived_is_sent_again_once_under_a_retry_id() {
    tokio::time::pause();
    let mut w = world(cfg());
    w.engine.dropped_prompts.store(1, SeqCst);
    w.busy("ses_A");
    settle().await;
    // Stalled at 180 s; aborted and continued within two seconds; read again abort_poll_max later.
    tokio::time::sleep(Duration::from_secs(184)).await;
    settle().await;
    assert_eq!(w.engine.dropped_prompts.load(SeqCst), 0, "the first continue was sent (and lost)");
    assert!(w.engine.prompts.lock().unwrap().is_empty(), "the first continue never arrived");
    tokio::time::sleep(cfg().abort_poll_max + Duration::from_secs(1)).await;
    settle().await;
    let prompts = w.engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1, "sent again once: {prompts:?}");
    assert!(prompts[0].1.tag.decision.ends_with("~retry"), "{:?}", prompts[0].1.tag);
    let records: Vec<ActionRecord> = std::iter::from_fn(|| w.records.try_recv().ok()).collect();
    let last = records.last().expect("records");
    assert_eq!((last.action, last.outcome), (Action::Continue, Outcome::Done), "{records:?}");
    assert!(last.reason.contains("had not reached the session"), "{}", last.reason);
    tokio::time::sleep(Duration::from_secs(200)).await;
    settle().await;
    assert_eq!(w.engine.prompts.lock().unwrap().len(), 1, "nothing more");
}

/// The session's detail as the status readers get it — `GetSession` and `ListSessions`,
/// from what its actor published, without asking it — equals the actor's own answer.
async fn assert_published_detail_is_the_actors(w: &World, id: &str, step: &str) -> SessionDetail {
    settle().await;
    assert!(w.registry.is_published(id), "{step}: published");
    let asked = w.registry.actor(id).expect("tracked").send(Inspect).await.unwrap();
    let got = w.supervisor.send(GetSession(id.into())).await.unwrap().expect("known");
    assert_eq!(got, asked, "{step}: GetSession");
    let listed = w.supervisor.send(ListSessions).await.unwrap();
    assert_eq!(listed.iter().find(|d| d.id == id), Some(&asked), "{step}: ListSessions");
    let fleet = w.supervisor.send(InspectFleet).await.unwrap();
    assert_eq!(fleet.sessions.iter().find(|d| d.id == id), Some(&asked), "{step}: InspectFleet");
    // `GET /v1/sessions`, read on the control API's thread from the same cell.
    let details = w.supervisor.send(InspectLiveSources).await.unwrap().details().await;
    assert_eq!(details.iter().find(|d| d.id == id), Some(&asked), "{step}: LiveSources::details");
    // The status file's view, read from the same cell without copying the detail whole.
    let live = w.supervisor.send(InspectLiveSources).await.unwrap().read().await;
    assert_eq!(live.sessions.iter().find(|l| &*l.id == id), Some(&LiveSession::from(&asked)), "{step}: LiveSources");
    asked
}

/// Every kind of change a session's detail shows reaches the detail the status readers
/// get (published by the actor, not asked of it), and the same moment: busy and idle,
/// todos, title, context tokens and window, a question, a recovery and its attempt and
/// record, a pause and its release, a new stall timeout, a hand-off's origin and phase.
#[actix::test]
async fn the_detail_status_readers_get_without_asking_the_actor_follows_every_change() {
    tokio::time::pause();
    let w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() }); // reads the models' windows
    let id = "ses_V";
    let event = |kind: &str, props: &str| {
        w.send(&format!(r#"{{"directory":"/p","payload":{{"type":"{kind}","properties":{props}}}}}"#));
    };
    let mut seen: Vec<(&str, SessionDetail)> = Vec::new();
    macro_rules! step {
        ($name:expr) => {
            seen.push(($name, assert_published_detail_is_the_actors(&w, id, $name).await))
        };
    }

    *w.engine.title.lock().unwrap() = Some("From REST".into()); // comes after the first event
    w.busy(id);
    step!("busy");
    event("todo.updated", &format!(r#"{{"sessionID":"{id}","todos":[{{"content":"write parser","status":"in_progress"}}]}}"#));
    step!("todos");
    event("todo.updated", &format!(r#"{{"sessionID":"{id}","todos":[{{"content":"write parser","status":"completed"}}]}}"#));
    step!("a todo done");
    event("session.updated", &format!(r#"{{"info":{{"id":"{id}","directory":"/p","title":"Parser work","time":{{"created":1}}}}}}"#));
    step!("title");
    event("session.updated", &format!(r#"{{"info":{{"id":"{id}","directory":"/q","title":"Parser work","time":{{"created":1}}}}}}"#));
    step!("directory");
    event("session.updated", &format!(r#"{{"info":{{"id":"{id}","directory":"/q","title":"Parser work","time":{{"created":1}},"metadata":{{"shepherd":{{"handoff_from":"ses_old"}}}}}}}}"#));
    step!("hand-off origin");
    event("message.updated", &format!(r#"{{"sessionID":"{id}","info":{{"id":"msg_1","sessionID":"{id}","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","time":{{"created":1,"completed":2}},"tokens":{{"input":50000,"output":10,"cache":{{"read":0,"write":0}}}}}}}}"#));
    step!("tokens");
    event("message.updated", &format!(r#"{{"sessionID":"{id}","info":{{"id":"msg_2","sessionID":"{id}","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","time":{{"created":2,"completed":3}},"tokens":{{"input":70000,"output":10,"cache":{{"read":0,"write":0}}}}}}}}"#));
    step!("more tokens");
    event("question.asked", &format!(r#"{{"id":"que_1","sessionID":"{id}"}}"#));
    step!("a question");
    event("question.replied", &format!(r#"{{"requestID":"que_1","sessionID":"{id}"}}"#));
    step!("the answer");
    let short = RecoveryConfig { stall_timeout: Duration::from_secs(60), ..cfg() };
    w.supervisor.send(ReconfigureAll { rules: Arc::new(short.into()), fleet: SupervisorConfig::default() }).await.unwrap();
    step!("a shorter stall timeout");
    tokio::time::sleep(Duration::from_secs(30)).await;
    step!("silence");
    event("message.part.delta", &format!(r#"{{"sessionID":"{id}","messageID":"msg_3","partID":"prt_1","field":"text","delta":"x"}}"#));
    step!("activity");
    *w.engine.slow_prompt.lock().unwrap() = Some(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(61)).await; // past the stall timeout: a recovery
    step!("a recovery under way");
    tokio::time::sleep(Duration::from_secs(11)).await;
    step!("a recovery");
    event("message.updated", &format!(r#"{{"sessionID":"{id}","info":{{"id":"msg_4","sessionID":"{id}","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","time":{{"created":4}}}}}}"#));
    step!("a compaction");
    event("session.compacted", &format!(r#"{{"sessionID":"{id}"}}"#));
    step!("compacted");
    let pause = |pause: bool| SetPause { target: PauseTarget::Session(id.into()), pause, until_ms: None, by: "test".into() };
    w.engine.busy.lock().unwrap().insert(id.into(), Status::Busy); // aborted: busy again
    w.supervisor.do_send(StreamDown { server: "srv".into() });
    step!("the stream down");
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    step!("the stream back");
    w.supervisor.send(pause(true)).await.unwrap().expect("paused");
    step!("a pause");
    // While paused the stall clock is off: these change one field each.
    w.engine.busy.lock().unwrap().remove(id);
    event("session.status", &format!(r#"{{"sessionID":"{id}","status":{{"type":"idle"}}}}"#));
    step!("idle while paused");
    event("message.updated", &format!(r#"{{"sessionID":"{id}","info":{{"id":"msg_5","sessionID":"{id}","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","time":{{"created":5}}}}}}"#));
    step!("a compaction while paused");
    event("message.updated", &format!(r#"{{"sessionID":"{id}","info":{{"id":"msg_5","sessionID":"{id}","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","time":{{"created":5,"completed":6}}}}}}"#));
    step!("its end while paused");
    w.engine.busy.lock().unwrap().insert(id.into(), Status::Busy);
    event("session.status", &format!(r#"{{"sessionID":"{id}","status":{{"type":"busy"}}}}"#));
    step!("busy while paused");
    w.supervisor.send(pause(false)).await.unwrap().expect("resumed");
    step!("its release");
    let _ = w.supervisor.send(StartHandoff(id.into())).await.unwrap();
    step!("a hand-off");
    tokio::time::sleep(Duration::from_secs(5)).await;
    step!("the hand-off's next steps");
    w.engine.busy.lock().unwrap().remove(id);
    event("session.status", &format!(r#"{{"sessionID":"{id}","status":{{"type":"idle"}}}}"#));
    step!("idle");
    tokio::time::sleep(Duration::from_secs(600)).await;
    step!("long after");

    // Each change was one the detail shows (else its step would prove nothing).
    let unchanged = ["silence", "the hand-off's next steps", "long after"];
    for pair in seen.windows(2).filter(|pair| !unchanged.contains(&pair[1].0)) {
        assert_ne!(pair[0].1, pair[1].1, "{} changed nothing the detail shows", pair[1].0);
    }
    let last = |name: &str| &seen.iter().find(|(n, _)| *n == name).expect(name).1;
    assert!(last("busy").busy && !last("idle").busy);
    assert_eq!(last("busy").title.as_deref(), Some("From REST"));
    assert_eq!(last("title").title.as_deref(), Some("Parser work"));
    assert_eq!(last("directory").directory.as_deref(), Some("/q"));
    assert_eq!(last("hand-off origin").handoff.from.as_deref(), Some("ses_old"));
    assert_eq!(last("the stream down").stall_timeout_ms, None);
    assert!(!last("idle while paused").busy && last("busy while paused").busy);
    assert!(last("a compaction while paused").compacting && !last("its end while paused").compacting);
    assert_eq!(last("more tokens").context_tokens, Some(70_000));
    assert_eq!(last("more tokens").context_window, Some(200_000));
    assert!(last("a question").waiting_on_person && !last("the answer").waiting_on_person);
    assert_eq!(last("a shorter stall timeout").stall_timeout_ms, Some(60_000));
    assert!(last("activity").last_activity_ms > last("silence").last_activity_ms);
    assert!(last("a recovery under way").recovering && !last("a recovery").recovering);
    assert!(last("a compaction").compacting && !last("compacted").compacting);
    assert_eq!(last("a recovery").attempts, 1);
    assert!(last("a recovery").last_action.is_some());
    assert_eq!(last("a pause").paused.as_deref(), Some("person"));
    assert_eq!(last("its release").paused, None);
}

/// A session whose actor is still loading its state from the ledger has published
/// nothing: the status readers ask its actor, which answers once loaded, as before.
#[actix::test]
async fn a_session_still_loading_its_state_is_listed_once_its_actor_answers() {
    tokio::time::pause();
    let ledger = Arc::new(FlakyLedger::new(0));
    let w = world_with_ledger(cfg(), ledger.clone());
    let loading = ledger.load_gate.write().await;
    w.busy("ses_L");
    settle().await;
    assert!(w.registry.actor("ses_L").is_some(), "tracked");
    assert!(!w.registry.is_published("ses_L"), "nothing published while loading");
    let listed = tokio::spawn(w.supervisor.send(ListSessions));
    let got = tokio::spawn(w.supervisor.send(GetSession("ses_L".into())));
    settle().await;
    assert!(!listed.is_finished(), "waits for the actor, as before");
    drop(loading);
    let listed = listed.await.unwrap().unwrap();
    let got = got.await.unwrap().unwrap().expect("known");
    assert!(listed.iter().any(|d| d.id == "ses_L" && d.busy), "{listed:?}");
    assert!(got.busy);
    assert!(w.registry.is_published("ses_L"));
    assert_published_detail_is_the_actors(&w, "ses_L", "loaded").await;
}

/// An idle session, and a server that takes 10 s to take the next prompt in (paused time).
async fn session_with_a_slow_prompt() -> World {
    tokio::time::pause();
    let w = world(cfg());
    w.supervisor.do_send(StreamUp { server: "srv".into() });
    w.busy("ses_A");
    w.engine.busy.lock().unwrap().remove("ses_A");
    w.send(r#"{"directory":"/p","payload":{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}}"#);
    settle().await;
    *w.engine.slow_prompt.lock().unwrap() = Some(Duration::from_secs(10));
    w
}

/// A person's prompt for `ses_A`.
fn custom_prompt(text: &str) -> SendCustomPrompt {
    SendCustomPrompt {
        session: "ses_A".into(),
        request: CustomPromptRequest { message: Some(text.into()), ..CustomPromptRequest::default() },
    }
}

/// A person's prompt on its way when Shepherd shuts down is waited for, like a continue
/// (it is not cut off half-sent, its intent left open); one asked for while shutdown
/// waits is refused, and the person is told why.
#[actix::test]
async fn shutdown_waits_for_a_custom_prompt_on_its_way_and_refuses_one_after_it_began() {
    let w = session_with_a_slow_prompt().await;
    let first = actix::spawn(w.supervisor.send(custom_prompt("first")));
    settle().await;
    assert!(w.engine.prompts.lock().unwrap().is_empty(), "on its way, not arrived");

    let shutdown = actix::spawn(w.supervisor.send(Shutdown { grace: Duration::from_secs(30) }));
    settle().await;
    let second = w.supervisor.send(custom_prompt("second")).await.expect("answered");
    assert!(matches!(second, Err(ControlError::ShuttingDown)), "{second:?}");

    let left = shutdown.await.expect("joined").expect("answered");
    assert_eq!(left, 0, "nothing cut off");
    let sent: Vec<String> = w.engine.prompts.lock().unwrap().iter().map(|(_, p)| p.text.clone()).collect();
    assert_eq!(sent.len(), 1, "the first arrived before shutdown answered, the second never: {sent:?}");
    assert!(sent[0].contains("first"));
    let first = first.await.expect("joined").expect("answered").expect("a reply");
    assert!(first.success);
}

/// A prompt still on its way when shutdown's grace runs out is cut off with its actor:
/// it never arrives after shutdown answered (its intent is left for the next start, as
/// after a crash). The procedure runs as a task of its own; it must go with the actor.
#[actix::test]
async fn a_prompt_still_on_its_way_when_the_grace_runs_out_never_arrives_after_shutdown() {
    let w = session_with_a_slow_prompt().await;
    let sent = actix::spawn(w.supervisor.send(custom_prompt("slow")));
    settle().await;

    let left = w.supervisor.send(Shutdown { grace: Duration::from_secs(1) }).await.expect("answered");
    assert_eq!(left, 1, "the prompt was still on its way");
    let reply = sent.await.expect("joined").expect("answered");
    assert!(matches!(reply, Err(ControlError::ShuttingDown)), "{reply:?}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    assert!(w.engine.prompts.lock().unwrap().is_empty(), "cut off, never sent after shutdown answered");
}

/// A periodic reading of a server that outlasts the discovery interval is not joined by
/// another: the next discoveries skip the server until it is applied (at 100,000
/// sessions each reading parses a ~40-MB listing; they would pile up), then resume.
#[actix::test]
async fn a_discovery_is_skipped_while_the_last_reading_of_its_server_is_under_way() {
    // An idle session: only the discoveries read its directory's statuses.
    let w = with_an_idle_session("ses_A").await;
    let discovery = SupervisorConfig::default().discovery_interval;
    let reads = |w: &World| w.engine.calls().iter().filter(|c| *c == "status /p").count();
    w.engine.slow_statuses.lock().unwrap().push_back(SlowRead::AnsweredAfter(discovery * 3 + discovery / 2));
    let before = reads(&w);
    tokio::time::sleep(discovery + Duration::from_secs(1)).await; // the slow reading starts
    settle().await;
    assert_eq!(reads(&w), before + 1);
    tokio::time::sleep(discovery * 2).await; // two more discoveries fall due meanwhile
    settle().await;
    assert_eq!(reads(&w), before + 1, "no reading joined the one under way");
    tokio::time::sleep(discovery * 2).await; // it lands; the next discovery reads again
    settle().await;
    assert_eq!(reads(&w), before + 2, "{:?}", w.engine.calls());
}

/// A failed periodic reading is retried soon, but not on top of a reading the next
/// discovery started meanwhile: that one answers for it (and is retried if it fails).
#[actix::test]
async fn a_failed_readings_retry_is_skipped_while_a_later_reading_is_under_way() {
    let w = with_an_idle_session("ses_A").await;
    let discovery = SupervisorConfig::default().discovery_interval;
    let reads = |w: &World| w.engine.calls().iter().filter(|c| *c == "status /p").count();
    {
        let mut slow = w.engine.slow_statuses.lock().unwrap();
        // Fails just before the next discovery; its retry falls due 250 ms later, while
        // that discovery's reading is still under way.
        slow.push_back(SlowRead::Fails(discovery - Duration::from_millis(100)));
        slow.push_back(SlowRead::AnsweredAfter(discovery * 3));
    }
    let before = reads(&w);
    tokio::time::sleep(discovery + Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(reads(&w), before + 1, "the reading that fails");
    tokio::time::sleep(discovery).await; // it failed, the next began, the retry fell due
    settle().await;
    assert_eq!(reads(&w), before + 2, "the retry did not join the reading under way: {:?}", w.engine.calls());
    tokio::time::sleep(discovery * 4).await; // that one lands; the next discovery reads again
    settle().await;
    assert_eq!(reads(&w), before + 3, "{:?}", w.engine.calls());
}
