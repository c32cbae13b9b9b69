//! A message part (`message.part.updated`): text (with Shepherd's tag on its own
//! prompts), reasoning, a tool call (its status, the child session of a `task`, a hash
//! of its input), step marks, compaction. Free-form metadata is read leniently.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::lenient;

/// How Shepherd marks its own prompts: part `metadata.shepherd`, stored and echoed
/// unchanged by OpenCode, so this instance and others recognise them in events and
/// in history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ShepherdTag {
    pub kind: String,
    #[serde(default)]
    pub instance: String,
    #[serde(default)]
    pub decision: String,
    /// The fencing token of the session lease the prompt was sent under (shared
    /// `redis` backend only): a later holder's prompts carry a higher one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
}

/// `message.part.updated` → `part`.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub id: String,
    pub message_id: String,
    pub session_id: String,
    pub kind: PartKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PartKind {
    /// `text` is the part's full text (OpenCode sends it when the part closes; while
    /// streaming it is empty and the deltas carry the words).
    Text {
        text: String,
        synthetic: bool,
        ignored: bool,
        shepherd: Option<ShepherdTag>,
    },
    Reasoning,
    Tool {
        tool: String,
        status: ToolStatus,
        child_session: Option<String>,
        /// A hash of the call's input (to tell repeated identical calls), when present.
        input: Option<u64>,
    },
    StepStart,
    StepFinish,
    Compaction,
    Other(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolStatus {
    Pending,
    Running,
    Completed,
    Error,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawPart<'a> {
    id: String,
    #[serde(rename = "messageID")]
    message_id: String,
    #[serde(rename = "sessionID")]
    session_id: String,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    /// Kept only for text parts (reasoning text is never copied).
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    synthetic: Option<bool>,
    #[serde(default)]
    ignored: Option<bool>,
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default, borrow)]
    state: Option<RawToolState<'a>>,
}

#[derive(Deserialize)]
struct RawToolState<'a> {
    status: ToolStatus,
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default)]
    input: Option<serde_json::Value>,
}

/// A text part's `metadata`: only Shepherd's tag is read.
#[derive(Deserialize)]
struct TextMetadata<'a> {
    #[serde(default, borrow)]
    shepherd: Option<&'a RawValue>,
}

/// A tool part's `state.metadata`: only the child session of a `task` is read.
#[derive(Deserialize)]
struct ToolMetadata<'a> {
    #[serde(default, rename = "sessionId", borrow)]
    session_id: Option<&'a RawValue>,
}

impl TryFrom<RawPart<'_>> for Part {
    type Error = String;

    fn try_from(r: RawPart<'_>) -> Result<Self, String> {
        let kind = match r.kind.as_ref() {
            "text" => PartKind::Text {
                text: r.text.map(Cow::into_owned).unwrap_or_default(),
                synthetic: r.synthetic.unwrap_or(false),
                ignored: r.ignored.unwrap_or(false),
                shepherd: lenient::<TextMetadata>(r.metadata).and_then(|m| lenient(m.shepherd)),
            },
            "reasoning" => PartKind::Reasoning,
            "tool" => {
                let state = r.state.ok_or("tool part without state")?;
                let child_session = lenient::<ToolMetadata>(state.metadata).and_then(|m| lenient(m.session_id));
                let input = state.input.as_ref().map(input_key);
                PartKind::Tool { tool: r.tool.unwrap_or_default(), status: state.status, child_session, input }
            }
            "step-start" => PartKind::StepStart,
            "step-finish" => PartKind::StepFinish,
            "compaction" => PartKind::Compaction,
            other => PartKind::Other(other.to_string()),
        };
        Ok(Part { id: r.id, message_id: r.message_id, session_id: r.session_id, kind })
    }
}

/// A stable hash of a tool input, for comparing calls (the loop and spin detectors
/// compare these; the part keeps the key, not the input).
fn input_key(input: &serde_json::Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fingerprint::hasher();
    input.to_string().hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::input_key;

    #[test]
    fn input_keys_tell_inputs_apart() {
        let a = serde_json::json!({"command": "ls"});
        assert_eq!(input_key(&a), input_key(&a.clone()));
        assert_ne!(input_key(&a), input_key(&serde_json::json!({"command": "ls -la"})));
    }
}
