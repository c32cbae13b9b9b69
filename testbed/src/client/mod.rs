//! A thin REST helper over an OpenCode server for tests and the demo: create sessions,
//! prompt, abort, read status / messages / todos / questions, follow `/event`, and poll
//! for a condition with [`wait_until`].
//!
//! It is deliberately shallow — JSON in, JSON (or a few small typed views) out — and is
//! **not** Shepherd's production OpenCode client (that lives in `shepherd::opencode`); tests
//! use this one to drive and observe OpenCode independently of the code under test.
//!
//! Parts: `error` ([`ClientError`]), `views` (the typed views of answers), `session`
//! (the session routes and [`PromptOptions`]), `questions` (what an agent waits on a
//! person for, and the answer), `events` (following `/event` and `/global/event`),
//! `wait` ([`wait_until`] and the waits built on it). This file holds the client and its
//! request plumbing.

mod error;
mod events;
mod questions;
mod session;
mod views;
mod wait;

use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use self::error::ClientError;
pub use self::session::PromptOptions;
pub use self::views::{Health, Message, SessionStatus, Todo};
pub use self::wait::{wait_for, wait_until};

/// Timeout of ordinary API calls.
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a pooled connection may sit idle and still be used: less than the 5 s after
/// which OpenCode 1.19 closes one. A test's prompt sent on a connection the server is
/// closing at that moment would fail though the test did nothing wrong.
const POOL_IDLE: Duration = Duration::from_secs(4);

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
        let http = reqwest::Client::builder()
            .timeout(API_TIMEOUT)
            .pool_idle_timeout(POOL_IDLE)
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
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
}
