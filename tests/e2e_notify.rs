//! Notifications end to end: the real OpenCode driven by the fake model, a real Shepherd
//! daemon, and a real HTTP receiver (`support::receiver`) standing in for a webhook,
//! ntfy or Slack. Timings are scaled down (`after` 1 s, batch windows of 300 ms).

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use shepherd_actors::config::{Config, NotifyConfig, NotifyEvent, NotifyKind, StoreBackend};
use shepherd_actors::control::{PauseTarget, SetPause};
use shepherd_actors::journal::{Action, Outcome};
use support::receiver::Receiver;
use support::{Rig, PATIENCE};

const SECRET: &str = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789ABCD";

fn target(kind: NotifyKind, url: &str) -> NotifyConfig {
    let mut n = NotifyConfig::new(kind, url);
    n.after = Duration::from_secs(1);
    n.batch_window = Duration::from_millis(300);
    n.retry_backoff = Duration::from_millis(100);
    n.retry_max_backoff = Duration::from_millis(400);
    n.timeout = Duration::from_secs(5);
    n
}

fn sqlite(c: &mut Config, dir: &tempfile::TempDir) {
    c.store.backend = StoreBackend::Sqlite;
    c.store.path = dir.path().join("ledger.sqlite3").display().to_string();
}

async fn pause(rig: &Rig, target: PauseTarget, pause: bool) -> anyhow::Result<()> {
    let asked = SetPause { target, pause, until_ms: None, by: "test".into() };
    rig.daemon().supervisor().send(asked).await?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// A session that has run one turn (so the supervisor tracks it, with its directory).
async fn session(rig: &mut Rig, title: &str) -> anyhow::Result<String> {
    let id = rig.client.create_session(Some(title)).await?;
    rig.client.prompt_async(&id, "[[fake:ok]] hello", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    Ok(id)
}

/// The value of `shepherd_notifications_total` with these labels (0 when absent).
fn notifications(rig: &Rig, kind: &str, event: &str, outcome: &str) -> u64 {
    let text = rig.daemon().metrics().render_now();
    let labels = [format!("kind=\"{kind}\""), format!("event=\"{event}\""), format!("outcome=\"{outcome}\"")];
    text.lines()
        .filter(|l| l.starts_with("shepherd_notifications_total{") && labels.iter().all(|x| l.contains(x.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[actix::test]
async fn a_paused_session_is_one_webhook_post_with_its_fields_redacted_and_a_restart_does_not_send_it_again(
) -> anyhow::Result<()> {
    support::logs::capture_raw(tracing::Level::DEBUG);
    let receiver = Receiver::start(&[]);
    let dir = tempfile::tempdir()?;
    let url = format!("{}/hook?token=tok-9f8e7d", receiver.url);
    let mut rig = Rig::start_config(|c| {
        sqlite(c, &dir);
        c.notify = vec![target(NotifyKind::Webhook, &url)];
    })
    .await?;
    let id = session(&mut rig, &format!("deploy with {SECRET}")).await?;
    pause(&rig, PauseTarget::Session(id.clone()), true).await?;

    let got = receiver.wait_for(1, PATIENCE).await;
    assert_eq!(got.len(), 1, "one POST");
    let post = &got[0];
    assert_eq!((post.method.as_str(), post.path.as_str()), ("POST", "/hook?token=tok-9f8e7d"));
    assert_eq!(post.header("content-type"), Some("application/json"));
    let v = post.json();
    assert_eq!(v["event"], "paused", "{v}");
    assert_eq!(v["server"], "local");
    assert_eq!(v["session"], id.as_str());
    assert_eq!(v["reason"], "paused by test until resumed");
    let title = v["title"].as_str().expect("the session's title");
    assert!(title.starts_with("deploy with ") && !title.contains(SECRET), "redacted: {title}");
    assert!(v["directory"].as_str().is_some_and(|d| d.starts_with('/')), "{v}");
    assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
    assert!(!post.body.contains(SECRET));
    // Counted once the receiver's answer is back, a moment after the receiver saw the
    // POST (under load, after this line would run).
    let deadline = Instant::now() + PATIENCE;
    while notifications(&rig, "webhook", "paused", "sent") == 0 {
        assert!(Instant::now() < deadline, "the sent notification was never counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(notifications(&rig, "webhook", "paused", "sent"), 1);
    let logs = support::logs::logged();
    assert!(logs.contains("notification sent") && logs.contains(&id), "one log event per notification");
    assert!(!logs.contains("tok-9f8e7d") && !logs.contains("/hook"), "the URL is never logged whole");

    // A restart reads the journal back (catch-up) and decides the same pause again;
    // the ledger says it was sent.
    rig.restart_daemon().await?;
    let deadline = Instant::now() + PATIENCE;
    while notifications(&rig, "webhook", "paused", "skipped") == 0 {
        assert!(Instant::now() < deadline, "the restarted daemon never re-decided the pause");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(receiver.received().len(), 1, "not sent again after the restart");
    assert_eq!(notifications(&rig, "webhook", "paused", "sent"), 0);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_question_unanswered_for_after_is_notified_once_not_before_and_not_again_after_a_restart(
) -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let dir = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        sqlite(c, &dir);
        let mut n = target(NotifyKind::Webhook, &receiver.url);
        n.events = vec![NotifyEvent::WaitingOnPerson];
        c.notify = vec![n];
    })
    .await?;
    let id = rig.client.create_session(Some("asks")).await?;
    rig.client.prompt_async(&id, "[[fake:question]] which one?", None, None, false).await?;
    let asked = rig.wait_record(&id, Action::WaitsOnPerson, Outcome::Done, PATIENCE).await?;
    // When the question was recorded, not when this task got round to reading it.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let asked_at = Instant::now() - Duration::from_millis((now_ms - asked.at_ms).max(0) as u64);
    assert!(asked.numbers.waits_on.as_deref().is_some_and(|q| q.starts_with("que")), "{asked:?}");

    let got = receiver.wait_for(1, PATIENCE).await;
    assert_eq!(got.len(), 1);
    assert!(got[0].at.duration_since(asked_at) >= Duration::from_millis(900), "not before `after`");
    let v = got[0].json();
    assert_eq!(v["event"], "waiting_on_person", "{v}");
    assert_eq!(v["session"], id.as_str());
    assert!(v["reason"].as_str().unwrap().contains("unanswered for"), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.received().len(), 1, "once per wait");

    // The question is still open: the restarted daemon reads the wait back from the
    // journal, finds it past `after`, and the ledger says it was told.
    rig.restart_daemon().await?;
    let deadline = Instant::now() + PATIENCE;
    while notifications(&rig, "webhook", "waiting_on_person", "skipped") == 0 {
        assert!(Instant::now() < deadline, "the restarted daemon never re-decided the wait");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.received().len(), 1, "not sent again after the restart");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_session_shepherd_gives_up_on_is_one_notification_with_the_reason() -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let mut rig = Rig::start_config(|c| {
        // Every continue stalls again: no real progress, ever.
        c.recovery.continue_message = "[[fake:stall]] continue (attempt {attempts} of {maxAttempts})".into();
        c.recovery.max_auto_submits = 1;
        let mut n = target(NotifyKind::Webhook, &receiver.url);
        n.events = vec![NotifyEvent::GaveUp];
        c.notify = vec![n];
    })
    .await?;
    let id = rig.client.create_session(Some("no progress")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] go", None, None, false).await?;
    rig.wait_record(&id, Action::GiveUp, Outcome::Done, Duration::from_secs(60)).await?;
    let got = receiver.wait_for(1, PATIENCE).await;
    assert_eq!(got.len(), 1);
    let v = got[0].json();
    assert_eq!((v["event"].as_str(), v["session"].as_str()), (Some("gave_up"), Some(id.as_str())), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("max_auto_submits"), "{v}");
    assert!(v["text"].as_str().unwrap().starts_with(&format!("Shepherd: session {id} was given up")), "{v}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.received().len(), 1);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_server_whose_event_stream_is_down_past_the_grace_is_told_once_and_so_is_its_return() -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let mut rig = Rig::start_config(|c| {
        let mut n = target(NotifyKind::Webhook, &receiver.url);
        n.events = vec![NotifyEvent::ServerUnreachable];
        n.unreachable_after = Duration::from_secs(1);
        c.notify = vec![n];
    })
    .await?;
    rig.opencode.stop().await;
    let got = receiver.wait_for(1, PATIENCE).await;
    assert_eq!(got.len(), 1);
    let v = got[0].json();
    assert_eq!((v["event"].as_str(), v["phase"].as_str()), (Some("server_unreachable"), Some("began")), "{v}");
    assert_eq!((v["server"].as_str(), v["session"].as_str()), (Some("local"), None), "{v}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.received().len(), 1, "once per outage");
    rig.opencode.respawn().await?;
    let got = receiver.wait_for(2, PATIENCE).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].json()["phase"], "ended");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_receiver_that_answers_500_then_200_gets_the_notification_on_the_retry() -> anyhow::Result<()> {
    let receiver = Receiver::start(&[500]);
    let mut rig = Rig::start_config(|c| c.notify = vec![target(NotifyKind::Webhook, &receiver.url)]).await?;
    let id = session(&mut rig, "retry").await?;
    pause(&rig, PauseTarget::Session(id.clone()), true).await?;
    let got = receiver.wait_for(2, PATIENCE).await;
    assert_eq!(got.len(), 2, "a retry after the 500");
    assert_eq!(got[0].body, got[1].body, "the same notification");
    assert!(got[1].at.duration_since(got[0].at) >= Duration::from_millis(90), "after the back-off");
    let deadline = Instant::now() + PATIENCE;
    while notifications(&rig, "webhook", "paused", "sent") != 1 {
        assert!(Instant::now() < deadline, "never counted as sent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(receiver.received().len(), 2, "no more attempts once delivered");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_dead_receiver_neither_slows_supervision_nor_grows_a_queue() -> anyhow::Result<()> {
    let receiver = Receiver::hanging();
    let mut rig = Rig::start_config(|c| {
        let mut n = target(NotifyKind::Webhook, &receiver.url);
        n.batch_window = Duration::ZERO;
        n.queue = 1;
        n.retries = 0;
        n.timeout = Duration::from_secs(60);
        c.notify = vec![n];
    })
    .await?;
    let id = session(&mut rig, "flapping").await?;
    // Pauses and resumes while the first POST hangs: one is being sent, one waits in the
    // queue, the rest are dropped — and each pause is answered at once. Each pause is
    // resumed only after the tick that sends it (one resumed before is not news: taken
    // back, never sent).
    let mut slowest = Duration::ZERO;
    for _ in 0..8 {
        let t = Instant::now();
        pause(&rig, PauseTarget::Session(id.clone()), true).await?;
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(300)).await; // past the tick: one message each
        let t = Instant::now();
        pause(&rig, PauseTarget::Session(id.clone()), false).await?;
        slowest = slowest.max(t.elapsed());
    }
    // Waiting on the receiver would take its 60-s timeout; a loaded host, a second or two.
    assert!(slowest < Duration::from_secs(5), "a pause waited on the receiver: {slowest:?}");
    assert!(notifications(&rig, "webhook", "paused", "dropped") >= 3, "{}", rig.daemon().metrics().render_now());
    // A stall elsewhere is still recovered on time.
    let stalled = rig.client.create_session(Some("stalls")).await?;
    rig.client.prompt_async(&stalled, "[[fake:stall]] work", None, None, false).await?;
    let t = Instant::now();
    rig.wait_record(&stalled, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert!(t.elapsed() < Duration::from_secs(20), "recovered in {:?}", t.elapsed());
    assert_eq!(receiver.received().len(), 1, "only the first POST reached the dead receiver");
    let t = Instant::now();
    rig.stop().await;
    assert!(t.elapsed() < Duration::from_secs(15), "the stop waited on the receiver: {:?}", t.elapsed());
    Ok(())
}

#[actix::test]
async fn ntfy_and_slack_get_their_own_bodies_and_headers_and_a_fleet_pause_is_one_batch() -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let mut rig = Rig::start_config(|c| {
        let mut ntfy = target(NotifyKind::Ntfy, &format!("{}/shepherd-topic", receiver.url));
        ntfy.priority = Some(4);
        ntfy.tags = vec!["warning".into(), "robot".into()];
        ntfy.batch_window = Duration::from_millis(1_000);
        let mut slack = target(NotifyKind::Slack, &format!("{}/services/T0/B0/xyz", receiver.url));
        slack.batch_window = Duration::from_millis(1_000);
        c.notify = vec![ntfy, slack];
    })
    .await?;
    let a = session(&mut rig, "first").await?;
    let b = session(&mut rig, "second").await?;
    pause(&rig, PauseTarget::Fleet, true).await?;

    let got = receiver.wait_for(2, PATIENCE).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.received().len(), 2, "one batch per target: {:#?}", receiver.received());
    let ntfy = got.iter().find(|r| r.path == "/shepherd-topic").expect("the ntfy POST");
    assert_eq!(ntfy.header("title"), Some("Shepherd: 2 sessions were paused"));
    assert_eq!(ntfy.header("priority"), Some("4"));
    assert_eq!(ntfy.header("tags"), Some("warning,robot"));
    assert!(ntfy.header("content-type").unwrap().starts_with("text/plain"));
    for id in [&a, &b] {
        assert!(ntfy.body.contains(&format!("local/{id}")), "{}", ntfy.body);
    }
    assert!(ntfy.body.contains("the fleet was paused by test"), "{}", ntfy.body);
    let slack = got.iter().find(|r| r.path == "/services/T0/B0/xyz").expect("the Slack POST");
    let v: Value = slack.json();
    let text = v["text"].as_str().expect("text");
    assert!(text.starts_with("*Shepherd: 2 sessions were paused*\n"), "{text}");
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_provider_outage_is_told_when_the_breaker_opens_and_when_it_closes() -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let rig = Rig::start_config(|c| {
        let r = &mut c.recovery;
        r.provider_backoff = Duration::from_secs(2);
        r.provider_max_backoff = Duration::from_secs(4);
        r.breaker_sessions = 2;
        r.breaker_window = Duration::from_secs(60);
        c.guard.window = Duration::from_secs(1);
        let mut n = target(NotifyKind::Webhook, &receiver.url);
        n.events = vec![NotifyEvent::ProviderOutage];
        c.notify = vec![n];
    })
    .await?;
    rig.fake.set_outage(Some(shepherd_testbed::fake_model::Behaviour::Err429(1)));
    for tag in ["outage-alpha", "outage-bravo"] {
        let id = rig.client.create_session(Some(tag)).await?;
        rig.client.prompt_async(&id, &format!("work on {tag} [[fake:ok]]"), None, None, false).await?;
    }
    let got = receiver.wait_for(1, PATIENCE).await;
    assert_eq!(got.len(), 1, "the breaker opened");
    let v = got[0].json();
    assert_eq!((v["event"].as_str(), v["phase"].as_str()), (Some("provider_outage"), Some("began")), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("provider breaker opened"), "{v}");
    assert!(v["text"].as_str().unwrap().starts_with("Shepherd: provider outage on server local"), "{v}");
    rig.fake.set_outage(None);
    let got = receiver.wait_for(2, PATIENCE).await;
    assert_eq!(got.len(), 2, "the breaker closed");
    assert_eq!(got[1].json()["phase"], "ended");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn notify_test_sends_one_test_message_to_each_target_and_fails_naming_the_one_that_did_not_answer(
) -> anyhow::Result<()> {
    let receiver = Receiver::start(&[]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("shepherd.toml");
    std::fs::write(
        &file,
        format!(
            "[[notify]]\nkind = \"webhook\"\nurl = \"{}/hook/SECRET\"\n\n\
             [[notify]]\nkind = \"slack\"\nurl = \"http://{closed}/services/SECRET\"\nretries = 0\n",
            receiver.url
        ),
    )?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["notify", "test", "--config"])
        .arg(&file)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("ok    notify[0] webhook http://127.0.0.1:"), "{text}");
    assert!(lines[0].ends_with("/…: delivered (1 attempt)"), "{text}");
    assert!(lines[1].starts_with("FAIL  notify[1] slack"), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].json()["event"], "test");
    Ok(())
}
