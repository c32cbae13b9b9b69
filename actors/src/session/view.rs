//! A session's detail as readers see it without asking its actor: the status file,
//! `/v1/status`, `/v1/sessions` and the metrics read every session at each refresh, and
//! a message to each of 100,000 actors cost their thread over a second of work and held
//! back their stall timers.
//!
//! Each session actor shares a [`DetailCell`] with its slot in the registry. The one
//! field that changes on nearly every event, where the session's silence is counted
//! from, is an atomic the actor stores after each change; the rest is a
//! [`PublishedDetail`], rebuilt and swapped in only when its [`fingerprint`] differs from
//! the one published before. The fingerprint is a hash of a few words the core holds
//! anyway, kept inline in the actor: at 100,000 sessions the fleet no longer fits in the
//! cache, and comparing with the published copy itself read two or three more lines of
//! memory per event (measured: the server thread's CPU per event 10–15 % higher). The
//! actor publishes after
//! everything that changes its core (see `SessionActor::settle`), so a reader sees what
//! the actor's own answer ([`super::actor::Inspect`]) would be, built by the same code.
//! Until the actor has loaded its state from the ledger nothing is published: readers
//! ask the actor then, as before.
//!
//! Details leave raw; whoever sends one out redacts it.

use std::hash::{Hash, Hasher};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::control::{HandoffView, SessionDetail};
use crate::event::Todo;
use crate::journal::LastAction;
use crate::session::core::{Now, SessionCore};
use crate::session::handoff::Phase;
use crate::session::pause::Pause;

/// What a session's actor and its registry slot share (small: one per session).
#[derive(Debug, Default)]
pub struct DetailCell {
    /// [`SessionCore::silent_since`], as nanoseconds from [`base`].
    silent_since: AtomicI64,
    /// The rest of the detail; `None` until the actor has loaded its state.
    published: Mutex<Option<Arc<PublishedDetail>>>,
    /// Deltas the pump took past the actor, not yet fed into its core ([`Streamed`]).
    streamed: Mutex<Option<Streamed>>,
    /// The actor has stopped: nothing noted here would be taken. (Its own flag, not the
    /// actor's address: a delta noted here touches this cell alone, and the address's
    /// channel was one more line of memory per delta.)
    stopped: AtomicBool,
    /// Whether the session is busy as the actor last knew it (0, the default, until it
    /// says): read per session by passes over the whole fleet (discovery), without a
    /// lock or the detail's own line.
    run: AtomicU8,
}

/// [`DetailCell`]'s `run` once said: idle, busy, busy while OpenCode retries.
const RUN_IDLE: u8 = 1;
const RUN_BUSY: u8 = 2;
const RUN_RETRY: u8 = 3;

/// A message's deltas that went past the session's actor: a delta only says the session
/// is active (`SessionCore::observe_streamed`), and at the fleet's rate a message to
/// the actor for each was the most of what a session cost per event. The pump notes
/// the latest here ([`DetailCell::stream_past`]) and the actor takes it before anything
/// else it does ([`DetailCell::take_streamed`]). One message at a time: a delta of
/// another message while one is noted goes to the actor as an event, so whether a
/// message is Shepherd's own is decided for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed {
    /// When the latest was read.
    pub at: Instant,
    /// Its message's key (`shepherd_core::session::core::message_key`).
    pub message: u64,
}

impl DetailCell {
    /// The session's detail as its actor would answer it at `now` (`server` and `id` are
    /// the slot's); `None` while nothing is published yet.
    pub fn detail(&self, server: &str, id: String, now: Now) -> Option<SessionDetail> {
        let published = Arc::clone(self.published.lock().unwrap_or_else(PoisonError::into_inner).as_ref()?);
        Some(published.to_detail(server, id, last_activity_ms(now, self.silent_since_now())))
    }

    /// Since when the session is silent, counting deltas not yet in the core.
    fn silent_since_now(&self) -> Instant {
        let silent_since = from_nanos(self.silent_since.load(Ordering::Acquire));
        match *self.streamed.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(streamed) => silent_since.max(streamed.at), // not yet in the core
            None => silent_since,
        }
    }

    /// What `read` makes of the published detail and the session's last activity (epoch
    /// ms), without copying the detail (the status file's view reads only counts of the
    /// todo list: `stats::LiveSession::of_published`). `None` until the actor has
    /// published one.
    pub fn read<T>(&self, now: Now, read: impl FnOnce(&PublishedDetail, i64) -> T) -> Option<T> {
        let published = Arc::clone(self.published.lock().unwrap_or_else(PoisonError::into_inner).as_ref()?);
        Some(read(&published, last_activity_ms(now, self.silent_since_now())))
    }

    /// Whether the actor has published its detail.
    pub fn is_published(&self) -> bool {
        self.published.lock().unwrap_or_else(PoisonError::into_inner).is_some()
    }

    /// Whether the actor knows its session idle (neither busy nor retrying); false before
    /// it said anything.
    pub fn thinks_idle(&self) -> bool {
        self.run.load(Ordering::Acquire) == RUN_IDLE
    }

    /// Whether the actor knows its session busy (and not retrying a model call).
    pub fn thinks_busy(&self) -> bool {
        self.run.load(Ordering::Acquire) == RUN_BUSY
    }

    /// What the actor knows of its session's run, after every change (an atomic
    /// store); `Some(idle)` when whether it thinks the session idle changed (from "not
    /// said yet", which is not idle, too).
    pub(crate) fn set_run(&self, busy: bool, retrying: bool) -> Option<bool> {
        let run = match (busy, retrying) {
            (false, _) => RUN_IDLE,
            (true, false) => RUN_BUSY,
            (true, true) => RUN_RETRY,
        };
        // The actor alone writes it: a load, and a store only on a change (most
        // events change nothing here).
        let was = self.run.load(Ordering::Acquire);
        if was == run {
            return None;
        }
        self.run.store(run, Ordering::Release);
        ((was == RUN_IDLE) != (run == RUN_IDLE)).then_some(run == RUN_IDLE)
    }

    /// The session's silence is counted from `t` now.
    pub(crate) fn set_silent_since(&self, t: Instant) {
        self.silent_since.store(to_nanos(t), Ordering::Release);
    }

    /// The pump read a delta of `message` at `at`: noted, unless one of another message
    /// is noted and not yet taken, or the actor has stopped (then `false`: the delta
    /// goes to the actor, or the long way).
    pub(crate) fn stream_past(&self, at: Instant, message: u64) -> bool {
        if self.stopped.load(Ordering::Acquire) {
            return false;
        }
        let mut noted = self.streamed.lock().unwrap_or_else(PoisonError::into_inner);
        match noted.as_mut() {
            None => {
                *noted = Some(Streamed { at, message });
                true
            }
            Some(s) if s.message == message => {
                s.at = s.at.max(at);
                true
            }
            Some(_) => false,
        }
    }

    /// The actor has stopped.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// The deltas noted since the last take, for the actor's core.
    pub(crate) fn take_streamed(&self) -> Option<Streamed> {
        self.streamed.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// `detail` replaces the published one.
    pub(crate) fn publish(&self, detail: Arc<PublishedDetail>) {
        *self.published.lock().unwrap_or_else(PoisonError::into_inner) = Some(detail);
    }
}

/// Epoch ms of the session's last activity as of `now`: the wall clock less how long
/// the session has been silent (what the detail calls `last_activity_ms`).
pub fn last_activity_ms(now: Now, silent_since: Instant) -> i64 {
    let quiet_ms = i64::try_from(now.mono.saturating_duration_since(silent_since).as_millis()).unwrap_or(i64::MAX);
    now.wall_ms.saturating_sub(quiet_ms)
}

/// Instants are stored as signed nanoseconds from one moment of the process (the first
/// asked): an `i64` fits in an atomic and spans ±292 years.
fn base() -> std::time::Instant {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    *BASE.get_or_init(std::time::Instant::now)
}

fn to_nanos(t: Instant) -> i64 {
    let (t, base) = (t.into_std(), base());
    match t.checked_duration_since(base) {
        Some(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        None => i64::try_from(base.duration_since(t).as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

fn from_nanos(n: i64) -> Instant {
    let base = base();
    let t = if n >= 0 {
        base.checked_add(Duration::from_nanos(n.unsigned_abs()))
    } else {
        base.checked_sub(Duration::from_nanos(n.unsigned_abs()))
    };
    Instant::from_std(t.unwrap_or(base))
}

/// Everything a session's detail shows but its name and its last activity.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedDetail {
    /// The core's own strings and list, shared (not copied: memory per session is a
    /// scale target).
    pub(crate) title: Option<Arc<str>>,
    directory: Option<Arc<str>>,
    pub(crate) todos: Arc<[Todo]>,
    last_action: Option<LastAction>,
    pub(crate) stall_timeout: Option<Duration>,
    pub(crate) context_tokens: Option<u64>,
    pub(crate) context_window: Option<u64>,
    attempts: u32,
    pub(crate) paused: Option<Pause>,
    pub(crate) phase: Phase,
    pub(crate) busy: bool,
    pub(crate) waiting_on_person: bool,
    pub(crate) recovering: bool,
    pub(crate) compacting: bool,
    /// The hand-off's names, when it has any. Boxed: most sessions never have one.
    handoff: Option<Box<HandoffNames>>,
}

/// The share of the window the latest model call's prompt took, in % to one decimal
/// (the core's share, from the same two numbers: not stored twice).
fn context_percent(tokens: Option<u64>, window: Option<u64>) -> Option<f64> {
    shepherd_core::advisor::context_share(tokens, window).map(|s| (s * 1000.0).round() / 10.0)
}

/// A hand-off's (or its origin's) names and reason.
#[derive(Debug, Clone, PartialEq, Default)]
struct HandoffNames {
    id: Option<String>,
    new_session: Option<String>,
    from: Option<String>,
    reason: Option<String>,
}

impl HandoffNames {
    fn of(r: &crate::session::handoff::Rollover) -> Option<Box<HandoffNames>> {
        let names = (r.id(), r.new_session(), r.from(), r.reason());
        (names != (None, None, None, None)).then(|| {
            Box::new(HandoffNames {
                id: names.0.map(str::to_string),
                new_session: names.1.map(str::to_string),
                from: names.2.map(str::to_string),
                reason: names.3.map(str::to_string),
            })
        })
    }
}

impl PublishedDetail {
    /// The detail of the session `core` describes, whose latest record is `last_action`.
    pub fn of(core: &SessionCore, last_action: Option<LastAction>) -> PublishedDetail {
        let (context_tokens, context_window) = core.context();
        let (title, directory) = core.shared_names();
        PublishedDetail {
            title,
            directory,
            todos: core.shared_todos(),
            last_action,
            stall_timeout: core.stall_clock(),
            context_tokens,
            context_window,
            attempts: core.attempts(),
            paused: core.pause(),
            phase: core.handoff().phase(),
            busy: core.is_busy(),
            waiting_on_person: core.waits_on_person(),
            recovering: core.is_recovering(),
            compacting: core.is_compacting(),
            handoff: HandoffNames::of(core.handoff()),
        }
    }

    /// The stall timeout in force while the stall timer runs, in whole ms.
    pub(crate) fn stall_timeout_ms(&self) -> Option<u64> {
        self.stall_timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
    }

    /// The whole detail, with the session's name and last activity.
    pub fn to_detail(&self, server: &str, id: String, last_activity_ms: i64) -> SessionDetail {
        let names = self.handoff.as_deref().cloned().unwrap_or_default();
        SessionDetail {
            server: server.to_string(),
            id,
            title: self.title.as_deref().map(str::to_string),
            directory: self.directory.as_deref().map(str::to_string),
            busy: self.busy,
            waiting_on_person: self.waiting_on_person,
            last_activity_ms,
            stall_timeout_ms: self.stall_timeout_ms(),
            recovering: self.recovering,
            paused: self.paused.map(|p| p.as_str().to_string()),
            attempts: self.attempts,
            todos: self.todos.to_vec(),
            context_tokens: self.context_tokens,
            context_window: self.context_window,
            context_percent: context_percent(self.context_tokens, self.context_window),
            compacting: self.compacting,
            last_action: self.last_action,
            handoff: HandoffView {
                phase: self.phase.as_str().to_string(),
                id: names.id,
                new_session: names.new_session,
                from: names.from,
                reason: names.reason,
            },
        }
    }
}

/// A fingerprint of everything [`PublishedDetail::of`] reads from `core` (and
/// `last_action`), found without building it or reading the published copy: it runs
/// after every event, so it allocates nothing and follows no pointer but the hand-off's
/// names (only while there is one). The todo list is hashed by the core's count of its
/// changes, the title and directory by where their text lives — each replaced whole when
/// it changes, and the published copy keeps the old text alive, so an unchanged address
/// is unchanged text. Like the durable state's generation (`durable_generation`) it is a
/// 64-bit hash: two different details share one with a chance of 2⁻⁶⁴ per change, and
/// then readers see the earlier detail until the next change.
pub fn fingerprint(core: &SessionCore, last_action: Option<LastAction>) -> NonZeroU64 {
    let mut h = shepherd_core::fingerprint::hasher();
    let place = |text: Option<&str>| text.map(|t| (t.as_ptr() as usize, t.len()));
    core.facts_generation().hash(&mut h);
    (place(core.title()), place(core.directory())).hash(&mut h);
    (core.is_busy(), core.waits_on_person(), core.is_recovering(), core.is_compacting()).hash(&mut h);
    (core.pause(), core.attempts(), core.handoff().phase()).hash(&mut h);
    (core.context(), core.stall_clock(), last_action).hash(&mut h);
    let r = core.handoff();
    (r.id(), r.new_session(), r.from(), r.reason()).hash(&mut h);
    NonZeroU64::new(h.finish()).unwrap_or(NonZeroU64::MIN)
}

/// The sessions of a server whose actor does not think them idle (busy, retrying, or
/// not said yet), kept by the actors as their view changes: a periodic discovery looks
/// at these alone for sessions the status map leaves out, not at every tracked session
/// (at 100,000 sessions that pass held the supervisor's thread 20–40 ms, a cache miss
/// per session). Counted per id: an evicted actor still stopping and its successor
/// are each one.
#[derive(Debug, Default)]
pub struct NotIdle(dashmap::DashMap<Arc<str>, u32, foldhash::quality::RandomState>);

impl NotIdle {
    /// An actor of session `id` does not think it idle (it starts so, and enters as it
    /// starts).
    pub(crate) fn enter(&self, id: &Arc<str>) {
        *self.0.entry(Arc::clone(id)).or_insert(0) += 1;
    }

    /// That actor thinks it idle now, or has stopped not thinking so.
    pub(crate) fn leave(&self, id: &str) {
        self.0.remove_if_mut(id, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }

    /// The sessions, as of now.
    pub(crate) fn ids(&self) -> Vec<Arc<str>> {
        self.0.iter().map(|e| Arc::clone(e.key())).collect()
    }

    /// How many sessions.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether every tracked session is thought idle.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RecoveryConfig;
    use crate::session::core::HoldScope;

    /// With no record beside it (the actor's test sees such a change with its journal
    /// record): a person waited on makes the published detail stale by itself, and
    /// activity does not (it is the atomic's). A pause also moves the durable count.
    #[test]
    fn a_change_with_no_record_beside_it_is_seen() {
        let start = Now { mono: Instant::now(), wall_ms: 1_000_000 };
        let mut core = SessionCore::new("srv", "ses_A", Arc::new(RecoveryConfig::default().into()), start);
        let event = |kind: &str, props: &str| {
            let json = format!(r#"{{"directory":"/p","payload":{{"type":"{kind}","properties":{props}}}}}"#);
            crate::event::decode(&json).expect("decodes").event
        };
        let mut shown = (PublishedDetail::of(&core, None), fingerprint(&core, None));
        let mut step = |core: &SessionCore, what: &str, changes: bool| {
            let now = (PublishedDetail::of(core, None), fingerprint(core, None));
            assert_eq!(now.0 != shown.0, changes, "{what}");
            assert_eq!(now.1 != shown.1, changes, "{what}");
            shown = now;
        };
        core.observe(&event("question.asked", r#"{"id":"que_1","sessionID":"ses_A"}"#), start);
        step(&core, "a question", true);
        core.observe(&event("message.part.delta", r#"{"sessionID":"ses_A","messageID":"msg_1","partID":"prt_1"}"#), start);
        step(&core, "activity", false);
        core.observe(&event("question.replied", r#"{"requestID":"que_1","sessionID":"ses_A"}"#), start);
        step(&core, "its answer", true);
        core.on_hold(HoldScope::Session, None, "test", start);
        step(&core, "a pause", true);
        core.on_release(HoldScope::Session, "test", start);
        step(&core, "its release", true);
    }

    /// An instant survives the atomic's round trip exactly, before and after the base.
    #[test]
    fn instants_round_trip_through_nanoseconds() {
        let now = Instant::now();
        for t in [now, now + Duration::from_secs(3600), now.checked_sub(Duration::from_secs(7)).unwrap_or(now)] {
            assert_eq!(from_nanos(to_nanos(t)), t);
        }
    }
}
