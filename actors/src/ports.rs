//! The ports: what the decision cores and actors need from the world, as traits.
//!
//! [`Engine`] is one OpenCode server as Shepherd uses it (the HTTP adapter in the binary
//! implements it; tests use fakes). [`Clock`] is time: monotonic instants from tokio (so
//! paused test time governs them) and wall-clock epoch milliseconds for comparing with
//! OpenCode's own timestamps.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Serialize;

use crate::event::{ModelRef, Role, SessionInfo, ShepherdSessionMark, ShepherdTag, Status, Todo, ToolStatus};

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

/// A session's latest messages (oldest first) and its last turn's settings, from one
/// read ([`Engine::recent`]).
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

/// The session's working directory as Shepherd can see it (read-only).
#[async_trait]
pub trait Workspace: Send + Sync + 'static {
    /// The repository state of `directory`, or `None` when it is not a local git checkout.
    async fn repo_state(&self, directory: &str) -> Option<RepoState>;
}

/// A workspace Shepherd cannot see (another machine's sessions, tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWorkspace;

#[async_trait]
impl Workspace for NoWorkspace {
    async fn repo_state(&self, _: &str) -> Option<RepoState> {
        None
    }
}

/// How the session's latest assistant turn ended, read from history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastTurn {
    pub message_id: String,
    /// `time.completed` is set.
    pub completed: bool,
    /// The message carries an error.
    pub errored: bool,
    /// A `task` tool part in it is still `running`.
    pub running_task: bool,
}

impl LastTurn {
    /// Cut off mid-flight (a server restart leaves exactly this behind).
    pub fn interrupted(&self) -> bool {
        (!self.completed && !self.errored) || self.running_task
    }
}

/// One OpenCode server, as the cores need it.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// The non-idle sessions of one directory (`GET /session/status`); absent = idle.
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError>;
    /// One session's entry of its directory's status map (`None`: idle). A recovery
    /// needs only this; the HTTP adapter reads the map without building it and shares
    /// one request among concurrent readers of a directory (10,000 sessions stalling
    /// together), so override it where that matters.
    async fn status(&self, directory: &str, session_id: &str) -> Result<Option<Status>, EngineError> {
        Ok(self.statuses(directory).await?.remove(session_id))
    }
    /// Sessions across all directories, newest first, at most `limit`.
    async fn list_sessions(&self, limit: u32) -> Result<Vec<SessionInfo>, EngineError>;
    /// One session's description.
    async fn session(&self, session_id: &str) -> Result<SessionInfo, EngineError>;
    /// `POST /session/{id}/abort`.
    async fn abort(&self, session_id: &str) -> Result<(), EngineError>;
    /// The session's current todo list.
    async fn todos(&self, session_id: &str) -> Result<Vec<Todo>, EngineError>;
    /// Agent and model of the session's last user message, read from its history.
    async fn last_turn_settings(&self, session_id: &str) -> Result<TurnSettings, EngineError>;
    /// The session's latest `limit` messages and its last turn's settings — what a
    /// prompt's delivery reads — from one request where the engine can (the HTTP
    /// adapter does: one `GET /session/{id}/message` instead of three per prompt).
    /// The default reads [`Engine::history`], then [`Engine::last_turn_settings`]
    /// (its failure leaves the settings empty).
    async fn recent(&self, session_id: &str, limit: u32) -> Result<Recent, EngineError> {
        let messages = self.history(session_id, limit).await?;
        let turn = self.last_turn_settings(session_id).await.unwrap_or_default();
        Ok(Recent { messages, turn })
    }
    /// The latest assistant message of the session, if any.
    async fn last_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError>;
    /// `POST /session/{id}/summarize` with the session's own model; returns when the
    /// compaction finished (OpenCode queues it behind a busy turn).
    async fn summarize(&self, session_id: &str, model: &ModelRef) -> Result<(), EngineError>;
    /// Context windows of the configured models (`GET /config/providers`), keyed
    /// `provider/model`.
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError>;
    /// `POST /session/{id}/prompt_async` with one synthetic, tagged text part.
    /// [`EngineError::Unconfirmed`] when it may have arrived anyway.
    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError>;

    // What a hand-off needs. Engines that cannot hand off answer with an error, and the
    // hand-off fails cleanly (the session is left as it was).

    /// The latest `limit` messages of a session, oldest first.
    async fn history(&self, session_id: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        let _ = (session_id, limit);
        Err(unsupported("history"))
    }
    /// `POST /session` in `directory` with a title and Shepherd's mark.
    async fn create_session(
        &self,
        directory: Option<&str>,
        title: &str,
        mark: &ShepherdSessionMark,
    ) -> Result<SessionInfo, EngineError> {
        let _ = (directory, title, mark);
        Err(unsupported("create_session"))
    }
    /// Sessions of `directory` whose title contains `title_part` (`GET /session?search=`).
    async fn find_sessions(&self, directory: Option<&str>, title_part: &str) -> Result<Vec<SessionInfo>, EngineError> {
        let _ = (directory, title_part);
        Err(unsupported("find_sessions"))
    }
    /// `POST /session/{id}/fork`: a copy of the session to ask questions in.
    async fn fork(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let _ = session_id;
        Err(unsupported("fork"))
    }
    /// `POST /session/{id}/message` (waits for the turn): the reply's text.
    async fn ask(&self, session_id: &str, prompt: &Prompt) -> Result<String, EngineError> {
        let _ = (session_id, prompt);
        Err(unsupported("ask"))
    }
    /// `DELETE /session/{id}`.
    async fn delete_session(&self, session_id: &str) -> Result<(), EngineError> {
        let _ = session_id;
        Err(unsupported("delete_session"))
    }
}

fn unsupported(what: &str) -> EngineError {
    EngineError::Http { status: 501, body: format!("{what} is not supported by this engine") }
}

/// Time, injectable. Monotonic time is tokio's so `tokio::time::pause()` controls it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> tokio::time::Instant;
    /// Wall-clock epoch milliseconds (OpenCode's timestamps are in this unit).
    fn wall_ms(&self) -> i64;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now()
    }

    fn wall_ms(&self) -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
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

/// The advisor's model: an OpenAI-compatible chat-completions endpoint (the adapter in
/// the binary), or a fake in tests. Timeouts are the caller's (the advisor actor).
#[async_trait]
pub trait ModelPort: Send + Sync + 'static {
    /// The text of the model's answer.
    async fn complete(&self, request: &ChatRequest) -> Result<String, ModelError>;
}
