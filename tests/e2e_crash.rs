//! Crash consistency on a real OpenCode: `shepherd run` kills itself (`SIGKILL`) at a
//! named step of a stall recovery (`SHEPHERD_KILL_AT`), is started again on the same
//! ledger, and the session ends with exactly one continue — none lost, none repeated.

mod support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use shepherd::testbed::client::{wait_until, Message};
use shepherd_actors::config::{Config, ServerConfig};
use shepherd_actors::killpoint::step;
use support::{Rig, PATIENCE};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

/// A `shepherd run` process and its JSON log lines.
struct Shepherd {
    child: tokio::process::Child,
    log: mpsc::UnboundedReceiver<Value>,
    /// Every line read so far.
    seen: Vec<Value>,
}

impl Shepherd {
    fn start(config: &std::path::Path, kill_at: Option<&str>) -> anyhow::Result<Shepherd> {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        cmd.current_dir(config.parent().expect("in a folder"))
            .args(["run", "--config"])
            .arg(config)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .env_remove("SHEPHERD_KILL_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(step) = kill_at {
            cmd.env("SHEPHERD_KILL_AT", step);
        }
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, log) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Ok(Shepherd { child, log, seen: Vec::new() })
    }

    /// The next log line that matches, within [`PATIENCE`].
    async fn wait_log(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match tokio::time::timeout_at(deadline, self.log.recv()).await {
                Ok(Some(v)) => {
                    self.seen.push(v.clone());
                    if matches(&v) {
                        return Ok(v);
                    }
                }
                Ok(None) => anyhow::bail!("the log ended before: {what}"),
                Err(_) => anyhow::bail!("no log line within {PATIENCE:?}: {what}"),
            }
        }
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        let _ = tokio::time::timeout(PATIENCE, self.child.wait()).await;
    }
}

fn is_action(v: &Value, session: &str, action: &str) -> bool {
    v["target"] == "shepherd::action" && v["session"] == session && v["action"] == action
}

/// The user messages of a session that carry Shepherd's tag of this kind.
fn tagged(messages: &[Message], kind: &str) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role() == "user")
        .filter(|m| m.parts.iter().any(|p| p.pointer("/metadata/shepherd/kind").and_then(Value::as_str) == Some(kind)))
        .map(|m| m.id().to_string())
        .collect()
}

/// A stall, recovered by a Shepherd that dies at `kill_at` and is started again on the
/// same ledger: the session gets exactly one continue and finishes its turn.
async fn crash_during_a_recovery_loses_and_repeats_nothing(kill_at: &str) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let mut rig = Rig::start_config(|_| {}).await?;
    if let Some(daemon) = rig.daemon.take() {
        daemon.shutdown().await;
    }
    let mut cfg = Config {
        servers: vec![ServerConfig::new("local", rig.opencode.url())],
        recovery: support::fast_recovery(),
        advisor: support::fast_advice(),
        ..Default::default()
    };
    cfg.advisor.new_session = Duration::ZERO;
    cfg.control.enabled = false;
    cfg.status.enabled = false;
    cfg.store.path = dir.path().join("ledger.sqlite3").display().to_string();
    Rig::write_config(&file, &cfg)?;

    let mut first = Shepherd::start(&file, Some(kill_at))?;
    first.wait_log("reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled"))).await?;
    let id = rig.client.create_session(Some(&format!("crash at {kill_at}"))).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work on it", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;

    let died = tokio::time::timeout(PATIENCE, first.child.wait()).await??;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(died.signal(), Some(libc::SIGKILL), "Shepherd killed itself at {kill_at}: {died:?}");

    let mut second = Shepherd::start(&file, None)?;
    let result = async {
        let cont = second
            .wait_log("a continue sent", |v| is_action(v, &id, "continue") && v["outcome"] == "done")
            .await?;
        // The turn the continue started finishes normally.
        let finished = wait_until("the continued turn to finish", PATIENCE, || async {
            let msgs = rig.client.messages(&id).await?;
            let done = msgs.last().is_some_and(|m| m.role() == "assistant" && m.finish() == Some("stop"));
            anyhow::Ok(done.then_some(msgs))
        })
        .await?;
        assert_eq!(tagged(&finished, "continue").len(), 1, "exactly one continue after a crash at {kill_at}");
        // Nothing more arrives: a second look a stall timeout later still sees one.
        tokio::time::sleep(cfg.recovery.stall_timeout + Duration::from_secs(1)).await;
        let later = rig.client.messages(&id).await?;
        assert_eq!(tagged(&later, "continue").len(), 1, "still one continue after a crash at {kill_at}");
        assert!(!rig.client.is_busy(&id).await?, "the session is idle, its work continued once");
        anyhow::Ok(cont)
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
