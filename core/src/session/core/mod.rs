//! The pure decision core of one session: what state it is in, and what to do.
//!
//! `(state, event, now) -> effects`. The core never performs I/O, never reads a clock
//! and knows nothing of actix: the actor passes `now` in, asks for the next
//! [`SessionCore::deadline`], and carries out the [`Effect`]s returned.
//!
//! What it decides:
//! - **Activity** (resets the stall timer): any event of the session that is not
//!   Shepherd's own — deltas, part updates, assistant messages, todos, status changes,
//!   permission and question traffic. Parts and messages tagged with Shepherd's
//!   metadata are not activity.
//! - **Real progress** (resets the recovery counters): an assistant step that finished
//!   normally, a tool that completed, a changed todo list, or a real user message.
//! - **Stall**: busy, no activity for `stall_timeout` (× `tool_grace_factor` while a
//!   tool runs). Never while a permission or question waits (the session waits for a
//!   person by design), never in `retry` (OpenCode's own wait), never while a recovery
//!   is already under way. While OpenCode compacts, the bound is `compaction.max_wait`
//!   from when the compaction was first seen instead (past it: abort and continue).
//! - **Blind is not silent**: while the server's event stream is down no clock that
//!   measures silence runs (stall, nudge, review, orphan); once it is back and
//!   reconciled, silence counts from that moment.
//! - **Abandoned**: a stalled session with no real progress for `max_session_age`
//!   (counted from when Shepherd first saw it at the earliest) is given up, not recovered.
//! - **User in charge**: an abort Shepherd did not send pauses all automation until
//!   the next real (non-synthetic, untagged) user message.
//! - **Provider outages** (`core/resume.rs`): a turn that ended on the provider's error
//!   with work left is resumed after a back-off growing per consecutive failure, once
//!   per step, when the server's breaker allows.
//!
//! One struct, its methods by behaviour — open the file named for what you look for:
//! - `facts.rs`: events → state, and the edges they cross (busy→idle, the person wrote,
//!   a foreign abort, a finished tool call, an empty finish);
//! - `arbiter.rs`: the precedence between behaviours at the idle edge and at a
//!   deadline, and the next deadline — stated once;
//! - `stall.rs` (the stall clock, recovery orders and reports, a turn cut off by a
//!   restart), `escalation.rs` (repeated continues), `runaway.rs` (empty finishes),
//!   `spin.rs` (the same tool call repeated);
//! - `nudge.rs` (nudges and reviews on their way out, and a person's custom prompt),
//!   `compaction.rs`, `handoff.rs`, `orphan.rs` (a parent's subagents);
//! - `advice.rs` (the advisor's hooks), `resume.rs` (provider outages), `hold.rs` (the
//!   person's and the fleet's pause), `person.rs` (the journal's edges of waiting on
//!   the person);
//! - `intents.rs` (actions a crash left open), `durable.rs` (export/restore);
//! - `open.rs` (the running tools and open questions), `rare.rs` (loop and crash memory
//!   most sessions never fill, boxed);
//! - here: the state itself, its accessors, and the journal record every behaviour
//!   writes. The orders and reports are `session::effect`'s; `testkit.rs` is the
//!   benches the tests beside each behaviour share.
//!
//! The behaviour files import this module's names (`use super::*`): these imports
//! are the core's prelude.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::advisor::gate::{AdviceGate, AdviceRequest};
use crate::advisor::{About, Situation};
use crate::config::SessionRules;
use crate::event::{
    ErrorInfo, Event, MessageInfo, ModelRef, Part, PartKind, Role, SessionInfo, Status, Todo, ToolStatus,
};
use crate::journal::{Action, ActionRecord, Numbers, Outcome};
use crate::ledger::{DurableState, Intent, IntentKind, OutageMemory};
use crate::ports::{EngineError, LastTurn, TurnSettings};
use crate::session::effect::{
    Delivery, FinishOrder, FinishReport, HandoffOrder, PromptKind, PromptOrder, StepReport, ToolTextScan,
};
use crate::session::family::{ChildNews, Family};
use crate::session::followup::{self, Decision, Delivered, Facts, FollowUp, LastReply};
use crate::session::handoff::{Phase, Rollover, Step};
pub use crate::session::effect::{BreakerCall, CompactOrder, Effect, RecoveryOrder, RecoveryReport};
pub use crate::session::loops::Escalation;
pub use crate::session::pause::Pause;
pub use self::facts::{message_key, TodoReread};
use crate::session::loops::{ContinueHistory, SpinVerdict, ToolSpin};
use crate::session::outage::{classify, ErrorClass, Outage};
use crate::session::planning::Planning;
use crate::session::prompt::PromptFacts;

/// A moment, in both of the clocks the core compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub mono: Instant,
    /// Epoch milliseconds (OpenCode's timestamps).
    pub wall_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunState {
    Idle,
    Busy,
    Retry,
}

#[derive(Debug, Clone)]
struct Recovering {
    aborted_message: Option<String>,
    /// This recovery is an escalation of repeated continues.
    escalation: Option<Escalation>,
}

/// At most this many running tools and open questions/permissions are remembered per
/// session: ids come from the server, and a server that never ends them must not grow a
/// session without bound. Past it new ones are not remembered; the session still counts
/// as running a tool, or waiting on the person, until those it has end.
const MAX_OPEN_PER_SESSION: usize = 256;

/// Where the verification of a request whose answer was lost stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    /// The session is looked at then (the request had time to land).
    At(Instant),
    /// The open intents are being read from the ledger.
    Finding,
}

impl Verify {
    fn at(self) -> Option<Instant> {
        match self {
            Verify::At(at) => Some(at),
            _ => None,
        }
    }
}

/// The state of one session and the rules that move it.
#[derive(Debug)]
pub struct SessionCore {
    /// Shared by every session of the server.
    server: Arc<str>,
    /// Shared with the registry's key for the session (one copy of the id per session).
    id: Arc<str>,
    cfg: Arc<SessionRules>,
    /// Replaced whole, only when it changes; an `Arc` shared with the session's
    /// published detail (one copy per session, not two).
    directory: Option<Arc<str>>,
    /// The session's title as the server last described it (shown by `shepherd top`);
    /// shared like the directory.
    title: Option<Arc<str>>,
    created_ms: Option<i64>,
    /// The session's `time.updated` as the stream last showed it (it moves with every
    /// turn); not from REST descriptions, and not moved while blind: after an outage it
    /// is what the stream showed before it, so a listing read after that which says the
    /// same shows that nothing happened to the session meanwhile
    /// ([`SessionCore::todo_reread`]).
    updated_ms: Option<i64>,
    busy: RunState,
    last_activity: Instant,
    /// The last real progress (see [`SessionCore::real_progress`]); until the first, when
    /// this core was made (Shepherd first saw the session, or resumed it from the ledger
    /// after a restart — always after its creation). `max_session_age` counts from it.
    progress_at: Instant,
    /// The server's event stream is down: what the session does is unknown, so no clock
    /// that measures its silence runs (stall, nudge, review, orphan).
    blind: bool,
    /// An idle edge was taken since the stream last went down (or since this core was
    /// made): a turn that ended unseen has had its edge — from the reconciliation's idle
    /// status, or a turn seen after the reconnect — and is not given a second.
    idle_edge_since_blind: bool,
    /// When sight came back (the stream reconnected and the reconciliation ran): silence
    /// is counted from here at the earliest.
    sighted_at: Option<Instant>,
    /// Running tool parts: part id → tool name.
    running_tools: Open<String>,
    /// Questions and permissions waiting on the person.
    waiting_on_person: Open<()>,
    /// Made exactly to size when the list changes (a `Vec` kept a grown capacity, and
    /// is 8 bytes more inline), and shared with the session's published detail (one
    /// copy per list, not two): memory per session is a scale target.
    todos: Arc<[Todo]>,
    /// Role and ownership of the last [`ROLE_MEMORY`] messages seen.
    messages: MessageMemory,
    turn: Option<TurnSettings>,
    /// The latest assistant message (`Box<str>`: replaced whole, only when it changes).
    last_assistant: Option<Box<str>>,
    attempts: u32,
    auto_submits: u32,
    pause: Option<Pause>,
    /// When a timed [`Pause::Person`] ends (see `core/hold.rs`).
    hold_until: Option<Box<hold::HoldUntil>>,
    /// The recovery under way. Boxed: most sessions are not recovering (and this is
    /// inline in every session: memory per session is a scale target).
    recovering: Option<Box<Recovering>>,
    /// When the last recovery ended, and the message it aborted (a trailing abort of
    /// its own is not a person's). Boxed: only sessions that were recovered have one.
    recovery_ended: Option<Box<(Instant, Option<String>)>>,
    backoff_until: Option<Instant>,
    last_reply: LastReply,
    followup: FollowUp,
    /// The subagents this session started (boxed: most sessions have none).
    family: Option<Box<Family>>,
    /// Prompt size of the latest finished model call (what fills the window).
    context_tokens: Option<u64>,
    /// The window of the session's model (from the server's provider list, or an
    /// overflow error's exact numbers).
    window: Option<u64>,
    /// The model of the latest assistant message.
    model: Option<ModelRef>,
    /// OpenCode is compacting the session (a `compaction` part or summary seen), since
    /// this moment (when it was first seen: `compaction.max_wait` counts from it).
    compacting: Option<Instant>,
    /// Shepherd's own `POST /summarize` is under way.
    compaction_in_flight: bool,
    last_compaction: Option<Instant>,
    /// A follow-up prompt waiting behind the hard gate's compaction.
    /// Boxed: rare, and a `PromptOrder` is large to carry inline in every session.
    held_prompt: Option<Box<PromptOrder>>,
    /// The hand-off to a fresh session.
    rollover: Rollover,
    /// The current run of identical tool calls.
    spin: ToolSpin,
    planning: Planning,
    /// The type of the latest part seen (`text`, `reasoning`, `tool:NAME`, …).
    last_part: Option<String>,
    /// Bumped whenever a durable field (what [`SessionCore::export`] returns) changes.
    generation: u64,
    /// Bumped whenever `model` changes.
    model_generation: u64,
    /// Advice before an abort or a nudge (`advisor.enabled`): see `advice.rs`.
    advice: AdviceGate,
    /// A request failed in a way that may still have reached OpenCode (its intent stays
    /// open): the session is looked at once the request had time to land.
    verify: Verify,
    /// Loop and crash memory most sessions never fill (see `core/rare.rs`).
    rare: Option<Box<rare::Rare>>,
    /// Provider errors and the resume back-off (boxed: most sessions never have one);
    /// see `core/resume.rs`.
    outage: Option<Box<Outage>>,
    /// A subagent's session (it has a parent).
    subagent: bool,
}

impl SessionCore {
    pub fn new(server: impl Into<Arc<str>>, id: impl AsRef<str>, cfg: Arc<SessionRules>, now: Now) -> Self {
        Self::with_shared_id(server, id.as_ref().into(), cfg, now)
    }

    /// [`SessionCore::new`] with an id already shared (the registry keys the session by it).
    pub fn with_shared_id(server: impl Into<Arc<str>>, id: Arc<str>, cfg: Arc<SessionRules>, now: Now) -> Self {
        Self {
            server: server.into(),
            id,
            cfg,
            directory: None,
            title: None,
            created_ms: None,
            updated_ms: None,
            busy: RunState::Idle,
            last_activity: now.mono,
            progress_at: now.mono,
            blind: false,
            idle_edge_since_blind: false,
            sighted_at: None,
            running_tools: Open::default(),
            waiting_on_person: Open::default(),
            todos: Arc::default(),
            messages: MessageMemory::default(),
            turn: None,
            last_assistant: None,
            attempts: 0,
            auto_submits: 0,
            pause: None,
            hold_until: None,
            recovering: None,
            recovery_ended: None,
            backoff_until: None,
            last_reply: LastReply::default(),
            followup: FollowUp::default(),
            family: None,
            context_tokens: None,
            window: None,
            model: None,
            compacting: None,
            compaction_in_flight: false,
            last_compaction: None,
            held_prompt: None,
            rollover: Rollover::default(),
            spin: ToolSpin::default(),
            planning: Planning::default(),
            last_part: None,
            generation: 0,
            model_generation: 0,
            advice: AdviceGate::default(),
            verify: Verify::Nothing,
            rare: None,
            outage: None,
            subagent: false,
        }
    }

    /// Changes whenever the durable state ([`SessionCore::export`]) may have changed,
    /// so the actor writes it only then instead of exporting it after every event.
    pub fn durable_generation(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::hasher();
        (self.generation, self.followup.generation(), self.rollover.durable_fingerprint()).hash(&mut h);
        self.outage.as_ref().map(|o| o.memory()).hash(&mut h);
        h.finish()
    }

    /// Counts the changes of the core's own durable fields, the todo list among them
    /// (one load, unlike [`SessionCore::durable_generation`]): the session's published
    /// view compares it after every event to see whether its todos changed.
    pub fn facts_generation(&self) -> u64 {
        self.generation
    }

    /// Marks a change of a durable field.
    fn touch(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id as shared with the session's registry slot (one copy per session).
    pub fn shared_id(&self) -> &Arc<str> {
        &self.id
    }

    pub fn directory(&self) -> Option<&str> {
        self.directory.as_deref()
    }

    pub fn is_busy(&self) -> bool {
        self.busy != RunState::Idle
    }

    /// Busy, but OpenCode is retrying a model call (no stall timer runs meanwhile).
    pub fn is_retrying(&self) -> bool {
        self.busy == RunState::Retry
    }

    pub fn pause(&self) -> Option<Pause> {
        self.pause
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn todos(&self) -> &[Todo] {
        &self.todos
    }

    /// The todo list, shared (the session's published detail holds it without a copy).
    pub fn shared_todos(&self) -> Arc<[Todo]> {
        Arc::clone(&self.todos)
    }

    /// The title and the directory, shared like the todos.
    pub fn shared_names(&self) -> (Option<Arc<str>>, Option<Arc<str>>) {
        (self.title.clone(), self.directory.clone())
    }

    pub fn is_recovering(&self) -> bool {
        self.recovering.is_some()
    }

    /// `(tokens, window)` of the session's context, when known.
    pub fn context(&self) -> (Option<u64>, Option<u64>) {
        (self.context_tokens, self.window)
    }

    /// `provider/model` of the session's model, the key of the window table.
    pub fn model_key(&self) -> Option<String> {
        self.model.as_ref().map(|m| format!("{}/{}", m.provider_id, m.model_id))
    }

    /// The model of the latest assistant message.
    pub fn model(&self) -> Option<&ModelRef> {
        self.model.as_ref()
    }

    /// Changes whenever [`SessionCore::model`] does.
    pub fn model_generation(&self) -> u64 {
        self.model_generation
    }

    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// The session rules in force.
    pub fn rules(&self) -> &Arc<SessionRules> {
        &self.cfg
    }

    /// Replaces the recovery settings (hot reload); applies to decisions from now on.
    pub fn set_config(&mut self, cfg: Arc<SessionRules>) {
        self.cfg = cfg;
    }

    /// Whether the session is planning now (agent `plan`, or a plan announced).
    pub fn is_planning(&self) -> bool {
        self.planning.active()
    }

    fn open_todos(&self) -> u32 {
        self.todos.iter().filter(|t| t.status.is_open()).count() as u32
    }

    // ── Intents left open by a crash ──────────────────────────────────────────

    // ── Hand-off ────────────────────────────────────────────────────────────────

    fn record(&self, action: Action, outcome: Outcome, reason: &str, numbers: Numbers, now: Now) -> Effect {
        Effect::Record(ActionRecord {
            server: self.server.to_string(),
            session: self.id.to_string(),
            action,
            outcome,
            reason: reason.to_string(),
            numbers,
            at_ms: now.wall_ms,
        })
    }
}

fn action_of(kind: PromptKind) -> Action {
    match kind {
        PromptKind::Nudge => Action::Nudge,
        PromptKind::Review => Action::Review,
        PromptKind::Continue => Action::Continue,
        PromptKind::Custom => Action::Prompt,
        PromptKind::Note => Action::Note,
        PromptKind::Handoff => Action::Handoff,
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

// One file per behaviour: each adds the methods it owns to `impl SessionCore`.
mod advice;
mod arbiter;
mod compaction;
mod durable;
mod escalation;
mod facts;
mod handoff;
mod hold;
mod intents;
mod nudge;
mod open;
mod orphan;
mod person;
mod rare;
mod resume;
mod runaway;
mod spin;
mod stall;

use facts::MessageMemory;
use open::Open;
pub use hold::HoldScope;

#[cfg(test)]
mod testkit;
