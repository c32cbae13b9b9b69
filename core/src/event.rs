//! Typed OpenCode events, decoded from the JSON of one SSE `data:` frame.
//!
//! Decoding is pure: a frame goes in, an [`Envelope`] or a [`DecodeError`] comes out.
//! Both stream shapes are accepted — `/global/event` wraps each event as
//! `{"directory","project","payload":{…}}`, `/event` sends the payload bare. Types the
//! server may add (the schema lists 89, the stream also sends `server.heartbeat` and
//! `sync`) decode to [`Event::Unknown`] so the caller can count them; a known type whose
//! properties do not match its shape is a [`DecodeError`], never a panic. Only the
//! fields Shepherd decides on are kept.
//!
//! Decoding is on the hot path (every frame of every session): the frame is read once
//! into borrowed slices (`RawValue`), and only a known type's `properties` are then
//! read into typed structs; fields Shepherd does not use are skipped, never built.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::ids::{IdKind, Ids};

/// One decoded frame: the event and the directory (instance) it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Absent on `server.*` events and on the per-directory stream.
    pub directory: Option<String>,
    pub event: Event,
}

/// The events Shepherd decides on. Everything else is [`Event::Unknown`].
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    ServerConnected,
    Heartbeat,
    /// The global stream's durable-change duplicate of another event; ignored.
    Sync,
    SessionCreated(SessionInfo),
    SessionUpdated(SessionInfo),
    SessionDeleted(SessionInfo),
    SessionStatus {
        session_id: String,
        status: Status,
    },
    SessionIdle {
        session_id: String,
    },
    SessionError {
        session_id: Option<String>,
        error: ErrorInfo,
    },
    SessionCompacted {
        session_id: String,
    },
    SessionDiff {
        session_id: String,
    },
    MessageUpdated(MessageInfo),
    MessageRemoved {
        session_id: String,
        message_id: String,
    },
    PartUpdated(Part),
    PartDelta {
        session_id: String,
        message_id: String,
        part_id: String,
    },
    PartRemoved {
        session_id: String,
        message_id: String,
        part_id: String,
    },
    TodoUpdated {
        session_id: String,
        todos: Vec<Todo>,
    },
    PermissionAsked {
        id: String,
        session_id: String,
    },
    PermissionReplied {
        request_id: String,
        session_id: String,
    },
    QuestionAsked {
        id: String,
        session_id: String,
    },
    QuestionReplied {
        request_id: String,
        session_id: String,
    },
    QuestionRejected {
        request_id: String,
        session_id: String,
    },
    /// A type Shepherd does not act on (counted, then ignored).
    Unknown {
        kind: String,
    },
}

impl Event {
    /// The session this event concerns, when it concerns one.
    pub fn session_id(&self) -> Option<&str> {
        use Event::*;
        match self {
            SessionCreated(s) | SessionUpdated(s) | SessionDeleted(s) => Some(&s.id),
            SessionStatus { session_id, .. }
            | SessionIdle { session_id }
            | SessionCompacted { session_id }
            | SessionDiff { session_id }
            | MessageRemoved { session_id, .. }
            | PartDelta { session_id, .. }
            | PartRemoved { session_id, .. }
            | TodoUpdated { session_id, .. }
            | PermissionAsked { session_id, .. }
            | PermissionReplied { session_id, .. }
            | QuestionAsked { session_id, .. }
            | QuestionReplied { session_id, .. }
            | QuestionRejected { session_id, .. } => Some(session_id),
            SessionError { session_id, .. } => session_id.as_deref(),
            MessageUpdated(m) => Some(&m.session_id),
            PartUpdated(p) => Some(&p.session_id),
            ServerConnected | Heartbeat | Sync | Unknown { .. } => None,
        }
    }

    /// Every id this event carries, with the kind it must be. [`decode`] refuses an
    /// event when one of them is not of OpenCode's shape.
    pub(crate) fn ids(&self) -> Ids<'_> {
        use Event::*;
        use IdKind::{Message, Part as PartId, Permission, Question, Session};
        let mut ids = Vec::with_capacity(3);
        if let Some(s) = self.session_id() {
            ids.push((Session, s));
        }
        match self {
            SessionCreated(s) | SessionUpdated(s) | SessionDeleted(s) => {
                ids.extend(s.parent_id.as_deref().map(|p| (Session, p)));
                ids.extend(s.handoff_from().map(|p| (Session, p)));
            }
            MessageUpdated(m) => ids.push((Message, &m.id)),
            MessageRemoved { message_id, .. } => ids.push((Message, message_id)),
            PartUpdated(p) => {
                ids.push((PartId, &p.id));
                ids.push((Message, &p.message_id));
                if let PartKind::Tool { child_session: Some(child), .. } = &p.kind {
                    ids.push((Session, child));
                }
            }
            PartDelta { message_id, part_id, .. } | PartRemoved { message_id, part_id, .. } => {
                ids.push((Message, message_id));
                ids.push((PartId, part_id));
            }
            PermissionAsked { id, .. } => ids.push((Permission, id)),
            PermissionReplied { request_id, .. } => ids.push((Permission, request_id)),
            QuestionAsked { id, .. } => ids.push((Question, id)),
            QuestionReplied { request_id, .. } | QuestionRejected { request_id, .. } => {
                ids.push((Question, request_id))
            }
            _ => {}
        }
        Ids(ids)
    }

    /// A short stable name for metrics and logs.
    pub fn kind(&self) -> &str {
        use Event::*;
        match self {
            ServerConnected => "server.connected",
            Heartbeat => "server.heartbeat",
            Sync => "sync",
            SessionCreated(_) => "session.created",
            SessionUpdated(_) => "session.updated",
            SessionDeleted(_) => "session.deleted",
            SessionStatus { .. } => "session.status",
            SessionIdle { .. } => "session.idle",
            SessionError { .. } => "session.error",
            SessionCompacted { .. } => "session.compacted",
            SessionDiff { .. } => "session.diff",
            MessageUpdated(_) => "message.updated",
            MessageRemoved { .. } => "message.removed",
            PartUpdated(_) => "message.part.updated",
            PartDelta { .. } => "message.part.delta",
            PartRemoved { .. } => "message.part.removed",
            TodoUpdated { .. } => "todo.updated",
            PermissionAsked { .. } => "permission.asked",
            PermissionReplied { .. } => "permission.replied",
            QuestionAsked { .. } => "question.asked",
            QuestionReplied { .. } => "question.replied",
            QuestionRejected { .. } => "question.rejected",
            Unknown { kind } => kind,
        }
    }
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// The agent and model a turn ran with; copied into every prompt Shepherd sends so
/// OpenCode does not switch the session to its default agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ModelRef {
    #[serde(rename = "providerID")]
    pub provider_id: String,
    #[serde(rename = "modelID")]
    pub model_id: String,
}

/// `message.updated` → `info`. User and assistant messages share this shape; the
/// model is `model{providerID,modelID}` on user messages and top-level fields on
/// assistant ones — both end up in [`MessageInfo::model`].
#[derive(Debug, Clone, PartialEq)]
pub struct MessageInfo {
    pub id: String,
    pub session_id: String,
    pub role: Role,
    pub agent: Option<String>,
    pub model: Option<ModelRef>,
    pub finish: Option<String>,
    pub error: Option<ErrorInfo>,
    pub time: Times,
    /// A compaction summary (`summary: true`).
    pub summary: bool,
    /// Token usage of this one model call (assistant messages).
    pub tokens: Option<Tokens>,
}

/// Token usage of one model call. The prompt size — what fills the context window — is
/// `input + cache.read + cache.write`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Tokens {
    #[serde(default)]
    pub input: u64,
    #[serde(default)]
    pub output: u64,
    #[serde(default)]
    pub cache: CacheTokens,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct CacheTokens {
    #[serde(default)]
    pub read: u64,
    #[serde(default)]
    pub write: u64,
}

impl Tokens {
    pub fn prompt_size(&self) -> u64 {
        self.input + self.cache.read + self.cache.write
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMessageInfo<'a> {
    id: String,
    #[serde(rename = "sessionID")]
    session_id: String,
    role: Role,
    #[serde(default)]
    agent: Option<String>,
    /// The older name of `agent` on assistant messages.
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    model: Option<ModelRef>,
    #[serde(default, rename = "providerID")]
    provider_id: Option<String>,
    #[serde(default, rename = "modelID")]
    model_id: Option<String>,
    #[serde(default)]
    finish: Option<String>,
    #[serde(default)]
    error: Option<ErrorInfo>,
    #[serde(default)]
    time: Times,
    /// `true` on a compaction summary; an object (the diff summary) on user messages.
    #[serde(default, borrow)]
    summary: Option<&'a RawValue>,
    #[serde(default)]
    tokens: Option<Tokens>,
}

impl From<RawMessageInfo<'_>> for MessageInfo {
    fn from(r: RawMessageInfo<'_>) -> Self {
        let model = r.model.or(match (r.provider_id, r.model_id) {
            (Some(provider_id), Some(model_id)) => Some(ModelRef { provider_id, model_id }),
            _ => None,
        });
        MessageInfo {
            id: r.id,
            session_id: r.session_id,
            role: r.role,
            agent: r.agent.or(r.mode),
            model,
            finish: r.finish,
            error: r.error,
            time: r.time,
            summary: r.summary.is_some_and(|v| v.get().trim() == "true"),
            tokens: r.tokens,
        }
    }
}

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
struct RawPart<'a> {
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

/// Metadata is free-form: a value of an unexpected shape is read as absent, never as
/// a broken event.
fn lenient<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
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
                let input = state.input.as_ref().map(crate::session::loops::input_key);
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

/// One todo item. Items have no id; the list is replaced whole on every update.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Todo {
    pub content: String,
    pub status: TodoStatus,
    #[serde(default)]
    pub priority: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    Pending,
    InProgress,
    Completed,
    Cancelled,
}

impl TodoStatus {
    /// `cancelled` counts as done.
    pub fn is_open(self) -> bool {
        matches!(self, TodoStatus::Pending | TodoStatus::InProgress)
    }
}

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
