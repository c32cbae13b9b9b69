//! The CLI's side of the control API: where the running daemon listens and which token
//! it wants (both from the same configuration the daemon reads), the calls, and errors
//! a person can act on ("is `shepherd run` running?", "unknown session: …").

use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;
use shepherd_actors::config::ControlConfig;
use shepherd_actors::control::{CustomPromptRequest, HandoffView, PauseView};
use shepherd_actors::event::Todo;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::stats::StatusDocument;

use super::server::{connectable, CLIENT_POOL_IDLE};
use super::token::{find_for_client, ControlToken, TokenError, TokenOrigin};

/// A daemon that does not accept the connection this fast is not running.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Delivering a prompt reads todos and posts to OpenCode: allow for slow servers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the control API is disabled in this configuration (control.enabled = false)")]
    Disabled,
    #[error("control.bind {0:?}: not an address like 127.0.0.1:7433")]
    BadBind(String),
    #[error("control.bind {0} asks for any free port, so the daemon's port cannot be known; configure a fixed port")]
    AnyPort(SocketAddr),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(
        "cannot reach the Shepherd daemon at {url} ({reason}); is `shepherd run` running with this configuration?"
    )]
    NotRunning { url: String, reason: String },
    #[error("the daemon at {url} refused the token from {origin} ({error}); it runs with another token")]
    Unauthorized { url: String, origin: TokenOrigin, error: String },
    /// The daemon's own words, e.g. `unknown session: ses_…` (404) or
    /// `include_todo_context: invalid type: …` (400).
    #[error("{error}")]
    Rejected { status: u16, error: String },
    #[error("the daemon at {url} failed ({status}): {error}")]
    Failed { url: String, status: u16, error: String },
    #[error("unexpected answer from {url}: {reason}")]
    Protocol { url: String, reason: String },
}

/// One session as `GET /v1/sessions` describes it (the fields the CLI shows).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SessionView {
    pub server: String,
    pub id: String,
    #[serde(default)]
    pub busy: bool,
    #[serde(default)]
    pub recovering: bool,
    #[serde(default)]
    pub paused: Option<String>,
    #[serde(default)]
    pub todos: Vec<Todo>,
    #[serde(default)]
    pub last_action: Option<ActionView>,
}

/// A session's last action record.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ActionView {
    pub action: String,
    pub outcome: String,
    #[serde(default)]
    pub reason: String,
    /// Epoch milliseconds.
    pub at_ms: i64,
}

/// The answer to a prompt.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PromptReplyView {
    pub success: bool,
    pub message: String,
    #[serde(default)]
    pub todos: Option<Vec<Todo>>,
    #[serde(default)]
    pub context_summary: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A client of one daemon's control API.
#[derive(Debug, Clone)]
pub struct ControlClient {
    base: Url,
    token: ControlToken,
    origin: TokenOrigin,
    http: reqwest::Client,
}

impl ControlClient {
    /// The daemon the configuration describes, with the token from the process
    /// environment or the token file.
    pub fn from_config(cfg: &ControlConfig) -> Result<Self, ClientError> {
        Self::from_config_with_env(cfg, &|name| std::env::var_os(name))
    }

    /// [`ControlClient::from_config`] with the environment given as a lookup function.
    pub fn from_config_with_env(
        cfg: &ControlConfig,
        lookup: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Self, ClientError> {
        if !cfg.enabled {
            return Err(ClientError::Disabled);
        }
        let bind: SocketAddr = cfg.bind.parse().map_err(|_| ClientError::BadBind(cfg.bind.clone()))?;
        if bind.port() == 0 {
            return Err(ClientError::AnyPort(bind));
        }
        let (token, origin) = find_for_client(cfg, lookup)?;
        Self::new(&format!("http://{}", connectable(bind)), token, origin)
    }

    /// A client of the API at `url` (`http://HOST:PORT`).
    pub fn new(url: &str, token: ControlToken, origin: TokenOrigin) -> Result<Self, ClientError> {
        let protocol = |reason: String| ClientError::Protocol { url: url.to_string(), reason };
        let base = Url::parse(url).map_err(|e| protocol(e.to_string()))?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_idle_timeout(CLIENT_POOL_IDLE)
            .build()
            .map_err(|e| protocol(e.to_string()))?;
        Ok(Self { base, token, origin, http })
    }

    /// The API's base URL.
    pub fn url(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// `GET /v1/sessions`, as the daemon sent it.
    pub async fn sessions_json(&self) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, &["v1", "sessions"], None).await
    }

    /// `GET /v1/sessions`.
    pub async fn sessions(&self) -> Result<Vec<SessionView>, ClientError> {
        let value = self.sessions_json().await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `GET /v1/sessions/{id}`, as the daemon sent it.
    pub async fn session_json(&self, id: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, &["v1", "sessions", id], None).await
    }

    /// `GET /v1/status?history=N`: the fleet, each session's history cut to its newest
    /// `history` entries.
    pub async fn status(&self, history: usize) -> Result<StatusDocument, ClientError> {
        let query = [("history", history.to_string())];
        let value = self.call_with(reqwest::Method::GET, &["v1", "status"], &query, None).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `GET /v1/sessions/{id}/history?limit=N`: the session's journal, oldest first.
    pub async fn session_history(&self, id: &str, limit: u32) -> Result<Vec<ActionRecord>, ClientError> {
        let query = [("limit", limit.to_string())];
        let value = self.call_with(reqwest::Method::GET, &["v1", "sessions", id, "history"], &query, None).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `POST /v1/sessions/{id}/prompt`.
    pub async fn prompt(&self, id: &str, request: &CustomPromptRequest) -> Result<PromptReplyView, ClientError> {
        let body = serde_json::to_value(request).map_err(|e| self.protocol(e))?;
        let value = self.call(reqwest::Method::POST, &["v1", "sessions", id, "prompt"], Some(body)).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `POST /v1/sessions/{id}/handoff`: hand the session over now.
    pub async fn handoff(&self, id: &str) -> Result<HandoffView, ClientError> {
        let value = self.call(reqwest::Method::POST, &["v1", "sessions", id, "handoff"], None).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `GET /v1/sessions/{id}/handoff`.
    pub async fn handoff_status(&self, id: &str) -> Result<HandoffView, ClientError> {
        let value = self.call(reqwest::Method::GET, &["v1", "sessions", id, "handoff"], None).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `POST /v1/sessions/{id}/pause|resume` (`session`) or `POST /v1/pause|resume` (the
    /// fleet): `pause` with an optional duration, or resume; `by` says who asked.
    pub async fn set_pause(
        &self,
        session: Option<&str>,
        pause: bool,
        span: Option<&str>,
        by: &str,
    ) -> Result<PauseView, ClientError> {
        let verb = if pause { "pause" } else { "resume" };
        let path: Vec<&str> = match session {
            Some(id) => vec!["v1", "sessions", id, verb],
            None => vec!["v1", verb],
        };
        let mut body = serde_json::json!({ "by": by });
        if let Some(span) = span {
            body["for"] = span.into();
        }
        let value = self.call(reqwest::Method::POST, &path, Some(body)).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `POST /v1/handoffs/{id}/resume`: restore a stored snapshot into a fresh session.
    pub async fn resume_handoff(&self, snapshot: &str) -> Result<HandoffView, ClientError> {
        let value = self.call(reqwest::Method::POST, &["v1", "handoffs", snapshot, "resume"], None).await?;
        serde_json::from_value(value).map_err(|e| self.protocol(e))
    }

    /// `POST /v1/config/reload`: what changed, as the daemon sent it.
    pub async fn reload_config(&self) -> Result<Value, ClientError> {
        self.call(reqwest::Method::POST, &["v1", "config", "reload"], None).await
    }

    fn protocol(&self, reason: impl ToString) -> ClientError {
        ClientError::Protocol { url: self.url().to_string(), reason: reason.to_string() }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        self.call_with(method, segments, &[], body).await
    }

    async fn call_with(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let mut url = self.base.clone();
        url.path_segments_mut().map_err(|()| self.protocol("not a base URL"))?.clear().extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut request = self.http.request(method, url).bearer_auth(self.token.expose());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() {
                ClientError::NotRunning { url: self.url().to_string(), reason: root_cause(&e) }
            } else {
                self.protocol(root_cause(&e))
            }
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| self.protocol(root_cause(&e)))?;
        let value: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success() {
            return value.ok_or_else(|| self.protocol("the body is not JSON"));
        }
        let error = value
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| text.chars().take(200).collect());
        let url = self.url().to_string();
        Err(match status {
            StatusCode::UNAUTHORIZED => ClientError::Unauthorized { url, origin: self.origin.clone(), error },
            s if s.is_client_error() => ClientError::Rejected { status: s.as_u16(), error },
            s => ClientError::Failed { url, status: s.as_u16(), error },
        })
    }
}

/// The innermost error of a chain: "Connection refused (os error 111)", not "error
/// sending request for url (…)".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut inner = e;
    while let Some(next) = inner.source() {
        inner = next;
    }
    inner.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars = vars.to_vec();
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn the_url_comes_from_control_bind_and_an_unspecified_address_means_loopback() {
        let cfg = ControlConfig { bind: "0.0.0.0:7555".into(), ..ControlConfig::default() };
        let c = ControlClient::from_config_with_env(&cfg, &env(&[("SHEPHERD_CONTROL_TOKEN", "t")])).unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:7555");
    }

    #[test]
    fn a_disabled_api_or_any_port_cannot_be_reached() {
        let token = env(&[("SHEPHERD_CONTROL_TOKEN", "t")]);
        let off = ControlConfig { enabled: false, ..ControlConfig::default() };
        assert!(matches!(ControlClient::from_config_with_env(&off, &token), Err(ClientError::Disabled)));
        let any = ControlConfig { bind: "127.0.0.1:0".into(), ..ControlConfig::default() };
        assert!(matches!(ControlClient::from_config_with_env(&any, &token), Err(ClientError::AnyPort(_))));
    }

    #[test]
    fn without_a_token_the_error_names_the_variable_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("control.token");
        let cfg = ControlConfig { token_file: file.to_string_lossy().into(), ..ControlConfig::default() };
        let e = ControlClient::from_config_with_env(&cfg, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("SHEPHERD_CONTROL_TOKEN") && e.contains(&*file.to_string_lossy()), "{e}");
        assert!(e.contains("shepherd run"), "{e}");
    }

    /// `shepherd top` polls at its `--refresh`: a call after the connection sat idle as
    /// long as the control API keeps one (5 s) goes on a new connection and is answered
    /// (on the old one, kept by reqwest's default pool for 90 s, it went unanswered).
    #[tokio::test]
    async fn a_connection_the_api_may_have_closed_for_idleness_is_not_used_again() {
        let answer = crate::test_support::Answer::json("[]").closing_idle_after(super::super::server::KEEP_ALIVE);
        let served = answer.serve().await;
        let (url, connections) = (served.url, served.connections);
        let token = ControlToken::new("t").unwrap();
        let client = ControlClient::new(&url, token, TokenOrigin::Env("SHEPHERD_CONTROL_TOKEN".into())).unwrap();
        client.sessions_json().await.unwrap();
        client.sessions_json().await.unwrap();
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1, "kept and used again");

        // Real time: under a paused clock the client's timeouts would fire at once.
        tokio::time::sleep(Duration::from_millis(5_200)).await;
        client.sessions_json().await.expect("answered on a new connection");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
