//! A session as the server describes it (`session.created/updated/deleted`), the marks
//! Shepherd writes on the sessions it creates, its status (`session.status`) and the
//! errors a session or a message carries.

use serde::Deserialize;

/// `Session` as the server describes it (only what Shepherd uses).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub id: String,
    #[serde(default, rename = "parentID")]
    pub parent_id: Option<String>,
    #[serde(default)]
    pub directory: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub time: Times,
    /// Free-form metadata given at creation; Shepherd marks the sessions it creates.
    #[serde(default)]
    pub metadata: Option<SessionMetadata>,
}

impl SessionInfo {
    /// The session Shepherd handed over to this one, if it was created by a hand-off.
    pub fn handoff_from(&self) -> Option<&str> {
        self.metadata.as_ref()?.shepherd.as_ref()?.handoff_from.as_deref()
    }
}

/// `Session.metadata`: only Shepherd's own marks are read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct SessionMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shepherd: Option<ShepherdSessionMark>,
}

/// What Shepherd writes into the metadata of a session it creates.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ShepherdSessionMark {
    /// The session whose work this one continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_from: Option<String>,
    /// The hand-off (snapshot) id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<String>,
}

/// Epoch-millisecond timestamps carried by sessions and messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Times {
    #[serde(default)]
    pub created: Option<i64>,
    #[serde(default)]
    pub updated: Option<i64>,
    #[serde(default)]
    pub completed: Option<i64>,
}

/// `session.status` → `status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Status {
    Idle,
    Busy,
    /// OpenCode is waiting to retry a failed model call; `next` is epoch ms.
    Retry {
        #[serde(default)]
        attempt: Option<u32>,
        #[serde(default)]
        next: Option<i64>,
    },
}

/// An error as carried by `session.error` and by failed assistant messages.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ErrorInfo {
    pub name: String,
    #[serde(default)]
    pub data: Option<ErrorData>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ErrorData {
    #[serde(default)]
    pub message: Option<String>,
    /// The provider's HTTP status (`APIError` after OpenCode's retries: 429, 500, …).
    #[serde(default, rename = "statusCode")]
    pub status_code: Option<u16>,
    /// OpenCode's verdict that the call may succeed if tried again.
    #[serde(default, rename = "isRetryable")]
    pub is_retryable: Option<bool>,
    /// `metadata.code`: `ProviderResponseStreamError`, `ProviderHeaderTimeoutError`, …
    #[serde(default, deserialize_with = "metadata_code")]
    pub metadata: Option<String>,
}

/// `metadata.code` of an error's data, when it is a string (other shapes are ignored).
fn metadata_code<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<serde_json::Value>::deserialize(d)?;
    Ok(v.and_then(|m| m.get("code").and_then(|c| c.as_str()).map(str::to_string)))
}

impl ErrorInfo {
    pub const ABORTED: &'static str = "MessageAbortedError";
    pub const CONTEXT_OVERFLOW: &'static str = "ContextOverflowError";

    pub fn is_abort(&self) -> bool {
        self.name == Self::ABORTED
    }
}
