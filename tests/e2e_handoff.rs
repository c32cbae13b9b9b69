//! The hand-off (rollover) on the real OpenCode server, driven by the fake model: a
//! session whose context fills up moves to a fresh session that receives a continuation
//! built from structured state, then a resume prompt, and works on.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::config::{Config, HandoffMode, StoreBackend};
use shepherd_actors::journal::Action;
use support::{fresh_sessions, tagged, Rig, PATIENCE};
use tempfile::TempDir;

/// Looks like a GitHub token: must never reach a continuation.
const SECRET: &str = "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Nudges and reviews off (the only prompts are the hand-off's); a real SQLite ledger
/// in `state`, so snapshots and phases survive a Shepherd restart.
fn configure(c: &mut Config, state: &TempDir) {
    c.nudge.enabled = false;
    c.review.enabled = false;
    c.store.backend = StoreBackend::Sqlite;
    c.store.path = state.path().join("ledger.sqlite3").to_string_lossy().into_owned();
}

#[actix::test]
async fn a_session_past_prepare_is_handed_to_a_fresh_session_that_receives_the_continuation_and_works(
) -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| configure(c, &state)).await?;
    let old = rig.client.create_session(Some("parser port")).await?;
    // Todos, then a reply whose prompt filled 85% of the 200k window (prepare is 80%).
    rig.client
        .prompt_async(
            &old,
            &format!("[[fake:todo:create]] [[fake:bigusage:170000]] Port the parser to Rust. Deploy key: {SECRET}"),
            None,
            None,
            false,
        )
        .await?;
    let done = rig.wait_phase(&old, "completed", PATIENCE * 2).await?;
    let fresh = fresh_sessions(&rig).await?;
    assert_eq!(fresh.len(), 1, "exactly one fresh session: {fresh:#?}");
    let new = fresh[0]["id"].as_str().unwrap().to_string();
    assert!(done.reason.contains(&new), "{done:?}");
    assert_eq!(fresh[0]["metadata"]["shepherd"]["handoff_from"], old.as_str(), "old → new is linked");
    assert_eq!(fresh[0]["directory"], rig.client.session(&old).await?["directory"], "same directory");

    // The fresh session got the continuation (as a note), then the resume prompt, then worked.
    rig.client.wait_idle(&new, PATIENCE).await?;
    let messages = shepherd_testbed::client::wait_until("the fresh session's reply", PATIENCE, || async {
        let m = rig.client.messages(&new).await?;
        let answered = m.iter().any(|m| m.role() == "assistant" && m.is_completed());
        Ok::<_, shepherd_testbed::client::ClientError>(answered.then_some(m))
    })
    .await?;
    let continuation = tagged(&messages, "handoff_continuation");
    assert_eq!(continuation.len(), 1, "one continuation");
    let c = &continuation[0];
    assert!(c.contains(&format!("# Continuation of session {old}")), "{c}");
    let objective = c.split("## Objective").nth(1).and_then(|rest| rest.split("\n## ").next()).unwrap_or_default();
    assert!(objective.contains("Port the parser to Rust"), "the objective is the person's request: {c}");
    assert!(!c.contains(SECRET) && objective.contains("[REDACTED]"), "secrets are redacted: {c}");
    assert!(c.contains("- [ ] (in progress) Write the parser") && c.contains("- [ ] Add tests"), "{c}");
    assert!(c.contains("85% full (170000 of 200000 tokens)"), "{c}");
    assert!(c.contains("In the previous model's own words"), "the model was asked in a fork: {c}");
    let resume = tagged(&messages, "handoff");
    assert_eq!(resume.len(), 1, "one resume prompt");
    assert!(resume[0].contains(&old), "{resume:?}");
    let user_agent = messages.iter().rev().find(|m| m.role() == "user").map(|m| m.info["agent"].clone());
    assert_eq!(user_agent, Some(Value::from("build")), "the old session's agent");

    // The old session is left untouched: its one user message, no nudge or continue.
    assert_eq!(rig.client.user_message_count(&old).await?, 1);
    // The fork the model was asked in is gone.
    let all = rig.client.get_json("/session?limit=100").await?;
    assert_eq!(all.as_array().map(Vec::len), Some(3), "warm-up, old and new only: {all:#}");
    // The continuation is also on disk, readable.
    let id = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == old).unwrap().handoff.id.unwrap();
    let md = std::fs::read_to_string(state.path().join("handoffs").join(format!("{id}.md")))?;
    assert_eq!(&md, c);
    assert_eq!(rig.count(&old, Action::Compact), 0, "the hand-off went first, no compaction");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn growing_readings_drive_the_phases_in_order_with_one_soft_note_between_turns() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        configure(c, &state);
        c.compaction.enabled = false; // readings only grow here
        c.handoff.ask_model = false;
    })
    .await?;
    let id = rig.client.create_session(Some("growing")).await?;
    // 76%: past soft. The note waits for the turn to end, then is stored without a turn.
    rig.client.prompt_async(&id, "[[fake:bigusage:152000]] first part", None, None, false).await?;
    rig.wait_phase(&id, "preparing", PATIENCE).await?;
    rig.wait_record(&id, Action::Note, shepherd_actors::journal::Outcome::Done, PATIENCE).await?;
    let notes = tagged(&rig.client.messages(&id).await?, "note");
    assert_eq!(notes.len(), 1, "one soft note");
    assert!(notes[0].contains("76% used"), "{notes:?}");
    assert!(!rig.client.is_busy(&id).await?, "a noReply note runs no turn");
    // 82%: past prepare. The hand-off starts when this turn ends.
    rig.client.prompt_async(&id, "[[fake:bigusage:164000]] second part", None, None, false).await?;
    rig.wait_phase(&id, "completed", PATIENCE).await?;
    let phases: Vec<String> = {
        let _ = rig.records_for(&id);
        rig.seen
            .iter()
            .filter(|r| r.session == id && r.action == Action::Handoff)
            .filter_map(|r| r.numbers.phase.clone())
            .collect()
    };
    assert_eq!(phases, ["preparing", "ready", "persisting", "handing_over", "resuming", "completed"]);
    assert_eq!(tagged(&rig.client.messages(&id).await?, "note").len(), 1, "still one note");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_shepherd_restarted_mid_hand_off_finishes_the_same_hand_off_once() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        configure(c, &state);
        // The model takes its time to answer the hand-off question: Shepherd stops meanwhile.
        c.handoff.question_message = "[[fake:slow:6]] For your successor: objective, status, next steps.".into();
    })
    .await?;
    let old = rig.client.create_session(Some("restart me")).await?;
    rig.client.prompt_async(&old, "[[fake:bigusage:170000]] Keep going", None, None, false).await?;
    rig.wait_phase(&old, "persisting", PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.restart_daemon().await?;
    rig.seen.clear();
    let done = rig.wait_phase(&old, "completed", PATIENCE * 2).await?;
    let fresh = fresh_sessions(&rig).await?;
    assert_eq!(fresh.len(), 1, "no second fresh session: {fresh:#?}");
    let new = fresh[0]["id"].as_str().unwrap();
    assert!(done.reason.contains(new), "{done:?}");
    let records = rig.records_for(&old);
    assert!(records.iter().any(|(_, _, why)| why.contains("resuming the hand-off")), "{records:#?}");
    let messages = rig.client.messages(new).await?;
    assert_eq!(tagged(&messages, "handoff_continuation").len(), 1);
    assert_eq!(tagged(&messages, "handoff").len(), 1);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn manual_mode_persists_and_the_person_resumes_the_snapshot_once() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        configure(c, &state);
        c.handoff.mode = HandoffMode::Manual;
        c.handoff.ask_model = false;
    })
    .await?;
    let old = rig.client.create_session(Some("by hand")).await?;
    rig.client.prompt_async(&old, "[[fake:bigusage:170000]] Read everything", None, None, false).await?;
    let waiting = rig.wait_phase(&old, "awaiting_manual", PATIENCE).await?;
    assert!(waiting.reason.contains("shepherd handoff --resume hf_"), "{waiting:?}");
    assert!(fresh_sessions(&rig).await?.is_empty(), "manual: nothing is created by itself");
    let id = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == old).unwrap().handoff.id.unwrap();

    let view = rig.daemon().resume_handoff(&id).await?;
    assert_eq!(view.id.as_deref(), Some(id.as_str()));
    rig.wait_phase(&old, "completed", PATIENCE).await?;
    assert_eq!(fresh_sessions(&rig).await?.len(), 1);
    // The snapshot is restored once: resuming it again finds the same fresh session and
    // delivers nothing twice.
    rig.seen.clear();
    rig.daemon().resume_handoff(&id).await?;
    rig.wait_phase(&old, "completed", PATIENCE).await?;
    let fresh = fresh_sessions(&rig).await?;
    assert_eq!(fresh.len(), 1, "still one");
    let messages = rig.client.messages(fresh[0]["id"].as_str().unwrap()).await?;
    assert_eq!(tagged(&messages, "handoff_continuation").len(), 1);
    assert_eq!(tagged(&messages, "handoff").len(), 1);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn an_overflow_opencode_compacts_by_itself_while_busy_is_left_alone() -> anyhow::Result<()> {
    // Busy: OpenCode compacts by itself (auto on) and goes on; Shepherd does nothing.
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| configure(c, &state)).await?;
    let id = rig.client.create_session(Some("overflow, auto on")).await?;
    rig.client.prompt_async(&id, "[[fake:ctx400]] too much", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.count(&id, Action::Compact), 0, "{:#?}", rig.records_for(&id));
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn compact_mode_summarises_the_same_session_and_resumes_it_there() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        configure(c, &state);
        c.handoff.mode = HandoffMode::Compact;
        c.handoff.ask_model = false;
    })
    .await?;
    let id = rig.client.create_session(Some("compact me")).await?;
    rig.client
        .prompt_async(&id, "[[fake:todo:create]] [[fake:bigusage:170000]] Keep porting", None, None, false)
        .await?;
    let done = rig.wait_phase(&id, "completed", PATIENCE).await?;
    assert!(done.reason.contains(&id), "the work continues in the same session: {done:?}");
    assert!(fresh_sessions(&rig).await?.is_empty(), "no new session in compact mode");
    rig.client.wait_idle(&id, PATIENCE).await?;
    let messages = rig.client.messages(&id).await?;
    assert!(messages.iter().any(|m| m.role() == "assistant" && m.info["summary"] == true), "OpenCode summarised");
    assert_eq!(tagged(&messages, "handoff_continuation").len(), 1);
    assert_eq!(tagged(&messages, "handoff").len(), 1);
    let detail = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == id).unwrap();
    assert_eq!(detail.handoff.phase, "monitoring", "the work goes on here: watched again");
    rig.stop().await;
    Ok(())
}
