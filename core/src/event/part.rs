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
    pub(super) id: String,
    #[serde(rename = "messageID")]
    pub(super) message_id: String,
    #[serde(rename = "sessionID")]
    pub(super) session_id: String,
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    /// Kept only for text parts (reasoning text is never copied).
    #[serde(default, borrow)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) synthetic: Option<bool>,
    #[serde(default)]
    pub(super) ignored: Option<bool>,
    #[serde(default, borrow)]
    pub(super) metadata: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) tool: Option<String>,
    #[serde(default, borrow)]
    pub(super) state: Option<RawToolState<'a>>,
}

#[derive(Deserialize)]
pub(super) struct RawToolState<'a> {
    pub(super) status: ToolStatus,
    #[serde(default, borrow)]
    pub(super) metadata: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) input: Option<InputKey>,
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
                let input = state.input.map(|k| k.0);
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
/// compare these; the part keeps the key, not the input). The same input in any key
/// order, spacing or escaping gives the same key, and it is computed as the input is
/// read, without building it: an input can be a whole file's content, and OpenCode
/// sends it again with every status of the call.
pub(super) struct InputKey(u64);

/// Tags that keep a value of one kind from hashing as another of the same bytes.
#[derive(Hash)]
enum Tag {
    Null,
    Bool(bool),
    Signed(i64),
    Unsigned(u64),
    Float(u64),
    Text,
    List(usize),
    Map(usize),
}

impl InputKey {
    /// The key of an input given as its JSON text (`None`: not JSON).
    pub(super) fn of_json(input: &str) -> Option<InputKey> {
        serde_json::from_str(input).ok()
    }

    fn of(tag: Tag, text: Option<&str>) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::hasher();
        tag.hash(&mut h);
        if let Some(text) = text {
            text.hash(&mut h);
        }
        InputKey(h.finish())
    }
}

impl<'de> serde::Deserialize<'de> for InputKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(InputKeyVisitor)
    }
}

struct InputKeyVisitor;

impl<'de> serde::de::Visitor<'de> for InputKeyVisitor {
    type Value = InputKey;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Null, None))
    }

    fn visit_bool<E>(self, v: bool) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Bool(v), None))
    }

    fn visit_i64<E>(self, v: i64) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Signed(v), None))
    }

    fn visit_u64<E>(self, v: u64) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Unsigned(v), None))
    }

    fn visit_f64<E>(self, v: f64) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Float(v.to_bits()), None))
    }

    fn visit_str<E>(self, v: &str) -> Result<InputKey, E> {
        Ok(InputKey::of(Tag::Text, Some(v)))
    }

    /// A list: its items' keys in order.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<InputKey, A::Error> {
        use std::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::hasher();
        let mut n = 0;
        while let Some(item) = seq.next_element::<InputKey>()? {
            item.0.hash(&mut h);
            n += 1;
        }
        Tag::List(n).hash(&mut h);
        Ok(InputKey(h.finish()))
    }

    /// An object: its entries' keys (name and value) combined in an order-free way (a
    /// sum), so that the same object with its keys in another order is the same input.
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<InputKey, A::Error> {
        use std::hash::{Hash, Hasher};
        let (mut sum, mut n) = (0u64, 0);
        // A name is hashed as the text it is (no `String` is made of it either).
        while let Some(name) = map.next_key::<InputKey>()? {
            let value = map.next_value::<InputKey>()?;
            let mut h = crate::fingerprint::hasher();
            (name.0, value.0).hash(&mut h);
            sum = sum.wrapping_add(h.finish());
            n += 1;
        }
        let mut h = crate::fingerprint::hasher();
        (Tag::Map(n), sum).hash(&mut h);
        Ok(InputKey(h.finish()))
    }
}

#[cfg(test)]
mod tests {
    use super::InputKey;

    fn key(json: &str) -> u64 {
        serde_json::from_str::<InputKey>(json).expect("JSON").0
    }

    #[test]
    fn input_keys_tell_inputs_apart() {
        assert_eq!(key(r#"{"command":"ls"}"#), key(r#"{"command":"ls"}"#));
        assert_ne!(key(r#"{"command":"ls"}"#), key(r#"{"command":"ls -la"}"#));
        assert_ne!(key(r#"{"command":"ls"}"#), key(r#"{"cmd":"ls"}"#));
        assert_ne!(key(r#"{"a":"b","c":"d"}"#), key(r#"{"a":"d","c":"b"}"#), "values belong to their names");
        assert_ne!(key(r#"["a","b"]"#), key(r#"["b","a"]"#), "a list's order counts");
        assert_ne!(key(r#"[1]"#), key(r#""1""#));
        assert_ne!(key(r#"{}"#), key(r#"[]"#));
        assert_ne!(key(r#"[[]]"#), key(r#"[]"#));
    }

    /// The same input as another model (or OpenCode) might spell it is the same call.
    #[test]
    fn the_same_input_in_another_key_order_spacing_or_escaping_is_the_same_key() {
        let a = key(r#"{"todos":[{"content":"Write the parser","status":"in_progress"}],"n":1}"#);
        assert_eq!(a, key(r#"{ "n": 1, "todos": [ { "status": "in_progress", "content": "Write the parser" } ] }"#));
        assert_eq!(a, key(r#"{"n":1,"todos":[{"status":"in_progress","content":"Write the \u0070arser"}]}"#));
    }
}
