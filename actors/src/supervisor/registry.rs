//! The session registry: one server's tracked sessions by id, shared by the supervisor
//! and the server's pump.
//!
//! The supervisor owns the sessions' lifecycle — it creates a slot with the actor,
//! evicts, reconciles, detaches — and the pump reads the registry to route an event
//! straight to its session's actor ([`Registry::route_frame`]), so the supervisor's
//! mailbox no longer carries every event of the fleet. An event goes the long way,
//! through the supervisor ([`super::Ingest`]), only when the supervisor has something to
//! learn or do with it: its session has no actor yet, it names a directory or a family
//! link the supervisor has not seen, it deletes the session, or its session is a
//! subagent whose parent hears of it too.
//!
//! A server's sessions' actors are spread over the server threads
//! (`supervisor.server_threads`) other than its pump's (`supervisor.pump_apart`, the
//! default with two threads or more), a session always on the same one
//! ([`Registry::thread_of`]: a hash of its id), so one server's fleet decides on every
//! core but the one that reads its stream; without `pump_apart` (or with one thread)
//! the pump and its sessions share one. Apart, the pump reads, frames, decodes and
//! routes on one core while the sessions decide on the others: the events a read routes
//! straight cross to each sessions' thread together, one crossing per thread per read
//! or, while the next read is already waiting, per few reads ([`Registry::end_of_read`],
//! [`Registry::flush`]), not one wake-up per event. Together, an event routed straight
//! is a send on the same thread. Either way the supervisor's mailbox, on the main
//! thread, carries only the long way, and what the supervisor routes it sends from the
//! session's own thread ([`Registry::dispatch`]), behind whatever the pump sent it
//! before (the pump flushes before anything goes the long way).
//!
//! A delta is not sent at all: it only says the session is active, so the pump notes
//! it in the session's cell ([`SessionSlot::stream_past`]) and the actor takes it in
//! before its next decision. Deltas were 43 % of what reached the actors. Nor is it
//! decoded: [`Registry::route_frame`] reads its session and message from the frame's
//! head ([`read_head`]), and only a frame that is not in OpenCode's exact form is
//! decoded first.
//!
//! Order is kept per session: once one of a session's events has gone the long way, its
//! next ones follow it there until the supervisor's sends for it are out, so a session
//! never sees a later event before an earlier one.
//!
//! A map guard is never held across an `.await`, nor across another call into the same
//! map: the guard locks a shard, and a second lock of that shard on the same thread
//! would wait forever.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use actix::{Addr, ArbiterHandle};
use dashmap::DashMap;
use foldhash::quality::RandomState;
use tokio::time::Instant;

use crate::event::{decode_past_head, read_head, DecodeError, DeltaHead, Envelope, Event, FrameHead, PartKind};
use crate::session::core::message_key;
use crate::session::actor::ObserveRead;
use crate::control::SessionDetail;
use crate::session::view::DetailCell;
use crate::session::Now;
use crate::session::SessionActor;
use crate::stream_clock::ReadToken;

/// A session actor's address as the registry keeps it: shared, because the pump hands
/// it over with every event it routes straight, and cloning an actix `Addr` allocates
/// twice (a sender's own task slot and flag) and counts a sender — per event, on one
/// core, freed on the other.
pub(crate) type SharedAddr = Arc<Addr<SessionActor>>;

/// A tracked session: its actor and what the supervisor keeps beside it.
pub(crate) struct SessionSlot {
    pub(crate) addr: SharedAddr,
    /// The directory (OpenCode instance) it lives in, once known.
    pub(crate) directory: Option<String>,
    /// When the last event for this session arrived (idle cleanup reads it).
    pub(crate) last_seen: Instant,
    /// Being evicted: events wait here until the actor's state is in the ledger. Boxed:
    /// a slot is rarely being evicted, and the table keeps every slot inline (with spare
    /// ones): memory per session is a scale target.
    #[allow(clippy::box_collection)] // the box is the point: 8 bytes inline, not 24
    pub(crate) evicting: Option<Box<Vec<Event>>>,
    /// [`Registry::routed`] when this session's last event was routed to it.
    pub(crate) last_event: u64,
    /// A subagent whose parent is known: its events go through the supervisor, which
    /// tells the parent too.
    pub(crate) child: bool,
    /// The session's detail as its actor publishes it: status reads take it from here
    /// instead of asking the actor ([`crate::session::view`]).
    pub(crate) view: Arc<DetailCell>,
}

impl SessionSlot {
    /// A delta of message `message_id`, read at `now` (stamped `stamp`), is noted in the
    /// session's cell instead of sent: all it says is that the session is active, which
    /// its actor takes in before anything else it does
    /// ([`crate::session::view::Streamed`]). Not while the slot is being evicted (the
    /// cell is the old actor's), nor when a delta of another message is noted and not
    /// yet taken (the actor then sees this one as an event).
    pub(crate) fn stream_past(&mut self, now: Instant, stamp: u64, message_id: &str) -> bool {
        if self.evicting.is_some() || !self.view.stream_past(now, message_key(message_id)) {
            return false;
        }
        self.last_seen = now;
        self.last_event = stamp;
        true
    }

    /// The stream spoke of this session (its event stamped `stamp`, at `now`): noted;
    /// while the slot is being evicted the event waits for the fresh actor (`None`),
    /// otherwise it comes back to be sent.
    pub(crate) fn heard(&mut self, now: Instant, stamp: u64, event: Event) -> Option<Event> {
        self.last_seen = now;
        self.last_event = stamp;
        match self.evicting.as_mut() {
            Some(waiting) => {
                waiting.push(event);
                None
            }
            None => Some(event),
        }
    }
}

/// The registry's maps hash with foldhash, seeded per map: every event of the fleet is
/// looked up by its session id, and SipHash (std's) was a measurable part of that; the
/// ids are checked tokens of at most 128 bytes, and the seed is random.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;
type HashSet<K> = std::collections::HashSet<K, RandomState>;

/// One server's sessions (see the module doc).
pub struct Registry {
    /// Keyed by the session's id, shared with its actor's core (one copy per session).
    pub(crate) slots: DashMap<Arc<str>, SessionSlot, RandomState>,
    /// Counts the events routed to this server's sessions; a slot keeps the count of its
    /// last one, so a REST answer older than what the stream said since is not applied.
    routed: AtomicU64,
    /// Events sent the long way, and how many of them the supervisor has handled.
    long_sent: AtomicU64,
    pub(super) long_handled: AtomicU64,
    /// Event types seen on the stream, with counts (capped: [`super::bounds`]).
    kinds: Mutex<KindCounts>,
    /// `supervisor.max_event_types`, kept here by the supervisor for the pump's counts.
    kind_cap: AtomicUsize,
    /// The threads the server's sessions' actors run on (set as the server is attached;
    /// unset: the supervisor's own), a session always on the same one
    /// ([`Registry::thread_of`]).
    pub(super) threads: OnceLock<Box<[ArbiterHandle]>>,
    /// The sessions whose actor does not think them idle ([`crate::session::view::NotIdle`]).
    pub(crate) not_idle: Arc<crate::session::view::NotIdle>,
    /// Spreads the sessions over `threads`: seeded per registry, so ids an outsider
    /// chose do not land on one thread by design (at worst, all on one: the layout
    /// with a single sessions' thread).
    pub(super) spread: RandomState,
}

/// The stream's event types and how often each came.
#[derive(Debug, Default)]
struct KindCounts {
    counts: BTreeMap<String, u64>,
    /// `supervisor.max_event_types` was reached (logged once).
    capped: bool,
}

impl Default for Registry {
    /// The supervisor sets the server's `max_event_types` as it attaches the server.
    fn default() -> Self {
        Self::new(crate::config::SupervisorConfig::default().max_event_types)
    }
}

impl Registry {
    fn new(kind_cap: usize) -> Self {
        Self {
            slots: DashMap::default(),
            routed: AtomicU64::new(0),
            long_sent: AtomicU64::new(0),
            long_handled: AtomicU64::new(0),
            kinds: Mutex::default(),
            kind_cap: AtomicUsize::new(kind_cap),
            threads: OnceLock::new(),
            not_idle: Arc::default(),
            spread: RandomState::default(),
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("sessions", &self.slots.len()).finish()
    }
}

/// What the pump keeps between events to route them in order.
#[derive(Default)]
pub struct RouteState {
    /// Sessions with an event gone the long way: the number it went with.
    long: HashMap<String, u64>,
    /// Directories the supervisor was told of (at most [`KNOWN_DIRECTORIES`]).
    directories: HashSet<String>,
    /// The size of `long` past which it is pruned next.
    prune_at: usize,
    /// The pump runs on another thread than the sessions' actors: events routed
    /// straight wait here, one batch per sessions' thread ([`Registry::thread_of`]), and
    /// cross to it together ([`Registry::flush`]).
    batching: bool,
    pub(super) batches: Vec<Vec<(SharedAddr, ObserveRead)>>,
    /// Reads whose events are in `batches`.
    pub(super) batched_reads: usize,
}

/// A batch crosses to the sessions' thread after at most this many reads even while
/// more data waits: far below [`crate::stream_clock::MAX_UNHANDLED_READS`], so the marks
/// a batch holds never stop the pump, and a few hundred events at most.
const READS_PER_CROSSING: usize = 8;

impl RouteState {
    /// `batching`: the pump runs apart from the server's sessions.
    pub fn new(batching: bool) -> Self {
        Self { batching, ..Self::default() }
    }

    /// Events routed straight and waiting to cross to the sessions' thread.
    pub fn waiting(&self) -> usize {
        self.batches.iter().map(Vec::len).sum()
    }
}

/// Directories the pump remembers having told the supervisor of; past it, events of a
/// new directory always go the long way (the supervisor keeps its own cap).
const KNOWN_DIRECTORIES: usize = 4096;

/// Past this many sessions remembered with an event on the long way, those whose event
/// has been handled are forgotten.
const LONG_WAY_PRUNE: usize = 1024;

/// What became of a frame ([`Registry::route_frame`]).
#[allow(clippy::large_enum_variant)] // returned once, straight to the pump: no box per long way
pub enum Routed {
    /// Its session has it: sent, waiting to cross, or noted past the actor.
    Straight,
    /// The supervisor is to handle it.
    Long(LongWay),
    /// Counted and nothing more: a `sync` duplicate, a type Shepherd does not know.
    Skipped,
}

/// An event the supervisor is to handle, numbered for [`Registry::handled`].
pub struct LongWay {
    pub envelope: Envelope,
    pub seq: u64,
}

impl Registry {
    /// The next stamp for an event routed to a session.
    pub(crate) fn next_routed(&self) -> u64 {
        self.routed.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The latest stamp handed out.
    pub(crate) fn routed(&self) -> u64 {
        self.routed.load(Ordering::Relaxed)
    }

    /// Routes one frame of the stream, as the pump reads it. Its head is read first
    /// ([`read_head`]): a `sync` duplicate is only counted, a delta in OpenCode's own
    /// form is noted without being decoded ([`Registry::note_delta`]); any other frame
    /// is decoded and routed ([`Registry::route`]). `count` is told every frame's event
    /// type; a frame that does not decode is the error, and nothing else happens.
    pub fn route_frame(
        &self,
        state: &mut RouteState,
        frame: &str,
        read: &ReadToken,
        now: Instant,
        mut count: impl FnMut(&str),
    ) -> Result<Routed, DecodeError> {
        let sent = match read_head(frame) {
            FrameHead::Sync => {
                count(Event::Sync.kind());
                return Ok(Routed::Skipped);
            }
            FrameHead::Delta(delta) => {
                count(DeltaHead::KIND);
                if self.note_delta(state, &delta, now) {
                    return Ok(Routed::Straight);
                }
                // Not to be noted (the long way, another message's noted…): sent.
                self.send(state, decode_past_head(frame)?, read, now)
            }
            FrameHead::Other => {
                let envelope = decode_past_head(frame)?;
                count(envelope.event.kind());
                if matches!(envelope.event, Event::Sync | Event::Unknown { .. }) {
                    return Ok(Routed::Skipped);
                }
                self.route(state, envelope, read, now)
            }
        };
        Ok(match sent {
            None => Routed::Straight,
            Some(long) => Routed::Long(long),
        })
    }

    /// Routes one of the stream's events: a delta is noted in its session's cell when it
    /// can be ([`Registry::note_delta`]); anything else is sent ([`Registry::send`]).
    pub(crate) fn route(&self, state: &mut RouteState, envelope: Envelope, read: &ReadToken, now: Instant) -> Option<LongWay> {
        if let Event::PartDelta { session_id, message_id, .. } = &envelope.event {
            let delta = DeltaHead { directory: envelope.directory.as_deref(), session_id, message_id };
            if self.note_delta(state, &delta, now) {
                return None;
            }
        }
        self.send(state, envelope, read, now)
    }

    /// Sends one of the stream's events: straight to its session's actor, with the
    /// read's mark, when nothing but the session needs it (then `None`); otherwise it
    /// comes back, numbered, for the supervisor.
    ///
    /// With [`RouteState::batching`] (the pump runs apart from the sessions) the event
    /// waits for the read's [`Registry::flush`]; otherwise it is sent at once, on the
    /// sessions' own thread.
    fn send(&self, state: &mut RouteState, envelope: Envelope, read: &ReadToken, now: Instant) -> Option<LongWay> {
        if self.direct(state, &envelope) {
            let id = envelope.event.session_id().unwrap_or_default();
            // Which thread's batch, worked out before the slot's shard is locked.
            let thread = if state.batching { self.thread_of(id) } else { 0 };
            if let Some(mut slot) = self.slots.get_mut(id) {
                if !slot.child && slot.addr.connected() {
                    let stamp = self.next_routed();
                    if let Some(event) = slot.heard(now, stamp, envelope.event) {
                        let msg = ObserveRead(event, ReadToken::clone(read));
                        if state.batching {
                            if state.batches.len() <= thread {
                                state.batches.resize_with(thread + 1, Vec::new);
                            }
                            state.batches[thread].push((Arc::clone(&slot.addr), msg));
                        } else {
                            slot.addr.do_send(msg);
                        }
                    }
                    return None;
                }
            }
        }
        // What the read routed straight goes first: the supervisor's sends for this
        // event must land behind it.
        self.flush(state);
        let seq = self.long_sent.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(id) = envelope.event.session_id() {
            match state.long.get_mut(id) {
                Some(last) => *last = seq,
                None => {
                    state.long.insert(id.to_string(), seq);
                }
            }
        }
        if let Some(dir) = &envelope.directory {
            if state.directories.len() < KNOWN_DIRECTORIES && !state.directories.contains(dir) {
                state.directories.insert(dir.clone());
            }
        }
        Some(LongWay { envelope, seq })
    }

    /// The pump finished a read: its events cross now, unless the next read is already
    /// waiting (then they go with its events, one crossing — a wake-up of the sessions'
    /// thread — for several reads while the stream is hot; at most
    /// [`READS_PER_CROSSING`]).
    pub fn end_of_read(&self, state: &mut RouteState, more_waiting: bool) {
        state.batched_reads += 1;
        if !more_waiting || state.batched_reads >= READS_PER_CROSSING {
            self.flush(state);
        }
    }

    /// Notes a delta in its session's cell — read from its frame's head
    /// ([`read_head`]), or decoded when its frame was not in OpenCode's exact form: the
    /// one way a delta is noted. `false` when it cannot be (the session has no actor
    /// here, is a subagent, has an event on the long way, another message's delta is
    /// noted…): the delta is then sent as an event.
    fn note_delta(&self, state: &mut RouteState, delta: &DeltaHead<'_>, now: Instant) -> bool {
        if !self.in_order(state, delta.directory, delta.session_id) {
            return false;
        }
        let Some(mut slot) = self.slots.get_mut(delta.session_id) else { return false };
        if slot.child {
            return false;
        }
        // Whether the actor still runs, its cell says (`stream_past`): its address's
        // channel is not read.
        let stamp = self.next_routed();
        slot.stream_past(now, stamp, delta.message_id)
    }

    /// Whether the event may go straight to its session, as far as the event and the
    /// order of its session's events go (the slot decides the rest).
    fn direct(&self, state: &mut RouteState, envelope: &Envelope) -> bool {
        let Some(id) = envelope.event.session_id() else { return false };
        if !self.in_order(state, envelope.directory.as_deref(), id) {
            return false;
        }
        match &envelope.event {
            Event::SessionDeleted(_) => false,
            Event::SessionCreated(i) | Event::SessionUpdated(i) => i.parent_id.is_none(),
            Event::PartUpdated(p) => !matches!(&p.kind, PartKind::Tool { child_session: Some(_), .. }),
            _ => true,
        }
    }

    /// Whether an event of session `id` in `directory` may go straight, as far as order
    /// goes: the supervisor knows the directory, and none of the session's events is
    /// still on the long way.
    fn in_order(&self, state: &mut RouteState, directory: Option<&str>, id: &str) -> bool {
        if directory.is_some_and(|d| !state.directories.contains(d)) {
            return false; // the supervisor learns the directory
        }
        if !state.long.is_empty() {
            let handled = self.long_handled.load(Ordering::Acquire);
            if handled >= self.long_sent.load(Ordering::Relaxed) {
                state.long.clear();
            } else {
                if state.long.len() > state.prune_at.max(LONG_WAY_PRUNE) {
                    // Under steady long-way traffic (a streaming subagent) the map is
                    // never empty all at once: forget the sessions whose turn is over
                    // (amortized: the next pass waits until the map has doubled).
                    state.long.retain(|_, seq| *seq > handled);
                    state.prune_at = 2 * state.long.len();
                }
                if state.long.get(id).is_some_and(|&seq| seq > handled) {
                    return false; // an earlier event of this session is still on the long way
                }
            }
        }
        true
    }

    /// Adds `n` events of type `kind` to the stream's counts, within
    /// `supervisor.max_event_types` names (past it they count as `other`; the first
    /// time is logged).
    pub fn count(&self, server: &str, kind: &str, n: u64) {
        let cap = self.kind_cap.load(Ordering::Relaxed);
        let mut k = self.kinds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if super::bounds::count_events(&mut k.counts, kind, n, cap) && !k.capped {
            k.capped = true;
            tracing::warn!(
                server = %server,
                cap,
                kind = %crate::ids::excerpt(kind),
                "supervisor.max_event_types reached: further new event types are counted as \"other\" (logged once)"
            );
        }
    }

    /// `supervisor.max_event_types` from now on (set as the server is attached and on
    /// every reload).
    pub(crate) fn set_kind_cap(&self, cap: usize) {
        self.kind_cap.store(cap, Ordering::Relaxed);
    }

    /// The stream's event types and their counts.
    pub(crate) fn kind_counts(&self) -> BTreeMap<String, u64> {
        self.kinds.lock().unwrap_or_else(std::sync::PoisonError::into_inner).counts.clone()
    }

    /// The actor of the tracked session `id`.
    pub fn actor(&self, id: &str) -> Option<Addr<SessionActor>> {
        self.slots.get(id).map(|slot| Addr::clone(&slot.addr))
    }

    /// Whether the tracked session `id` has published its detail (its actor has loaded
    /// its state): readers take it from the registry then, without asking the actor.
    pub fn is_published(&self, id: &str) -> bool {
        self.slots.get(id).is_some_and(|slot| slot.view.is_published())
    }

    /// The details of `cells` (some of [`Registry::published_cells`]; `server` is this
    /// registry's, `now` its clock's time) as their actors published them, into `out`;
    /// the actors of the sessions that have published nothing yet (still loading their
    /// state) into `unpublished`, to be asked. A session whose actor has stopped is not
    /// among the cells: it would not answer.
    pub(crate) fn details_of(
        server: &Arc<str>,
        now: Now,
        cells: &[PublishedCell],
        out: &mut Vec<SessionDetail>,
        unpublished: &mut Vec<Addr<SessionActor>>,
    ) {
        read_cells(cells, |id, cell| cell.detail(server, id.to_string(), now), out, unpublished);
    }

    /// [`Registry::details_of`] as the status file shows them
    /// ([`LiveSession::of_published`](crate::stats::LiveSession::of_published)): no copy
    /// of any todo list.
    pub(crate) fn live_of(
        server: &Arc<str>,
        now: Now,
        cells: &[PublishedCell],
        out: &mut Vec<crate::stats::LiveSession>,
        unpublished: &mut Vec<Addr<SessionActor>>,
    ) {
        let read = |id: &str, cell: &DetailCell| {
            cell.read(now, |p, last| crate::stats::LiveSession::of_published(p, Arc::clone(server), id, last))
        };
        read_cells(cells, read, out, unpublished);
    }

    /// Each running session's id and published cell, with its actor when it has
    /// published nothing yet. The shards are locked only to copy these out (the pump
    /// waits on them); what is read of them is built after, by the caller.
    pub(crate) fn published_cells(&self) -> Vec<PublishedCell> {
        self.slots
            .iter()
            .filter(|slot| slot.addr.connected())
            .map(|slot| {
                let ask = (!slot.view.is_published()).then(|| Addr::clone(&slot.addr));
                (slot.key().clone(), Arc::clone(&slot.view), ask)
            })
            .collect()
    }

    /// The detail of the tracked session `id` as its actor published it, or its actor
    /// when it has published nothing yet; `None` when it is not tracked or has stopped.
    pub(crate) fn detail(&self, server: &str, id: &str, now: Now) -> Option<Result<SessionDetail, Addr<SessionActor>>> {
        let (cell, addr) = {
            let slot = self.slots.get(id).filter(|slot| slot.addr.connected())?;
            (Arc::clone(&slot.view), Addr::clone(&slot.addr))
        };
        Some(cell.detail(server, id.to_string(), now).ok_or(addr))
    }

    /// The sessions whose actor does not think them idle.
    pub fn not_idle(&self) -> &crate::session::view::NotIdle {
        &self.not_idle
    }

    /// How many sessions are tracked.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no session is tracked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// A running session's id and published cell, and its actor while it has published
/// nothing ([`Registry::published_cells`]).
pub(crate) type PublishedCell = (Arc<str>, Arc<DetailCell>, Option<Addr<SessionActor>>);

/// What `read` makes of each of `cells`, into `out`; the actors of those with nothing
/// published yet into `unpublished`.
fn read_cells<T>(
    cells: &[PublishedCell],
    read: impl Fn(&str, &DetailCell) -> Option<T>,
    out: &mut Vec<T>,
    unpublished: &mut Vec<Addr<SessionActor>>,
) {
    for (id, cell, ask) in cells {
        match (read(id, cell), ask) {
            (Some(value), _) => out.push(value),
            (None, Some(addr)) => unpublished.push(Addr::clone(addr)),
            (None, None) => {} // never: a detail once published stays
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream_clock::StreamClock;

    fn status(id: &str) -> Envelope {
        crate::event::decode(&format!(
            r#"{{"directory":"/p","payload":{{"type":"session.status","properties":{{"sessionID":"{id}","status":{{"type":"busy"}}}}}}}}"#
        ))
        .unwrap()
    }

    /// Under steady long-way traffic the pump's memory of sessions with an event on the
    /// long way stays bounded by what is still on the way, not by every session seen.
    #[tokio::test]
    async fn sessions_whose_long_way_event_was_handled_are_forgotten() {
        let registry = Arc::new(Registry::default());
        let read = Arc::new(Arc::new(StreamClock::default()).mark(None).await);
        let mut state = RouteState::default();
        let now = Instant::now();
        let mut last = 0;
        for i in 0..10_000 {
            // No session has an actor: every event goes the long way, and the supervisor
            // handles each one before the next two are sent.
            let long = registry.route(&mut state, status(&format!("ses_{i}")), &read, now).expect("long way");
            registry.handled(last);
            last = long.seq;
        }
        assert!(state.long.len() <= 2 * LONG_WAY_PRUNE + 2, "{} remembered", state.long.len());
        registry.handled(last);
        assert!(registry.route(&mut state, status("ses_x"), &read, now).is_some());
        assert_eq!(state.long.len(), 1, "all handled: only the newest is remembered");
    }
}
