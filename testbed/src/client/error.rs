//! [`ClientError`]: a call that failed, with the method and URL it was, and the cause
//! (its whole source chain, which reqwest's own message hides).

use reqwest::Method;
use thiserror::Error;

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
    pub(super) fn transport(method: Method, url: &str, source: reqwest::Error) -> ClientError {
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
