//! `GET /session/{id}/message` as Shepherd reads it — the last turn's agent and model,
//! the history a hand-off carries — and the body of the prompts it sends
//! (`prompt_async`, `message`). A message's `info` is decoded by the event stream's own
//! decoder, only where needed; one that does not decode is skipped, never fatal.

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;
use shepherd_actors::event::{MessageInfo, Role, ShepherdTag, ToolStatus};
use shepherd_actors::ids::{self, IdKind};
use shepherd_actors::ports::{EngineError, HistoryMessage, HistoryPart, Prompt, TurnSettings};

use super::session_ids::session_path;
use super::OpenCodeClient;

/// How many recent messages are read to find the last user turn's agent and model.
pub(super) const TURN_LOOKBACK_MESSAGES: u32 = 30;

/// A message's `error`, nothing else.
#[derive(Deserialize)]
pub(super) struct ErrorOnly {
    #[serde(default)]
    pub(super) error: Option<ErrorName>,
}

#[derive(Deserialize)]
pub(super) struct ErrorName {
    pub(super) name: String,
}

#[derive(Deserialize)]
pub(super) struct MessageWithParts {
    /// Decoded only where needed ([`decode_message`]), straight from its text.
    pub(super) info: Box<serde_json::value::RawValue>,
    #[serde(default)]
    pub(super) parts: Vec<serde_json::Value>,
}

impl OpenCodeClient {
    /// The session's last [`TURN_LOOKBACK_MESSAGES`] messages, oldest first.
    pub(super) async fn recent_messages(&self, session_id: &str) -> Result<Vec<MessageWithParts>, EngineError> {
        self.messages(session_id, TURN_LOOKBACK_MESSAGES).await
    }

    /// The session's last `limit` messages, oldest first, as the server sent them.
    pub(super) async fn messages(&self, session_id: &str, limit: u32) -> Result<Vec<MessageWithParts>, EngineError> {
        let rb = self.request(Method::GET, &session_path(session_id, "/message")?).query(&[("limit", limit)]);
        self.get_json(rb, "GET /session/{id}/message").await
    }
}

/// The body of `prompt_async` / `message`: one synthetic text part tagged as ours, the
/// turn's agent and model, `noReply` for notes.
pub(super) fn prompt_body(prompt: &Prompt) -> serde_json::Value {
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

/// Agent and model of the newest user message (of `messages`, oldest first) that names them.
pub(super) fn turn_settings(messages: &[MessageWithParts]) -> TurnSettings {
    messages
        .iter()
        .rev()
        .filter_map(|m| decode_message(&m.info))
        .find(|info| info.role == Role::User && (info.agent.is_some() || info.model.is_some()))
        .map(|info| TurnSettings { agent: info.agent, model: info.model })
        .unwrap_or_default()
}

/// One message of `GET /session/{id}/message` as the hand-off reads it; `None` for a
/// message whose `info` does not decode (skipped, never fatal).
pub(super) fn history_message(m: &MessageWithParts) -> Option<HistoryMessage> {
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

/// A message's `info` through the same decoder the event stream uses.
pub(super) fn decode_message(info: &serde_json::value::RawValue) -> Option<MessageInfo> {
    shepherd_actors::event::decode_message_info(info.get()).ok()
}
