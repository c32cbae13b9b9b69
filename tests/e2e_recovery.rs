//! Stall recovery against the real OpenCode server, driven by the project's fake model.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::config::RecoveryConfig;
use shepherd_actors::journal::{Action, Outcome};
use support::{fast_recovery, Rig, PATIENCE};

fn user_messages(messages: &[shepherd_testbed::client::Message]) -> Vec<&shepherd_testbed::client::Message> {
    messages.iter().filter(|m| m.role() == "user").collect()
}

fn shepherd_tag(m: &shepherd_testbed::client::Message) -> Option<Value> {
    m.parts.iter().find_map(|p| p.pointer("/metadata/shepherd").cloned())
}

#[actix::test]
async fn stalled_session_is_aborted_and_continued_with_its_todos_then_finishes() -> anyhow::Result<()> {
    let recovery = RecoveryConfig {
        // The fake model reads markers from the last user message: the continue
        // prompt itself tells it to finish the todos.
        continue_with_todos_message:
            "[[fake:todo:done]] Continue, attempt {attempts}/{maxAttempts}. Open {pending} of {total}:\n{todoList}"
                .into(),
        ..fast_recovery()
    };
    // The session runs the `plan` agent, so it is planning: the planning continue is sent.
    let recovery =
        RecoveryConfig { continue_with_plan_message: recovery.continue_with_todos_message.clone(), ..recovery };
    let mut rig = Rig::start(recovery).await?;
    let id = rig.client.create_session(Some("stall")).await?;
    rig.client
        .prompt_async(
            &id,
            "[[fake:todo:create]][[fake:stall]] build it",
            Some("plan"),
            Some(("fake", "fake-model-2")),
            false,
        )
        .await?;

    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert!(stall.numbers.idle_for_ms.unwrap() >= 4000, "{stall:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;

    // The session finished: every todo done, last reply normal.
    let todos = rig.client.todos(&id).await?;
    assert!(!todos.is_empty() && todos.iter().all(|t| t.status == "completed"), "{todos:?}");
    let messages = rig.client.messages(&id).await?;
    let last = messages.last().unwrap();
    assert_eq!(last.finish(), Some("stop"));
    assert!(messages.iter().any(|m| m.error_name() == Some("MessageAbortedError")), "the stall was aborted");

    // Exactly one continue, tagged as Shepherd's, listing the open todos, with the
    // session's own agent and model.
    let users = user_messages(&messages);
    let continues: Vec<_> = users.iter().filter(|m| shepherd_tag(m).is_some_and(|t| t["kind"] == "continue")).collect();
    assert_eq!(continues.len(), 1);
    let c = continues[0];
    assert_eq!(shepherd_tag(c).unwrap()["kind"], "continue");
    assert!(c.parts.iter().any(|p| p["synthetic"] == true));
    let text = c.text();
    assert!(text.contains("attempt 1/3") && text.contains("Open 3 of 3"), "{text}");
    assert_eq!(c.info["agent"], "plan");
    assert_eq!(c.info["model"]["modelID"], "fake-model-2");
    assert_eq!(rig.count(&id, Action::Abort), 1);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_session_waiting_on_a_question_is_never_aborted() -> anyhow::Result<()> {
    let mut rig = Rig::start(fast_recovery()).await?;
    let id = rig.client.create_session(Some("question")).await?;
    rig.client.prompt_async(&id, "[[fake:question]] ask me", None, None, false).await?;
    let dir = rig.opencode.project_dir().to_string_lossy().to_string();
    let question = shepherd_testbed::client::wait_until("a pending question", PATIENCE, || async {
        rig.client.questions(Some(&dir)).await.map(|q| q.into_iter().next())
    })
    .await?;
    // Three stall timeouts of silence: still busy, never touched.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(rig.client.is_busy(&id).await?);
    // Only the observation that it waits (for the notifiers), no action.
    let records = rig.records_for(&id);
    assert_eq!(
        records.iter().map(|(a, o, _)| (*a, *o)).collect::<Vec<_>>(),
        vec![(Action::WaitsOnPerson, Outcome::Done)],
        "no action on a session waiting for a person: {records:?}"
    );

    // Answered, it goes on and finishes by itself.
    let qid = question["id"].as_str().unwrap().to_string();
    rig.client.reply_question(&qid, &[vec!["A".to_string()]]).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert!(rig.client.messages(&id).await?.iter().all(|m| m.error_name().is_none()));
    rig.stop().await;
    Ok(())
}

/// A tool that runs `secs` (stall timeout 4 s × grace 4 = 16 s) ends by itself: no
/// stall is detected, nothing is aborted. With `restart`, Shepherd restarts a second
/// into it — only the stopped Shepherd's memory knew the tool ran; the restarted one
/// learns of it at its first connect.
async fn a_long_tool_runs_its_course(secs: u32, restart: bool) -> anyhow::Result<()> {
    let mut rig = Rig::start(fast_recovery()).await?;
    let id = rig.client.create_session(Some("long tool")).await?;
    rig.client.prompt_async(&id, &format!("[[fake:bash:sleep {secs}]] run it"), None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    if restart {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rig.restart_daemon().await?;
    }
    rig.client.wait_idle(&id, PATIENCE).await?;
    let messages = rig.client.messages(&id).await?;
    assert!(messages.iter().all(|m| m.error_name().is_none()), "nothing was aborted");
    assert!(messages.iter().any(|m| m.tools().iter().any(|(t, s)| t == "bash" && s == "completed")));
    assert_eq!(rig.records_for(&id), vec![]);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_long_running_tool_is_not_aborted_before_the_grace() -> anyhow::Result<()> {
    a_long_tool_runs_its_course(8, false).await // twice the stall timeout
}

#[actix::test]
async fn a_long_running_tool_across_a_shepherd_restart_is_not_aborted_before_the_grace() -> anyhow::Result<()> {
    a_long_tool_runs_its_course(12, true).await // three stall timeouts
}

#[actix::test]
async fn a_user_abort_stops_automation_until_the_user_writes_again() -> anyhow::Result<()> {
    let mut rig = Rig::start(fast_recovery()).await?;
    let id = rig.client.create_session(Some("user abort")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.client.abort(&id).await?; // the person pressed Esc
    rig.wait_record(&id, Action::Pause, Outcome::Done, PATIENCE).await?;

    // Another tool sends a synthetic prompt that stalls: Shepherd keeps its hands off.
    rig.client.prompt_async(&id, "[[fake:stall]] from a tool", None, None, true).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.count(&id, Action::StallDetected), 0, "{:?}", rig.records_for(&id));
    assert!(rig.client.is_busy(&id).await?, "left alone, still stalled");
    rig.client.abort(&id).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;

    // The person writes: automation is back, and the next stall is recovered.
    rig.client.prompt_async(&id, "[[fake:stall]] carry on", None, None, false).await?;
    rig.wait_record(&id, Action::Resume, Outcome::Done, PATIENCE).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn shepherds_own_continue_is_not_progress_so_it_gives_up_after_max_auto_submits() -> anyhow::Result<()> {
    let recovery = RecoveryConfig {
        // Every continue stalls again: no real progress, ever.
        continue_message: "[[fake:stall]] continue (attempt {attempts} of {maxAttempts})".into(),
        max_auto_submits: 2,
        max_recoveries: 5,
        ..fast_recovery()
    };
    let mut rig = Rig::start(recovery).await?;
    let id = rig.client.create_session(Some("no progress")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] go", None, None, false).await?;
    let give_up = rig.wait_record(&id, Action::GiveUp, Outcome::Done, Duration::from_secs(60)).await?;
    assert_eq!(give_up.numbers.auto_submits, Some(2));

    let continues: Vec<String> = rig
        .client
        .messages(&id)
        .await?
        .iter()
        .filter(|m| m.role() == "user" && shepherd_tag(m).is_some_and(|t| t["kind"] == "continue"))
        .map(|m| m.text())
        .collect();
    assert_eq!(continues.len(), 2, "{continues:?}");
    assert!(continues[0].contains("attempt 1 of 2") && continues[1].contains("attempt 2 of 2"), "{continues:?}");
    assert_eq!(rig.count(&id, Action::Resume), 0, "our own prompts are not the person writing");
    assert_eq!(rig.count(&id, Action::Abort), 2);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn malformed_and_unknown_events_disturb_nothing() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut proxy = None;
    let mut rig = Rig::start_via(
        fast_recovery(),
        |o| o,
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start),
    )
    .await?;
    let id = rig.client.create_session(Some("noisy stream")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:stall]] work", None, None, false).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;

    let stats = rig.daemon().pump_stats()[0].1.clone();
    assert!(stats.malformed.load(Ordering::Relaxed) >= 2, "bad frames were seen and skipped");
    assert_eq!(stats.connects.load(Ordering::Relaxed), 1, "the stream was never dropped over bad input");
    // A well-formed lie (a session that does not exist, "busy") is checked before any
    // abort: the status endpoint does not confirm it, so nothing is sent.
    rig.wait_record("ses_ghost", Action::Recover, Outcome::Declined, PATIENCE).await?;
    assert_eq!(rig.count("ses_ghost", Action::Abort), 0);
    let fleet = rig.daemon().fleet().await;
    assert!(fleet.servers[0].events.get("totally.new.event").copied().unwrap_or(0) >= 1, "unknown types are counted");
    rig.stop().await;
    drop(proxy);
    Ok(())
}

#[actix::test]
async fn after_the_stream_comes_back_a_session_that_stalled_unseen_is_found_and_recovered() -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut proxy = None;
    let mut rig = Rig::start_via(
        fast_recovery(),
        |o| o,
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start_clean),
    )
    .await?;
    let faults = std::sync::Arc::clone(&proxy.as_ref().unwrap().faults);

    // The event stream drops; REST still answers. A session starts and stalls unseen.
    faults.cut_events.store(true, Ordering::SeqCst);
    let id = rig.client.create_session(Some("unseen")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work while nobody watches", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(rig.records_for(&id).is_empty());

    // The stream comes back: reconciliation finds the busy session, and its silence
    // is then recovered like any stall.
    faults.cut_events.store(false, Ordering::SeqCst);
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    let stats = rig.daemon().pump_stats()[0].1.clone();
    assert!(stats.connects.load(Ordering::Relaxed) >= 2, "the pump reconnected");
    rig.stop().await;
    drop(proxy);
    Ok(())
}

/// The stream drops while an idle session runs a turn that writes its first todo list:
/// once the stream is back Shepherd reads that list and nudges the session about it,
/// while a session whose list nothing touched meanwhile costs no read (a reconnect
/// used to re-read every list Shepherd knew of — at 100,000 sessions, up to 100,000
/// requests — and never the list of a session that had none before).
#[actix::test]
async fn after_the_stream_comes_back_a_list_written_unseen_is_read_and_nudged_and_an_untouched_one_is_not_read(
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut proxy = None;
    let mut rig = Rig::start_full(
        |c| {
            c.recovery = fast_recovery();
            c.advisor = support::fast_advice();
            // Nudged within a second of going idle (the nudge's own timing is tested in
            // e2e_followup); no reviews, so the finished list asks for nothing.
            c.advisor.new_session = Duration::ZERO;
            c.nudge.user_quiet = Duration::ZERO;
            c.nudge.idle_delay = Duration::from_millis(300);
            c.review.enabled = false;
        },
        |o| o,
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start_clean),
    )
    .await?;
    let faults = std::sync::Arc::clone(&proxy.as_ref().unwrap().faults);
    let requests = || faults.requests.lock().unwrap().clone();
    let knows = |sessions: &[shepherd_actors::control::SessionDetail], id: &str, todos: usize| {
        sessions.iter().any(|s| s.id == id && s.todos.len() == todos)
    };

    // `done` plans and finishes its list in one turn; `moved` only says hello.
    let done = rig.client.create_session(Some("done")).await?;
    rig.client.prompt_async(&done, "[[fake:todo:create]][[fake:todo:done]] plan and finish", None, None, false).await?;
    let moved = rig.client.create_session(Some("moved")).await?;
    rig.client.prompt_async(&moved, "say hello", None, None, false).await?;
    rig.client.wait_idle(&done, PATIENCE).await?;
    rig.client.wait_idle(&moved, PATIENCE).await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !knows(&rig.daemon().ask_sessions().await, &done, 3) {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "Shepherd never saw done's list");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The stream drops; meanwhile `moved` plans three todos and stops.
    rig.cut_the_stream(&faults).await?;
    rig.client.prompt_async(&moved, "[[fake:todo:create]] plan and stop", None, None, false).await?;
    rig.client.wait_busy(&moved, PATIENCE).await?;
    rig.client.wait_idle(&moved, PATIENCE).await?;
    assert!(!knows(&rig.daemon().ask_sessions().await, &moved, 3), "blind while it planned");
    let before = requests().len();

    faults.cut_events.store(false, Ordering::SeqCst);
    rig.wait_record(&moved, Action::Nudge, Outcome::Done, PATIENCE).await?;
    let after: Vec<_> = requests()[before..].to_vec();
    let read_list = |id: &str| after.iter().any(|r| r.starts_with(&format!("GET /session/{id}/todo")));
    assert!(read_list(&moved), "the list written unseen is read: {after:#?}");
    assert!(!read_list(&done), "a list nothing touched is not read again: {after:#?}");
    let nudge = rig.client.messages(&moved).await?.into_iter().rfind(|m| m.role() == "user").unwrap();
    assert_eq!(shepherd_tag(&nudge).unwrap()["kind"], "nudge");
    assert!(rig.client.todos(&moved).await?.iter().all(|t| nudge.text().contains(&t.content)), "{}", nudge.text());
    rig.stop().await;
    drop(proxy);
    Ok(())
}

/// What a session can wait on the person for.
#[derive(Clone, Copy, PartialEq)]
enum Ask {
    Question,
    Permission,
}

/// The stream drops; meanwhile a session asks the person something — busy and silent by
/// design. When the stream is back Shepherd finds the ask (`GET /question`, `GET
/// /permission`): the session is never aborted, however long it waits, and goes on once
/// answered. (Before, its silence ran out the stall timeout and it was aborted.)
async fn asked_while_the_stream_was_down_the_session_is_never_aborted(ask: Ask) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut proxy = None;
    let mut rig = Rig::start_via(
        fast_recovery(),
        |o| match ask {
            Ask::Permission => o.config("permission", serde_json::json!({"bash": "ask"})),
            Ask::Question => o,
        },
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start_clean),
    )
    .await?;
    let faults = std::sync::Arc::clone(&proxy.as_ref().unwrap().faults);
    let id = rig.client.create_session(Some("asked unseen")).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;

    rig.cut_the_stream(&faults).await?;
    let prompt = match ask {
        Ask::Question => "[[fake:question]] ask me",
        Ask::Permission => "[[fake:bash:echo hello]] run it",
    };
    rig.client.prompt_async(&id, prompt, None, None, false).await?;
    let pending = pending_ask(&rig, ask).await?;
    faults.cut_events.store(false, Ordering::SeqCst);
    rig.wait_connected().await?;
    untouched_while_it_waits_then_answered(&mut rig, &id, ask, &pending).await?;
    rig.stop().await;
    drop(proxy);
    Ok(())
}

/// The first pending ask of `kind` in the project's directory, once there is one.
async fn pending_ask(rig: &Rig, kind: Ask) -> anyhow::Result<Value> {
    let dir = rig.opencode.project_dir().to_string_lossy().to_string();
    shepherd_testbed::client::wait_until("a pending ask", PATIENCE, || async {
        let asks = match kind {
            Ask::Question => rig.client.questions(Some(&dir)).await,
            Ask::Permission => rig.client.permissions(Some(&dir)).await,
        };
        asks.map(|a| a.into_iter().next())
    })
    .await
}

/// Three stall timeouts of silence pass: the session is still busy and Shepherd took no
/// action on it (only noted that it waits). Answered, it goes on and finishes with no
/// message aborted.
async fn untouched_while_it_waits_then_answered(rig: &mut Rig, id: &str, kind: Ask, pending: &Value) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(rig.client.is_busy(id).await?);
    let acted: Vec<_> = rig.records_for(id).into_iter().filter(|(a, _, _)| *a != Action::WaitsOnPerson).collect();
    assert!(acted.is_empty(), "no action on a session waiting for a person: {acted:?}");
    let ask_id = pending["id"].as_str().unwrap().to_string();
    match kind {
        Ask::Question => rig.client.reply_question(&ask_id, &[vec!["A".to_string()]]).await?,
        Ask::Permission => rig.client.reply_permission(&ask_id, "once", None).await?,
    }
    rig.client.wait_idle(id, PATIENCE).await?;
    assert!(rig.client.messages(id).await?.iter().all(|m| m.error_name().is_none()), "nothing was aborted");
    Ok(())
}

#[actix::test]
async fn a_question_asked_while_the_stream_was_down_is_found_and_its_session_never_aborted() -> anyhow::Result<()> {
    asked_while_the_stream_was_down_the_session_is_never_aborted(Ask::Question).await
}

#[actix::test]
async fn a_permission_requested_while_the_stream_was_down_is_found_and_its_session_never_aborted(
) -> anyhow::Result<()> {
    asked_while_the_stream_was_down_the_session_is_never_aborted(Ask::Permission).await
}

/// Shepherd restarts while a session waits on a question it saw asked (only its memory
/// knew): the restarted Shepherd reads the pending asks at its first connect, and the
/// session, busy and silent, is never aborted. (Before, it was, a stall timeout after
/// every restart.)
#[actix::test]
async fn a_session_waiting_on_a_question_across_a_shepherd_restart_is_never_aborted() -> anyhow::Result<()> {
    let mut rig = Rig::start(fast_recovery()).await?;
    let id = rig.client.create_session(Some("question across a restart")).await?;
    rig.client.prompt_async(&id, "[[fake:question]] ask me", None, None, false).await?;
    let question = pending_ask(&rig, Ask::Question).await?;
    rig.wait_record(&id, Action::WaitsOnPerson, Outcome::Done, PATIENCE).await?;
    rig.restart_daemon().await?;
    untouched_while_it_waits_then_answered(&mut rig, &id, Ask::Question, &question).await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_password_protected_server_is_supervised_with_basic_auth_from_the_environment() -> anyhow::Result<()> {
    // The variable name is unique to this test; tests share one process environment.
    std::env::set_var("SHEPHERD_TEST_OC_PASSWORD", "s3cret-for-test");
    let mut rig = Rig::start_full(
        |c| c.servers[0].password_env = Some("SHEPHERD_TEST_OC_PASSWORD".into()),
        |o| o.password("s3cret-for-test"),
        Ok,
    )
    .await?;
    let id = rig.client.create_session(Some("secured")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_wrong_password_keeps_the_daemon_running_and_the_server_unready() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::FakeModel;
    use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
    std::env::set_var("SHEPHERD_TEST_WRONG_PASSWORD", "not-the-password");
    let fake = FakeModel::start()?;
    let mut opencode = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake).password("right")).await?;
    let mut server = shepherd_actors::config::ServerConfig::new("locked", opencode.url());
    server.password_env = Some("SHEPHERD_TEST_WRONG_PASSWORD".into());
    server.reconnect_initial = Duration::from_millis(100);
    let mut cfg = shepherd_actors::config::Config { servers: vec![server], ..Default::default() };
    cfg.control.enabled = false;
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    let daemon = shepherd::daemon::Daemon::start(&cfg)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fleet = daemon.fleet().await;
    assert!(!fleet.servers[0].connected, "401 is not a connection");
    assert_eq!(daemon.pump_stats()[0].1.connects.load(std::sync::atomic::Ordering::Relaxed), 0);
    daemon.shutdown().await;
    opencode.stop().await;
    Ok(())
}

#[actix::test]
async fn a_turn_cut_off_by_an_opencode_crash_is_continued_once_after_the_restart() -> anyhow::Result<()> {
    let recovery = shepherd_actors::config::RecoveryConfig {
        continue_message: "[[fake:ok]] The server restarted under you; please continue.".into(),
        stall_timeout: Duration::from_secs(90), // the stall path must not be what acts here
        ..fast_recovery()
    };
    let mut rig = Rig::start(recovery).await?;
    let id = rig.client.create_session(Some("crash")).await?;
    rig.client.prompt_async(&id, "[[fake:slow:20]] a long answer", None, None, false).await?;
    // Mid-answer: the assistant message exists, streaming, not completed.
    shepherd_testbed::client::wait_for("the answer to be streaming", PATIENCE, || async {
        rig.client.messages(&id).await.map(|m| m.iter().any(|m| m.role() == "assistant" && !m.is_completed()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.opencode.kill(); // a crash: no terminal events at all
    rig.opencode.respawn().await?;

    rig.wait_record(&id, Action::Recover, Outcome::Done, Duration::from_secs(75)).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    shepherd_testbed::client::wait_for("the continued turn to finish", PATIENCE, || async {
        rig.client.last_assistant(&id).await.map(|m| m.is_some_and(|m| m.finish() == Some("stop")))
    })
    .await?;
    let continues: Vec<_> = rig
        .client
        .messages(&id)
        .await?
        .into_iter()
        .filter(|m| m.role() == "user" && shepherd_tag(m).is_some_and(|t| t["kind"] == "continue"))
        .collect();
    assert_eq!(continues.len(), 1, "continued exactly once");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn one_shepherd_supervises_two_servers_each_with_its_own_sessions() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::FakeModel;
    use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
    let fake = FakeModel::start()?;
    let mut a = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake)).await?;
    let mut b = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake)).await?;
    let mut cfg = shepherd_actors::config::Config {
        servers: vec![
            shepherd_actors::config::ServerConfig::new("alpha", a.url()),
            shepherd_actors::config::ServerConfig::new("beta", b.url()),
        ],
        recovery: fast_recovery(),
        advisor: support::fast_advice(),
        ..Default::default()
    };
    cfg.control.enabled = false;
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    let daemon = shepherd::daemon::Daemon::start(&cfg)?;
    let mut records = daemon.journal().subscribe();
    let (ca, cb) = (a.client(), b.client());
    let sa = ca.create_session(Some("on alpha")).await?;
    let sb = cb.create_session(Some("on beta")).await?;
    ca.prompt_async(&sa, "[[fake:stall]] a", None, None, false).await?;
    cb.prompt_async(&sb, "[[fake:stall]] b", None, None, false).await?;

    let mut continued = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while continued.len() < 2 {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let r = tokio::time::timeout(left, records.recv()).await??;
        if r.action == Action::Continue && r.outcome == Outcome::Done {
            continued.insert(r.session.clone(), r.server.clone());
        }
    }
    assert_eq!(continued.get(&sa).map(String::as_str), Some("alpha"));
    assert_eq!(continued.get(&sb).map(String::as_str), Some("beta"));
    let fleet = daemon.fleet().await;
    assert!(fleet.sessions.iter().any(|s| s.server == "alpha" && s.id == sa));
    assert!(fleet.sessions.iter().any(|s| s.server == "beta" && s.id == sb));
    daemon.shutdown().await;
    a.stop().await;
    b.stop().await;
    Ok(())
}

#[actix::test]
async fn an_evicted_session_remembers_that_the_person_paused_it() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.supervisor.idle_cleanup = Duration::from_secs(2);
        c.supervisor.cleanup_interval = Duration::from_millis(500);
    })
    .await?;
    let id = rig.client.create_session(Some("evicted")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] one", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.client.abort(&id).await?; // the person takes over
    rig.wait_record(&id, Action::Pause, Outcome::Done, PATIENCE).await?;
    // Quiet past idle_cleanup: the actor leaves memory.
    shepherd_testbed::client::wait_for("the session to be evicted", PATIENCE, || async {
        Ok::<_, std::convert::Infallible>(rig.daemon().fleet().await.sessions.iter().all(|s| s.id != id))
    })
    .await?;
    // A tool (not the person) starts it again and it stalls: the fresh actor resumes
    // from the ledger, still paused, and leaves it alone.
    rig.client.prompt_async(&id, "[[fake:stall]] two", None, None, true).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(rig.count(&id, Action::StallDetected), 0, "{:?}", rig.records_for(&id));
    let detail = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == id).expect("tracked again");
    assert_eq!(detail.paused.as_deref(), Some("user_abort"));
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_runaway_loop_is_aborted_within_seconds_and_continued_once() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.continue_message = "[[fake:ok]] That looped; please go on.".into();
        c.recovery.stall_timeout = Duration::from_secs(60); // the loop is busy and "active": only the loop rule can catch it
        c.review.enabled = false;
    })
    .await?;
    let id = rig.client.create_session(Some("runaway")).await?;
    rig.client.prompt_async(&id, "[[fake:cut]] go", None, None, false).await?;
    let detected = rig.wait_record(&id, Action::StallDetected, Outcome::Done, Duration::from_secs(30)).await?;
    assert!(detected.reason.starts_with("runaway loop"), "{detected:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    shepherd_testbed::client::wait_for("the continued turn to finish", PATIENCE, || async {
        rig.client.last_assistant(&id).await.map(|m| m.is_some_and(|m| m.finish() == Some("stop")))
    })
    .await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert_eq!(rig.count(&id, Action::Abort), 1);
    rig.stop().await;
    Ok(())
}

/// The race of issue 14: OpenCode restarts a moment before the stall timer would fire.
/// While the stream is down the session is unseen, not silent: no stall is decided on
/// the dead server or the freshly restarted one (which lists nothing), and after the
/// reconnect's reconciliation the cut-off turn is continued exactly once.
#[actix::test]
async fn an_opencode_restart_just_before_the_stall_deadline_is_no_stall_and_the_cut_off_turn_is_continued_once(
) -> anyhow::Result<()> {
    let recovery = RecoveryConfig {
        continue_message: "[[fake:ok]] The server restarted under you; please continue.".into(),
        // Longer than a restarted OpenCode's first turn takes to boot (seconds, silent),
        // so the continued turn is not itself a stall.
        stall_timeout: Duration::from_secs(12),
        ..fast_recovery()
    };
    let mut rig = Rig::start(recovery).await?;
    let id = rig.client.create_session(Some("restart race")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;
    shepherd_testbed::client::wait_for("the answer to be streaming", PATIENCE, || async {
        rig.client.messages(&id).await.map(|m| m.iter().any(|m| m.role() == "assistant" && !m.is_completed()))
    })
    .await?;
    // Silent now: wait until the stall deadline is 3 s away, then crash OpenCode (a
    // slow host's late wake-up must not carry the crash past the deadline).
    let deadline_ms = shepherd_testbed::client::wait_until("the stall clock to run", PATIENCE, || async {
        let s = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == id);
        Ok::<_, std::convert::Infallible>(s.and_then(|s| s.stall_timeout_ms.map(|t| s.last_activity_ms + t as i64)))
    })
    .await?;
    let kill_at = deadline_ms - 3000;
    let wait_ms = kill_at - epoch_ms();
    assert!(wait_ms > 0, "the stall deadline is still ahead ({wait_ms} ms)");
    tokio::time::sleep(Duration::from_millis(wait_ms as u64)).await;
    rig.opencode.kill(); // a crash: no terminal events at all
    rig.opencode.respawn().await?;

    let recovered = rig.wait_record(&id, Action::Recover, Outcome::Done, Duration::from_secs(60)).await?;
    assert!(recovered.reason.contains("cut off by a server restart"), "{recovered:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    shepherd_testbed::client::wait_for("the continued turn to finish", PATIENCE, || async {
        rig.client.last_assistant(&id).await.map(|m| m.is_some_and(|m| m.finish() == Some("stop")))
    })
    .await?;
    // Up to the continue of the cut-off turn: no stall, no abort. (What the continued
    // turn does afterwards is not this race: on a loaded machine a restarted OpenCode's
    // first turn can boot silently for longer than the stall timeout, a stall of its own.)
    let records = rig.records_for(&id);
    let until_continued = records.iter().position(|(a, o, _)| *a == Action::Continue && *o == Outcome::Done).unwrap();
    assert!(
        records[..until_continued].iter().all(|(a, _, _)| !matches!(a, Action::StallDetected | Action::Abort)),
        "no stall decided on an unseen session: {records:#?}"
    );
    let cut_off = records.iter().filter(|(a, _, why)| *a == Action::Recover && why.contains("cut off")).count();
    assert_eq!(cut_off, 1, "the cut-off turn is continued exactly once: {records:#?}");
    rig.stop().await;
    Ok(())
}

fn epoch_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// What a recovery asks of OpenCode, counted at the wire (a proxy between Shepherd and
/// the real server): the status check before the abort, the abort, the session's
/// messages and todos for the continue, the continue — five; the wait for the abort's
/// idle reads the session's own events, not `/session/status`. A session that sits idle
/// meanwhile costs nothing.
#[actix::test]
async fn a_recovery_costs_five_rest_calls_and_an_idle_session_none() -> anyhow::Result<()> {
    let mut proxy = None;
    let mut rig = Rig::start_full(
        |c| {
            c.recovery = fast_recovery();
            c.advisor = support::fast_advice();
        },
        |o| o,
        support::faulty_proxy::via(&mut proxy, support::faulty_proxy::FaultyProxy::start_clean),
    )
    .await?;
    let faults = std::sync::Arc::clone(&proxy.as_ref().unwrap().faults);
    let requests = || faults.requests.lock().unwrap().clone();

    let quiet = rig.client.create_session(Some("idle")).await?;
    rig.client.prompt_async(&quiet, "say hello", None, None, false).await?;
    rig.client.wait_idle(&quiet, PATIENCE).await?;
    // What Shepherd asks as the turn ends is done once a second passes without a call
    // about it (on a slow host it may come late).
    let about = |quiet: &str| requests().iter().filter(|r| r.contains(quiet)).count();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let before = about(&quiet);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if about(&quiet) == before || tokio::time::Instant::now() > deadline {
            break;
        }
    }
    let since_idle = requests().len();

    let id = rig.client.create_session(Some("stall")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:stall]] build it", None, None, false).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;

    let log = requests();
    let abort = log.iter().position(|r| *r == format!("POST /session/{id}/abort")).expect("aborted");
    let check = log[..abort].iter().rposition(|r| r.starts_with("GET /session/status")).expect("busy checked first");
    let prompt = log.iter().position(|r| *r == format!("POST /session/{id}/prompt_async")).expect("continued");
    let recovery: Vec<_> =
        log[check..=prompt].iter().filter(|r| r.contains(id.as_str()) || r.starts_with("GET /session/status")).collect();
    assert!(recovery.len() <= 5, "{} calls for one recovery: {recovery:#?}", recovery.len());
    assert!(!log[abort..prompt].iter().any(|r| r.starts_with("GET /session/status")), "{recovery:#?}");
    let about_the_idle_one: Vec<_> = log[since_idle..].iter().filter(|r| r.contains(quiet.as_str())).collect();
    assert!(about_the_idle_one.is_empty(), "the idle session was asked about: {about_the_idle_one:?}");
    rig.stop().await;
    drop(proxy);
    Ok(())
}
