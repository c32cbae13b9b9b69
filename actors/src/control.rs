//! What the control API may ask of the supervisor, as actor messages.
//!
//! The HTTP layer (`src/control/` in the binary) authenticates, parses and maps these to
//! status codes; the supervisor answers them. Custom prompts go through the same
//! prompt path as every prompt Shepherd sends (so later guards apply to them too).

use actix::Message;
use serde::{Deserialize, Serialize};

use crate::event::Todo;
use crate::journal::{ActionRecord, LastAction};

impl SessionDetail {
    /// The detail as it may leave Shepherd: title and todos redacted. Session actors
    /// answer raw; the thread that sends it out (control API, status writer) redacts.
    pub fn redacted(mut self, r: &crate::redact::Redactor) -> Self {
        if let Some(title) = self.title.as_mut() {
            r.redact_in_place(title);
        }
        for todo in &mut self.todos {
            r.redact_in_place(&mut todo.content);
        }
        self
    }
}

/// What Shepherd knows about one session, and what it last did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionDetail {
    pub server: String,
    pub id: String,
    /// The session's title, when the server gave one.
    pub title: Option<String>,
    pub directory: Option<String>,
    pub busy: bool,
    /// A question or permission is open, or the last reply asks the person something.
    pub waiting_on_person: bool,
    /// Epoch ms of the session's last activity, or of the moment its server's event
    /// stream came back after an outage if that is later (what the stall timer counts from).
    pub last_activity_ms: i64,
    /// The stall timeout in force while the stall timer runs (busy, not paused,
    /// recovering, compacting, handed off, waiting on a person, or unseen while its
    /// server's event stream is down), ms.
    pub stall_timeout_ms: Option<u64>,
    pub recovering: bool,
    /// `user_abort` or `gave_up` when automation is off for this session.
    pub paused: Option<String>,
    pub attempts: u32,
    pub todos: Vec<Todo>,
    /// Prompt size of the latest model call, the model's window, and the share in %.
    pub context_tokens: Option<u64>,
    pub context_window: Option<u64>,
    pub context_percent: Option<f64>,
    pub compacting: bool,
    pub last_action: Option<LastAction>,
    pub handoff: HandoffView,
}

impl SessionDetail {
    /// A session as first seen: idle, nothing known about it yet (the base test
    /// fixtures and views start from).
    pub fn new(server: &str, id: &str) -> SessionDetail {
        SessionDetail {
            server: server.into(),
            id: id.into(),
            title: None,
            directory: None,
            busy: false,
            waiting_on_person: false,
            last_activity_ms: 0,
            stall_timeout_ms: None,
            recovering: false,
            paused: None,
            attempts: 0,
            todos: vec![],
            context_tokens: None,
            context_window: None,
            context_percent: None,
            compacting: false,
            last_action: None,
            handoff: HandoffView { phase: "monitoring".into(), ..HandoffView::default() },
        }
    }
}

/// Where a session's hand-off stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HandoffView {
    /// `monitoring`, `preparing`, `ready`, `persisting`, `handing_over`, `resuming`,
    /// `completed`, `failed` or `awaiting_manual`.
    pub phase: String,
    /// The hand-off (and snapshot) id.
    pub id: Option<String>,
    /// The fresh session the work moved to.
    pub new_session: Option<String>,
    /// This session continues the work of that one.
    pub from: Option<String>,
    pub reason: Option<String>,
}

/// Hand a session over to a fresh one now (`POST /v1/sessions/{id}/handoff`).
#[derive(Message)]
#[rtype(result = "Result<HandoffView, ControlError>")]
pub struct StartHandoff(pub String);

/// What a pause or a resume is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseTarget {
    Session(String),
    Fleet,
}

/// Pause (`pause: true`) or resume Shepherd for one session or the whole fleet
/// (`shepherd pause|resume`, `POST /v1/sessions/{id}/pause|resume`, `POST /v1/pause|resume`).
#[derive(Message)]
#[rtype(result = "Result<PauseView, ControlError>")]
pub struct SetPause {
    pub target: PauseTarget,
    pub pause: bool,
    /// Epoch ms; `None`: until resumed. Only with `pause`.
    pub until_ms: Option<i64>,
    /// Who asked (journaled): `cli`, `control API`, …
    pub by: String,
}

/// Where a pause stands after a [`SetPause`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseView {
    /// The session; `None` for the fleet.
    pub session: Option<String>,
    /// Why automation is off now (`person`, `fleet`, `user_abort`, `gave_up`); `None`: on.
    pub paused: Option<String>,
    /// When a timed pause ends (epoch ms).
    pub until_ms: Option<i64>,
}

/// Restore a stored snapshot into a fresh session (`POST /v1/handoffs/{id}/resume`).
#[derive(Message)]
#[rtype(result = "Result<HandoffView, ControlError>")]
pub struct ResumeHandoff(pub String);

/// `POST /v1/sessions/{id}/prompt` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomPromptRequest {
    /// The text to send; template variables (`{pending}`, `{total}`, `{completed}`,
    /// `{todoList}`, `{attempts}`, `{maxAttempts}`, `{contextSummary}`) are rendered.
    #[serde(default)]
    pub message: Option<String>,
    /// A template used instead of `message` when given (same variables).
    #[serde(default)]
    pub custom_prompt: Option<String>,
    /// Append the open todos to the text.
    #[serde(default)]
    pub include_todo_context: bool,
    /// Append a short summary of the session's state to the text.
    #[serde(default)]
    pub include_context_summary: bool,
}

/// The answer to a custom prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CustomPromptReply {
    pub success: bool,
    /// The text as sent (rendered).
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub todos: Option<Vec<Todo>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_summary: Option<String>,
    /// Why it was not sent, when `success` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Why a control request could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("unknown session: {0}")]
    UnknownSession(String),
    #[error("{field}: {reason}")]
    BadRequest { field: String, reason: String },
    #[error("shepherd is shutting down")]
    ShuttingDown,
    /// The request conflicts with what is under way (e.g. a hand-off already running).
    #[error("{0}")]
    Conflict(String),
    #[error("unknown hand-off snapshot: {0}")]
    UnknownSnapshot(String),
    /// The ledger could not be read.
    #[error("{0}")]
    Unavailable(String),
}

/// Every tracked session.
#[derive(Message)]
#[rtype(result = "Vec<SessionDetail>")]
pub struct ListSessions;

/// One session (tracked, or known to a supervised server).
#[derive(Message)]
#[rtype(result = "Result<SessionDetail, ControlError>")]
pub struct GetSession(pub String);

/// Send a person's or a tool's prompt to a session.
#[derive(Message)]
#[rtype(result = "Result<CustomPromptReply, ControlError>")]
pub struct SendCustomPrompt {
    pub session: String,
    pub request: CustomPromptRequest,
}

/// A session's journal from the ledger, oldest first, at most `limit` newest records
/// (`GET /v1/sessions/{id}/history`; the same records `shepherd history` prints).
#[derive(Message)]
#[rtype(result = "Result<Vec<ActionRecord>, ControlError>")]
pub struct SessionJournal {
    pub session: String,
    pub limit: u32,
}
