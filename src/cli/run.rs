//! `shepherd run`: the daemon, until SIGTERM or Ctrl-C; SIGHUP reloads its
//! configuration; the service manager hears when it is ready, reloading and stopping.

use anyhow::Context as _;
use shepherd::config::load;
use shepherd::daemon::Daemon;

use super::wait_for_signal;
use crate::ConfigArgs;

pub(crate) fn run(args: &ConfigArgs) -> anyhow::Result<()> {
    // Before any thread starts: nothing the daemon (or SQLite) creates is
    // readable by the group or others. The writers also set modes explicitly.
    shepherd::private_state::restrict_umask();
    let cfg = args.load()?;
    // Held to the end: dropped, it writes out the log lines still queued.
    let _log = shepherd::logging::init(cfg.log.format, &cfg.log.level);
    install_kill_point();
    runnable(&cfg)?;
    let sources = args.sources();
    let loader: shepherd::reload::ConfigLoader = std::sync::Arc::new(move || load(&sources));
    actix::System::new().block_on(supervise(cfg, loader))
}

/// What `run` refuses in a valid configuration — no server to supervise — and `config
/// check` too, so a unit whose `ExecStartPre` checks the configuration does not pass it
/// and then restart `run` in a loop.
pub(crate) fn runnable(cfg: &shepherd_actors::config::Config) -> anyhow::Result<()> {
    if cfg.servers.is_empty() {
        anyhow::bail!("no servers configured: add [[servers]] to the config or pass --server URL");
    }
    Ok(())
}

async fn supervise(cfg: shepherd_actors::config::Config, loader: shepherd::reload::ConfigLoader) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let daemon = Daemon::start_reloadable(&cfg, loader)?;
    // Started by systemd: it hears when Shepherd is ready, reloading, alive and stopping.
    let manager = shepherd::systemd::ServiceManager::from_env();
    if let Some(manager) = manager {
        actix::spawn(manager.attend(daemon.supervisor().clone()));
    }
    let mut hangup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    let reload = daemon.reload_handle().clone();
    let stop = wait_for_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            // The reload task logs the outcome (what changed, or why it was rejected).
            Some(()) = hangup.recv() => {
                manager.inspect(|m| m.reloading());
                let outcome = match reload.reload("SIGHUP").await {
                    Ok(_) => "supervising (configuration reloaded)",
                    Err(_) => "supervising (reload rejected; the previous configuration runs)",
                };
                manager.inspect(|m| m.reloaded(outcome));
            }
        }
    }
    tracing::info!("signal received: shutting down");
    manager.inspect(|m| m.stopping());
    daemon.shutdown().await;
    Ok(())
}

/// The test-only variable naming the step at which `shepherd run` kills itself
/// (`shepherd_actors::killpoint`): the crash-consistency tests restart it after.
const KILL_AT_ENV: &str = "SHEPHERD_KILL_AT";

/// Arms the kill point named by `SHEPHERD_KILL_AT`, if any: the process sends itself
/// `SIGKILL` the first time a procedure reaches that step. Never set it in production.
fn install_kill_point() {
    let Ok(target) = std::env::var(KILL_AT_ENV) else { return };
    if !shepherd_actors::killpoint::step::ALL.contains(&target.as_str()) {
        tracing::warn!(variable = KILL_AT_ENV, value = %target, known = ?shepherd_actors::killpoint::step::ALL, "unknown kill point; ignored");
        return;
    }
    tracing::warn!(variable = KILL_AT_ENV, step = %target, "TEST ONLY: this process kills itself (SIGKILL) when it reaches this step");
    shepherd_actors::killpoint::install(move |step| {
        if step == target {
            eprintln!("kill point {step} reached: SIGKILL");
            // SAFETY: `kill` on our own pid with a signal number has no memory effects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    });
}
