//! Crash consistency on a real OpenCode: `shepherd run` kills itself (`SIGKILL`) at a
//! named step (`SHEPHERD_KILL_AT`) of a stall recovery or a hand-off, is started again
//! on the same ledger, and the session ends with exactly one continue, or exactly one
//! fresh session holding one continuation and one resume prompt — none lost, none
//! repeated.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::config::Config;
use shepherd_actors::killpoint::step;
use shepherd_testbed::client::wait_until;
use support::process::ShepherdProcess;
use support::{fresh_sessions, tagged, Rig, PATIENCE};
use tempfile::TempDir;

fn is_action(v: &Value, session: &str, action: &str) -> bool {
    v["target"] == "shepherd::action" && v["session"] == session && v["action"] == action
}

/// Starts a Shepherd that kills itself at `kill_at`, has `start` begin the work on a
/// session, waits for the `SIGKILL`, and starts a second Shepherd on the same ledger.
async fn kill_and_restart(
    dir: &TempDir,
    rig: &Rig,
    kill_at: &str,
    start: &str,
) -> anyhow::Result<(String, ShepherdProcess)> {
    let file = dir.path().join("shepherd.toml");
    let mut first = ShepherdProcess::run(&file, Some(kill_at))?;
    first.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    let id = rig.client.create_session(Some(&format!("crash at {kill_at}"))).await?;
    rig.client.prompt_async(&id, start, None, None, false).await?;
    let died = tokio::time::timeout(PATIENCE * 2, first.child.wait()).await??;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(died.signal(), Some(libc::SIGKILL), "Shepherd killed itself at {kill_at}: {died:?}");
    Ok((id, ShepherdProcess::run(&file, None)?))
}

/// The restarted Shepherd sends a continue (its record, returned), the turn it starts
/// finishes, and the session holds exactly one continue — still one a stall timeout
/// later, and idle: its work went on once.
async fn one_continue_and_then_quiet(
    rig: &Rig,
    second: &mut ShepherdProcess,
    id: &str,
    cfg: &Config,
    crash: &str,
) -> anyhow::Result<Value> {
    let cont = second.wait_log("a continue sent", |v| is_action(v, id, "continue") && v["outcome"] == "done").await?;
    let finished = wait_until("the continued turn to finish", PATIENCE, || async {
        let msgs = rig.client.messages(id).await?;
        let done = msgs.last().is_some_and(|m| m.role() == "assistant" && m.finish() == Some("stop"));
        anyhow::Ok(done.then_some(msgs))
    })
    .await?;
    assert_eq!(tagged(&finished, "continue").len(), 1, "exactly one continue after a crash ({crash})");
    tokio::time::sleep(cfg.recovery.stall_timeout + Duration::from_secs(1)).await;
    let later = rig.client.messages(id).await?;
    assert_eq!(tagged(&later, "continue").len(), 1, "still one continue after a crash ({crash})");
    assert!(!rig.client.is_busy(id).await?, "the session is idle, its work continued once ({crash})");
    Ok(cont)
}

/// A stall, recovered by a Shepherd that dies at `kill_at` and is started again on the
/// same ledger: the session gets exactly one continue and finishes its turn.
async fn crash_during_a_recovery_loses_and_repeats_nothing(kill_at: &str) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let (mut rig, cfg) = Rig::for_process(&dir, |_| {}).await?;
    let (id, mut second) = kill_and_restart(&dir, &rig, kill_at, "[[fake:stall]] work on it").await?;
    let result = async {
        one_continue_and_then_quiet(&rig, &mut second, &id, &cfg, kill_at).await
    }
    .await;
    let moot = second.seen.iter().any(|v| {
        is_action(v, &id, "continue")
            && v["outcome"] == "declined"
            && v["reason"].as_str().is_some_and(|r| r.contains("the abort never took effect"))
    });
    second.stop().await;
    rig.opencode.stop().await;
    let cont = result?;
    let reason = cont["reason"].as_str().unwrap_or_default();
    if kill_at == step::RECOVER_BEFORE_ABORT {
        // The abort never went out: the intent was found moot, and a recovery of the
        // second Shepherd's own sent the continue.
        assert!(!reason.starts_with("unfinished"), "a new recovery: {cont}");
        assert!(moot, "the open intent was looked at and found moot");
    } else {
        // The second Shepherd finished what the first began (the first never wrote it).
        assert!(reason.starts_with("unfinished"), "resumed, not a new recovery: {cont}");
    }
    Ok(())
}

#[actix::test]
async fn killed_after_ledgering_the_recovery_but_before_the_abort() -> anyhow::Result<()> {
    // The abort never went out: after the restart the session is still stalled, the
    // intent is moot, and the usual recovery sends the one continue.
    crash_during_a_recovery_loses_and_repeats_nothing(step::RECOVER_BEFORE_ABORT).await
}

#[actix::test]
async fn killed_between_the_abort_and_the_continue() -> anyhow::Result<()> {
    crash_during_a_recovery_loses_and_repeats_nothing(step::RECOVER_AFTER_ABORT).await
}

#[actix::test]
async fn killed_after_the_continue_was_sent_but_before_it_was_ledgered() -> anyhow::Result<()> {
    crash_during_a_recovery_loses_and_repeats_nothing(step::PROMPT_AFTER_SEND).await
}

/// A filling session handed off by a Shepherd that dies at `kill_at` and is started
/// again: one fresh session, one continuation in it, one resume prompt, and it works.
async fn crash_during_a_hand_off_hands_off_once(kill_at: &str) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let (mut rig, _) = Rig::for_process(&dir, |c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.handoff.ask_model = false;
    })
    .await?;
    let start = "[[fake:todo:create]] [[fake:bigusage:170000]] Port the parser to Rust.";
    let (old, mut second) = kill_and_restart(&dir, &rig, kill_at, start).await?;
    let result = async {
        let done = second
            .wait_log("the hand-off completed", |v| {
                is_action(v, &old, "handoff") && v["reason"].as_str().is_some_and(|r| r.starts_with("the work continues in"))
            })
            .await?;
        let fresh = fresh_sessions(&rig).await?;
        assert_eq!(fresh.len(), 1, "exactly one fresh session after a crash at {kill_at}: {fresh:#?}");
        let new = fresh[0]["id"].as_str().unwrap_or_default().to_string();
        assert!(done["reason"].as_str().is_some_and(|r| r.contains(&new)), "{done}");
        let messages = wait_until("the fresh session's reply", PATIENCE, || async {
            let m = rig.client.messages(&new).await?;
            let answered = m.iter().any(|m| m.role() == "assistant" && m.is_completed());
            anyhow::Ok(answered.then_some(m))
        })
        .await?;
        assert_eq!(tagged(&messages, "handoff_continuation").len(), 1, "one continuation ({kill_at})");
        assert_eq!(tagged(&messages, "handoff").len(), 1, "one resume prompt ({kill_at})");
        anyhow::Ok(())
    }
    .await;
    if result.is_err() {
        for v in second.seen.iter().filter(|v| v["target"] == "shepherd::action" || v["level"] == "WARN") {
            eprintln!("second shepherd: {v}");
        }
    }
    second.stop().await;
    rig.opencode.stop().await;
    result
}

#[actix::test]
async fn killed_after_the_hand_off_snapshot_was_stored() -> anyhow::Result<()> {
    crash_during_a_hand_off_hands_off_once(step::HANDOFF_AFTER_PERSISTING).await
}

#[actix::test]
async fn killed_after_the_fresh_session_was_created_before_its_continuation() -> anyhow::Result<()> {
    crash_during_a_hand_off_hands_off_once(step::HANDOFF_AFTER_CREATE).await
}

#[actix::test]
async fn killed_after_the_continuation_was_delivered() -> anyhow::Result<()> {
    crash_during_a_hand_off_hands_off_once(step::HANDOFF_AFTER_HANDING_OVER).await
}

#[actix::test]
async fn killed_after_the_resume_prompt_was_sent() -> anyhow::Result<()> {
    crash_during_a_hand_off_hands_off_once(step::HANDOFF_AFTER_RESUMING).await
}

/// Killed while its own compaction runs (the summary call hangs): restarted, Shepherd
/// finds the session busy and silent, and recovers it once — the session is not left
/// compacting forever, and gets exactly one continue.
#[actix::test]
async fn killed_in_the_middle_of_its_own_compaction() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::Behaviour;
    let dir = TempDir::new()?;
    let (mut rig, cfg) = Rig::for_process(&dir, |c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.handoff.enabled = false;
        c.recovery.continue_message = "[[fake:ok]] Please continue.".into();
        c.recovery.continue_with_todos_message = "[[fake:ok]] Please continue with {pending} todos.".into();
    })
    .await?;
    let file = dir.path().join("shepherd.toml");
    let mut first = ShepherdProcess::run(&file, None)?;
    first.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    let id = rig.client.create_session(Some("killed mid-compaction")).await?;
    // The summary call Shepherd's compaction makes sends two chunks, then nothing.
    rig.fake.set_helper_behaviour(Some(Behaviour::Stall(None)));
    // 145k of 200k: past compaction.proactive (0.7) at the end of the turn.
    rig.client.prompt_async(&id, "[[fake:todo:create]] [[fake:bigusage:145000]] read everything", None, None, false).await?;
    let asked = rig.fake.wait_for_requests(PATIENCE, |log| log.iter().any(|r| r.marker() == "helper:stall")).await;
    assert!(asked, "the summary was asked for: {:?}", rig.fake.requests().iter().map(|r| r.marker()).collect::<Vec<_>>());
    rig.fake.set_helper_behaviour(None);
    first.signal(libc::SIGKILL);
    let _ = tokio::time::timeout(PATIENCE, first.child.wait()).await?;

    let mut second = ShepherdProcess::run(&file, None)?;
    let result = async {
        one_continue_and_then_quiet(&rig, &mut second, &id, &cfg, "mid-compaction").await
    }
    .await;
    if result.is_err() {
        for v in second.seen.iter().filter(|v| v["target"] == "shepherd::action" || v["level"] == "WARN") {
            eprintln!("second shepherd: {v}");
        }
    }
    second.stop().await;
    rig.opencode.stop().await;
    result.map(drop)
}
