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

use std::collections::{HashMap, HashSet, VecDeque};
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
use crate::ports::{EngineError, TurnSettings};
use crate::session::delivery::{Delivery, PromptKind, PromptOrder, ToolTextScan};
use crate::session::family::{ChildNews, Family};
use crate::session::followup::{self, Decision, Delivered, Facts, FollowUp, LastReply};
use crate::session::handoff::{Phase, Rollover, Step};
use crate::session::handover::{HandoffOrder, StepReport};
pub use crate::session::loops::Escalation;
use crate::session::loops::{ContinueHistory, SpinVerdict, ToolSpin};
use crate::session::outage::{classify, ErrorClass, Outage};
use crate::session::planning::Planning;
use crate::session::prompt::PromptFacts;
use crate::session::unfinished::{FinishOrder, FinishReport};
use crate::session::textual_tool_call::TextualToolCall;

/// A moment, in both of the clocks the core compares with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub mono: Instant,
    /// Epoch milliseconds (OpenCode's timestamps).
    pub wall_ms: i64,
}

/// What the actor must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Write this record to the journal.
    Record(ActionRecord),
    /// Run the abort + continue procedure.
    Recover(RecoveryOrder),
    /// Deliver a nudge or a review.
    Prompt(PromptOrder),
    /// Compact the session (`POST /summarize` with its own model).
    Compact(CompactOrder),
    /// Run one step of a hand-off.
    HandOff(HandoffOrder),
    /// Ask the advisor; its answer goes to [`SessionCore::on_advice`].
    Advise(AdviceRequest),
    /// Finish an action a crash left open (its intent); the report goes to
    /// [`SessionCore::on_unfinished_done`].
    Finish(FinishOrder),
    /// Read this session's open intents from the ledger and hand them to
    /// [`SessionCore::on_open_intents`] (a request that may have arrived is verified).
    FindIntents,
    /// Tell the server's provider breaker, or ask it (its answer goes to
    /// [`SessionCore::on_breaker_permit`]).
    Breaker(BreakerCall),
    /// The session is gone: stop the actor.
    Stop,
}

/// What the core tells or asks the server's provider breaker (`session::breaker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerCall {
    /// This session's turn ended on a provider error.
    Failed,
    /// This session, which had failed on provider errors, finished a turn normally.
    Recovered,
    /// May this session resume now?
    Ask,
}

/// Everything the recovery procedure needs to know, decided by the core.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveryOrder {
    pub session_id: String,
    pub directory: Option<String>,
    /// 1-based attempt number, rendered into the continue prompt.
    pub attempt: u32,
    /// Todos as last seen in events (the procedure re-reads them before writing).
    pub known_todos: Vec<Todo>,
    /// Agent/model of the last user message, if seen in events.
    pub known_turn: Option<TurnSettings>,
    /// A fresh id naming this decision in the prompt's metadata and the log.
    pub decision: String,
    /// When it was decided (epoch ms): prompts before it are not repeated by its continue.
    pub decided_ms: i64,
    /// Past `handoff.hard`: compact (with this model, waiting at most this long)
    /// between the abort and the continue.
    pub compact_first: Option<(ModelRef, Duration)>,
    /// Send the continue after the abort (false: a runaway loop that came back).
    pub continue_after: bool,
    /// The session is planning: the continue uses `continue_with_plan_message`.
    pub planning: bool,
    /// Repeated continues did not help: this instead of a plain continue (`Compact`,
    /// carried out as `compact_first`; a hand-off runs as its own procedure instead).
    pub escalation: Option<Escalation>,
}

/// A compaction to run.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactOrder {
    pub session_id: String,
    pub model: ModelRef,
    pub reason: String,
}

/// How the recovery procedure ended.
#[derive(Debug, Clone)]
pub enum RecoveryReport {
    /// `GET /session/status` says the session is not busy: nothing was done.
    NotBusy,
    /// The status could not be read: nothing was done (no abort on a guess).
    StatusUnavailable(EngineError),
    /// The abort request failed: nothing else was done.
    AbortFailed(EngineError),
    /// Shutdown began before the abort: nothing was done.
    Cancelled,
    /// Another Shepherd instance holds the session's lease: it acts, this one did nothing.
    NotOurs(String),
    /// Aborted, then continued.
    /// Aborted, then continued (`compacted`: the hard gate's compaction, if one ran).
    /// `tool_call_as_text`: the specialised prompt was sent because of this;
    /// `waited_ms`: the guard's rate limit held the continue back this long.
    Continued {
        idle_after_ms: Option<u64>,
        open_todos: u32,
        compacted: Option<Result<(), String>>,
        tool_call_as_text: Option<TextualToolCall>,
        waited_ms: u64,
    },
    /// Aborted; no continue was wanted.
    AbortedOnly { idle_after_ms: Option<u64> },
    /// Aborted, but the continue could not be sent.
    ContinueFailed { idle_after_ms: Option<u64>, error: EngineError },
    /// Aborted; the guard held the continue back (a similar prompt reached the session
    /// after the stall was decided — e.g. from another instance or the person).
    ContinueDeclined { idle_after_ms: Option<u64>, reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunState {
    Idle,
    Busy,
    Retry,
}

/// Why automation is off for this session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// The person aborted the session.
    UserAbort,
    /// Shepherd's limits were reached.
    GaveUp,
    /// A person paused Shepherd for this session (`shepherd pause SESSION`): see
    /// `core/hold.rs`. The person writing does not lift it.
    Person,
    /// The fleet is paused (`shepherd pause --all`).
    Fleet,
}

impl Pause {
    pub fn as_str(self) -> &'static str {
        match self {
            Pause::UserAbort => "user_abort",
            Pause::GaveUp => "gave_up",
            Pause::Person => "person",
            Pause::Fleet => "fleet",
        }
    }

    fn parse(text: &str) -> Option<Pause> {
        [Pause::UserAbort, Pause::GaveUp, Pause::Person, Pause::Fleet].into_iter().find(|p| p.as_str() == text)
    }

    /// Whether the person writing in the session lifts it (not a hold they asked for).
    fn lifted_by_the_person_writing(self) -> bool {
        matches!(self, Pause::UserAbort | Pause::GaveUp)
    }
}

#[derive(Debug, Clone)]
struct Recovering {
    aborted_message: Option<String>,
    /// This recovery is an escalation of repeated continues.
    escalation: Option<Escalation>,
}

/// How many message roles to remember (to tell user parts from assistant parts). A
/// message's parts follow its `message.updated` closely, so a short memory suffices; it
/// is per session, so it is most of a long-lived session's footprint (fleet bench).
const ROLE_MEMORY: usize = 32;

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
    id: String,
    cfg: Arc<SessionRules>,
    directory: Option<String>,
    /// The session's title as the server last described it (shown by `shepherd top`).
    /// Boxed: one pointer and length inline, nothing when there is none.
    title: Option<Box<str>>,
    created_ms: Option<i64>,
    busy: RunState,
    last_activity: Instant,
    /// The last real progress (see [`SessionCore::real_progress`]); until the first, when
    /// this core was made (Shepherd first saw the session, or resumed it from the ledger
    /// after a restart — always after its creation). `max_session_age` counts from it.
    progress_at: Instant,
    /// The server's event stream is down: what the session does is unknown, so no clock
    /// that measures its silence runs (stall, nudge, review, orphan).
    blind: bool,
    /// When sight came back (the stream reconnected and the reconciliation ran): silence
    /// is counted from here at the earliest.
    sighted_at: Option<Instant>,
    /// Running tool parts: part id → tool name.
    running_tools: HashMap<String, String>,
    waiting_on_person: HashSet<String>,
    todos: Vec<Todo>,
    /// Role and ownership of the last [`ROLE_MEMORY`] messages seen.
    messages: MessageMemory,
    turn: Option<TurnSettings>,
    last_assistant: Option<String>,
    attempts: u32,
    auto_submits: u32,
    pause: Option<Pause>,
    /// When a timed [`Pause::Person`] ends (see `core/hold.rs`).
    hold_until: Option<Box<hold::HoldUntil>>,
    recovering: Option<Recovering>,
    recovery_ended: Option<(Instant, Option<String>)>,
    backoff_until: Option<Instant>,
    last_reply: LastReply,
    followup: FollowUp,
    /// The interrupted assistant message already continued after a server restart.
    interrupted_continued: Option<String>,
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
    /// Recent assistant messages that ended with `finish: "unknown"` and no output.
    empty_finishes: VecDeque<(String, Instant)>,
    /// Runaway loops already broken for this session since the last real progress.
    runaways: u32,
    /// The hand-off to a fresh session.
    rollover: Rollover,
    /// Continues since the last real progress (repeated continues → escalation).
    continues: ContinueHistory,
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
    /// Decisions of open intents being resumed (after a restart or reconnect).
    resuming: Vec<String>,
    /// A request failed in a way that may still have reached OpenCode (its intent stays
    /// open): the session is looked at once the request had time to land.
    verify: Verify,
    /// Provider errors and the resume back-off (boxed: most sessions never have one);
    /// see `core/resume.rs`.
    outage: Option<Box<Outage>>,
    /// A subagent's session (it has a parent).
    subagent: bool,
}

impl SessionCore {
    pub fn new(server: impl Into<Arc<str>>, id: impl Into<String>, cfg: Arc<SessionRules>, now: Now) -> Self {
        Self {
            server: server.into(),
            id: id.into(),
            cfg,
            directory: None,
            title: None,
            created_ms: None,
            busy: RunState::Idle,
            last_activity: now.mono,
            progress_at: now.mono,
            blind: false,
            sighted_at: None,
            running_tools: HashMap::new(),
            waiting_on_person: HashSet::new(),
            todos: Vec::new(),
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
            interrupted_continued: None,
            family: None,
            context_tokens: None,
            window: None,
            model: None,
            compacting: None,
            compaction_in_flight: false,
            last_compaction: None,
            held_prompt: None,
            empty_finishes: VecDeque::new(),
            runaways: 0,
            rollover: Rollover::default(),
            continues: ContinueHistory::default(),
            spin: ToolSpin::default(),
            planning: Planning::default(),
            last_part: None,
            generation: 0,
            model_generation: 0,
            advice: AdviceGate::default(),
            resuming: Vec::new(),
            verify: Verify::Nothing,
            outage: None,
            subagent: false,
        }
    }

    /// Changes whenever the durable state ([`SessionCore::export`]) may have changed,
    /// so the actor writes it only then instead of exporting it after every event.
    pub fn durable_generation(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.generation, self.followup.generation(), self.rollover.durable_fingerprint()).hash(&mut h);
        self.outage.as_ref().map(|o| o.memory()).hash(&mut h);
        h.finish()
    }

    /// Marks a change of a durable field.
    fn touch(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn directory(&self) -> Option<&str> {
        self.directory.as_deref()
    }

    pub fn is_busy(&self) -> bool {
        self.busy != RunState::Idle
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

    pub fn is_recovering(&self) -> bool {
        self.recovering.is_some()
    }

    /// `(tokens, window)` of the session's context, when known.
    pub fn context(&self) -> (Option<u64>, Option<u64>) {
        (self.context_tokens, self.window)
    }

    /// The share of the window in use, when both numbers are known.
    pub fn context_share(&self) -> Option<f64> {
        match (self.context_tokens, self.window) {
            (Some(t), Some(w)) if w > 0 => Some(t as f64 / w as f64),
            _ => None,
        }
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

    /// The window of the session's model, as the server lists it.
    pub fn set_window(&mut self, window: Option<u64>) {
        if window.is_some() {
            self.window = window;
        }
    }

    pub fn is_compacting(&self) -> bool {
        self.compacting.is_some() || self.compaction_in_flight
    }

    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    /// How long the session has been quiet: no activity, counted from when Shepherd last
    /// regained sight of it at the earliest (what the stall timer counts).
    pub fn quiet_for(&self, now: Now) -> Duration {
        now.mono.saturating_duration_since(self.silent_since())
    }

    /// Where the stall timer counts silence from: the last activity, or the moment the
    /// event stream came back if that is later (a session Shepherd could not see was not
    /// silent, only unseen).
    fn silent_since(&self) -> Instant {
        self.watched_since(self.last_activity)
    }

    /// `t`, or the moment sight came back if that is later.
    fn watched_since(&self, t: Instant) -> Instant {
        self.sighted_at.map_or(t, |s| s.max(t))
    }

    /// The server's event stream went down: Shepherd is blind to this session. The
    /// clocks that measure its silence stop (stall, nudge, review, orphan) until
    /// [`SessionCore::on_sight`]; what the session does meanwhile is unknown, not quiet.
    pub fn on_blind(&mut self) {
        self.blind = true;
    }

    /// The stream is back and the reconciliation has run (statuses applied, interrupted
    /// turns checked): silence is counted from now. Follow-ups and orphan waits that
    /// fell due while blind are decided now, on the reconciled facts.
    pub fn on_sight(&mut self, now: Now) {
        if self.blind {
            self.blind = false;
            self.sighted_at = Some(now.mono);
        }
    }

    /// The stall timeout in force while the stall timer runs — busy, not retrying, not
    /// paused, recovering, compacting, handed off, or waiting on a person — else `None`.
    /// A session past it that is still here is stalled (in back-off, postponed by
    /// advice, out of continues, or being looked at by the advisor).
    pub fn stall_clock(&self) -> Option<Duration> {
        let runs = self.busy == RunState::Busy
            && !self.blind
            && self.recovering.is_none()
            && self.pause.is_none()
            && self.waiting_on_person.is_empty()
            && !self.is_compacting()
            && !self.rollover.suspends_automation();
        runs.then(|| self.stall_timeout())
    }

    /// The session waits for a person: a question or permission is open, or it stopped
    /// with a reply that asks the person something.
    pub fn waits_on_person(&self) -> bool {
        !self.waiting_on_person.is_empty()
            || (self.busy == RunState::Idle && (self.last_reply.text_asks || self.last_reply.used_question_tool))
    }

    /// Replaces the recovery settings (hot reload); applies to decisions from now on.
    pub fn set_config(&mut self, cfg: Arc<SessionRules>) {
        self.cfg = cfg;
    }

    /// One more model call that ended with no finish reason and no output. N of them in
    /// the window is OpenCode's runaway loop: abort and continue once; if it comes back,
    /// abort and stop (paused, reported).
    fn on_empty_finish(&mut self, message_id: &str, now: Now) -> Vec<Effect> {
        let window = self.cfg.loops.runaway_window;
        self.empty_finishes.retain(|(_, at)| now.mono.duration_since(*at) <= window);
        if self.empty_finishes.iter().any(|(id, _)| id == message_id) {
            return Vec::new(); // the same message, re-emitted
        }
        self.empty_finishes.push_back((message_id.to_string(), now.mono));
        if self.empty_finishes.len() < self.cfg.loops.runaway_count || self.recovering.is_some() || self.pause.is_some()
        {
            return Vec::new();
        }
        self.empty_finishes.clear();
        self.runaways += 1;
        let again = self.runaways > 1;
        let numbers = Numbers {
            attempt: Some(self.runaways),
            round: Some(self.cfg.loops.runaway_count as u32),
            ..Numbers::default()
        };
        let reason = if again {
            "runaway loop again (model calls ending with no finish reason and no output): aborting and stopping"
        } else {
            "runaway loop (model calls ending with no finish reason and no output): aborting, then one continue"
        };
        if again {
            self.pause = Some(Pause::GaveUp);
            self.touch();
        }
        self.recovering = Some(Recovering { aborted_message: Some(message_id.to_string()), escalation: None });
        vec![
            self.record(Action::StallDetected, Outcome::Done, reason, numbers, now),
            Effect::Recover(RecoveryOrder {
                continue_after: !again,
                planning: false,
                ..self.recovery_order(self.attempts + 1, Some("runaway"), now)
            }),
        ]
    }

    /// Exact numbers from a context-length error text (configurable patterns).
    fn learn_from_overflow(&mut self, err: &ErrorInfo) {
        let Some(text) = err.data.as_ref().and_then(|d| d.message.as_deref()) else { return };
        for re in &self.cfg.error_patterns {
            if let Some(c) = re.captures(text) {
                let num = |name: &str| c.name(name).and_then(|m| m.as_str().parse::<u64>().ok());
                if let Some(limit) = num("limit") {
                    self.window = Some(limit);
                }
                if let Some(used) = num("used") {
                    self.context_tokens = Some(used);
                }
                return;
            }
        }
    }

    /// On a busy→idle edge: compact when the last turn overflowed (emergency: OpenCode's
    /// own compaction is off or failed) or the window is past `proactive`.
    fn consider_compaction(&mut self, now: Now) -> Vec<Effect> {
        let cfg = &self.cfg.compaction;
        if !cfg.enabled || self.pause.is_some() {
            return Vec::new();
        }
        let overflowed = self.last_reply.error.as_deref() == Some(ErrorInfo::CONTEXT_OVERFLOW);
        let share = self.context_share();
        let numbers =
            Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() };
        let reason = if overflowed {
            if self.last_reply.error_text.as_deref().is_some_and(|t| t.contains("too large to compact")) {
                let mut out = vec![self.record(
                    Action::Compact,
                    Outcome::Declined,
                    "the session is too large to compact: handing it off to a fresh session instead",
                    numbers,
                    now,
                )];
                if self.cfg.handoff.enabled {
                    if let Some(step) = self.rollover.request(false, "too large to compact") {
                        out.extend(self.on_rollover_step(step, now));
                    }
                }
                return out;
            }
            "the last turn overflowed the context window and OpenCode did not compact: emergency compaction"
        } else if share.is_some_and(|s| s >= cfg.proactive) {
            "idle past compaction.proactive of the context window"
        } else {
            return Vec::new();
        };
        if let Some(last) = self.last_compaction {
            if now.mono.duration_since(last) < cfg.cooldown && !overflowed {
                return vec![self.record(
                    Action::Compact,
                    Outcome::Declined,
                    "within compaction.cooldown",
                    numbers,
                    now,
                )];
            }
        }
        let Some(model) = self.model.clone() else {
            return vec![self.record(
                Action::Compact,
                Outcome::Declined,
                "the session's model is not known yet",
                numbers,
                now,
            )];
        };
        self.compaction_in_flight = true;
        self.last_compaction = Some(now.mono);
        vec![Effect::Compact(CompactOrder { session_id: self.id.clone(), model, reason: reason.to_string() })]
    }

    /// Shepherd's compaction ended (`Ok` when OpenCode answered `true`).
    pub fn on_compaction_finished(
        &mut self,
        order: &CompactOrder,
        result: Result<(), String>,
        now: Now,
    ) -> Vec<Effect> {
        self.compaction_in_flight = false;
        self.compacting = None;
        let numbers =
            Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() };
        let out = vec![match result {
            Ok(()) => {
                self.context_tokens = None;
                self.rollover.on_compacted();
                self.record(Action::Compact, Outcome::Done, &order.reason, numbers, now)
            }
            Err(e) => self.record(Action::Compact, Outcome::Failed, &format!("{}: {e}", order.reason), numbers, now),
        }];
        let mut out = out;
        if let Some(held) = self.held_prompt.take() {
            if let Some(p) = self.pause {
                // Paused during the compaction: not sent, as if skipped at delivery.
                self.followup.on_delivered(held.kind, Delivered::NotSent);
                let reason = format!("automation is paused ({})", p.as_str());
                let numbers = Numbers { round: Some(held.facts.attempts), ..Numbers::default() };
                out.push(self.record(action_of(held.kind), Outcome::Declined, &reason, numbers, now));
            } else {
                out.push(Effect::Prompt(*held)); // the hard gate's prompt, compacted or not
            }
        } else if self.busy == RunState::Idle {
            // Follow-ups held back while compacting get their turn now.
            self.followup.on_idle_edge(now.mono, &self.todos, false, &self.cfg.nudge, &self.cfg.review);
        }
        out
    }

    /// What must survive eviction and restarts (see [`DurableState`]).
    pub fn export(&self, now: Now) -> DurableState {
        let f = self.followup.export(now.mono);
        DurableState {
            attempts: self.attempts,
            auto_submits: self.auto_submits,
            paused: self.pause.map(|p| p.as_str().to_string()),
            paused_until_ms: self.hold_until.as_ref().map(|u| u.wall_ms),
            todos: self.todos.clone(),
            nudges_without_progress: f.nudges_without_progress,
            nudge_snapshot: f
                .nudge_snapshot
                .map(|snap| snap.into_iter().map(|(c, st)| (c, status_name(st).to_string())).collect()),
            last_nudge_ms: f.since_last_nudge.map(|d| now.wall_ms - ms(d) as i64),
            review_armed: f.review_armed,
            review_rounds: f.review_rounds,
            interrupted_continued: self.interrupted_continued.clone(),
            last_action: None,
            last_action_ms: None,
            handoff: self.rollover.export(),
            handoff_from: self.rollover.from().map(str::to_string),
            outage: self.outage.as_ref().map(|o| o.memory().clone()).unwrap_or_default(),
        }
    }

    /// Resumes from what the ledger remembered: counters, flags, the todo snapshot.
    pub fn restore(&mut self, d: &DurableState, now: Now) {
        self.touch();
        self.attempts = d.attempts;
        self.auto_submits = d.auto_submits;
        // A fleet pause is the supervisor's to give (it tells every actor it creates while
        // the fleet is paused): one remembered from before is not kept.
        self.pause = d.paused.as_deref().and_then(Pause::parse).filter(|p| *p != Pause::Fleet);
        self.hold_until = match (self.pause, d.paused_until_ms) {
            (Some(Pause::Person), Some(wall_ms)) => Some(Box::new(hold::HoldUntil::at(wall_ms, now))),
            _ => None,
        };
        self.todos.clone_from(&d.todos);
        self.interrupted_continued.clone_from(&d.interrupted_continued);
        self.rollover.restore(&d.handoff, d.handoff_from.as_deref());
        self.outage =
            (d.outage != OutageMemory::default()).then(|| Box::new(Outage::restore(&d.outage, now.mono, now.wall_ms)));
        let since_last_nudge =
            d.last_nudge_ms.map(|t| Duration::from_millis(now.wall_ms.saturating_sub(t).max(0) as u64));
        self.followup.restore(
            followup::FollowUpMemory {
                nudges_without_progress: d.nudges_without_progress,
                nudge_snapshot: d
                    .nudge_snapshot
                    .as_ref()
                    .map(|snap| snap.iter().filter_map(|(c, st)| Some((c.clone(), status_from_name(st)?))).collect()),
                since_last_nudge,
                review_armed: d.review_armed,
                review_rounds: d.review_rounds,
            },
            now.mono,
        );
        self.followup.resume_armed_review(now.mono, &self.cfg.review);
    }

    /// Learns the session's directory and creation time from its description.
    pub fn hydrate(&mut self, info: &SessionInfo) {
        if info.directory.is_some() {
            self.directory.clone_from(&info.directory);
        }
        if info.time.created.is_some() {
            self.created_ms = info.time.created;
        }
        if let Some(title) = info.title.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            if self.title.as_deref() != Some(title) {
                self.title = Some(title.into());
            }
        }
        if let Some(from) = info.handoff_from() {
            self.rollover.set_from(from);
        }
        if info.parent_id.is_some() {
            self.subagent = true;
        }
    }

    /// The stall timeout in force now.
    pub fn stall_timeout(&self) -> Duration {
        if self.waits_on_idle_children() {
            return self.cfg.orphan_wait;
        }
        if self.running_tools.is_empty() {
            if self.planning.active() {
                self.cfg.recovery.planning_timeout
            } else {
                self.cfg.recovery.stall_timeout
            }
        } else {
            self.cfg.recovery.stall_timeout.mul_f64(self.cfg.recovery.tool_grace_factor)
        }
    }

    /// A parent whose `task` tool runs while every child it started is idle: the
    /// children are done and the parent should have moved on (orphan rule b).
    fn waits_on_idle_children(&self) -> bool {
        self.family.as_ref().is_some_and(|f| f.all_idle()) && self.running_tools.values().any(|t| t == "task")
    }

    fn family(&mut self) -> &mut Family {
        self.family.get_or_insert_with(Box::default)
    }

    /// When [`SessionCore::on_deadline`] should next be called, if ever.
    pub fn deadline(&self) -> Option<Instant> {
        // Blind: no clock that measures the session's silence (the hand-off's drain
        // bounds a turn, not a silence: it runs on).
        let watched = !self.blind;
        [
            self.stall_deadline(),
            self.followup.deadline().filter(|_| watched),
            self.family.as_ref().and_then(|f| f.deadline()).filter(|_| watched),
            // The drain past `hard` ends in an abort: it waits while a person is asked
            // or automation is paused.
            self.rollover.deadline().filter(|_| self.waiting_on_person.is_empty() && self.pause.is_none()),
            self.verify.at(),
            self.hold_deadline(),
            self.outage.as_ref().and_then(|o| o.deadline()).filter(|_| watched),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// An event of a child session (a subagent this session started).
    pub fn on_child_event(&mut self, child: &str, event: &Event, now: Now) -> Vec<Effect> {
        let news = match event {
            Event::SessionStatus { status: Status::Busy | Status::Retry { .. }, .. } => Some(ChildNews::Busy),
            Event::SessionStatus { status: Status::Idle, .. } | Event::SessionIdle { .. } => Some(ChildNews::Idle),
            Event::SessionError { .. } => Some(ChildNews::Failed),
            Event::MessageUpdated(m) if m.error.is_some() => Some(ChildNews::Failed),
            Event::SessionCreated(_) | Event::SessionUpdated(_) | Event::SessionDiff { .. } => None,
            _ => {
                self.family().adopt(child);
                self.activity(now); // the child works, so the parent is not stalled
                return Vec::new();
            }
        };
        let (parent_idle, orphan_at) = (self.busy == RunState::Idle, now.mono + self.cfg.orphan_wait);
        let family = self.family();
        match news {
            Some(news) if family.on_news(child, news, parent_idle, orphan_at) => self.activity(now),
            Some(_) => {}
            None => family.adopt(child),
        }
        Vec::new()
    }

    /// A continue for an idle session that was left hanging (orphaned parent, turn
    /// cut off by a restart): no abort needed, delivered only if still idle.
    fn continue_when_idle(&self, why: &str, now: Now) -> PromptOrder {
        let planning = self.planning.active();
        let r = &self.cfg.recovery;
        PromptOrder {
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            kind: PromptKind::Continue,
            template: if planning {
                r.continue_with_plan_message.clone()
            } else {
                r.continue_with_todos_message.clone()
            },
            template_without_open_todos: (!planning).then(|| r.continue_message.clone()),
            facts: PromptFacts {
                attempts: self.attempts + 1,
                max_attempts: self.cfg.recovery.max_auto_submits,
                context_summary: String::new(),
            },
            known_todos: self.todos.clone(),
            known_turn: self.turn.clone(),
            require_idle: true,
            require_open_todos: false,
            decision: format!("{}-{why}-{}", self.id, now.wall_ms),
            not_before_ms: None,
            tool_text_scan: ToolTextScan::from_config(&self.cfg.recovery),
            model: None,
        }
    }

    fn on_orphan_deadline(&mut self, now: Now) -> Vec<Effect> {
        let due = self.family.as_mut().map(|f| f.take_due(now.mono)).unwrap_or_default();
        let mut out = Vec::new();
        let mut continues = false;
        for child in due {
            if self.busy != RunState::Idle {
                continue; // the parent moved on by itself
            }
            if let Some(p) = self.pause {
                let reason = format!("background subagent {child} failed, but automation is paused ({})", p.as_str());
                out.push(self.record(Action::Recover, Outcome::Declined, &reason, Numbers::default(), now));
                continue;
            }
            let reason = format!(
                "background subagent {child} ended with an error and no notice reached this parent within orphan_wait: continuing the parent"
            );
            out.push(self.record(Action::Recover, Outcome::Done, &reason, Numbers::default(), now));
            continues = true;
        }
        if continues {
            // One continue however many children it lost at once: one decision, one prompt.
            out.push(Effect::Prompt(self.continue_when_idle("orphan", now)));
        }
        out
    }

    fn stall_deadline(&self) -> Option<Instant> {
        if self.compaction_in_flight || self.rollover.suspends_automation() {
            // Shepherd's own compaction is bounded by its call (`compaction.max_wait`); a
            // session being handed off is the hand-off's.
            return None;
        }
        if self.blind {
            return None; // unseen is not silent
        }
        if self.busy != RunState::Busy
            || self.recovering.is_some()
            || self.pause.is_some()
            || !self.waiting_on_person.is_empty()
        {
            return None;
        }
        if self.advice.pending() == Some(About::Abort) {
            return None; // the advisor is being asked
        }
        if !self.resuming.is_empty() {
            return None; // an action left open is being finished: its outcome comes first
        }
        let stall_at = match self.compacting {
            // OpenCode's own compaction: bounded by `compaction.max_wait` from when it was
            // first seen; the summary's stream does not extend it (a summary is one model
            // call of bounded size, and one that streams forever must end too).
            Some(since) => self.watched_since(since) + self.cfg.compaction.max_wait,
            None => self.silent_since() + self.stall_timeout(),
        };
        let stall_at = self.advice.postponed(stall_at);
        // An action whose answer was lost is verified first: a new recovery before that
        // (`abort_poll_max` ≥ the stall timeout) and the verification could each send a
        // continue for the same stall.
        let stall_at = match self.verify {
            Verify::Nothing => stall_at,
            Verify::At(at) => at.max(stall_at),
            Verify::Finding => return None,
        };
        Some(self.backoff_until.map_or(stall_at, |b| b.max(stall_at)))
    }

    /// A todo list read by REST (after a reconnect). Only a list that differs from
    /// what the core knows is news; an unchanged one is not activity.
    pub fn on_todos_refreshed(&mut self, todos: Vec<Todo>, now: Now) -> Vec<Effect> {
        if followup::snapshot(&todos) == followup::snapshot(&self.todos) {
            return Vec::new();
        }
        let session_id = self.id.clone();
        self.observe(&Event::TodoUpdated { session_id, todos }, now)
    }

    /// Feeds one event of this session in.
    pub fn observe(&mut self, event: &Event, now: Now) -> Vec<Effect> {
        let mut out = Vec::new();
        let waited_on = if self.waits_on_person() { self.waits_on() } else { None }; // no allocation in the usual case
        match event {
            Event::SessionCreated(info) | Event::SessionUpdated(info) => self.hydrate(info),
            Event::SessionDeleted(_) => out.push(Effect::Stop),
            Event::SessionStatus { status, .. } => self.on_status(status, now, &mut out),
            Event::SessionIdle { .. } => self.on_status(&Status::Idle, now, &mut out),
            Event::SessionError { error, .. } if error.is_abort() => self.on_abort_seen(None, now, &mut out),
            Event::MessageUpdated(m) => self.on_message(m, now, &mut out),
            Event::PartUpdated(p) => self.on_part(p, now, &mut out),
            Event::PartDelta { message_id, .. } if !self.messages.is_own(message_key(message_id)) => self.activity(now),
            Event::TodoUpdated { todos, .. } => {
                self.activity(now);
                if followup::snapshot(todos) != followup::snapshot(&self.todos) {
                    self.real_progress(now);
                }
                let idle = self.busy == RunState::Idle;
                self.followup.on_todos(&self.todos, todos, now.mono, idle, &self.cfg.review);
                if self.todos != *todos {
                    self.todos.clone_from(todos);
                    self.touch();
                }
            }
            Event::PermissionAsked { id, .. } | Event::QuestionAsked { id, .. } => {
                if self.waiting_on_person.len() < MAX_OPEN_PER_SESSION {
                    self.waiting_on_person.insert(id.clone());
                }
                self.activity(now);
            }
            Event::PermissionReplied { request_id, .. }
            | Event::QuestionReplied { request_id, .. }
            | Event::QuestionRejected { request_id, .. } => {
                self.waiting_on_person.remove(request_id);
                self.activity(now);
            }
            Event::SessionCompacted { .. } => {
                self.activity(now);
                self.compacting = None;
                self.rollover.on_compacted();
                self.context_tokens = None; // unknown until the next model call reports
            }
            Event::SessionError { error, .. } if error.name == ErrorInfo::CONTEXT_OVERFLOW => {
                // The message's own error may arrive after the idle edge; this one does
                // not. If OpenCode then compacts by itself, its next reply replaces it.
                self.learn_from_overflow(error);
                self.last_reply.error = Some(error.name.clone());
                self.last_reply.error_text = error.data.as_ref().and_then(|d| d.message.clone());
            }
            Event::SessionError { error, .. } if classify(error) == ErrorClass::Provider => {
                self.note_provider_error(None, error, now, &mut out);
            }
            _ => {}
        }
        self.report_recovered(now, &mut out);
        self.person_edge(waited_on, now, &mut out);
        out
    }

    fn on_status(&mut self, status: &Status, now: Now, out: &mut Vec<Effect>) {
        match status {
            Status::Busy => {
                if self.busy != RunState::Busy {
                    self.busy = RunState::Busy;
                    self.activity(now);
                    if let Some(d) = self.followup.on_busy() {
                        out.extend(self.decision_effects(d, now));
                    }
                }
            }
            Status::Retry { .. } => {
                self.busy = RunState::Retry;
                self.activity(now);
            }
            Status::Idle => {
                if self.busy != RunState::Idle {
                    let ours = self.recovering.is_some();
                    self.busy = RunState::Idle;
                    // OpenCode's own compaction ends with the turn (also when our abort
                    // ended it: its bound must not outlive it into the next turn).
                    self.compacting = None;
                    // Paused: no hand-off starts (it waits for the person to write).
                    let mut step = if ours || self.pause.is_some() { None } else { self.rollover.on_idle() };
                    let note = step.take_if(|s| matches!(s, Step::SoftNote { .. }));
                    if let Some(start) = step {
                        // The hand-off goes first: no compaction, nudge or review now.
                        out.extend(self.on_rollover_step(start, now));
                    } else {
                        if !ours && !self.compaction_in_flight && !self.rollover.suspends_automation() {
                            out.extend(self.consider_compaction(now));
                        }
                        // A compaction starting now makes the soft note moot (and a note
                        // stored during it would make OpenCode run a turn to answer it).
                        // Nor is a note for a paused session.
                        if let Some(note) = note.filter(|_| !self.compaction_in_flight && self.pause.is_none()) {
                            out.extend(self.on_rollover_step(note, now));
                        }
                        self.followup.on_idle_edge(now.mono, &self.todos, ours, &self.cfg.nudge, &self.cfg.review);
                        if !ours {
                            out.extend(self.on_turn_ended(now));
                        }
                    }
                }
                self.busy = RunState::Idle;
                // Emptied by replacing, not `clear()`: an idle session keeps no
                // capacity (it is most of the fleet, most of the time).
                self.running_tools = HashMap::new();
                self.waiting_on_person = HashSet::new();
                self.backoff_until = None;
            }
        }
    }

    fn on_message(&mut self, m: &MessageInfo, now: Now, out: &mut Vec<Effect>) {
        let new_message = self.messages.role(message_key(&m.id)).is_none();
        self.remember_role(&m.id, m.role);
        match m.role {
            Role::User => {
                if new_message {
                    self.planning.on_user_turn(m.agent.as_deref());
                }
                // A user message's `message.updated` repeats after idle (diff summary):
                // not activity. Its agent/model is what our prompts must repeat.
                if m.agent.is_some() || m.model.is_some() {
                    self.turn = Some(TurnSettings { agent: m.agent.clone(), model: m.model.clone() });
                }
            }
            Role::Assistant => {
                if self.last_reply.message_id.as_deref() != Some(&m.id) {
                    self.last_reply = LastReply { message_id: Some(m.id.clone()), ..LastReply::default() };
                }
                self.last_reply.finish.clone_from(&m.finish);
                self.last_reply.error = m.error.as_ref().map(|e| e.name.clone());
                self.last_reply.error_text =
                    m.error.as_ref().and_then(|e| e.data.as_ref()).and_then(|d| d.message.clone());
                if m.model.is_some() && !m.summary && self.model != m.model {
                    self.model.clone_from(&m.model);
                    self.model_generation = self.model_generation.wrapping_add(1);
                }
                if let (Some(agent), false) = (&m.agent, m.summary) {
                    self.planning.on_agent(agent);
                }
                if let Some(err) = &m.error {
                    self.learn_from_overflow(err);
                    if classify(err) == ErrorClass::Provider {
                        self.note_provider_error(Some(m.id.clone()), err, now, out);
                    }
                }
                if m.finish.as_deref() == Some("unknown") && m.tokens.is_some_and(|t| t.output == 0) {
                    out.extend(self.on_empty_finish(&m.id, now));
                }
                if m.summary {
                    if m.time.completed.is_none() && m.error.is_none() {
                        self.compacting.get_or_insert(now.mono);
                    } else {
                        self.compacting = None;
                    }
                } else if m.finish.is_some() && m.error.is_none() {
                    if let Some(size) = m.tokens.map(|t| t.prompt_size()).filter(|s| *s > 0) {
                        let new_reading = self.context_tokens != Some(size);
                        self.context_tokens = Some(size);
                        if new_reading {
                            out.extend(self.on_context_reading(now));
                        }
                    }
                }
                self.last_assistant = Some(m.id.clone());
                if let Some(err) = &m.error {
                    if err.is_abort() {
                        self.on_abort_seen(Some(&m.id), now, out);
                    }
                    return;
                }
                self.activity(now);
                if matches!(m.finish.as_deref(), Some("stop" | "length" | "tool-calls")) {
                    // The provider answered: the outage is over for this session (a
                    // person writing or a todo changing is no such evidence).
                    if let Some(o) = self.outage.as_mut() {
                        o.on_progress();
                    }
                }
                match m.finish.as_deref() {
                    Some("stop" | "length") => self.real_progress(now),
                    // A step of a spinning tool run is not progress.
                    Some("tool-calls") if !self.spin.is_spinning(self.cfg.loops.spin_count) => self.real_progress(now),
                    _ => {}
                }
            }
        }
    }

    fn on_part(&mut self, p: &Part, now: Now, out: &mut Vec<Effect>) {
        let msg = message_key(&p.message_id);
        if self.messages.is_own(msg) {
            return;
        }
        let users = matches!(p.kind, PartKind::Text { shepherd: Some(_), .. })
            || (matches!(p.kind, PartKind::Text { .. }) && self.messages.role(msg) == Some(Role::User));
        if !users {
            self.last_part = Some(part_type(&p.kind));
            self.advice.on_part(&p.kind);
        }
        match &p.kind {
            PartKind::Text { shepherd: Some(_), .. } => {
                // Ours (this instance or another): neither activity nor the person.
                self.messages.mark_own(msg);
            }
            PartKind::Text { synthetic, ignored, text, .. } if self.messages.role(msg) == Some(Role::User) => {
                self.activity(now);
                // OpenCode's notice that a background child ended: not an orphan.
                if let Some(family) = self.family.as_mut() {
                    family.on_parent_notice(text);
                }
                if !synthetic && !ignored {
                    self.on_real_user_message(now, out);
                }
            }
            PartKind::Text { text, .. } => {
                self.activity(now);
                self.planning.on_text(text);
                if self.last_reply.message_id.as_deref() == Some(&p.message_id) && !text.is_empty() {
                    // The verdict, not the text: a session keeps no reply text.
                    self.last_reply.text_asks = crate::session::question::asks_the_person(text);
                }
            }
            PartKind::Compaction => {
                self.activity(now);
                self.compacting.get_or_insert(now.mono);
            }
            PartKind::Tool { status, tool, child_session, input } => {
                self.activity(now);
                if matches!(status, ToolStatus::Running | ToolStatus::Completed) {
                    self.planning.on_tool(tool);
                }
                let spinning = match (status, input) {
                    (ToolStatus::Completed | ToolStatus::Error, Some(input)) => {
                        self.on_tool_call_finished(tool, *input, now, out)
                    }
                    _ => false,
                };
                if let Some(child) = child_session {
                    self.family().adopt(child);
                }
                if tool == "question" && self.last_reply.message_id.as_deref() == Some(&p.message_id) {
                    self.last_reply.used_question_tool = true;
                }
                match status {
                    ToolStatus::Running
                        if self.running_tools.len() < MAX_OPEN_PER_SESSION || self.running_tools.contains_key(&p.id) =>
                    {
                        self.running_tools.insert(p.id.clone(), tool.clone());
                    }
                    ToolStatus::Running => {}
                    ToolStatus::Completed => {
                        self.running_tools.remove(&p.id);
                        if !spinning {
                            self.real_progress(now);
                        }
                    }
                    ToolStatus::Error | ToolStatus::Pending => {
                        self.running_tools.remove(&p.id);
                    }
                }
            }
            _ => self.activity(now),
        }
    }

    fn on_real_user_message(&mut self, now: Now, out: &mut Vec<Effect>) {
        self.real_progress(now);
        self.rollover.on_person_wrote();
        self.followup.on_user_message(now.mono);
        if let Some(pause) = self.pause.filter(|p| p.lifted_by_the_person_writing()) {
            self.pause = None;
            self.touch();
            let reason = match pause {
                Pause::GaveUp => "the person wrote after Shepherd gave up",
                _ => "the person wrote after aborting",
            };
            out.push(self.record(Action::Resume, Outcome::Done, reason, Numbers::default(), now));
        }
    }

    /// A `MessageAbortedError`: ours if a recovery is under way, or it names the
    /// message our abort interrupted, or it trails a recovery that just ended.
    fn on_abort_seen(&mut self, message_id: Option<&str>, now: Now, out: &mut Vec<Effect>) {
        if self.recovering.is_some() || self.verify != Verify::Nothing {
            return; // ours: under way, or an abort whose answer was lost
        }
        if self.rollover.interrupted().is_some_and(|(_, abort_first)| abort_first) {
            return; // the hand-off under way aborted the turn itself
        }
        if let Some((ended, aborted)) = &self.recovery_ended {
            let trailing = now.mono.duration_since(*ended) <= self.cfg.recovery.abort_poll_max;
            let same_message = message_id.is_some() && message_id == aborted.as_deref();
            if trailing || same_message {
                return;
            }
        }
        if matches!(self.pause, Some(Pause::UserAbort | Pause::Person | Pause::Fleet)) {
            // The same abort seen twice (event + message error), or Shepherd is held
            // off anyway (the person's own hold stays what it is).
            return;
        }
        self.pause = Some(Pause::UserAbort);
        self.touch();
        self.backoff_until = None;
        out.push(self.record(
            Action::Pause,
            Outcome::Done,
            "aborted by someone else than Shepherd: automation paused until the person writes",
            Numbers::default(),
            now,
        ));
    }

    fn activity(&mut self, now: Now) {
        self.last_activity = now.mono;
        self.backoff_until = None;
        self.advice.on_activity();
    }

    fn real_progress(&mut self, now: Now) {
        self.progress_at = now.mono;
        if self.attempts != 0 || self.auto_submits != 0 {
            self.touch();
        }
        self.attempts = 0;
        self.auto_submits = 0;
        self.runaways = 0;
        self.continues.on_progress();
    }

    /// A tool call finished: is it part of a spinning run (same tool, same input, again
    /// and again)? Reported once per run; such calls are not progress.
    fn on_tool_call_finished(&mut self, tool: &str, input: u64, now: Now, out: &mut Vec<Effect>) -> bool {
        let loops = &self.cfg.loops;
        let (count, window) = (loops.spin_count, loops.spin_window);
        match self.spin.on_call(tool, input, now.mono, count, window) {
            SpinVerdict::Normal => false,
            SpinVerdict::StillSpinning => true,
            SpinVerdict::Spinning { repeats } => {
                let reason = format!(
                    "spinning tool: {tool} called {repeats} times in a row with the same input within \
                     loops.spin_window; not counted as progress"
                );
                let numbers = Numbers { round: Some(repeats), window_ms: Some(ms(window)), ..Numbers::default() };
                out.push(self.record(Action::SpinningTool, Outcome::Done, &reason, numbers, now));
                true
            }
        }
    }

    /// Whether the session is planning now (agent `plan`, or a plan announced).
    pub fn is_planning(&self) -> bool {
        self.planning.active()
    }

    fn remember_role(&mut self, message_id: &str, role: Role) {
        self.messages.set_role(message_key(message_id), role);
    }

    /// Called when [`SessionCore::deadline`] has passed: decides whether the session
    /// is stalled and what to do about it.
    pub fn on_deadline(&mut self, now: Now) -> Vec<Effect> {
        // A timed hold that ends now lets every other clock decide in this same moment.
        let mut out = self.on_hold_deadline(now);
        // First: while the ledger is read, the stall clock waits (see `stall_deadline`).
        if self.verify.at().is_some_and(|at| at <= now.mono) {
            self.verify = Verify::Finding;
            out.push(Effect::FindIntents);
        }
        if !self.blind {
            out.extend(self.on_watched_deadlines(now));
        }
        // The drain past `hard` ends in an abort: it waits while a person is asked or
        // automation is paused.
        if self.waiting_on_person.is_empty() && self.pause.is_none() {
            if let Some(step) = self.rollover.on_deadline(self.busy != RunState::Idle, now.mono) {
                out.extend(self.on_rollover_step(step, now));
            }
        }
        out
    }

    /// The deadlines of the clocks that measure the session's silence (none while blind).
    fn on_watched_deadlines(&mut self, now: Now) -> Vec<Effect> {
        let facts = Facts {
            idle: self.busy == RunState::Idle,
            pause: self.pause,
            busy_with_other_work: self.recovering.is_some()
                || self.is_compacting()
                || self.rollover.suspends_automation(),
            waiting_on_person: !self.waiting_on_person.is_empty(),
            last_reply: &self.last_reply,
            todos: &self.todos,
        };
        let decisions = self.followup.on_deadline(now.mono, &facts, &self.cfg.nudge, &self.cfg.review);
        let mut out: Vec<Effect> = decisions.into_iter().flat_map(|d| self.decision_effects(d, now)).collect();
        out.extend(self.on_orphan_deadline(now));
        out.extend(self.on_resume_deadline(now));
        out.extend(self.on_stall_deadline(now));
        out
    }

    /// A request failed in a way that may still have reached OpenCode: its intent stays
    /// open, and the session is read once the request had time to land
    /// (`recovery.abort_poll_max`), so it is neither lost nor sent twice.
    fn verify_later(&mut self, error: &EngineError, now: Now) {
        if crate::session::recovery::may_have_arrived(error) {
            self.verify = Verify::At(now.mono + self.cfg.recovery.abort_poll_max);
        }
    }

    /// Past `handoff.hard` (the hard gate: compact before any follow-up prompt).
    fn past_hard(&self) -> bool {
        self.cfg.compaction.enabled && self.context_share().is_some_and(|s| s >= self.cfg.handoff.hard)
    }

    /// Turns a follow-up decision into a prompt order or a record. The prompt waits
    /// behind a compaction past the hard threshold (the hard gate), or past
    /// `compaction.opportunistic` outside the cooldown (the session is idle anyway: a
    /// cheap moment to compact). Either way it is sent whatever the compaction gives, so
    /// the session is never stranded.
    fn decision_effects(&mut self, d: Decision, now: Now) -> Vec<Effect> {
        if let Some(ask) = self.advice_before_nudge(&d, now) {
            return vec![ask];
        }
        self.decision_effects_advised(d, now)
    }

    fn decision_effects_advised(&mut self, d: Decision, now: Now) -> Vec<Effect> {
        let mut effects = self.decision_effects_ungated(d, now);
        let back = match effects.as_mut_slice() {
            [Effect::Prompt(order)] => self.back_on_own_model(order, now),
            _ => None,
        };
        let gate = if self.compaction_in_flight {
            None
        } else if self.past_hard() {
            Some("past handoff.hard")
        } else if self.opportune_compaction(now) {
            Some("past compaction.opportunistic, idle")
        } else {
            None
        };
        let gated = match (gate, self.model.clone(), effects.as_slice()) {
            (Some(why), Some(model), [Effect::Prompt(order)]) => {
                self.held_prompt = Some(Box::new(order.clone()));
                self.compaction_in_flight = true;
                self.last_compaction = Some(now.mono);
                let reason = format!("{why}: compacting before the {}", order.kind.as_str());
                vec![Effect::Compact(CompactOrder { session_id: self.id.clone(), model, reason })]
            }
            _ => effects,
        };
        back.into_iter().chain(gated).collect()
    }

    /// Past `compaction.opportunistic` and outside the cooldown.
    fn opportune_compaction(&self, now: Now) -> bool {
        let cfg = &self.cfg.compaction;
        cfg.enabled
            && self.context_share().is_some_and(|s| s >= cfg.opportunistic)
            && self.last_compaction.is_none_or(|at| now.mono.duration_since(at) >= cfg.cooldown)
    }

    fn decision_effects_ungated(&self, d: Decision, now: Now) -> Vec<Effect> {
        match d {
            Decision::Send { kind, round } => {
                let template = match kind {
                    PromptKind::Review => self.cfg.review.message.clone(),
                    _ => self.cfg.nudge.message.clone(),
                };
                vec![Effect::Prompt(PromptOrder {
                    session_id: self.id.clone(),
                    directory: self.directory.clone(),
                    kind,
                    template,
                    template_without_open_todos: None,
                    facts: PromptFacts {
                        attempts: round,
                        max_attempts: self.max_rounds(kind),
                        context_summary: String::new(),
                    },
                    known_todos: self.todos.clone(),
                    known_turn: self.turn.clone(),
                    require_idle: true,
                    require_open_todos: kind == PromptKind::Nudge,
                    decision: format!("{}-{}-{}", self.id, kind.as_str(), now.wall_ms),
                    not_before_ms: None,
                    tool_text_scan: (kind == PromptKind::Nudge)
                        .then(|| ToolTextScan::from_config(&self.cfg.recovery))
                        .flatten(),
                    model: None,
                })]
            }
            Decision::Decline { kind, reason, round } => {
                let numbers = Numbers { round: Some(round), open_todos: Some(self.open_todos()), ..Numbers::default() };
                vec![self.record(action_of(kind), Outcome::Declined, &reason, numbers, now)]
            }
        }
    }

    fn max_rounds(&self, kind: PromptKind) -> u32 {
        match kind {
            PromptKind::Review => self.cfg.review.max_rounds,
            PromptKind::Nudge => self.cfg.nudge.max_without_progress,
            _ => self.cfg.recovery.max_auto_submits,
        }
    }

    fn open_todos(&self) -> u32 {
        self.todos.iter().filter(|t| t.status.is_open()).count() as u32
    }

    /// After a reconnect: this session was busy before, the server no longer says so,
    /// and its last assistant message was cut off mid-flight — OpenCode restarted under
    /// it. Continue it, once per interrupted message.
    pub fn on_interrupted(&mut self, message_id: &str, now: Now) -> Vec<Effect> {
        if self.interrupted_continued.as_deref() == Some(message_id) {
            return Vec::new();
        }
        if let Some(p) = self.pause {
            let reason = format!("interrupted by a server restart, but automation is paused ({})", p.as_str());
            return vec![self.record(Action::Recover, Outcome::Declined, &reason, Numbers::default(), now)];
        }
        self.interrupted_continued = Some(message_id.to_string());
        self.touch();
        let order = self.continue_when_idle("interrupted", now);
        vec![
            self.record(
                Action::Recover,
                Outcome::Done,
                "the turn was cut off by a server restart (no completion, no error): continuing it once",
                Numbers { open_todos: Some(self.open_todos()), ..Numbers::default() },
                now,
            ),
            Effect::Prompt(order),
        ]
    }

    /// A delivery (nudge, review or custom prompt) ended.
    pub fn on_prompt_finished(&mut self, order: &PromptOrder, delivery: &Delivery, now: Now) -> Vec<Effect> {
        let sent = matches!(delivery, Delivery::Sent { .. });
        let retry_after_ms = match delivery {
            Delivery::Guarded { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        };
        let delivered = match (sent, retry_after_ms) {
            (true, _) => Delivered::Sent,
            (false, Some(ms)) => Delivered::Deferred { retry_at: now.mono + Duration::from_millis(ms.max(1)) },
            (false, None) => Delivered::NotSent,
        };
        self.followup.on_delivered(order.kind, delivered);
        let resume = self.on_resume_delivered(order, delivery, now);
        if sent && order.kind == PromptKind::Continue && !resume {
            self.continues.on_continue(now.mono);
        }
        let (outcome, reason) = match delivery {
            Delivery::Sent { tool_call_as_text: Some(found), .. } => (
                Outcome::Done,
                format!(
                    "{} sent as the tool-call-as-text prompt: the model wrote {} as text ({})",
                    order.kind.as_str(),
                    found.pattern,
                    found.excerpt
                ),
            ),
            Delivery::Sent { waited_ms: 0, .. } => (Outcome::Done, format!("{} sent", order.kind.as_str())),
            Delivery::Sent { waited_ms, .. } => {
                (Outcome::Done, format!("{} sent (held {waited_ms} ms by the guard's rate limit)", order.kind.as_str()))
            }
            Delivery::Skipped { reason, .. } => (Outcome::Declined, (*reason).to_string()),
            Delivery::Guarded { reason, .. } => (Outcome::Declined, reason.clone()),
            Delivery::Failed { error } => {
                self.verify_later(error, now);
                (Outcome::Failed, format!("could not send: {error}"))
            }
        };
        let open = match delivery {
            Delivery::Sent { todos, .. } | Delivery::Skipped { todos, .. } | Delivery::Guarded { todos, .. } => {
                todos.iter().filter(|t| t.status.is_open()).count() as u32
            }
            Delivery::Failed { .. } => self.open_todos(),
        };
        let numbers = Numbers {
            round: Some(order.facts.attempts),
            open_todos: Some(open),
            backoff_ms: retry_after_ms,
            ..Numbers::default()
        };
        vec![self.record(action_of(order.kind), outcome, &reason, numbers, now)]
    }

    /// A person's or tool's prompt through the control API: the order to deliver.
    pub fn custom_order(&self, template: String, now: Now) -> PromptOrder {
        PromptOrder {
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            kind: PromptKind::Custom,
            template,
            template_without_open_todos: None,
            facts: PromptFacts {
                attempts: self.attempts,
                max_attempts: self.cfg.recovery.max_auto_submits,
                context_summary: self.context_summary(now),
            },
            known_todos: self.todos.clone(),
            known_turn: self.turn.clone(),
            require_idle: false,
            require_open_todos: false,
            decision: format!("{}-custom-{}", self.id, now.wall_ms),
            not_before_ms: None,
            tool_text_scan: None,
            model: None,
        }
    }

    /// A short account of the session's state, for `{contextSummary}`.
    pub fn context_summary(&self, now: Now) -> String {
        let state = match (self.busy, self.pause) {
            (_, Some(p)) => format!("paused ({})", p.as_str()),
            (RunState::Idle, None) => "idle".to_string(),
            (RunState::Busy, None) => "busy".to_string(),
            (RunState::Retry, None) => "retrying a model call".to_string(),
        };
        let quiet_s = now.mono.duration_since(self.last_activity).as_secs();
        format!(
            "Session is {state}; last activity {quiet_s}s ago; {} of {} todos open; {} recovery attempt(s) since the last progress.",
            self.open_todos(),
            self.todos.len(),
            self.attempts
        )
    }

    fn on_stall_deadline(&mut self, now: Now) -> Vec<Effect> {
        let Some(deadline) = self.stall_deadline() else { return Vec::new() };
        if now.mono < deadline {
            return Vec::new();
        }
        let cfg = Arc::clone(&self.cfg);
        let idle_for = now.mono.saturating_duration_since(self.silent_since());
        // OpenCode's own compaction past its bound, measured from when it was first seen.
        let compacting_for = self.compacting.map(|since| now.mono.saturating_duration_since(since));
        let base = Numbers {
            idle_for_ms: Some(ms(idle_for)),
            timeout_ms: Some(ms(if compacting_for.is_some() { cfg.compaction.max_wait } else { self.stall_timeout() })),
            compacting_for_ms: compacting_for.map(ms),
            running_tools: Some(self.running_tools.len() as u32),
            attempt: Some(self.attempts + 1),
            max_attempts: Some(cfg.recovery.max_auto_submits),
            auto_submits: Some(self.auto_submits),
            last_part: self.last_part.clone(),
            ..Numbers::default()
        };

        let (count, window) = (cfg.recovery.repeated_continue_count, cfg.recovery.repeated_continue_window);
        if let Some(continues) = self.continues.escalation_due(now.mono, count, window) {
            // The escalation aborts too: it is asked about like any recovery's abort.
            if let Some(ask) = self.advice_before_abort(now) {
                return vec![ask];
            }
            return self.escalate(continues, base, now);
        }
        if self.attempts >= cfg.recovery.max_recoveries && self.backoff_until.is_none() {
            let exp = (self.attempts - cfg.recovery.max_recoveries).min(20);
            let backoff = cfg.recovery.cooldown.saturating_mul(1u32 << exp).min(cfg.recovery.max_backoff);
            self.backoff_until = Some(now.mono + backoff);
            let numbers = Numbers { backoff_ms: Some(ms(backoff)), ..base };
            return vec![self.record(
                Action::Backoff,
                Outcome::Done,
                "stalled again after max_recoveries recoveries: backing off before the next",
                numbers,
                now,
            )];
        }
        // Abandoned: no real progress for `max_session_age` (not how long ago it was
        // created: an agent that works for hours and then stalls is recovered). A time
        // Shepherd could not see the session counts as unknown, not as no progress.
        let without_progress = now.mono.saturating_duration_since(self.watched_since(self.progress_at));
        if without_progress > cfg.recovery.max_session_age {
            self.pause = Some(Pause::GaveUp);
            self.touch();
            let numbers = Numbers {
                without_progress_ms: Some(ms(without_progress)),
                age_ms: self.created_ms.map(|c| now.wall_ms.saturating_sub(c).max(0) as u64),
                ..base
            };
            return vec![self.record(
                Action::GiveUp,
                Outcome::Done,
                "stalled with no real progress for longer than max_session_age (abandoned): not recovering",
                numbers,
                now,
            )];
        }
        if self.auto_submits >= cfg.recovery.max_auto_submits {
            self.pause = Some(Pause::GaveUp);
            self.touch();
            return vec![self.record(
                Action::GiveUp,
                Outcome::Done,
                "stalled again after max_auto_submits continues without progress",
                base,
                now,
            )];
        }

        if let Some(ask) = self.advice_before_abort(now) {
            return vec![ask];
        }
        self.attempts += 1;
        self.auto_submits += 1;
        self.touch();
        self.backoff_until = None;
        self.recovering = Some(Recovering { aborted_message: self.last_assistant.clone(), escalation: None });
        let reason = if self.compacting.is_some() {
            "OpenCode's compaction ran past compaction.max_wait (counted from when it was first seen): treating it as a stall"
        } else if self.waits_on_idle_children() {
            "busy on a subagent task while every subagent is idle, for orphan_wait: the parent is orphaned"
        } else if self.running_tools.is_empty() && self.planning.active() {
            "planning with no progress for recovery.planning_timeout"
        } else if self.running_tools.is_empty() {
            "busy with no progress for the stall timeout"
        } else {
            "busy with a running tool and no progress for the stall timeout × tool_grace_factor"
        };
        vec![
            self.record(Action::StallDetected, Outcome::Done, reason, base, now),
            Effect::Recover(RecoveryOrder {
                compact_first: self
                    .past_hard()
                    .then(|| self.model.clone().map(|m| (m, self.cfg.compaction.max_wait)))
                    .flatten(),
                ..self.recovery_order(self.attempts, None, now)
            }),
        ]
    }

    /// `repeated_continue_count` continues within the window did not bring progress:
    /// instead of another, hand the work to a fresh session (hand-off enabled), or abort
    /// and compact, then continue the compacted session. When neither is possible the
    /// escalation is declined (recorded) and the stall is handled as usual at the next
    /// deadline, which is already due.
    fn escalate(&mut self, continues: u32, base: Numbers, now: Now) -> Vec<Effect> {
        self.continues.mark_escalated();
        let window = self.cfg.recovery.repeated_continue_window;
        let numbers = Numbers { round: Some(continues), window_ms: Some(ms(window)), ..base.clone() };
        // A fresh session is the stronger remedy: hand off when hand-off is enabled (the
        // hand-off aborts the stalled turn itself), else compact.
        if self.cfg.handoff.enabled {
            let reason = format!(
                "{continues} continues within recovery.repeated_continue_window without progress: another will \
                 not help; escalating ({})",
                Escalation::HandOff.as_str()
            );
            let why = format!("{continues} continues without progress (escalation)");
            if let Some(step) = self.rollover.request(true, &why) {
                let mut out = vec![
                    self.record(
                        Action::StallDetected,
                        Outcome::Done,
                        "stalled again after repeated continues",
                        base,
                        now,
                    ),
                    self.record(Action::Escalate, Outcome::Done, &reason, numbers, now),
                ];
                out.extend(self.on_rollover_step(step, now));
                return out;
            }
        }
        let escalation = Escalation::Compact;
        let model = match (self.cfg.compaction.enabled, self.model.clone()) {
            (true, Some(model)) => model,
            (enabled, _) => {
                let why = if enabled { "the session's model is not known yet" } else { "compaction is disabled" };
                let reason = format!(
                    "{continues} continues within recovery.repeated_continue_window without progress, but no \
                     escalation is possible ({why}; hand-off not available): recovering as usual"
                );
                return vec![self.record(Action::Escalate, Outcome::Declined, &reason, numbers, now)];
            }
        };
        self.attempts += 1;
        self.auto_submits += 1;
        self.touch();
        self.backoff_until = None;
        self.recovering =
            Some(Recovering { aborted_message: self.last_assistant.clone(), escalation: Some(escalation) });
        let reason = format!(
            "{continues} continues within recovery.repeated_continue_window without progress: another will \
             not help; escalating ({}: abort, compact, then continue)",
            escalation.as_str()
        );
        vec![
            self.record(Action::StallDetected, Outcome::Done, "stalled again after repeated continues", base, now),
            self.record(Action::Escalate, Outcome::Done, &reason, numbers, now),
            Effect::Recover(RecoveryOrder {
                compact_first: Some((model, self.cfg.compaction.max_wait)),
                escalation: Some(escalation),
                ..self.recovery_order(self.attempts, Some("escalate"), now)
            }),
        ]
    }

    /// The abort + continue order every recovery starts from: this session, the given
    /// attempt, what the core knows of its todos and turn, a decision id (`tag` names the
    /// kind when it is not a plain stall), an abort followed by its continue.
    fn recovery_order(&self, attempt: u32, tag: Option<&str>, now: Now) -> RecoveryOrder {
        let decision = match tag {
            Some(tag) => format!("{}-{tag}-{}", self.id, now.wall_ms),
            None => format!("{}-{}", self.id, now.wall_ms),
        };
        RecoveryOrder {
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            attempt,
            known_todos: self.todos.clone(),
            known_turn: self.turn.clone(),
            decision,
            decided_ms: now.wall_ms,
            compact_first: None,
            continue_after: true,
            planning: self.planning.active(),
            escalation: None,
        }
    }

    /// Feeds the recovery procedure's result in.
    pub fn on_recovery_finished(&mut self, report: &RecoveryReport, now: Now) -> Vec<Effect> {
        let (aborted, escalation) = match self.recovering.take() {
            Some(r) => (r.aborted_message, r.escalation),
            None => (None, None),
        };
        let numbers = Numbers {
            attempt: Some(self.attempts),
            max_attempts: Some(self.cfg.recovery.max_auto_submits),
            ..Numbers::default()
        };
        let mut out = Vec::new();
        match report {
            RecoveryReport::NotBusy
            | RecoveryReport::StatusUnavailable(_)
            | RecoveryReport::AbortFailed(_)
            | RecoveryReport::NotOurs(_)
            | RecoveryReport::Cancelled => {
                // Nothing reached the session: the attempt does not count.
                self.attempts = self.attempts.saturating_sub(1);
                self.auto_submits = self.auto_submits.saturating_sub(1);
                self.touch();
                self.activity(now);
                let (outcome, reason) = match report {
                    RecoveryReport::NotBusy if self.blind => {
                        // A server that restarted lists nothing: while the stream is down
                        // the reconciliation, not this answer, says how the turn ended.
                        (Outcome::Declined, "the status endpoint says the session is not busy, but the event stream is down: the reconciliation will tell".to_string())
                    }
                    RecoveryReport::NotBusy => {
                        // The turn ended unseen: what it ran or waited on ended with it
                        // (as at an idle event), or a stale request would hold the stall
                        // clock off through the next turn.
                        self.busy = RunState::Idle;
                        self.running_tools = HashMap::new();
                        self.waiting_on_person = HashSet::new();
                        (Outcome::Declined, "the status endpoint says the session is no longer busy".to_string())
                    }
                    RecoveryReport::StatusUnavailable(e) => {
                        (Outcome::Failed, format!("could not confirm the session is busy ({e}); not aborting"))
                    }
                    RecoveryReport::AbortFailed(e) => {
                        self.verify_later(e, now);
                        (Outcome::Failed, format!("abort request failed: {e}"))
                    }
                    RecoveryReport::NotOurs(holder) => {
                        // Its abort is about to arrive: not the person's.
                        self.recovery_ended = Some((now.mono, aborted.clone()));
                        (Outcome::Declined, format!("another Shepherd instance ({holder}) acts for this session"))
                    }
                    _ => (Outcome::Declined, "shutting down: nothing was sent".to_string()),
                };
                out.push(self.record(Action::Recover, outcome, &reason, numbers, now));
            }
            RecoveryReport::Continued { idle_after_ms, open_todos, compacted, tool_call_as_text, waited_ms } => {
                self.recovery_ended = Some((now.mono, aborted));
                self.continues.on_continue(now.mono);
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                let abort_reason = match idle_after_ms {
                    Some(_) => "stalled session aborted; it went idle",
                    None => "stalled session aborted; still busy after abort_poll_max, continuing anyway",
                };
                out.push(self.record(Action::Abort, Outcome::Done, abort_reason, abort_numbers, now));
                if let Some(result) = compacted {
                    let n = Numbers {
                        context_tokens: self.context_tokens,
                        context_window: self.window,
                        ..Numbers::default()
                    };
                    let why = match escalation {
                        Some(_) => "escalation of repeated continues",
                        None => "past handoff.hard",
                    };
                    out.push(match result {
                        Ok(()) => {
                            self.context_tokens = None;
                            let reason = format!("{why}: compacted before the continue");
                            self.record(Action::Compact, Outcome::Done, &reason, n, now)
                        }
                        Err(e) => {
                            let reason =
                                format!("{why}: compaction before the continue failed ({e}); continuing anyway");
                            self.record(Action::Compact, Outcome::Failed, &reason, n, now)
                        }
                    });
                }
                let numbers = Numbers { open_todos: Some(*open_todos), ..numbers };
                let held = match waited_ms {
                    0 => String::new(),
                    ms => format!(" (held {ms} ms by the guard's rate limit)"),
                };
                let reason = match tool_call_as_text {
                    Some(found) => format!(
                        "tool-call-as-text prompt sent after the abort: the model wrote {} as text ({}){held}",
                        found.pattern, found.excerpt
                    ),
                    None => format!("continue sent after the abort{held}"),
                };
                out.push(self.record(Action::Continue, Outcome::Done, &reason, numbers, now));
            }
            RecoveryReport::AbortedOnly { idle_after_ms } => {
                self.recovery_ended = Some((now.mono, aborted));
                let numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers };
                out.push(self.record(
                    Action::Abort,
                    Outcome::Done,
                    "aborted; no continue (automation stopped for this session)",
                    numbers,
                    now,
                ));
            }
            RecoveryReport::ContinueDeclined { idle_after_ms, reason } => {
                self.recovery_ended = Some((now.mono, aborted));
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                out.push(self.record(Action::Abort, Outcome::Done, "stalled session aborted", abort_numbers, now));
                out.push(self.record(Action::Continue, Outcome::Declined, reason, numbers, now));
            }
            RecoveryReport::ContinueFailed { idle_after_ms, error } => {
                self.verify_later(error, now);
                self.recovery_ended = Some((now.mono, aborted));
                self.activity(now);
                let abort_numbers = Numbers { abort_to_idle_ms: *idle_after_ms, ..numbers.clone() };
                out.push(self.record(Action::Abort, Outcome::Done, "stalled session aborted", abort_numbers, now));
                let reason = format!("abort sent but the continue was not: {error}");
                out.push(self.record(Action::Continue, Outcome::Failed, &reason, numbers, now));
            }
        }
        out
    }

    // ── Intents left open by a crash ──────────────────────────────────────────

    /// The ledger could not say which intents are open: look again later (the stall
    /// clock keeps waiting for the verification meanwhile).
    pub fn on_intents_unreadable(&mut self, now: Now) {
        if self.verify == Verify::Finding {
            self.verify = Verify::At(now.mono + self.cfg.recovery.abort_poll_max);
        }
    }

    /// Open intents of this session found in the ledger (at start, after a reconnect):
    /// each is resumed once — the session is read and only what is missing is done.
    /// While a recovery's intent is resumed the session counts as recovering: the
    /// abort's own events are ours, and no second recovery starts.
    pub fn on_open_intents(&mut self, intents: Vec<Intent>, now: Now) -> Vec<Effect> {
        if self.verify == Verify::Finding {
            self.verify = Verify::Nothing; // what is open is handed over below
        }
        let mut out = Vec::new();
        for intent in intents {
            let resuming = self.resuming.iter().any(|d| crate::session::unfinished::same_action(d, &intent.decision));
            if intent.session != self.id || resuming {
                continue;
            }
            let prompt = self.resume_prompt(&intent, now);
            if intent.kind == IntentKind::Recover && self.recovering.is_none() {
                self.recovering = Some(Recovering { aborted_message: None, escalation: None });
            }
            self.resuming.push(intent.decision.clone());
            out.push(Effect::Finish(FinishOrder { intent, prompt, messages: self.cfg.recovery.verify_messages }));
        }
        out
    }

    /// The prompt an open intent sends if the session shows it is missing: built from
    /// what the core knows now, under the intent's decision id (so it is recognised,
    /// and a second crash is resolved the same way).
    fn resume_prompt(&self, intent: &Intent, now: Now) -> Option<PromptOrder> {
        let mut order = match intent.kind {
            IntentKind::Recover => {
                let recovery = RecoveryOrder { attempt: intent.attempt, ..self.recovery_order(intent.attempt, None, now) };
                crate::session::recovery::continue_order(&self.cfg.recovery, &recovery, self.directory.clone())
            }
            IntentKind::Continue => self.continue_when_idle("resume", now),
            IntentKind::Nudge | IntentKind::Review => {
                let kind = if intent.kind == IntentKind::Nudge { PromptKind::Nudge } else { PromptKind::Review };
                match self.decision_effects_ungated(Decision::Send { kind, round: intent.attempt }, now).pop() {
                    Some(Effect::Prompt(order)) => order,
                    _ => return None,
                }
            }
            IntentKind::Custom => return None,
        };
        order.decision.clone_from(&intent.decision);
        order.not_before_ms = Some(intent.started_ms);
        Some(order)
    }

    /// A resumed intent finished: one record saying what the session showed and what
    /// was done about it.
    pub fn on_unfinished_done(&mut self, order: &FinishOrder, report: &FinishReport, now: Now) -> Vec<Effect> {
        let intent = &order.intent;
        self.resuming.retain(|d| *d != intent.decision);
        if intent.kind == IntentKind::Recover {
            self.recovering = None;
            // The abort's trailing events are still ours.
            self.recovery_ended = Some((now.mono, None));
            self.activity(now);
        }
        let action = match intent.kind {
            IntentKind::Recover | IntentKind::Continue => Action::Continue,
            IntentKind::Nudge => Action::Nudge,
            IntentKind::Review => Action::Review,
            IntentKind::Custom => Action::Prompt,
        };
        let what = intent.kind.as_str();
        let step = intent.step.as_str();
        let (outcome, reason) = match report {
            FinishReport::Delivered => (
                Outcome::Done,
                format!("unfinished {what} (step {step}): it is in the session already; not sent again"),
            ),
            FinishReport::Sent(delivery) => {
                let sent = matches!(delivery, Delivery::Sent { .. });
                match intent.kind {
                    IntentKind::Recover | IntentKind::Continue if sent => self.continues.on_continue(now.mono),
                    IntentKind::Nudge | IntentKind::Review => {
                        let kind = if intent.kind == IntentKind::Nudge { PromptKind::Nudge } else { PromptKind::Review };
                        let delivered = if sent { Delivered::Sent } else { Delivered::NotSent };
                        self.followup.on_delivered(kind, delivered);
                    }
                    _ => {}
                }
                match delivery {
                    Delivery::Sent { .. } => (
                        Outcome::Done,
                        format!("unfinished {what} (step {step}): it had not reached the session; sent it once"),
                    ),
                    Delivery::Skipped { reason, .. } => {
                        (Outcome::Declined, format!("unfinished {what} (step {step}): not sent: {reason}"))
                    }
                    Delivery::Guarded { reason, .. } => {
                        (Outcome::Declined, format!("unfinished {what} (step {step}): not sent: {reason}"))
                    }
                    Delivery::Failed { error } => {
                        (Outcome::Failed, format!("unfinished {what} (step {step}): could not be sent: {error}"))
                    }
                }
            }
            FinishReport::Moot(why) => (Outcome::Declined, format!("unfinished {what} (step {step}): moot, {why}")),
            FinishReport::Gone => (Outcome::Declined, format!("unfinished {what} (step {step}): moot, the session is gone")),
            FinishReport::NotOurs(holder) => (
                Outcome::Declined,
                format!("unfinished {what} (step {step}): left to another Shepherd instance ({holder})"),
            ),
            FinishReport::Unreadable(e) => (
                Outcome::Failed,
                format!("unfinished {what} (step {step}): could not read the session ({e}); kept for the next start or reconnect"),
            ),
        };
        let numbers = Numbers { attempt: Some(intent.attempt), open_todos: Some(self.open_todos()), ..Numbers::default() };
        vec![self.record(action, outcome, &reason, numbers, now)]
    }

    // ── Hand-off ────────────────────────────────────────────────────────────────

    /// Where the session's hand-off stands (status, control API).
    pub fn handoff(&self) -> &Rollover {
        &self.rollover
    }

    /// A new context reading: the hand-off thresholds may have been crossed.
    fn on_context_reading(&mut self, now: Now) -> Vec<Effect> {
        let Some(share) = self.context_share() else { return Vec::new() };
        if self.pause.is_some() {
            return Vec::new();
        }
        let busy = self.busy != RunState::Idle;
        let steps = self.rollover.on_reading(share, busy, &self.cfg.handoff, now.mono);
        steps.into_iter().flat_map(|step| self.on_rollover_step(step, now)).collect()
    }

    fn context_numbers(&self) -> Numbers {
        Numbers { context_tokens: self.context_tokens, context_window: self.window, ..Numbers::default() }
    }

    fn on_rollover_step(&mut self, step: Step, now: Now) -> Vec<Effect> {
        match step {
            Step::SoftNote { share } => {
                let percent = format!("{:.0}", share * 100.0);
                let mut order = self.continue_when_idle("handoff-soft", now);
                order.kind = PromptKind::Note;
                order.template = self.cfg.handoff.soft_message.replace("{percent}", &percent);
                order.template_without_open_todos = None;
                order.require_idle = true;
                order.tool_text_scan = None; // a note, not a continue
                let numbers = Numbers { phase: Some(Phase::Preparing.as_str().into()), ..self.context_numbers() };
                vec![
                    self.record(
                        Action::Handoff,
                        Outcome::Done,
                        "past handoff.soft: a note asks the model to keep its todos current",
                        numbers,
                        now,
                    ),
                    Effect::Prompt(order),
                ]
            }
            Step::Entered { phase, reason } => {
                let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
                vec![self.record(Action::Handoff, Outcome::Done, &reason, numbers, now)]
            }
            Step::LoopGuard { share } => {
                let reason = format!(
                    "this session was created by a hand-off and its first reading is already {:.0}% of the window, past handoff.soft: \
                     the limits are below a fresh session's size, so it is not handed off again",
                    share * 100.0
                );
                let numbers = Numbers { phase: Some(Phase::Failed.as_str().into()), ..self.context_numbers() };
                vec![self.record(Action::Handoff, Outcome::Declined, &reason, numbers, now)]
            }
            Step::Start { abort_first, reason } => {
                let id = format!("hf_{}_{}", self.id.trim_start_matches("ses_"), now.wall_ms);
                let mode = self.cfg.handoff.mode;
                self.start_handoff(id, mode, Phase::Persisting, abort_first, &reason, now)
            }
        }
    }

    fn start_handoff(
        &mut self,
        id: String,
        mode: crate::config::HandoffMode,
        phase: Phase,
        abort_first: bool,
        reason: &str,
        now: Now,
    ) -> Vec<Effect> {
        self.rollover.begin(id, mode, phase, abort_first, reason, now.wall_ms);
        self.held_prompt = None;
        let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
        let why = format!("hand-off ({}) starts: {reason}", mode.as_str());
        vec![
            self.record(Action::Handoff, Outcome::Done, &why, numbers, now),
            Effect::HandOff(self.handoff_order(phase)),
        ]
    }

    fn handoff_order(&self, step: Phase) -> HandoffOrder {
        HandoffOrder {
            id: self.rollover.id().unwrap_or_default().to_string(),
            server: self.server.to_string(),
            session_id: self.id.clone(),
            directory: self.directory.clone(),
            mode: self.rollover.mode().unwrap_or(self.cfg.handoff.mode),
            step,
            abort_first: step == Phase::Persisting && self.rollover.interrupted().is_some_and(|(_, a)| a),
            known_todos: self.todos.clone(),
            known_turn: self.turn.clone(),
            children: self.family.as_ref().map(|f| f.children().cloned().collect()).unwrap_or_default(),
            context: (self.context_tokens, self.window),
            target: self.rollover.new_session().map(str::to_string),
        }
    }

    /// A person asked for a hand-off now (`shepherd handoff SESSION`).
    pub fn request_handoff(&mut self, now: Now) -> Result<Vec<Effect>, String> {
        if self.rollover.suspends_automation() && self.rollover.phase().is_running() {
            return Err(format!("a hand-off is already under way ({})", self.rollover.phase().as_str()));
        }
        let busy = self.busy != RunState::Idle;
        let step = self
            .rollover
            .request(busy, "requested through the control API")
            .ok_or("a hand-off is already under way")?;
        Ok(self.on_rollover_step(step, now))
    }

    /// Restores a stored snapshot into a fresh session (`shepherd handoff --resume ID`).
    pub fn resume_snapshot(&mut self, id: &str, now: Now) -> Result<Vec<Effect>, String> {
        if self.rollover.phase().is_running() {
            return Err(format!("a hand-off is already under way ({})", self.rollover.phase().as_str()));
        }
        let mode = crate::config::HandoffMode::Fresh;
        Ok(self.start_handoff(id.to_string(), mode, Phase::HandingOver, false, "resuming a stored snapshot", now))
    }

    /// After a restart: a hand-off that was running goes on at the step it was in.
    pub fn resume_interrupted_handoff(&mut self, now: Now) -> Vec<Effect> {
        if self.rollover.interrupted().is_none() {
            return Vec::new();
        }
        let phase = self.rollover.phase();
        let numbers = Numbers { phase: Some(phase.as_str().into()), ..self.context_numbers() };
        vec![
            self.record(
                Action::Handoff,
                Outcome::Done,
                "resuming the hand-off that was under way when Shepherd stopped",
                numbers,
                now,
            ),
            Effect::HandOff(self.handoff_order(phase)),
        ]
    }

    /// One step of the hand-off procedure ended.
    pub fn on_handoff_step(&mut self, order: &HandoffOrder, report: &StepReport, now: Now) -> Vec<Effect> {
        if self.rollover.id() != Some(order.id.as_str()) {
            return Vec::new(); // a step of an older hand-off
        }
        let (next, reason, outcome) = match report {
            StepReport::Persisted { reused, readable, chars, model_account } => {
                let what = if *reused { "the stored snapshot is intact and reused" } else { "continuation persisted" };
                let file = readable.as_deref().map(|p| format!("; readable copy {p}")).unwrap_or_default();
                let account = if *model_account { "with" } else { "without" };
                let base = format!("{what} ({chars} characters, {account} the model's own account{file})");
                if order.mode == crate::config::HandoffMode::Manual {
                    let r = format!("{base}; mode manual: resume it with `shepherd handoff --resume {}`", order.id);
                    (Phase::AwaitingManual, r, Outcome::Done)
                } else {
                    (Phase::HandingOver, base, Outcome::Done)
                }
            }
            StepReport::HandedOver { target, created } => {
                self.rollover.advance(Phase::Resuming, Some(target), None);
                let how = if *created { "created" } else { "found" };
                (Phase::Resuming, format!("continuation delivered to {target} ({how})"), Outcome::Done)
            }
            StepReport::Resumed { target } => (
                Phase::Completed,
                format!("the work continues in {target}; this session is left untouched"),
                Outcome::Done,
            ),
            StepReport::Failed { step, error } => (
                Phase::Failed,
                format!("hand-off failed while {}: {error}; the session goes on as before", step.as_str()),
                Outcome::Failed,
            ),
        };
        self.rollover.advance(next, None, Some(&reason));
        let numbers = Numbers { phase: Some(next.as_str().into()), ..self.context_numbers() };
        let mut out = vec![self.record(Action::Handoff, outcome, &reason, numbers, now)];
        self.rollover.rearm_after_compact_mode();
        if next.is_running() {
            out.push(Effect::HandOff(self.handoff_order(next)));
        } else if next == Phase::Failed && self.busy == RunState::Idle {
            // Follow-ups held back during the hand-off get their turn now.
            self.followup.on_idle_edge(now.mono, &self.todos, false, &self.cfg.nudge, &self.cfg.review);
        }
        out
    }

    fn record(&self, action: Action, outcome: Outcome, reason: &str, numbers: Numbers, now: Now) -> Effect {
        Effect::Record(ActionRecord {
            server: self.server.to_string(),
            session: self.id.clone(),
            action,
            outcome,
            reason: reason.to_string(),
            numbers,
            at_ms: now.wall_ms,
        })
    }
}

/// The type of a part as the statistics name it (`tool:NAME` for tools).
fn part_type(kind: &PartKind) -> String {
    match kind {
        PartKind::Text { .. } => "text".to_string(),
        PartKind::Reasoning => "reasoning".to_string(),
        PartKind::Tool { tool, .. } => format!("tool:{tool}"),
        PartKind::StepStart => "step-start".to_string(),
        PartKind::StepFinish => "step-finish".to_string(),
        PartKind::Compaction => "compaction".to_string(),
        PartKind::Other(other) => other.clone(),
    }
}

/// A message id as a 64-bit hash: the role memory needs identity, not the text.
/// Role and "ours" flag of the last [`ROLE_MEMORY`] messages, in one ring of words:
/// each is a message's [`message_key`] with its low three bits replaced by the flags
/// (61 bits of hash: collisions among 32 ids are out of the question). 256 bytes when
/// full, searched linearly (32 words: cheaper than hashing again).
#[derive(Debug, Default)]
struct MessageMemory {
    slots: Vec<u64>,
    /// The oldest slot, overwritten next once the ring is full.
    next: usize,
}

impl MessageMemory {
    const FLAGS: u64 = 0b111;
    const USER: u64 = 0b001;
    const ASSISTANT: u64 = 0b010;
    const OWN: u64 = 0b100;

    fn find(&self, key: u64) -> Option<usize> {
        self.slots.iter().position(|s| s & !Self::FLAGS == key & !Self::FLAGS)
    }

    /// Sets `flags` on the message (remembering it, the oldest forgotten if full).
    fn set(&mut self, key: u64, flags: u64, keep: u64) {
        match self.find(key) {
            Some(i) => self.slots[i] = (self.slots[i] & keep) | flags,
            None => {
                let slot = (key & !Self::FLAGS) | flags;
                if self.slots.len() < ROLE_MEMORY {
                    if self.slots.capacity() == 0 {
                        // Once, to the ring's full size (`reserve_exact` counts from the
                        // length: calling it on every push reallocated up to 63 words).
                        self.slots.reserve_exact(ROLE_MEMORY);
                    }
                    self.slots.push(slot);
                } else {
                    self.slots[self.next] = slot;
                    self.next = (self.next + 1) % ROLE_MEMORY;
                }
            }
        }
    }

    fn set_role(&mut self, key: u64, role: Role) {
        let flag = match role {
            Role::User => Self::USER,
            Role::Assistant => Self::ASSISTANT,
        };
        self.set(key, flag, !(Self::USER | Self::ASSISTANT));
    }

    fn mark_own(&mut self, key: u64) {
        self.set(key, Self::OWN, u64::MAX);
    }

    fn role(&self, key: u64) -> Option<Role> {
        let slot = self.slots[self.find(key)?];
        match slot & (Self::USER | Self::ASSISTANT) {
            Self::USER => Some(Role::User),
            Self::ASSISTANT => Some(Role::Assistant),
            _ => None,
        }
    }

    fn is_own(&self, key: u64) -> bool {
        self.find(key).is_some_and(|i| self.slots[i] & Self::OWN != 0)
    }
}

fn message_key(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

fn status_name(s: crate::event::TodoStatus) -> &'static str {
    use crate::event::TodoStatus::*;
    match s {
        Pending => "pending",
        InProgress => "in_progress",
        Completed => "completed",
        Cancelled => "cancelled",
    }
}

fn status_from_name(s: &str) -> Option<crate::event::TodoStatus> {
    serde_json::from_value(serde_json::Value::String(s.to_string())).ok()
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

mod advice;
mod hold;
mod person;
mod resume;

pub use hold::HoldScope;

#[cfg(test)]
mod tests {

    //! The core as a specification: events and moments in, effects out.
    use super::*;
    use crate::config::{CompactionConfig, NudgeConfig, RecoveryConfig};
    use crate::event::{decode, TodoStatus};
    use crate::journal::Action;

    #[test]
    fn the_message_ring_holds_its_last_32_messages_in_32_words() {
        let mut m = MessageMemory::default();
        for i in 0..40 {
            m.set_role(message_key(&format!("msg_{i}")), if i % 2 == 0 { Role::User } else { Role::Assistant });
        }
        assert_eq!(m.slots.capacity(), ROLE_MEMORY, "memory per session is a scale target");
        assert_eq!(m.role(message_key("msg_39")), Some(Role::Assistant));
        assert_eq!(m.role(message_key("msg_8")), Some(Role::User));
        assert_eq!(m.role(message_key("msg_7")), None, "the oldest are forgotten");
    }

    /// A core under test and its time origin; the intelligence tests use it too.
    pub(super) struct Bench {
        pub(super) core: SessionCore,
        pub(super) t0: Instant,
    }

    pub(super) const CREATED_MS: i64 = 1_000_000;

    /// `rules` without the advice hooks (on by default): these benches specify the
    /// rules beneath them; the hooks themselves are specified in `core/advice.rs`.
    pub(super) fn unadvised(mut rules: SessionRules) -> SessionRules {
        rules.advisor.enabled = false;
        rules
    }

    /// A core for session `ses_A` in `/p`, created at `CREATED_MS`, and its time origin:
    /// the one set-up every core test bench starts from.
    pub(super) fn test_core(rules: SessionRules) -> (SessionCore, Instant) {
        let t0 = Instant::now();
        let mut core = SessionCore::new("srv", "ses_A", Arc::new(rules), Now { mono: t0, wall_ms: CREATED_MS });
        core.hydrate(&SessionInfo {
            id: "ses_A".into(),
            parent_id: None,
            directory: Some("/p".into()),
            title: None,
            time: crate::event::Times { created: Some(CREATED_MS), ..Default::default() },
            metadata: None,
        });
        (core, t0)
    }

    impl Bench {
        fn new() -> Self {
            Self::with(RecoveryConfig::default())
        }
        fn with(cfg: RecoveryConfig) -> Self {
            Self::with_rules(unadvised(cfg.into()))
        }
        pub(super) fn with_rules(rules: SessionRules) -> Self {
            let (core, t0) = test_core(rules);
            Self { core, t0 }
        }
        pub(super) fn at(&self, secs: u64) -> Now {
            Now { mono: self.t0 + Duration::from_secs(secs), wall_ms: CREATED_MS + secs as i64 * 1000 }
        }
        pub(super) fn feed(&mut self, secs: u64, json: &str) -> Vec<Effect> {
            let event = decode(json).expect("test event decodes").event;
            let now = self.at(secs);
            self.core.observe(&event, now)
        }
        pub(super) fn busy(&mut self, secs: u64) {
            self.feed(secs, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        }
        pub(super) fn tick(&mut self, secs: u64) -> Vec<Effect> {
            let now = self.at(secs);
            self.core.on_deadline(now)
        }
        /// The recovery procedure reports: aborted, then continued.
        pub(super) fn recovered(&mut self, secs: u64) -> Vec<Effect> {
            let now = self.at(secs);
            self.core.on_recovery_finished(
                &RecoveryReport::Continued {
                    idle_after_ms: Some(20),
                    open_todos: 0,
                    compacted: None,
                    tool_call_as_text: None,
                    waited_ms: 0,
                },
                now,
            )
        }
    }

    fn actions(effects: &[Effect]) -> Vec<Action> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(r) => Some(r.action),
                _ => None,
            })
            .collect()
    }

    fn recovers(effects: &[Effect]) -> bool {
        effects.iter().any(|e| matches!(e, Effect::Recover(_)))
    }

    const DELTA: &str = r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_1","field":"text","delta":"x"}}"#;

    #[test]
    fn a_busy_session_silent_for_the_stall_timeout_is_recovered() {
        let mut b = Bench::new();
        b.busy(0);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(180)));
        assert!(b.tick(179).is_empty());
        let effects = b.tick(180);
        assert!(recovers(&effects));
        assert_eq!(actions(&effects), vec![Action::StallDetected]);
    }

    /// With `abort_poll_max` longer than the stall timeout, an abort whose answer was
    /// lost is verified before the session can be called stalled again: the verification
    /// and a second recovery would each send a continue for one stall.
    #[test]
    fn no_second_recovery_starts_while_a_lost_abort_is_being_verified() {
        let mut b = Bench::with(RecoveryConfig {
            stall_timeout: Duration::from_secs(60),
            abort_poll_max: Duration::from_secs(90),
            ..RecoveryConfig::default()
        });
        b.busy(0);
        assert!(recovers(&b.tick(60)));
        let lost = RecoveryReport::AbortFailed(EngineError::Unreachable("timed out".into()));
        b.core.on_recovery_finished(&lost, b.at(61));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(151)), "the verification comes first");
        assert!(!recovers(&b.tick(121)), "no recovery before the verification");
        let effects = b.tick(151);
        assert!(effects.iter().any(|e| matches!(e, Effect::FindIntents)));
        assert!(!recovers(&effects));
        assert_eq!(b.core.deadline(), None, "nothing until the ledger answers");
        // The intent was closed meanwhile (another path finished it): the stall clock runs again.
        assert!(b.core.on_open_intents(vec![], b.at(152)).is_empty());
        assert!(recovers(&b.tick(152)), "still stalled, recovered once the verification is over");
    }

    #[test]
    fn activity_pushes_the_stall_deadline_back() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(100, DELTA);
        assert!(b.tick(180).is_empty());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(280)));
    }

    #[test]
    fn repeated_busy_events_do_not_count_as_progress() {
        let mut b = Bench::new();
        b.busy(0);
        b.busy(100);
        assert!(recovers(&b.tick(180)));
    }

    #[test]
    fn a_running_tool_extends_the_timeout_by_the_grace_factor() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(0, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_T","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{"status":"running"}}}}"#);
        assert!(b.tick(180).is_empty());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(720)));
        assert!(recovers(&b.tick(720)));
    }

    /// A server that starts tools and never ends them grows no session without bound;
    /// the session still counts as running tools (the grace holds).
    #[test]
    fn running_tools_a_server_never_ends_are_remembered_up_to_a_bound() {
        let mut b = Bench::new();
        b.busy(0);
        for n in 0..(MAX_OPEN_PER_SESSION + 500) {
            b.feed(0, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"prt_T{n}","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{{"status":"running"}}}}}}}}"#));
        }
        assert_eq!(b.core.running_tools.len(), MAX_OPEN_PER_SESSION);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(720)), "still a running tool's grace");
        b.feed(1, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_T0","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{"status":"completed"}}}}"#);
        assert_eq!(b.core.running_tools.len(), MAX_OPEN_PER_SESSION - 1, "one that ends is forgotten");
    }

    #[test]
    fn a_pending_question_is_never_a_stall() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1, r#"{"type":"question.asked","properties":{"id":"que_1","sessionID":"ses_A","questions":[]}}"#);
        assert_eq!(b.core.deadline(), None);
        assert!(b.tick(10_000).is_empty());
        b.feed(
            20_000,
            r#"{"type":"question.replied","properties":{"sessionID":"ses_A","requestID":"que_1","answers":[["A"]]}}"#,
        );
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(20_180)));
    }

    #[test]
    fn the_stall_clock_runs_while_busy_and_stops_while_a_person_is_asked() {
        let mut b = Bench::new();
        assert_eq!(b.core.stall_clock(), None, "idle: no stall timer");
        b.busy(0);
        assert_eq!(b.core.stall_clock(), Some(Duration::from_secs(180)));
        assert_eq!(b.core.quiet_for(b.at(45)), Duration::from_secs(45));
        assert!(!b.core.waits_on_person());
        b.feed(50, r#"{"type":"question.asked","properties":{"id":"que_1","sessionID":"ses_A","questions":[]}}"#);
        assert_eq!(b.core.stall_clock(), None);
        assert!(b.core.waits_on_person());
        assert_eq!(b.core.quiet_for(b.at(60)), Duration::from_secs(10), "the question was activity");
    }

    #[test]
    fn the_title_follows_the_servers_description() {
        let mut b = Bench::new();
        assert_eq!(b.core.title(), None);
        b.feed(
            1,
            r#"{"type":"session.updated","properties":{"info":{"id":"ses_A","title":"Fix the parser","time":{}}}}"#,
        );
        assert_eq!(b.core.title(), Some("Fix the parser"));
        b.feed(2, r#"{"type":"session.updated","properties":{"info":{"id":"ses_A","title":"  ","time":{}}}}"#);
        assert_eq!(b.core.title(), Some("Fix the parser"), "a blank title changes nothing");
    }

    #[test]
    fn retry_is_opencodes_own_wait_and_not_a_stall() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"retry","attempt":1,"message":"x","next":5}}}"#);
        assert_eq!(b.core.deadline(), None);
    }

    #[test]
    fn our_own_abort_is_not_taken_for_a_user_abort() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(0, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_B","sessionID":"ses_A","role":"assistant","time":{"created":1}}}}"#);
        assert!(recovers(&b.tick(180)));
        // The abort's events arrive while the procedure runs…
        let during = b.feed(180, r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError","data":{"message":"Aborted"}}}}"#);
        assert!(during.is_empty());
        b.recovered(182);
        // …and the message's own error may trail it.
        let after = b.feed(182, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_B","sessionID":"ses_A","role":"assistant","error":{"name":"MessageAbortedError"},"time":{"created":1,"completed":2}}}}"#);
        assert!(after.is_empty());
        assert_eq!(b.core.pause(), None);
    }

    #[test]
    fn a_user_abort_pauses_until_a_real_user_message() {
        let mut b = Bench::new();
        b.busy(0);
        let effects = b.feed(
            5,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(actions(&effects), vec![Action::Pause]);
        b.feed(6, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
        // A synthetic prompt from some tool does not un-pause…
        b.feed(7, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed(7, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p1","messageID":"msg_S","sessionID":"ses_A","type":"text","text":"x","synthetic":true}}}"#);
        b.busy(7);
        assert_eq!(b.core.deadline(), None, "paused: no stall recovery");
        // …a real one does.
        b.feed(8, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        let effects = b.feed(8, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p2","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"go"}}}"#);
        assert_eq!(actions(&effects), vec![Action::Resume]);
        assert!(b.core.deadline().is_some());
    }

    #[test]
    fn shepherds_own_prompt_is_neither_user_activity_nor_progress() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(182);
        assert_eq!(b.core.attempts(), 1);
        b.feed(182, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_C","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed(182, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p3","messageID":"msg_C","sessionID":"ses_A","type":"text","text":"continue","synthetic":true,"metadata":{"shepherd":{"kind":"continue","instance":"i","decision":"d"}}}}}"#);
        b.busy(182);
        let effects = b.tick(182 + 180);
        assert!(recovers(&effects));
        assert_eq!(b.core.attempts(), 2, "our own continue did not reset the attempts");
    }

    #[test]
    fn after_max_auto_submits_without_progress_shepherd_gives_up() {
        let mut b =
            Bench::with(RecoveryConfig { max_recoveries: 10, max_auto_submits: 2, ..RecoveryConfig::default() });
        b.busy(0);
        let mut t = 0;
        for _ in 0..2 {
            t += 180;
            assert!(recovers(&b.tick(t)));
            b.recovered(t);
        }
        t += 180;
        let effects = b.tick(t);
        assert_eq!(actions(&effects), vec![Action::GiveUp]);
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    #[test]
    fn after_max_recoveries_the_next_recovery_backs_off_exponentially() {
        let mut b =
            Bench::with(RecoveryConfig { max_recoveries: 1, max_auto_submits: 10, ..RecoveryConfig::default() });
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(180);
        let effects = b.tick(360);
        assert_eq!(actions(&effects), vec![Action::Backoff]);
        let Effect::Record(r) = &effects[0] else { panic!() };
        assert_eq!(r.numbers.backoff_ms, Some(60_000));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(420)));
        assert!(recovers(&b.tick(420)));
        b.recovered(420);
        let Effect::Record(r) = &b.tick(600)[0] else { panic!() };
        assert_eq!(r.numbers.backoff_ms, Some(120_000), "doubles");
    }

    #[test]
    fn real_progress_resets_the_attempts() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(180);
        b.feed(181, r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"completed","priority":"high"}]}}"#);
        assert_eq!(b.core.attempts(), 0);
    }

    const TODO_PROGRESS: &str = r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"completed","priority":"high"}]}}"#;

    fn record_of(effects: &[Effect], action: Action) -> ActionRecord {
        effects
            .iter()
            .find_map(|e| match e {
                Effect::Record(r) if r.action == action => Some(r.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {action:?} record in {effects:?}"))
    }

    #[test]
    fn a_session_created_three_hours_ago_that_progressed_a_minute_ago_and_stalls_is_recovered() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(3 * 3600 - 60, TODO_PROGRESS);
        let effects = b.tick(3 * 3600 - 60 + 180);
        assert!(recovers(&effects), "{effects:?}");
        assert_eq!(actions(&effects), vec![Action::StallDetected]);
    }

    #[test]
    fn a_session_without_real_progress_for_longer_than_max_session_age_is_given_up() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(1000, TODO_PROGRESS);
        // Activity without progress (deltas) for more than two hours, then silence.
        b.feed(8300, DELTA);
        let effects = b.tick(8300 + 180);
        assert!(!recovers(&effects));
        let r = record_of(&effects, Action::GiveUp);
        assert!(r.reason.contains("no real progress") && r.reason.contains("max_session_age"), "{}", r.reason);
        assert_eq!(r.numbers.without_progress_ms, Some(7_480_000), "since the last progress");
        assert_eq!(r.numbers.age_ms, Some(8_480_000), "since creation");
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    // ---- blind is not silent: the event stream is down ----

    #[test]
    fn a_stall_timer_that_would_fire_while_the_stream_is_down_does_not() {
        let mut b = Bench::new();
        b.busy(0);
        b.core.on_blind();
        assert_eq!(b.core.deadline(), None, "no timer while blind");
        assert!(b.tick(180).is_empty());
        assert!(b.tick(3600).is_empty());
        assert_eq!(b.core.stall_clock(), None, "not shown as stalled either");
    }

    #[test]
    fn after_the_stream_is_back_a_still_busy_silent_session_is_recovered_after_a_full_stall_timeout() {
        let mut b = Bench::new();
        b.busy(0);
        b.core.on_blind();
        let back = b.at(500);
        b.core.on_sight(back);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(500 + 180)));
        assert!(b.tick(679).is_empty());
        let effects = b.tick(680);
        assert!(recovers(&effects));
        let r = record_of(&effects, Action::StallDetected);
        assert_eq!(r.numbers.idle_for_ms, Some(180_000), "silence counted from the stream's return");
    }

    #[test]
    fn a_turn_cut_off_while_blind_is_continued_even_if_a_recovery_then_finds_it_not_busy() {
        // The stall fired just before the stream broke; its status check reached the
        // restarted server, which lists nothing.
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.core.on_blind();
        let effects = b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(190));
        assert_eq!(actions(&effects), vec![Action::Recover]);
        assert!(b.core.is_busy(), "the reconciliation, not this answer, tells how the turn ended");
        // The reconciliation: the last turn was cut off.
        let effects = b.core.on_interrupted("msg_B", b.at(200));
        assert!(effects.iter().any(|e| matches!(e, Effect::Prompt(o) if o.kind == PromptKind::Continue)));
    }

    #[test]
    fn a_session_first_seen_long_after_its_creation_counts_from_first_sight() {
        let mut b = Bench::new();
        // Created five hours before Shepherd saw it (mid-flight, or after a restart).
        b.core.hydrate(&SessionInfo {
            id: "ses_A".into(),
            parent_id: None,
            directory: Some("/p".into()),
            title: None,
            time: crate::event::Times { created: Some(CREATED_MS - 5 * 3600 * 1000), ..Default::default() },
            metadata: None,
        });
        b.busy(0);
        assert!(recovers(&b.tick(180)), "not abandoned: Shepherd has watched it for three minutes");
    }

    #[test]
    fn a_recovery_that_found_the_session_idle_does_not_count_as_an_attempt() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        let effects = b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(181));
        assert_eq!(actions(&effects), vec![Action::Recover]);
        assert_eq!(b.core.attempts(), 0);
        assert!(!b.core.is_busy());
    }

    #[test]
    fn a_recovery_that_found_the_session_idle_forgets_what_the_turn_waited_on() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.feed(180, r#"{"type":"permission.asked","properties":{"id":"per_1","sessionID":"ses_A"}}"#);
        b.core.on_recovery_finished(&RecoveryReport::NotBusy, b.at(181));
        b.busy(200);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(380)), "the next turn has its stall clock");
    }

    #[test]
    fn todos_are_tracked_and_cancelled_counts_as_done() {
        let mut b = Bench::new();
        b.feed(0, r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"cancelled","priority":"high"},{"content":"b","status":"in_progress","priority":"low"}]}}"#);
        let open: Vec<_> = b.core.todos().iter().filter(|t| t.status.is_open()).collect();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].status, TodoStatus::InProgress);
    }

    // ---- follow-ups: nudge and review ----

    fn rules() -> SessionRules {
        let mut r = unadvised(SessionRules::default());
        r.nudge.user_quiet = Duration::from_secs(5);
        r
    }

    fn bench_with_rules(rules: SessionRules) -> Bench {
        let t0 = Instant::now();
        let core = SessionCore::new("srv", "ses_A", Arc::new(rules), Now { mono: t0, wall_ms: CREATED_MS });
        Bench { core, t0 }
    }

    impl Bench {
        fn at_ms(&self, ms: u64) -> Now {
            Now { mono: self.t0 + Duration::from_millis(ms), wall_ms: CREATED_MS + ms as i64 }
        }
        fn feed_ms(&mut self, ms: u64, json: &str) -> Vec<Effect> {
            let event = decode(json).expect("test event decodes").event;
            let now = self.at_ms(ms);
            self.core.observe(&event, now)
        }
        fn tick_ms(&mut self, ms: u64) -> Vec<Effect> {
            let now = self.at_ms(ms);
            self.core.on_deadline(now)
        }
        fn todos_ms(&mut self, ms: u64, statuses: &[&str]) -> Vec<Effect> {
            let items: Vec<String> = statuses
                .iter()
                .enumerate()
                .map(|(i, st)| format!(r#"{{"content":"t{i}","status":"{st}","priority":"high"}}"#))
                .collect();
            self.feed_ms(
                ms,
                &format!(
                    r#"{{"type":"todo.updated","properties":{{"sessionID":"ses_A","todos":[{}]}}}}"#,
                    items.join(",")
                ),
            )
        }
        /// One turn: busy, an assistant reply with `text` finishing `finish`, idle.
        fn turn_ms(&mut self, ms: u64, msg: &str, text: &str, finish: &str) -> Vec<Effect> {
            let mut out = self.feed_ms(
                ms,
                r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#,
            );
            out.extend(self.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"assistant","finish":"{finish}","time":{{"created":1}}}}}}}}"#)));
            let text = serde_json::to_string(text).unwrap();
            out.extend(self.feed_ms(ms, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"prt_{msg}","messageID":"{msg}","sessionID":"ses_A","type":"text","text":{text}}}}}}}"#)));
            out.extend(self.idle_ms(ms));
            out
        }
        fn idle_ms(&mut self, ms: u64) -> Vec<Effect> {
            let mut out = self.feed_ms(
                ms,
                r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#,
            );
            out.extend(self.feed_ms(ms, r#"{"type":"session.idle","properties":{"sessionID":"ses_A"}}"#));
            out
        }
        fn deliver(&mut self, ms: u64, effects: &[Effect]) {
            for e in effects {
                if let Effect::Prompt(order) = e {
                    let now = self.at_ms(ms);
                    self.core.on_prompt_finished(
                        order,
                        &Delivery::Sent { text: String::new(), todos: vec![], tool_call_as_text: None, waited_ms: 0 },
                        now,
                    );
                }
            }
        }
    }

    fn prompts(effects: &[Effect]) -> Vec<PromptKind> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Prompt(o) => Some(o.kind),
                _ => None,
            })
            .collect()
    }

    fn declined(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(r) if r.outcome == Outcome::Declined => Some(r.reason.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn idle_with_open_todos_is_nudged_once_per_idle_edge_after_the_delay() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(600)));
        assert!(prompts(&b.tick_ms(599)).is_empty());
        b.idle_ms(550); // a repeated idle event does not re-arm
        let effects = b.tick_ms(600);
        assert_eq!(prompts(&effects), vec![PromptKind::Nudge]);
        let Effect::Prompt(order) = &effects[0] else { panic!() };
        assert!(order.require_idle && order.require_open_todos);
        assert_eq!(order.template, NudgeConfig::default().message);
        b.deliver(600, &effects);
        assert!(prompts(&b.tick_ms(5_000)).is_empty(), "no second nudge without a new edge");
    }

    #[test]
    fn a_nudge_due_while_the_stream_is_down_waits_for_the_reconciled_facts() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        b.core.on_blind();
        assert_eq!(b.core.deadline(), None, "no nudge timer while blind");
        assert!(prompts(&b.tick_ms(5_000)).is_empty());
        // The reconciliation found it busy again (the person wrote meanwhile): no nudge.
        let effects = b
            .feed_ms(6_000, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        let back = b.at_ms(6_000);
        b.core.on_sight(back);
        assert_eq!(declined(&effects), vec!["the session went busy again".to_string()]);
        assert!(prompts(&b.tick_ms(7_000)).is_empty());
    }

    #[test]
    fn a_nudge_that_fell_due_while_blind_is_sent_once_the_stream_is_back_and_the_session_still_idle() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.turn_ms(100, "msg_1", "Working on it.", "stop");
        b.core.on_blind();
        let back = b.at_ms(6_000);
        b.core.on_sight(back);
        assert!(b.core.deadline().is_some_and(|d| d <= back.mono), "due at once");
        assert_eq!(prompts(&b.tick_ms(6_000)), vec![PromptKind::Nudge]);
    }

    #[test]
    fn a_session_that_goes_busy_again_is_not_nudged_and_that_is_logged() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "Next step.", "stop");
        let effects =
            b.feed_ms(300, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        assert_eq!(declined(&effects), vec!["the session went busy again".to_string()]);
        assert!(prompts(&b.tick_ms(600)).is_empty());
    }

    #[test]
    fn no_nudge_when_the_last_reply_asks_the_person_a_question() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "I can use SQLite or Postgres. Which do you prefer?", "stop");
        let effects = b.tick_ms(600);
        assert!(prompts(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["the last reply asks the person a question".to_string()]);
    }

    #[test]
    fn no_nudge_after_a_user_abort_until_the_person_writes() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.feed_ms(
            50,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        b.turn_ms(100, "msg_1", "Stopped.", "stop");
        let effects = b.tick_ms(600);
        assert!(prompts(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["automation is paused (user_abort)".to_string()]);
    }

    #[test]
    fn no_nudge_when_the_reply_did_not_finish_normally() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "partial", "length");
        assert!(declined(&b.tick_ms(600))[0].starts_with("the last reply did not finish normally"));
    }

    #[test]
    fn nudging_stops_after_max_without_progress_and_resumes_when_a_todo_changes() {
        let mut r = rules();
        r.nudge.cooldown = Duration::ZERO;
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["pending", "pending"]);
        let mut t = 100;
        for round in 1..=3 {
            b.turn_ms(t, &format!("msg_{round}"), "Still on it.", "stop");
            let effects = b.tick_ms(t + 500);
            assert_eq!(prompts(&effects), vec![PromptKind::Nudge], "round {round}");
            b.deliver(t + 500, &effects);
            t += 1000;
        }
        b.turn_ms(t, "msg_4", "Still on it.", "stop");
        let effects = b.tick_ms(t + 500);
        assert!(prompts(&effects).is_empty());
        assert!(declined(&effects)[0].contains("3 nudges without progress"));
        t += 1000;
        b.todos_ms(t, &["completed", "pending"]);
        b.turn_ms(t, "msg_5", "One done.", "stop");
        assert_eq!(prompts(&b.tick_ms(t + 500)), vec![PromptKind::Nudge], "progress resumes nudging");
    }

    #[test]
    fn the_nudge_cooldown_and_a_recent_person_hold_nudges_back() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.turn_ms(100, "msg_1", "a", "stop");
        let effects = b.tick_ms(600);
        b.deliver(600, &effects);
        b.turn_ms(1000, "msg_2", "b", "stop");
        assert_eq!(declined(&b.tick_ms(1500)), vec!["within nudge.cooldown of the previous nudge".to_string()]);

        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.feed_ms(10, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(10, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pu","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"please"}}}"#);
        b.turn_ms(100, "msg_1", "ok", "stop");
        assert_eq!(declined(&b.tick_ms(600)), vec!["the person wrote within nudge.user_quiet".to_string()]);
    }

    #[test]
    fn review_fires_once_when_the_last_todo_is_done_and_again_after_new_todos() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["in_progress", "pending"]);
        b.feed_ms(10, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        b.todos_ms(200, &["completed", "completed"]);
        b.turn_ms(300, "msg_1", "All done.", "stop");
        assert!(prompts(&b.tick_ms(799)).is_empty(), "debounced");
        let effects = b.tick_ms(800);
        assert_eq!(prompts(&effects), vec![PromptKind::Review]);
        b.deliver(800, &effects);
        b.turn_ms(2000, "msg_2", "Tests pass.", "stop");
        assert!(prompts(&b.tick_ms(3000)).is_empty(), "never twice for one edge");

        // The review found failures: new todos, then done again -> second round.
        b.todos_ms(4000, &["completed", "completed", "pending"]);
        b.todos_ms(4100, &["completed", "completed", "completed"]);
        b.idle_ms(4100);
        b.turn_ms(4200, "msg_3", "Fixed.", "stop");
        let effects = b.tick_ms(4700);
        assert_eq!(prompts(&effects), vec![PromptKind::Review]);
        let Effect::Prompt(order) = &effects[0] else { panic!() };
        assert_eq!(order.facts.attempts, 2, "round 2");
    }

    #[test]
    fn a_session_whose_todos_were_always_empty_is_never_reviewed() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &[]);
        b.turn_ms(100, "msg_1", "Done.", "stop");
        assert_eq!(b.core.deadline(), None);
        b.todos_ms(200, &["completed"]);
        b.idle_ms(300);
        assert!(prompts(&b.tick_ms(10_000)).is_empty(), "created already done: no open->done edge");
    }

    #[test]
    fn reviews_are_bounded_by_max_rounds() {
        let mut r = rules();
        r.review.max_rounds = 1;
        let mut b = bench_with_rules(r);
        let mut t = 0;
        for round in 0..2 {
            b.todos_ms(t, &["pending"]);
            b.todos_ms(t + 10, &["completed"]);
            b.turn_ms(t + 20, &format!("msg_{round}"), "Done.", "stop");
            let effects = b.tick_ms(t + 600);
            assert_eq!(prompts(&effects).len(), if round == 0 { 1 } else { 0 });
            b.deliver(t + 600, &effects);
            t += 1000;
        }
    }

    // ---- orphan parents ----

    fn child_event(b: &mut Bench, ms: u64, child: &str, json: &str) -> Vec<Effect> {
        let event = decode(json).expect("decodes").event;
        let now = b.at_ms(ms);
        b.core.on_child_event(child, &event, now)
    }

    const CHILD_BUSY: &str = r#"{"type":"session.status","properties":{"sessionID":"ses_C","status":{"type":"busy"}}}"#;
    const CHILD_IDLE: &str = r#"{"type":"session.status","properties":{"sessionID":"ses_C","status":{"type":"idle"}}}"#;
    const CHILD_ABORTED: &str =
        r#"{"type":"session.error","properties":{"sessionID":"ses_C","error":{"name":"MessageAbortedError"}}}"#;

    #[test]
    fn an_idle_parent_whose_background_child_failed_unnoticed_is_continued_once() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started a background task.", "stop");
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(17_000)));
        assert!(prompts(&b.tick_ms(16_999)).is_empty());
        let effects = b.tick_ms(17_000);
        assert_eq!(prompts(&effects), vec![PromptKind::Continue]);
        assert!(actions(&effects).contains(&Action::Recover));
        child_event(&mut b, 18_000, "ses_C", CHILD_IDLE);
        assert!(prompts(&b.tick_ms(40_000)).is_empty(), "once per child");
    }

    #[test]
    fn a_parent_that_lost_two_background_children_at_once_is_continued_once() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started two background tasks.", "stop");
        for child in ["ses_C", "ses_D"] {
            child_event(&mut b, 100, child, CHILD_BUSY);
            child_event(&mut b, 2000, child, CHILD_ABORTED);
            child_event(&mut b, 2000, child, CHILD_IDLE);
        }
        let effects = b.tick_ms(17_000);
        assert_eq!(prompts(&effects), vec![PromptKind::Continue], "{effects:?}");
        assert_eq!(actions(&effects), vec![Action::Recover, Action::Recover], "each child is journalled");
    }

    #[test]
    fn a_task_notice_reaching_the_parent_means_it_is_not_orphaned() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started.", "stop");
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        b.feed_ms(2100, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_N","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(2100, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pn","messageID":"msg_N","sessionID":"ses_A","type":"text","synthetic":true,"text":"<task id=\"ses_C\" state=\"error\">"}}}"#);
        assert!(prompts(&b.tick_ms(30_000)).is_empty());
    }

    #[test]
    fn a_foreground_child_aborted_while_the_parent_is_busy_is_not_an_orphan() {
        let mut b = bench_with_rules(rules());
        b.feed_ms(0, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        b.turn_ms(2500, "msg_1", "Carried on.", "stop");
        assert!(prompts(&b.tick_ms(30_000)).is_empty());
    }

    #[test]
    fn a_busy_parent_whose_children_are_all_idle_is_recovered_after_orphan_wait() {
        let mut b = bench_with_rules(rules());
        b.feed_ms(0, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        b.feed_ms(0, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pt","messageID":"msg_1","sessionID":"ses_A","type":"tool","tool":"task","state":{"status":"running","metadata":{"sessionId":"ses_C"}}}}}"#);
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        // While the child works, its events keep the parent alive past any timeout.
        for s in 1..=20u64 {
            child_event(
                &mut b,
                s * 60_000,
                "ses_C",
                r#"{"type":"message.part.delta","properties":{"sessionID":"ses_C","messageID":"msg_m","partID":"prt_p","field":"text","delta":"x"}}"#,
            );
        }
        assert!(!recovers(&b.tick_ms(20 * 60_000 + 1000)), "a working child is not a stalled parent");
        child_event(&mut b, 20 * 60_000 + 2000, "ses_C", CHILD_IDLE);
        let due = b.core.deadline().unwrap();
        assert_eq!(due, b.t0 + Duration::from_millis(20 * 60_000 + 2000 + 15_000), "orphan_wait, not the tool grace");
        assert!(recovers(&b.tick_ms(20 * 60_000 + 17_000)));
    }

    // ---- context and compaction ----

    fn assistant_with_tokens(b: &mut Bench, ms: u64, id: &str, input: u64, cache_read: u64) {
        b.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","tokens":{{"input":{input},"output":5,"cache":{{"read":{cache_read},"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#));
    }

    fn compactions(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Compact(o) => Some(o.reason.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_context_size_is_the_latest_model_calls_prompt_not_the_session_total() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 50_000, 10_000);
        assistant_with_tokens(&mut b, 20, "msg_2", 90_000, 30_000);
        b.core.set_window(Some(200_000));
        assert_eq!(b.core.context(), (Some(120_000), Some(200_000)));
        assert_eq!(b.core.model_key().as_deref(), Some("fake/fake-model"));
        assert!((b.core.context_share().unwrap() - 0.6).abs() < 1e-9);
    }

    /// Compaction alone (the hand-off would take over past `handoff.prepare`).
    fn compaction_rules() -> SessionRules {
        let mut r = rules();
        r.handoff.enabled = false;
        r
    }

    #[test]
    fn an_idle_session_past_proactive_is_compacted_once_per_cooldown() {
        let mut b = bench_with_rules(compaction_rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 150_000, 0);
        b.core.set_window(Some(200_000));
        let effects = b.idle_ms(100);
        assert_eq!(compactions(&effects), vec!["idle past compaction.proactive of the context window".to_string()]);
        assert!(b.core.is_compacting());
        let Effect::Compact(order) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).unwrap().clone() else {
            panic!()
        };
        let now = b.at_ms(5_000);
        let done = b.core.on_compaction_finished(&order, Ok(()), now);
        assert_eq!(actions(&done), vec![Action::Compact]);
        assert!(!b.core.is_compacting());
        // Grown again right away: the cooldown holds it back, and says so.
        b.busy(6);
        assistant_with_tokens(&mut b, 6_100, "msg_2", 160_000, 0);
        let effects = b.idle_ms(6_200);
        assert!(compactions(&effects).is_empty());
        assert_eq!(declined(&effects), vec!["within compaction.cooldown".to_string()]);
    }

    #[test]
    fn below_proactive_nothing_is_compacted() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        b.core.set_window(Some(200_000));
        assert!(compactions(&b.idle_ms(100)).is_empty());
    }

    const OVERFLOW: &str = r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_O","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"error","error":{"name":"ContextOverflowError","data":{"message":"This model's maximum context length is 200000 tokens. However, your messages resulted in 250123 tokens. Please reduce the length of the messages."}},"time":{"created":1,"completed":2}}}}"#;

    #[test]
    fn an_overflow_left_idle_gets_one_emergency_compaction_with_exact_numbers() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, OVERFLOW);
        assert_eq!(b.core.context(), (Some(250_123), Some(200_000)), "read from the error text");
        let effects = b.idle_ms(20);
        assert!(compactions(&effects)[0].contains("emergency"));
    }

    #[test]
    fn an_overflow_while_busy_is_left_to_opencode() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"ContextOverflowError","data":{"message":"x"}}}}"#);
        // OpenCode compacts by itself: a compaction part, a summary, then a normal reply.
        b.feed_ms(20, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pc","messageID":"msg_C","sessionID":"ses_A","type":"compaction","auto":true,"overflow":true}}}"#);
        assert!(b.core.is_compacting());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(20) + CompactionConfig::default().max_wait));
        assert!(!recovers(&b.tick_ms(60_000)), "a compaction within compaction.max_wait is left alone");
        b.feed_ms(30, r#"{"type":"session.compacted","properties":{"sessionID":"ses_A"}}"#);
        assistant_with_tokens(&mut b, 40, "msg_R", 20_000, 0);
        assert!(compactions(&b.idle_ms(50)).is_empty());
    }

    const COMPACTION_PART: &str = r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pc","messageID":"msg_C","sessionID":"ses_A","type":"compaction","auto":true,"overflow":false}}}"#;
    const SUMMARY_STREAMING: &str = r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","time":{"created":1}}}}"#;
    const SUMMARY_DELTA: &str = r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_S","partID":"prt_s","field":"text","delta":"x"}}"#;

    #[test]
    fn opencodes_compaction_past_max_wait_is_aborted_and_continued_like_a_stall() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        b.feed_ms(11_000, SUMMARY_STREAMING);
        // The summary trickles on: activity, but the bound counts from the first sight.
        for s in (20..=185).step_by(15) {
            b.feed_ms(s * 1000, SUMMARY_DELTA);
        }
        let max_wait = CompactionConfig::default().max_wait;
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(10) + max_wait));
        assert!(b.tick_ms(189_999).is_empty());
        let effects = b.tick_ms(190_000);
        assert!(recovers(&effects), "{effects:?}");
        let r = record_of(&effects, Action::StallDetected);
        assert!(r.reason.contains("compaction ran past compaction.max_wait"), "{}", r.reason);
        assert_eq!(r.numbers.compacting_for_ms, Some(180_000));
        assert_eq!(r.numbers.timeout_ms, Some(180_000), "compaction.max_wait");
        assert_eq!(r.numbers.idle_for_ms, Some(5_000), "it was not silent: only too long");
    }

    #[test]
    fn the_bound_of_a_compaction_our_abort_ended_does_not_carry_over_to_the_continued_turn() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        assert!(recovers(&b.tick_ms(190_000)));
        // Our abort's idle edge (no summary error seen), then the continue's turn.
        b.idle_ms(190_100);
        b.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(100),
                open_todos: 0,
                compacted: None,
                tool_call_as_text: None,
                waited_ms: 0,
            },
            b.at_ms(191_000),
        );
        b.busy(192);
        assert!(!b.core.is_compacting());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(192 + 180)), "the usual stall clock");
    }

    #[test]
    fn a_compaction_that_ends_in_time_leaves_the_usual_stall_clock_running() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10_000, COMPACTION_PART);
        b.feed_ms(11_000, SUMMARY_STREAMING);
        b.feed_ms(100_000, r#"{"type":"session.compacted","properties":{"sessionID":"ses_A"}}"#);
        assert!(!b.core.is_compacting());
        assert!(b.tick_ms(190_000).is_empty(), "the compaction's bound is gone with it");
        assert_eq!(
            b.core.deadline(),
            Some(b.t0 + Duration::from_secs(100 + 180)),
            "silence since the compaction ended"
        );
    }

    #[test]
    fn a_session_too_large_to_compact_is_not_compacted_again() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.feed_ms(10, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","finish":"error","error":{"name":"ContextOverflowError","data":{"message":"Session too large to compact - context exceeds model limit even after stripping media"}},"time":{"created":1,"completed":2}}}}"#);
        let effects = b.idle_ms(20);
        assert!(compactions(&effects).is_empty());
        assert!(declined(&effects)[0].contains("too large to compact"));
    }

    #[test]
    fn past_opportunistic_a_nudge_to_an_idle_session_is_preceded_by_a_compaction_outside_the_cooldown() {
        let mut b = bench_with_rules(compaction_rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 110_000, 0); // 55%: past opportunistic, below proactive
        assert!(compactions(&b.idle_ms(20)).is_empty(), "below proactive: nothing at the idle edge");
        let effects = b.tick_ms(5_000);
        assert_eq!(
            compactions(&effects),
            vec!["past compaction.opportunistic, idle: compacting before the nudge".to_string()]
        );
        assert!(prompts(&effects).is_empty(), "the nudge waits for the compaction");
        let Some(Effect::Compact(order)) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!()
        };
        let after = b.core.on_compaction_finished(&order, Ok(()), b.at_ms(6_000));
        assert_eq!(prompts(&after), vec![PromptKind::Nudge]);
        // Within the cooldown the next nudge goes straight out.
        b.busy(7);
        assistant_with_tokens(&mut b, 7_100, "msg_2", 120_000, 0);
        b.idle_ms(7_200);
        let next = b.tick_ms(13_000);
        assert!(compactions(&next).is_empty());
    }

    #[test]
    fn past_the_hard_threshold_a_nudge_waits_behind_a_compaction_and_is_sent_whatever_it_gives() {
        let mut r = compaction_rules();
        r.compaction.cooldown = Duration::from_secs(3600); // the idle-edge compaction is held back
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        b.core.set_window(Some(200_000));
        let first = b.idle_ms(20); // 50%: no compaction; then the cooldown starts below
        assert!(compactions(&first).is_empty());
        b.core.last_compaction = Some(b.at_ms(30).mono);
        b.busy(1);
        assistant_with_tokens(&mut b, 1_100, "msg_2", 180_000, 0); // 90% > hard (88%)
        b.idle_ms(1_200);
        let effects = b.tick_ms(1_700);
        assert_eq!(compactions(&effects), vec!["past handoff.hard: compacting before the nudge".to_string()]);
        assert!(prompts(&effects).is_empty(), "the nudge waits");
        let Effect::Compact(order) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).unwrap().clone() else {
            panic!()
        };
        let after = b.core.on_compaction_finished(&order, Err("timed out".into()), b.at_ms(9_000));
        assert_eq!(prompts(&after), vec![PromptKind::Nudge], "never stranded");
    }

    #[test]
    fn a_prompt_held_behind_a_compaction_is_not_sent_if_the_person_aborted_meanwhile() {
        let mut b = bench_with_rules(compaction_rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 110_000, 0); // 55%: past opportunistic
        b.idle_ms(20);
        let effects = b.tick_ms(5_000);
        let Some(Effect::Compact(order)) = effects.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!("the nudge waits behind a compaction: {effects:?}")
        };
        b.feed_ms(
            5_100,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        let after = b.core.on_compaction_finished(&order, Err("aborted".into()), b.at_ms(5_200));
        assert!(prompts(&after).is_empty(), "{after:?}");
        assert_eq!(declined(&after), vec!["automation is paused (user_abort)".to_string()]);
    }

    #[test]
    fn past_the_hard_threshold_a_stall_recovery_compacts_between_abort_and_continue() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        assistant_with_tokens(&mut b, 0, "msg_1", 190_000, 0);
        b.core.set_window(Some(200_000));
        b.busy(0);
        let effects = b.tick(180);
        let order = effects.iter().find_map(|e| match e {
            Effect::Recover(o) => Some(o.clone()),
            _ => None,
        });
        assert!(order.expect("recovers").compact_first.is_some());
    }

    // ---- runaway loops ----

    fn empty_finish(b: &mut Bench, ms: u64, id: &str) -> Vec<Effect> {
        b.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","finish":"unknown","tokens":{{"input":0,"output":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#))
    }

    #[test]
    fn a_runaway_loop_is_aborted_and_continued_once_then_stopped_if_it_comes_back() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        for i in 0..4 {
            assert!(!recovers(&empty_finish(&mut b, 100 + i * 300, &format!("msg_{i}"))));
            assert!(
                !recovers(&empty_finish(&mut b, 101 + i * 300, &format!("msg_{i}"))),
                "a re-emitted message counts once"
            );
        }
        let effects = empty_finish(&mut b, 1_300, "msg_4");
        let order = effects
            .iter()
            .find_map(|e| match e {
                Effect::Recover(o) => Some(o.clone()),
                _ => None,
            })
            .expect("abort");
        assert!(order.continue_after);
        b.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(10),
                open_todos: 0,
                compacted: None,
                tool_call_as_text: None,
                waited_ms: 0,
            },
            b.at_ms(2_000),
        );
        b.busy(3);
        let mut last = Vec::new();
        for i in 0..5 {
            last = empty_finish(&mut b, 3_000 + i * 300, &format!("msg_n{i}"));
        }
        let order = last
            .iter()
            .find_map(|e| match e {
                Effect::Recover(o) => Some(o.clone()),
                _ => None,
            })
            .expect("abort");
        assert!(!order.continue_after, "it came back: abort and stop");
        assert_eq!(b.core.pause(), Some(Pause::GaveUp));
    }

    #[test]
    fn empty_finishes_spread_out_in_time_are_not_a_runaway_loop() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        for i in 0..10 {
            assert!(!recovers(&empty_finish(&mut b, i * 5_000, &format!("msg_{i}"))));
        }
    }

    fn handoffs(effects: &[Effect]) -> Vec<HandoffOrder> {
        effects.iter().filter_map(|e| if let Effect::HandOff(o) = e { Some(o.clone()) } else { None }).collect()
    }

    fn phases(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(r) if r.action == Action::Handoff => r.numbers.phase.clone(),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_filling_session_gets_a_soft_note_then_is_handed_off_when_its_turn_ends() {
        let mut r = rules();
        r.compaction.enabled = false; // here the window only grows
        let mut b = bench_with_rules(r);
        b.todos_ms(0, &["in_progress", "pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        assert!(b.feed_ms(20_000, &tokens_json("msg_2", 152_000)).is_empty(), "76%: the note waits for idle");
        let soft = b.idle_ms(21_000);
        assert_eq!(phases(&soft), vec!["preparing"]);
        let note = soft.iter().find_map(|e| if let Effect::Prompt(o) = e { Some(o.clone()) } else { None }).unwrap();
        assert_eq!(note.kind, PromptKind::Note);
        assert!(note.require_idle && note.template.contains("76% used"), "{note:?}");
        b.busy(22);
        let ready = b.feed_ms(30_000, &tokens_json("msg_3", 164_000)); // 82%
        assert_eq!(phases(&ready), vec!["ready"]);
        assert!(handoffs(&ready).is_empty(), "not mid-turn");
        let idle = b.idle_ms(40_000);
        let orders = handoffs(&idle);
        assert_eq!(orders.len(), 1, "{idle:?}");
        assert_eq!(orders[0].step, Phase::Persisting);
        assert!(!orders[0].abort_first);
        assert!(compactions(&idle).is_empty(), "the hand-off goes first");
        // Nothing else acts on the session while the hand-off runs.
        assert!(b.core.deadline().is_none() || prompts(&b.tick_ms(50_000)).is_empty());
        let order = orders[0].clone();
        let persisted = StepReport::Persisted { reused: false, readable: None, chars: 900, model_account: true };
        let next = b.core.on_handoff_step(&order, &persisted, b.at_ms(41_000));
        assert_eq!(handoffs(&next)[0].step, Phase::HandingOver);
        let over = StepReport::HandedOver { target: "ses_new".into(), created: true };
        let next = b.core.on_handoff_step(&handoffs(&next)[0], &over, b.at_ms(42_000));
        let resume = handoffs(&next);
        assert_eq!(resume[0].step, Phase::Resuming);
        assert_eq!(resume[0].target.as_deref(), Some("ses_new"));
        let done =
            b.core.on_handoff_step(&resume[0], &StepReport::Resumed { target: "ses_new".into() }, b.at_ms(43_000));
        assert_eq!(phases(&done), vec!["completed"]);
        assert_eq!(b.core.handoff().new_session(), Some("ses_new"));
        // The old session is left alone afterwards: no nudge for its open todos.
        let later = b.tick_ms(120_000);
        assert!(prompts(&later).is_empty(), "{later:?}");
    }

    #[test]
    fn a_compaction_at_the_idle_edge_makes_the_soft_note_moot_and_rearms_the_thresholds() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 152_000)); // 76%: past proactive and soft
        let idle = b.idle_ms(100);
        assert_eq!(compactions(&idle).len(), 1);
        assert!(prompts(&idle).is_empty(), "no note beside the compaction: {idle:?}");
        let Some(Effect::Compact(order)) = idle.iter().find(|e| matches!(e, Effect::Compact(_))).cloned() else {
            panic!()
        };
        b.core.on_compaction_finished(&order, Ok(()), b.at_ms(2_000));
        assert_eq!(b.core.handoff().phase(), Phase::Monitoring, "watched afresh after the compaction");
    }

    #[test]
    fn past_hard_mid_turn_the_turn_drains_and_then_the_hand_off_aborts_it() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        assistant_with_tokens(&mut b, 10, "msg_1", 100_000, 0);
        let effects = b.feed_ms(1_000, &tokens_json("msg_2", 180_000)); // 90%
        assert_eq!(phases(&effects), vec!["ready", "ready"]);
        let drain = b.core.cfg.handoff.drain;
        assert!(handoffs(&b.tick_ms(1_000 + ms(drain) - 1)).is_empty());
        b.feed_ms(
            1_000 + ms(drain) - 1,
            r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#,
        );
        let at = 1_000 + ms(drain) + 1;
        let orders = handoffs(&b.tick_ms(at));
        assert_eq!(orders.len(), 1);
        assert!(orders[0].abort_first, "the turn is still running: it is aborted first");
    }

    #[test]
    fn the_abort_of_a_hand_off_is_not_taken_for_the_persons() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(1_000, &tokens_json("msg_1", 180_000)); // 90%, mid-turn: drain, then abort
        let at = 1_000 + ms(b.core.cfg.handoff.drain);
        assert!(handoffs(&b.tick_ms(at))[0].abort_first);
        let aborted =
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#;
        assert!(b.feed_ms(at + 10, aborted).is_empty());
        assert_eq!(b.core.pause(), None);
    }

    #[test]
    fn the_drain_past_hard_does_not_abort_while_a_person_is_asked() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: drain, then abort
        b.feed_ms(20, r#"{"type":"permission.asked","properties":{"id":"per_1","sessionID":"ses_A"}}"#);
        let at = 10 + ms(b.core.cfg.handoff.drain);
        assert_eq!(b.core.deadline(), None, "nothing to do until the person answers");
        assert!(handoffs(&b.tick_ms(at)).is_empty());
        b.feed_ms(at + 5, r#"{"type":"permission.replied","properties":{"requestID":"per_1","sessionID":"ses_A"}}"#);
        assert!(handoffs(&b.tick_ms(at + 5))[0].abort_first, "then the drain is over");
    }

    #[test]
    fn a_paused_session_past_hard_is_neither_aborted_nor_handed_off_until_the_person_writes() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: drain, then abort
        b.feed_ms(
            20,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(b.core.deadline(), None);
        assert!(handoffs(&b.tick_ms(10 + ms(b.core.cfg.handoff.drain))).is_empty());
        assert!(handoffs(&b.idle_ms(200_000)).is_empty(), "not at the end of the turn either");
        b.feed_ms(201_000, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(201_000, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pu","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"go on"}}}"#);
        b.busy(202);
        assert_eq!(
            handoffs(&b.idle_ms(203_000)).len(),
            1,
            "the person wrote: the hand-off goes at the end of the turn"
        );
    }

    #[test]
    fn a_soft_note_due_at_the_end_of_the_turn_is_not_sent_once_the_session_is_paused_or_handed_off() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 152_000)); // 76% mid-turn: the note waits for idle
        b.feed_ms(
            20,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(b.core.pause(), Some(Pause::UserAbort));
        assert!(prompts(&b.idle_ms(30)).is_empty(), "paused: no note");

        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 180_000)); // 90% mid-turn: a note due, and a drain
        let at = 10 + ms(b.core.cfg.handoff.drain);
        assert_eq!(handoffs(&b.tick_ms(at)).len(), 1, "the hand-off starts");
        assert!(prompts(&b.idle_ms(at + 10)).is_empty(), "no note during the hand-off");
    }

    #[test]
    fn a_failed_hand_off_gives_the_session_back_to_the_usual_automation() {
        let mut b = bench_with_rules(rules());
        b.todos_ms(0, &["pending"]);
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 164_000));
        let order = handoffs(&b.idle_ms(100))[0].clone();
        let failed = StepReport::Failed { step: Phase::HandingOver, error: "server unreachable".into() };
        let effects = b.core.on_handoff_step(&order, &failed, b.at_ms(200));
        assert_eq!(phases(&effects), vec!["failed"]);
        assert!(!b.core.handoff().suspends_automation());
        let later = b.tick_ms(10_000);
        // The nudge goes out again — behind a compaction, since the window is still full.
        assert_eq!(compactions(&later), vec!["past compaction.opportunistic, idle: compacting before the nudge"]);
    }

    #[test]
    fn a_hand_off_under_way_survives_a_restart_and_resumes_at_its_step() {
        let mut b = bench_with_rules(rules());
        b.busy(0);
        b.core.set_window(Some(200_000));
        b.feed_ms(10, &tokens_json("msg_1", 164_000));
        let order = handoffs(&b.idle_ms(100))[0].clone();
        let persisted = StepReport::Persisted { reused: false, readable: None, chars: 10, model_account: false };
        b.core.on_handoff_step(&order, &persisted, b.at_ms(200));
        let saved = b.core.export(b.at_ms(300));
        let mut again = bench_with_rules(rules());
        again.core.restore(&saved, again.at_ms(0));
        let resumed = again.core.resume_interrupted_handoff(again.at_ms(1));
        let orders = handoffs(&resumed);
        assert_eq!(orders.len(), 1);
        assert_eq!((orders[0].id.as_str(), orders[0].step), (order.id.as_str(), Phase::HandingOver));
        assert!(again.core.request_handoff(again.at_ms(2)).is_err(), "no second hand-off");
    }

    fn tokens_json(id: &str, input: u64) -> String {
        format!(
            r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","tokens":{{"input":{input},"output":10,"reasoning":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#
        )
    }
}

#[cfg(test)]
#[path = "core_intelligence_tests.rs"]
mod intelligence_tests;
