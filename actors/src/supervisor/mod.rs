//! The supervisor: the one actor that sees the whole fleet.
//!
//! It creates a session actor the first time a session is seen (from an event or from
//! reconciliation), routes every event to its session, and after each event-stream
//! (re)connect reconciles by REST — the stream replays nothing, so busy sessions that
//! started or stopped while it was down are found through `GET /session/status`.
//! On shutdown it stops new recoveries, waits (bounded) for those under way, then stops
//! every session actor.
//!
//! Parts: [`bounds`] (the caps on what a server's data makes it remember).

mod bounds;
mod pause;

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
use crate::ports::{Clock, Engine, EngineError, NoWorkspace, Workspace};
use crate::session::actor::{
    Blind, CheckInterrupted, ChildObserve, DeliverCustom, Evict, Hydrate, Inspect, Reconfigure, RefreshTodos,
    RequestHandoff, ResumeIntents, ResumeSnapshot, Retire, Scratch, Sighted, StopSession,
};
use crate::session::recovery::InFlight;
use crate::session::{Observe, SessionActor, SessionEnv};

/// One supervised OpenCode server.
struct Server {
    env: Arc<SessionEnv>,
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
    events: BTreeMap<String, u64>,
    /// Which caps ([`bounds`]) this server's data reached (each is logged once).
    capped: Capped,
}

#[derive(Debug, Default)]
struct Capped {
    events: bool,
    directories: bool,
}

impl Server {
    /// A directory of this server, within `supervisor.max_directories` (see [`bounds`]).
    fn learn_directory(&mut self, dir: &str, cap: usize, server: &str) {
        if bounds::insert_capped(&mut self.directories, dir, cap) && !self.capped.directories {
            self.capped.directories = true;
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
    servers: HashMap<String, Server>,
    sessions: HashMap<SessionKey, SessionSlot>,
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
    /// Counts the events routed to sessions; a session's slot keeps the count of its
    /// last one, so a REST answer older than what the stream said since is not applied.
    routed: u64,
}

/// How many session actors [`Supervisor::details`] asks at a time (about half a
/// millisecond of work on the actors' thread).
const INSPECT_SLICE: usize = 256;

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

/// A tracked session: its actor and the directory (OpenCode instance) it lives in.
struct SessionSlot {
    addr: Addr<SessionActor>,
    directory: Option<String>,
    /// When the last event for this session arrived (idle cleanup reads it).
    last_seen: tokio::time::Instant,
    /// Being evicted: events wait here until the actor's state is in the ledger.
    evicting: Option<Vec<Event>>,
    /// [`Supervisor::routed`] when this session's last event was routed to it.
    last_event: u64,
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
            sessions: HashMap::new(),
            parents: HashMap::new(),
            parents_capped: false,
            workspace: Arc::new(NoWorkspace),
            scratch: Scratch::default(),
            guard: Arc::new(NoGuard),
            advisor: Default::default(),
            intervals: Vec::new(),
            fleet_pause: None,
            fleet_pause_end: None,
            routed: 0,
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
            .sessions
            .iter()
            .find(|((srv, id), slot)| {
                *id == session && only_server.as_ref().is_none_or(|s| s == srv) && slot.addr.connected()
            })
            .map(|(_, slot)| slot.addr.clone());
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
        if let Some(slot) = self.sessions.get_mut(key(&(server, id))) {
            if slot.addr.connected() {
                if slot.directory.is_none() {
                    slot.directory = info.and_then(|i| i.directory.clone());
                }
                return Some(slot.addr.clone());
            }
        }
        let srv = self.servers.get(server)?;
        let addr = SessionActor::new(id, Arc::clone(&self.cfg), Arc::clone(&srv.env)).start();
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
        let slot = SessionSlot { addr: addr.clone(), directory, last_seen, evicting: None, last_event: 0 };
        self.sessions.insert((server.to_string(), id.to_string()), slot);
        Some(addr)
    }

    /// Parent/child links: a child's `parentID`, or the child id in a parent's `task` part.
    fn learn_family(&mut self, server: &str, id: &str, event: &Event, info: Option<&SessionInfo>) {
        if let Some(parent) = info.and_then(|i| i.parent_id.clone()) {
            self.learn_parent((server.to_string(), id.to_string()), parent);
        }
        if let Event::PartUpdated(p) = event {
            if let crate::event::PartKind::Tool { child_session: Some(child), .. } = &p.kind {
                self.learn_parent((server.to_string(), child.clone()), id.to_string());
            }
        }
    }

    /// One child → parent link, within `supervisor.max_parents` (see [`bounds`]).
    fn learn_parent(&mut self, child: SessionKey, parent: String) {
        let cap = self.fleet.max_parents;
        if bounds::insert_capped_map(&mut self.parents, child, parent, cap) && !self.parents_capped {
            self.parents_capped = true;
            tracing::warn!(cap, "supervisor.max_parents reached: an arbitrary child → parent link is forgotten for each new one (logged once)");
        }
    }

    /// Asks every session actor for its detail, [`INSPECT_SLICE`] actors at a time: all
    /// at once, every actor of a large fleet would be ready to run together, and a stall
    /// timer firing then would wait behind all of them (tens of ms at 10,000 sessions).
    fn details(&self) -> impl std::future::Future<Output = Vec<SessionDetail>> + 'static {
        let addrs: Vec<Addr<SessionActor>> = self.sessions.values().map(|s| s.addr.clone()).collect();
        async move {
            let mut out = Vec::with_capacity(addrs.len());
            for slice in addrs.chunks(INSPECT_SLICE) {
                let asks: Vec<_> = slice.iter().map(|addr| addr.send(Inspect)).collect();
                for ask in asks {
                    if let Ok(detail) = ask.await {
                        out.push(detail);
                    }
                }
            }
            out.sort_by(|a, b| (&a.server, &a.id).cmp(&(&b.server, &b.id)));
            out
        }
    }

    /// The tracked session with this id, on whichever server.
    fn find(&self, id: &str) -> Option<&SessionSlot> {
        self.sessions.iter().find(|((_, sid), _)| sid == id).map(|(_, slot)| slot)
    }

    /// Lists sessions and statuses by REST and brings the actors in line. After a
    /// (re)connect (`after_connect`) todo lists are re-read too, since their events may
    /// have been missed; periodic discovery skips that.
    fn reconcile(&mut self, server: &str, after_connect: bool, ctx: &mut Context<Self>) {
        let Some(srv) = self.servers.get(server) else { return };
        let engine = Arc::clone(&srv.env.engine);
        let limit = srv.list_limit;
        let mut directories = srv.directories.clone();
        let read_windows = srv.windows_stale;
        let (epoch, routed) = (srv.epoch, self.routed);
        let server = server.to_string();
        let work = async move {
            let windows = if read_windows { Some(engine.model_windows().await) } else { None };
            let listed = engine.list_sessions(limit).await;
            if let Ok(infos) = &listed {
                directories.extend(infos.iter().filter_map(|i| i.directory.clone()));
            }
            let mut statuses = Vec::new();
            for dir in directories {
                let result = engine.statuses(&dir).await;
                statuses.push((dir, result));
            }
            Reconciled { server, listed, statuses, windows, after_connect, epoch, routed }
        };
        ctx.spawn(work.into_actor(self).map(|r, act, ctx| act.apply_reconciliation(r, ctx)));
    }

    fn apply_reconciliation(&mut self, r: Reconciled, ctx: &mut Context<Self>) {
        let Some(srv) = self.servers.get(&r.server) else { return };
        if r.epoch != srv.epoch || (srv.blind && !r.after_connect) {
            // The stream went down or came back while this was read: the server it
            // describes is gone, and the reconnect reconciles afresh. A periodic read
            // while blind would mark idle, without checking for a cut-off turn, sessions
            // that the reconnect's own reconciliation checks.
            tracing::debug!(server = %r.server, after_connect = r.after_connect, "reconcile: dropped a reading from before the stream's last change");
            return;
        }
        let mut failed = r.listed.is_err();
        match (r.windows, self.servers.get_mut(&r.server)) {
            (Some(Ok(windows)), Some(srv)) => {
                srv.env.windows.replace(windows);
                srv.windows_stale = false;
            }
            (Some(Err(e)), _) => {
                // A booting OpenCode may answer its stream before its config: retried below.
                tracing::warn!(server = %r.server, error = %e, "could not read the models' context windows");
                failed = true;
            }
            _ => {}
        }
        let infos: HashMap<String, SessionInfo> = match r.listed {
            Ok(list) => list.into_iter().map(|i| (i.id.clone(), i)).collect(),
            Err(e) => {
                tracing::warn!(server = %r.server, error = %e, "reconcile: could not list sessions");
                HashMap::new()
            }
        };
        let mut busy_ids = HashSet::new();
        let mut checked_dirs = HashSet::new();
        let statuses_read = r.statuses.iter().all(|(_, result)| result.is_ok());
        for (dir, result) in r.statuses {
            let map = match result {
                Ok(map) => map,
                Err(e) => {
                    tracing::warn!(server = %r.server, directory = %dir, error = %e, "reconcile: could not read statuses");
                    failed = true;
                    continue;
                }
            };
            if let Some(srv) = self.servers.get_mut(&r.server) {
                srv.learn_directory(&dir, self.fleet.max_directories, &r.server);
            }
            checked_dirs.insert(dir.clone());
            for (id, status) in map {
                busy_ids.insert(id.clone());
                if self.heard_since(&r.server, &id, r.routed) {
                    continue;
                }
                if let Some(addr) = self.session(&r.server, &id, infos.get(&id), Some(&dir), ctx) {
                    addr.do_send(Observe(Event::SessionStatus { session_id: id, status }));
                }
            }
        }
        // Tracked sessions of a checked directory that the status endpoint left out
        // are idle now (their idle event may have been lost while disconnected).
        for ((server, id), slot) in &self.sessions {
            if *server != r.server || busy_ids.contains(id) || slot.last_event > r.routed {
                // Busy, or the stream spoke of it after the statuses were asked for:
                // its word is newer than this reading.
                continue;
            }
            let dir = slot.directory.clone().or_else(|| infos.get(id).and_then(|i| i.directory.clone()));
            if dir.is_some_and(|d| checked_dirs.contains(&d)) {
                if r.after_connect {
                    slot.addr.do_send(CheckInterrupted);
                }
                slot.addr.do_send(Observe(Event::SessionStatus { session_id: id.clone(), status: Status::Idle }));
            }
        }
        // Todo events may have been missed while disconnected.
        for ((server, _), slot) in &self.sessions {
            if r.after_connect && *server == r.server {
                slot.addr.do_send(RefreshTodos);
            }
        }
        // Every status is known again and every interrupted turn checked (the messages
        // above are ahead of this one in each actor's mailbox): silence counts from now.
        if r.after_connect && statuses_read {
            self.regain_sight(&r.server);
        }
        if let Some(srv) = self.servers.get_mut(&r.server) {
            if failed {
                // Try again soon (what was read is applied; the rest is not lost).
                let delay = srv.retry_next;
                srv.retry_next = (srv.retry_next * 2).min(srv.retry_max);
                let (server, after_connect, epoch) = (r.server.clone(), r.after_connect, r.epoch);
                tracing::info!(server = %server, retry_in_ms = delay.as_millis() as u64, "reconcile incomplete; retrying");
                ctx.run_later(delay, move |act, ctx| {
                    // A reconnect meanwhile started its own reconciliation.
                    if act.servers.get(&server).is_some_and(|s| s.epoch == epoch) {
                        act.reconcile(&server, after_connect, ctx);
                    }
                });
                return;
            }
            srv.retry_next = srv.retry_initial;
            srv.reconciled = true;
        }
        tracing::info!(server = %r.server, directories = checked_dirs.len(), busy = busy_ids.len(), "reconciled after stream connect");
    }
}

impl Supervisor {
    /// Idle cleanup: evicts sessions quiet for `idle_cleanup`, and the longest-quiet
    /// ones beyond `max_sessions_in_memory`. Busy or recovering sessions refuse.
    fn clean_up(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        let mut quiet: Vec<_> =
            self.sessions.iter().filter(|(_, s)| s.evicting.is_none()).map(|(k, s)| (s.last_seen, k.clone())).collect();
        quiet.sort();
        let over = self.sessions.len().saturating_sub(self.fleet.max_sessions_in_memory);
        let chosen: Vec<_> = quiet
            .into_iter()
            .enumerate()
            .filter(|(i, (seen, _))| *i < over || now.duration_since(*seen) >= self.fleet.idle_cleanup)
            .map(|(_, (_, k))| k)
            .collect();
        for key in chosen {
            let Some(slot) = self.sessions.get_mut(&key) else { continue };
            slot.evicting = Some(Vec::new());
            let ask = slot.addr.send(Evict);
            ctx.spawn(
                ask.into_actor(self).map(move |evicted, act, ctx| act.evicted(key, evicted.unwrap_or(false), ctx)),
            );
        }
    }

    fn evicted(&mut self, key: (String, String), evicted: bool, ctx: &mut Context<Self>) {
        let Some(slot) = self.sessions.get_mut(&key) else { return };
        let waiting = slot.evicting.take().unwrap_or_default();
        if evicted {
            let slot = self.sessions.remove(&key);
            tracing::debug!(server = %key.0, session = %key.1, "evicted an idle session (state kept in the ledger)");
            if !waiting.is_empty() {
                // Events arrived meanwhile: a fresh actor resumes from the ledger.
                let dir = slot.and_then(|s| s.directory);
                if let Some(addr) = self.session(&key.0, &key.1, None, dir.as_deref(), ctx) {
                    for e in waiting {
                        addr.do_send(Observe(e));
                    }
                }
            }
        } else {
            for e in waiting {
                slot.addr.do_send(Observe(e));
            }
        }
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
                act.reconcile(&server, false, ctx);
            }
        });
        self.intervals = vec![cleanup, discovery];
    }
}

/// The statuses of one directory, or why they could not be read.
type DirectoryStatuses = (String, Result<HashMap<String, Status>, EngineError>);

struct Reconciled {
    server: String,
    after_connect: bool,
    /// `None` when the windows were not due for a read.
    windows: Option<Result<HashMap<String, u64>, EngineError>>,
    listed: Result<Vec<SessionInfo>, EngineError>,
    statuses: Vec<DirectoryStatuses>,
    /// The server's [`Server::epoch`] when the reading started.
    epoch: u64,
    /// [`Supervisor::routed`] when the reading started.
    routed: u64,
}

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
}

impl Handler<AttachServer> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: AttachServer, _: &mut Context<Self>) {
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
        });
        self.servers.insert(
            msg.name,
            Server {
                env,
                list_limit: msg.list_limit,
                retry_initial: msg.retry_initial,
                retry_max: msg.retry_max,
                retry_next: msg.retry_initial,
                directories: HashSet::new(),
                connected: false,
                reconciled: false,
                blind: false,
                epoch: 0,
                windows_stale: true,
                events: BTreeMap::new(),
                capped: Capped::default(),
            },
        );
    }
}

/// One decoded event from a server's stream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ingest {
    /// Shared with the pump (one name per event would be one copy per event).
    pub server: Arc<str>,
    pub envelope: Envelope,
}

/// Sent by a pump behind the events of one read. Reaching it, the supervisor has handed
/// every one of them to its session (the mailbox keeps order); dropping the mark moves
/// the server's stream time on ([`crate::stream_clock`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReadMark(pub crate::stream_clock::Mark);

impl Handler<ReadMark> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ReadMark, _: &mut Context<Self>) {
        drop(msg.0);
    }
}

impl Handler<Ingest> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Ingest, ctx: &mut Context<Self>) {
        let Envelope { directory, event } = msg.envelope;
        let server: &str = &msg.server;
        let Some(srv) = self.servers.get_mut(server) else { return };
        if bounds::count_event(&mut srv.events, event.kind(), self.fleet.max_event_types) && !srv.capped.events {
            srv.capped.events = true;
            tracing::warn!(
                server = %server,
                cap = self.fleet.max_event_types,
                kind = %crate::ids::excerpt(event.kind()),
                "supervisor.max_event_types reached: further new event types are counted as \"other\" (logged once)"
            );
        }
        if matches!(event, Event::Sync) {
            return;
        }
        if let Event::Unknown { kind } = &event {
            tracing::trace!(server = %server, kind = %kind, "ignoring an event type Shepherd does not act on");
            return;
        }
        if let Some(dir) = &directory {
            srv.learn_directory(dir, self.fleet.max_directories, server);
        }
        let Some(id) = event.session_id() else { return };
        if self.scratch.contains(id) {
            // Shepherd's own fork: not supervised (stop an actor made before it was known).
            if let Some(slot) = self.sessions.remove(key(&(server, id))) {
                slot.addr.do_send(StopSession);
            }
            return;
        }
        if let Event::SessionDeleted(_) = event {
            let id = id.to_string();
            self.parents.remove(key(&(server, &id)));
            if let Some(slot) = self.sessions.remove(key(&(server, &id))) {
                slot.addr.do_send(Observe(event));
            }
            return;
        }
        let info = match &event {
            Event::SessionCreated(i) | Event::SessionUpdated(i) => Some(i.clone()),
            _ => None,
        };
        self.learn_family(server, id, &event, info.as_ref());
        if let Some(parent) = self.parents.get(key(&(server, id))).cloned() {
            if let Some(addr) = self.session(server, &parent, None, directory.as_deref(), ctx) {
                addr.do_send(ChildObserve { child: id.to_string(), event: event.clone() });
            }
        }
        let now = self.clock.now();
        self.routed += 1;
        if let Some(slot) = self.sessions.get_mut(key(&(server, id))) {
            slot.last_seen = now;
            slot.last_event = self.routed;
            if let Some(waiting) = slot.evicting.as_mut() {
                waiting.push(event);
                return;
            }
        }
        if let Some(addr) = self.session(server, id, info.as_ref(), directory.as_deref(), ctx) {
            if let Some(slot) = self.sessions.get_mut(key(&(server, id))) {
                slot.last_event = self.routed;
            }
            addr.do_send(Observe(event));
        }
    }
}

/// A server's event stream is (re)connected: reconcile.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StreamUp {
    pub server: String,
}

impl Handler<StreamUp> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: StreamUp, ctx: &mut Context<Self>) {
        if let Some(srv) = self.servers.get_mut(&msg.server) {
            srv.connected = true;
            srv.reconciled = false;
            srv.epoch += 1;
            // Model windows may change with the server's config: re-read on every
            // connect, as part of the reconciliation (retried with it).
            srv.windows_stale = true;
        }
        self.reconcile(&msg.server, true, ctx);
        self.wake_unfinished(&msg.server, ctx);
    }
}

impl Supervisor {
    /// Sessions with work the ledger says is not finished get their actor now, even if
    /// they stay quiet: a hand-off that was under way (the actor resumes it at its step),
    /// a provider-outage resume scheduled (it keeps the step's time), an action left open
    /// (an intent: a crash, or an answer lost on the way back). An actor finds all of it
    /// as it starts; a live one is asked to look for open intents again.
    fn wake_unfinished(&mut self, server: &str, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.ledger);
        let server = server.to_string();
        let find = async move {
            let handoffs = ledger.unfinished_handoffs(&server).await;
            let outages = ledger.scheduled_resumes(&server).await;
            let intents = ledger.open_intents(&server, None).await;
            (server, handoffs, outages, intents)
        };
        ctx.spawn(find.into_actor(self).map(|(server, handoffs, outages, intents), act, ctx| {
            let intents = intents.map(|open| {
                let mut ids: Vec<String> = open.into_iter().map(|i| i.session).collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            });
            for (found, what) in [
                (handoffs, "a hand-off was under way"),
                (outages, "a provider-outage resume is scheduled"),
                (intents, "an action was left unfinished"),
            ] {
                let ids = match found {
                    Ok(ids) => ids,
                    Err(e) => {
                        tracing::warn!(server = %server, error = %e, what, "could not look for unfinished work");
                        continue;
                    }
                };
                for id in ids {
                    let live = act.sessions.get(key(&(server.as_str(), id.as_str()))).filter(|s| s.addr.connected());
                    match live {
                        Some(slot) => slot.addr.do_send(ResumeIntents),
                        None => {
                            tracing::info!(server = %server, session = %id, what, "waking the session");
                            act.session(&server, &id, None, None, ctx);
                        }
                    }
                }
            }
        }));
    }
}

/// A server's event stream broke.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StreamDown {
    pub server: String,
}

impl Handler<StreamDown> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: StreamDown, _: &mut Context<Self>) {
        let Some(srv) = self.servers.get_mut(&msg.server) else { return };
        srv.connected = false;
        srv.reconciled = false;
        srv.epoch += 1;
        if srv.blind {
            return; // a failed reconnect: the sessions know already
        }
        // Being blind is not the session being silent: stop the clocks that measure
        // silence. One message per session per outage; an idle one arms nothing.
        srv.blind = true;
        let mut told = 0usize;
        for ((server, _), slot) in &self.sessions {
            if *server == msg.server {
                slot.addr.do_send(Blind);
                told += 1;
            }
        }
        tracing::info!(server = %msg.server, sessions = told, "event stream down: silence is not counted until it is back and reconciled");
    }
}

impl Supervisor {
    /// Whether the stream spoke of this session after a reading stamped `routed` began.
    fn heard_since(&self, server: &str, id: &str, routed: u64) -> bool {
        self.sessions.get(key(&(server, id))).is_some_and(|s| s.last_event > routed)
    }

    /// After an outage: the server's sessions count silence from now.
    fn regain_sight(&mut self, server: &str) {
        let Some(srv) = self.servers.get_mut(server) else { return };
        if !srv.blind {
            return;
        }
        srv.blind = false;
        for ((s, _), slot) in &self.sessions {
            if s == server {
                slot.addr.do_send(Sighted);
            }
        }
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
    type Result = ();

    fn handle(&mut self, msg: ReconfigureAll, ctx: &mut Context<Self>) {
        self.cfg = Arc::clone(&msg.rules);
        for slot in self.sessions.values() {
            slot.addr.do_send(Reconfigure(Arc::clone(&msg.rules)));
        }
        let rearm = msg.fleet.cleanup_interval != self.fleet.cleanup_interval
            || msg.fleet.discovery_interval != self.fleet.discovery_interval;
        self.fleet = msg.fleet;
        if rearm {
            self.arm_intervals(ctx);
        }
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
        self.servers.remove(&msg.name);
        self.parents.retain(|(server, _), _| *server != msg.name);
        let keys: Vec<SessionKey> = self.sessions.keys().filter(|(server, _)| *server == msg.name).cloned().collect();
        let retiring: Vec<_> =
            keys.iter().filter_map(|k| self.sessions.remove(k)).map(|slot| slot.addr.send(Retire)).collect();
        let count = retiring.len();
        tracing::info!(server = %msg.name, sessions = count, "no longer supervising this server");
        Box::pin(async move {
            // Each actor answers once its state is written; a stopped one is as good.
            futures::future::join_all(retiring).await;
            count
        })
    }
}

/// The fleet as the supervisor sees it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FleetView {
    pub servers: Vec<ServerView>,
    pub sessions: Vec<SessionDetail>,
    /// `shepherd pause --all`, while it lasts.
    pub fleet_pause: Option<crate::ledger::FleetPause>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerView {
    pub name: String,
    pub connected: bool,
    pub reconciled: bool,
    pub events: BTreeMap<String, u64>,
}

#[derive(Message)]
#[rtype(result = "FleetView")]
pub struct InspectFleet;

impl Handler<InspectFleet> for Supervisor {
    type Result = ResponseFuture<FleetView>;

    fn handle(&mut self, _: InspectFleet, _: &mut Context<Self>) -> Self::Result {
        let servers = self.server_views();
        let details = self.details();
        let fleet_pause = self.fleet_pause.clone();
        Box::pin(async move { FleetView { servers, sessions: details.await, fleet_pause } })
    }
}

/// The servers only (cheap: no session actor is asked), e.g. for a readiness probe.
#[derive(Message)]
#[rtype(result = "Vec<ServerView>")]
pub struct InspectServers;

impl Handler<InspectServers> for Supervisor {
    type Result = MessageResult<InspectServers>;

    fn handle(&mut self, _: InspectServers, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.server_views())
    }
}

impl Supervisor {
    fn server_views(&self) -> Vec<ServerView> {
        self.servers
            .iter()
            .map(|(name, s)| ServerView {
                name: name.clone(),
                connected: s.connected,
                reconciled: s.reconciled,
                events: s.events.clone(),
            })
            .collect()
    }
}

/// Graceful stop: no new aborts; wait up to `grace` for recoveries under way; stop
/// every session. Answers with the number of recoveries that did not finish in time.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Shutdown {
    pub grace: Duration,
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, msg: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.in_flight.begin_shutdown();
        let in_flight = self.in_flight.clone();
        let pending = in_flight.count();
        if pending > 0 {
            tracing::info!(recoveries = pending, "shutdown: waiting for recoveries under way to send their continue");
        }
        Box::pin(
            async move {
                let _ = tokio::time::timeout(msg.grace, in_flight.drained()).await;
                in_flight.count()
            }
            .into_actor(self)
            .map(|left, act, _| {
                if left > 0 {
                    tracing::warn!(
                        recoveries = left,
                        "shutdown: recoveries still under way; their continue may not be sent"
                    );
                }
                for slot in act.sessions.values() {
                    slot.addr.do_send(StopSession);
                }
                act.sessions.clear();
                left
            }),
        )
    }
}

impl Handler<ListSessions> for Supervisor {
    type Result = ResponseFuture<Vec<SessionDetail>>;

    fn handle(&mut self, _: ListSessions, _: &mut Context<Self>) -> Self::Result {
        Box::pin(self.details())
    }
}

impl Handler<SessionJournal> for Supervisor {
    type Result = ResponseFuture<Result<Vec<crate::journal::ActionRecord>, ControlError>>;

    fn handle(&mut self, msg: SessionJournal, _: &mut Context<Self>) -> Self::Result {
        let ledger = Arc::clone(&self.ledger);
        // Records are redacted when written; again on the way out for ledgers written
        // before that, or under other patterns.
        let redactor = self.cfg.redactor.clone();
        Box::pin(async move {
            ledger
                .history(&msg.session, msg.limit)
                .await
                .map(|records| records.into_iter().map(|r| r.redacted(&redactor)).collect())
                .map_err(|e| ControlError::Unavailable(format!("reading the journal: {e}")))
        })
    }
}

impl Handler<GetSession> for Supervisor {
    type Result = ResponseFuture<Result<SessionDetail, ControlError>>;

    fn handle(&mut self, msg: GetSession, _: &mut Context<Self>) -> Self::Result {
        let ask = self.find(&msg.0).map(|slot| slot.addr.send(Inspect));
        Box::pin(async move {
            match ask {
                Some(ask) => ask.await.map_err(|_| ControlError::UnknownSession(msg.0)),
                None => Err(ControlError::UnknownSession(msg.0)),
            }
        })
    }
}

impl Handler<SendCustomPrompt> for Supervisor {
    type Result = ResponseActFuture<Self, Result<CustomPromptReply, ControlError>>;

    fn handle(&mut self, msg: SendCustomPrompt, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        if let Some(slot) = self.find(&msg.session) {
            let ask = slot.addr.send(DeliverCustom(msg.request));
            return Box::pin(async move { ask.await.unwrap_or(Err(ControlError::ShuttingDown)) }.into_actor(self));
        }
        // Not tracked yet: ask each server whether it knows the session.
        let engines: Vec<_> = self.servers.iter().map(|(name, s)| (name.clone(), Arc::clone(&s.env.engine))).collect();
        let id = msg.session.clone();
        let lookup = async move {
            for (server, engine) in engines {
                if let Ok(info) = engine.session(&id).await {
                    return Some((server, info));
                }
            }
            None
        };
        Box::pin(lookup.into_actor(self).then(move |found, act, ctx| {
            let addr = found.and_then(|(server, info)| {
                let dir = info.directory.clone();
                act.session(&server, &info.id, Some(&info), dir.as_deref(), ctx)
            });
            async move {
                match addr {
                    Some(addr) => {
                        addr.send(DeliverCustom(msg.request)).await.unwrap_or(Err(ControlError::ShuttingDown))
                    }
                    None => Err(ControlError::UnknownSession(msg.session)),
                }
            }
            .into_actor(act)
        }))
    }
}

impl Handler<StartHandoff> for Supervisor {
    type Result = ResponseActFuture<Self, Result<HandoffView, ControlError>>;

    fn handle(&mut self, msg: StartHandoff, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        let session = msg.0;
        Box::pin(self.locate(session.clone(), None).then(move |addr, act, _| {
            async move {
                match addr {
                    Some(addr) => addr.send(RequestHandoff).await.unwrap_or(Err(ControlError::ShuttingDown)),
                    None => Err(ControlError::UnknownSession(session)),
                }
            }
            .into_actor(act)
        }))
    }
}

impl Handler<ResumeHandoff> for Supervisor {
    type Result = ResponseActFuture<Self, Result<HandoffView, ControlError>>;

    fn handle(&mut self, msg: ResumeHandoff, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        let ledger = Arc::clone(&self.ledger);
        let id = msg.0;
        let id2 = id.clone();
        let find = async move { ledger.snapshot(&id2).await };
        Box::pin(find.into_actor(self).then(move |found, act, _| {
            let owner = match found {
                Ok(Some(Ok(s))) => Some((s.server, s.session)),
                _ => None,
            };
            match owner {
                Some((server, session)) => Box::pin(act.locate(session, Some(server)).then(move |addr, act, _| {
                    async move {
                        match addr {
                            Some(addr) => {
                                addr.send(ResumeSnapshot(id)).await.unwrap_or(Err(ControlError::ShuttingDown))
                            }
                            None => Err(ControlError::UnknownSession(id)),
                        }
                    }
                    .into_actor(act)
                }))
                    as ResponseActFuture<Self, Result<HandoffView, ControlError>>,
                None => Box::pin(actix::fut::ready(Err(ControlError::UnknownSnapshot(id)))),
            }
        }))
    }
}
