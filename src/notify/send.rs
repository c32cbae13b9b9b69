//! The HTTP edge: one POST per message to one target, retried with back-off on what may
//! pass (a connect error, a timeout, 408, 429, 5xx) at most `retries` times. The URL is
//! never logged or put in an error whole (only [`display_url`]); reqwest's errors are
//! stripped of it.

use std::time::Duration;

use reqwest::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use shepherd_actors::config::NotifyConfig;

use super::body::Request;

/// Why a POST did not get through, without the URL.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("HTTP {0}")]
    Status(u16),
    #[error("{0}")]
    Transport(String),
}

impl SendError {
    /// Worth another attempt?
    pub fn transient(&self) -> bool {
        match self {
            SendError::Status(s) => *s == 408 || *s == 429 || *s >= 500,
            SendError::Transport(_) => true,
        }
    }
}

/// `scheme://host[:port]/…`: what may be logged of a URL (a Slack hook's path, an ntfy
/// topic or a `?token=` are secrets).
pub fn display_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("?", url));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    let tail = if rest.len() > host.len() { "/…" } else { "" };
    format!("{scheme}://{host}{tail}")
}

/// The wait before retry `n` (1-based): `retry_backoff × 2^(n-1)`, at most
/// `retry_max_backoff`; a `Retry-After` of seconds replaces it within the same bound.
pub fn backoff(n: u32, retry_after: Option<Duration>, cfg: &NotifyConfig) -> Duration {
    let doubled = cfg.retry_backoff.saturating_mul(1u32 << (n.saturating_sub(1)).min(16));
    retry_after.unwrap_or(doubled).min(cfg.retry_max_backoff)
}

/// One target's HTTP client.
#[derive(Clone)]
pub struct Target {
    cfg: NotifyConfig,
    url: String,
    client: reqwest::Client,
}

impl Target {
    pub fn new(cfg: &NotifyConfig, url: String) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Target { cfg: cfg.clone(), url, client })
    }

    /// The URL as it may be logged.
    pub fn shown(&self) -> String {
        display_url(&self.url)
    }

    /// POSTs `req`, retrying transient failures. `Ok(attempts)` when delivered.
    pub async fn post(&self, req: &Request) -> Result<u32, (u32, SendError)> {
        let mut attempt = 1;
        loop {
            let (result, retry_after) = self.once(req).await;
            match result {
                Ok(()) => return Ok(attempt),
                Err(e) if e.transient() && attempt <= self.cfg.retries => {
                    let wait = backoff(attempt, retry_after, &self.cfg);
                    tracing::debug!(url = %self.shown(), attempt, error = %e, wait_ms = wait.as_millis() as u64, "notification: retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Err(e) => return Err((attempt, e)),
            }
        }
    }

    async fn once(&self, req: &Request) -> (Result<(), SendError>, Option<Duration>) {
        let mut builder = self
            .client
            .post(&self.url)
            .header(CONTENT_TYPE, HeaderValue::from_static(req.content_type))
            .body(req.body.clone());
        for (name, value) in &req.headers {
            builder = builder.header(*name, value.as_str());
        }
        match builder.send().await {
            Ok(resp) if resp.status().is_success() => (Ok(()), None),
            Ok(resp) => {
                let retry_after = (resp.status() == StatusCode::TOO_MANY_REQUESTS)
                    .then(|| resp.headers().get(RETRY_AFTER)?.to_str().ok()?.trim().parse::<u64>().ok())
                    .flatten()
                    .map(Duration::from_secs);
                (Err(SendError::Status(resp.status().as_u16())), retry_after)
            }
            Err(e) => (Err(SendError::Transport(e.without_url().to_string())), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use shepherd_actors::config::NotifyKind;

    use super::*;

    #[test]
    fn a_logged_url_keeps_only_the_scheme_and_the_host() {
        assert_eq!(display_url("https://hooks.slack.com/services/T0/B0/SECRET"), "https://hooks.slack.com/…");
        assert_eq!(display_url("https://user:pw@ntfy.example:8443/topic?auth=tok"), "https://ntfy.example:8443/…");
        assert_eq!(display_url("http://127.0.0.1:9"), "http://127.0.0.1:9");
    }

    #[test]
    fn the_back_off_doubles_up_to_its_bound_and_honours_retry_after_within_it() {
        let mut cfg = NotifyConfig::new(NotifyKind::Webhook, "http://x");
        cfg.retry_backoff = Duration::from_secs(1);
        cfg.retry_max_backoff = Duration::from_secs(5);
        let waits: Vec<u64> = (1..=5).map(|n| backoff(n, None, &cfg).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 5, 5]);
        assert_eq!(backoff(1, Some(Duration::from_secs(3)), &cfg), Duration::from_secs(3));
        assert_eq!(backoff(1, Some(Duration::from_secs(3600)), &cfg), Duration::from_secs(5));
    }

    #[test]
    fn server_errors_throttling_and_transport_errors_are_retried_other_client_errors_are_not() {
        for (s, retried) in [(500, true), (503, true), (429, true), (408, true), (400, false), (404, false)] {
            assert_eq!(SendError::Status(s).transient(), retried, "{s}");
        }
        assert!(SendError::Transport("connection refused".into()).transient());
    }
}
