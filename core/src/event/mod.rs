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
//!
//! Parts: this file holds [`Envelope`] and [`Event`]; `session` (a session, its status,
//! its errors), `message` (a message's info and token usage), `part` (a message part,
//! Shepherd's tag on its own prompts), `todo`, `decoder` (the frame's two shapes, the
//! checks on what a hostile server could send, [`decode`] itself), `head` (the two
//! forms read by their head alone: `sync` duplicates, and deltas — [`read_head`]) and
//! `quick` (the usual events in OpenCode's exact form, read without serde).
//! Every type is re-exported here: the paths are `crate::event::…` whatever file holds
//! them.

#[cfg(test)]
mod captures;
mod decoder;
mod head;
mod message;
mod part;
mod quick;
mod session;
mod todo;

pub use self::decoder::{
    decode, decode_message_info, decode_past_head, is_known_kind, DecodeError, MAX_KIND_LEN,
};
pub use self::head::{read_head, DeltaHead, FrameHead};
pub use self::message::{CacheTokens, MessageInfo, ModelRef, Role, Tokens};
pub use self::part::{Part, PartKind, ShepherdTag, ToolStatus};
pub use self::session::{ErrorData, ErrorInfo, SessionInfo, SessionMetadata, ShepherdSessionMark, Status, Times};
pub use self::todo::{Todo, TodoStatus};

/// Metadata is free-form: a value of an unexpected shape is read as absent, never as
/// a broken event. (Here, not in the decoder: the decoder and the part reader both
/// use it, and the decoder reads parts.)
fn lenient<'a, T: serde::Deserialize<'a>>(raw: Option<&'a serde_json::value::RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
}

use crate::ids::{IdKind, Ids};

/// The longest directory accepted with an event, bytes (Linux's `PATH_MAX`).
pub const MAX_DIRECTORY_LEN: usize = 4096;

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
    // The large ones are boxed: an event is moved through every layer of its decoding
    // and again into its session's mailbox, and at 320 bytes those copies were a tenth
    // of the pump's time; boxed (and the rare error too), the event is 80.
    SessionCreated(Box<SessionInfo>),
    SessionUpdated(Box<SessionInfo>),
    SessionDeleted(Box<SessionInfo>),
    SessionStatus {
        session_id: String,
        status: Status,
    },
    SessionIdle {
        session_id: String,
    },
    SessionError {
        session_id: Option<String>,
        error: Box<ErrorInfo>,
    },
    SessionCompacted {
        session_id: String,
    },
    SessionDiff {
        session_id: String,
    },
    MessageUpdated(Box<MessageInfo>),
    MessageRemoved {
        session_id: String,
        message_id: String,
    },
    PartUpdated(Box<Part>),
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
        let mut ids = Ids::new();
        if let Some(s) = self.session_id() {
            ids.push(Session, s);
        }
        match self {
            SessionCreated(s) | SessionUpdated(s) | SessionDeleted(s) => {
                if let Some(p) = s.parent_id.as_deref() {
                    ids.push(Session, p);
                }
                if let Some(p) = s.handoff_from() {
                    ids.push(Session, p);
                }
            }
            MessageUpdated(m) => ids.push(Message, &m.id),
            MessageRemoved { message_id, .. } => ids.push(Message, message_id),
            PartUpdated(p) => {
                ids.push(PartId, &p.id);
                ids.push(Message, &p.message_id);
                if let PartKind::Tool { child_session: Some(child), .. } = &p.kind {
                    ids.push(Session, child);
                }
            }
            PartDelta { message_id, part_id, .. } | PartRemoved { message_id, part_id, .. } => {
                ids.push(Message, message_id);
                ids.push(PartId, part_id);
            }
            PermissionAsked { id, .. } => ids.push(Permission, id),
            PermissionReplied { request_id, .. } => ids.push(Permission, request_id),
            QuestionAsked { id, .. } => ids.push(Question, id),
            QuestionReplied { request_id, .. } | QuestionRejected { request_id, .. } => {
                ids.push(Question, request_id)
            }
            _ => {}
        }
        ids
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
            PartDelta { .. } => DeltaHead::KIND,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An event is moved through every layer of its decoding and into its session's
    /// mailbox: a variant that holds a large struct inline makes every event that large
    /// (it was 320 bytes; a tenth of the pump's time went to those copies).
    #[test]
    fn an_event_stays_small_to_move() {
        assert!(std::mem::size_of::<Event>() <= 80, "{} bytes: box the large variant", std::mem::size_of::<Event>());
    }
}
