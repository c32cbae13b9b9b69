//! Wiring: one supervisor, one REST client and one event pump per configured server.
//!
//! [`Daemon::start`] must be called inside a running actix `System`. The same wiring
//! serves `shepherd run`, `shepherd demo` and the end-to-end tests, so what the tests
//! prove is what users run. With `control.enabled`, the control API
//! ([`crate::control`]) is served on a thread of its own beside the actors; another
//! folds the journal into the [`StatusBoard`] that `GET /v1/status` reads and, with
//! `status.enabled`, writes the status file ([`crate::status`]) from it. The
//! servers, their pumps and every setting a reload may change are held in
//! [`crate::reload`]'s `Running`, behind the one task that applies reloads. The
//! daemon's [`Metrics`] (served at the control API's `/metrics`) follow its journal,
//! its pumps, its ledger and its advisor model.

use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};
use shepherd_actors::advisor::actor::{AdvisorActor, AdvisorSlot};
use shepherd_actors::config::Config;
use shepherd_actors::journal::Journal;
use shepherd_actors::ports::SystemClock;
use shepherd_actors::supervisor::{FleetView, InspectFleet, Shutdown, Supervisor};

use crate::control::{ControlServer, ControlToken};
use crate::metrics::edge::{CountingLedger, TimedModel};
use crate::metrics::Metrics;
use crate::notify::Notifiers;
use crate::opencode::PumpStats;
use crate::reload::{ConfigLoader, ReloadHandle, Running};
use crate::status::{status_path, StatusBoard, StatusWriter};
use crate::toast::Toasts;

/// A running Shepherd.
pub struct Daemon {
    supervisor: Addr<Supervisor>,
    journal: Journal,
    /// What a reload may change: the running config, the pumps, the retunable actors.
    running: Arc<tokio::sync::Mutex<Running>>,
    pump_stats: crate::reload::PumpTable,
    reload: ReloadHandle,
    instance: String,
    control: Option<ControlServer>,
    status: Option<StatusWriter>,
    /// `[[notify]]`: told of the journal, stopped after the supervisor.
    notifiers: Notifiers,
    metrics: Arc<Metrics>,
    /// Returns freed heap to the system every `supervisor.cleanup_interval`.
    trimmer: tokio::task::JoinHandle<()>,
    /// The threads the servers' pumps and sessions run on (`supervisor.server_threads`),
    /// stopped last.
    server_threads: Vec<Arbiter>,
    /// Where the sessions' calls to OpenCode are made (`shepherd-io-N`, one per server
    /// thread), stopped last.
    io_threads: Vec<Arbiter>,
}

/// Starts the servers' threads: `configured`, or one per CPU core for 0.
fn server_threads(configured: usize) -> Vec<Arbiter> {
    let n = match configured {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    tracing::info!(threads = n, "servers (their event pumps and sessions) run on {n} thread(s)");
    named_threads(n, SERVER_THREADS)
}

/// The threads the sessions' calls to OpenCode are made on, one per server thread
/// ([`crate::opencode::io_thread`]): a burst of events queued for the sessions does not
/// delay their recoveries' HTTP exchanges.
fn io_threads(n: usize) -> Vec<Arbiter> {
    named_threads(n, IO_THREADS)
}

/// The servers' threads' names: `shepherd-srv-0`, `shepherd-srv-1`, ….
const SERVER_THREADS: &str = "shepherd-srv";
/// The io threads' names: `shepherd-io-0`, ….
const IO_THREADS: &str = "shepherd-io";

/// The `i`-th of the threads named `prefix`.
fn thread_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i}")
}

/// `n` threads with their own runtimes, named `{prefix}-0`, `{prefix}-1`, ….
fn named_threads(n: usize, prefix: &'static str) -> Vec<Arbiter> {
    (0..n)
        .map(|i| {
            let arbiter = Arbiter::new();
            arbiter.spawn_fn(move || name_this_thread(&thread_name(prefix, i)));
            arbiter
        })
        .collect()
}

/// Names the calling thread as `top -H`, `ps -L` and `/proc/…/task/*/comm` show it
/// (Linux keeps 15 bytes). actix names its threads `actix-rt|system:0|arbiter:N`, cut
/// to `actix-rt|system` for all of them: the servers' threads and the main one could
/// not be told apart. Best effort: elsewhere, or where `/proc` is not mounted, the
/// name stays actix's.
fn name_this_thread(name: &str) {
    if let Err(e) = std::fs::write("/proc/thread-self/comm", name) {
        tracing::debug!(error = %e, name, "could not name the thread");
    }
}

impl Daemon {
    /// Attaches to every configured server. Fails only on configuration problems (a
    /// named password variable that is unset, a control port already taken); an
    /// unreachable server is retried by its pump, not fatal. A reload has nothing to
    /// re-read (see [`Daemon::start_reloadable`]); [`Daemon::apply_config`] still works.
    pub fn start(cfg: &Config) -> anyhow::Result<Self> {
        Self::start_with_loader(cfg, None)
    }

    /// Like [`Daemon::start`]; a reload (`SIGHUP`, `POST /v1/config/reload`) calls
    /// `loader` to re-read the configuration from the sources `cfg` came from.
    pub fn start_reloadable(cfg: &Config, loader: ConfigLoader) -> anyhow::Result<Self> {
        Self::start_with_loader(cfg, Some(loader))
    }

    fn start_with_loader(cfg: &Config, loader: Option<ConfigLoader>) -> anyhow::Result<Self> {
        // What the configuration can make fail is tried before anything starts: a
        // failure after would leave actors, threads, a token file and a status file's
        // draft behind (and actix panicking as the half-started system was dropped).
        let metrics = Metrics::new();
        let servers = cfg
            .servers
            .iter()
            .map(|server| crate::reload::prepare(&metrics, cfg, server))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let control_listener =
            if cfg.control.enabled { Some(crate::control::ControlListener::bind(&cfg.control)?) } else { None };
        let status_file =
            if cfg.status.enabled { Some(status_path(&cfg.status, &|name| std::env::var_os(name))?) } else { None };
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        // The metrics (made first, for the servers' call timers) are this daemon's own
        // recorder (never a global one: tests run several daemons), counting every
        // record as it is made.
        let journal = Journal::observed(metrics.journal_observer());
        // Before any actor starts: every session actor loads its state from here.
        let (ledger, notified) = crate::store::open_ledgers(&cfg.store).map_err(|e| anyhow::anyhow!("store: {e}"))?;
        let ledger = CountingLedger::wrap(ledger, Arc::clone(&metrics));
        let guard = crate::guard::start(&cfg.guard, Arc::new(SystemClock), &instance)?;
        // Without a model the heuristics answer in place (in the session actor): no
        // advisor actor, no queue, nothing to wait for.
        let model =
            if cfg.advisor.enabled { crate::advisor::ChatCompletions::from_config(&cfg.advisor)? } else { None }
                .map(|model| TimedModel::wrap(model, Arc::clone(&metrics)));
        tracing::info!(
            enabled = cfg.advisor.enabled,
            model = model.is_some(),
            "advisor: {}",
            match (cfg.advisor.enabled, model.is_some()) {
                (false, _) => "off (no advice before aborts or nudges)",
                (true, false) => "heuristics only (no model configured)",
                (true, true) => "model, heuristics as fallback",
            }
        );
        let advisor = AdvisorSlot::default();
        advisor.set(model.map(|model| AdvisorActor::new(cfg.advisor.clone(), Some(model)).start()));
        let rules = Arc::new(cfg.session_rules());
        // Every log line from here on passes the configured redactor too.
        crate::logging::set_redactor(rules.redactor.clone());
        let redactor = rules.redactor.clone();
        let supervisor = Supervisor::new(
            rules,
            cfg.supervisor.clone(),
            ledger,
            Arc::new(SystemClock),
            journal.clone(),
            instance.clone(),
        )
        .with_workspace(Arc::new(crate::workspace::GitWorkspace))
        .with_guard(crate::guard::as_port(&guard))
        .with_advisor_slot(advisor.clone())
        .start();
        let toasts = Toasts::start(&cfg.toasts, &journal);
        let server_threads = server_threads(cfg.supervisor.server_threads);
        let io_threads = io_threads(server_threads.len());
        let mut running =
            Running::new(cfg.clone(), loader, supervisor.clone(), guard, advisor, toasts, Arc::clone(&metrics))
                .with_threads(server_threads.iter().map(Arbiter::handle).collect())
                .with_io_threads(io_threads.iter().map(Arbiter::handle).collect());
        let pump_stats = Arc::clone(&running.pump_stats);
        let notifiers = Notifiers::start(
            &cfg.notify,
            crate::notify::Wiring {
                journal: journal.clone(),
                ledger: notified,
                supervisor: supervisor.clone(),
                pumps: Arc::clone(&pump_stats),
                redactor: redactor.clone(),
                metrics: Arc::clone(&metrics),
                clock: Arc::new(SystemClock),
            },
        )?;
        let board = StatusBoard::new(&cfg.status, supervisor.clone(), Arc::clone(&pump_stats), instance.clone());
        let (reload, requests) = crate::reload::channel();
        let control = match control_listener {
            Some(listener) => Some(ControlServer::start(
                &cfg.control,
                listener,
                supervisor.clone(),
                Arc::clone(&metrics),
                Some(reload.clone()),
                board.clone(),
            )?),
            None => None,
        };
        // Before the pumps too, so no record is missed. The board is fed whenever
        // something reads it: the status file, or the control API's `/v1/status`.
        let status = if cfg.status.enabled || cfg.control.enabled {
            Some(StatusWriter::start(&cfg.status, status_file, &journal, board)?)
        } else {
            None
        };
        running.start_servers(servers);
        let running = Arc::new(tokio::sync::Mutex::new(running));
        crate::reload::serve(requests, Arc::clone(&running));
        let trimmer = crate::memory::spawn_trimmer(cfg.supervisor.cleanup_interval);
        tracing::info!(instance = %instance, servers = cfg.servers.len(), "started");
        Ok(Self {
            supervisor,
            journal,
            running,
            pump_stats,
            reload,
            instance,
            control,
            status,
            notifiers,
            metrics,
            trimmer,
            server_threads,
            io_threads,
        })
    }

    /// Asks for a reload (what `SIGHUP` and `POST /v1/config/reload` do).
    pub fn reload_handle(&self) -> &ReloadHandle {
        &self.reload
    }

    /// Re-reads the configuration from the daemon's sources and applies it.
    pub async fn reload(&self) -> Result<crate::config::diff::ConfigDiff, crate::reload::ReloadError> {
        self.reload.reload("api").await
    }

    /// Applies `cfg` as a reload would (validated first; what needs a restart is kept).
    pub async fn apply_config(
        &self,
        cfg: Config,
    ) -> Result<crate::config::diff::ConfigDiff, crate::reload::ReloadError> {
        self.reload.apply(cfg).await
    }

    /// The configuration in force (after any reloads).
    pub async fn config(&self) -> Config {
        self.running.lock().await.cfg.clone()
    }

    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn supervisor(&self) -> &Addr<Supervisor> {
        &self.supervisor
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The control API's base URL (`http://127.0.0.1:PORT`, the port actually bound),
    /// when it is enabled.
    pub fn control_url(&self) -> Option<&str> {
        self.control.as_ref().map(ControlServer::url)
    }

    /// The token control requests must carry (for tests and the demo; never log it).
    pub fn control_token(&self) -> Option<&ControlToken> {
        self.control.as_ref().map(ControlServer::token)
    }

    /// Where the status file is written, when it is enabled.
    pub fn status_path(&self) -> Option<&std::path::Path> {
        self.status.as_ref().and_then(StatusWriter::path)
    }

    /// Counters of each server's event pump (servers come and go with reloads).
    pub fn pump_stats(&self) -> Vec<(String, Arc<PumpStats>)> {
        self.pump_stats.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// The threads the servers' pumps and sessions run on (`shepherd-srv-N`), then those
    /// the sessions' calls to OpenCode are made on (`shepherd-io-N`, paired with
    /// `shepherd-srv-N`), each with the name it was given: where the fleet bench
    /// measures how late each thread runs what it is given.
    pub fn threads(&self) -> Vec<(String, actix::ArbiterHandle)> {
        let named = |prefix: &str, threads: &[Arbiter]| -> Vec<(String, actix::ArbiterHandle)> {
            threads.iter().enumerate().map(|(i, t)| (thread_name(prefix, i), t.handle())).collect()
        };
        let mut threads = named(SERVER_THREADS, &self.server_threads);
        threads.extend(named(IO_THREADS, &self.io_threads));
        threads
    }

    /// This daemon's metrics (what `GET /metrics` serves).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The fleet as the supervisor sees it now.
    pub async fn fleet(&self) -> FleetView {
        self.supervisor.send(InspectFleet).await.unwrap_or_default()
    }

    /// Every tracked session's detail asked of its actor (a message each): returns once
    /// every session actor has handled what was sent to it before (the fleet bench's
    /// barrier; [`Daemon::fleet`] reads what the actors published, without waiting).
    pub async fn ask_sessions(&self) -> Vec<shepherd_actors::control::SessionDetail> {
        self.supervisor.send(shepherd_actors::supervisor::AskSessions).await.unwrap_or_default()
    }

    /// Restores a stored hand-off snapshot into a fresh session (what
    /// `POST /v1/handoffs/{id}/resume` does; also for tests and the demo).
    pub async fn resume_handoff(&self, snapshot: &str) -> anyhow::Result<shepherd_actors::control::HandoffView> {
        let view = self.supervisor.send(shepherd_actors::control::ResumeHandoff(snapshot.to_string())).await??;
        Ok(view)
    }

    /// Graceful stop: the control API first (no new prompts; its token file is
    /// removed), then streams (no new events), then recoveries under way are given time
    /// to send their continue, then every actor stops.
    pub async fn shutdown(self) {
        if let Some(control) = self.control {
            control.stop().await;
        }
        // Waits for a reload under way; none starts after this.
        let grace = {
            let mut running = self.running.lock().await;
            running.stop_pumps().await;
            running.shutdown_grace()
        };
        match self.supervisor.send(Shutdown { grace }).await {
            Ok(0) => tracing::info!("shutdown complete"),
            Ok(left) => tracing::warn!(recoveries = left, "shutdown complete with recoveries unfinished"),
            Err(e) => tracing::warn!(error = %e, "supervisor gone before shutdown"),
        }
        if let Some(status) = self.status {
            status.stop().await; // the final state, after the last recovery
        }
        self.notifiers.stop().await; // what is batched is sent, within the targets' timeout
        self.trimmer.abort();
        for arbiter in &self.server_threads {
            arbiter.stop();
        }
        for arbiter in &self.io_threads {
            arbiter.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `top -H` tells the servers' threads apart: each is named `shepherd-srv-N`, the
    /// sessions' calls' `shepherd-io-N` (actix's own names are all cut to
    /// `actix-rt|system`).
    #[actix::test]
    async fn the_servers_threads_are_named_for_what_they_run() {
        let threads: Vec<Arbiter> = server_threads(2).into_iter().chain(io_threads(2)).collect();
        let names = || -> Vec<String> {
            std::fs::read_dir("/proc/self/task")
                .map(|tasks| {
                    tasks
                        .flatten()
                        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                        .map(|n| n.trim_end().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let want = ["shepherd-srv-0", "shepherd-srv-1", "shepherd-io-0", "shepherd-io-1"];
        let mut seen = names();
        for _ in 0..200 {
            if want.iter().all(|w| seen.iter().any(|n| n == w)) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            seen = names();
        }
        for arbiter in &threads {
            arbiter.stop();
        }
        for w in want {
            assert!(seen.iter().any(|n| n == w), "no thread named {w} among {seen:?}");
        }
    }
}
