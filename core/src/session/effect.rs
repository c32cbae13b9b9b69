//! The orders a session core gives and the reports it gets back: what a procedure in
//! `shepherd-actors` (delivery, hand-over, finishing an unfinished action) is asked to
//! do, and how it ended. Plain data; the procedures that carry them out do the I/O.

use std::time::Duration;

use crate::advisor::gate::AdviceRequest;
use crate::config::{HandoffMode, RecoveryConfig};
use crate::event::{ModelRef, Todo};
use crate::journal::ActionRecord;
use crate::ledger::Intent;
use crate::ports::{EngineError, TurnSettings};
use crate::session::handoff::Phase;
use crate::session::loops::Escalation;
use crate::session::prompt::PromptFacts;
use crate::session::textual_tool_call::TextualToolCall;

/// Which kind of prompt; written into the part metadata (`shepherd.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptKind {
    Continue,
    Nudge,
    Review,
    Custom,
    /// A `noReply` note: stored for the model's next turn, no turn of its own.
    Note,
    /// The hand-off's resume prompt to the fresh session.
    Handoff,
}

impl PromptKind {
    /// Decided by Shepherd itself (everything but a person's or tool's custom prompt).
    pub fn is_automatic(self) -> bool {
        self != PromptKind::Custom
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PromptKind::Continue => "continue",
            PromptKind::Nudge => "nudge",
            PromptKind::Review => "review",
            PromptKind::Custom => "custom",
            PromptKind::Note => "note",
            PromptKind::Handoff => "handoff",
        }
    }
}

/// A prompt to deliver, as decided by a core.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptOrder {
    pub session_id: String,
    pub directory: Option<String>,
    pub kind: PromptKind,
    pub template: String,
    /// Used instead of `template` when the fresh todo list has no open items.
    pub template_without_open_todos: Option<String>,
    pub facts: PromptFacts,
    /// Todos as last seen in events (used when the fresh read fails).
    pub known_todos: Vec<Todo>,
    pub known_turn: Option<TurnSettings>,
    /// Send only if `GET /session/status` says the session is idle.
    pub require_idle: bool,
    /// Send only if the fresh todo list still has open items.
    pub require_open_todos: bool,
    /// Names this decision in the prompt's metadata and the log.
    pub decision: String,
    /// For the guard: prompts that reached the session before this moment (epoch ms)
    /// are not repeated by this one (the continue after Shepherd's own abort).
    pub not_before_ms: Option<i64>,
    /// Look for a tool call written as text first; on a match send its template instead.
    pub tool_text_scan: Option<ToolTextScan>,
    /// Send with this model instead of the last turn's (a fallback after provider
    /// errors, or the session's own model again after the fallback's cool-down).
    pub model: Option<ModelRef>,
}

/// The tool-call-as-text check of a continue or a nudge (see
/// [`crate::session::textual_tool_call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolTextScan {
    /// How many recent messages to read.
    pub messages: u32,
    /// Sent on a match; `{pattern}` names what was found.
    pub template: String,
}

impl ToolTextScan {
    /// The scan as configured, or none when it is switched off.
    pub fn from_config(cfg: &RecoveryConfig) -> Option<Self> {
        cfg.detect_tool_calls_as_text.then(|| ToolTextScan {
            messages: cfg.tool_call_scan_messages,
            template: cfg.tool_call_as_text_message.clone(),
        })
    }
}

/// How the delivery ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    Sent {
        text: String,
        todos: Vec<Todo>,
        /// Held back by a rate limit this long before it went out.
        waited_ms: u64,
        /// The specialised prompt was sent because of this.
        tool_call_as_text: Option<TextualToolCall>,
    },
    /// Not sent, for this reason (fresh facts contradicted the decision).
    Skipped {
        reason: &'static str,
        todos: Vec<Todo>,
    },
    Failed {
        error: EngineError,
    },
    /// The guard held it back (a duplicate, over a rate limit, another instance's session).
    Guarded {
        reason: String,
        todos: Vec<Todo>,
        /// Over a rate limit after waiting `guard.max_wait`: deferred, try again after
        /// this long (`None`: not to be retried — a duplicate, another instance's session).
        retry_after_ms: Option<u64>,
    },
}

impl Delivery {
    /// The todo list the delivery saw, if it read one.
    pub fn todos(&self) -> Option<&[Todo]> {
        match self {
            Delivery::Sent { todos, .. } | Delivery::Skipped { todos, .. } | Delivery::Guarded { todos, .. } => {
                Some(todos)
            }
            Delivery::Failed { .. } => None,
        }
    }
}

/// One step of a hand-off to run, decided by the core.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffOrder {
    /// The hand-off id (and its snapshot's).
    pub id: String,
    pub server: String,
    pub session_id: String,
    pub directory: Option<String>,
    pub mode: HandoffMode,
    /// The step to run.
    pub step: Phase,
    /// Abort the running turn before persisting.
    pub abort_first: bool,
    pub known_todos: Vec<Todo>,
    pub known_turn: Option<TurnSettings>,
    pub children: Vec<String>,
    pub context: (Option<u64>, Option<u64>),
    /// The fresh session, once known (resuming).
    pub target: Option<String>,
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StepReport {
    /// The snapshot is stored (`reused`: it was already); `readable`: the `.md` file.
    Persisted { reused: bool, readable: Option<String>, chars: usize, model_account: bool },
    /// The target session holds the continuation (`created`: it was made now).
    HandedOver { target: String, created: bool },
    /// The resume prompt is in the target session.
    Resumed { target: String },
    /// The step could not be done; nothing after it was attempted.
    Failed { step: Phase, error: String },
}

/// An open intent to finish, with the prompt to send if it turns out to be missing.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishOrder {
    pub intent: Intent,
    /// Built by the core from what it knows now, under the intent's decision id; `None`:
    /// verify only (a person's prompt).
    pub prompt: Option<PromptOrder>,
    /// How many of the session's latest messages to read.
    pub messages: u32,
}

/// How the resumption ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishReport {
    /// The session carries the prompt: it arrived before the crash.
    Delivered,
    /// The missing prompt was sent now (or the delivery says why not).
    Sent(Delivery),
    /// Nothing to do any more, and why.
    Moot(&'static str),
    /// The server no longer knows the session.
    Gone,
    /// Another Shepherd instance holds the session's lease.
    NotOurs(String),
    /// The session could not be read; the intent stays open for the next attempt.
    Unreadable(EngineError),
}

/// The suffix of a retry's decision id (`{decision}~retry`).
pub const RETRY: &str = "~retry";

/// Whether two decision ids name the same action: one is the other's retry. While a
/// finish runs under the first id, the ledger's open intent may already be the retry's
/// (written before its send): a second finish of that intent, started meanwhile, would
/// read the session before the retry landed and send it again.
pub fn same_action(a: &str, b: &str) -> bool {
    let base = |d: &str| d.find(RETRY).map_or(d, |at| &d[..at]).len();
    let (la, lb) = (base(a), base(b));
    la == lb && a[..la] == b[..lb]
}

/// The continue a recovery sends after its abort: the planning continue for a planning
/// session, else the todo continue (the plain one when no todo is open).
pub fn continue_order(cfg: &RecoveryConfig, order: &RecoveryOrder, directory: Option<String>) -> PromptOrder {
    PromptOrder {
        session_id: order.session_id.clone(),
        directory,
        kind: PromptKind::Continue,
        template: if order.planning {
            cfg.continue_with_plan_message.clone()
        } else {
            cfg.continue_with_todos_message.clone()
        },
        template_without_open_todos: (!order.planning).then(|| cfg.continue_message.clone()),
        facts: PromptFacts {
            attempts: order.attempt,
            max_attempts: cfg.max_auto_submits,
            context_summary: String::new(),
        },
        known_todos: order.known_todos.clone(),
        known_turn: order.known_turn.clone(),
        require_idle: false,
        require_open_todos: false,
        decision: order.decision.clone(),
        not_before_ms: Some(order.decided_ms),
        tool_text_scan: ToolTextScan::from_config(cfg),
        model: None,
    }
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
    /// Ask the advisor; its answer goes to [`SessionCore::on_advice`](crate::session::SessionCore::on_advice).
    Advise(AdviceRequest),
    /// Finish an action a crash left open (its intent); the report goes to
    /// [`SessionCore::on_unfinished_done`](crate::session::SessionCore::on_unfinished_done).
    Finish(FinishOrder),
    /// Read this session's open intents from the ledger and hand them to
    /// [`SessionCore::on_open_intents`](crate::session::SessionCore::on_open_intents) (a request that may have arrived is verified).
    FindIntents,
    /// Tell the server's provider breaker, or ask it (its answer goes to
    /// [`SessionCore::on_breaker_permit`](crate::session::SessionCore::on_breaker_permit)).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_is_the_same_action_as_the_first_attempt_and_its_own_retries() {
        assert!(same_action("ses_a-1000", "ses_a-1000~retry"));
        assert!(same_action("ses_a-1000~retry~retry", "ses_a-1000"));
        assert!(same_action("ses_a-1000~retry", "ses_a-1000~retry"));
        assert!(!same_action("ses_a-1000", "ses_a-1001~retry"));
        assert!(!same_action("ses_a-100", "ses_a-1000"));
    }
}
