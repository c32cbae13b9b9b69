//! Decoding one SSE `data:` frame into an [`Envelope`]: both stream shapes read in one
//! pass, a known type's `properties` read into its typed struct, and what a hostile
//! server could send refused with a clear [`DecodeError`] (ids not of OpenCode's shape,
//! implausible type names, directories no path could have).
//!
//! The usual events in OpenCode's exact form never come this far: [`super::quick`] reads
//! them straight, and hands anything else here. Of the rest, the usual frame is parsed
//! once: OpenCode's global stream sends `payload` with its `type` before its
//! `properties`, and then the properties are read into the type's struct as the parser
//! meets them ([`one_pass`]). Anything else — the other field order, the per-directory
//! shape, a frame that is refused — takes the general path ([`two_pass`]): `properties`
//! kept as an unparsed slice until the type is known. The general path decides every error, so
//! both paths refuse the same frames with the same words.

use std::borrow::Cow;

use serde::de::{DeserializeSeed, Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::head::{read_head, FrameHead};
use super::{lenient, MAX_DIRECTORY_LEN};
use super::message::RawMessageInfo;
use super::part::RawPart;
use super::quick;
use super::{Envelope, ErrorInfo, Event, MessageInfo, SessionInfo, Status, Todo};

/// Why a frame could not be decoded. The frame is skipped; the stream goes on.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("frame has no event type")]
    NoType,
    #[error("{kind}: unexpected shape: {reason}")]
    BadShape { kind: String, reason: String },
    /// An id that is not of OpenCode's shape (see [`crate::ids`]): the event is dropped.
    #[error("{kind}: {source}")]
    BadId { kind: String, source: crate::ids::BadId },
    /// An event type that is not a plausible name (too long, odd characters): not kept,
    /// not counted under its name.
    #[error("event type {} is not a plausible name", crate::ids::excerpt(.0))]
    BadType(String),
    /// A directory longer than [`MAX_DIRECTORY_LEN`] or holding NUL: no path is.
    #[error("the event's directory is longer than 4096 bytes or holds NUL")]
    BadDirectory,
}

/// Either stream shape, read in one pass: `properties` stays an unparsed slice until
/// the type says what it holds. `directory` is free-form (a non-string is ignored).
#[derive(Deserialize)]
struct RawFrame<'a> {
    #[serde(default, borrow)]
    directory: Option<&'a RawValue>,
    #[serde(default, borrow)]
    payload: Option<RawPayload<'a>>,
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    properties: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawPayload<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    properties: Option<&'a RawValue>,
}

/// [`RawFrame`] for [`one_pass`]: the same fields, read the same way (so it refuses
/// what [`RawFrame`] refuses), except that `payload` is read in place.
#[derive(Deserialize)]
struct OnePassFrame<'a> {
    #[serde(default, borrow)]
    directory: Option<&'a RawValue>,
    #[serde(default)]
    payload: Option<OnePassPayload>,
    #[allow(dead_code)] // read only to refuse what `RawFrame` refuses
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[allow(dead_code)] // as `kind`
    #[serde(default, borrow)]
    properties: Option<&'a RawValue>,
}

/// A payload whose `type` came before its `properties`, decoded as they were read.
struct OnePassPayload {
    event: Event,
}

/// The keys of a payload, as `RawPayload` names them; the rest is skipped.
#[derive(Deserialize)]
#[serde(field_identifier)]
enum PayloadKey {
    #[serde(rename = "type")]
    Type,
    #[serde(rename = "properties")]
    Properties,
    #[serde(other)]
    Other,
}

/// An event type name, borrowed from the frame unless it holds escapes.
#[derive(Deserialize)]
struct KindName<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de> Deserialize<'de> for OnePassPayload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Payload;
        impl<'de> Visitor<'de> for Payload {
            type Value = OnePassPayload;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an event payload with its type before its properties")
            }

            // Every way out but one is an error: the frame then goes to `two_pass`.
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<OnePassPayload, M::Error> {
                let mut kind: Option<Cow<'de, str>> = None;
                let mut event = None;
                while let Some(key) = map.next_key::<PayloadKey>()? {
                    match key {
                        PayloadKey::Type if kind.is_none() => kind = Some(map.next_value::<KindName>()?.0),
                        PayloadKey::Properties if event.is_none() => {
                            let Some(kind) = kind.as_deref().filter(|k| is_plausible_kind(k)) else {
                                return Err(M::Error::custom("properties before a plausible type"));
                            };
                            event = Some(map.next_value_seed(PropsInPlace(kind))?);
                        }
                        PayloadKey::Type | PayloadKey::Properties => return Err(M::Error::custom("duplicate field")),
                        PayloadKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let event = event.ok_or_else(|| M::Error::custom("no properties"))?;
                Ok(OnePassPayload { event })
            }
        }
        d.deserialize_map(Payload)
    }
}

/// Reads a known type's `properties` straight from the frame's parser.
struct PropsInPlace<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for PropsInPlace<'_> {
    type Value = Event;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Event, D::Error> {
        let mut props = InPlace(Some(d));
        let event = decode_event(self.0, &mut props).map_err(D::Error::custom)?;
        if let Some(unread) = props.0 {
            IgnoredAny::deserialize(unread)?; // a type that reads nothing of them
        }
        Ok(event)
    }
}

/// Where a type's `properties` are read from: an unparsed slice ([`two_pass`]), or the
/// frame's parser standing at them ([`one_pass`]).
trait Props<'a> {
    fn read<T: Deserialize<'a>>(&mut self) -> Result<T, String>;
}

impl<'a> Props<'a> for &'a str {
    fn read<T: Deserialize<'a>>(&mut self) -> Result<T, String> {
        serde_json::from_str(self).map_err(|e| e.to_string())
    }
}

/// The frame's parser at the properties, taken by the first read.
struct InPlace<D>(Option<D>);

impl<'a, D: Deserializer<'a>> Props<'a> for InPlace<D> {
    fn read<T: Deserialize<'a>>(&mut self) -> Result<T, String> {
        let d = self.0.take().ok_or("properties read twice")?;
        T::deserialize(d).map_err(|e| e.to_string())
    }
}

/// Decodes one SSE `data:` payload (either stream shape).
pub fn decode(frame: &str) -> Result<Envelope, DecodeError> {
    // `sync` duplicates are over a quarter of the global stream and only counted:
    // OpenCode's compact form is recognised by its head ([`super::head`]). Any other
    // spelling takes the full path below.
    match read_head(frame) {
        FrameHead::Sync => Ok(Envelope { directory: None, event: Event::Sync }),
        FrameHead::Delta(_) | FrameHead::Other => decode_past_head(frame),
    }
}

/// [`decode`] for a frame whose head was read already ([`read_head`]) and is not a
/// `sync` duplicate: the head is not read again.
pub fn decode_past_head(frame: &str) -> Result<Envelope, DecodeError> {
    // The global stream's frames, as OpenCode writes them; others would be parsed twice.
    let global = frame.starts_with(r#"{"directory":"#) || frame.starts_with(r#"{"payload":"#);
    // The usual events in OpenCode's exact form are read without serde ([`quick`]).
    match global.then(|| quick::read(frame).or_else(|| one_pass(frame))).flatten() {
        Some(envelope) => Ok(envelope),
        None => two_pass(frame),
    }
}

/// The usual frame, parsed once: `{"directory", "payload": {"type", "properties"}}`
/// with the type first. `None` for any frame it cannot take whole, or that would be
/// refused: [`two_pass`] reads those and says why. What it accepts, it reads exactly as
/// [`two_pass`] would (a test holds the two to it, over every captured frame).
fn one_pass(frame: &str) -> Option<Envelope> {
    let raw: OnePassFrame = serde_json::from_str(frame).ok()?;
    let event = raw.payload?.event;
    let directory = lenient::<String>(raw.directory);
    if directory.as_ref().is_some_and(|d| d.len() > MAX_DIRECTORY_LEN || d.contains('\0')) {
        return None;
    }
    event.ids().check().ok()?;
    Some(Envelope { directory, event })
}

/// Either stream shape, fields in any order: `properties` is kept as an unparsed slice
/// until the type says what it holds, then parsed again into its struct.
pub(super) fn two_pass(frame: &str) -> Result<Envelope, DecodeError> {
    let raw: RawFrame = serde_json::from_str(frame).map_err(|e| {
        if e.is_data() {
            DecodeError::NoType // JSON, but not an event object (or a non-string type)
        } else {
            DecodeError::NotJson(e)
        }
    })?;
    let directory = lenient::<String>(raw.directory);
    if directory.as_ref().is_some_and(|d| d.len() > MAX_DIRECTORY_LEN || d.contains('\0')) {
        return Err(DecodeError::BadDirectory);
    }
    let (kind, props) = match raw.payload {
        Some(p) => (p.kind, p.properties),
        None => (raw.kind, raw.properties),
    };
    let kind = kind.ok_or(DecodeError::NoType)?;
    let props = props.map_or("{}", RawValue::get);
    if !is_plausible_kind(&kind) {
        return Err(DecodeError::BadType(kind.chars().take(MAX_KIND_LEN + 1).collect()));
    }
    let event = decode_event(&kind, &mut { props })
        .map_err(|reason| DecodeError::BadShape { kind: kind.clone().into_owned(), reason })?;
    event.ids().check().map_err(|source| DecodeError::BadId { kind: kind.into_owned(), source })?;
    Ok(Envelope { directory, event })
}

/// A message's `info` as `GET /session/{id}/message` returns it, decoded and its ids
/// checked as a `message.updated` event's are — without wrapping it in a frame.
pub fn decode_message_info(info: &str) -> Result<MessageInfo, DecodeError> {
    const KIND: &str = "message.updated";
    let raw: RawMessageInfo<'_> = serde_json::from_str(info)
        .map_err(|e| DecodeError::BadShape { kind: KIND.to_string(), reason: e.to_string() })?;
    let event = Event::MessageUpdated(Box::new(raw.into()));
    event.ids().check().map_err(|source| DecodeError::BadId { kind: KIND.to_string(), source })?;
    match event {
        Event::MessageUpdated(m) => Ok(*m),
        _ => unreachable!("built as a message above"),
    }
}

/// The longest event type name kept (OpenCode's longest is about 30).
pub const MAX_KIND_LEN: usize = 64;

/// An event type name: 1 to [`MAX_KIND_LEN`] characters of `[A-Za-z0-9._-]`.
fn is_plausible_kind(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= MAX_KIND_LEN
        && kind.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `properties` of the events that name only their session.
#[derive(Deserialize)]
struct OfSession {
    #[serde(rename = "sessionID")]
    session_id: String,
}

#[derive(Deserialize)]
struct OfSessionInfo {
    info: SessionInfo,
}

#[derive(Deserialize)]
struct OfStatus {
    #[serde(rename = "sessionID")]
    session_id: String,
    status: Status,
}

#[derive(Deserialize)]
struct OfError<'a> {
    /// Absent (or not a string) on errors of no particular session.
    #[serde(default, rename = "sessionID", borrow)]
    session_id: Option<&'a RawValue>,
    error: ErrorInfo,
}

#[derive(Deserialize)]
struct OfMessage<'a> {
    #[serde(borrow)]
    info: RawMessageInfo<'a>,
}

#[derive(Deserialize)]
struct OfMessageId {
    #[serde(rename = "sessionID")]
    session_id: String,
    #[serde(rename = "messageID")]
    message_id: String,
}

#[derive(Deserialize)]
struct OfPart<'a> {
    #[serde(borrow)]
    part: RawPart<'a>,
}

#[derive(Deserialize)]
struct OfPartId {
    #[serde(rename = "sessionID")]
    session_id: String,
    #[serde(rename = "messageID")]
    message_id: String,
    #[serde(rename = "partID")]
    part_id: String,
}

#[derive(Deserialize)]
struct OfTodos {
    #[serde(rename = "sessionID")]
    session_id: String,
    todos: Vec<Todo>,
}

#[derive(Deserialize)]
struct OfRequest {
    id: String,
    #[serde(rename = "sessionID")]
    session_id: String,
}

#[derive(Deserialize)]
struct OfReply {
    #[serde(rename = "requestID")]
    request_id: String,
    #[serde(rename = "sessionID")]
    session_id: String,
}

/// Whether Shepherd decodes events of this type; any other type is [`Event::Unknown`]
/// (the metrics count those under one `unknown` label rather than by their names).
pub fn is_known_kind(kind: &str) -> bool {
    // A known type with empty properties fails to decode or decodes as itself; only an
    // unknown type decodes to `Unknown`: the decoder's own match is the one list.
    !matches!(decode_event(kind, &mut "{}"), Ok(Event::Unknown { .. }))
}

fn decode_event<'a>(kind: &str, props: &mut impl Props<'a>) -> Result<Event, String> {
    Ok(match kind {
        "server.connected" => Event::ServerConnected,
        "server.heartbeat" => Event::Heartbeat,
        "sync" => Event::Sync,
        "session.created" => Event::SessionCreated(Box::new(props.read::<OfSessionInfo>()?.info)),
        "session.updated" => Event::SessionUpdated(Box::new(props.read::<OfSessionInfo>()?.info)),
        "session.deleted" => Event::SessionDeleted(Box::new(props.read::<OfSessionInfo>()?.info)),
        "session.status" => {
            let p: OfStatus = props.read()?;
            Event::SessionStatus { session_id: p.session_id, status: p.status }
        }
        "session.idle" => Event::SessionIdle { session_id: props.read::<OfSession>()?.session_id },
        "session.error" => {
            let p: OfError = props.read()?;
            Event::SessionError { session_id: lenient(p.session_id), error: Box::new(p.error) }
        }
        "session.compacted" => Event::SessionCompacted { session_id: props.read::<OfSession>()?.session_id },
        "session.diff" => Event::SessionDiff { session_id: props.read::<OfSession>()?.session_id },
        "message.updated" => Event::MessageUpdated(Box::new(props.read::<OfMessage>()?.info.into())),
        "message.removed" => {
            let p: OfMessageId = props.read()?;
            Event::MessageRemoved { session_id: p.session_id, message_id: p.message_id }
        }
        "message.part.updated" => Event::PartUpdated(Box::new(props.read::<OfPart>()?.part.try_into()?)),
        "message.part.delta" => {
            let p: OfPartId = props.read()?;
            Event::PartDelta { session_id: p.session_id, message_id: p.message_id, part_id: p.part_id }
        }
        "message.part.removed" => {
            let p: OfPartId = props.read()?;
            Event::PartRemoved { session_id: p.session_id, message_id: p.message_id, part_id: p.part_id }
        }
        "todo.updated" => {
            let p: OfTodos = props.read()?;
            Event::TodoUpdated { session_id: p.session_id, todos: p.todos }
        }
        "permission.asked" => {
            let p: OfRequest = props.read()?;
            Event::PermissionAsked { id: p.id, session_id: p.session_id }
        }
        "permission.replied" => {
            let p: OfReply = props.read()?;
            Event::PermissionReplied { request_id: p.request_id, session_id: p.session_id }
        }
        "question.asked" => {
            let p: OfRequest = props.read()?;
            Event::QuestionAsked { id: p.id, session_id: p.session_id }
        }
        "question.replied" => {
            let p: OfReply = props.read()?;
            Event::QuestionReplied { request_id: p.request_id, session_id: p.session_id }
        }
        "question.rejected" => {
            let p: OfReply = props.read()?;
            Event::QuestionRejected { request_id: p.request_id, session_id: p.session_id }
        }
        other => Event::Unknown { kind: other.to_string() },
    })
}

#[cfg(test)]
mod tests {
    use crate::event::{ModelRef, PartKind, ToolStatus};

    use super::*;
    use crate::event::captures::captured_events;

    /// What the general path makes of `frame`, comparable with what `decode` makes.
    fn outcome(result: Result<Envelope, DecodeError>) -> Result<Envelope, String> {
        result.map_err(|e| e.to_string())
    }

    #[test]
    fn the_usual_frame_is_read_in_one_pass_exactly_as_the_general_path_reads_it() {
        let mut one_pass_taken = 0;
        let events = captured_events();
        for (kind, props) in &events {
            let frame = format!(r#"{{"directory":"/p","project":"x","payload":{{"id":"evt_1","type":{kind},"properties":{props}}}}}"#);
            if let Some(envelope) = one_pass(&frame) {
                one_pass_taken += 1;
                assert_eq!(Ok(envelope), outcome(two_pass(&frame)), "{frame}");
            }
            assert_eq!(outcome(decode(&frame)), outcome(two_pass(&frame)), "{frame}");
        }
        assert!(one_pass_taken * 10 >= events.len() * 9, "one pass took {one_pass_taken} of {}", events.len());
    }

    /// Field orders, duplicates, nulls, escapes and stray fields around every captured
    /// event: the one-pass path never accepts what the general path refuses, nor reads
    /// anything differently.
    #[test]
    fn any_other_spelling_of_a_frame_decodes_as_the_general_path_decodes_it() {
        let events = captured_events();
        for (kind, props) in events.iter().step_by(7) {
            let payloads = [
                format!(r#"{{"properties":{props},"type":{kind}}}"#),
                format!(r#"{{"type":{kind},"properties":{props},"type":{kind}}}"#),
                format!(r#"{{"type":{kind},"properties":{props},"properties":{props}}}"#),
                format!(r#"{{"type":{kind},"properties":null}}"#),
                format!(r#"{{"type":{kind}}}"#),
                format!(r#"{{"typ\u0065":{kind},"properti\u0065s":{props}}}"#),
                format!(r#"{{"type":null,"properties":{props}}}"#),
                format!(r#"{{"type":{kind},"properties":{{"sessionID":5}}}}"#),
                format!(r#"{{"type":{kind},"properties":[{props}]}}"#),
                format!(r#"{{"type":"x/y","properties":{props}}}"#),
                format!(r#"{{"type":{kind},"properties":{}}}"#, props.replace(r#""ses_"#, r#""ses_../"#)),
                format!(r#"{{"type":{kind},"properties":{}}}"#, props.replace(r#""msg_"#, r#""msg_a/b"#)),
            ];
            for payload in &payloads {
                for frame in [
                    format!(r#"{{"directory":"/p","payload":{payload}}}"#),
                    format!(r#"{{"payload":{payload},"type":5}}"#),
                    format!(r#"{{"directory":"/p\u0000","payload":{payload}}}"#),
                    format!(r#"{{"payload":{payload},"payload":{payload}}}"#),
                    format!(r#"{{"directory":7,"payload":{payload}}}"#),
                    format!(r#"{{"directory":"{}","payload":{payload}}}"#, "d".repeat(MAX_DIRECTORY_LEN + 1)),
                ] {
                    assert_eq!(outcome(decode(&frame)), outcome(two_pass(&frame)), "{frame}");
                }
            }
        }
    }

    #[test]
    fn known_kinds_are_those_the_decoder_names() {
        for kind in ["session.status", "message.part.updated", "server.heartbeat", "sync", "question.rejected"] {
            assert!(is_known_kind(kind), "{kind}");
        }
        assert!(!is_known_kind("plugin.added"));
    }

    #[test]
    fn global_envelope_carries_the_directory() {
        let frame = r#"{"directory":"/p","project":"x","payload":{"id":"evt_1","type":"session.idle","properties":{"sessionID":"ses_A"}}}"#;
        let env = decode(frame).unwrap();
        assert_eq!(env.directory.as_deref(), Some("/p"));
        assert_eq!(env.event, Event::SessionIdle { session_id: "ses_A".into() });
    }

    #[test]
    fn sync_duplicates_are_recognised_cheaply_in_either_spelling() {
        let compact =
            r#"{"directory":"/p","payload":{"type":"sync","syncEvent":{"type":"message.updated.1","data":{}}}}"#;
        assert_eq!(decode(compact).unwrap().event, Event::Sync);
        let spaced = r#"{"directory": "/p", "payload": {"type": "sync", "syncEvent": {}}}"#;
        assert_eq!(decode(spaced).unwrap().event, Event::Sync);
    }

    /// A tool whose input holds a `sync`-shaped object is a tool call like any other:
    /// the frame's own payload says what it is, not text deeper in it.
    #[test]
    fn an_event_holding_sync_shaped_text_deeper_in_is_decoded_not_dropped() {
        let frame = r#"{"directory":"/p","project":"x","payload":{"id":"evt_1","type":"message.part.updated","properties":{"part":{"id":"prt_p","messageID":"msg_m","sessionID":"ses_s","type":"tool","tool":"webhook","state":{"status":"running","input":{"payload":{"type":"sync","x":1}}}}}}}"#;
        let Event::PartUpdated(p) = decode(frame).unwrap().event else { panic!("{frame}") };
        assert!(matches!(p.kind, PartKind::Tool { ref tool, .. } if tool == "webhook"), "{:?}", p.kind);
        // Nor does a directory or project that merely looks like the head: escapes and
        // other keys take the full path, which reads the real payload.
        let escaped = r#"{"directory":"/p\",\"payload\":{\"type\":\"sync\",","payload":{"type":"session.idle","properties":{"sessionID":"ses_A"}}}"#;
        assert_eq!(decode(escaped).unwrap().event, Event::SessionIdle { session_id: "ses_A".into() });
        let other_key = r#"{"x":"y","payload":{"type":"sync","syncEvent":{}}}"#;
        assert_eq!(decode(other_key).unwrap().event, Event::Sync, "the full path knows sync too");
    }

    #[test]
    fn unknown_types_decode_to_unknown_not_an_error() {
        let env = decode(r#"{"type":"plugin.added","properties":{"x":1}}"#).unwrap();
        assert_eq!(env.event, Event::Unknown { kind: "plugin.added".into() });
    }

    #[test]
    fn a_known_type_with_a_wrong_shape_is_a_clear_error() {
        let err = decode(r#"{"type":"session.status","properties":{"sessionID":"s"}}"#).unwrap_err();
        assert!(err.to_string().starts_with("session.status: unexpected shape: missing field `status`"), "{err}");
    }

    #[test]
    fn free_form_fields_of_an_unexpected_shape_read_as_absent() {
        let frame = r#"{"directory":5,"payload":{"type":"message.part.updated","properties":{"part":{"id":"prt_p","messageID":"msg_m","sessionID":"ses_s","type":"tool","tool":"task","state":{"status":"running","metadata":{"sessionId":4}}}}}}"#;
        let env = decode(frame).unwrap();
        assert_eq!(env.directory, None);
        let Event::PartUpdated(p) = env.event else { panic!() };
        assert_eq!(
            p.kind,
            PartKind::Tool { tool: "task".into(), status: ToolStatus::Running, child_session: None, input: None }
        );
        let frame = r#"{"type":"message.part.updated","properties":{"part":{"id":"prt_p","messageID":"msg_m","sessionID":"ses_s","type":"text","metadata":{"shepherd":{"kind":1}}}}}"#;
        let Event::PartUpdated(p) = decode(frame).unwrap().event else { panic!() };
        assert!(matches!(p.kind, PartKind::Text { shepherd: None, .. }));
    }

    #[test]
    fn json_that_is_not_an_event_has_no_type() {
        for frame in ["{}", "[]", "1", r#"{"payload":1}"#, r#"{"payload":{"type":1}}"#] {
            assert!(matches!(decode(frame), Err(DecodeError::NoType)), "{frame}");
        }
        assert!(matches!(decode("{"), Err(DecodeError::NotJson(_))));
    }

    #[test]
    fn assistant_model_fields_become_a_model_ref() {
        let frame = r#"{"type":"message.updated","properties":{"sessionID":"ses_s","info":{"id":"msg_m","sessionID":"ses_s","role":"assistant","agent":"plan","providerID":"fake","modelID":"m2","finish":"stop","time":{"created":1}}}}"#;
        let Event::MessageUpdated(m) = decode(frame).unwrap().event else { panic!() };
        assert_eq!(m.model, Some(ModelRef { provider_id: "fake".into(), model_id: "m2".into() }));
        assert_eq!(m.agent.as_deref(), Some("plan"));
    }

    #[test]
    fn shepherd_metadata_on_a_text_part_is_recognised() {
        let frame = r#"{"type":"message.part.updated","properties":{"sessionID":"ses_s","part":{"id":"prt_p","messageID":"msg_m","sessionID":"ses_s","type":"text","text":"go on","synthetic":true,"metadata":{"shepherd":{"kind":"continue","instance":"i","decision":"d"}}}}}"#;
        let Event::PartUpdated(p) = decode(frame).unwrap().event else { panic!() };
        let PartKind::Text { synthetic, shepherd, .. } = p.kind else { panic!() };
        assert!(synthetic);
        assert_eq!(shepherd.unwrap().kind, "continue");
    }

    /// Ids a hostile server (or proxy) might send: each must stop at the decoder.
    fn hostile_ids() -> Vec<String> {
        let mut ids: Vec<String> =
            ["../../etc/x", "a/b", "..", "%2e%2e", "ses_../x", "ses_a/b", "ses_%2e%2e", "ses_.."]
                .map(String::from)
                .into();
        ids.push(format!("ses_{}", "A".repeat(10 * 1024)));
        ids.push(r"ses_a\u0000b".into()); // NUL, as JSON escapes it
        ids
    }

    #[test]
    fn an_event_with_a_hostile_session_id_is_refused_with_a_clear_error() {
        for id in hostile_ids() {
            let frame = format!(r#"{{"type":"session.idle","properties":{{"sessionID":"{id}"}}}}"#);
            let err = decode(&frame).unwrap_err();
            assert!(matches!(err, DecodeError::BadId { .. }), "{id}: {err}");
            let shown = err.to_string();
            assert!(shown.starts_with("session.idle: bad session id"), "{shown}");
            assert!(shown.len() < 200, "the error quotes a bounded excerpt: {} bytes", shown.len());
        }
    }

    #[test]
    fn hostile_message_part_and_child_ids_are_refused_too() {
        let frames = [
            r#"{"type":"message.removed","properties":{"sessionID":"ses_A","messageID":"../x"}}"#,
            r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_/..","field":"text","delta":"x"}}"#,
            r#"{"type":"message.part.updated","properties":{"part":{"id":"prt_p","messageID":"msg_m","sessionID":"ses_A","type":"tool","tool":"task","state":{"status":"running","metadata":{"sessionId":"../../etc"}}}}}"#,
            r#"{"type":"session.created","properties":{"info":{"id":"ses_C","parentID":"ses_A/..","time":{}}}}"#,
            r#"{"type":"message.updated","properties":{"info":{"id":"msg_..","sessionID":"ses_A","role":"user","time":{}}}}"#,
        ];
        for frame in frames {
            assert!(matches!(decode(frame), Err(DecodeError::BadId { .. })), "{frame}");
        }
    }

    #[test]
    fn a_directory_no_path_could_have_is_refused() {
        let frame = |dir: &str| {
            format!(
                r#"{{"directory":"{dir}","payload":{{"type":"session.idle","properties":{{"sessionID":"ses_A"}}}}}}"#
            )
        };
        assert!(matches!(decode(&frame(&"d".repeat(5000))), Err(DecodeError::BadDirectory)));
        assert!(matches!(decode(&frame(r"/p\u0000q")), Err(DecodeError::BadDirectory)));
        assert_eq!(decode(&frame("/p")).unwrap().directory.as_deref(), Some("/p"));
    }

    #[test]
    fn an_implausible_event_type_is_refused_not_kept() {
        let long = format!(r#"{{"type":"{}","properties":{{}}}}"#, "x".repeat(10_000));
        let err = decode(&long).unwrap_err();
        assert!(matches!(err, DecodeError::BadType(_)) && err.to_string().len() < 200, "{err}");
        assert!(matches!(decode(r#"{"type":"a/b","properties":{}}"#), Err(DecodeError::BadType(_))));
    }
}
