//! Hot reload: `SIGHUP` or `POST /v1/config/reload` re-reads the configuration the
//! daemon was started from (the same layers: defaults < file < environment < flags),
//! and applies what can change while running.
//!
//! Requests from every trigger go through one channel to one task, so two reloads never
//! interleave. A reload is all or nothing up to the point of applying: the new
//! configuration must load, validate, and every server it adds or changes must have its
//! password variable set (and the advisor its key), or nothing changes and the caller
//! gets the error naming the key. Then:
//! - session rules (timeouts, thresholds, templates, limits) go to every session actor
//!   and to those created later; the supervisor's intervals are re-armed;
//! - the guard and the advisor are retuned in place;
//! - a removed server's pump stops and its sessions save their state and stop; an added
//!   one is attached and its pump started; a changed one is both, in that order;
//! - keys read only at start-up ([`crate::config::diff::needs_restart`]) keep their
//!   running value and are reported as needing a restart.
//!
//! Every reload is one `shepherd::reload` log event listing the changed keys, old → new,
//! with secrets masked (passwords and API keys are read from variables the config names,
//! and only the names are ever shown).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::{Actor as _, Addr, ArbiterHandle};
use shepherd_actors::advisor::actor::{AdvisorActor, AdvisorSlot, Retune};
use shepherd_actors::config::{Config, ServerConfig};
use shepherd_actors::guard::GuardHandle;
use shepherd_actors::ports::Engine;
use shepherd_actors::supervisor::{AttachServer, DetachServer, ReconfigureAll, Supervisor};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::diff::{keep_restart_only, Change, ConfigDiff};
use crate::config::{resolve_password, ConfigError};
use crate::metrics::edge::TimedModel;
use crate::metrics::Metrics;
use crate::opencode::io_thread::IoThread;
use crate::opencode::{CallTimer, Credentials, EventPump, OpenCodeClient, PumpStats};
use crate::toast::Toasts;

/// Where a reload reads the configuration: the sources `shepherd run` was started with.
pub type ConfigLoader = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new configuration does not load or validate (names the key).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// It loads, but cannot be used: a named variable is unset, a client cannot be made.
    #[error("{key}: {reason}")]
    Unusable { key: String, reason: String },
    #[error("this daemon was started from a configuration value, not from files: there is nothing to re-read")]
    NoSource,
    #[error("Shepherd is shutting down")]
    ShuttingDown,
}

impl ReloadError {
    /// The key path the error is about, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ReloadError::Invalid(ConfigError::Invalid { key, .. }) | ReloadError::Unusable { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Asks the running daemon to reload (the `SIGHUP` handler, the control API, tests).
#[derive(Clone)]
pub struct ReloadHandle {
    tx: mpsc::Sender<Request>,
}

struct Request {
    trigger: &'static str,
    /// Apply this configuration instead of re-reading the sources (tests).
    config: Option<Config>,
    reply: oneshot::Sender<Result<ConfigDiff, ReloadError>>,
}

impl ReloadHandle {
    /// Re-reads the configuration and applies it; answers what changed.
    pub async fn reload(&self, trigger: &'static str) -> Result<ConfigDiff, ReloadError> {
        self.request(trigger, None).await
    }

    /// Applies `config` (validated first) as if it had been re-read.
    pub async fn apply(&self, config: Config) -> Result<ConfigDiff, ReloadError> {
        self.request("api", Some(config)).await
    }

    async fn request(&self, trigger: &'static str, config: Option<Config>) -> Result<ConfigDiff, ReloadError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Request { trigger, config, reply }).await.map_err(|_| ReloadError::ShuttingDown)?;
        answer.await.unwrap_or(Err(ReloadError::ShuttingDown))
    }
}

/// Each supervised server's pump counters, by server name (shared with the daemon).
pub(crate) type PumpTable = Arc<RwLock<Vec<(String, Arc<PumpStats>)>>>;

/// One server's event pump, stoppable on its own.
struct Pump {
    stop: watch::Sender<bool>,
    /// Resolves (or fails: the thread is gone) once the pump has ended.
    done: tokio::sync::oneshot::Receiver<()>,
}

/// Everything a reload may change, owned by the daemon (behind a lock shared with the
/// reload task, so shutdown waits for a reload under way).
pub(crate) struct Running {
    pub(crate) cfg: Config,
    loader: Option<ConfigLoader>,
    supervisor: Addr<Supervisor>,
    guard: Option<GuardHandle>,
    advisor: AdvisorSlot,
    toasts: Toasts,
    pumps: BTreeMap<String, Pump>,
    /// Each server's REST client (clones share their long-call timeout with the engine
    /// the sessions hold).
    clients: BTreeMap<String, OpenCodeClient>,
    pub(crate) pump_stats: PumpTable,
    metrics: Arc<Metrics>,
    stopped: bool,
    /// The threads servers run on (`supervisor.server_threads`): each new server takes
    /// the next in turn ([`threads_of`]).
    threads: Vec<ArbiterHandle>,
    /// Where the sessions' calls to OpenCode are made, one per server thread
    /// ([`Self::with_io_threads`]).
    io: Vec<ArbiterHandle>,
    next_thread: usize,
}

/// A server ready to start: its password read, its clients built ([`prepare`]).
pub(crate) struct Prepared {
    server: ServerConfig,
    auth: Option<Credentials>,
    client: OpenCodeClient,
}

/// Resolves the server's password and builds its REST client: what can fail of a
/// server's start, tried before anything starts (start-up) or changes (a reload).
pub(crate) fn prepare(metrics: &Arc<Metrics>, cfg: &Config, server: &ServerConfig) -> Result<Prepared, ReloadError> {
    let unusable = |reason: String| ReloadError::Unusable { key: format!("servers.{}", server.name), reason };
    let auth = resolve_password(server)
        .map_err(|e| unusable(e.to_string()))?
        .map(|password| Credentials { username: server.username.clone(), password });
    let (metrics, name) = (Arc::clone(metrics), server.name.clone());
    let timer = CallTimer(Arc::new(move |call: &str, took: std::time::Duration, outcome: &'static str| {
        metrics.opencode_call(&name, call, outcome, took.as_secs_f64())
    }));
    let client = OpenCodeClient::new(server, auth.clone())
        .map_err(|e| unusable(e.to_string()))?
        .with_long_call_timeout(cfg.compaction.max_wait + server.request_timeout)
        .with_call_timer(timer);
    Ok(Prepared { server: server.clone(), auth, client })
}

impl Running {
    pub(crate) fn new(
        cfg: Config,
        loader: Option<ConfigLoader>,
        supervisor: Addr<Supervisor>,
        guard: Option<GuardHandle>,
        advisor: AdvisorSlot,
        toasts: Toasts,
        metrics: Arc<Metrics>,
    ) -> Running {
        Running {
            cfg,
            loader,
            supervisor,
            guard,
            advisor,
            toasts,
            pumps: BTreeMap::new(),
            clients: BTreeMap::new(),
            pump_stats: Arc::default(),
            metrics,
            stopped: false,
            threads: Vec::new(),
            next_thread: 0,
            io: Vec::new(),
        }
    }

    /// Runs each server (its pump and its sessions) on one of these threads, in turn;
    /// without any, on the caller's.
    pub(crate) fn with_threads(mut self, threads: Vec<ArbiterHandle>) -> Self {
        self.threads = threads;
        self
    }

    /// Makes the calls of the sessions on server thread N on io thread N ([`IoThread`]):
    /// one each, so the calls' work (an answer's parse) spreads as the sessions do;
    /// without them, on the sessions' own threads.
    pub(crate) fn with_io_threads(mut self, io: Vec<ArbiterHandle>) -> Self {
        self.io = io;
        self
    }

    /// Attaches the server to the supervisor and starts its pump.
    fn start_server(&mut self, p: Prepared) {
        let Prepared { server, auth, client } = p;
        let pump = EventPump::new(server.clone(), auth, self.supervisor.clone());
        let (pump_thread, sessions, apart) = match self.threads.len() {
            0 => (None, Vec::new(), false),
            n => {
                let (pump, sessions) = threads_of(self.next_thread, n, self.cfg.supervisor.pump_apart);
                self.next_thread += 1;
                let apart = !sessions.contains(&pump);
                (Some(self.threads[pump].clone()), sessions, apart)
            }
        };
        let threads = sessions.iter().map(|&t| self.threads[t].clone()).collect();
        let thread_engines = sessions
            .iter()
            .map(|&t| -> Arc<dyn Engine> {
                let engine: Arc<dyn Engine> = match client.with_own_connections() {
                    Ok(own) => Arc::new(own),
                    Err(e) => {
                        tracing::warn!(server = %server.name, error = %e, "a sessions' thread shares the server's connections");
                        Arc::new(client.clone())
                    }
                };
                match self.io.get(t) {
                    Some(io) => Arc::new(IoThread::new(engine, io.clone())),
                    None => engine,
                }
            })
            .collect();
        self.toasts.attach(&server.name, client.clone());
        self.clients.insert(server.name.clone(), client.clone());
        self.supervisor.do_send(AttachServer {
            name: server.name.clone(),
            engine: Arc::new(client),
            list_limit: server.list_limit,
            retry_initial: server.reconnect_initial,
            retry_max: server.reconnect_max,
            stream: Arc::clone(&pump.stats().clock),
            registry: pump.registry(),
            threads,
            thread_engines,
        });
        let (stop, stop_rx) = watch::channel(false);
        if let Ok(mut stats) = self.pump_stats.write() {
            stats.retain(|(name, _)| *name != server.name);
            stats.push((server.name.clone(), pump.stats()));
        }
        self.metrics.add_pump(&server.name, pump.stats());
        let (ended, done) = tokio::sync::oneshot::channel();
        let run = async move {
            pump.run(stop_rx, apart).await;
            let _ = ended.send(());
        };
        match &pump_thread {
            Some(thread) => {
                thread.spawn(run);
            }
            None => {
                actix::spawn(run);
            }
        }
        self.pumps.insert(server.name.clone(), Pump { stop, done });
        tracing::info!(server = %server.name, url = %server.url, "supervising");
    }

    /// Every configured server at start-up, as [`prepare`]d before anything started.
    pub(crate) fn start_servers(&mut self, prepared: Vec<Prepared>) {
        for p in prepared {
            self.start_server(p);
        }
    }

    /// Stops the server's pump, then releases its sessions (saved to the ledger).
    async fn stop_server(&mut self, name: &str) -> usize {
        if let Some(pump) = self.pumps.remove(name) {
            let _ = pump.stop.send(true);
            let _ = pump.done.await;
        }
        if let Ok(mut stats) = self.pump_stats.write() {
            stats.retain(|(n, _)| n != name);
        }
        self.metrics.remove_pump(name);
        self.toasts.detach(name);
        self.clients.remove(name);
        self.supervisor.send(DetachServer { name: name.to_string() }).await.unwrap_or(0)
    }

    /// Stops every pump (shutdown); later reloads are refused.
    pub(crate) async fn stop_pumps(&mut self) {
        self.stopped = true;
        for (_, pump) in std::mem::take(&mut self.pumps) {
            let _ = pump.stop.send(true);
            let _ = pump.done.await;
        }
    }

    /// How long shutdown waits for recoveries under way: their waits plus a few requests.
    pub(crate) fn shutdown_grace(&self) -> Duration {
        let r = &self.cfg.recovery;
        let slowest = self.cfg.servers.iter().map(|s| s.request_timeout).max().unwrap_or_default();
        r.abort_poll_max + r.wait_after_abort + slowest * 3
    }

    async fn reload(&mut self, trigger: &'static str, given: Option<Config>) -> Result<ConfigDiff, ReloadError> {
        if self.stopped {
            return Err(ReloadError::ShuttingDown);
        }
        let new = match given {
            Some(cfg) => {
                cfg.validate().map_err(|e| ReloadError::Unusable { key: e.key, reason: e.reason })?;
                cfg
            }
            None => (self.loader.as_ref().ok_or(ReloadError::NoSource)?)()?,
        };
        let diff = ConfigDiff::between(&self.cfg, &new);
        let new = keep_restart_only(&self.cfg, new);
        // Everything that can fail, before anything changes.
        let mut prepared = Vec::new();
        for name in diff.servers_added.iter().chain(&diff.servers_changed) {
            if let Some(server) = new.servers.iter().find(|s| &s.name == name) {
                prepared.push(prepare(&self.metrics, &new, server)?);
            }
        }
        let model = if new.advisor.enabled && diff.touches("advisor.") {
            crate::advisor::ChatCompletions::from_config(&new.advisor)
                .map_err(|e| ReloadError::Unusable { key: "advisor".into(), reason: e.to_string() })?
                .map(|model| TimedModel::wrap(model, Arc::clone(&self.metrics)))
        } else {
            None
        };
        if diff.is_empty() {
            tracing::info!(target: "shepherd::reload", trigger, changed = 0, "configuration reloaded: nothing changed");
            return Ok(diff);
        }

        let rules = Arc::new(new.session_rules());
        crate::logging::set_redactor(rules.redactor.clone());
        self.supervisor.do_send(ReconfigureAll { rules, fleet: new.supervisor.clone() });
        if diff.touches("guard.") {
            if let Some(guard) = &self.guard {
                guard.retune(new.guard.clone());
            }
        }
        if diff.touches("advisor.") {
            // The model advisor runs only while a model is configured; the heuristics
            // answer in place otherwise (and read `advisor.*` from the session rules).
            match (self.advisor.get(), model) {
                (Some(addr), Some(model)) => addr.do_send(Retune { cfg: new.advisor.clone(), model: Some(model) }),
                (None, Some(model)) => {
                    self.advisor.set(Some(AdvisorActor::new(new.advisor.clone(), Some(model)).start()));
                }
                (Some(_), None) => self.advisor.set(None),
                (None, None) => {}
            }
        }
        self.toasts.set_config(new.toasts.clone());
        if new.compaction.max_wait != self.cfg.compaction.max_wait {
            // A compaction call may take `max_wait`; its HTTP timeout follows.
            for server in &new.servers {
                if let Some(client) = self.clients.get(&server.name) {
                    client.set_long_call_timeout(new.compaction.max_wait + server.request_timeout);
                }
            }
        }
        let mut released = 0;
        for name in diff.servers_removed.iter().chain(&diff.servers_changed) {
            released += self.stop_server(name).await;
        }
        for p in prepared {
            self.start_server(p);
        }
        self.cfg = new;
        log_reload(trigger, &diff, released);
        Ok(diff)
    }
}

/// The handle triggers hold, and the requests [`serve`] answers.
pub(crate) fn channel() -> (ReloadHandle, Requests) {
    let (tx, rx) = mpsc::channel::<Request>(8);
    (ReloadHandle { tx }, Requests(rx))
}

/// Reload requests on their way to [`serve`].
pub(crate) struct Requests(mpsc::Receiver<Request>);

/// Serves reload requests one at a time until every handle is gone.
pub(crate) fn serve(requests: Requests, running: Arc<tokio::sync::Mutex<Running>>) {
    let mut rx = requests.0;
    actix::spawn(async move {
        while let Some(req) = rx.recv().await {
            let result = running.lock().await.reload(req.trigger, req.config).await;
            if let Err(e) = &result {
                tracing::warn!(
                    target: "shepherd::reload",
                    trigger = req.trigger,
                    key = e.key().unwrap_or(""),
                    error = %e,
                    "configuration reload rejected; the running configuration stays"
                );
            }
            let _ = req.reply.send(result);
        }
    });
}

/// The threads (of `n`) the `k`-th server attached runs on: its pump's, and those its
/// sessions are spread over. Apart, the pump takes an odd thread (servers in turn) and
/// the sessions every other one, so one server's fleet decides on every core but the
/// one reading its stream (with two threads every server's pump shares one, its
/// sessions the other: each core does one kind of work); otherwise the pump and its
/// sessions share the `k`-th thread in turn.
fn threads_of(k: usize, n: usize, apart: bool) -> (usize, Vec<usize>) {
    if apart && n >= 2 {
        let pump = (2 * k + 1) % n;
        (pump, (0..n).filter(|&t| t != pump).collect())
    } else {
        (k % n, vec![k % n])
    }
}

/// The one event a reload makes.
fn log_reload(trigger: &str, diff: &ConfigDiff, released: usize) {
    let list = |changes: &[Change]| changes.iter().map(Change::to_string).collect::<Vec<_>>().join("; ");
    let names = |v: &[String]| v.join(",");
    let (changed, restart) = (list(&diff.live), list(&diff.needs_restart));
    let keys = diff.needs_restart.iter().map(|c| c.key.as_str()).collect::<Vec<_>>().join(", ");
    macro_rules! event {
        ($level:ident, $($msg:tt)+) => {
            tracing::$level!(
                target: "shepherd::reload",
                trigger,
                changed = %changed,
                needs_restart = %restart,
                servers_added = %names(&diff.servers_added),
                servers_removed = %names(&diff.servers_removed),
                servers_restarted = %names(&diff.servers_changed),
                sessions_released = released,
                $($msg)+
            )
        };
    }
    if diff.needs_restart.is_empty() {
        event!(info, "configuration reloaded: {} key(s) changed", diff.live.len());
    } else {
        event!(
            warn,
            "configuration reloaded: {} key(s) changed; needs a restart (ignored until then): {keys}",
            diff.live.len()
        );
    }
}

#[cfg(test)]
mod thread_tests {
    use super::threads_of;

    /// A server's pump and sessions are on different threads whenever there are two to
    /// choose from and `pump_apart` is on, and its sessions then take every thread but
    /// the pump's; pumps spread over the threads.
    #[test]
    fn a_servers_pump_and_sessions_take_different_threads_when_apart() {
        assert_eq!(threads_of(0, 1, true), (0, vec![0]), "one thread: shared");
        assert_eq!(threads_of(0, 2, true), (1, vec![0]));
        assert_eq!(threads_of(1, 2, true), (1, vec![0]), "two threads: pumps on one, sessions on the other");
        assert_eq!([0, 1].map(|k| threads_of(k, 4, true)), [(1, vec![0, 2, 3]), (3, vec![0, 1, 2])]);
        for n in 2..9 {
            for k in 0..20 {
                let (pump, sessions) = threads_of(k, n, true);
                assert!(pump < n && !sessions.contains(&pump), "{k} of {n}");
                assert_eq!(sessions.len(), n - 1, "every other thread decides: {k} of {n}");
            }
        }
        assert_eq!([0, 1, 2].map(|k| threads_of(k, 2, false)), [(0, vec![0]), (1, vec![1]), (0, vec![0])], "together, in turn");
    }
}
