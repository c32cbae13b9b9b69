//! A Shepherd that did not run for a while — descheduled on a starved host, a paused VM,
//! a laptop lid — on a real OpenCode: its stall timers are long past due when it runs
//! again, and the events that say the session kept working wait unread in its socket.
//! Those events are not silence: the deadline falls due in stream time, after they are
//! read and handled, and nothing is aborted.
//!
//! And a Shepherd whose log nobody reads — a terminal paused with Ctrl-S, a stuck
//! journald: its log pipe fills, and it supervises on; the lines wait for the reader.

mod support;

use std::time::Duration;

use shepherd_testbed::client::wait_until;
use support::process::ShepherdProcess;
use support::{tagged, Rig, PATIENCE};
use tempfile::TempDir;

#[actix::test]
async fn a_shepherd_stopped_past_the_stall_timeout_does_not_abort_a_session_that_kept_working() -> anyhow::Result<()>
{
    let dir = TempDir::new()?;
    let (mut rig, cfg) = Rig::for_process(&dir, |_| {}).await?;
    let mut shepherd = ShepherdProcess::run(&dir.path().join("shepherd.toml"), None)?;
    shepherd.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    let id = rig.client.create_session(Some("starved")).await?;
    // The reply streams for 20 s, a word at a time: never silent for the stall timeout,
    // and still streaming when Shepherd runs again (ten seconds in, on a quiet host).
    rig.client.prompt_async(&id, "[[fake:slow:20]] write it out", None, None, false).await?;
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

/// Nobody reads Shepherd's log: its pipe is full before a session stalls, and the stall
/// is still aborted and continued (log lines are written by a thread of their own; the
/// thread that decides never waits for the reader). Once the log is read again, the
/// recovery's lines are there.
#[actix::test]
async fn a_log_nobody_reads_holds_up_no_recovery() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let (mut rig, _cfg) = Rig::for_process(&dir, |_| {}).await?;
    let args = ["run", "--config", "shepherd.toml", "--log-format", "json"].map(std::ffi::OsStr::new);
    let mut shepherd = ShepherdProcess::spawn(dir.path(), &args, &[("RUST_LOG", std::ffi::OsStr::new("debug"))])?;
    shepherd.shrink_log_pipe();
    shepherd.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    shepherd.pause_log_reading();

    // Sessions at work fill the pipe (each tracked session is a line).
    let pipe_full = || async {
        let unread = shepherd.log_pipe_unread();
        anyhow::Ok((unread >= 4096 - 512).then_some(unread))
    };
    let mut filled = None;
    for n in 0..40 {
        let id = rig.client.create_session(Some(&format!("filler {n}"))).await?;
        rig.client.prompt_async(&id, "[[fake:ok]] hello", None, None, false).await?;
        if let Some(unread) = pipe_full().await? {
            filled = Some(unread);
            break;
        }
    }
    let filled = match filled {
        Some(unread) => unread,
        None => wait_until("the log pipe to fill", PATIENCE, pipe_full).await?,
    };

    let id = rig.client.create_session(Some("stalls with its log unread")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work on it", None, None, false).await?;
    let messages = wait_until("the stall to be continued and its turn to finish", PATIENCE * 2, || async {
        let msgs = rig.client.messages(&id).await?;
        let done = msgs.last().is_some_and(|m| m.role() == "assistant" && m.finish() == Some("stop"));
        anyhow::Ok((done && !tagged(&msgs, "continue").is_empty()).then_some(msgs))
    })
    .await?;
    assert_eq!(tagged(&messages, "continue").len(), 1, "one continue, with {filled} bytes unread in the log pipe");

    shepherd.resume_log_reading();
    let continued = shepherd
        .wait_log("the continue's log line", |v| {
            v["target"] == "shepherd::action" && v["session"] == id.as_str() && v["action"] == "continue"
        })
        .await?;
    shepherd.stop().await;
    rig.opencode.stop().await;
    assert_eq!(continued["outcome"], "done");
    Ok(())
}
