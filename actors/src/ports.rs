//! The ports: what the actors and procedures need from the world, as traits.
//!
//! [`Engine`] is one OpenCode server as Shepherd uses it (the HTTP adapter in the binary
//! implements it; tests use fakes). [`Clock`] is time: monotonic instants from tokio (so
//! paused test time governs them) and wall-clock epoch milliseconds for comparing with
//! OpenCode's own timestamps. The values that cross these ports ([`EngineError`],
//! [`HistoryMessage`], [`ChatRequest`], …) are `shepherd_core::ports`'s, re-exported here.

pub use shepherd_core::ports::*;

use std::collections::HashMap;

use async_trait::async_trait;

use crate::event::{ModelRef, SessionInfo, ShepherdSessionMark, Status, Todo};

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

/// The advisor's model: an OpenAI-compatible chat-completions endpoint (the adapter in
/// the binary), or a fake in tests. Timeouts are the caller's (the advisor actor).
#[async_trait]
pub trait ModelPort: Send + Sync + 'static {
    /// The text of the model's answer.
    async fn complete(&self, request: &ChatRequest) -> Result<String, ModelError>;
}
