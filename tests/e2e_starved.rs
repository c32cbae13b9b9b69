//! A Shepherd that did not run for a while — descheduled on a starved host, a paused VM,
//! a laptop lid — on a real OpenCode: its stall timers are long past due when it runs
//! again, and the events that say the session kept working wait unread in its socket.
//! Those events are not silence: the deadline falls due in stream time, after they are
//! read and handled, and nothing is aborted.

mod support;

use std::time::Duration;

use shepherd_testbed::client::wait_until;
use support::process::ShepherdProcess;
use support::{Rig, PATIENCE};
use tempfile::TempDir;

#[actix::test]
async fn a_shepherd_stopped_past_the_stall_timeout_does_not_abort_a_session_that_kept_working() -> anyhow::Result<()>
{
    let dir = TempDir::new()?;
    let (mut rig, cfg) = Rig::for_process(&dir, |_| {}).await?;
    let mut shepherd = ShepherdProcess::run(&dir.path().join("shepherd.toml"), None)?;
    shepherd.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    let id = rig.client.create_session(Some("starved")).await?;
    // The reply streams for 14 s, a word at a time: never silent for the stall timeout.
    rig.client.prompt_async(&id, "[[fake:slow:14]] write it out", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Shepherd does not run for twice the stall timeout while the session streams on.
    let stopped = cfg.recovery.stall_timeout * 2;
    shepherd.signal(libc::SIGSTOP);
    tokio::time::sleep(stopped).await;
    assert!(rig.client.is_busy(&id).await?, "the session worked on meanwhile");
    shepherd.signal(libc::SIGCONT);

    let messages = wait_until("the turn to finish", PATIENCE, || async {
        let msgs = rig.client.messages(&id).await?;
        let done = msgs.last().is_some_and(|m| m.role() == "assistant" && m.finish().is_some());
        anyhow::Ok(done.then_some(msgs))
    })
    .await?;
    let actions: Vec<String> = shepherd
        .drain()
        .iter()
        .filter(|v| v["target"] == "shepherd::action" && v["session"] == id.as_str())
        .map(|v| format!("{} {}", v["action"], v["outcome"]))
        .collect();
    shepherd.stop().await;
    rig.opencode.stop().await;
    assert!(messages.iter().all(|m| m.error_name().is_none()), "nothing was aborted: {actions:?}");
    assert_eq!(messages.last().and_then(|m| m.finish()), Some("stop"), "the reply ran to its end");
    assert!(actions.is_empty(), "no stall was seen, nothing was done: {actions:?}");
    Ok(())
}
