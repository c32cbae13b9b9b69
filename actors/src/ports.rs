//! The ports: what the decision cores and actors need from the world, as traits.
//!
//! [`Engine`] is one OpenCode server as Shepherd uses it (the HTTP adapter in the binary
//! implements it; tests use fakes). [`Clock`] is time: monotonic instants from tokio (so
//! paused test time governs them) and wall-clock epoch milliseconds for comparing with
//! OpenCode's own timestamps.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Serialize;

use crate::event::{ModelRef, SessionInfo, ShepherdTag, Status, Todo};

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
}

/// The agent and model of a turn: every prompt Shepherd sends repeats those of the
/// session's last user message, or OpenCode would switch to its default agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TurnSettings {
    pub agent: Option<String>,
    pub model: Option<ModelRef>,
}

/// A prompt Shepherd sends: one synthetic text part tagged as ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    pub tag: ShepherdTag,
    pub turn: TurnSettings,
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
    /// The latest assistant message of the session, if any.
    async fn last_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError>;
    /// `POST /session/{id}/summarize` with the session's own model; returns when the
    /// compaction finished (OpenCode queues it behind a busy turn).
    async fn summarize(&self, session_id: &str, model: &ModelRef) -> Result<(), EngineError>;
    /// Context windows of the configured models (`GET /config/providers`), keyed
    /// `provider/model`.
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError>;
    /// `POST /session/{id}/prompt_async` with one synthetic, tagged text part.
    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError>;
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
