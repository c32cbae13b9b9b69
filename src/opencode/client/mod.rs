//! The REST side of one OpenCode server: the [`Engine`](shepherd_actors::ports::Engine)
//! ports over HTTP.
//!
//! One `reqwest` client with a total timeout per request (the event stream has its own
//! client, see `pump`). HTTP Basic auth when the server has a password. Every answer is
//! mapped to an [`EngineError`] kind the cores can branch on; bodies in errors are
//! truncated so a huge error page does not flood the log.
//!
//! `GET /session/status` is the one call a fleet makes in bursts (every recovery reads
//! it, twice, and at 10,000 sessions a directory's map holds ~1,000 entries): reads of
//! one directory are coalesced ([`StatusReads`]) and each answer is scanned once for
//! the sessions its readers asked about, without building the rest of the map.
//!
//! Parts: `transport` (requests, auth, error mapping, capped reads), `status` (the
//! coalesced status reads), `messages` (`GET /session/{id}/message` decoded for turns and
//! hand-offs, the body of a prompt), `session_ids` (an id of OpenCode's shape only, in a
//! path or in an answer). The impls below ([`Reads`], [`Control`], [`Lifecycle`],
//! [`Discovery`]) are the ports, call by call.

mod asks;
mod messages;
mod session_ids;
mod status;
mod transport;
mod turns;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use reqwest::Method;
use serde_json::json;
use serde_json::value::RawValue;
use shepherd_actors::config::ServerConfig;
use shepherd_actors::event::{Event, ModelRef, Role, SessionInfo, ShepherdSessionMark, Status, Todo};
use shepherd_actors::ids::{self, IdKind};
use shepherd_actors::ports::{
    Control, Discovery, EngineError, HistoryMessage, LastTurn, Lifecycle, Prompt, Reads, Recent, TurnSettings,
};

use self::messages::{
    decode_message, history_message, prompt_body, turn_settings, ErrorOnly, MessageWithParts, PartFields, TURN_LOOKBACK_MESSAGES,
};
use self::session_ids::{check_session, session_path, valid_sessions};
use self::status::{StatusReads, Want};

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

/// Told of every call to the server once its answer's head is in (or it failed): the
/// call (`GET /session/{id}`: a template, never an id), how long it took from being sent
/// (the wait for a `max_requests_in_flight` permit not counted), and its outcome — `ok`,
/// `http_error` (a non-2xx answer), `failed` (no answer). The daemon turns it into the
/// `shepherd_opencode_request_duration_seconds` histogram; the client knows nothing of
/// metrics.
#[derive(Clone)]
pub struct CallTimer(pub Arc<TimedCall>);

/// What a [`CallTimer`] calls: the call, its time, its outcome.
pub type TimedCall = dyn Fn(&str, std::time::Duration, &'static str) + Send + Sync;

impl std::fmt::Debug for CallTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallTimer")
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
    /// `servers[].max_requests_in_flight`: a turn per call under way, the calls an abort
    /// waits on served first (shared by clones).
    in_flight: Arc<turns::Turns>,
    /// How long a call waits for a permit: the server's `request_timeout`.
    permit_wait: std::time::Duration,
    /// Told of every call's time (shared by clones).
    timer: Option<CallTimer>,
}

/// How long a connection to OpenCode may sit idle in a pool and still be used: less than
/// the 5 s after which OpenCode 1.19 closes one (`Keep-Alive: timeout=5`; 1.18 kept
/// them open). A request sent on a connection the server is closing at that moment gets
/// no answer — a prompt or an abort then cannot be confirmed, a read fails — so the
/// client gives a connection up before the server may. The event stream's is in use,
/// never idle.
pub const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// The HTTP client of one server's REST calls: a pool of connections of its own.
fn http_client(request_timeout: std::time::Duration) -> Result<reqwest::Client, EngineError> {
    reqwest::Client::builder()
        .timeout(request_timeout)
        .connect_timeout(request_timeout)
        .pool_idle_timeout(POOL_IDLE)
        .build()
        .map_err(|e| EngineError::Unreachable(format!("cannot build HTTP client: {e}")))
}

impl OpenCodeClient {
    pub fn new(server: &ServerConfig, auth: Option<Credentials>) -> Result<Self, EngineError> {
        let http = http_client(server.request_timeout)?;
        Ok(Self {
            base: server.url.trim_end_matches('/').to_string(),
            http,
            auth,
            long_call_timeout_ms: Arc::new(server.request_timeout.as_millis().try_into().unwrap_or(u64::MAX).into()),
            status_reads: Arc::default(),
            max_response_bytes: server.max_response_bytes,
            in_flight: turns::Turns::new(server.max_requests_in_flight),
            permit_wait: server.request_timeout,
            timer: None,
        })
    }

    /// The same client — settings, status reads, calls-in-flight bound, all shared —
    /// with a pool of connections of its own. A connection is driven by the thread that
    /// opened it: the sessions of each thread get their own pool (opened on their io
    /// thread, [`crate::opencode::io_thread`]), so their calls are not carried by
    /// another thread (in a shared pool, the supervisor's, which opened it while
    /// reconciling).
    pub fn with_own_connections(&self) -> Result<Self, EngineError> {
        Ok(Self { http: http_client(self.permit_wait)?, ..self.clone() })
    }

    /// Tells `timer` of every call's time (see [`CallTimer`]).
    pub fn with_call_timer(self, timer: CallTimer) -> Self {
        Self { timer: Some(timer), ..self }
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
    /// `true` once it has published the toast). Not part of the engine's ports: toasts
    /// are the edge's business ([`crate::toast`]), never a decision's.
    pub async fn show_toast(&self, directory: Option<&str>, toast: &Toast) -> Result<bool, EngineError> {
        let mut rb = self.request(Method::POST, "/tui/show-toast").json(toast);
        if let Some(d) = directory.filter(|d| !d.is_empty()) {
            rb = rb.query(&[("directory", d)]);
        }
        self.get_json(rb, "POST /tui/show-toast").await
    }
}

#[async_trait]
impl Reads for OpenCodeClient {
    async fn statuses(&self, directory: &str) -> Result<HashMap<String, Status>, EngineError> {
        let entries = self.status_entries(directory, Want::All).await?;
        let mut map: HashMap<String, Status> = std::sync::Arc::unwrap_or_clone(entries);
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
        Ok(self.status_entries(directory, Want::One(session_id.to_string())).await?.get(session_id).cloned())
    }

    async fn session(&self, session_id: &str) -> Result<SessionInfo, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "")?);
        let info: SessionInfo = self.get_json(rb, "GET /session/{id}").await?;
        check_session(&info, "GET /session/{id}")?;
        Ok(info)
    }

    async fn todos(&self, session_id: &str) -> Result<Vec<Todo>, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "/todo")?);
        self.get_json(rb, "GET /session/{id}/todo").await
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
        Ok(last_turn_of(session_id, &self.recent_messages(session_id).await?))
    }

    async fn latest_turn(&self, session_id: &str) -> Result<Option<LastTurn>, EngineError> {
        Ok(last_turn_of(session_id, &self.messages(session_id, LATEST_TURN_MESSAGES).await?))
    }

    async fn history(&self, session_id: &str, limit: u32) -> Result<Vec<HistoryMessage>, EngineError> {
        Ok(self.messages(session_id, limit).await?.iter().filter_map(history_message).collect())
    }
}

/// How many of a session's newest messages [`Reads::latest_turn`] reads: the turn, and a
/// prompt queued behind it.
const LATEST_TURN_MESSAGES: u32 = 2;

/// The latest assistant message among `messages` (oldest first), as a [`LastTurn`].
fn last_turn_of(session_id: &str, messages: &[MessageWithParts]) -> Option<LastTurn> {
    for m in messages.iter().rev() {
        let Some(info) = decode_message(&m.info) else { continue };
        if info.role != Role::Assistant {
            continue;
        }
        let running_parts: Vec<(&RawValue, PartFields)> = m
            .parts
            .iter()
            .filter_map(|p| Some((&**p, PartFields::of(p)?)))
            .filter(|(_, f)| f.kind == "tool" && f.state().status == "running")
            .collect();
        return Some(LastTurn {
            message_id: info.id.clone(),
            completed: info.time.completed.is_some(),
            errored: info.error.is_some(),
            running_task: running_parts.iter().any(|(_, f)| f.tool == "task"),
            running: running_parts.into_iter().filter_map(|(p, _)| running_part(session_id, p)).collect(),
            reply: Some(Box::new(info)),
        });
    }
    None
}

/// A running tool part of a message read by REST, as the `message.part.updated` event
/// that said it runs: read by the stream's own decoder (the same checks), or dropped.
fn running_part(session_id: &str, part: &RawValue) -> Option<Event> {
    let properties = json!({"sessionID": session_id, "part": part});
    match asks::as_event("message.part.updated", &properties.to_string()) {
        Ok(event @ Event::PartUpdated(_)) => Some(event),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "dropping a running tool part that does not read as its event");
            None
        }
    }
}

#[async_trait]
impl Control for OpenCodeClient {
    async fn abort(&self, session_id: &str) -> Result<(), EngineError> {
        let rb = self.request(Method::POST, &session_path(session_id, "/abort")?);
        self.send_first(rb, transport::ABORT).await.map(drop)
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

    async fn prompt(&self, session_id: &str, prompt: &Prompt) -> Result<(), EngineError> {
        let rb = self.request(Method::POST, &session_path(session_id, "/prompt_async")?).json(&prompt_body(prompt));
        self.send_effect(rb, "POST /session/{id}/prompt_async").await.map(drop)
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
        let text: Vec<String> = reply
            .parts
            .iter()
            .filter_map(|p| PartFields::of(p))
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text.as_str().map(str::to_string))
            .collect();
        Ok(text.join("\n"))
    }
}

#[async_trait]
impl Lifecycle for OpenCodeClient {
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

    async fn delete_session(&self, session_id: &str) -> Result<(), EngineError> {
        let rb = self.request(Method::DELETE, &session_path(session_id, "")?);
        self.send(rb, "DELETE /session/{id}").await.map(drop)
    }
}

#[async_trait]
impl Discovery for OpenCodeClient {
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

    async fn pending_asks(&self, directory: &str) -> Result<Vec<Event>, EngineError> {
        self.asks_of(directory).await
    }
}

/// The body of `POST /tui/show-toast`, as OpenCode's API defines it (when to show
/// one, and what it says, is the toast module's business).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Toast {
    pub title: String,
    pub message: String,
    /// `info`, `success`, `warning` or `error`.
    pub variant: &'static str,
    /// Milliseconds.
    pub duration: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use shepherd_actors::event::ShepherdTag;

    use super::*;

    pub(super) fn prompt() -> Prompt {
        Prompt {
            text: "go on".into(),
            tag: ShepherdTag { kind: "nudge".into(), instance: "i1".into(), decision: "d1".into(), lease: None },
            turn: TurnSettings::default(),
            no_reply: false,
        }
    }

    #[test]
    fn a_reloaded_long_call_timeout_reaches_the_clone_the_sessions_hold() {
        let client = OpenCodeClient::new(&ServerConfig::new("a", "http://a:1"), None).unwrap();
        let held = client.clone();
        client.set_long_call_timeout(std::time::Duration::from_secs(99));
        assert_eq!(held.long_call_timeout(), std::time::Duration::from_secs(99));
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

    /// What every connect reads of a busy session: its newest two messages (not the
    /// thirty of a cut-off turn's check), the latest assistant one found behind a prompt
    /// queued after it, its running tools as their events (a finished one is not), and
    /// the reply itself.
    #[tokio::test]
    async fn the_latest_turn_is_read_from_two_messages_with_its_running_tools() {
        let tool = |id: &str, status: &str| {
            json!({"id": id, "messageID": "msg_2", "sessionID": "ses_A", "type": "tool", "tool": "bash", "state": {"status": status}})
        };
        let history = json!([
            {"info": {"id": "msg_2", "sessionID": "ses_A", "role": "assistant", "time": {"created": 1}},
             "parts": [tool("prt_done", "completed"), tool("prt_run", "running")]},
            {"info": {"id": "msg_3", "sessionID": "ses_A", "role": "user", "time": {"created": 2}}, "parts": []},
        ]);
        let (url, seen) = recording_server(serde_json::to_vec(&history).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let turn = client.latest_turn("ses_A").await.unwrap().expect("the assistant message behind the queued prompt");
        assert_eq!(turn.message_id, "msg_2");
        assert!(!turn.completed && !turn.running_task);
        let running: Vec<_> = turn
            .running
            .iter()
            .map(|e| match e {
                Event::PartUpdated(p) => p.id.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(running, ["prt_run"]);
        assert_eq!(turn.reply.map(|r| r.id), Some("msg_2".to_string()));
        let requests = seen.lock().unwrap().clone();
        assert!(requests[0].contains(&format!("limit={LATEST_TURN_MESSAGES}")), "{requests:?}");
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    /// A fake OpenCode that answers every request with `body` (chunked when `chunked`,
    /// so no length announces it) and records each request line.
    pub(super) async fn recording_server(body: Vec<u8>, chunked: bool) -> (String, Arc<Mutex<Vec<String>>>) {
        let answer = crate::test_support::Answer::json(body);
        let served = if chunked { answer.chunked() } else { answer }.serve().await;
        (served.url, served.requests)
    }
}
