//! Nudges and reviews against the real OpenCode server, driven by the fake model.
//!
//! The fake model reads markers in the last user message, so the nudge and review
//! templates below carry markers that tell it how to react (finish the todos, plan new
//! ones): the templates are configuration, and this is what the tests configure.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::config::Config;
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::client::Message;
use support::{Rig, PATIENCE};

fn kind_of(m: &Message) -> Option<String> {
    m.parts.iter().find_map(|p| p.pointer("/metadata/shepherd/kind").and_then(Value::as_str).map(str::to_string))
}

async fn prompts_of_kind(rig: &Rig, id: &str, kind: &str) -> anyhow::Result<Vec<String>> {
    Ok(rig
        .client
        .messages(id)
        .await?
        .iter()
        .filter(|m| m.role() == "user" && kind_of(m).as_deref() == Some(kind))
        .map(|m| m.text())
        .collect())
}

fn quick(c: &mut Config) {
    // These sessions go idle and are nudged within a second of being created: the
    // heuristic "new session → wait" would skip the first nudge (that skip and its
    // retry are tested in e2e_advisor). Here the nudge's own rules are under test.
    c.advisor.new_session = Duration::ZERO;
    c.nudge.user_quiet = Duration::ZERO;
    c.nudge.idle_delay = Duration::from_millis(300);
    c.review.debounce = Duration::from_millis(300);
}

/// Waits until the session has been idle, with no Shepherd prompt pending, for a while.
async fn settle(rig: &Rig, id: &str) -> anyhow::Result<()> {
    let mut quiet_polls = 0;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while quiet_polls < 15 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "session {id} never settled");
        if rig.client.is_busy(id).await? {
            quiet_polls = 0;
        } else {
            quiet_polls += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[actix::test]
async fn idle_with_open_todos_is_nudged_once_with_the_todos_then_reviewed_once_when_done() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        quick(c);
        c.nudge.message = "[[fake:todo:done]] Keep going: {pending} of {total} open:\n{todoList}".into();
    })
    .await?;
    let id = rig.client.create_session(Some("nudge")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]] plan and stop", None, None, false).await?;
    rig.wait_record(&id, Action::Nudge, Outcome::Done, PATIENCE).await?;
    rig.wait_record(&id, Action::Review, Outcome::Done, PATIENCE).await?;
    settle(&rig, &id).await?;

    let nudges = prompts_of_kind(&rig, &id, "nudge").await?;
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(nudges[0].contains("3 of 3 open"), "{}", nudges[0]);
    let todos = rig.client.todos(&id).await?;
    assert!(todos.iter().all(|t| nudges[0].contains(&t.content)), "the nudge lists the open todos");
    assert_eq!(prompts_of_kind(&rig, &id, "review").await?.len(), 1, "one review for one completion");
    assert!(todos.iter().all(|t| t.status == "completed"));
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn no_nudge_when_the_model_asked_the_person_a_question() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(quick).await?;
    let id = rig.client.create_session(Some("asks")).await?;
    rig.client
        .prompt_async(&id, "[[fake:todo:create]][[fake:say:Should I use SQLite or Postgres?]] plan", None, None, false)
        .await?;
    let declined = rig.wait_record(&id, Action::Nudge, Outcome::Declined, PATIENCE).await?;
    assert_eq!(declined.reason, "the last reply asks the person a question");
    settle(&rig, &id).await?;
    assert!(prompts_of_kind(&rig, &id, "nudge").await?.is_empty());
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn no_nudge_after_a_user_abort_until_the_person_writes() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        quick(c);
        c.nudge.message = "[[fake:ok]] nudge: {pending} open".into();
    })
    .await?;
    let id = rig.client.create_session(Some("esc")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:stall]] work", None, None, false).await?;
    shepherd_testbed::client::wait_for("todos to exist", PATIENCE, || async {
        rig.client.todos(&id).await.map(|t| !t.is_empty())
    })
    .await?;
    rig.client.abort(&id).await?;
    let declined = rig.wait_record(&id, Action::Nudge, Outcome::Declined, PATIENCE).await?;
    assert!(declined.reason.contains("paused") || declined.reason.contains("did not finish normally"), "{declined:?}");
    settle(&rig, &id).await?;
    assert!(prompts_of_kind(&rig, &id, "nudge").await?.is_empty());

    rig.client.prompt_async(&id, "[[fake:ok]] carry on", None, None, false).await?;
    rig.wait_record(&id, Action::Resume, Outcome::Done, PATIENCE).await?;
    rig.wait_record(&id, Action::Nudge, Outcome::Done, PATIENCE).await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn loop_protection_stops_after_three_unchanged_nudges_and_resumes_when_a_todo_changes() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        quick(c);
        c.nudge.cooldown = Duration::ZERO;
        c.nudge.message = "[[fake:ok]] {pending} still open".into(); // the model never progresses
                                                                     // Nudges come seconds apart here by design; the guard would drop the repeats
                                                                     // (its own tests are in e2e_guard). This tests the nudge's loop protection.
        c.guard.enabled = false;
    })
    .await?;
    let id = rig.client.create_session(Some("loop")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]] plan", None, None, false).await?;
    let stop = rig.wait_record(&id, Action::Nudge, Outcome::Declined, Duration::from_secs(60)).await?;
    assert!(stop.reason.contains("3 nudges without progress"), "{stop:?}");
    settle(&rig, &id).await?;
    assert_eq!(prompts_of_kind(&rig, &id, "nudge").await?.len(), 3);

    // A tool (not the person) makes the agent finish one todo: progress, nudging resumes.
    rig.client.prompt_async(&id, "[[fake:todo:partial]] tick one off", None, None, true).await?;
    shepherd_testbed::client::wait_for("a fourth nudge", PATIENCE, || async {
        prompts_of_kind(&rig, &id, "nudge").await.map(|n| n.len() == 4)
    })
    .await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn review_fires_again_after_the_review_produced_new_todos_up_to_max_rounds() -> anyhow::Result<()> {
    let rig = Rig::start_config(|c| {
        quick(c);
        c.review.max_rounds = 2;
        c.guard.enabled = false; // review rounds seconds apart: see the loop-protection test
                                 // The review makes the agent plan fixes (new open todos); the nudge finishes them.
        c.review.message = "[[fake:todo:create]] Review round {attempts} of {maxAttempts}: run the tests.".into();
        c.nudge.message = "[[fake:todo:done]] Fix: {todoList}".into();
    })
    .await?;
    let id = rig.client.create_session(Some("review loop")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:todo:done]] do it all", None, None, false).await?;
    shepherd_testbed::client::wait_for("two reviews", Duration::from_secs(60), || async {
        prompts_of_kind(&rig, &id, "review").await.map(|r| r.len() == 2)
    })
    .await?;
    settle(&rig, &id).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reviews = prompts_of_kind(&rig, &id, "review").await?;
    assert_eq!(reviews.len(), 2, "bounded by max_rounds");
    assert!(reviews[0].contains("round 1 of 2") && reviews[1].contains("round 2 of 2"), "{reviews:?}");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_shepherd_restart_between_a_completion_and_its_review_sends_exactly_one_review() -> anyhow::Result<()> {
    let state = tempfile::TempDir::new()?;
    let ledger = state.path().join("ledger.sqlite3").display().to_string();
    let mut rig = Rig::start_config(|c| {
        quick(c);
        c.store.backend = shepherd_actors::config::StoreBackend::Sqlite;
        c.store.path = ledger;
        c.recovery.stall_timeout = Duration::from_secs(30);
    })
    .await?;
    let id = rig.client.create_session(Some("restart before review")).await?;
    // The last todo is done mid-turn; the turn then goes on for a while.
    rig.client
        .prompt_async(&id, "[[fake:todo:create]][[fake:todo:done]][[fake:slow:8]] finish up", None, None, false)
        .await?;
    shepherd_testbed::client::wait_for("all todos done", PATIENCE, || async {
        rig.client.todos(&id).await.map(|t| !t.is_empty() && t.iter().all(|t| t.status == "completed"))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(rig.client.is_busy(&id).await?, "still in the turn: no review yet");
    rig.restart_daemon().await?; // Shepherd restarts; only the ledger remembers the completion

    rig.wait_record(&id, Action::Review, Outcome::Done, PATIENCE).await?;
    settle(&rig, &id).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(prompts_of_kind(&rig, &id, "review").await?.len(), 1, "exactly one review");
    rig.stop().await;
    Ok(())
}

/// Shepherd is stopped; meanwhile a session it knew runs a turn that ends with open
/// todos. The restarted Shepherd catches up: the session is nudged, once. A session
/// nothing happened to meanwhile costs the restart no request.
#[actix::test]
async fn a_turn_that_ended_while_shepherd_was_stopped_is_nudged_after_the_restart() -> anyhow::Result<()> {
    let state = tempfile::TempDir::new()?;
    let ledger = state.path().join("ledger.sqlite3").display().to_string();
    let mut proxy = None;
    let mut rig = Rig::start_full(
        |c| {
            quick(c);
            c.store.backend = shepherd_actors::config::StoreBackend::Sqlite;
            c.store.path = ledger;
        },
        |o| o,
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start_clean),
    )
    .await?;
    let faults = std::sync::Arc::clone(&proxy.as_ref().unwrap().faults);
    let requests = || faults.requests.lock().unwrap().clone();

    let quiet = rig.client.create_session(Some("quiet")).await?;
    rig.client.prompt_async(&quiet, "say hello", None, None, false).await?;
    let moved = rig.client.create_session(Some("moved")).await?;
    rig.client.prompt_async(&moved, "say hello", None, None, false).await?;
    settle(&rig, &quiet).await?;
    settle(&rig, &moved).await?;
    // Past the margin allowed for clocks: `quiet` was last updated while watched.
    tokio::time::sleep(Duration::from_secs(6)).await;

    rig.stop_daemon().await;
    rig.client.prompt_async(&moved, "[[fake:todo:create]] plan and stop", None, None, false).await?;
    rig.client.wait_busy(&moved, PATIENCE).await?;
    rig.client.wait_idle(&moved, PATIENCE).await?;
    let before = requests().len();
    rig.start_daemon_again().await?;

    rig.wait_record(&moved, Action::Nudge, Outcome::Done, PATIENCE).await?;
    settle(&rig, &moved).await?;
    let nudges = prompts_of_kind(&rig, &moved, "nudge").await?;
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(nudges[0].contains("3 of 3 todos still open"), "{}", nudges[0]);
    let about_quiet: Vec<_> = requests()[before..].iter().filter(|r| r.contains(quiet.as_str())).cloned().collect();
    assert!(about_quiet.is_empty(), "nothing happened to it: {about_quiet:?}");
    rig.stop().await;
    drop(proxy);
    Ok(())
}
