//! The guard in the prompt path, with a fake engine and paused time: what is sent, what
//! is dropped, what waits — and that a guard which cannot read the session's history
//! still lets the prompt through (fail open).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shepherd_actors::config::GuardConfig;
use shepherd_actors::event::{ModelRef, SessionInfo, Status, Todo, TodoStatus};
use shepherd_actors::guard::GuardHandle;
use shepherd_actors::ports::{Clock, Engine, EngineError, LastTurn, Prompt, SystemClock, TurnSettings};
use shepherd_actors::session::delivery::{deliver, Delivery, Outbound, PromptKind, PromptOrder};
use shepherd_actors::session::prompt::PromptFacts;

/// An engine whose history cannot be read (the trait's default answers an error).
#[derive(Default)]
struct Engine1 {
    prompts: Mutex<Vec<String>>,
}

#[async_trait]
impl Engine for Engine1 {
    async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
        Ok(HashMap::new())
    }
    async fn list_sessions(&self, _: u32) -> Result<Vec<SessionInfo>, EngineError> {
        Ok(vec![])
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Err(EngineError::NotFound(id.into()))
    }
    async fn abort(&self, _: &str) -> Result<(), EngineError> {
        Ok(())
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
    async fn summarize(&self, _: &str, _: &ModelRef) -> Result<(), EngineError> {
        Ok(())
    }
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        Ok(HashMap::new())
    }
    async fn prompt(&self, _: &str, p: &Prompt) -> Result<(), EngineError> {
        self.prompts.lock().unwrap().push(p.text.clone());
        Ok(())
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
    let out = Outbound { server: "local", engine: &engine, guard: &guard, instance: "i1" };
    let first = deliver(out, &order(PromptKind::Nudge, "Please continue working")).await;
    assert!(matches!(first, Delivery::Sent { .. }), "fail open: {first:?}");
    let second = deliver(out, &order(PromptKind::Nudge, "Continue working on tasks")).await;
    assert!(matches!(&second, Delivery::Guarded { reason, .. } if reason.contains("Shepherd's nudge")), "{second:?}");
    assert_eq!(engine.prompts.lock().unwrap().len(), 1);
}

#[actix::test]
async fn over_the_session_limit_a_nudge_is_dropped_and_a_continue_waits_then_goes_out() {
    tokio::time::pause();
    let engine = Engine1::default();
    let cfg = GuardConfig {
        session_per_minute: 1,
        session_burst: 1,
        max_wait: Duration::from_secs(20),
        ..GuardConfig::default()
    };
    let guard = guard(cfg);
    let out = Outbound { server: "local", engine: &engine, guard: &guard, instance: "i1" };
    assert!(matches!(deliver(out, &order(PromptKind::Review, "Review your work")).await, Delivery::Sent { .. }));
    let nudge = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    assert!(matches!(&nudge, Delivery::Guarded { reason, .. } if reason.contains("session rate limit")), "{nudge:?}");
    let cont = deliver(out, &order(PromptKind::Continue, "You stalled; go on with the parser")).await;
    match cont {
        Delivery::Sent { waited_ms, .. } => assert!(waited_ms >= 1, "it waited its turn ({waited_ms} ms)"),
        other => panic!("a continue is never lost: {other:?}"),
    }
    assert_eq!(engine.prompts.lock().unwrap().len(), 2);
}

#[actix::test]
async fn a_retuned_guard_judges_by_its_new_limits_and_still_remembers_what_was_sent() {
    let engine = Engine1::default();
    let tight = GuardConfig { session_per_minute: 1, session_burst: 1, ..GuardConfig::default() };
    let guard = guard(tight.clone());
    let out = Outbound { server: "local", engine: &engine, guard: &guard, instance: "i1" };
    assert!(matches!(deliver(out, &order(PromptKind::Review, "Review your work")).await, Delivery::Sent { .. }));
    let dropped = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    assert!(matches!(&dropped, Delivery::Guarded { reason, .. } if reason.contains("rate limit")), "{dropped:?}");

    guard.retune(GuardConfig { session_burst: 5, ..tight });
    let sent = deliver(out, &order(PromptKind::Nudge, "Write the release notes")).await;
    assert!(matches!(sent, Delivery::Sent { .. }), "the new burst lets it through: {sent:?}");
    let again = deliver(out, &order(PromptKind::Nudge, "Review your work")).await;
    assert!(matches!(&again, Delivery::Guarded { reason, .. } if reason.contains("similar")), "{again:?}");
}
