//! The advisor actor with paused time and a scripted model: obvious cases and cached
//! states never reach the model, calls are bounded in number and in time, and every
//! failure of the model ends in heuristic advice that says why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use shepherd_actors::advisor::actor::{AdvisorActor, Consult, Retune};
use shepherd_actors::advisor::{About, AdviceAction, Consulted, Situation, Source};
use shepherd_actors::config::AdvisorConfig;
use shepherd_actors::event::{SessionInfo, Status, Todo, TodoStatus};
use shepherd_actors::ports::{ChatRequest, EngineError, LastTurn, ModelError, ModelPort, Reads, TurnSettings};

/// What the scripted model does with each call.
#[derive(Clone)]
enum Answer {
    Text(&'static str),
    Hang,
    Status(u16),
}

struct ScriptedModel {
    answer: Mutex<Answer>,
    calls: AtomicUsize,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    /// How long each answer takes.
    delay: Duration,
}

impl ScriptedModel {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(Self {
            answer: Mutex::new(answer),
            calls: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            most_at_once: AtomicUsize::new(0),
            delay: Duration::from_millis(500),
        })
    }
}

#[async_trait]
impl ModelPort for ScriptedModel {
    async fn complete(&self, _: &ChatRequest) -> Result<String, ModelError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        let answer = self.answer.lock().unwrap().clone();
        tokio::time::sleep(self.delay).await;
        let result = match answer {
            Answer::Text(t) => Ok(t.to_string()),
            Answer::Hang => futures_pending().await,
            Answer::Status(status) => Err(ModelError::Http { status }),
        };
        self.running.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

async fn futures_pending() -> Result<String, ModelError> {
    std::future::pending().await
}

/// An OpenCode server that knows nothing (the history read fails: the model is asked
/// without messages).
struct NoEngine;

#[async_trait]
impl Reads for NoEngine {
    async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
        Err(EngineError::Unreachable("test".into()))
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Err(EngineError::NotFound(id.into()))
    }
    async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
        Err(EngineError::Unreachable("test".into()))
    }
    async fn last_turn_settings(&self, _: &str) -> Result<TurnSettings, EngineError> {
        Err(EngineError::Unreachable("test".into()))
    }
    async fn last_turn(&self, _: &str) -> Result<Option<LastTurn>, EngineError> {
        Err(EngineError::Unreachable("test".into()))
    }
}

fn stall(session_age_s: u64) -> Situation {
    Situation {
        about: About::Abort,
        session_age: Some(Duration::from_secs(session_age_s)),
        since_activity: Duration::from_secs(200),
        todos: vec![Todo { content: "x".into(), status: TodoStatus::Completed, priority: None }],
        context_tokens: None,
        context_window: None,
        attempts: 0,
        part: Some("text".into()),
        recent_stall_parts: vec![],
        agent: None,
    }
}

fn cfg() -> AdvisorConfig {
    AdvisorConfig { enabled: true, model: "m".into(), ..AdvisorConfig::default() }
}

fn consult(session: &str, situation: Situation) -> Consult {
    Consult {
        server: "srv".into(),
        session: session.into(),
        situation,
        reads: Arc::new(NoEngine),
        redactor: Default::default(),
    }
}

async fn ask(addr: &Addr<AdvisorActor>, session: &str, s: Situation) -> Consulted {
    addr.send(consult(session, s)).await.expect("advisor running")
}

#[actix::test]
async fn a_good_answer_is_the_models_advice_and_is_reused_for_the_same_state() {
    tokio::time::pause();
    let model = ScriptedModel::new(Answer::Text("Looks busy. @wait:0.9"));
    let addr = AdvisorActor::new(cfg(), Some(model.clone())).start();
    let first = ask(&addr, "a", stall(600)).await;
    assert_eq!(
        (first.advice.action, first.advice.confidence, &first.source),
        (AdviceAction::Wait, 0.9, &Source::Model)
    );
    let again = ask(&addr, "a", stall(601)).await;
    assert_eq!(again.source, Source::Cached, "same session, same state");
    assert_eq!(again.advice, first.advice);
    assert_eq!(model.calls.load(Ordering::SeqCst), 1);
    // Another session, or the same one after cache_ttl, asks again.
    ask(&addr, "b", stall(600)).await;
    tokio::time::sleep(cfg().cache_ttl + Duration::from_secs(1)).await;
    assert_eq!(ask(&addr, "a", stall(900)).await.source, Source::Model);
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
}

#[actix::test]
async fn an_obvious_case_never_calls_the_model() {
    tokio::time::pause();
    let model = ScriptedModel::new(Answer::Text("@abort:1"));
    let addr = AdvisorActor::new(cfg(), Some(model.clone())).start();
    let young = ask(&addr, "a", stall(5)).await;
    assert_eq!((young.advice.action, young.source), (AdviceAction::Wait, Source::Obvious));
    assert_eq!(model.calls.load(Ordering::SeqCst), 0);
}

#[actix::test]
async fn without_a_model_the_heuristic_answers() {
    tokio::time::pause();
    let addr = AdvisorActor::new(cfg(), None).start();
    let answer = ask(&addr, "a", stall(600)).await;
    assert_eq!(answer.source, Source::NoModel);
    assert_eq!(answer.why, "no rule applies");
}

#[actix::test]
async fn garbage_http_errors_and_timeouts_fall_back_to_the_heuristic_and_say_why() {
    tokio::time::pause();
    let model = ScriptedModel::new(Answer::Text("wait, probably"));
    let addr = AdvisorActor::new(cfg(), Some(model.clone())).start();
    let garbage = ask(&addr, "a", stall(600)).await;
    assert!(matches!(&garbage.source, Source::Fallback(why) if why.contains("unparsable")), "{:?}", garbage.source);
    assert_eq!(garbage.advice.action, AdviceAction::Continue, "the heuristic's advice");

    *model.answer.lock().unwrap() = Answer::Status(500);
    let http = ask(&addr, "b", stall(600)).await;
    assert_eq!(http.source, Source::Fallback("model answered HTTP 500".into()));

    *model.answer.lock().unwrap() = Answer::Hang;
    let started = tokio::time::Instant::now();
    let timeout = ask(&addr, "c", stall(600)).await;
    assert_eq!(timeout.source, Source::Fallback("timeout after 5s".into()));
    let waited = started.elapsed();
    assert!(
        waited >= cfg().timeout && waited < cfg().timeout + Duration::from_millis(100),
        "bounded by advisor.timeout: {waited:?}"
    );
    // Failures are not cached: the next consultation asks again.
    *model.answer.lock().unwrap() = Answer::Text("@abort:0.8");
    assert_eq!(ask(&addr, "a", stall(600)).await.source, Source::Model);
}

#[actix::test]
async fn no_more_than_max_concurrent_model_calls_run_at_once() {
    tokio::time::pause();
    let model = ScriptedModel::new(Answer::Text("@continue:0.6"));
    let addr = AdvisorActor::new(AdvisorConfig { max_concurrent: 2, ..cfg() }, Some(model.clone())).start();
    let asks: Vec<_> = (0..6).map(|i| addr.send(consult(&format!("s{i}"), stall(600)))).collect();
    let answers = futures::future::join_all(asks).await;
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|c| c.source == Source::Model)));
    assert_eq!(model.calls.load(Ordering::SeqCst), 6);
    assert_eq!(model.most_at_once.load(Ordering::SeqCst), 2);
}

#[actix::test]
async fn a_consultation_waits_for_a_free_slot_no_longer_than_the_timeout() {
    tokio::time::pause();
    let model = ScriptedModel::new(Answer::Hang);
    let addr = AdvisorActor::new(AdvisorConfig { max_concurrent: 1, ..cfg() }, Some(model.clone())).start();
    let timeout = cfg().timeout;
    let started = tokio::time::Instant::now();
    // Three stalls in a burst against one slot and a model that never answers: the
    // first holds the slot for `timeout`, the second gets it then for another.
    let first = addr.send(consult("s1", stall(600)));
    tokio::time::sleep(timeout / 10).await;
    let second = addr.send(consult("s2", stall(600)));
    tokio::time::sleep(timeout / 10).await;
    let third = addr.send(consult("s3", stall(600))).await.unwrap();
    assert!(matches!(&third.source, Source::Fallback(why) if why.contains("no free slot")), "{:?}", third.source);
    let waited = started.elapsed();
    assert!(waited < timeout * 3 / 2, "the third waited for its slot at most advisor.timeout: {waited:?}");
    assert_eq!(first.await.unwrap().source, Source::Fallback("timeout after 5s".into()));
    assert_eq!(second.await.unwrap().source, Source::Fallback("timeout after 5s".into()));
    assert_eq!(model.calls.load(Ordering::SeqCst), 2, "the third never reached the model");
}

#[actix::test]
async fn a_retuned_advisor_asks_its_new_model_and_forgets_answers_given_before() {
    tokio::time::pause();
    let addr = AdvisorActor::new(cfg(), None).start();
    assert_eq!(ask(&addr, "a", stall(600)).await.source, Source::NoModel);
    let model = ScriptedModel::new(Answer::Text("@abort:0.8"));
    addr.send(Retune { cfg: cfg(), model: Some(model.clone()) }).await.unwrap();
    let answer = ask(&addr, "a", stall(600)).await;
    assert_eq!((answer.advice.action, answer.source), (AdviceAction::Abort, Source::Model));
    assert_eq!(ask(&addr, "a", stall(600)).await.source, Source::Cached);
    // A retune drops the cache: the same state is asked again under the new settings.
    addr.send(Retune { cfg: cfg(), model: Some(model.clone()) }).await.unwrap();
    assert_eq!(ask(&addr, "a", stall(600)).await.source, Source::Model);
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);
}
