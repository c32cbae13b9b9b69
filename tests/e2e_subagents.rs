//! Parents and their subagents on the real OpenCode server.

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd_actors::journal::{Action, Outcome};
use support::{Rig, PATIENCE};

async fn child_of(rig: &Rig, parent: &str) -> anyhow::Result<String> {
    shepherd_testbed::client::wait_until("the subagent session", PATIENCE, || async {
        rig.client.children(parent).await.map(|c| c.first().and_then(|c| c["id"].as_str().map(str::to_string)))
    })
    .await
}

#[actix::test]
async fn a_parent_whose_background_subagent_was_aborted_is_prompted_once() -> anyhow::Result<()> {
    let mut rig = Rig::start_full(
        |c| {
            c.supervisor.orphan_wait = Duration::from_secs(3);
            c.recovery.stall_timeout = Duration::from_secs(20); // the child's stall is not what acts
            c.recovery.continue_message = "[[fake:ok]] A subagent failed; please check and continue.".into();
        },
        |o| o.env("OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS", "true"),
        Ok,
    )
    .await?;
    let parent = rig.client.create_session(Some("parent")).await?;
    rig.client.prompt_async(&parent, "[[fake:bgtask:stall]] delegate it", None, None, false).await?;
    let child = child_of(&rig, &parent).await?;
    rig.client.wait_busy(&child, PATIENCE).await?;
    rig.client.wait_idle(&parent, PATIENCE).await?; // background: the parent finished its turn
    rig.client.abort(&child).await?; // the child dies; OpenCode never tells the parent

    let rec = rig.wait_record(&parent, Action::Recover, Outcome::Done, PATIENCE).await?;
    assert!(rec.reason.contains(&child), "{rec:?}");
    rig.wait_record(&parent, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&parent, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let continues = rig
        .client
        .messages(&parent)
        .await?
        .iter()
        .filter(|m| {
            m.parts.iter().any(|p| p.pointer("/metadata/shepherd/kind").and_then(Value::as_str) == Some("continue"))
        })
        .count();
    assert_eq!(continues, 1, "prompted once");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_foreground_subagent_aborted_is_left_to_its_parent() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.supervisor.orphan_wait = Duration::from_secs(3);
        c.recovery.stall_timeout = Duration::from_secs(20);
    })
    .await?;
    let parent = rig.client.create_session(Some("parent")).await?;
    rig.client.prompt_async(&parent, "[[fake:task:stall]] delegate it", None, None, false).await?;
    let child = child_of(&rig, &parent).await?;
    rig.client.wait_busy(&child, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.client.abort(&child).await?;
    rig.client.wait_idle(&parent, PATIENCE).await?; // the parent carries on by itself
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        rig.records_for(&parent).iter().all(|(a, _, _)| *a != Action::Recover && *a != Action::Continue),
        "{:?}",
        rig.records_for(&parent)
    );
    rig.stop().await;
    Ok(())
}
