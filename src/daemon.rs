//! Wiring: one supervisor, one REST client and one event pump per configured server.
//!
//! [`Daemon::start`] must be called inside a running actix `System`. The same wiring
//! serves `shepherd run`, `shepherd demo` and the end-to-end tests, so what the tests
//! prove is what users run. With `control.enabled`, the control API
//! ([`crate::control`]) is served on a thread of its own beside the actors; with
//! `status.enabled`, the status file ([`crate::status`]) is written from another. The
//! daemon's [`Metrics`] (served at the control API's `/metrics`) follow its journal,
//! its pumps, its ledger and its advisor model.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use anyhow::Context as _;
use shepherd_actors::advisor::actor::AdvisorActor;
use shepherd_actors::config::Config;
use shepherd_actors::journal::Journal;
use shepherd_actors::ports::SystemClock;
use shepherd_actors::supervisor::{AttachServer, FleetView, InspectFleet, Shutdown, Supervisor};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::resolve_password;
use crate::control::{ControlServer, ControlToken};
use crate::metrics::edge::{CountingLedger, TimedModel};
use crate::metrics::Metrics;
use crate::opencode::{Credentials, EventPump, OpenCodeClient, PumpStats};
use crate::status::{status_path, StatusWriter};

/// A running Shepherd.
pub struct Daemon {
    supervisor: Addr<Supervisor>,
    journal: Journal,
    stop_pumps: watch::Sender<bool>,
    pumps: Vec<JoinHandle<()>>,
    pump_stats: Vec<(String, Arc<PumpStats>)>,
    shutdown_grace: Duration,
    instance: String,
    control: Option<ControlServer>,
    status: Option<StatusWriter>,
    metrics: Arc<Metrics>,
    metrics_task: JoinHandle<()>,
}

impl Daemon {
    /// Attaches to every configured server. Fails only on configuration problems (a
    /// named password variable that is unset, a control port already taken); an
    /// unreachable server is retried by its pump, not fatal.
    pub fn start(cfg: &Config) -> anyhow::Result<Self> {
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let journal = Journal::new();
        let recovery = cfg.recovery.clone();
        // This daemon's own recorder (never a global one: tests run several daemons).
        let metrics = Metrics::new();
        let metrics_task = metrics.follow(&journal);
        // Before any actor starts: every session actor loads its state from here.
        let ledger = crate::store::open_ledger(&cfg.store).map_err(|e| anyhow::anyhow!("store: {e}"))?;
        let ledger = CountingLedger::wrap(ledger, Arc::clone(&metrics));
        let supervisor = Supervisor::new(
            Arc::new(cfg.session_rules()),
            cfg.supervisor.clone(),
            ledger,
            Arc::new(SystemClock),
            journal.clone(),
            instance.clone(),
        )
        .with_workspace(Arc::new(crate::workspace::GitWorkspace))
        .with_guard(crate::guard::start(&cfg.guard, Arc::new(SystemClock), &instance)?);
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
        let supervisor = match model {
            Some(model) => supervisor.with_advisor(AdvisorActor::new(cfg.advisor.clone(), Some(model)).start()),
            None => supervisor,
        }
        .start();
        // Before the pumps: a control port already taken fails start-up with nothing running.
        let control = if cfg.control.enabled {
            Some(ControlServer::start(&cfg.control, supervisor.clone(), Arc::clone(&metrics))?)
        } else {
            None
        };
        let (stop_pumps, stop_rx) = watch::channel(false);
        let mut pumps = Vec::new();
        let mut pump_stats = Vec::new();
        let mut slowest_request = Duration::ZERO;
        for server in &cfg.servers {
            let auth = resolve_password(server)
                .with_context(|| format!("server {:?}", server.name))?
                .map(|password| Credentials { username: server.username.clone(), password });
            let client = OpenCodeClient::new(server, auth.clone())
                .map_err(|e| anyhow::anyhow!("server {:?}: {e}", server.name))?
                .with_long_call_timeout(cfg.compaction.max_wait + server.request_timeout);
            supervisor.do_send(AttachServer {
                name: server.name.clone(),
                engine: Arc::new(client),
                list_limit: server.list_limit,
                retry_initial: server.reconnect_initial,
                retry_max: server.reconnect_max,
            });
            let pump = EventPump::new(server.clone(), auth, supervisor.clone());
            pump_stats.push((server.name.clone(), pump.stats()));
            metrics.add_pump(&server.name, pump.stats());
            pumps.push(actix::spawn(pump.run(stop_rx.clone())));
            slowest_request = slowest_request.max(server.request_timeout);
            tracing::info!(server = %server.name, url = %server.url, instance = %instance, "supervising");
        }
        // Long enough for a recovery under way to finish: its waits plus a few requests.
        let shutdown_grace = recovery.abort_poll_max + recovery.wait_after_abort + slowest_request * 3;
        let status = if cfg.status.enabled {
            let path = status_path(&cfg.status, &|name| std::env::var_os(name))?;
            Some(StatusWriter::start(&cfg.status, path, &journal, supervisor.clone(), instance.clone())?)
        } else {
            None
        };
        Ok(Self {
            supervisor,
            journal,
            stop_pumps,
            pumps,
            pump_stats,
            shutdown_grace,
            instance,
            control,
            status,
            metrics,
            metrics_task,
        })
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
        self.status.as_ref().map(StatusWriter::path)
    }

    /// Counters of each server's event pump.
    pub fn pump_stats(&self) -> &[(String, Arc<PumpStats>)] {
        &self.pump_stats
    }

    /// This daemon's metrics (what `GET /metrics` serves).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The fleet as the supervisor sees it now.
    pub async fn fleet(&self) -> FleetView {
        self.supervisor.send(InspectFleet).await.unwrap_or_default()
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
        let _ = self.stop_pumps.send(true);
        for pump in self.pumps {
            let _ = pump.await;
        }
        match self.supervisor.send(Shutdown { grace: self.shutdown_grace }).await {
            Ok(0) => tracing::info!("shutdown complete"),
            Ok(left) => tracing::warn!(recoveries = left, "shutdown complete with recoveries unfinished"),
            Err(e) => tracing::warn!(error = %e, "supervisor gone before shutdown"),
        }
        if let Some(status) = self.status {
            status.stop().await; // the final state, after the last recovery
        }
        self.metrics_task.abort();
    }
}
