//! Decoding one SSE `data:` frame into an [`Envelope`]: both stream shapes read in one
//! pass, a known type's `properties` read into its typed struct, and what a hostile
//! server could send refused with a clear [`DecodeError`] (ids not of OpenCode's shape,
//! implausible type names, directories no path could have).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::message::RawMessageInfo;
use super::part::RawPart;
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

/// Metadata is free-form: a value of an unexpected shape is read as absent, never as
/// a broken event.
pub(super) fn lenient<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
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

/// Decodes one SSE `data:` payload (either stream shape).
pub fn decode(frame: &str) -> Result<Envelope, DecodeError> {
    // `sync` duplicates are over a quarter of the global stream and only counted:
    // recognise OpenCode's compact form without parsing the whole frame. (A string
    // value cannot contain this text unescaped, so there is no false match; any other
    // spelling takes the full path below.)
    if frame.contains(r#""payload":{"type":"sync","#) {
        return Ok(Envelope { directory: None, event: Event::Sync });
    }
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
    let event = decode_event(&kind, props)
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
    let event = Event::MessageUpdated(raw.into());
    event.ids().check().map_err(|source| DecodeError::BadId { kind: KIND.to_string(), source })?;
    match event {
        Event::MessageUpdated(m) => Ok(m),
        _ => unreachable!("built as a message above"),
    }
}

/// The longest directory accepted with an event, bytes (Linux's `PATH_MAX`).
pub const MAX_DIRECTORY_LEN: usize = 4096;

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
    !matches!(decode_event(kind, "{}"), Ok(Event::Unknown { .. }))
}

fn decode_event(kind: &str, props: &str) -> Result<Event, String> {
    fn read<'a, T: Deserialize<'a>>(props: &'a str) -> Result<T, String> {
        serde_json::from_str(props).map_err(|e| e.to_string())
    }
    Ok(match kind {
        "server.connected" => Event::ServerConnected,
        "server.heartbeat" => Event::Heartbeat,
        "sync" => Event::Sync,
        "session.created" => Event::SessionCreated(read::<OfSessionInfo>(props)?.info),
        "session.updated" => Event::SessionUpdated(read::<OfSessionInfo>(props)?.info),
        "session.deleted" => Event::SessionDeleted(read::<OfSessionInfo>(props)?.info),
        "session.status" => {
            let p: OfStatus = read(props)?;
            Event::SessionStatus { session_id: p.session_id, status: p.status }
        }
        "session.idle" => Event::SessionIdle { session_id: read::<OfSession>(props)?.session_id },
        "session.error" => {
            let p: OfError = read(props)?;
            Event::SessionError { session_id: lenient(p.session_id), error: p.error }
        }
        "session.compacted" => Event::SessionCompacted { session_id: read::<OfSession>(props)?.session_id },
        "session.diff" => Event::SessionDiff { session_id: read::<OfSession>(props)?.session_id },
        "message.updated" => Event::MessageUpdated(read::<OfMessage>(props)?.info.into()),
        "message.removed" => {
            let p: OfMessageId = read(props)?;
            Event::MessageRemoved { session_id: p.session_id, message_id: p.message_id }
        }
        "message.part.updated" => Event::PartUpdated(read::<OfPart>(props)?.part.try_into()?),
        "message.part.delta" => {
            let p: OfPartId = read(props)?;
            Event::PartDelta { session_id: p.session_id, message_id: p.message_id, part_id: p.part_id }
        }
        "message.part.removed" => {
            let p: OfPartId = read(props)?;
            Event::PartRemoved { session_id: p.session_id, message_id: p.message_id, part_id: p.part_id }
        }
        "todo.updated" => {
            let p: OfTodos = read(props)?;
            Event::TodoUpdated { session_id: p.session_id, todos: p.todos }
        }
        "permission.asked" => {
            let p: OfRequest = read(props)?;
            Event::PermissionAsked { id: p.id, session_id: p.session_id }
        }
        "permission.replied" => {
            let p: OfReply = read(props)?;
            Event::PermissionReplied { request_id: p.request_id, session_id: p.session_id }
        }
        "question.asked" => {
            let p: OfRequest = read(props)?;
            Event::QuestionAsked { id: p.id, session_id: p.session_id }
        }
        "question.replied" => {
            let p: OfReply = read(props)?;
            Event::QuestionReplied { request_id: p.request_id, session_id: p.session_id }
        }
        "question.rejected" => {
            let p: OfReply = read(props)?;
            Event::QuestionRejected { request_id: p.request_id, session_id: p.session_id }
        }
        other => Event::Unknown { kind: other.to_string() },
    })
}

#[cfg(test)]
mod tests {
    use crate::event::{ModelRef, PartKind, ToolStatus};

    use super::*;

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
