//! A `shepherd` process of the built binary, as a user or a service manager starts it,
//! with its JSON log lines read as they come.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use super::{Rig, PATIENCE};
use shepherd_actors::config::{Config, ServerConfig};

/// A running `shepherd` and its JSON log lines (stderr).
pub struct ShepherdProcess {
    pub child: tokio::process::Child,
    log: mpsc::UnboundedReceiver<Value>,
    /// Every line read so far.
    pub seen: Vec<Value>,
    /// While true the log is not read (its pipe fills, as a paused terminal's does).
    reading_paused: tokio::sync::watch::Sender<bool>,
    /// The log pipe's read end (held open by the reading task).
    log_fd: std::os::fd::RawFd,
}

impl ShepherdProcess {
    /// `shepherd run --config FILE --log-format json` in the file's folder, with
    /// `SHEPHERD_KILL_AT` set to `kill_at` (or unset).
    pub fn run(config: &Path, kill_at: Option<&str>) -> anyhow::Result<ShepherdProcess> {
        let args = [OsStr::new("run"), OsStr::new("--config"), config.as_os_str(), OsStr::new("--log-format"), OsStr::new("json")];
        let env: Vec<(&str, &OsStr)> = kill_at.map(|step| ("SHEPHERD_KILL_AT", OsStr::new(step))).into_iter().collect();
        Self::spawn(config.parent().expect("in a folder"), &args, &env)
    }

    /// `shepherd ARGS…` in `dir`, with `env` added (and `SHEPHERD_KILL_AT`,
    /// `NOTIFY_SOCKET` and the watchdog's variables removed unless given).
    pub fn spawn(dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> anyhow::Result<ShepherdProcess> {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        cmd.current_dir(dir)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for inherited in ["SHEPHERD_KILL_AT", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
            cmd.env_remove(inherited);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().expect("piped");
        let log_fd = std::os::fd::AsRawFd::as_raw_fd(&stderr);
        let (tx, log) = mpsc::unbounded_channel();
        let (reading_paused, mut paused) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut lines = BufReader::with_capacity(256, stderr).lines();
            loop {
                // A paused reader keeps the pipe open and takes nothing from it.
                if paused.wait_for(|p| !*p).await.is_err() {
                    return;
                }
                let Ok(Some(line)) = lines.next_line().await else { return };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
        Ok(ShepherdProcess { child, log, seen: Vec::new(), reading_paused, log_fd })
    }

    /// Stops reading the log, with the pipe open, so that Shepherd's next lines fill it
    /// (a few, once [`Self::shrink_log_pipe`] made it a page): a terminal paused with
    /// Ctrl-S, a stuck journald. (The reader may still take the line it is waiting for.)
    pub fn pause_log_reading(&self) {
        self.reading_paused.send_replace(true);
    }

    /// Reads the log again.
    pub fn resume_log_reading(&self) {
        self.reading_paused.send_replace(false);
    }

    /// The bytes waiting unread in the log pipe.
    pub fn log_pipe_unread(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; the descriptor is the pipe's open read end.
        let rc = unsafe { libc::ioctl(self.log_fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
        if rc == 0 { n.max(0) as usize } else { 0 }
    }

    /// Shrinks the log pipe's buffer to one page (from 64 KiB).
    pub fn shrink_log_pipe(&self) {
        // SAFETY: F_SETPIPE_SZ on the pipe's read end, which the reading task holds open.
        let rc = unsafe { libc::fcntl(self.log_fd, libc::F_SETPIPE_SZ, 4096) };
        assert!(rc >= 4096, "F_SETPIPE_SZ: {}", std::io::Error::last_os_error());
    }

    /// The next log line that matches, within [`PATIENCE`].
    pub async fn wait_log(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
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

    /// Every log line so far, without waiting for more.
    pub fn drain(&mut self) -> &[Value] {
        while let Ok(v) = self.log.try_recv() {
            self.seen.push(v);
        }
        &self.seen
    }

    /// Sends `signal` (`libc::SIGTERM`, `libc::SIGHUP`, …).
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.child.id() {
            // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
    }

    /// `SIGTERM`, then waits (at most [`PATIENCE`]) for the exit.
    pub async fn stop(mut self) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        tokio::time::timeout(PATIENCE, self.child.wait()).await.ok().and_then(Result::ok)
    }
}

impl Rig {
    /// The rig's OpenCode and fake model with its in-process daemon stopped, and a config
    /// file for `shepherd run` (fast timings, a SQLite ledger in `dir`), adjusted by `tweak`.
    pub async fn for_process(dir: &tempfile::TempDir, tweak: impl FnOnce(&mut Config)) -> anyhow::Result<(Rig, Config)> {
        let mut rig = Rig::start_config(|_| {}).await?;
        if let Some(daemon) = rig.daemon.take() {
            daemon.shutdown().await;
        }
        let mut cfg = Config {
            servers: vec![ServerConfig::new("local", rig.opencode.url())],
            recovery: super::fast_recovery(),
            advisor: super::fast_advice(),
            ..Default::default()
        };
        cfg.advisor.new_session = std::time::Duration::ZERO;
        cfg.control.enabled = false;
        cfg.status.enabled = false;
        cfg.store.path = dir.path().join("ledger.sqlite3").display().to_string();
        tweak(&mut cfg);
        Rig::write_config(&dir.path().join("shepherd.toml"), &cfg)?;
        Ok((rig, cfg))
    }
}
