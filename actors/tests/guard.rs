//! The guard in the prompt path, with a fake engine and paused time: what is sent, what
//! is dropped, what waits — and that a guard which cannot read the session's history
//! still lets the prompt through (fail open). A burst of sessions stopping at once with
//! open todos: every one is nudged, within the fleet-wide limit, later but never lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use shepherd_actors::config::{Config, GuardConfig, SupervisorConfig};
use shepherd_actors::event::{decode, ModelRef, Role, SessionInfo, ShepherdTag, Status, Todo, TodoStatus};
use shepherd_actors::guard::{GuardHandle, PromptGuard};
use shepherd_actors::journal::{Action, Journal, Outcome};
use shepherd_actors::ledger::MemoryLedger;
use shepherd_actors::ports::{
    Clock, Control, Discovery, EngineError, HistoryMessage, HistoryPart, LastTurn, Lifecycle, Prompt, Reads,
    SystemClock, TurnSettings,
};
use shepherd_actors::session::procedures::deliver::{deliver, Delivery, Outbound, PromptKind, PromptOrder};
use shepherd_actors::session::prompt::PromptFacts;
use shepherd_actors::supervisor::{AttachServer, Ingest, Shutdown, Supervisor};

/// One session's engine. Its history cannot be read (the trait's default answers an
/// error) unless `history` is set; then every prompt sent is stored there too, tagged.
#[derive(Default)]
struct Engine1 {
    prompts: Mutex<Vec<String>>,
    history: Mutex<Option<Vec<HistoryMessage>>>,
    /// The next prompt fails with this error, after OpenCode stored it when `true`.
    fail_next: Mutex<Option<(EngineError, bool)>>,
}

impl Engine1 {
    fn with_history(messages: Vec<HistoryMessage>) -> Engine1 {
        Engine1 { history: Mutex::new(Some(messages)), ..Engine1::default() }
    }
}

/// A user message of the session, `secs_ago` before now (wall time: the guard's clock).
fn user_message(text: &str, tag: Option<ShepherdTag>, secs_ago: i64) -> HistoryMessage {
    HistoryMessage {
        id: format!("msg_{}", text.len()),
        role: Role::User,
        created_ms: Some(SystemClock.wall_ms() - secs_ago * 1000),
        agent: None,
        error: None,
        summary: false,
        parts: vec![HistoryPart::Text { text: text.into(), synthetic: tag.is_some(), ignored: false, shepherd: tag }],
    }
}

fn tag(kind: &str, instance: &str, decision: &str) -> ShepherdTag {
    ShepherdTag { kind: kind.into(), instance: instance.into(), decision: decision.into(), lease: None }
}

#[async_trait]
impl Reads for Engine1 {
    async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
        Ok(HashMap::new())
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Err(EngineError::NotFound(id.into()))
    }
    async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
        Ok(vec![Todo { content: "write it".into(), status: TodoStatus::Pending, priority: None }])
    }
    async fn last_turn_settings(&self, _: &str) -> Result<TurnSettings, EngineError> {
        Ok(TurnSettings::default())
    }
    async fn last_turn(&self, _: &str) -> Result<Option<LastTurn>, EngineError> {
        Ok(None)
    }
    async fn history(&self, _: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        match self.history.lock().unwrap().as_ref() {
            Some(h) => Ok(h.iter().rev().take(limit as usize).rev().cloned().collect()),
            None => Err(EngineError::Http { status: 500, body: "history unreadable".into() }),
        }
    }
}

#[async_trait]
impl Control for Engine1 {
    async fn abort(&self, _: &str) -> Result<(), EngineError> {
        Ok(())
    }
    async fn summarize(&self, _: &str, _: &ModelRef) -> Result<(), EngineError> {
        Ok(())
    }
    async fn prompt(&self, _: &str, p: &Prompt) -> Result<(), EngineError> {
        let fail = self.fail_next.lock().unwrap().take();
        if let Some((error, false)) = fail {
            return Err(error);
        }
        self.prompts.lock().unwrap().push(p.text.clone());
        if let Some(h) = self.history.lock().unwrap().as_mut() {
            h.push(user_message(&p.text, Some(p.tag.clone()), 0));
        }
        match fail {
            Some((error, true)) => Err(error),
            _ => Ok(()),
        }
    }
}

fn order(kind: PromptKind, text: &str) -> PromptOrder {
    PromptOrder {
        session_id: "ses_A".into(),
        directory: Some("/p".into()),
        kind,
        template: text.into(),
        template_without_open_todos: None,
        facts: PromptFacts::default(),
        known_todos: vec![],
        known_turn: None,
        require_idle: false,
        require_open_todos: false,
        decision: format!("d-{text}"),
        not_before_ms: None,
        tool_text_scan: None,
        model: None,
    }
}

fn guard(cfg: GuardConfig) -> GuardHandle {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    GuardHandle::start(cfg, clock, None)
}

#[actix::test]
async fn a_guard_that_cannot_read_the_sessions_history_still_sends_and_still_dedupes_its_own() {
    let engine = Engine1::default();
    let guard = guard(GuardConfig::default());
    let out =
        Outbound { server: "local", reads: &engine, control: &engine, guard: &guard, instance: "i1", lease: None };
    let nudge = order(PromptKind::Nudge, "Please continue working");
    let first = deliver(out, &nudge).await;
    assert!(matches!(first, Delivery::Sent { .. }), "fail open: {first:?}");
    let retry = deliver(out, &nudge).await;
    assert!(matches!(&retry, Delivery::Guarded { reason, .. } if reason.contains("Shepherd's nudge")), "{retry:?}");
    let person = deliver(out, &order(PromptKind::Custom, "Continue working on tasks")).await;
    assert!(matches!(&person, Delivery::Guarded { reason, .. } if reason.contains("Shepherd's nudge")), "{person:?}");
    assert_eq!(engine.prompts.lock().unwrap().len(), 1);
}

#[actix::test]
async fn a_second_review_round_within_the_window_is_sent_and_the_same_decision_twice_is_not() {
    let engine = Engine1::with_history(vec![]);
    let guard = guard(GuardConfig::default());
    let out =
        Outbound { server: "local", reads: &engine, control: &engine, guard: &guard, instance: "i1", lease: None };
    let review = "All todos are done: run the tests and check your claims.";
    let round = |n: u32| PromptOrder { decision: format!("ses_A-review-{n}"), ..order(PromptKind::Review, review) };
    assert!(matches!(deliver(out, &round(1)).await, Delivery::Sent { .. }));
    // New todos came and were done within guard.window: Shepherd's new decision, alike
    // in every word, in its memory and in the session's messages.
    let second = deliver(out, &round(2)).await;
    assert!(matches!(second, Delivery::Sent { .. }), "a rightful second review: {second:?}");
    let again = deliver(out, &round(2)).await;
    assert!(matches!(&again, Delivery::Guarded { reason, .. } if reason.contains("similar")), "{again:?}");
    assert_eq!(engine.prompts.lock().unwrap().len(), 2);
}

#[actix::test]
async fn what_another_instance_or_the_person_sent_for_the_same_situation_is_still_a_duplicate() {
    let review = "All todos are done: run the tests and check your claims.";
    for (who, text, their_tag) in [
        ("another instance", review, Some(tag("review", "i2", "ses_A-review-7"))),
        ("the person", "all todos are done, run the tests and check the claims", None),
    ] {
        // Made just before it is read: its age is read on the wall clock.
        let engine = Engine1::with_history(vec![user_message(text, their_tag, 5)]);
        let guard = guard(GuardConfig::default());
        let out =
            Outbound { server: "local", reads: &engine, control: &engine, guard: &guard, instance: "i1", lease: None };
        let ours = deliver(out, &order(PromptKind::Review, review)).await;
        assert!(
            matches!(&ours, Delivery::Guarded { reason, .. } if reason.contains("a user message 5s ago")),
            "{who}: {ours:?}"
        );
        assert!(engine.prompts.lock().unwrap().is_empty(), "{who}");
    }
}

#[actix::test]
async fn a_prompt_whose_send_timed_out_is_looked_for_in_the_session_and_never_sent_twice() {
    let lost_answer = || EngineError::Unconfirmed("POST /session/{id}/prompt_async: timed out".into());
    // It arrived: the session's messages carry its tag, so it was delivered.
    let engine = Engine1::with_history(vec![]);
    *engine.fail_next.lock().unwrap() = Some((lost_answer(), true));
    let g = guard(GuardConfig::default());
    let out = Outbound { server: "local", reads: &engine, control: &engine, guard: &g, instance: "i1", lease: None };
    let nudge = order(PromptKind::Nudge, "Please continue working");
    assert!(matches!(deliver(out, &nudge).await, Delivery::Sent { .. }), "found in the session");
    assert!(matches!(deliver(out, &nudge).await, Delivery::Guarded { .. }), "and not sent again");
    assert_eq!(engine.prompts.lock().unwrap().len(), 1);

    // Not (yet) there: it failed, but may still arrive — the guard keeps it, so the
    // same decision retried within the window is not sent a second time.
    let engine = Engine1::with_history(vec![]);
    *engine.fail_next.lock().unwrap() = Some((lost_answer(), false));
    let g = guard(GuardConfig::default());
    let out = Outbound { server: "local", reads: &engine, control: &engine, guard: &g, instance: "i1", lease: None };
    let failed = deliver(out, &nudge).await;
    assert!(matches!(&failed, Delivery::Failed { error: EngineError::Unconfirmed(_) }), "{failed:?}");
    let retry = deliver(out, &nudge).await;
    assert!(matches!(&retry, Delivery::Guarded { reason, .. } if reason.contains("similar")), "{retry:?}");
    assert!(engine.prompts.lock().unwrap().is_empty());

    // Surely not sent (nothing listened): forgotten, so the retry goes out.
    let engine = Engine1::with_history(vec![]);
    *engine.fail_next.lock().unwrap() = Some((EngineError::Unreachable("connection refused".into()), false));
    let g = guard(GuardConfig::default());
    let out = Outbound { server: "local", reads: &engine, control: &engine, guard: &g, instance: "i1", lease: None };
    assert!(matches!(deliver(out, &nudge).await, Delivery::Failed { error: EngineError::Unreachable(_) }));
    assert!(matches!(deliver(out, &nudge).await, Delivery::Sent { .. }));
    assert_eq!(engine.prompts.lock().unwrap().len(), 1);
}

#[actix::test]
async fn over_the_session_limit_a_nudge_waits_its_turn_then_is_deferred_and_a_continue_goes_out() {
    tokio::time::pause();
    let engine = Engine1::default();
    let cfg = GuardConfig {
        session_per_minute: 1,
        session_burst: 1,
        max_wait: Duration::from_secs(20),
        ..GuardConfig::default()
    };
    let guard = guard(cfg);
    let out =
        Outbound { server: "local", reads: &engine, control: &engine, guard: &guard, instance: "i1", lease: None };
    assert!(matches!(deliver(out, &order(PromptKind::Review, "Review your work")).await, Delivery::Sent { .. }));
    let started = tokio::time::Instant::now();
    let nudge = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    match &nudge {
        Delivery::Guarded { reason, retry_after_ms: Some(retry), .. } => {
            assert!(reason.contains("session rate limit") && reason.contains("deferred"), "{reason}");
            // One prompt a minute: the next permit is 60 s after the review, 20 s of
            // which the nudge waited.
            assert!((39_000..=40_000).contains(retry), "the retry comes when the limiter has room: {retry}");
        }
        other => panic!("deferred, with a retry time: {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_secs(20), "it waited guard.max_wait first");
    let cont = deliver(out, &order(PromptKind::Continue, "You stalled; go on with the parser")).await;
    match cont {
        Delivery::Sent { waited_ms, .. } => {
            assert!(waited_ms >= 19_000, "it waited guard.max_wait, then went: {waited_ms}")
        }
        other => panic!("a continue is never lost: {other:?}"),
    }
    assert_eq!(engine.prompts.lock().unwrap().len(), 2);
}

#[actix::test]
async fn a_retuned_guard_judges_by_its_new_limits_and_still_remembers_what_was_sent() {
    tokio::time::pause();
    let engine = Engine1::default();
    let tight = GuardConfig {
        session_per_minute: 1,
        session_burst: 1,
        max_wait: Duration::from_secs(20),
        ..GuardConfig::default()
    };
    let guard = guard(tight.clone());
    let out =
        Outbound { server: "local", reads: &engine, control: &engine, guard: &guard, instance: "i1", lease: None };
    assert!(matches!(deliver(out, &order(PromptKind::Review, "Review your work")).await, Delivery::Sent { .. }));
    let deferred = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    assert!(matches!(&deferred, Delivery::Guarded { reason, .. } if reason.contains("rate limit")), "{deferred:?}");

    guard.retune(GuardConfig { session_burst: 5, ..tight });
    let sent = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    assert!(matches!(sent, Delivery::Sent { waited_ms: 0, .. }), "the new burst lets it through: {sent:?}");
    let again = deliver(out, &order(PromptKind::Custom, "Review your work")).await;
    assert!(matches!(&again, Delivery::Guarded { reason, .. } if reason.contains("similar")), "{again:?}");
}

/// An OpenCode with many idle sessions, each with one open todo, that records every
/// prompt with the (paused) time it arrived.
#[derive(Default)]
struct Fleet {
    prompts: Mutex<Vec<(String, String, tokio::time::Instant)>>,
}

#[async_trait]
impl Reads for Fleet {
    async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
        Ok(HashMap::new())
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
    async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
        Ok(vec![Todo { content: "finish the report".into(), status: TodoStatus::Pending, priority: None }])
    }
    async fn last_turn_settings(&self, _: &str) -> Result<TurnSettings, EngineError> {
        Ok(TurnSettings::default())
    }
    async fn last_turn(&self, _: &str) -> Result<Option<LastTurn>, EngineError> {
        Ok(None)
    }
    async fn history(&self, _: &str, _: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        Ok(vec![])
    }
}

#[async_trait]
impl Control for Fleet {
    async fn abort(&self, _: &str) -> Result<(), EngineError> {
        Ok(())
    }
    async fn summarize(&self, _: &str, _: &ModelRef) -> Result<(), EngineError> {
        Ok(())
    }
    async fn prompt(&self, id: &str, p: &Prompt) -> Result<(), EngineError> {
        self.prompts.lock().unwrap().push((id.into(), p.tag.kind.clone(), tokio::time::Instant::now()));
        Ok(())
    }
}

impl Lifecycle for Fleet {}

#[async_trait]
impl Discovery for Fleet {
    async fn list_sessions(&self, _: u32) -> Result<Vec<SessionInfo>, EngineError> {
        Ok(vec![])
    }
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        Ok(HashMap::new())
    }
    async fn pending_asks(&self, _: &str) -> Result<Vec<shepherd_actors::event::Event>, EngineError> {
        Ok(vec![])
    }
}

struct PausedClock(tokio::time::Instant);

impl Clock for PausedClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        1_000_000_000 + self.0.elapsed().as_millis() as i64
    }
}

fn ingest(supervisor: &Addr<Supervisor>, json: String) {
    let envelope = decode(&json).expect("decodes");
    supervisor.do_send(Ingest { server: "srv".into(), envelope, read: None, seq: 0 });
}

/// One turn of `id` that ends normally with its todo still open.
fn stop_with_open_todos(supervisor: &Addr<Supervisor>, id: &str) {
    let status = |s: &str| {
        format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"{s}"}}}}}}}}"#
        )
    };
    ingest(supervisor, status("busy"));
    ingest(
        supervisor,
        format!(
            r#"{{"directory":"/p","payload":{{"type":"todo.updated","properties":{{"sessionID":"{id}","todos":[{{"content":"finish the report","status":"pending"}}]}}}}}}"#
        ),
    );
    ingest(
        supervisor,
        format!(
            r#"{{"directory":"/p","payload":{{"type":"message.updated","properties":{{"sessionID":"{id}","info":{{"id":"msg_{id}","sessionID":"{id}","role":"assistant","finish":"stop","time":{{"created":1,"completed":2}}}}}}}}}}"#
        ),
    );
    ingest(supervisor, status("idle"));
}

#[actix::test]
async fn a_burst_of_sessions_stopping_with_open_todos_is_nudged_every_one_within_the_global_limit() {
    tokio::time::pause();
    const SESSIONS: usize = 300;
    let cfg = Config::default();
    let g = cfg.guard.clone();
    // More than the global limit lets through within one `max_wait`: some nudges wait
    // their turn, the rest are deferred and come back.
    let fits_in_max_wait = g.global_burst as f64 + g.global_per_minute as f64 * g.max_wait.as_secs_f64() / 60.0;
    assert!(SESSIONS as f64 > fits_in_max_wait);

    let clock: Arc<dyn Clock> = Arc::new(PausedClock(tokio::time::Instant::now()));
    let engine = Arc::new(Fleet::default());
    let journal = Journal::new();
    let mut records = journal.subscribe();
    let guard: Arc<dyn PromptGuard> = Arc::new(GuardHandle::start(g.clone(), Arc::clone(&clock), None));
    let supervisor = Supervisor::new(
        Arc::new(cfg.session_rules()),
        SupervisorConfig::default(),
        Arc::new(MemoryLedger::default()),
        clock,
        journal,
        "i1".into(),
    )
    .with_guard(guard)
    .start();
    supervisor.do_send(AttachServer {
        name: "srv".into(),
        engine: engine.clone(),
        list_limit: 10,
        retry_initial: Duration::from_millis(250),
        retry_max: Duration::from_secs(30),
        stream: Arc::default(),
        registry: Default::default(),
        threads: Vec::new(),
        thread_engines: Vec::new(),
    });
    let ids: Vec<String> = (0..SESSIONS).map(|i| format!("ses_{i:03}")).collect();
    let stopped = tokio::time::Instant::now();
    for id in &ids {
        stop_with_open_todos(&supervisor, id);
    }

    let (mut deferred, mut sent_records) = (0, 0);
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        while let Ok(r) = records.try_recv() {
            match (r.action, r.outcome) {
                (Action::Nudge, Outcome::Done) => sent_records += 1,
                (Action::Nudge, Outcome::Declined) if r.reason.contains("deferred") => {
                    assert!(r.numbers.backoff_ms.is_some(), "the retry delay is in the record: {r:?}");
                    deferred += 1;
                }
                (Action::Nudge, _) => panic!("a nudge was declined for another reason: {r:?}"),
                _ => {}
            }
        }
        if sent_records == SESSIONS {
            break;
        }
    }
    let prompts = engine.prompts.lock().unwrap().clone();
    let mut per_session: HashMap<&str, usize> = HashMap::new();
    for (id, kind, _) in &prompts {
        assert_eq!(kind, "nudge");
        *per_session.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(per_session.len(), SESSIONS, "every session was nudged");
    assert!(per_session.values().all(|n| *n == 1), "and each exactly once");
    assert_eq!(sent_records, SESSIONS);
    assert!(deferred > 0, "some nudges waited longer than guard.max_wait and were deferred, not dropped");
    // Never faster than the fleet-wide limit allows (its burst, then its pace).
    for (n, (_, _, at)) in prompts.iter().enumerate() {
        let allowed =
            g.global_burst as f64 + g.global_per_minute as f64 * at.duration_since(stopped).as_secs_f64() / 60.0;
        assert!(
            (n + 1) as f64 <= allowed + 1.0,
            "prompt {} at {:?} exceeds the limit",
            n + 1,
            at.duration_since(stopped)
        );
    }
    let last = prompts.last().map(|p| p.2.duration_since(stopped)).unwrap_or_default();
    assert!(last > g.max_wait, "the last nudge went out later ({last:?}), not never");
    supervisor.do_send(Shutdown { grace: Duration::ZERO });
}
