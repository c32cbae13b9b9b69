//! The REST side of one OpenCode server: the [`Engine`] port over HTTP.
//!
//! One `reqwest` client with a total timeout per request (the event stream has its own
//! client, see `pump`). HTTP Basic auth when the server has a password. Every answer is
//! mapped to an [`EngineError`] kind the cores can branch on; bodies in errors are
//! truncated so a huge error page does not flood the log.
//!
//! `GET /session/status` is the one call a fleet makes in bursts (every recovery reads
//! it, twice, and at 10,000 sessions a directory's map holds ~1,000 entries): reads of
//! one directory are coalesced ([`StatusReads`]) and a single session's entry is found
//! without building the map ([`status_of`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;
use shepherd_actors::config::ServerConfig;
use shepherd_actors::event::{
    MessageInfo, ModelRef, Role, SessionInfo, ShepherdSessionMark, ShepherdTag, Status, Todo, ToolStatus,
};
use shepherd_actors::ids::{self, IdKind};
use shepherd_actors::ports::{Engine, EngineError, HistoryMessage, HistoryPart, LastTurn, Prompt, Recent, TurnSettings};

/// How many recent messages are read to find the last user turn's agent and model.
const TURN_LOOKBACK_MESSAGES: u32 = 30;
/// Error bodies are cut to this many characters in errors and logs.
const ERROR_BODY_CHARS: usize = 300;
/// Of an error answer, at most this many bytes are read.
const ERROR_BODY_BYTES: usize = 4 * 1024;

/// Credentials for one server (the password comes from the environment, never a file).
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"***").finish()
    }
}

/// REST client of one OpenCode server.
#[derive(Debug, Clone)]
pub struct OpenCodeClient {
    base: String,
    http: reqwest::Client,
    auth: Option<Credentials>,
    /// Per-request timeout (ms) of calls that block until OpenCode has done the work
    /// (`summarize`), instead of the server's `request_timeout`. Shared by clones, so a
    /// reload of `compaction.max_wait` reaches the engine the sessions hold.
    long_call_timeout_ms: Arc<std::sync::atomic::AtomicU64>,
    status_reads: Arc<StatusReads>,
    /// `servers[].max_response_bytes`: the largest answer read.
    max_response_bytes: usize,
    /// The counters of the pump that follows this server's events (its lag), once set.
    stream: Arc<std::sync::OnceLock<Arc<super::PumpStats>>>,
}

/// The body of one `GET /session/status` (shared by every reader it answers).
type StatusBody = Result<bytes::Bytes, EngineError>;

/// Coalesces `GET /session/status` reads per directory. A reader never gets an answer
/// to a request sent before it asked (a recovery must see the status *after* its
/// stall deadline): while a read is in flight, new readers wait for the next one,
/// which then answers all of them. So a directory has at most one read in flight, and
/// a burst of N concurrent readers costs about two requests, not N.
#[derive(Debug, Default)]
struct StatusReads {
    /// Directories with a read loop running → readers waiting for its next read.
    waiting: Mutex<HashMap<String, Vec<tokio::sync::oneshot::Sender<StatusBody>>>>,
}

impl OpenCodeClient {
    pub fn new(server: &ServerConfig, auth: Option<Credentials>) -> Result<Self, EngineError> {
        let http = reqwest::Client::builder()
            .timeout(server.request_timeout)
            .connect_timeout(server.request_timeout)
            .build()
            .map_err(|e| EngineError::Unreachable(format!("cannot build HTTP client: {e}")))?;
        Ok(Self {
            base: server.url.trim_end_matches('/').to_string(),
            http,
            auth,
            long_call_timeout_ms: Arc::new(server.request_timeout.as_millis().try_into().unwrap_or(u64::MAX).into()),
            status_reads: Arc::default(),
            max_response_bytes: server.max_response_bytes,
            stream: Arc::default(),
        })
    }

    /// The pump that follows this server's events: its lag is the engine's
    /// [`Engine::stream_lag`] (for this client and every clone of it).
    pub fn follow_stream(&self, stats: Arc<super::PumpStats>) {
        let _ = self.stream.set(stats);
    }

    /// Sets the timeout of calls that block until OpenCode finished (compaction).
    pub fn with_long_call_timeout(self, timeout: std::time::Duration) -> Self {
        self.set_long_call_timeout(timeout);
        self
    }

    /// Changes that timeout for this client and every clone of it (hot reload).
    pub fn set_long_call_timeout(&self, timeout: std::time::Duration) {
        let ms = timeout.as_millis().try_into().unwrap_or(u64::MAX);
        self.long_call_timeout_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn long_call_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.long_call_timeout_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub fn credentials(&self) -> Option<&Credentials> {
        self.auth.as_ref()
    }

    /// `POST /tui/show-toast` (a TUI attached to the server shows it; OpenCode answers
    /// `true` once it has published the toast). Not part of the [`Engine`] port: toasts
    /// are the edge's business ([`crate::toast`]), never a decision's.
    pub async fn show_toast(&self, directory: Option<&str>, toast: &crate::toast::Toast) -> Result<bool, EngineError> {
        let mut rb = self.request(Method::POST, "/tui/show-toast").json(toast);
        if let Some(d) = directory.filter(|d| !d.is_empty()) {
            rb = rb.query(&[("directory", d)]);
        }
        self.get_json(rb, "POST /tui/show-toast").await
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}{}", self.base, path));
        match &self.auth {
            Some(c) => rb.basic_auth(&c.username, Some(&c.password)),
            None => rb,
        }
    }

    async fn send(&self, rb: RequestBuilder, what: &str) -> Result<reqwest::Response, EngineError> {
        let resp = rb.send().await.map_err(|e| EngineError::Unreachable(format!("{what}: {e}")))?;
        Self::checked(resp, what).await
    }

    /// Like [`Self::send`], for a request that changes the session: a transport error
    /// after the connection was made (a timeout, a connection broken while waiting for
    /// the answer) may come after OpenCode acted on it — [`EngineError::Unconfirmed`].
    async fn send_effect(&self, rb: RequestBuilder, what: &str) -> Result<reqwest::Response, EngineError> {
        let resp = rb.send().await.map_err(|e| {
            if e.is_connect() || e.is_builder() {
                EngineError::Unreachable(format!("{what}: {e}"))
            } else {
                EngineError::Unconfirmed(format!("{what}: {e}"))
            }
        })?;
        Self::checked(resp, what).await
    }

    async fn checked(resp: reqwest::Response, what: &str) -> Result<reqwest::Response, EngineError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = read_prefix(resp, ERROR_BODY_BYTES).await;
        let body: String = String::from_utf8_lossy(&body).chars().take(ERROR_BODY_CHARS).collect();
        if status == StatusCode::NOT_FOUND {
            return Err(EngineError::NotFound(format!("{what}: {body}")));
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(EngineError::Http {
                status: 401,
                body: format!("{what}: unauthorized (check the server password)"),
            });
        }
        Err(EngineError::Http { status: status.as_u16(), body: format!("{what}: {body}") })
    }

    /// The session's last [`TURN_LOOKBACK_MESSAGES`] messages, oldest first.
    async fn recent_messages(&self, session_id: &str) -> Result<Vec<MessageWithParts>, EngineError> {
        self.messages(session_id, TURN_LOOKBACK_MESSAGES).await
    }

    /// The session's last `limit` messages, oldest first, as the server sent them.
    async fn messages(&self, session_id: &str, limit: u32) -> Result<Vec<MessageWithParts>, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "/message")?).query(&[("limit", limit)]);
        self.get_json(rb, "GET /session/{id}/message").await
    }

    /// The body of a `GET /session/status` for `directory` sent after this call began,
    /// possibly shared with other readers (see [`StatusReads`]).
    async fn status_body(&self, directory: &str) -> StatusBody {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start_loop = {
            let mut waiting = self.status_reads.waiting.lock().unwrap_or_else(|e| e.into_inner());
            match waiting.get_mut(directory) {
                Some(readers) => {
                    readers.push(tx);
                    false
                }
                None => {
                    waiting.insert(directory.to_string(), vec![tx]);
                    true
                }
            }
        };
        if start_loop {
            // Detached, so that no reader's cancellation strands the others.
            let (client, directory) = (self.clone(), directory.to_string());
            tokio::spawn(async move { client.status_read_loop(directory).await });
        }
        rx.await.unwrap_or_else(|_| Err(EngineError::Unreachable("GET /session/status: read abandoned".into())))
    }

    /// Reads until no reader waits: each round answers the readers that asked before
    /// it was sent.
    async fn status_read_loop(&self, directory: String) {
        loop {
            let readers = {
                let mut waiting = self.status_reads.waiting.lock().unwrap_or_else(|e| e.into_inner());
                match waiting.get_mut(&directory) {
                    Some(readers) if !readers.is_empty() => std::mem::take(readers),
                    _ => {
                        waiting.remove(&directory);
                        return;
                    }
                }
            };
            let mut rb = self.request(Method::GET, "/session/status");
            if !directory.is_empty() {
                rb = rb.query(&[("directory", directory.as_str())]);
            }
            let body = match self.send(rb, "GET /session/status").await {
                Ok(resp) => read_capped(resp, self.max_response_bytes, "GET /session/status").await,
                Err(e) => Err(e),
            };
            for reader in readers {
                let _ = reader.send(body.clone());
            }
        }
    }

    async fn get_json<T: DeserializeOwned>(&self, rb: RequestBuilder, what: &str) -> Result<T, EngineError> {
        let resp = self.send(rb, what).await?;
        self.read_json(resp, what).await
    }

    /// The answer's body (at most `max_response_bytes`), parsed.
    async fn read_json<T: DeserializeOwned>(&self, resp: reqwest::Response, what: &str) -> Result<T, EngineError> {
        let body = read_capped(resp, self.max_response_bytes, what).await?;
        serde_json::from_slice(&body).map_err(|e| EngineError::Decode(format!("{what}: {e}")))
    }
}

/// The body of `resp`, refused (never read whole) when it is longer than `max` bytes.
async fn read_capped(mut resp: reqwest::Response, max: usize, what: &str) -> Result<bytes::Bytes, EngineError> {
    let too_large = || {
        EngineError::Decode(format!(
            "{what}: the answer is larger than {max} bytes (servers[].max_response_bytes); refused"
        ))
    };
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| EngineError::Decode(format!("{what}: {e}")))? {
        if body.len() + chunk.len() > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The first `max` bytes or so of an error answer (the rest is not read).
async fn read_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(max - body.len())]),
            _ => break,
        }
    }
    body
}

/// `/session/ID` + `rest`, for a session id of OpenCode's shape only: an id that is not
/// (from a hostile server, or anything between) is refused before any request is made.
fn session_path(id: &str, rest: &str) -> Result<String, EngineError> {
    if let Err(bad) = ids::check(IdKind::Session, id) {
        tracing::warn!(error = %bad, "refusing to call OpenCode about a session whose id is not of OpenCode's shape");
        return Err(EngineError::NotFound(format!("{bad}: not sent to the server")));
    }
    Ok(format!("/session/{}{}", urlencode(id), rest))
}

/// Percent-encodes one path segment: everything but `[A-Za-z0-9_-]`, the dot included,
/// so that no `.` or `..` segment can be normalised away by the URL parser.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Keeps the sessions of an answer whose ids (and parents) are of OpenCode's shape; the
/// others are dropped with a warning.
fn valid_sessions(sessions: Vec<SessionInfo>, what: &str) -> Vec<SessionInfo> {
    sessions.into_iter().filter(|s| check_session(s, what).is_ok()).collect()
}

/// One session of an answer: its id and parent must be of OpenCode's shape.
fn check_session(s: &SessionInfo, what: &str) -> Result<(), EngineError> {
    let checked = ids::check(IdKind::Session, &s.id)
        .and_then(|()| s.parent_id.as_deref().map_or(Ok(()), |p| ids::check(IdKind::Session, p)));
    checked.map_err(|bad| {
        tracing::warn!(what, error = %bad, "dropping a session whose id is not of OpenCode's shape from a server's answer");
        EngineError::Decode(format!("{what}: {bad}"))
    })
}

/// A message's `error`, nothing else.
#[derive(Deserialize)]
struct ErrorOnly {
    #[serde(default)]
    error: Option<ErrorName>,
}

#[derive(Deserialize)]
struct ErrorName {
    name: String,
}

#[derive(Deserialize)]
struct MessageWithParts {
    /// Decoded only where needed ([`decode_message`]), straight from its text.
    info: Box<serde_json::value::RawValue>,
    #[serde(default)]
    parts: Vec<serde_json::Value>,
}

#[async_trait]
impl Engine for OpenCodeClient {
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError> {
        let body = self.status_body(directory).await?;
        let mut map: HashMap<String, Status> =
            serde_json::from_slice(&body).map_err(|e| EngineError::Decode(format!("GET /session/status: {e}")))?;
        map.retain(|id, _| match ids::check(IdKind::Session, id) {
            Ok(()) => true,
            Err(bad) => {
                tracing::warn!(error = %bad, "GET /session/status: dropping an entry whose id is not of OpenCode's shape");
                false
            }
        });
        Ok(map)
    }

    async fn status(&self, directory: &str, session_id: &str) -> Result<Option<Status>, EngineError> {
        let body = self.status_body(directory).await?;
        status_of(&body, session_id).map_err(|e| EngineError::Decode(format!("GET /session/status: {e}")))
    }

    /// All projects' sessions, newest first, following `x-next-cursor` pages until
    /// `limit` sessions or the last page.
    async fn list_sessions(&self, limit: u32) -> Result<Vec<SessionInfo>, EngineError> {
        let mut out: Vec<SessionInfo> = Vec::new();
        let mut cursor: Option<String> = None;
        while (out.len() as u32) < limit {
            let want = limit - out.len() as u32;
            let mut rb = self.request(Method::GET, "/experimental/session").query(&[("limit", want)]);
            if let Some(c) = &cursor {
                rb = rb.query(&[("cursor", c.as_str())]);
            }
            let resp = self.send(rb, "GET /experimental/session").await?;
            cursor = resp.headers().get("x-next-cursor").and_then(|v| v.to_str().ok()).map(str::to_string);
            let page: Vec<SessionInfo> = self.read_json(resp, "GET /experimental/session").await?;
            let last_page = page.is_empty() || cursor.is_none();
            out.extend(valid_sessions(page, "GET /experimental/session"));
            if last_page {
                break;
            }
        }
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn session(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "")?);
        let info: SessionInfo = self.get_json(rb, "GET /session/{id}").await?;
        check_session(&info, "GET /session/{id}")?;
        Ok(info)
    }

    async fn abort(&self, session_id: &str) -> Result<(), EngineError> {
        let rb = self.request(Method::POST, &session_path(session_id, "/abort")?);
        self.send(rb, "POST /session/{id}/abort").await.map(drop)
    }

    async fn todos(&self, session_id: &str) -> Result<Vec<Todo>, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "/todo")?);
        self.get_json(rb, "GET /session/{id}/todo").await
    }

    fn stream_lag(&self) -> Option<std::time::Duration> {
        self.stream.get().and_then(|stats| stats.lag())
    }

    async fn last_turn_settings(&self, session_id: &str) -> Result<TurnSettings, EngineError> {
        Ok(turn_settings(&self.recent_messages(session_id).await?))
    }

    /// One `GET /session/{id}/message` for both: enough messages for the turn's
    /// settings, the newest `limit` of them kept.
    async fn recent(&self, session_id: &str, limit: u32) -> Result<Recent, EngineError> {
        let messages = self.messages(session_id, limit.max(TURN_LOOKBACK_MESSAGES)).await?;
        let turn = turn_settings(&messages);
        let newest = &messages[messages.len().saturating_sub(limit as usize)..];
        Ok(Recent { messages: newest.iter().filter_map(history_message).collect(), turn })
    }

    async fn last_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError> {
        let messages = self.recent_messages(session_id).await?;
        for m in messages.iter().rev() {
            let Some(info) = decode_message(&m.info) else { continue };
            if info.role != Role::Assistant {
                continue;
            }
            let running_task = m.parts.iter().any(|p| {
                p["type"] == "tool"
                    && p["tool"] == "task"
                    && p.pointer("/state/status").and_then(|v| v.as_str()) == Some("running")
            });
            return Ok(Some(LastTurn {
                message_id: info.id,
                completed: info.time.completed.is_some(),
                errored: info.error.is_some(),
                running_task,
            }));
        }
        Ok(None)
    }

    async fn summarize(&self, session_id: &str, model: &ModelRef) -> Result<(), EngineError> {
        let rb = self
            .request(Method::POST, &session_path(session_id, "/summarize")?)
            .timeout(self.long_call_timeout())
            .json(&json!({ "providerID": model.provider_id, "modelID": model.model_id }));
        let done: serde_json::Value = self.get_json(rb, "POST /session/{id}/summarize").await?;
        match done {
            serde_json::Value::Bool(true) => Ok(()),
            other => Err(EngineError::Decode(format!("POST /session/{{id}}/summarize answered {other}"))),
        }
    }

    async fn model_windows(&self) -> Result<HashMap<String, u64>, EngineError> {
        let rb = self.request(Method::GET, "/config/providers");
        let body: serde_json::Value = self.get_json(rb, "GET /config/providers").await?;
        let mut out = HashMap::new();
        for provider in body["providers"].as_array().into_iter().flatten() {
            let Some(pid) = provider["id"].as_str() else { continue };
            for (mid, model) in provider["models"].as_object().into_iter().flatten() {
                if let Some(ctx) = model.pointer("/limit/context").and_then(serde_json::Value::as_u64) {
                    out.insert(format!("{pid}/{mid}"), ctx);
                }
            }
        }
        Ok(out)
    }

    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError> {
        let rb = self.request(Method::POST, &session_path(session_id, "/prompt_async")?).json(&prompt_body(prompt));
        self.send_effect(rb, "POST /session/{id}/prompt_async").await.map(drop)
    }

    async fn history(&self, session_id: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        Ok(self.messages(session_id, limit).await?.iter().filter_map(history_message).collect())
    }

    async fn create_session(
        &self,
        directory: Option<&str>,
        title: &str,
        mark: &ShepherdSessionMark,
    ) -> Result<SessionInfo, EngineError> {
        let mut rb = self.request(Method::POST, "/session");
        if let Some(d) = directory.filter(|d| !d.is_empty()) {
            rb = rb.query(&[("directory", d)]);
        }
        let rb = rb.json(&json!({ "title": title, "metadata": { "shepherd": mark } }));
        let info: SessionInfo = self.get_json(rb, "POST /session").await?;
        check_session(&info, "POST /session")?;
        Ok(info)
    }

    async fn find_sessions(&self, directory: Option<&str>, title_part: &str) -> Result<Vec<SessionInfo>, EngineError> {
        let mut rb = self.request(Method::GET, "/session").query(&[("search", title_part), ("limit", "20")]);
        if let Some(d) = directory.filter(|d| !d.is_empty()) {
            rb = rb.query(&[("directory", d)]);
        }
        let found: Vec<SessionInfo> = self.get_json(rb, "GET /session?search=").await?;
        Ok(valid_sessions(found, "GET /session?search="))
    }

    async fn fork(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let rb = self.request(Method::POST, &session_path(session_id, "/fork")?).json(&json!({}));
        let info: SessionInfo = self.get_json(rb, "POST /session/{id}/fork").await?;
        check_session(&info, "POST /session/{id}/fork")?;
        Ok(info)
    }

    async fn ask(&self, session_id: &str, prompt: &Prompt) -> Result<String, EngineError> {
        let rb = self
            .request(Method::POST, &session_path(session_id, "/message")?)
            .timeout(self.long_call_timeout())
            .json(&prompt_body(prompt));
        let reply: MessageWithParts = self.get_json(rb, "POST /session/{id}/message").await?;
        // Only the error's name is wanted: read it whatever else the info holds.
        let info: Option<ErrorOnly> = serde_json::from_str(reply.info.get()).ok();
        if let Some(err) = info.and_then(|i| i.error).map(|e| e.name) {
            return Err(EngineError::Http { status: 200, body: format!("the model's turn ended with {err}") });
        }
        let text: Vec<&str> =
            reply.parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect();
        Ok(text.join("\n"))
    }

    async fn delete_session(&self, session_id: &str) -> Result<(), EngineError> {
        let rb = self.request(Method::DELETE, &session_path(session_id, "")?);
        self.send(rb, "DELETE /session/{id}").await.map(drop)
    }
}

/// The body of `prompt_async` / `message`: one synthetic text part tagged as ours, the
/// turn's agent and model, `noReply` for notes.
fn prompt_body(prompt: &Prompt) -> serde_json::Value {
    {
        let mut body = json!({
            "parts": [{
                "type": "text",
                "text": prompt.text,
                "synthetic": true,
                "metadata": { "shepherd": prompt.tag },
            }],
        });
        if let Some(agent) = &prompt.turn.agent {
            body["agent"] = json!(agent);
        }
        if let Some(model) = &prompt.turn.model {
            body["model"] = json!(model);
        }
        if prompt.no_reply {
            body["noReply"] = json!(true);
        }
        body
    }
}

/// One message of `GET /session/{id}/message` as the hand-off reads it; `None` for a
/// message whose `info` does not decode (skipped, never fatal).
/// Agent and model of the newest user message (of `messages`, oldest first) that names them.
fn turn_settings(messages: &[MessageWithParts]) -> TurnSettings {
    messages
        .iter()
        .rev()
        .filter_map(|m| decode_message(&m.info))
        .find(|info| info.role == Role::User && (info.agent.is_some() || info.model.is_some()))
        .map(|info| TurnSettings { agent: info.agent, model: info.model })
        .unwrap_or_default()
}

fn history_message(m: &MessageWithParts) -> Option<HistoryMessage> {
    let info = decode_message(&m.info)?;
    let parts = m
        .parts
        .iter()
        .filter_map(|p| {
            let text = || p["text"].as_str().unwrap_or_default().to_string();
            match p["type"].as_str()? {
                "text" => Some(HistoryPart::Text {
                    text: text(),
                    synthetic: p["synthetic"].as_bool().unwrap_or(false),
                    ignored: p["ignored"].as_bool().unwrap_or(false),
                    shepherd: p
                        .pointer("/metadata/shepherd")
                        .and_then(|v| serde_json::from_value::<ShepherdTag>(v.clone()).ok()),
                }),
                "reasoning" => Some(HistoryPart::Reasoning { text: text() }),
                "tool" => Some(HistoryPart::Tool {
                    tool: p["tool"].as_str().unwrap_or_default().to_string(),
                    status: p
                        .pointer("/state/status")
                        .and_then(|v| serde_json::from_value::<ToolStatus>(v.clone()).ok())
                        .unwrap_or(ToolStatus::Pending),
                    input: p.pointer("/state/input").cloned().unwrap_or_default(),
                    error: p.pointer("/state/error").and_then(|v| v.as_str()).map(str::to_string),
                    child_session: p
                        .pointer("/state/metadata/sessionId")
                        .and_then(|v| v.as_str())
                        .filter(|c| ids::check(IdKind::Session, c).is_ok())
                        .map(str::to_string),
                }),
                _ => None,
            }
        })
        .collect();
    Some(HistoryMessage {
        id: info.id,
        role: info.role,
        created_ms: info.time.created,
        agent: info.agent,
        error: info.error.map(|e| e.name),
        summary: info.summary,
        parts,
    })
}

/// One session's entry in a `GET /session/status` body (`{id: status, …}`), found by
/// scanning: other entries are skipped unparsed and no key is copied.
fn status_of(body: &[u8], session_id: &str) -> Result<Option<Status>, serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

    /// A map key, compared with the wanted id in place.
    struct KeyIs<'s>(&'s str);
    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl Visitor<'_> for KeyIs<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a session id")
        }
        fn visit_str<E>(self, key: &str) -> Result<bool, E> {
            Ok(key == self.0)
        }
    }

    struct Find<'s>(&'s str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<Status>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of session id to status")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(wanted) = map.next_key_seed(KeyIs(self.0))? {
                if wanted {
                    found = Some(map.next_value::<Status>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    let found = de.deserialize_map(Find(session_id))?;
    de.end()?;
    Ok(found)
}

/// A message's `info` through the same decoder the event stream uses.
fn decode_message(info: &serde_json::value::RawValue) -> Option<MessageInfo> {
    shepherd_actors::event::decode_message_info(info.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt() -> Prompt {
        Prompt {
            text: "go on".into(),
            tag: ShepherdTag { kind: "nudge".into(), instance: "i1".into(), decision: "d1".into(), lease: None },
            turn: TurnSettings::default(),
            no_reply: false,
        }
    }

    #[tokio::test]
    async fn a_prompt_whose_answer_never_came_is_unconfirmed_and_one_never_sent_is_unreachable() {
        // A server that reads the request and never answers: it may have acted on it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            drop(socket);
        });
        let mut server = ServerConfig::new("a", &url);
        server.request_timeout = std::time::Duration::from_millis(300);
        let client = OpenCodeClient::new(&server, None).unwrap();
        let err = client.prompt("ses_A", &prompt()).await.unwrap_err();
        assert!(matches!(err, EngineError::Unconfirmed(_)), "{err:?}");
        held.abort();

        // Nothing listens: the prompt surely did not arrive.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let err = client.prompt("ses_A", &prompt()).await.unwrap_err();
        assert!(matches!(err, EngineError::Unreachable(_)), "{err:?}");
    }

    #[test]
    fn a_reloaded_long_call_timeout_reaches_the_clone_the_sessions_hold() {
        let client = OpenCodeClient::new(&ServerConfig::new("a", "http://a:1"), None).unwrap();
        let held = client.clone();
        client.set_long_call_timeout(std::time::Duration::from_secs(99));
        assert_eq!(held.long_call_timeout(), std::time::Duration::from_secs(99));
    }

    #[test]
    fn one_sessions_status_is_found_in_the_directorys_map() {
        let body = br#"{"ses_a":{"type":"busy"},"ses_b":{"type":"retry","attempt":2,"message":"x","next":9},"ses_c":{"type":"busy"}}"#;
        assert_eq!(status_of(body, "ses_a").unwrap(), Some(Status::Busy));
        assert_eq!(status_of(body, "ses_b").unwrap(), Some(Status::Retry { attempt: Some(2), next: Some(9) }));
        assert_eq!(status_of(body, "ses_z").unwrap(), None);
        assert_eq!(status_of(b"{}", "ses_a").unwrap(), None);
        assert!(status_of(b"[1]", "ses_a").is_err());
        assert!(status_of(br#"{"ses_a":{"type":"busy"}"#, "ses_a").is_err());
    }

    /// A status endpoint that answers slowly, naming each answer after its request's
    /// number (`{"ses_<n>": busy}`), and counts requests.
    async fn numbered_status_server() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&count);
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = sock.read(&mut chunk).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    let body = format!(r#"{{"ses_{n}":{{"type":"busy"}}}}"#);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(format!("{head}{body}").as_bytes()).await;
                });
            }
        });
        (url, count)
    }

    #[tokio::test]
    async fn concurrent_status_reads_of_a_directory_share_requests_sent_after_they_asked() {
        let (url, requests) = numbered_status_server().await;
        let server: ServerConfig = serde_json::from_value(json!({"name": "t", "url": url})).unwrap();
        let client = OpenCodeClient::new(&server, None).unwrap();
        let first = tokio::spawn({
            let c = client.clone();
            async move { c.statuses("/p").await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(30)).await; // the first read is in flight
        let later: Vec<_> = (0..5)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.status("/p", "ses_2").await })
            })
            .collect();
        let first = first.await.unwrap().unwrap();
        assert!(first.contains_key("ses_1"), "{first:?}");
        for reader in later {
            // Not the answer to the request already in flight: the next one, shared.
            assert_eq!(reader.await.unwrap(), Ok(Some(Status::Busy)));
        }
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Another directory is another read.
        assert_eq!(client.status("/q", "ses_3").await, Ok(Some(Status::Busy)));
    }

    #[tokio::test]
    async fn a_delivery_reads_the_session_once_for_its_turn_and_its_recent_messages() {
        let message = |id: &str, role: &str, extra: serde_json::Value| {
            let mut info = json!({"id": id, "sessionID": "ses_A", "role": role, "time": {"created": 1}});
            info.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"info": info, "parts": [{"type": "text", "text": format!("text of {id}")}]})
        };
        let history = json!([
            message("msg_1", "user", json!({"agent": "plan", "model": {"providerID": "p", "modelID": "m"}})),
            message("msg_2", "assistant", json!({})),
            message("msg_3", "user", json!({})),
            message("msg_4", "assistant", json!({})),
        ]);
        let (url, seen) = recording_server(serde_json::to_vec(&history).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let recent = client.recent("ses_A", 2).await.unwrap();
        // The turn's settings come from a message older than the two kept.
        assert_eq!(recent.turn.agent.as_deref(), Some("plan"));
        assert_eq!(recent.turn.model.as_ref().map(|m| m.model_id.as_str()), Some("m"));
        assert_eq!(recent.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["msg_3", "msg_4"]);
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert!(requests[0].contains(&format!("limit={TURN_LOOKBACK_MESSAGES}")), "{requests:?}");
    }

    #[test]
    fn odd_session_ids_are_escaped_in_paths() {
        assert!(session_path("ses_1/../x", "/abort").is_err());
        assert_eq!(urlencode(".."), "%2E%2E");
        assert_eq!(urlencode("a/../b"), "a%2F%2E%2E%2Fb");
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    /// A fake OpenCode that answers every request with `body` (chunked when `chunked`,
    /// so no length announces it) and records each request line.
    async fn recording_server(body: Vec<u8>, chunked: bool) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (body, log) = (body.clone(), Arc::clone(&log));
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let n = sock.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string();
                    log.lock().unwrap().push(head);
                    let answer = if chunked {
                        let mut a = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
                        for piece in body.chunks(16 * 1024) {
                            a.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                            a.extend_from_slice(piece);
                            a.extend_from_slice(b"\r\n");
                        }
                        a.extend_from_slice(b"0\r\n\r\n");
                        a
                    } else {
                        let mut a = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        a.extend_from_slice(&body);
                        a
                    };
                    let _ = sock.write_all(&answer).await;
                });
            }
        });
        (url, seen)
    }

    fn hostile_ids() -> Vec<String> {
        let mut ids: Vec<String> =
            ["../../etc/x", "a/b", "..", "%2e%2e", "ses_..", "ses_a/../b", "ses_%2e%2e", "ses_a\0b"]
                .map(String::from)
                .into();
        ids.push(format!("ses_{}", "A".repeat(10 * 1024)));
        ids
    }

    #[tokio::test]
    async fn hostile_session_ids_are_never_sent_as_a_path() {
        let (url, seen) = recording_server(b"{}".to_vec(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        for id in hostile_ids() {
            assert!(matches!(client.abort(&id).await, Err(EngineError::NotFound(_))), "{id:?}");
            assert!(client.session(&id).await.is_err(), "{id:?}");
            assert!(client.prompt(&id, &prompt()).await.is_err(), "{id:?}");
            assert!(client.history(&id, 5).await.is_err(), "{id:?}");
            assert!(client.delete_session(&id).await.is_err(), "{id:?}");
        }
        assert_eq!(*seen.lock().unwrap(), Vec::<String>::new(), "no request may reach the server");
        // A good id still goes through, to the path it names.
        client.abort("ses_A").await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["POST /session/ses_A/abort HTTP/1.1"]);
    }

    #[tokio::test]
    async fn sessions_with_hostile_ids_in_an_answer_are_dropped_and_the_rest_kept() {
        let mut listed = vec![serde_json::json!({"id": "ses_good", "time": {}})];
        for id in hostile_ids() {
            listed.push(serde_json::json!({"id": id, "time": {}}));
        }
        listed.push(serde_json::json!({"id": "ses_child", "parentID": "../ses_x", "time": {}}));
        let (url, _) = recording_server(serde_json::to_vec(&listed).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let found = client.list_sessions(100).await.unwrap();
        assert_eq!(found.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["ses_good"]);
        let found = client.find_sessions(None, "x").await.unwrap();
        assert_eq!(found.len(), 1);

        let statuses: serde_json::Map<String, serde_json::Value> = hostile_ids()
            .into_iter()
            .chain(["ses_busy".to_string()])
            .map(|id| (id, serde_json::json!({"type": "busy"})))
            .collect();
        let (url, _) = recording_server(serde_json::to_vec(&statuses).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let map = client.statuses("/p").await.unwrap();
        assert_eq!(map.keys().collect::<Vec<_>>(), ["ses_busy"]);

        // One session whose own id is hostile: an error, not a session.
        let (url, _) = recording_server(br#"{"id":"../../etc","time":{}}"#.to_vec(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        assert!(matches!(client.session("ses_A").await, Err(EngineError::Decode(_))));
    }

    #[tokio::test]
    async fn an_answer_past_max_response_bytes_is_refused_with_a_clear_error() {
        let mut server = ServerConfig::new("a", "");
        server.max_response_bytes = 64 * 1024;
        // A JSON array a little past the cap: announced by its length, or chunked.
        let big = format!("[{}1]", "1,".repeat(40 * 1024)).into_bytes();
        for chunked in [false, true] {
            let (url, _) = recording_server(big.clone(), chunked).await;
            server.url = url;
            let client = OpenCodeClient::new(&server, None).unwrap();
            let err = client.todos("ses_A").await.unwrap_err();
            assert!(err.to_string().contains("larger than 65536 bytes (servers[].max_response_bytes)"), "{err}");
        }
        // Under the cap it is read as before.
        let (url, _) = recording_server(b"[]".to_vec(), true).await;
        server.url = url;
        assert_eq!(OpenCodeClient::new(&server, None).unwrap().todos("ses_A").await.unwrap(), vec![]);
    }
}
