//! Reading a frame by its head, without parsing it: the two forms that are most of
//! OpenCode's global stream and need the least of Shepherd — a `sync` duplicate (a
//! quarter of the frames; only counted) and a `message.part.delta` (a third; all that
//! matters is whose message streams).
//!
//! The head is read once per frame ([`read_head`]), and only in the exact bytes
//! OpenCode writes — `{"directory":"…","project":"…","payload":{"id":"…","type":"…",…`
//! with plain string values; anything else — an escape, a space, another key or order,
//! a value of another type — is [`FrameHead::Other`], and goes through the full decoder
//! ([`super::decode_past_head`]), which reads it whatever its spelling and says why it
//! refuses it. So the shortcut never reads a frame differently from the decoder; the
//! tests hold the two to it, over every captured delta and over generated near-misses.
//! The other usual events are read in the same exact form past this head by
//! [`super::quick`], with the primitives here.

use crate::ids::{self, IdKind};

use super::MAX_DIRECTORY_LEN;

/// What a frame's head says it is ([`read_head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameHead<'a> {
    /// A `sync` duplicate: counted, nothing more.
    Sync,
    /// A delta: whose message streams.
    Delta(DeltaHead<'a>),
    /// Anything else: the decoder reads it ([`super::decode_past_head`]).
    Other,
}

/// A `message.part.delta` read from its frame's head: whose message streams, and in
/// which directory. Its ids are checked as the decoder checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaHead<'a> {
    pub directory: Option<&'a str>,
    pub session_id: &'a str,
    pub message_id: &'a str,
}

impl DeltaHead<'_> {
    /// The event type it is (as [`super::Event::kind`] names it).
    pub const KIND: &'static str = "message.part.delta";
}

/// Reads the frame's head once: a `sync` duplicate, a delta, or anything else.
///
/// - A `sync` duplicate as OpenCode writes it: `…"payload":{"type":"sync",…`. Only the
///   frame's own head is read, so the answer is about the frame's `payload`, never
///   about text deeper in it: a tool's input holding `{"payload":{"type":"sync",…}}` is
///   not taken for a duplicate (the test for the text anywhere in the frame hid such an
///   event).
/// - A delta in OpenCode's exact form: `…"payload":{"id":"…","type":"message.part.delta",
///   "properties":{"sessionID":"…","messageID":"…","partID":"…","field":"…","delta":"…"}}}`
///   and nothing after. The delta's text may hold any JSON string (escapes included) and
///   is checked as the decoder checks a string it skips; every other value must be
///   plain, and the ids of OpenCode's shape.
pub fn read_head(frame: &str) -> FrameHead<'_> {
    let Some((directory, mut head)) = payload(frame) else { return FrameHead::Other };
    if head.0.starts_with(r#""type":"sync","#) {
        return FrameHead::Sync;
    }
    match delta(directory, &mut head) {
        Some(delta) => FrameHead::Delta(delta),
        None => FrameHead::Other,
    }
}

/// The rest of a delta's frame after `"payload":{`.
fn delta<'a>(directory: Option<&'a str>, head: &mut Head<'a>) -> Option<DeltaHead<'a>> {
    head.event_id()?;
    head.expect(r#""type":"message.part.delta","properties":{"sessionID":""#)?;
    let session_id = head.plain()?;
    head.expect(r#","messageID":""#)?;
    let message_id = head.plain()?;
    head.expect(r#","partID":""#)?;
    let part_id = head.plain()?;
    head.expect(r#","field":""#)?;
    head.plain()?;
    head.expect(r#","delta":""#)?;
    head.string()?;
    head.expect("}}}")?;
    if !head.0.is_empty() {
        return None;
    }
    ids::check(IdKind::Session, session_id).ok()?;
    ids::check(IdKind::Message, message_id).ok()?;
    ids::check(IdKind::Part, part_id).ok()?;
    Some(DeltaHead { directory, session_id, message_id })
}

/// The frame's `directory` (when it comes first) and the rest after `"payload":{`,
/// with `project` (when it comes next) read past. `None` when the frame does not start
/// so, or either value is not a plain string of at most [`MAX_DIRECTORY_LEN`] bytes.
pub(super) fn payload(frame: &str) -> Option<(Option<&str>, Head<'_>)> {
    let mut head = Head(frame.strip_prefix('{')?);
    let mut directory = None;
    if head.tag(r#""directory":""#) {
        directory = Some(head.plain().filter(|d| d.len() <= MAX_DIRECTORY_LEN)?);
        head.expect(",")?;
    }
    if head.tag(r#""project":""#) {
        head.plain()?;
        head.expect(",")?;
    }
    head.expect(r#""payload":{"#)?;
    Some((directory, head))
}

/// What is left of the frame to read.
pub(super) struct Head<'a>(pub(super) &'a str);

impl<'a> Head<'a> {
    /// Reads past `text` if the rest starts with it.
    pub(super) fn tag(&mut self, text: &str) -> bool {
        match self.0.strip_prefix(text) {
            Some(rest) => {
                self.0 = rest;
                true
            }
            None => false,
        }
    }

    pub(super) fn expect(&mut self, text: &str) -> Option<()> {
        self.tag(text).then_some(())
    }

    /// The payload's `"id":"…",` when it comes first, read past (plain, as OpenCode
    /// writes it); `None` when it is there and not so.
    pub(super) fn event_id(&mut self) -> Option<()> {
        if self.tag(r#""id":""#) {
            self.plain()?;
            self.expect(",")?;
        }
        Some(())
    }

    /// A string value's text up to its closing quote (read past): `None` at an escape
    /// or a control character (the decoder refuses the latter; the former it would
    /// read differently than the bytes say), or when no quote closes it.
    pub(super) fn plain(&mut self) -> Option<&'a str> {
        let end = memchr::memchr(b'"', self.0.as_bytes())?;
        let (value, rest) = self.0.split_at(end);
        if !is_plain(value.as_bytes()) {
            return None;
        }
        self.0 = &rest[1..]; // past the quote
        Some(value)
    }

    /// Any JSON string's text, up to its closing quote (read past), checked as
    /// `serde_json` checks a string it skips: no control characters, and escapes of
    /// `"\/bfnrt` or `u` and four hex digits.
    pub(super) fn string(&mut self) -> Option<()> {
        let bytes = self.0.as_bytes();
        let mut i = 0;
        loop {
            let at = i + memchr::memchr2(b'"', b'\\', &bytes[i..])?;
            if !is_plain(&bytes[i..at]) {
                return None;
            }
            if bytes[at] == b'"' {
                // An ASCII quote: a character boundary.
                self.0 = &self.0[at + 1..];
                return Some(());
            }
            i = at + match *bytes.get(at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                b'u' if bytes.get(at + 2..at + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
                _ => return None,
            };
        }
    }
}

/// Whether `bytes` hold neither a backslash nor a control character. Without an early
/// exit, so that it is compiled to a few vector instructions for the usual short value.
fn is_plain(bytes: &[u8]) -> bool {
    !bytes.iter().fold(false, |odd, &b| odd | (b < 0x20) | (b == b'\\'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::event::{decode, Envelope, Event};

    /// The delta the frame holds, when its head says it is one.
    fn peek_delta(frame: &str) -> Option<DeltaHead<'_>> {
        match read_head(frame) {
            FrameHead::Delta(delta) => Some(delta),
            FrameHead::Sync | FrameHead::Other => None,
        }
    }

    /// OpenCode's global frame of a delta, with each value as given (already JSON).
    fn frame(dir: &str, sid: &str, mid: &str, pid: &str, field: &str, delta: &str) -> String {
        format!(
            r#"{{"directory":{dir},"project":"34a087cc","payload":{{"id":"evt_1","type":"message.part.delta","properties":{{"sessionID":{sid},"messageID":{mid},"partID":{pid},"field":{field},"delta":{delta}}}}}}}"#
        )
    }

    /// What the decoder makes of a frame the head reader took.
    fn as_decoded(head: DeltaHead<'_>, part_id: &str) -> Envelope {
        Envelope {
            directory: head.directory.map(String::from),
            event: Event::PartDelta {
                session_id: head.session_id.into(),
                message_id: head.message_id.into(),
                part_id: part_id.into(),
            },
        }
    }

    /// The deltas of the captured streams, in the global stream's form: every one is
    /// read from its head, exactly as the decoder reads it.
    #[test]
    fn every_captured_delta_is_read_from_its_head_as_the_decoder_reads_it() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../actors/tests/fixtures/captures");
        let mut read = 0;
        for entry in std::fs::read_dir(dir).expect("the captures are in the repository") {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for line in text.lines().filter(|l| l.contains(r#""message.part.delta""#)) {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let v = v.get("payload").unwrap_or(&v);
                let p = &v["properties"];
                let text = |k: &str| p[k].to_string(); // re-serialised compactly, as OpenCode writes
                let f = frame(r#""/scratch/project""#, &text("sessionID"), &text("messageID"), &text("partID"), &text("field"), &text("delta"));
                let head = peek_delta(&f).unwrap_or_else(|| panic!("not read from its head: {f}"));
                assert_eq!(Ok(as_decoded(head, p["partID"].as_str().unwrap())), decode(&f).map_err(|e| e.to_string()), "{f}");
                read += 1;
            }
        }
        assert!(read > 50, "{read} captured deltas");
    }

    #[test]
    fn other_spellings_and_other_events_are_left_to_the_decoder() {
        let usual = frame(r#""/p""#, r#""ses_A""#, r#""msg_B""#, r#""prt_C""#, r#""text""#, r#""Hi \"x\"\n""#);
        assert_eq!(
            peek_delta(&usual),
            Some(DeltaHead { directory: Some("/p"), session_id: "ses_A", message_id: "msg_B" })
        );
        let bare = r#"{"payload":{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_C","field":"text","delta":""}}}"#;
        assert_eq!(peek_delta(bare).map(|h| h.directory), Some(None));
        for other in [
            usual.replace(r#""directory":"/p","#, r#""directory": "/p","#), // a space
            usual.replace("ses_A", r"ses_\u0041"),                           // an escape in an id
            usual.replace("ses_A", "ses_A/.."),                              // a hostile id
            usual.replace(r#""field":"text","#, ""),                         // a field missing
            usual.replace("}}}", "}},\"x\":1}"),                             // more after
            usual.replace("}}}", "}}} "),
            usual.replace("message.part.delta", "message.part.removed"),
            usual.replace(r#""/p""#, &format!("\"{}\"", "d".repeat(MAX_DIRECTORY_LEN + 1))),
        ] {
            assert_eq!(peek_delta(&other), None, "{other}");
        }
    }

    #[test]
    fn sync_duplicates_are_recognised_by_their_own_head_only() {
        let sync = |frame: &str| read_head(frame) == FrameHead::Sync;
        assert!(sync(r#"{"directory":"/p","project":"x","payload":{"type":"sync","id":"e"}}"#));
        assert!(sync(r#"{"payload":{"type":"sync","id":"e"}}"#));
        assert!(!sync(r#"{"project":"x","directory":"/p","payload":{"type":"sync","id":"e"}}"#));
        assert!(!sync(r#"{"directory":"/p\",\"payload\":{\"type\":\"sync\",","payload":{"type":"x"}}"#));
        assert!(!sync(r#"{"directory":"/p","payload":{"type":"session.idle","properties":{"x":{"payload":{"type":"sync",}}}}}"#));
    }

    /// A string value as JSON, starting with `prefix`, then pieces biased toward what
    /// could trip a reader of bytes — quotes, escapes (valid and not), control
    /// characters, path tricks, non-ASCII — among plain ones; mostly plain (so that a
    /// good share of the frames are taken), now and then not a string.
    fn json_value(prefix: &'static str) -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            12 => "[A-Za-z0-9_]{1,6}",
            1 => Just("\\\"".to_string()),
            1 => Just("\\\\".to_string()),
            1 => Just("\\u0041".to_string()),
            1 => Just("\\u00".to_string()),
            1 => Just("\\ud800".to_string()),
            1 => Just("\\x".to_string()),
            1 => Just("\"".to_string()),
            1 => Just("\u{1}".to_string()),
            1 => Just("\n".to_string()),
            1 => Just("/..".to_string()),
            1 => Just("é".to_string()),
            1 => Just("}}}".to_string()),
        ];
        prop_oneof![
            16 => "[A-Za-z0-9_]{0,12}".prop_map(move |p| format!("\"{prefix}{p}\"")),
            3 => prop::collection::vec(piece, 0..4).prop_map(move |p| format!("\"{prefix}{}\"", p.concat())),
            1 => prop_oneof![Just("5".to_string()), Just("null".to_string())],
        ]
    }

    proptest! {
        /// Whatever the values, a frame the head reader takes decodes to the same delta.
        #[test]
        fn a_delta_read_from_its_head_is_the_delta_the_decoder_reads(
            dir in json_value("/"), sid in json_value("ses_"), mid in json_value("msg_"),
            pid in json_value("prt_"), field in json_value(""), delta in json_value(""),
        ) {
            let f = frame(&dir, &sid, &mid, &pid, &field, &delta);
            if let Some(head) = peek_delta(&f) {
                let part_id: String = serde_json::from_str(&pid).unwrap();
                prop_assert_eq!(Ok(as_decoded(head, &part_id)), decode(&f).map_err(|e| e.to_string()), "{}", f);
            }
        }

        /// And a delta of plain values with any text is taken by the head reader.
        #[test]
        fn a_plain_delta_with_any_text_is_read_from_its_head(text in any::<String>()) {
            let delta = serde_json::to_string(&text).unwrap();
            let f = frame(r#""/p""#, r#""ses_A""#, r#""msg_B""#, r#""prt_C""#, r#""text""#, &delta);
            prop_assert!(peek_delta(&f).is_some(), "{}", f);
        }
    }
}
