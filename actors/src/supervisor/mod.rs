//! The supervisor: the one actor that sees the whole fleet.
//!
//! It creates a session actor the first time a session is seen (from an event or from
//! reconciliation), routes every event to its session, and after each event-stream
//! (re)connect reconciles by REST — the stream replays nothing, so busy sessions that
//! started or stopped while it was down are found through `GET /session/status`.
//! On shutdown it stops new recoveries, waits (bounded) for those under way, then stops
//! every session actor.
//!
//! Parts: [`bounds`] (the caps on what a server's data makes it remember), [`pause`]
//! (the off switch), and the messages by concern: [`lifecycle`] (attach, detach,
//! reconfigure), [`stream`] (events routed to sessions, the stream going up and down),
//! [`reconcile`] (reading a server by REST and bringing the actors in line),
//! [`inspect`] (what the fleet looks like), [`commands`] (the control API's orders and
//! shutdown), [`cleanup`] (evicting idle sessions). This file keeps the state and how
//! a session's actor is found or made ([`Supervisor::locate`], [`Supervisor::session`]).

mod bounds;
mod cleanup;
mod commands;
mod crossing;
mod inspect;
mod lifecycle;
mod pause;
mod reconcile;
mod registry;
mod stream;

pub use commands::Shutdown;
pub use inspect::{
    AskSessions, FleetView, InspectFleet, InspectLive, InspectLiveSources, InspectServers, LiveSources, LiveView,
    ServerView,
};
pub use lifecycle::{AttachServer, DetachServer, ReconfigureAll};
use registry::SessionSlot;
pub use registry::{LongWay, Registry, RouteState, Routed};
pub use stream::{Ingest, StreamDown, StreamUp};

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::config::{SessionRules, SupervisorConfig};
use crate::control::{
    ControlError, CustomPromptReply, GetSession, HandoffView, ListSessions, ResumeHandoff, SendCustomPrompt,
    SessionDetail, SessionJournal, StartHandoff,
};
use crate::event::{Envelope, Event, SessionInfo, Status};
use crate::guard::{NoGuard, PromptGuard};
use crate::journal::Journal;
use crate::ledger::Ledger;
use crate::ports::{Clock, Discovery, Engine, EngineError, NoWorkspace, Reads, Workspace};
use crate::session::actor::{
    Blind, CheckInterrupted, ChildObserve, DeliverCustom, Evict, Hydrate, Inspect, Reconfigure, RefreshTodos,
    RequestHandoff, ResumeIntents, ResumeSnapshot, Retire, Scratch, Sighted, StopSession,
};
use crate::session::procedures::in_flight::InFlight;
use crate::session::{Observe, SessionActor, SessionEnv};

/// One supervised OpenCode server.
struct Server {
    /// The sessions' shared environment, and the supervisor's own engine.
    env: Arc<SessionEnv>,
    /// The environment of the sessions on each of the server's threads (its engine
    /// that thread's own connections); none: `env` for all.
    thread_envs: Vec<Arc<SessionEnv>>,
    list_limit: u32,
    /// A failed reconciliation is retried after this long, doubling up to `retry_max`
    /// (a freshly restarted OpenCode may not answer REST yet while its stream does).
    retry_initial: Duration,
    retry_max: Duration,
    retry_next: Duration,
    directories: HashSet<String>,
    connected: bool,
    reconciled: bool,
    /// The stream went down and its sessions were told so ([`Blind`]); they are told
    /// [`Sighted`] once a reconciliation after the reconnect has read every directory's
    /// statuses. Sessions created meanwhile start blind.
    blind: bool,
    /// Counts the stream's connects and disconnects. A reconciliation is stamped with
    /// the epoch it started in; one that lands in another (the stream went down or came
    /// back meanwhile) describes a server that is gone and is dropped unapplied.
    epoch: u64,
    /// The models' context windows are to be (re)read: after every connect (they may
    /// change with the server's config) until one read succeeds.
    windows_stale: bool,
    /// A periodic reading of the server is under way: the next discovery skips it
    /// rather than start another (at 100,000 sessions each reads and parses a ~40-MB
    /// listing, and readings that outlast the interval would pile up).
    surveying: bool,
    /// The server's tracked sessions, shared with its pump ([`registry`]), and the
    /// thread they run on.
    registry: Arc<Registry>,
    /// `supervisor.max_directories` was reached (logged once).
    directories_capped: bool,
}

impl Server {
    /// A directory of this server, within `supervisor.max_directories` (see [`bounds`]).
    fn learn_directory(&mut self, dir: &str, cap: usize, server: &str) {
        if bounds::insert_capped(&mut self.directories, dir, cap) && !self.directories_capped {
            self.directories_capped = true;
            tracing::warn!(server = %server, cap, "supervisor.max_directories reached: an arbitrary directory is forgotten for each new one (logged once)");
        }
    }
}

/// The fleet supervisor.
pub struct Supervisor {
    cfg: Arc<SessionRules>,
    fleet: SupervisorConfig,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    journal: Journal,
    in_flight: InFlight,
    instance: String,
    /// The supervised servers; each keeps its tracked sessions ([`Registry`]).
    servers: HashMap<String, Server>,
    /// (server, child session) → parent session, from `parentID` and task parts.
    parents: HashMap<SessionKey, String>,
    /// `supervisor.max_parents` was reached (logged once).
    parents_capped: bool,
    /// How session directories are read (hand-off continuations).
    workspace: Arc<dyn Workspace>,
    /// Sessions Shepherd made for its own questions: not supervised.
    scratch: Scratch,
    /// The guard every prompt passes.
    guard: Arc<dyn PromptGuard>,
    /// The advisor actor every session consults (`advisor.enabled`).
    advisor: crate::advisor::actor::AdvisorSlot,
    /// The discovery and cleanup intervals, re-armed when a reload changes them.
    intervals: Vec<SpawnHandle>,
    /// `shepherd pause --all`, and the timer that ends it when it was given an end.
    fleet_pause: Option<crate::ledger::FleetPause>,
    fleet_pause_end: Option<SpawnHandle>,
}

/// `(server, session id)`: a session's identity everywhere. Maps keyed by it are looked
/// up with borrowed strings ([`key`]), so routing an event copies no id.
type SessionKey = (String, String);

/// A session key, owned or borrowed; hashes and compares like `(&str, &str)`.
trait KeyParts {
    fn parts(&self) -> (&str, &str);
}

impl KeyParts for SessionKey {
    fn parts(&self) -> (&str, &str) {
        (&self.0, &self.1)
    }
}

impl KeyParts for (&str, &str) {
    fn parts(&self) -> (&str, &str) {
        *self
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for SessionKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

/// `(String, String)` hashes as its two `str`s, in order: so does this.
impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state);
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

/// The borrowed form of a [`SessionKey`], for lookups.
fn key<'a>(parts: &'a (&'a str, &'a str)) -> &'a (dyn KeyParts + 'a) {
    parts
}

impl Supervisor {
    pub fn new(
        cfg: Arc<SessionRules>,
        fleet: SupervisorConfig,
        ledger: Arc<dyn Ledger>,
        clock: Arc<dyn Clock>,
        journal: Journal,
        instance: String,
    ) -> Self {
        Self {
            cfg,
            fleet,
            ledger,
            clock,
            journal,
            in_flight: InFlight::default(),
            instance,
            servers: HashMap::new(),
            parents: HashMap::new(),
            parents_capped: false,
            workspace: Arc::new(NoWorkspace),
            scratch: Scratch::default(),
            guard: Arc::new(NoGuard),
            advisor: Default::default(),
            intervals: Vec::new(),
            fleet_pause: None,
            fleet_pause_end: None,
        }
    }

    /// Puts every prompt through this guard (the daemon passes the guard actor's handle).
    pub fn with_guard(mut self, guard: Arc<dyn PromptGuard>) -> Self {
        self.guard = guard;
        self
    }

    /// Lets sessions consult the advisor actor before an abort or a nudge.
    pub fn with_advisor(self, advisor: Addr<crate::advisor::actor::AdvisorActor>) -> Self {
        self.advisor.set(Some(advisor));
        self
    }

    /// Consults whatever advisor `slot` holds (the daemon fills and empties it on reload).
    pub fn with_advisor_slot(mut self, slot: crate::advisor::actor::AdvisorSlot) -> Self {
        self.advisor = slot;
        self
    }

    /// Lets hand-offs read the sessions' repositories (the daemon passes local `git`).
    pub fn with_workspace(mut self, workspace: Arc<dyn Workspace>) -> Self {
        self.workspace = workspace;
        self
    }

    /// The actor of a session, tracked or looked up on every server by REST.
    fn locate(
        &mut self,
        session: String,
        only_server: Option<String>,
    ) -> impl ActorFuture<Self, Output = Option<Addr<SessionActor>>> {
        let tracked = self
            .servers
            .iter()
            .filter(|(name, _)| only_server.as_ref().is_none_or(|s| s == *name))
            .find_map(|(_, srv)| srv.registry.slots.get(session.as_str()).map(|slot| Addr::clone(&slot.addr)))
            .filter(Addr::connected);
        let engines: Vec<_> = self
            .servers
            .iter()
            .filter(|(name, _)| only_server.as_ref().is_none_or(|s| s == *name))
            .map(|(name, s)| (name.clone(), Arc::clone(&s.env.engine)))
            .collect();
        let lookup = async move {
            if tracked.is_some() {
                return (tracked, None);
            }
            for (server, engine) in engines {
                if let Ok(info) = engine.session(&session).await {
                    return (None, Some((server, info)));
                }
            }
            (None, None)
        };
        lookup.into_actor(self).map(|(tracked, found), act, ctx| {
            tracked.or_else(|| {
                let (server, info) = found?;
                let dir = info.directory.clone();
                act.session(&server, &info.id, Some(&info), dir.as_deref(), ctx)
            })
        })
    }

    /// The actor of a session, created (and hydrated by REST if `info` is unknown) on
    /// first sight.
    fn session(
        &mut self,
        server: &str,
        id: &str,
        info: Option<&SessionInfo>,
        directory: Option<&str>,
        ctx: &mut Context<Self>,
    ) -> Option<Addr<SessionActor>> {
        let srv = self.servers.get(server)?;
        if let Some(mut slot) = srv.registry.slots.get_mut(id) {
            if slot.addr.connected() {
                if slot.directory.is_none() {
                    slot.directory = info.and_then(|i| i.directory.clone());
                }
                return Some(Addr::clone(&slot.addr));
            }
        }
        let shared_id: Arc<str> = id.into();
        let env = srv.thread_envs.get(srv.registry.thread_of(id)).unwrap_or(&srv.env);
        let actor = SessionActor::with_shared_id(Arc::clone(&shared_id), Arc::clone(&self.cfg), Arc::clone(env));
        let view = actor.view();
        let addr = match srv.registry.thread_for(id) {
            Some(thread) => SessionActor::start_in_arbiter(thread, move |_| actor),
            None => actor.start(),
        };
        tracing::debug!(server, session = id, "tracking session");
        if srv.blind {
            addr.do_send(Blind);
        }
        self.hold_if_fleet_paused(&addr);
        match info {
            Some(info) => addr.do_send(Hydrate(info.clone())),
            None => {
                if let Some(dir) = directory {
                    addr.do_send(Hydrate(SessionInfo {
                        id: id.to_string(),
                        parent_id: None,
                        directory: Some(dir.to_string()),
                        title: None,
                        time: Default::default(),
                        metadata: None,
                    }));
                }
                let engine = Arc::clone(&srv.env.engine);
                let (addr2, id2, server2) = (addr.clone(), id.to_string(), server.to_string());
                ctx.spawn(
                    async move {
                        match engine.session(&id2).await {
                            Ok(info) => addr2.do_send(Hydrate(info)),
                            Err(e) => tracing::warn!(server = %server2, session = %id2, error = %e, "could not read the session's description"),
                        }
                    }
                    .into_actor(self),
                );
            }
        }
        let directory = info.and_then(|i| i.directory.clone()).or(directory.map(str::to_string));
        let last_seen = self.clock.now();
        let child = self.parents.contains_key(key(&(server, id)));
        let slot = SessionSlot { addr: Arc::new(addr.clone()), directory, last_seen, evicting: None, last_event: 0, child, view };
        srv.registry.slots.insert(shared_id, slot);
        Some(addr)
    }

    /// A server's registry (shared: no borrow of the supervisor is held with it).
    fn registry(&self, server: &str) -> Option<Arc<Registry>> {
        self.servers.get(server).map(|s| Arc::clone(&s.registry))
    }

    /// How many sessions are tracked, on every server.
    fn tracked(&self) -> usize {
        self.servers.values().map(|s| s.registry.len()).sum()
    }

    /// Every tracked session's actor.
    fn actors(&self) -> Vec<Addr<SessionActor>> {
        let mut out = Vec::with_capacity(self.tracked());
        for srv in self.servers.values() {
            out.extend(srv.registry.slots.iter().map(|slot| Addr::clone(&slot.addr)));
        }
        out
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.load_fleet_pause(ctx);
        self.arm_intervals(ctx);
    }
}

impl Supervisor {
    /// (Re)starts idle cleanup and discovery at the configured intervals.
    fn arm_intervals(&mut self, ctx: &mut Context<Self>) {
        for handle in self.intervals.drain(..) {
            ctx.cancel_future(handle);
        }
        let cleanup = ctx.run_interval(self.fleet.cleanup_interval, |act, ctx| act.clean_up(ctx));
        let discovery = ctx.run_interval(self.fleet.discovery_interval, |act, ctx| {
            // A blind server's reconnect reconciliation (and its retries) reads it.
            let connected: Vec<_> =
                act.servers.iter().filter(|(_, s)| s.connected && !s.blind).map(|(n, _)| n.clone()).collect();
            for server in connected {
                if act.servers.get(&server).is_some_and(|s| s.surveying) {
                    tracing::debug!(server = %server, "discovery: the last reading is still under way; skipped");
                    continue;
                }
                act.reconcile(&server, false, ctx);
            }
        });
        // Until when each server was watched, for a restart after a crash to catch up from
        // (a clean shutdown records it last; so does the stream going down).
        let watch_mark = ctx.run_interval(reconcile::WATCH_MARK_INTERVAL, |act, ctx| {
            for server in act.watched_servers() {
                act.record_watched(&server, ctx);
            }
        });
        self.intervals = vec![cleanup, discovery, watch_mark];
    }
}
