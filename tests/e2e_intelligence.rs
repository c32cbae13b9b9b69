//! Recovery intelligence against the real OpenCode server, driven by the fake model:
//! tool calls written as text, repeated continues, spinning tools, planning.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::client::Message;
use support::{Rig, PATIENCE};

fn shepherd_tag(m: &Message) -> Option<Value> {
    m.parts.iter().find_map(|p| p.pointer("/metadata/shepherd").cloned())
}

/// The texts of Shepherd's continues to `id`, oldest first.
async fn continues(rig: &Rig, id: &str) -> anyhow::Result<Vec<String>> {
    Ok(rig
        .client
        .messages(id)
        .await?
        .iter()
        .filter(|m| m.role() == "user" && shepherd_tag(m).is_some_and(|t| t["kind"] == "continue"))
        .map(Message::text)
        .collect())
}

#[actix::test]
async fn a_stalled_session_that_wrote_a_tool_call_as_text_gets_the_specialised_prompt() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.tool_call_as_text_message = "[[fake:ok]] TOOL-AS-TEXT {pattern}: call it properly.".into();
        c.recovery.continue_message = "[[fake:ok]] PLAIN continue".into();
    })
    .await?;
    let id = rig.client.create_session(Some("xml tool")).await?;
    // The reply writes an XML-ish call, cut off before its closing tags, then stalls.
    rig.client
        .prompt_async(
            &id,
            "[[fake:saystall:I will list the files.\n<function=bash><parameter=command>ls]] look around",
            None,
            None,
            false,
        )
        .await?;

    let cont = rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert!(cont.reason.contains("<function="), "the record says which pattern: {}", cont.reason);
    let sent = continues(&rig, &id).await?;
    assert_eq!(sent, vec!["[[fake:ok]] TOOL-AS-TEXT <function=: call it properly.".to_string()]);
    rig.client.wait_idle(&id, PATIENCE).await?;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn jsx_in_a_code_block_is_not_taken_for_a_tool_call() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.tool_call_as_text_message = "[[fake:ok]] TOOL-AS-TEXT {pattern}".into();
        c.recovery.continue_message = "[[fake:ok]] PLAIN continue".into();
    })
    .await?;
    let id = rig.client.create_session(Some("jsx page")).await?;
    let reply = "Here is the page:\n```jsx\nexport default function Toolbar() {\n  return <div className=\"bar\"><execute>Run</execute><TOOL>hammer</TOOL></div>;\n}\n```\nNow the styles";
    rig.client.prompt_async(&id, &format!("[[fake:saystall:{reply}]] build the page"), None, None, false).await?;

    let cont = rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert_eq!(cont.reason, "continue sent after the abort");
    assert_eq!(continues(&rig, &id).await?, vec!["[[fake:ok]] PLAIN continue".to_string()]);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn an_idle_session_that_wrote_a_tool_call_as_text_is_nudged_with_the_specialised_prompt() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.tool_call_as_text_message = "[[fake:todo:done]] TOOL-AS-TEXT {pattern} ({pending} open)".into();
        c.nudge.user_quiet = Duration::from_millis(100);
        c.review.enabled = false;
    })
    .await?;
    let id = rig.client.create_session(Some("xml nudge")).await?;
    // Todos, then a reply that only writes the call as text and ends normally.
    rig.client.prompt_async(&id, "[[fake:todo:create]][[fake:xmltool]] work", None, None, false).await?;
    let nudge = rig.wait_record(&id, Action::Nudge, Outcome::Done, PATIENCE).await?;
    assert!(nudge.reason.contains("<function="), "{}", nudge.reason);
    let nudges: Vec<String> = rig
        .client
        .messages(&id)
        .await?
        .iter()
        .filter(|m| shepherd_tag(m).is_some_and(|t| t["kind"] == "nudge"))
        .map(Message::text)
        .collect();
    assert_eq!(nudges, vec!["[[fake:todo:done]] TOOL-AS-TEXT <function= (3 open)".to_string()]);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn three_continues_without_progress_escalate_to_a_compaction_instead_of_a_fourth() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        // Every continue stalls again: no real progress, ever.
        c.recovery.continue_message = "[[fake:stall]] continue (attempt {attempts})".into();
        c.recovery.max_recoveries = 10;
        c.recovery.max_auto_submits = 10;
        c.review.enabled = false;
        c.nudge.enabled = false;
        c.handoff.enabled = false; // without hand-off, the escalation compacts
    })
    .await?;
    let id = rig.client.create_session(Some("repeated continues")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] go", None, None, false).await?;

    let esc = rig.wait_record(&id, Action::Escalate, Outcome::Done, Duration::from_secs(90)).await?;
    assert_eq!(esc.numbers.round, Some(3), "{esc:?}");
    assert_eq!(rig.count(&id, Action::Continue), 3, "escalated instead of a fourth continue");
    let compact = rig.wait_record(&id, Action::Compact, Outcome::Done, PATIENCE).await?;
    assert!(compact.reason.contains("escalation"), "{}", compact.reason);
    // The compacted session is continued (the one continue after the escalation).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while rig.count(&id, Action::Continue) < 4 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "no continue after the compaction");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let messages = rig.client.messages(&id).await?;
    assert!(
        messages.iter().any(|m| m.info["summary"] == true || m.parts.iter().any(|p| p["type"] == "compaction")),
        "OpenCode compacted the session"
    );
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn with_hand_off_enabled_three_continues_escalate_to_a_hand_off() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.continue_message = "[[fake:stall]] continue (attempt {attempts})".into();
        c.recovery.max_recoveries = 10;
        c.recovery.max_auto_submits = 10;
        c.review.enabled = false;
        c.nudge.enabled = false;
        c.handoff.enabled = true;
        c.handoff.ask_model = false;
        c.handoff.resume_message = "[[fake:ok]] carry on from the continuation".into();
    })
    .await?;
    let id = rig.client.create_session(Some("repeated continues, hand-off")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] go", None, None, false).await?;

    let esc = rig.wait_record(&id, Action::Escalate, Outcome::Done, Duration::from_secs(90)).await?;
    assert!(esc.reason.contains("hand_off"), "{}", esc.reason);
    assert_eq!(rig.count(&id, Action::Continue), 3, "escalated instead of a fourth continue");
    // The hand-off runs to its end: the work continues in a fresh session.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let records = rig.records_for(&id);
        if let Some((_, outcome, reason)) = records
            .iter()
            .find(|(a, o, r)| *a == Action::Handoff && (*o == Outcome::Failed || r.contains("the work continues in")))
        {
            assert_eq!(*outcome, Outcome::Done, "the hand-off failed: {reason}");
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the hand-off never finished: {records:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(rig.count(&id, Action::Continue), 3, "no continue to the old session after the hand-off");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn the_same_tool_call_again_and_again_is_reported_as_spinning() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.loops.spin_count = 3;
        c.review.enabled = false;
    })
    .await?;
    let id = rig.client.create_session(Some("spinning")).await?;
    rig.client
        .prompt_async(
            &id,
            "[[fake:bash:echo same]][[fake:bash:echo same]][[fake:bash:echo same]][[fake:bash:echo same]] loop",
            None,
            None,
            false,
        )
        .await?;
    let spin = rig.wait_record(&id, Action::SpinningTool, Outcome::Done, PATIENCE).await?;
    assert!(spin.reason.contains("bash"), "{}", spin.reason);
    assert_eq!(spin.numbers.round, Some(3));
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert_eq!(rig.count(&id, Action::SpinningTool), 1, "reported once per run");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_planning_agent_gets_the_planning_timeout_and_the_plan_continue() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.recovery.stall_timeout = Duration::from_secs(3);
        c.recovery.planning_timeout = Duration::from_secs(9);
        c.recovery.continue_with_plan_message = "[[fake:ok]] PLAN continue".into();
    })
    .await?;
    let id = rig.client.create_session(Some("planning")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] plan the work", Some("plan"), None, false).await?;

    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert!(stall.reason.contains("planning"), "{}", stall.reason);
    assert_eq!(stall.numbers.timeout_ms, Some(9_000));
    assert!(stall.numbers.idle_for_ms.unwrap() >= 9_000, "not the 3 s stall timeout: {stall:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert_eq!(continues(&rig, &id).await?, vec!["[[fake:ok]] PLAN continue".to_string()]);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn the_status_file_shows_each_sessions_recoveries_and_is_valid_after_every_write() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("status.json");
    std::fs::write(&path, "{\"previous\": \"run\"}")?;
    let file = path.display().to_string();
    let mut rig = Rig::start_config(|c| {
        c.status.enabled = true;
        c.status.path = file;
        c.status.min_interval = Duration::from_millis(200);
        c.status.refresh_interval = Duration::from_secs(1);
        c.recovery.continue_message = "[[fake:ok]] go on".into();
    })
    .await?;
    assert!(dir.path().join("status.json.1").exists(), "the previous file was rotated at start-up");
    let id = rig.client.create_session(Some("status")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;

    // Read the file while the daemon writes it: every read is a whole document.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let doc = loop {
        let text = std::fs::read_to_string(&path)?;
        let doc: shepherd_actors::stats::StatusDocument =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("torn status file: {e}"))?;
        if doc.sessions.get(&id).is_some_and(|s| s.recovery.successes == 1) {
            break doc;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the status file never showed the recovery");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let s = &doc.sessions[&id];
    assert_eq!(s.server, "local");
    assert_eq!((s.recovery.attempts, s.recovery.failures), (1, 0));
    assert_eq!(s.recovery.histogram.samples, 1);
    assert!(s.recovery.histogram.min_ms.unwrap() > 0);
    assert_eq!(s.stall.detections, 1);
    assert!(!s.stall.patterns.is_empty() && s.stall.last_part.is_some(), "{:?}", s.stall);
    assert!(s.history.iter().any(|h| h.action == Action::Abort), "{:?}", s.history);
    let text = shepherd::status::render::render_status(&doc, doc.timestamp);
    assert!(text.contains(&id) && text.contains("1 attempts, 1 succeeded"), "{text}");
    assert_eq!(doc.stopped_at_ms, None, "running");
    rig.stop().await;

    // The last write says Shepherd stopped, and keeps the session as last seen live.
    let last: shepherd_actors::stats::StatusDocument = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    assert!(last.stopped_at_ms.is_some_and(|at| at >= doc.timestamp), "{:?}", last.stopped_at_ms);
    // As last read live (busy or idle: the live read is every second), not "untracked",
    // which a read after the supervisor let the sessions go made of every one.
    let status = last.sessions.get(&id).map(|s| s.status.as_str());
    assert!(matches!(status, Some("busy" | "idle")), "{:?}", last.sessions.get(&id));
    Ok(())
}
