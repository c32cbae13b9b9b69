//! The guard on the real OpenCode server: one prompt per decision (similar prompts within
//! the window are dropped, whoever sent the first), rate limits that delay a continue
//! instead of losing it, and — with Redis — several Shepherd instances acting on each
//! session exactly once.

mod support;

use std::time::Duration;

use shepherd::daemon::Daemon;
use shepherd::testbed::client::wait_until;
use shepherd::testbed::redis::RedisServer;
use shepherd_actors::config::GuardBackend;
use shepherd_actors::control::{CustomPromptReply, CustomPromptRequest, SendCustomPrompt};
use shepherd_actors::journal::{Action, ActionRecord, Outcome};
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
        c.guard.lease_ttl = Duration::from_secs(2);
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
