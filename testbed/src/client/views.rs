//! The typed views of OpenCode's answers this helper offers: health, a session's status,
//! a todo, a message (kept as JSON, with accessors for what tests usually look at).

use serde::{Deserialize, Serialize};
use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

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
}
