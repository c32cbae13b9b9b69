//! The ports: what the actors and procedures need from the world, as traits.
//!
//! One OpenCode server is four ports, split by what their users need of it, so that
//! each procedure names only what it does to a server (and a fake implements only
//! that):
//! - [`Reads`]: a session's state — its status, description, todos, messages and last
//!   turn. Every procedure reads before it acts (never on a guess), so nearly all take
//!   it; the session actor reads todos and the last turn itself.
//! - [`Control`]: acting on a session — abort a turn, send a prompt, compact it, ask it
//!   a question and wait for the reply. Only what changes a session's course: recovery,
//!   delivery, compaction and the hand-off.
//! - [`Lifecycle`]: making and removing sessions — create, fork, find by title, delete.
//!   The hand-off alone does this (its fresh session, the fork it asks the model in);
//!   an engine that cannot hand off keeps its default bodies (an error each), and the
//!   hand-off fails cleanly.
//! - [`Discovery`]: what the server holds as a whole — its sessions across directories
//!   and its models' context windows. The supervisor's reconciliation alone reads it.
//!
//! [`Engine`] is all four: the whole server, held where a server is attached (the
//! supervisor, the sessions' shared environment) and served whole by the HTTP adapter
//! in the binary; tests fake what they use. [`Clock`] is time: monotonic
//! instants from tokio (so paused test time governs them) and wall-clock epoch
//! milliseconds for comparing with OpenCode's own timestamps. The values that cross
//! these ports ([`EngineError`], [`HistoryMessage`], [`ChatRequest`], …) are
//! `shepherd_core::ports`'s, re-exported here.

pub use shepherd_core::ports::*;

use std::collections::HashMap;

use async_trait::async_trait;

use crate::event::{Event, ModelRef, SessionInfo, ShepherdSessionMark, Status, Todo};

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

/// One OpenCode server as a whole: every port it serves. Held where a server is
/// attached (the supervisor, [`crate::session::SessionEnv`]); procedures take the ports
/// they use. Implemented for anything that serves all four.
pub trait Engine: Reads + Control + Lifecycle + Discovery {}

impl<T: Reads + Control + Lifecycle + Discovery> Engine for T {}

/// Reading a session's state: what a procedure checks before it acts, and what a
/// prompt is rendered from.
#[async_trait]
pub trait Reads: Send + Sync + 'static {
    /// The non-idle sessions of one directory (`GET /session/status`); absent = idle.
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError>;
    /// One session's entry of its directory's status map (`None`: idle). A recovery
    /// needs only this; the HTTP adapter reads the map without building it and shares
    /// one request among concurrent readers of a directory (10,000 sessions stalling
    /// together), so override it where that matters.
    async fn status(&self, directory: &str, session_id: &str) -> Result<Option<Status>, EngineError> {
        Ok(self.statuses(directory).await?.remove(session_id))
    }
    /// One session's description.
    async fn session(&self, session_id: &str) -> Result<SessionInfo, EngineError>;
    /// The session's current todo list.
    async fn todos(&self, session_id: &str) -> Result<Vec<Todo>, EngineError>;
    /// Agent and model of the session's last user message, read from its history.
    async fn last_turn_settings(&self, session_id: &str) -> Result<TurnSettings, EngineError>;
    /// The session's latest `limit` messages and its last turn's settings — what a
    /// prompt's delivery reads — from one request where the engine can (the HTTP
    /// adapter does: one `GET /session/{id}/message` instead of three per prompt).
    /// The default reads [`Reads::history`], then [`Reads::last_turn_settings`]
    /// (its failure leaves the settings empty).
    async fn recent(&self, session_id: &str, limit: u32) -> Result<Recent, EngineError> {
        let messages = self.history(session_id, limit).await?;
        let turn = self.last_turn_settings(session_id).await.unwrap_or_default();
        Ok(Recent { messages, turn })
    }
    /// The latest assistant message of the session, if any.
    async fn last_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError>;
    /// The same, read cheaply where the engine can: what every connect reads of each
    /// busy session (its running tools) and of each that ended a turn unseen (its reply)
    /// — at 10,000 busy sessions, 10,000 reads. The HTTP adapter reads the newest two
    /// messages (the turn, and a prompt queued behind it) instead of
    /// [`Reads::last_turn`]'s thirty; an older turn is not found (`None`).
    async fn latest_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError> {
        self.last_turn(session_id).await
    }
    /// The latest `limit` messages of a session, oldest first. What a hand-off, the
    /// guard's comparison and the advisor read; an engine without it answers with an
    /// error (the hand-off then fails cleanly, the session left as it was).
    async fn history(&self, session_id: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        let _ = (session_id, limit);
        Err(unsupported("history"))
    }
}

/// Acting on a session: what changes its course, kept apart from reading it so that
/// what may only look (the advisor, the actor's own reads) cannot act.
#[async_trait]
pub trait Control: Send + Sync + 'static {
    /// `POST /session/{id}/abort`.
    async fn abort(&self, session_id: &str) -> Result<(), EngineError>;
    /// `POST /session/{id}/prompt_async` with one synthetic, tagged text part.
    /// [`EngineError::Unconfirmed`] when it may have arrived anyway.
    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError>;
    /// `POST /session/{id}/summarize` with the session's own model; returns when the
    /// compaction finished (OpenCode queues it behind a busy turn).
    async fn summarize(&self, session_id: &str, model: &ModelRef) -> Result<(), EngineError>;
    /// `POST /session/{id}/message` (waits for the turn): the reply's text. The
    /// hand-off asks it in a fork; an engine without it answers with an error.
    async fn ask(&self, session_id: &str, prompt: &Prompt) -> Result<String, EngineError> {
        let _ = (session_id, prompt);
        Err(unsupported("ask"))
    }
}

/// Making and removing sessions: what a hand-off needs (the fresh session it continues
/// in, found again after a crash; the fork it asks the model in). Engines that cannot
/// hand off answer with an error, and the hand-off fails cleanly (the session is left
/// as it was).
#[async_trait]
pub trait Lifecycle: Send + Sync + 'static {
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
    /// `DELETE /session/{id}`.
    async fn delete_session(&self, session_id: &str) -> Result<(), EngineError> {
        let _ = session_id;
        Err(unsupported("delete_session"))
    }
}

/// What a server holds as a whole, not one session's state: the reconciliation after
/// every (re)connect lists it, since the stream replays nothing.
#[async_trait]
pub trait Discovery: Send + Sync + 'static {
    /// Sessions across all directories, newest first, at most `limit`.
    async fn list_sessions(&self, limit: u32) -> Result<Vec<SessionInfo>, EngineError>;
    /// Context windows of the configured models (`GET /config/providers`), keyed
    /// `provider/model`.
    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError>;
    /// What the sessions of `directory` wait on the person for — its pending questions
    /// and permission requests (`GET /question`, `GET /permission`) — as the events that
    /// asked them: a reconnect finds the asks whose events it missed (a session waiting
    /// on the person is busy and silent by design, never stalled).
    async fn pending_asks(&self, directory: &str) -> Result<Vec<Event>, EngineError>;
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
