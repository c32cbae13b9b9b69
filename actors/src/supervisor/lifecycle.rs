//! A server's place in the supervisor: attached (its sessions' shared environment is
//! built), reconfigured on a hot reload, detached (its sessions write their state and
//! stop).

use super::*;

/// Starts supervising a server.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AttachServer {
    pub name: String,
    pub engine: Arc<dyn Engine>,
    pub list_limit: u32,
    /// Back-off of a failed reconciliation (the server's reconnect back-off).
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// The server's stream time, fed by its pump (a default clock, never behind, where
    /// no pump runs).
    pub stream: Arc<crate::stream_clock::StreamClock>,
    /// The server's tracked sessions, which its pump routes events through.
    pub registry: Arc<Registry>,
    /// The threads the server's sessions' actors are spread over (none: the
    /// supervisor's own); its pump runs on one of them or on another
    /// (`supervisor.pump_apart`).
    pub threads: Vec<ArbiterHandle>,
    /// The engine the sessions on each of `threads` use (the same server through
    /// connections of that thread's own, so a session's REST calls are not carried by
    /// the one that opened a shared pool — the supervisor's; the daemon makes them on
    /// an io thread paired with the sessions' thread); none: `engine` for all.
    pub thread_engines: Vec<Arc<dyn Engine>>,
}

impl Handler<AttachServer> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: AttachServer, _: &mut Context<Self>) {
        msg.registry.set_kind_cap(self.fleet.max_event_types);
        msg.registry.set_threads(msg.threads);
        let env = Arc::new(SessionEnv {
            server: msg.name.as_str().into(),
            engine: msg.engine,
            clock: Arc::clone(&self.clock),
            journal: self.journal.clone(),
            in_flight: self.in_flight.clone(),
            instance: self.instance.clone(),
            ledger: Arc::clone(&self.ledger),
            windows: Arc::default(),
            workspace: Arc::clone(&self.workspace),
            scratch: self.scratch.clone(),
            guard: Arc::clone(&self.guard),
            advisor: self.advisor.clone(),
            breaker: Arc::default(),
            stream: msg.stream,
            not_idle: Arc::clone(&msg.registry.not_idle),
        });
        let thread_envs = msg.thread_engines.into_iter().map(|engine| Arc::new(SessionEnv { engine, ..(*env).clone() })).collect();
        self.servers.insert(
            msg.name,
            Server {
                env,
                thread_envs,
                list_limit: msg.list_limit,
                retry_initial: msg.retry_initial,
                retry_max: msg.retry_max,
                retry_next: msg.retry_initial,
                directories: HashSet::new(),
                connected: false,
                reconciled: false,
                blind: false,
                surveying: false,
                epoch: 0,
                windows_stale: true,
                registry: msg.registry,
                directories_capped: false,
            },
        );
    }
}

/// New settings (hot reload): session rules for every live session actor and for
/// those created later; the supervisor's own intervals and limits.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReconfigureAll {
    pub rules: Arc<SessionRules>,
    pub fleet: SupervisorConfig,
}

impl Handler<ReconfigureAll> for Supervisor {
    type Result = ResponseFuture<()>;

    /// Answered once every session actor has taken the new rules in: a status read after
    /// the reload shows them (reads take what the actors published).
    fn handle(&mut self, msg: ReconfigureAll, ctx: &mut Context<Self>) -> Self::Result {
        self.cfg = Arc::clone(&msg.rules);
        let told: Vec<_> = self.actors().iter().map(|addr| addr.send(Reconfigure(Arc::clone(&msg.rules)))).collect();
        for srv in self.servers.values() {
            srv.registry.set_kind_cap(msg.fleet.max_event_types);
        }
        let rearm = msg.fleet.cleanup_interval != self.fleet.cleanup_interval
            || msg.fleet.discovery_interval != self.fleet.discovery_interval;
        self.fleet = msg.fleet;
        if rearm {
            self.arm_intervals(ctx);
        }
        Box::pin(async move {
            for reconfigured in told {
                let _ = reconfigured.await;
            }
        })
    }
}

/// Stops supervising a server (removed from the configuration, or about to be attached
/// again with changed settings): its sessions write their state to the ledger and stop,
/// and its events, should any still arrive, are ignored. Answers with the number of
/// session actors released.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct DetachServer {
    pub name: String,
}

impl Handler<DetachServer> for Supervisor {
    type Result = ResponseFuture<usize>;

    fn handle(&mut self, msg: DetachServer, _: &mut Context<Self>) -> Self::Result {
        let registry = self.servers.remove(&msg.name).map(|s| s.registry);
        self.parents.retain(|(server, _), _| *server != msg.name);
        let mut retiring = Vec::new();
        if let Some(registry) = registry {
            retiring.extend(registry.slots.iter().map(|slot| slot.addr.send(Retire)));
            registry.slots.clear();
        }
        let count = retiring.len();
        tracing::info!(server = %msg.name, sessions = count, "no longer supervising this server");
        Box::pin(async move {
            // Each actor answers once its state is written; a stopped one is as good.
            futures::future::join_all(retiring).await;
            count
        })
    }
}
