//! The service manager's protocol (`sd_notify`): what `shepherd run` tells systemd.
//!
//! With `Type=notify-reload` (see `contrib/systemd/shepherd.service`) systemd waits for
//! `READY=1` before it counts the service as started, sends `SIGHUP` for a reload and
//! waits for `RELOADING=1` … `READY=1` around it, and with `WatchdogSec=` restarts the
//! service when `WATCHDOG=1` stops arriving. Shepherd says:
//! - `READY=1` once every server's stream is connected and reconciled — what
//!   `GET /readyz` reports — with a `STATUS=` line naming what it still waits for until
//!   then (a server that never answers keeps the unit "activating", visibly);
//! - `WATCHDOG=1` every half `WatchdogSec`, and only when the supervisor actor answered
//!   within that time: a wedged actor system stops the pings and systemd restarts it;
//! - `RELOADING=1` (with `MONOTONIC_USEC`, which systemd 253+ requires) before a reload
//!   and `READY=1` after it, whatever its outcome (a rejected reload keeps the old
//!   configuration running; the log says why);
//! - `STOPPING=1` when shutdown begins.
//!
//! Without `NOTIFY_SOCKET` (not started by systemd) nothing is sent and nothing runs.
//! A failed send is logged, never fatal: supervising sessions matters more than telling.

use std::time::Duration;

use actix::Addr;
use sd_notify::NotifyState;
use shepherd_actors::supervisor::{InspectServers, Supervisor};

use crate::metrics::fleet::readiness;

/// How often readiness is checked until it is reached.
const READINESS_POLL: Duration = Duration::from_millis(250);

/// The service manager, when Shepherd was started by one.
#[derive(Debug, Clone, Copy)]
pub struct ServiceManager {
    /// `WatchdogSec` (`WATCHDOG_USEC`), when the watchdog is on for this process.
    watchdog: Option<Duration>,
}

impl ServiceManager {
    /// `None` when `NOTIFY_SOCKET` is not set.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("NOTIFY_SOCKET")?;
        Some(Self { watchdog: sd_notify::watchdog_enabled().filter(|d| !d.is_zero()) })
    }

    /// Shutdown has begun.
    pub fn stopping(&self) {
        send(&[NotifyState::Stopping, NotifyState::Status("shutting down")], "STOPPING=1");
    }

    /// A reload begins (systemd 253+ needs the monotonic time with it).
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => send(&[NotifyState::Reloading, now], "RELOADING=1"),
            Err(e) => tracing::warn!(error = %e, "systemd: could not read the monotonic clock; RELOADING=1 not sent"),
        }
    }

    /// A reload is over, applied or rejected: the service runs on.
    pub fn reloaded(&self, outcome: &str) {
        send(&[NotifyState::Ready, NotifyState::Status(outcome)], "READY=1");
    }

    /// Runs beside the daemon until the supervisor stops: `READY=1` once ready, then the
    /// watchdog pings (when `WatchdogSec` is set).
    pub async fn attend(self, supervisor: Addr<Supervisor>) {
        let mut waiting_on = String::new();
        loop {
            let Ok(servers) = supervisor.send(InspectServers).await else { return };
            match readiness(&servers) {
                Ok(()) => break,
                Err(not_ready) => {
                    let now: Vec<String> = not_ready.iter().map(|n| format!("{}: {}", n.server, n.reason)).collect();
                    let status = format!("waiting for {}", now.join(", "));
                    if status != waiting_on {
                        send(&[NotifyState::Status(&status)], "STATUS");
                        waiting_on = status;
                    }
                }
            }
            // Not ready yet: still alive, as far as the watchdog is concerned.
            self.ping();
            tokio::time::sleep(READINESS_POLL).await;
        }
        send(&[NotifyState::Ready, NotifyState::Status("supervising")], "READY=1");
        tracing::info!(watchdog_ms = self.watchdog.map(|d| d.as_millis() as u64), "systemd: ready");
        let Some(period) = self.watchdog else { return };
        let every = period / 2;
        loop {
            tokio::time::sleep(every).await;
            match tokio::time::timeout(every, supervisor.send(InspectServers)).await {
                Ok(Ok(_)) => self.ping(),
                Ok(Err(_)) => return, // the supervisor stopped: shutting down
                Err(_) => tracing::warn!(
                    waited_ms = every.as_millis() as u64,
                    "systemd: the supervisor did not answer in time; no watchdog ping"
                ),
            }
        }
    }

    fn ping(&self) {
        if self.watchdog.is_some() {
            send(&[NotifyState::Watchdog], "WATCHDOG=1");
        }
    }
}

fn send(state: &[NotifyState], what: &str) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!(error = %e, what, "systemd: could not notify the service manager");
    }
}
