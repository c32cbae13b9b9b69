//! `GET /session/{id}/message` as Shepherd reads it — the last turn's agent and model,
//! the history a hand-off carries — and the body of the prompts it sends
//! (`prompt_async`, `message`). A message's `info` is decoded by the event stream's own
//! decoder, only where needed; one that does not decode is skipped, never fatal.

use reqwest::Method;
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;
use serde_json::Value;
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
    pub(super) info: Box<RawValue>,
    /// Each decoded only where needed ([`PartFields::of`]): most of a turn's text is a
    /// tool's output or a file's contents, which nothing here reads — kept as text, never
    /// built into a tree (thirty messages of file reads were megabytes of small
    /// allocations on the sessions' thread at every continue).
    #[serde(default)]
    pub(super) parts: Vec<Box<RawValue>>,
}

/// The fields of a message part Shepherd reads, each as the server sent it (of the
/// wrong type it reads as absent, as from the whole part); everything else is skipped
/// unparsed. A part that is not an object (or names a field twice) is skipped.
#[derive(Deserialize, Default)]
pub(super) struct PartFields {
    #[serde(rename = "type", default)]
    pub(super) kind: Value,
    #[serde(default)]
    pub(super) text: Value,
    #[serde(default)]
    synthetic: Value,
    #[serde(default)]
    ignored: Value,
    #[serde(default)]
    pub(super) tool: Value,
    #[serde(default)]
    metadata: Value,
    /// Kept as text and read by itself ([`PartFields::state`]): its output is large, and
    /// a state that does not read must not cost the part.
    #[serde(default)]
    state: Option<Box<RawValue>>,
}

/// A tool part's `state`, the fields Shepherd reads.
#[derive(Deserialize, Default)]
pub(super) struct ToolState {
    #[serde(default)]
    pub(super) status: Value,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    error: Value,
    #[serde(default)]
    metadata: Option<Box<RawValue>>,
}

/// A tool state's `metadata`: the child session of a `task`.
#[derive(Deserialize)]
struct ToolMetadata {
    #[serde(rename = "sessionId", default)]
    session_id: Value,
}

impl PartFields {
    pub(super) fn of(part: &RawValue) -> Option<PartFields> {
        serde_json::from_str(part.get()).ok()
    }

    /// The tool's state (empty when absent or unreadable).
    pub(super) fn state(&self) -> ToolState {
        self.state.as_deref().and_then(|s| serde_json::from_str(s.get()).ok()).unwrap_or_default()
    }
}

impl ToolState {
    /// A `task`'s child session, when its id is one.
    fn child_session(&self) -> Option<String> {
        let meta: ToolMetadata = serde_json::from_str(self.metadata.as_deref()?.get()).ok()?;
        meta.session_id.as_str().filter(|c| ids::check(IdKind::Session, c).is_ok()).map(str::to_string)
    }
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
        .filter_map(|p| PartFields::of(p))
        .filter_map(|p| {
            let text = || p.text.as_str().unwrap_or_default().to_string();
            match p.kind.as_str()? {
                "text" => Some(HistoryPart::Text {
                    text: text(),
                    synthetic: p.synthetic.as_bool().unwrap_or(false),
                    ignored: p.ignored.as_bool().unwrap_or(false),
                    shepherd: p
                        .metadata
                        .get("shepherd")
                        .and_then(|v| serde_json::from_value::<ShepherdTag>(v.clone()).ok()),
                }),
                "reasoning" => Some(HistoryPart::Reasoning { text: text() }),
                "tool" => {
                    let state = p.state();
                    Some(HistoryPart::Tool {
                        tool: p.tool.as_str().unwrap_or_default().to_string(),
                        status: serde_json::from_value::<ToolStatus>(state.status.clone()).unwrap_or(ToolStatus::Pending),
                        child_session: state.child_session(),
                        error: state.error.as_str().map(str::to_string),
                        input: state.input,
                    })
                }
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
pub(super) fn decode_message(info: &RawValue) -> Option<MessageInfo> {
    shepherd_actors::event::decode_message_info(info.get()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each part reads as the history needs it — a text part's flags and Shepherd's tag,
    /// a tool's status, input, error and child session — while a tool's output is never
    /// read; a part that is not an object, or whose state does not read, costs nothing
    /// else of the message.
    #[test]
    fn a_messages_parts_read_as_history_and_the_rest_is_skipped() {
        let output = "x".repeat(200_000);
        let m: MessageWithParts = serde_json::from_value(json!({
            "info": {"id": "msg_1", "sessionID": "ses_A", "role": "assistant", "time": {"created": 5}},
            "parts": [
                {"type": "text", "text": "continue", "synthetic": true,
                 "metadata": {"shepherd": {"kind": "continue", "instance": "i", "decision": "d"}}},
                {"type": "text", "text": "by hand", "synthetic": "not a flag"},
                {"type": "reasoning", "text": "thinking"},
                {"type": "tool", "tool": "task", "state": {"status": "running", "input": {"prompt": "p"},
                 "output": output, "metadata": {"sessionId": "ses_child", "output": output}}},
                {"type": "tool", "tool": "bash", "state": {"status": "error", "error": "denied", "input": {}}},
                {"type": "tool", "tool": "read", "state": "not an object"},
                "not a part",
                {"type": "step-start"}
            ]
        }))
        .unwrap();
        let h = history_message(&m).expect("the info reads");
        assert_eq!(h.id, "msg_1");
        assert_eq!(
            h.parts,
            vec![
                HistoryPart::Text {
                    text: "continue".into(),
                    synthetic: true,
                    ignored: false,
                    shepherd: Some(ShepherdTag {
                        kind: "continue".into(),
                        instance: "i".into(),
                        decision: "d".into(),
                        lease: None
                    }),
                },
                HistoryPart::Text { text: "by hand".into(), synthetic: false, ignored: false, shepherd: None },
                HistoryPart::Reasoning { text: "thinking".into() },
                HistoryPart::Tool {
                    tool: "task".into(),
                    status: ToolStatus::Running,
                    input: json!({"prompt": "p"}),
                    error: None,
                    child_session: Some("ses_child".into()),
                },
                HistoryPart::Tool {
                    tool: "bash".into(),
                    status: ToolStatus::Error,
                    input: json!({}),
                    error: Some("denied".into()),
                    child_session: None,
                },
                HistoryPart::Tool {
                    tool: "read".into(),
                    status: ToolStatus::Pending,
                    input: Value::Null,
                    error: None,
                    child_session: None,
                },
            ]
        );
    }
}
