//! A thin REST helper over an OpenCode server for tests and the demo: create sessions,
//! prompt, abort, read status / messages / todos / questions, follow `/event`, and poll
//! for a condition with [`wait_until`].
//!
//! It is deliberately shallow — JSON in, JSON (or a few small typed views) out — and is
//! **not** Shepherd's production OpenCode client (that lives in `crate::opencode`); tests
//! use this one to drive and observe OpenCode independently of the code under test.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::Method;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;

/// Timeout of ordinary API calls.
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval of [`wait_until`].
const POLL_EVERY: Duration = Duration::from_millis(100);

/// A failed call.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No HTTP answer (connection refused, timeout, …).
    #[error("{method} {url}: {detail}")]
    Transport {
        /// HTTP method.
        method: Method,
        /// Full URL.
        url: String,
        /// The cause with its whole source chain (reqwest's own message hides it).
        detail: String,
        /// Cause.
        #[source]
        source: reqwest::Error,
    },
    /// An answer with a non-success status.
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        /// HTTP method.
        method: Method,
        /// Full URL.
        url: String,
        /// Status code.
        status: u16,
        /// Body text (OpenCode error JSON, or empty for 401).
        body: String,
    },
    /// A success answer whose body did not have the expected shape.
    #[error("{method} {url}: unexpected body ({source}): {body}")]
    Decode {
        /// HTTP method.
        method: Method,
        /// Full URL.
        url: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
        /// Body text, truncated.
        body: String,
    },
}

impl ClientError {
    fn transport(method: Method, url: &str, source: reqwest::Error) -> ClientError {
        let mut detail = source.to_string();
        let mut cause = std::error::Error::source(&source);
        while let Some(c) = cause {
            detail.push_str(": ");
            detail.push_str(&c.to_string());
            cause = c.source();
        }
        ClientError::Transport { method, url: url.to_string(), detail, source }
    }

    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// `GET /global/health`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Health {
    /// Always `true` when answered.
    pub healthy: bool,
    /// OpenCode version.
    pub version: String,
}

/// One entry of `GET /session/status` (absent sessions are idle).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SessionStatus {
    /// A turn is running.
    Busy,
    /// Seen in events only; `/session/status` omits idle sessions.
    Idle,
    /// Waiting to retry a failed provider call.
    Retry {
        /// Attempt number.
        attempt: u32,
        /// Error text.
        message: String,
        /// Epoch ms of the next attempt.
        next: u64,
    },
    /// A status this helper does not know.
    #[serde(other)]
    Other,
}

/// One todo of `GET /session/{id}/todo`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Todo {
    /// Text.
    pub content: String,
    /// `pending | in_progress | completed | cancelled`.
    pub status: String,
    /// `high | medium | low`.
    pub priority: String,
}

/// One message of `GET /session/{id}/message`: `info` and `parts`, kept as JSON, with
/// accessors for what tests usually look at.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Message {
    /// The message info (`id`, `role`, `finish`, `error`, `tokens`, `time`, …).
    pub info: Value,
    /// The parts.
    pub parts: Vec<Value>,
}

impl Message {
    /// `info.id`.
    pub fn id(&self) -> &str {
        self.info.get("id").and_then(Value::as_str).unwrap_or("")
    }
    /// `info.role` (`user` / `assistant`).
    pub fn role(&self) -> &str {
        self.info.get("role").and_then(Value::as_str).unwrap_or("")
    }
    /// `info.finish` (`stop`, `tool-calls`, `length`, `unknown`, `error`), if any.
    pub fn finish(&self) -> Option<&str> {
        self.info.get("finish").and_then(Value::as_str)
    }
    /// `info.error.name`, if the message failed.
    pub fn error_name(&self) -> Option<&str> {
        self.info.pointer("/error/name").and_then(Value::as_str)
    }
    /// Whether `info.time.completed` is set.
    pub fn is_completed(&self) -> bool {
        self.info.pointer("/time/completed").is_some()
    }
    /// The text parts' texts joined (synthetic ones included).
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("")
    }
    /// The `tool` parts.
    pub fn tool_parts(&self) -> impl Iterator<Item = &Value> {
        self.parts.iter().filter(|p| p.get("type").and_then(Value::as_str) == Some("tool"))
    }
    /// `(tool, state.status)` of every tool part.
    pub fn tools(&self) -> Vec<(String, String)> {
        self.tool_parts()
            .map(|p| {
                let s = |ptr: &str| p.pointer(ptr).and_then(Value::as_str).unwrap_or("").to_string();
                (s("/tool"), s("/state/status"))
            })
            .collect()
    }
}

/// Options of a prompt beyond its text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptOptions {
    /// `agent` (e.g. `build`, `plan`).
    pub agent: Option<String>,
    /// `model`: `(providerID, modelID)`.
    pub model: Option<(String, String)>,
    /// Mark the text part `synthetic: true`.
    pub synthetic: bool,
    /// `metadata` of the text part.
    pub metadata: Option<Value>,
    /// `noReply: true`.
    pub no_reply: bool,
    /// `system`.
    pub system: Option<String>,
}

impl PromptOptions {
    /// The JSON body of `prompt_async` / `message` for `text`.
    pub fn body(&self, text: &str) -> Value {
        let mut part = json!({"type": "text", "text": text});
        if self.synthetic {
            part["synthetic"] = json!(true);
        }
        if let Some(m) = &self.metadata {
            part["metadata"] = m.clone();
        }
        let mut body = json!({ "parts": [part] });
        if let Some(a) = &self.agent {
            body["agent"] = json!(a);
        }
        if let Some((provider, model)) = &self.model {
            body["model"] = json!({"providerID": provider, "modelID": model});
        }
        if self.no_reply {
            body["noReply"] = json!(true);
        }
        if let Some(s) = &self.system {
            body["system"] = json!(s);
        }
        body
    }
}

/// A REST helper bound to one OpenCode server (and optionally one directory).
#[derive(Debug, Clone)]
pub struct OpenCodeClient {
    base: String,
    http: reqwest::Client,
    auth: Option<(String, String)>,
    directory: Option<String>,
}

impl OpenCodeClient {
    /// A client for `base_url` (`http://127.0.0.1:PORT`, no trailing slash needed).
    pub fn new(base_url: impl Into<String>) -> OpenCodeClient {
        let http = reqwest::Client::builder().timeout(API_TIMEOUT).build().unwrap_or_else(|_| reqwest::Client::new());
        OpenCodeClient { base: base_url.into().trim_end_matches('/').to_string(), http, auth: None, directory: None }
    }

    /// Sends HTTP Basic credentials with every call.
    pub fn with_auth(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((username.into(), password.into()));
        self
    }

    /// Scopes directory-aware calls (`status`, `questions`, `events`, `create_session`, …)
    /// to `dir` unless a call names a directory itself.
    pub fn with_directory(mut self, dir: impl Into<String>) -> Self {
        self.directory = Some(dir.into());
        self
    }

    /// The server URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str, directory: Option<&str>) -> (reqwest::RequestBuilder, String) {
        let url = format!("{}{}", self.base, path);
        let mut rb = self.http.request(method, &url);
        if let Some((u, p)) = &self.auth {
            rb = rb.basic_auth(u, Some(p));
        }
        if let Some(dir) = directory.or(self.directory.as_deref()) {
            rb = rb.query(&[("directory", dir)]);
        }
        (rb, url)
    }

    /// Sends a request and returns the raw body of a success answer.
    async fn send(
        &self,
        method: Method,
        path: &str,
        directory: Option<&str>,
        body: Option<&Value>,
    ) -> Result<String, ClientError> {
        let (mut rb, url) = self.request(method.clone(), path, directory);
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let transport = |source| ClientError::transport(method.clone(), &url, source);
        let resp = rb.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if !status.is_success() {
            return Err(ClientError::Status { method, url, status: status.as_u16(), body: text });
        }
        Ok(text)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        directory: Option<&str>,
        body: Option<&Value>,
    ) -> Result<T, ClientError> {
        let text = self.send(method.clone(), path, directory, body).await?;
        let text = if text.is_empty() { "null".to_string() } else { text };
        serde_json::from_str(&text).map_err(|source| ClientError::Decode {
            method,
            url: format!("{}{}", self.base, path),
            source,
            body: text.chars().take(500).collect(),
        })
    }

    /// `GET path` as JSON (escape hatch for routes without a helper).
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, path, None, None).await
    }

    /// `POST path` with a JSON body, answer as JSON (`null` for an empty body).
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call(Method::POST, path, None, Some(body)).await
    }

    /// `GET /global/health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call(Method::GET, "/global/health", None, None).await
    }

    /// `GET /global/health`, giving up after `timeout`. A request that reaches a server
    /// still booting can hang forever (seen with 1.18.34), so probes use a short timeout.
    pub async fn health_within(&self, timeout: Duration) -> Result<Health, ClientError> {
        let (rb, url) = self.request(Method::GET, "/global/health", None);
        let transport = |source| ClientError::transport(Method::GET, &url, source);
        let resp = rb.timeout(timeout).send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if !status.is_success() {
            return Err(ClientError::Status { method: Method::GET, url, status: status.as_u16(), body: text });
        }
        serde_json::from_str(&text).map_err(|source| ClientError::Decode {
            method: Method::GET,
            url,
            source,
            body: text.chars().take(500).collect(),
        })
    }

    /// `POST /session` with an optional title; returns the session id. Without a title,
    /// OpenCode makes an extra title-generation model call on the first prompt.
    pub async fn create_session(&self, title: Option<&str>) -> Result<String, ClientError> {
        let body = match title {
            Some(t) => json!({ "title": t }),
            None => json!({}),
        };
        let session = self.create_session_with(&body).await?;
        Ok(session.get("id").and_then(Value::as_str).unwrap_or_default().to_string())
    }

    /// `POST /session` with any body (`title`, `parentID`, `permission`, …); returns the
    /// session JSON.
    pub async fn create_session_with(&self, body: &Value) -> Result<Value, ClientError> {
        self.call(Method::POST, "/session", None, Some(body)).await
    }

    /// `GET /session/{id}`.
    pub async fn session(&self, id: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, &format!("/session/{id}"), None, None).await
    }

    /// `GET /session/{id}/children`.
    pub async fn children(&self, id: &str) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/children"), None, None).await
    }

    /// `DELETE /session/{id}`.
    pub async fn delete_session(&self, id: &str) -> Result<bool, ClientError> {
        self.call(Method::DELETE, &format!("/session/{id}"), None, None).await
    }

    /// `POST /session/{id}/prompt_async` with one text part. Returns once OpenCode has
    /// accepted it (204); the turn runs in the background.
    pub async fn prompt_async(
        &self,
        id: &str,
        text: &str,
        agent: Option<&str>,
        model: Option<(&str, &str)>,
        synthetic: bool,
    ) -> Result<(), ClientError> {
        let opts = PromptOptions {
            agent: agent.map(str::to_string),
            model: model.map(|(p, m)| (p.to_string(), m.to_string())),
            synthetic,
            ..PromptOptions::default()
        };
        self.prompt_async_body(id, &opts.body(text)).await
    }

    /// `POST /session/{id}/prompt_async` with a full body (see [`PromptOptions::body`]).
    pub async fn prompt_async_body(&self, id: &str, body: &Value) -> Result<(), ClientError> {
        self.send(Method::POST, &format!("/session/{id}/prompt_async"), None, Some(body)).await.map(drop)
    }

    /// `POST /session/{id}/abort`.
    pub async fn abort(&self, id: &str) -> Result<bool, ClientError> {
        self.call(Method::POST, &format!("/session/{id}/abort"), None, None).await
    }

    /// `POST /session/{id}/summarize` (blocks until the compaction is done).
    pub async fn summarize(&self, id: &str, provider: &str, model: &str) -> Result<bool, ClientError> {
        let body = json!({"providerID": provider, "modelID": model});
        self.call(Method::POST, &format!("/session/{id}/summarize"), None, Some(&body)).await
    }

    /// `GET /session/status`: the non-idle sessions of `directory` (default: the client's
    /// directory, else the server's).
    pub async fn status(&self, directory: Option<&str>) -> Result<BTreeMap<String, SessionStatus>, ClientError> {
        self.call(Method::GET, "/session/status", directory, None).await
    }

    /// The status of one session (`Idle` when absent from `/session/status`).
    pub async fn session_status(&self, id: &str) -> Result<SessionStatus, ClientError> {
        Ok(self.status(None).await?.remove(id).unwrap_or(SessionStatus::Idle))
    }

    /// Whether `/session/status` lists the session as busy (or retrying).
    pub async fn is_busy(&self, id: &str) -> Result<bool, ClientError> {
        Ok(!matches!(self.session_status(id).await?, SessionStatus::Idle))
    }

    /// `GET /session/{id}/message`: every message, oldest first.
    pub async fn messages(&self, id: &str) -> Result<Vec<Message>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/message"), None, None).await
    }

    /// The last assistant message, if any.
    pub async fn last_assistant(&self, id: &str) -> Result<Option<Message>, ClientError> {
        Ok(self.messages(id).await?.into_iter().rev().find(|m| m.role() == "assistant"))
    }

    /// `GET /session/{id}/todo`.
    pub async fn todos(&self, id: &str) -> Result<Vec<Todo>, ClientError> {
        self.call(Method::GET, &format!("/session/{id}/todo"), None, None).await
    }

    /// `GET /question`: pending questions of `directory`.
    pub async fn questions(&self, directory: Option<&str>) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, "/question", directory, None).await
    }

    /// `POST /question/{id}/reply` with `answers` (one list of labels per question).
    pub async fn reply_question(&self, id: &str, answers: &[Vec<String>]) -> Result<(), ClientError> {
        let body = json!({ "answers": answers });
        self.send(Method::POST, &format!("/question/{id}/reply"), None, Some(&body)).await.map(drop)
    }

    /// `GET /permission`: pending permission requests of `directory`.
    pub async fn permissions(&self, directory: Option<&str>) -> Result<Vec<Value>, ClientError> {
        self.call(Method::GET, "/permission", directory, None).await
    }

    /// `POST /permission/{id}/reply` (`once | always | reject`, optional message).
    pub async fn reply_permission(&self, id: &str, reply: &str, message: Option<&str>) -> Result<(), ClientError> {
        let mut body = json!({ "reply": reply });
        if let Some(m) = message {
            body["message"] = json!(m);
        }
        self.send(Method::POST, &format!("/permission/{id}/reply"), None, Some(&body)).await.map(drop)
    }

    /// Follows `GET /event` (one directory) and yields each event's JSON
    /// (`{"id","type","properties"}`), starting with `server.connected`. The stream ends
    /// when the server closes it.
    pub async fn events(
        &self,
        directory: Option<&str>,
    ) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        self.sse("/event", directory).await
    }

    /// Follows `GET /global/event` (every directory; frames wrap the event in `payload`).
    pub async fn global_events(&self) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        self.sse("/global/event", None).await
    }

    async fn sse(
        &self,
        path: &str,
        directory: Option<&str>,
    ) -> Result<impl Stream<Item = Result<Value, ClientError>>, ClientError> {
        // The API client's total timeout would cut a long-lived stream: use a client with
        // a read timeout only (OpenCode sends a heartbeat every 10 s).
        let http = reqwest::Client::builder()
            .read_timeout(Duration::from_secs(60))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let url = format!("{}{}", self.base, path);
        let mut rb = http.get(&url);
        if let Some((u, p)) = &self.auth {
            rb = rb.basic_auth(u, Some(p));
        }
        if let Some(dir) = directory.or(self.directory.as_deref()) {
            rb = rb.query(&[("directory", dir)]);
        }
        let transport = |source| ClientError::transport(Method::GET, &url, source);
        let resp = rb.send().await.map_err(transport)?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            return Err(ClientError::Status {
                method: Method::GET,
                url: url.clone(),
                status,
                body: resp.text().await.unwrap_or_default(),
            });
        }
        let bytes = resp.bytes_stream();
        let state = (bytes, String::new(), url);
        Ok(futures::stream::unfold(state, |(mut bytes, mut buf, url)| async move {
            loop {
                if let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    let data: Vec<&str> =
                        frame.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
                    if data.is_empty() {
                        continue;
                    }
                    let joined = data.join("\n");
                    let item = serde_json::from_str(&joined).map_err(|source| ClientError::Decode {
                        method: Method::GET,
                        url: url.clone(),
                        source,
                        body: joined.chars().take(500).collect(),
                    });
                    return Some((item, (bytes, buf, url)));
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => buf.push_str(&String::from_utf8_lossy(&chunk).replace("\r\n", "\n")),
                    Some(Err(source)) => {
                        let err = ClientError::transport(Method::GET, &url, source);
                        return Some((Err(err), (bytes, String::new(), url)));
                    }
                    None => return None,
                }
            }
        }))
    }
}

/// Polls `check` every 100 ms until it returns `Ok(Some(value))`, and returns the value.
/// `Ok(None)` and errors mean "not yet" (a server that is restarting answers with
/// errors); after `timeout` the result is an error naming `what` and the last error seen.
pub async fn wait_until<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error: Option<String>;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => last_error = None,
            Err(e) => last_error = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            match last_error {
                Some(e) => {
                    anyhow::bail!("timed out after {timeout:?} waiting for {what}; last error: {e}")
                }
                None => anyhow::bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`wait_until`] for a yes/no condition.
pub async fn wait_for<E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, E>>,
    E: std::fmt::Display,
{
    wait_until(what, timeout, || {
        let fut = check();
        async move { fut.await.map(|ok| ok.then_some(())) }
    })
    .await
}

impl OpenCodeClient {
    /// Waits until the session is absent from `/session/status` (idle).
    pub async fn wait_idle(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(&format!("session {id} to be idle"), timeout, || async { self.is_busy(id).await.map(|busy| !busy) })
            .await
    }

    /// Prompts `text` and waits until that turn is over: the user message is stored, the
    /// session is idle and the last message is a completed assistant message. Returns that
    /// message. `prompt_async`'s 204 alone means little: the user message is stored and the
    /// session turns busy a moment later (seconds, on a freshly started server).
    ///
    /// A turn that ends without an assistant message (unknown model) times out.
    pub async fn prompt_and_wait(&self, id: &str, text: &str, timeout: Duration) -> anyhow::Result<Message> {
        let users_before = self.user_message_count(id).await?;
        self.prompt_async(id, text, None, None, false).await?;
        self.wait_turn_after(id, users_before, timeout).await
    }

    /// Number of user messages in the session.
    pub async fn user_message_count(&self, id: &str) -> Result<usize, ClientError> {
        Ok(self.messages(id).await?.iter().filter(|m| m.role() == "user").count())
    }

    /// Waits until the session has more than `users_before` user messages, is idle, and
    /// ends with a completed assistant message; returns that message.
    pub async fn wait_turn_after(&self, id: &str, users_before: usize, timeout: Duration) -> anyhow::Result<Message> {
        wait_until(&format!("the turn of session {id} to finish"), timeout, || async {
            if self.is_busy(id).await? {
                return Ok::<_, ClientError>(None);
            }
            let msgs = self.messages(id).await?;
            let users = msgs.iter().filter(|m| m.role() == "user").count();
            Ok(msgs.last().filter(|m| users > users_before && m.role() == "assistant" && m.is_completed()).cloned())
        })
        .await
    }

    /// Waits until `/session/status` lists the session as busy (or retrying).
    pub async fn wait_busy(&self, id: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(&format!("session {id} to be busy"), timeout, || self.is_busy(id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_body_carries_the_options() {
        let opts = PromptOptions {
            agent: Some("plan".into()),
            model: Some(("fake".into(), "fake-model-2".into())),
            synthetic: true,
            metadata: Some(json!({"shepherd": {"kind": "continue"}})),
            ..PromptOptions::default()
        };
        let body = opts.body("go [[fake:ok]]");
        assert_eq!(body.pointer("/parts/0/synthetic"), Some(&json!(true)));
        assert_eq!(body.pointer("/parts/0/metadata/shepherd/kind"), Some(&json!("continue")));
        assert_eq!(body.pointer("/model/modelID"), Some(&json!("fake-model-2")));
        assert_eq!(body.pointer("/agent"), Some(&json!("plan")));
        assert_eq!(body.get("noReply"), None);
    }

    #[test]
    fn status_entries_decode() {
        let v: BTreeMap<String, SessionStatus> = serde_json::from_value(json!({
            "ses_A": {"type": "busy"},
            "ses_B": {"type": "retry", "attempt": 2, "message": "x", "next": 5},
            "ses_C": {"type": "something-new"},
        }))
        .unwrap();
        assert_eq!(v["ses_A"], SessionStatus::Busy);
        assert!(matches!(v["ses_B"], SessionStatus::Retry { attempt: 2, .. }));
        assert_eq!(v["ses_C"], SessionStatus::Other);
    }

    #[tokio::test]
    async fn wait_until_times_out_with_the_last_error() {
        let r: anyhow::Result<()> =
            wait_until("nothing", Duration::from_millis(250), || async { Err::<Option<()>, _>("boom") }).await;
        let msg = format!("{:#}", r.unwrap_err());
        assert!(msg.contains("nothing") && msg.contains("boom"), "{msg}");
    }
}
