//! The end-to-end rig: the project's fake model, a real OpenCode server (pinned,
//! installed from npm on first use) and a real Shepherd daemon attached to it.

#![allow(dead_code)] // each test binary uses a different part of the rig

pub mod control;
pub mod faulty_proxy;
pub mod logs;
pub mod process;
pub mod receiver;

use std::time::Duration;

use shepherd::daemon::Daemon;
use shepherd_actors::config::{AdvisorConfig, Config, RecoveryConfig, ServerConfig};
use shepherd_actors::journal::{Action, ActionRecord, Outcome};
use shepherd_testbed::client::OpenCodeClient;
use shepherd_testbed::fake_model::FakeModel;
use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
use tokio::sync::broadcast;

/// How long a test waits for something Shepherd or OpenCode should do within seconds.
pub const PATIENCE: Duration = Duration::from_secs(40);

pub struct Rig {
    pub fake: FakeModel,
    pub opencode: OpenCodeServer,
    pub client: OpenCodeClient,
    pub daemon: Option<Daemon>,
    /// The configuration the daemon runs with.
    pub cfg: Config,
    records: broadcast::Receiver<ActionRecord>,
    pub seen: Vec<ActionRecord>,
}

/// Recovery settings scaled down to seconds for tests.
pub fn fast_recovery() -> RecoveryConfig {
    RecoveryConfig {
        stall_timeout: Duration::from_secs(4),
        planning_timeout: Duration::from_secs(4),
        wait_after_abort: Duration::from_millis(300),
        abort_poll_interval: Duration::from_millis(100),
        abort_poll_max: Duration::from_secs(3),
        cooldown: Duration::from_secs(5),
        max_backoff: Duration::from_secs(20),
        ..RecoveryConfig::default()
    }
}

/// The heuristic advice (on by default) scaled like the recovery timings: test
/// sessions are seconds old when they stall (the production "new session" is 30 s,
/// a postponement 1 min).
pub fn fast_advice() -> AdvisorConfig {
    AdvisorConfig { new_session: Duration::from_secs(1), postpone: Duration::from_secs(2), ..AdvisorConfig::default() }
}

impl Rig {
    pub async fn start(recovery: RecoveryConfig) -> anyhow::Result<Rig> {
        Self::start_with(recovery, |o| o).await
    }

    pub async fn start_with(
        recovery: RecoveryConfig,
        tweak: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions,
    ) -> anyhow::Result<Rig> {
        Self::start_via(recovery, tweak, Ok).await
    }

    /// Like [`Rig::start_with`], with Shepherd talking to the URL `via` returns
    /// (e.g. a fault-injecting proxy in front of OpenCode).
    pub async fn start_via(
        recovery: RecoveryConfig,
        tweak: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions,
        via: impl FnOnce(String) -> anyhow::Result<String>,
    ) -> anyhow::Result<Rig> {
        Self::start_full(|c| c.recovery = recovery, tweak, via).await
    }

    /// With Shepherd's whole configuration adjusted by `configure` (the server list is
    /// filled in; recovery starts from [`fast_recovery`], the control API is off).
    pub async fn start_config(configure: impl FnOnce(&mut Config)) -> anyhow::Result<Rig> {
        Self::start_full(configure, |o| o, Ok).await
    }

    pub async fn start_full(
        configure: impl FnOnce(&mut Config),
        tweak: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions,
        via: impl FnOnce(String) -> anyhow::Result<String>,
    ) -> anyhow::Result<Rig> {
        Self::start_with_fake(|c, _| configure(c), tweak, via).await
    }

    /// Like [`Rig::start_with_fake`], with the fake model at hand while configuring (e.g. to
    /// point the advisor at it).
    pub async fn start_with_fake(
        configure: impl FnOnce(&mut Config, &FakeModel),
        tweak: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions,
        via: impl FnOnce(String) -> anyhow::Result<String>,
    ) -> anyhow::Result<Rig> {
        Self::start_inner(configure, tweak, via, None).await
    }

    /// Like [`Rig::start_config`], with the configuration written to `file` (TOML) and
    /// the daemon started from it, so a reload re-reads the file ([`Rig::write_config`]).
    pub async fn start_reloadable(file: &std::path::Path, configure: impl FnOnce(&mut Config)) -> anyhow::Result<Rig> {
        Self::start_inner(|c, _| configure(c), |o| o, Ok, Some(file.to_path_buf())).await
    }

    /// Writes `cfg` as the configuration file a reload reads.
    pub fn write_config(path: &std::path::Path, cfg: &Config) -> anyhow::Result<()> {
        std::fs::write(path, shepherd::config::render_effective(cfg))?;
        Ok(())
    }

    async fn start_inner(
        configure: impl FnOnce(&mut Config, &FakeModel),
        tweak: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions,
        via: impl FnOnce(String) -> anyhow::Result<String>,
        file: Option<std::path::PathBuf>,
    ) -> anyhow::Result<Rig> {
        let fake = FakeModel::start()?;
        let opencode = OpenCodeServer::start(tweak(OpenCodeOptions::for_fake(&fake))).await?;
        let client = opencode.client();
        // The first turn after a server start pays the instance boot (seconds): pay it
        // before Shepherd watches, so test-sized stall timeouts measure the model only.
        let warmup = client.create_session(Some("warmup")).await?;
        client.prompt_async(&warmup, "[[fake:ok]] warm up", None, None, false).await?;
        client.wait_busy(&warmup, PATIENCE).await.ok();
        client.wait_idle(&warmup, PATIENCE).await?;
        let mut cfg = Config {
            servers: vec![ServerConfig::new("local", via(opencode.url())?)],
            recovery: fast_recovery(),
            ..Config::default()
        };
        cfg.control.enabled = false;
        // The sessions spread over three threads (the pump on a fourth), however many
        // cores the machine has: every suite runs the layout of a large machine, where a
        // session's events, its parent's and the supervisor's sends cross between threads.
        cfg.supervisor.server_threads = 4;
        // Tests restart servers: reconnect within seconds, not the production 30 s cap.
        cfg.servers[0].reconnect_max = Duration::from_secs(2);
        // Never the user's own ledger; tests that need persistence set a temp path.
        cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
        // Never the user's own status file either.
        cfg.status.enabled = false;
        cfg.advisor = fast_advice();
        configure(&mut cfg, &fake);
        cfg.validate()?;
        let daemon = match file {
            None => Daemon::start(&cfg)?,
            Some(path) => {
                Self::write_config(&path, &cfg)?;
                // The file alone: the test's process environment is not configuration.
                let sources = shepherd::config::ConfigSources { file: Some(path), ..Default::default() };
                let loader: shepherd::reload::ConfigLoader =
                    std::sync::Arc::new(move || shepherd::config::load_with_env(&sources, &[]));
                Daemon::start_reloadable(&cfg, loader)?
            }
        };
        let records = daemon.journal().subscribe();
        let rig = Rig { fake, opencode, client, daemon: Some(daemon), cfg, records, seen: Vec::new() };
        rig.wait_connected().await?;
        Ok(rig)
    }

    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("daemon running")
    }

    /// Waits until the daemon's stream is connected and reconciled.
    pub async fn wait_connected(&self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let fleet = self.daemon().fleet().await;
            if fleet.servers.iter().all(|s| s.connected && s.reconciled) && !fleet.servers.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "daemon never connected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Cuts the event stream at the proxy and waits until Shepherd has noticed (the
    /// proxy ends a stream at its next frame: the cut is held until then, however late
    /// that comes). The cut stays until the test lifts it.
    ///
    /// It first waits until Shepherd sees the stream connected: just after a reconnect
    /// the pump counts its connect before the supervisor hears of it, and a cut made then
    /// would read as noticed at once and be lifted before the proxy ever ended a stream.
    pub async fn cut_the_stream(&self, faults: &faulty_proxy::Faults) -> anyhow::Result<()> {
        self.wait_connected().await?;
        faults.cut_events.store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.daemon().fleet().await.servers.iter().any(|s| s.connected) {
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the cut was never noticed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn pull(&mut self) {
        while let Ok(r) = self.records.try_recv() {
            self.seen.push(r);
        }
    }

    /// Waits for a record of `action`/`outcome` on `session` and returns it.
    pub async fn wait_record(
        &mut self,
        session: &str,
        action: Action,
        outcome: Outcome,
        timeout: Duration,
    ) -> anyhow::Result<ActionRecord> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.pull();
            if let Some(r) =
                self.seen.iter().find(|r| r.session == session && r.action == action && r.outcome == outcome)
            {
                return Ok(r.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "no {action:?}/{outcome:?} for {session} within {timeout:?}; seen: {:#?}\nopencode log tail:\n{}",
                    self.records_for(session),
                    self.opencode.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for a hand-off record of `session` entering `phase` and returns it.
    pub async fn wait_phase(&mut self, session: &str, phase: &str, timeout: Duration) -> anyhow::Result<ActionRecord> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.pull();
            if let Some(r) = self.seen.iter().find(|r| {
                r.session == session && r.action == Action::Handoff && r.numbers.phase.as_deref() == Some(phase)
            }) {
                return Ok(r.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "no hand-off phase {phase} for {session} within {timeout:?}; seen: {:#?}\nopencode log tail:\n{}",
                    self.records_for(session),
                    self.opencode.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every record so far, of every session.
    pub fn seen_so_far(&mut self) -> Vec<ActionRecord> {
        self.pull();
        self.seen.clone()
    }

    /// Every record about `session` so far.
    pub fn records_for(&mut self, session: &str) -> Vec<(Action, Outcome, String)> {
        self.pull();
        self.seen.iter().filter(|r| r.session == session).map(|r| (r.action, r.outcome, r.reason.clone())).collect()
    }

    pub fn count(&mut self, session: &str, action: Action) -> usize {
        self.records_for(session).iter().filter(|(a, o, _)| *a == action && *o == Outcome::Done).count()
    }

    /// Stops Shepherd (gracefully) and starts a new one with the same configuration —
    /// a Shepherd restart, with OpenCode left running.
    pub async fn restart_daemon(&mut self) -> anyhow::Result<()> {
        self.stop_daemon().await;
        self.start_daemon_again().await
    }

    /// Stops Shepherd (gracefully), OpenCode left running, until
    /// [`Rig::start_daemon_again`].
    pub async fn stop_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown().await;
        }
        self.pull();
    }

    /// Starts a new Shepherd with the same configuration after [`Rig::stop_daemon`].
    pub async fn start_daemon_again(&mut self) -> anyhow::Result<()> {
        let daemon = Daemon::start(&self.cfg)?;
        self.records = daemon.journal().subscribe();
        self.daemon = Some(daemon);
        self.wait_connected().await
    }

    pub async fn stop(mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown().await;
        }
        self.opencode.stop().await;
    }
}

/// The texts of a session's user messages that carry Shepherd's tag of `kind`.
pub fn tagged(messages: &[shepherd_testbed::client::Message], kind: &str) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m.role() == "user")
        .filter(|m| {
            m.parts.iter().any(|p| p.pointer("/metadata/shepherd/kind").and_then(serde_json::Value::as_str) == Some(kind))
        })
        .map(shepherd_testbed::client::Message::text)
        .collect()
}

/// Sessions whose title carries a hand-off marker (`[hf_…]`).
pub async fn fresh_sessions(rig: &Rig) -> anyhow::Result<Vec<serde_json::Value>> {
    let all = rig.client.get_json("/session?limit=100").await?;
    Ok(all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["title"].as_str().is_some_and(|t| t.contains("[hf_")))
        .cloned()
        .collect())
}
