//! The guard on the real OpenCode server: one prompt per decision (similar prompts within
//! the window are dropped, whoever sent the first), rate limits that delay a continue
//! instead of losing it, and — with Redis — several Shepherd instances acting on each
//! session exactly once.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use shepherd::daemon::Daemon;
use shepherd::guard::redis::RedisShared;
use shepherd_actors::config::{GuardBackend, GuardConfig, RecoveryConfig};
use shepherd_actors::control::{CustomPromptReply, CustomPromptRequest, SendCustomPrompt};
use shepherd_actors::event::{ModelRef, SessionInfo, ShepherdTag, Status, Todo};
use shepherd_actors::guard::{GuardHandle, GuardRequest, PromptGuard, Shared, Verdict};
use shepherd_actors::journal::{Action, ActionRecord, Outcome};
use shepherd_actors::ports::{
    Control, EngineError, HistoryMessage, LastTurn, Prompt, Reads, SystemClock, TurnSettings,
};
use shepherd_actors::session::core::{RecoveryOrder, RecoveryReport};
use shepherd_actors::session::procedures::deliver::{deliver, send_admitted, Delivery, Outbound, PromptKind, PromptOrder, Unsent};
use shepherd_actors::session::prompt::PromptFacts;
use shepherd_actors::session::procedures::recover::recover;
use shepherd_testbed::client::wait_until;
use shepherd_testbed::redis::RedisServer;
use support::{Rig, PATIENCE};

async fn custom(rig: &Rig, session: &str, text: &str) -> anyhow::Result<CustomPromptReply> {
    let request = CustomPromptRequest { message: Some(text.into()), ..CustomPromptRequest::default() };
    Ok(rig.daemon().supervisor().send(SendCustomPrompt { session: session.into(), request }).await??)
}

async fn idle_session(rig: &Rig, title: &str) -> anyhow::Result<String> {
    let id = rig.client.create_session(Some(title)).await?;
    rig.client.prompt_async(&id, "[[fake:ok]] hello", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    Ok(id)
}

#[actix::test]
async fn two_prompts_that_differ_only_in_wording_within_the_window_are_sent_once() -> anyhow::Result<()> {
    let rig = Rig::start_config(|c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
    })
    .await?;
    let id = idle_session(&rig, "dedupe").await?;
    let before = rig.client.user_message_count(&id).await?;
    let first = custom(&rig, &id, "[[fake:ok]] Please continue working").await?;
    assert!(first.success, "{first:?}");
    let second = custom(&rig, &id, "[[fake:ok]] Continue working on tasks").await?;
    assert!(!second.success, "{second:?}");
    let why = second.reason.unwrap_or_default();
    assert!(why.contains("similar prompt") && why.contains("Shepherd's custom"), "{why}");
    let other = custom(&rig, &id, "[[fake:ok]] Now write the release notes").await?;
    assert!(other.success, "a different request goes through: {other:?}");
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert_eq!(rig.client.user_message_count(&id).await?, before + 2);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_prompt_another_client_just_sent_makes_shepherds_similar_prompt_a_duplicate() -> anyhow::Result<()> {
    let rig = Rig::start_config(|c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
    })
    .await?;
    let id = idle_session(&rig, "other client").await?;
    // Another tool (or another Shepherd without a shared store) prompts the session.
    rig.client.prompt_async(&id, "[[fake:ok]] please continue working on the tasks", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    let reply = custom(&rig, &id, "[[fake:ok]] Continue working on tasks").await?;
    assert!(!reply.success, "{reply:?}");
    assert!(reply.reason.unwrap_or_default().contains("a user message"), "the session's own history counts");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn over_the_global_limit_a_continue_waits_its_turn_and_is_not_lost() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.guard.global_per_minute = 20; // one every 3 s …
        c.guard.global_burst = 1; // … and no burst
    })
    .await?;
    let a = rig.client.create_session(Some("stall a")).await?;
    let b = rig.client.create_session(Some("stall b")).await?;
    rig.client.prompt_async(&a, "[[fake:todo:create]][[fake:stall]] one", None, None, false).await?;
    rig.client.prompt_async(&b, "[[fake:todo:create]][[fake:stall]] two", None, None, false).await?;
    let ra = rig.wait_record(&a, Action::Continue, Outcome::Done, PATIENCE).await?;
    let rb = rig.wait_record(&b, Action::Continue, Outcome::Done, PATIENCE).await?;
    let held: Vec<&ActionRecord> = [&ra, &rb].into_iter().filter(|r| r.reason.contains("held")).collect();
    assert_eq!(held.len(), 1, "one of the two continues waited for the limit: {ra:?} {rb:?}");
    for id in [&a, &b] {
        let users = rig.client.messages(id).await?;
        let continues = users
            .iter()
            .filter(|m| {
                m.parts
                    .iter()
                    .any(|p| p.pointer("/metadata/shepherd/kind").and_then(|v| v.as_str()) == Some("continue"))
            })
            .count();
        assert_eq!(continues, 1, "{id} got its continue");
    }
    rig.stop().await;
    Ok(())
}

/// Records of one daemon, collected in the background.
struct Watch(std::sync::Arc<std::sync::Mutex<Vec<ActionRecord>>>);

impl Watch {
    fn of(daemon: &Daemon) -> Watch {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut rx = daemon.journal().subscribe();
        let into = std::sync::Arc::clone(&seen);
        actix::spawn(async move {
            while let Ok(r) = rx.recv().await {
                into.lock().unwrap().push(r);
            }
        });
        Watch(seen)
    }

    fn count(&self, session: &str, action: Action, outcome: Outcome) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.session == session && r.action == action && r.outcome == outcome)
            .count()
    }
}

#[actix::test]
async fn two_instances_sharing_redis_act_on_a_stall_once_and_one_takes_over_when_the_other_dies() -> anyhow::Result<()>
{
    let redis = RedisServer::start().await?;
    let url = redis.url();
    let mut rig = Rig::start_config(|c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.guard.backend = GuardBackend::Redis;
        c.guard.redis_url = url.clone();
        c.guard.lease_ttl = shepherd_actors::config::MIN_RENEWED_LEASE_TTL;
    })
    .await?;
    let second = Daemon::start(&rig.cfg)?;
    let (w1, w2) = (Watch::of(rig.daemon()), Watch::of(&second));
    wait_until("the second instance to connect", PATIENCE, || async {
        let f = second.fleet().await;
        anyhow::Ok(f.servers.iter().all(|s| s.connected && s.reconciled).then_some(()))
    })
    .await?;

    let id = rig.client.create_session(Some("shared")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:stall]] work", None, None, false).await?;
    wait_until("one instance to continue the stalled session", PATIENCE, || async {
        let n = w1.count(&id, Action::Continue, Outcome::Done) + w2.count(&id, Action::Continue, Outcome::Done);
        anyhow::Ok((n >= 1).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let aborts = w1.count(&id, Action::Abort, Outcome::Done) + w2.count(&id, Action::Abort, Outcome::Done);
    let continues = w1.count(&id, Action::Continue, Outcome::Done) + w2.count(&id, Action::Continue, Outcome::Done);
    assert_eq!((aborts, continues), (1, 1), "acted on once across both instances");
    let declined =
        w1.count(&id, Action::Recover, Outcome::Declined) + w2.count(&id, Action::Recover, Outcome::Declined);
    assert_eq!(declined, 1, "the other instance saw the stall and left it to the lease holder");

    // The instance that acted dies; the session stalls again; the survivor takes over
    // once the lease has expired.
    let first_acted = w1.count(&id, Action::Abort, Outcome::Done) == 1;
    let (survivor, watch) = if first_acted {
        rig.daemon.take().unwrap().shutdown().await;
        (second, w2)
    } else {
        second.shutdown().await;
        (rig.daemon.take().unwrap(), w1)
    };
    rig.client.wait_idle(&id, PATIENCE).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] again", None, None, false).await?;
    let taken_over = wait_until("the surviving instance to recover the session", PATIENCE, || async {
        anyhow::Ok((watch.count(&id, Action::Continue, Outcome::Done) >= 1).then_some(()))
    })
    .await;
    if taken_over.is_err() {
        let detail = survivor.fleet().await.sessions.into_iter().find(|s| s.id == id);
        let busy = rig.client.is_busy(&id).await;
        let seen: Vec<ActionRecord> = watch.0.lock().unwrap().iter().filter(|r| r.session == id).cloned().collect();
        panic!("{seen:#?}\n{detail:#?}\nbusy: {busy:?}");
    }
    survivor.shutdown().await;
    rig.opencode.stop().await;
    drop(redis);
    Ok(())
}

// The shared store on a real `redis-server`, with a fake OpenCode (no model needed):
// leases that are held while a prompt waits, fence a stale holder, and a local
// fleet-wide limit while Redis is down.

/// An OpenCode that records the prompts it gets; `busy` sessions are busy until
/// aborted, and a compaction takes `compaction`.
#[derive(Default)]
struct Recorder {
    prompts: std::sync::Mutex<Vec<Prompt>>,
    busy: std::sync::Mutex<HashMap<String, Status>>,
    compaction: Duration,
}

#[async_trait::async_trait]
impl Reads for Recorder {
    async fn statuses(&self, _: &str) -> Result<HashMap<String, Status>, EngineError> {
        Ok(self.busy.lock().unwrap().clone())
    }
    async fn session(&self, id: &str) -> Result<SessionInfo, EngineError> {
        Err(EngineError::NotFound(id.into()))
    }
    async fn todos(&self, _: &str) -> Result<Vec<Todo>, EngineError> {
        Ok(vec![])
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

#[async_trait::async_trait]
impl Control for Recorder {
    async fn abort(&self, id: &str) -> Result<(), EngineError> {
        self.busy.lock().unwrap().remove(id);
        Ok(())
    }
    async fn summarize(&self, _: &str, _: &ModelRef) -> Result<(), EngineError> {
        tokio::time::sleep(self.compaction).await;
        Ok(())
    }
    async fn prompt(&self, _: &str, p: &Prompt) -> Result<(), EngineError> {
        self.prompts.lock().unwrap().push(p.clone());
        Ok(())
    }
}

/// One Shepherd instance's guard over the shared store at `url`.
fn instance(url: &str, name: &str, cfg: &GuardConfig) -> anyhow::Result<GuardHandle> {
    let shared: Arc<dyn Shared> = Arc::new(RedisShared::new(url, "test", name)?);
    Ok(GuardHandle::start(cfg.clone(), Arc::new(SystemClock), Some(shared)))
}

fn order(session: &str, kind: PromptKind, text: &str) -> PromptOrder {
    PromptOrder {
        session_id: session.into(),
        directory: Some("/p".into()),
        kind,
        template: text.into(),
        template_without_open_todos: None,
        facts: PromptFacts::default(),
        known_todos: vec![],
        known_turn: None,
        require_idle: false,
        require_open_todos: false,
        decision: format!("{session}-{text}"),
        not_before_ms: None,
        tool_text_scan: None,
        model: None,
    }
}

#[actix::test]
async fn a_lease_is_renewed_while_a_prompt_waits_in_the_limiter_and_no_other_instance_takes_it() -> anyhow::Result<()> {
    let redis = RedisServer::start().await?;
    // One prompt per 5 s to a session, a lease of 3 s: the second prompt waits longer
    // than the lease lives.
    let cfg = GuardConfig {
        backend: GuardBackend::Redis,
        session_per_minute: 12,
        session_burst: 1,
        lease_ttl: Duration::from_secs(3),
        max_wait: Duration::from_secs(20),
        ..GuardConfig::default()
    };
    let (a, b) = (instance(&redis.url(), "i-a", &cfg)?, instance(&redis.url(), "i-b", &cfg)?);
    let engine = Recorder::default();
    let out = Outbound { server: "srv", reads: &engine, control: &engine, guard: &a, instance: "i-a", lease: None };
    assert!(matches!(deliver(out, &order("ses_L", PromptKind::Custom, "Run the tests")).await, Delivery::Sent { .. }));
    let notes = order("ses_L", PromptKind::Custom, "Now write the release notes");
    let waiting = deliver(out, &notes);
    let other = async {
        // Past the lease's lifetime while the prompt waits: still the waiting instance's.
        tokio::time::sleep(Duration::from_secs(4)).await;
        b.may_act("srv", "ses_L").await
    };
    let (second, taken) = tokio::join!(waiting, other);
    assert_eq!(taken, Err("i-a".to_string()), "the waiting instance kept its lease");
    match second {
        Delivery::Sent { waited_ms, .. } => assert!(waited_ms >= 3_000, "it waited past lease_ttl: {waited_ms} ms"),
        other => panic!("{other:?}"),
    }
    let prompts = engine.prompts.lock().unwrap().clone();
    let tokens: Vec<Option<u64>> = prompts.iter().map(|p| p.tag.lease).collect();
    assert!(tokens[0].is_some() && tokens[0] == tokens[1], "both sent under the same lease: {tokens:?}");
    Ok(())
}

#[actix::test]
async fn a_recovery_holds_its_lease_through_a_long_compaction_and_continues_under_it() -> anyhow::Result<()> {
    let redis = RedisServer::start().await?;
    let cfg = GuardConfig { backend: GuardBackend::Redis, lease_ttl: Duration::from_secs(3), ..GuardConfig::default() };
    let (a, b) = (instance(&redis.url(), "i-a", &cfg)?, instance(&redis.url(), "i-b", &cfg)?);
    // Past handoff.hard: the abort is followed by a compaction that outlives the lease.
    let engine = Recorder { compaction: Duration::from_secs(5), ..Recorder::default() };
    engine.busy.lock().unwrap().insert("ses_R".into(), Status::Busy);
    let out = Outbound { server: "srv", reads: &engine, control: &engine, guard: &a, instance: "i-a", lease: None };
    let recovery = RecoveryConfig {
        abort_poll_interval: Duration::from_millis(100),
        wait_after_abort: Duration::from_millis(100),
        ..RecoveryConfig::default()
    };
    let order = RecoveryOrder {
        session_id: "ses_R".into(),
        directory: Some("/p".into()),
        attempt: 1,
        known_todos: vec![],
        known_turn: None,
        decision: "ses_R-stall-1".into(),
        decided_ms: 0,
        compact_first: Some((ModelRef { provider_id: "p".into(), model_id: "m".into() }, Duration::from_secs(30))),
        continue_after: true,
        planning: false,
        escalation: None,
    };
    let stopping = std::sync::atomic::AtomicBool::new(false);
    let other = async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        b.may_act("srv", "ses_R").await
    };
    let intents = shepherd_actors::ledger::MemoryLedger::default();
    let (report, taken) = tokio::join!(recover(out, &recovery, &order, &stopping, &intents, 0, None), other);
    assert_eq!(taken, Err("i-a".to_string()), "the recovering instance kept its lease while it compacted");
    assert!(matches!(report, RecoveryReport::Continued { .. }), "{report:?}");
    let prompts = engine.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 1);
    assert!(prompts[0].tag.lease.is_some(), "the continue went out under the abort's lease");
    Ok(())
}

#[actix::test]
async fn a_stale_holder_is_fenced_once_another_instance_holds_the_lease() -> anyhow::Result<()> {
    let redis = RedisServer::start().await?;
    let cfg = GuardConfig { backend: GuardBackend::Redis, lease_ttl: Duration::from_secs(1), ..GuardConfig::default() };
    let (a, b) = (instance(&redis.url(), "i-a", &cfg)?, instance(&redis.url(), "i-b", &cfg)?);
    let engine = Recorder::default();
    let out = Outbound { server: "srv", reads: &engine, control: &engine, guard: &a, instance: "i-a", lease: None };
    let text = "You stalled; go on with the parser";
    let req = GuardRequest {
        server: "srv".into(),
        session: "ses_F".into(),
        kind: PromptKind::Continue,
        text: text.into(),
        decision: "ses_F-continue-1".into(),
        lease: None,
        recent: Some(vec![]),
        not_before_ms: None,
    };
    let Verdict::Send { lease: Some(stale), .. } = a.admit(&req).await else { panic!("admitted under a lease") };
    // Instance A stops (a long pause) before it sends; its lease lapses; B takes over.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let fresh = b.may_act("srv", "ses_F").await.expect("the lapsed lease is B's now");
    assert!(fresh > Some(stale), "a later holder has a higher fencing token: {fresh:?} > {stale}");
    let prompt = Prompt {
        text: text.into(),
        tag: ShepherdTag {
            kind: "continue".into(),
            instance: "i-a".into(),
            decision: req.decision.clone(),
            lease: Some(stale),
        },
        turn: TurnSettings::default(),
        no_reply: false,
    };
    let refused = send_admitted(out, "ses_F", &prompt, None).await;
    assert_eq!(refused, Err(Unsent::Fenced { holder: "i-b".into() }));
    assert!(engine.prompts.lock().unwrap().is_empty(), "the stale holder sent nothing");
    // And B's own prompt goes out under its lease.
    let out_b = Outbound { guard: &b, instance: "i-b", ..out };
    let sent = deliver(out_b, &order("ses_F", PromptKind::Continue, text)).await;
    assert!(matches!(sent, Delivery::Sent { .. }), "{sent:?}");
    assert_eq!(engine.prompts.lock().unwrap()[0].tag.lease, fresh);
    Ok(())
}

#[actix::test]
async fn with_redis_down_each_instance_falls_back_to_a_local_fleet_wide_limit() -> anyhow::Result<()> {
    let redis = RedisServer::start().await?;
    let url = redis.url();
    drop(redis); // Redis is down from the start.
    let cfg = GuardConfig {
        backend: GuardBackend::Redis,
        redis_url: url.clone(),
        fallback_per_minute: 12, // one every five seconds …
        fallback_burst: 2,       // … after two at once
        max_wait: Duration::from_secs(20),
        ..GuardConfig::default()
    };
    let guard = instance(&url, "i-a", &cfg)?;
    let engine = Recorder::default();
    let out = Outbound { server: "srv", reads: &engine, control: &engine, guard: &guard, instance: "i-a", lease: None };
    let mut waited = Vec::new();
    for (i, text) in ["Run the tests", "Write the release notes", "Fix the failing build"].iter().enumerate() {
        match deliver(out, &order(&format!("ses_{i}"), PromptKind::Custom, text)).await {
            Delivery::Sent { waited_ms, .. } => waited.push(waited_ms),
            other => panic!("sent (fail open on the lease and fingerprints): {other:?}"),
        }
    }
    assert_eq!(&waited[..2], &[0, 0], "the fallback's burst");
    // Five seconds less what the first two took (each tries Redis first): however slow
    // the host, well past nothing.
    assert!(waited[2] >= 2_500, "the third waited for the local limit: {waited:?}");
    assert!(engine.prompts.lock().unwrap().iter().all(|p| p.tag.lease.is_none()), "no lease without Redis");
    Ok(())
}
