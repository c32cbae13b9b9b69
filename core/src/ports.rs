//! The values that cross the ports: what the cores order from the world and what it
//! answers (errors, history, repository state, chat requests). The traits themselves
//! (an OpenCode server's `Reads`, `Control`, `Lifecycle` and `Discovery`, all four
//! `Engine`; `Clock`, `ModelPort`, `Workspace`) live in `shepherd-actors::ports`, beside
//! the procedures that call them; nothing here does I/O.

use serde::Serialize;

use crate::event::{Event, MessageInfo, ModelRef, Role, ShepherdTag, ToolStatus};

/// What went wrong talking to OpenCode. Callers branch on the kind: a session that no
/// longer exists is not retried, an unreachable server is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("session not found: {0}")]
    NotFound(String),
    #[error("server unreachable: {0}")]
    Unreachable(String),
    #[error("server answered {status}: {body}")]
    Http { status: u16, body: String },
    #[error("unexpected response: {0}")]
    Decode(String),
    /// The request was sent but its answer never came (timed out, or the connection
    /// broke after sending): it may have been carried out. A prompt in this state is
    /// looked for in the session's messages, never simply sent again.
    #[error("sent, but no answer (it may have arrived): {0}")]
    Unconfirmed(String),
}

/// The agent and model of a turn: every prompt Shepherd sends repeats those of the
/// session's last user message, or OpenCode would switch to its default agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TurnSettings {
    pub agent: Option<String>,
    pub model: Option<ModelRef>,
}

impl TurnSettings {
    /// These settings as read from the session, or `known` (from its events) when the
    /// read named neither agent nor model.
    pub fn or_known(self, known: Option<&TurnSettings>) -> TurnSettings {
        if self.agent.is_some() || self.model.is_some() {
            self
        } else {
            known.cloned().unwrap_or_default()
        }
    }
}

/// A session's latest messages (oldest first) and its last turn's settings, from one
/// read (the `Reads` port's `recent`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recent {
    pub messages: Vec<HistoryMessage>,
    pub turn: TurnSettings,
}

impl Recent {
    /// The newest `n` of the messages.
    pub fn last(&self, n: u32) -> &[HistoryMessage] {
        &self.messages[self.messages.len().saturating_sub(n as usize)..]
    }
}

/// A prompt Shepherd sends: one synthetic text part tagged as ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tag: ShepherdTag,
    pub turn: TurnSettings,
    /// Store the message without a model call (`noReply`): a note for the next turn.
    pub no_reply: bool,
}

/// One message of a session's history, as a hand-off's continuation needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryMessage {
    pub id: String,
    pub role: Role,
    /// `time.created`, epoch ms.
    pub created_ms: Option<i64>,
    pub agent: Option<String>,
    /// The message's error name, if it ended with one.
    pub error: Option<String>,
    /// A compaction summary written by OpenCode.
    pub summary: bool,
    pub parts: Vec<HistoryPart>,
}

/// One part of a [`HistoryMessage`].
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryPart {
    Text {
        text: String,
        synthetic: bool,
        ignored: bool,
        shepherd: Option<ShepherdTag>,
    },
    Reasoning {
        text: String,
    },
    Tool {
        tool: String,
        status: ToolStatus,
        input: serde_json::Value,
        error: Option<String>,
        child_session: Option<String>,
    },
}

impl HistoryMessage {
    /// A message the person wrote: a user message with a text part that is neither
    /// synthetic, ignored nor Shepherd's.
    pub fn is_from_person(&self) -> bool {
        self.role == Role::User
            && self.parts.iter().any(|p| {
                matches!(p, HistoryPart::Text { synthetic: false, ignored: false, shepherd: None, text } if !text.trim().is_empty())
            })
    }

    /// The text parts joined (what the person or model wrote).
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                HistoryPart::Text { text, ignored: false, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }
}

/// The state of a session's repository, read (never changed) by local `git`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoState {
    pub branch: Option<String>,
    pub head: Option<String>,
    /// `git status --porcelain` lines, at most the adapter's bound, Markdown-safe.
    pub dirty: Vec<String>,
    /// Uncommitted entries past the bound: counted, not kept.
    pub dirty_omitted: usize,
    /// Git's output was cut short (past the adapter's byte bound): there are more
    /// uncommitted entries than `dirty` and `dirty_omitted` say.
    pub dirty_truncated: bool,
}

/// How the session's latest assistant turn ended, read from history.
#[derive(Debug, Clone, PartialEq)]
pub struct LastTurn {
    pub message_id: String,
    /// `time.completed` is set.
    pub completed: bool,
    /// The message carries an error.
    pub errored: bool,
    /// A `task` tool part in it is still `running`.
    pub running_task: bool,
    /// The message itself, as its `message.updated` event would have said it: a turn
    /// that ended while the stream was down is taken in from here (its finish or error
    /// decides what follows it).
    pub reply: Option<Box<MessageInfo>>,
    /// Its tool parts still running, as the `message.part.updated` events that said so:
    /// after a restart or an outage, a busy session's long tool gets its grace.
    pub running: Vec<Event>,
}

impl LastTurn {
    /// Cut off mid-flight (a server restart leaves exactly this behind).
    pub fn interrupted(&self) -> bool {
        (!self.completed && !self.errored) || self.running_task
    }
}

/// One chat-completions request to the advisor's model.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub system: String,
    pub user: String,
    pub max_tokens: u32,
    pub temperature: f64,
}

/// What went wrong asking the model. The text never carries the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("model unreachable: {0}")]
    Unreachable(String),
    #[error("model answered HTTP {status}")]
    Http { status: u16 },
    #[error("model answer not understood: {0}")]
    Decode(String),
}

/// A request that failed this way may still have reached OpenCode (a timeout, a
/// connection lost after sending, a server error: OpenCode may have stored the message
/// before failing, a proxy may have passed it on): only the session can say whether it
/// did. Its intent stays open and the session is read later, so the action is neither
/// dropped (a 503 is not a "no") nor sent twice.
pub fn may_have_arrived(error: &EngineError) -> bool {
    match error {
        EngineError::Unreachable(_) | EngineError::Unconfirmed(_) => true,
        // 501 is an engine that does not do this at all (`ports::unsupported`).
        EngineError::Http { status, .. } => *status >= 500 && *status != 501,
        EngineError::NotFound(_) | EngineError::Decode(_) => false,
    }
}
