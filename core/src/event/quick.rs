//! Reading the usual events of OpenCode's global stream without the general decoder:
//! `message.part.updated`, `message.updated`, `session.status`, `session.idle` and
//! `todo.updated` — with `sync` duplicates and deltas ([`super::head`]), most of what a
//! busy fleet sends.
//!
//! The general decoder ([`super::decode_past_head`]) reads any spelling through serde,
//! and at a few hundred bytes a frame serde's machinery, not the bytes, is most of its
//! time: a `session.status` took ~600 ns, a tool part ~1.5 µs. This reader takes only
//! the exact form OpenCode writes — compact JSON, the frame's head as [`super::head`]
//! reads it, plain keys, each known key once — and reads it straight. Anything else
//! (a space, an escaped key, a duplicate, a value of another type, a `retry` status,
//! nesting past [`MAX_SKIPPED_DEPTH`]) is `None`, and the general decoder reads it and
//! says why it refuses it, if it does. So this reader never reads a frame differently
//! from the decoder: where it answers, it builds the event from the same raw structs
//! and the same conversions ([`RawPart`] → [`Part`], [`RawMessageInfo`] →
//! [`MessageInfo`](super::MessageInfo)), checks its ids the same way, and
//! the tests hold the two to it over every captured event and over generated variants.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::head::{payload, Head};
use super::message::{ModelRef, RawMessageInfo, Role, Tokens};
use super::part::{InputKey, RawPart, RawToolState};
use super::todo::TodoStatus;
use super::{CacheTokens, Envelope, ErrorInfo, Event, Part, Status, Times, Todo, ToolStatus};

/// How deeply a value this reader skips may nest (objects and arrays within it); deeper
/// ones go to the decoder. Far below `serde_json`'s own limit, so that nothing the
/// decoder refuses for its depth is taken here.
const MAX_SKIPPED_DEPTH: usize = 32;

/// The event a frame in OpenCode's exact form holds, when it is of a type read here;
/// `None` for anything else (the decoder then reads it).
pub(super) fn read(frame: &str) -> Option<Envelope> {
    let (directory, mut head) = payload(frame)?;
    head.event_id()?;
    head.expect(r#""type":""#)?;
    let kind = head.plain()?;
    head.expect(r#","properties":"#)?;
    let event = match kind {
        "message.part.updated" => part_updated(&mut head)?,
        "message.updated" => message_updated(&mut head)?,
        "session.status" => status(&mut head)?,
        "session.idle" => Event::SessionIdle { session_id: session_only(&mut head)? },
        "todo.updated" => todos(&mut head)?,
        _ => return None,
    };
    head.expect("}}")?;
    if !head.0.is_empty() {
        return None;
    }
    event.ids().check().ok()?;
    Some(Envelope { directory: directory.map(String::from), event })
}

/// `message.part.updated`'s properties: the part, read into the decoder's [`RawPart`]
/// and converted by the decoder's own conversion.
fn part_updated(head: &mut Head<'_>) -> Option<Event> {
    let mut part = None;
    head.object(|head, key| match key {
        "part" => once(&mut part, raw_part(head)?),
        _ => head.skip(),
    })?;
    Some(Event::PartUpdated(Box::new(Part::try_from(part?).ok()?)))
}

/// A part's fields as [`RawPart`] reads them; the others skipped.
fn raw_part<'a>(head: &mut Head<'a>) -> Option<RawPart<'a>> {
    let (mut id, mut message_id, mut session_id, mut kind) = (None, None, None, None);
    let (mut text, mut synthetic, mut ignored, mut metadata, mut tool, mut state) = (None, None, None, None, None, None);
    head.object(|head, key| match key {
        "id" => once(&mut id, head.string_plain()?),
        "messageID" => once(&mut message_id, head.string_plain()?),
        "sessionID" => once(&mut session_id, head.string_plain()?),
        "type" => once(&mut kind, head.string_plain()?),
        "text" => once(&mut text, head.nullable(Head::text)?),
        "synthetic" => once(&mut synthetic, head.nullable(Head::boolean)?),
        "ignored" => once(&mut ignored, head.nullable(Head::boolean)?),
        "metadata" => once(&mut metadata, head.raw_value()?),
        "tool" => once(&mut tool, head.nullable(Head::string_plain)?),
        "state" => once(&mut state, head.nullable(raw_tool_state)?),
        _ => head.skip(),
    })?;
    Some(RawPart {
        id: id?.to_string(),
        message_id: message_id?.to_string(),
        session_id: session_id?.to_string(),
        kind: Cow::Borrowed(kind?),
        text: text.flatten(),
        synthetic: synthetic.flatten(),
        ignored: ignored.flatten(),
        metadata: metadata.flatten(),
        tool: tool.flatten().map(String::from),
        state: state.flatten(),
    })
}

/// A tool part's `state` as [`RawToolState`] reads it.
fn raw_tool_state<'a>(head: &mut Head<'a>) -> Option<RawToolState<'a>> {
    let (mut status, mut metadata, mut input) = (None, None, None);
    head.object(|head, key| match key {
        "status" => once(&mut status, tool_status(head.string_plain()?)?),
        "metadata" => once(&mut metadata, head.raw_value()?),
        "input" => {
            let raw = head.skipped()?;
            let key = if raw == "null" { None } else { Some(InputKey::of_json(raw)?) };
            once(&mut input, key)
        }
        _ => head.skip(),
    })?;
    Some(RawToolState { status: status?, metadata: metadata.flatten(), input: input.flatten() })
}

fn tool_status(name: &str) -> Option<ToolStatus> {
    Some(match name {
        "pending" => ToolStatus::Pending,
        "running" => ToolStatus::Running,
        "completed" => ToolStatus::Completed,
        "error" => ToolStatus::Error,
        _ => return None,
    })
}

/// `message.updated`'s properties: the message's info, read into the decoder's
/// [`RawMessageInfo`] and converted by the decoder's own conversion.
fn message_updated(head: &mut Head<'_>) -> Option<Event> {
    let mut info = None;
    head.object(|head, key| match key {
        "info" => once(&mut info, raw_message(head)?),
        _ => head.skip(),
    })?;
    Some(Event::MessageUpdated(Box::new(info?.into())))
}

/// A message's info as [`RawMessageInfo`] reads it; the other fields skipped. An error
/// (rare, and read by a field's own rules) is read by `serde_json` from its text.
fn raw_message<'a>(head: &mut Head<'a>) -> Option<RawMessageInfo<'a>> {
    let (mut id, mut session_id, mut role, mut agent, mut mode) = (None, None, None, None, None);
    let (mut model, mut provider_id, mut model_id, mut finish) = (None, None, None, None);
    let (mut error, mut time, mut summary, mut tokens) = (None, None, None, None);
    head.object(|head, key| match key {
        "id" => once(&mut id, head.string_plain()?),
        "sessionID" => once(&mut session_id, head.string_plain()?),
        "role" => once(
            &mut role,
            match head.string_plain()? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                _ => return None,
            },
        ),
        "agent" => once(&mut agent, head.nullable(Head::owned_text)?),
        "mode" => once(&mut mode, head.nullable(Head::owned_text)?),
        "model" => once(&mut model, head.nullable(model_ref)?),
        "providerID" => once(&mut provider_id, head.nullable(Head::owned_text)?),
        "modelID" => once(&mut model_id, head.nullable(Head::owned_text)?),
        "finish" => once(&mut finish, head.nullable(Head::owned_text)?),
        "error" => once(&mut error, head.nullable(|head| serde_json::from_str::<ErrorInfo>(head.skipped()?).ok())?),
        "time" => once(&mut time, times(head)?),
        "summary" => once(&mut summary, head.raw_value()?),
        "tokens" => once(&mut tokens, head.nullable(tokens_used)?),
        _ => head.skip(),
    })?;
    Some(RawMessageInfo {
        id: id?.to_string(),
        session_id: session_id?.to_string(),
        role: role?,
        agent: agent.flatten(),
        mode: mode.flatten(),
        model: model.flatten(),
        provider_id: provider_id.flatten(),
        model_id: model_id.flatten(),
        finish: finish.flatten(),
        error: error.flatten(),
        time: time.unwrap_or_default(),
        summary: summary.flatten(),
        tokens: tokens.flatten(),
    })
}

fn model_ref(head: &mut Head<'_>) -> Option<ModelRef> {
    let (mut provider_id, mut model_id) = (None, None);
    head.object(|head, key| match key {
        "providerID" => once(&mut provider_id, head.owned_text()?),
        "modelID" => once(&mut model_id, head.owned_text()?),
        _ => head.skip(),
    })?;
    Some(ModelRef { provider_id: provider_id?, model_id: model_id? })
}

fn times(head: &mut Head<'_>) -> Option<Times> {
    let (mut created, mut updated, mut completed) = (None, None, None);
    head.object(|head, key| match key {
        "created" => once(&mut created, head.nullable(Head::epoch)?),
        "updated" => once(&mut updated, head.nullable(Head::epoch)?),
        "completed" => once(&mut completed, head.nullable(Head::epoch)?),
        _ => head.skip(),
    })?;
    Some(Times { created: created.flatten(), updated: updated.flatten(), completed: completed.flatten() })
}

fn tokens_used(head: &mut Head<'_>) -> Option<Tokens> {
    let (mut input, mut output, mut cache) = (None, None, None);
    head.object(|head, key| match key {
        "input" => once(&mut input, head.count()?),
        "output" => once(&mut output, head.count()?),
        "cache" => {
            let (mut read, mut write) = (None, None);
            head.object(|head, key| match key {
                "read" => once(&mut read, head.count()?),
                "write" => once(&mut write, head.count()?),
                _ => head.skip(),
            })?;
            once(&mut cache, CacheTokens { read: read.unwrap_or_default(), write: write.unwrap_or_default() })
        }
        _ => head.skip(),
    })?;
    Some(Tokens { input: input.unwrap_or_default(), output: output.unwrap_or_default(), cache: cache.unwrap_or_default() })
}

/// `session.status`'s properties, for the two statuses of no fields (`busy`, `idle`)
/// spelled exactly so; a `retry` goes to the decoder.
fn status(head: &mut Head<'_>) -> Option<Event> {
    let (mut session_id, mut status) = (None, None);
    head.object(|head, key| match key {
        "sessionID" => once(&mut session_id, head.string_plain()?),
        "status" => once(
            &mut status,
            if head.tag(r#"{"type":"busy"}"#) {
                Status::Busy
            } else if head.tag(r#"{"type":"idle"}"#) {
                Status::Idle
            } else {
                return None;
            },
        ),
        _ => head.skip(),
    })?;
    Some(Event::SessionStatus { session_id: session_id?.to_string(), status: status? })
}

/// The properties of an event that names only its session.
fn session_only(head: &mut Head<'_>) -> Option<String> {
    let mut session_id = None;
    head.object(|head, key| match key {
        "sessionID" => once(&mut session_id, head.string_plain()?),
        _ => head.skip(),
    })?;
    Some(session_id?.to_string())
}

/// `todo.updated`'s properties: the session and its whole list.
fn todos(head: &mut Head<'_>) -> Option<Event> {
    let (mut session_id, mut todos) = (None, None);
    head.object(|head, key| match key {
        "sessionID" => once(&mut session_id, head.string_plain()?),
        "todos" => {
            let mut list = Vec::new();
            head.array(|head| {
                list.push(todo(head)?);
                Some(())
            })?;
            once(&mut todos, list)
        }
        _ => head.skip(),
    })?;
    Some(Event::TodoUpdated { session_id: session_id?.to_string(), todos: todos? })
}

fn todo(head: &mut Head<'_>) -> Option<Todo> {
    let (mut content, mut status, mut priority) = (None, None, None);
    head.object(|head, key| match key {
        "content" => once(&mut content, head.text()?),
        "status" => once(
            &mut status,
            match head.string_plain()? {
                "pending" => TodoStatus::Pending,
                "in_progress" => TodoStatus::InProgress,
                "completed" => TodoStatus::Completed,
                "cancelled" => TodoStatus::Cancelled,
                _ => return None,
            },
        ),
        "priority" => once(&mut priority, head.nullable(Head::text)?),
        _ => head.skip(),
    })?;
    Some(Todo { content: content?.into_owned(), status: status?, priority: priority.flatten().map(Cow::into_owned) })
}

/// Fills `slot` with a field's value: `None` (not read here) when the field came
/// before — the decoder refuses a duplicate field.
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    match slot {
        Some(_) => None,
        None => {
            *slot = Some(value);
            Some(())
        }
    }
}

impl<'a> Head<'a> {
    /// An object: `field` is called with each key (plain keys only), standing at its
    /// value, and reads the value past.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.expect("{")?;
        if self.tag("}") {
            return Some(());
        }
        loop {
            self.expect("\"")?;
            let key = self.plain()?;
            self.expect(":")?;
            field(self, key)?;
            if !self.tag(",") {
                return self.expect("}");
            }
        }
    }

    /// An array: `item` is called standing at each item, and reads it past.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.expect("[")?;
        if self.tag("]") {
            return Some(());
        }
        loop {
            item(self)?;
            if !self.tag(",") {
                return self.expect("]");
            }
        }
    }

    /// A string of plain text (no escape, no control character).
    fn string_plain(&mut self) -> Option<&'a str> {
        self.expect("\"")?;
        self.plain()
    }

    /// Any string, as the decoder reads it into text: borrowed when plain, unescaped by
    /// `serde_json` itself otherwise (so a lone surrogate is refused the same way).
    fn text(&mut self) -> Option<Cow<'a, str>> {
        let raw = self.0;
        self.expect("\"")?;
        let mut plain = Head(self.0);
        if let Some(text) = plain.plain() {
            *self = plain;
            return Some(Cow::Borrowed(text));
        }
        self.string()?;
        let quoted = &raw[..raw.len() - self.0.len()];
        serde_json::from_str::<String>(quoted).ok().map(Cow::Owned)
    }

    fn owned_text(&mut self) -> Option<String> {
        self.text().map(Cow::into_owned)
    }

    /// A count: digits only, as JSON spells an integer, within `u64`. Anything else (a
    /// sign, a fraction, an exponent — which the decoder reads as a float and refuses) is
    /// `None`.
    fn count(&mut self) -> Option<u64> {
        let bytes = self.0.as_bytes();
        let n = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        if n == 0 || (n > 1 && bytes[0] == b'0') || matches!(bytes.get(n), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let value = self.0[..n].parse().ok()?;
        self.0 = &self.0[n..];
        Some(value)
    }

    /// An epoch-millisecond time: a [`Head::count`] within `i64`.
    fn epoch(&mut self) -> Option<i64> {
        self.count().and_then(|n| i64::try_from(n).ok())
    }

    fn boolean(&mut self) -> Option<bool> {
        if self.tag("true") {
            Some(true)
        } else if self.tag("false") {
            Some(false)
        } else {
            None
        }
    }

    /// A value `read` reads, or `null` (an absent optional field, to the decoder).
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.tag("null") {
            return Some(None);
        }
        read(self).map(Some)
    }

    /// Any value, as the decoder keeps free-form metadata: its text, `None` for `null`.
    fn raw_value(&mut self) -> Option<Option<&'a RawValue>> {
        let raw = self.skipped()?;
        if raw == "null" {
            return Some(None);
        }
        serde_json::from_str::<&RawValue>(raw).ok().map(Some)
    }

    /// Any value, read past.
    fn skip(&mut self) -> Option<()> {
        self.skipped().map(drop)
    }

    /// Any value, read past and checked as `serde_json` checks a value it skips; its
    /// text.
    fn skipped(&mut self) -> Option<&'a str> {
        let start = self.0;
        self.skip_nested(0)?;
        Some(&start[..start.len() - self.0.len()])
    }

    fn skip_nested(&mut self, depth: usize) -> Option<()> {
        match *self.0.as_bytes().first()? {
            b'"' => {
                self.0 = &self.0[1..];
                self.string()
            }
            b'{' | b'[' if depth >= MAX_SKIPPED_DEPTH => None,
            b'{' => {
                self.0 = &self.0[1..];
                if self.tag("}") {
                    return Some(());
                }
                loop {
                    self.expect("\"")?;
                    self.string()?;
                    self.expect(":")?;
                    self.skip_nested(depth + 1)?;
                    if !self.tag(",") {
                        return self.expect("}");
                    }
                }
            }
            b'[' => self.array(|head| head.skip_nested(depth + 1)),
            b't' => self.expect("true"),
            b'f' => self.expect("false"),
            b'n' => self.expect("null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A number as JSON spells it: `-`, then `0` or digits not starting with `0`, then
    /// a fraction and an exponent, each optional and each with at least one digit.
    fn number(&mut self) -> Option<()> {
        let bytes = self.0.as_bytes();
        let digits = |from: usize| from + bytes[from..].iter().take_while(|b| b.is_ascii_digit()).count();
        let mut i = usize::from(bytes.first() == Some(&b'-'));
        i = match bytes.get(i)? {
            b'0' => i + 1,
            b'1'..=b'9' => digits(i + 1),
            _ => return None,
        };
        if bytes.get(i) == Some(&b'.') {
            let end = digits(i + 1);
            if end == i + 1 {
                return None;
            }
            i = end;
        }
        if matches!(bytes.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(bytes.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            let end = digits(i);
            if end == i {
                return None;
            }
            i = end;
        }
        self.0 = &self.0[i..];
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use proptest::strategy::ValueTree as _;

    use super::*;
    use crate::event::captures::captured_events;
    use crate::event::decoder::two_pass;

    /// An event as OpenCode's global stream sends it (`props` already JSON).
    fn frame(kind: &str, props: &str) -> String {
        format!(
            r#"{{"directory":"/scratch/project","project":"34a087cc","payload":{{"id":"evt_1","type":"{kind}","properties":{props}}}}}"#
        )
    }

    /// JSON without the spaces between its tokens, as OpenCode writes it (the captures
    /// were written spaced); the keys keep their order.
    fn compact(json: &str) -> String {
        let (mut out, mut in_string, mut escaped) = (String::with_capacity(json.len()), false, false);
        for c in json.chars() {
            if in_string {
                (escaped, in_string) = (!escaped && c == '\\', escaped || c != '"');
            } else if c.is_ascii_whitespace() {
                continue;
            } else {
                in_string = c == '"';
            }
            out.push(c);
        }
        out
    }

    /// What the general decoder makes of a frame.
    fn decoded(frame: &str) -> Result<Envelope, String> {
        two_pass(frame).map_err(|e| e.to_string())
    }

    #[test]
    fn every_captured_event_of_the_types_read_here_is_read_as_the_decoder_reads_it() {
        let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (kind, props) in captured_events() {
            let kind: String = serde_json::from_str(&kind).unwrap();
            let f = frame(&kind, &compact(&props));
            let read = read(&f);
            if let Some(envelope) = &read {
                assert_eq!(Ok(envelope.clone()), decoded(&f), "{f}");
            }
            let retry = props.contains(r#""retry""#);
            let counts = seen.entry(if retry { format!("{kind} retry") } else { kind }).or_default();
            counts.0 += usize::from(read.is_some());
            counts.1 += 1;
        }
        for kind in ["message.part.updated", "message.updated", "session.status", "session.idle", "todo.updated"] {
            let (taken, all) = seen[kind];
            assert!(all > 0 && taken == all, "{kind}: {taken} of {all} read here");
        }
        assert_eq!(seen["session.status retry"].0, 0, "a retry goes to the decoder");
        assert_eq!(seen["session.updated"].0, 0, "other types go to the decoder");
    }

    #[test]
    fn other_spellings_go_to_the_decoder() {
        let status = frame("session.status", r#"{"sessionID":"ses_A","status":{"type":"busy"}}"#);
        assert!(read(&status).is_some());
        for other in [
            status.replace(r#""status":{"#, r#""status": {"#),
            status.replace(r#"{"sessionID""#, r#"{"session\u0049D""#),
            status.replace("ses_A", r"ses_\u0041"),
            status.replace("ses_A", "ses_A/.."),
            status.replace(r#"{"type":"busy"}"#, r#"{"type":"busy","x":1}"#),
            status.replace(r#""status":{"#, r#""sessionID":"ses_B","status":{"#),
            status.replace("}}}}", "}}} }"),
            status.replace("}}}}", "}}},\"x\":1}"),
        ] {
            assert_eq!(read(&other), None, "{other}");
        }
    }

    /// A JSON value for a field: mostly of the field's own kind, now and then anything
    /// that could trip a reader of bytes — escapes (valid and not), control characters,
    /// nulls, numbers spelt every way (valid and not), nesting, spaces, broken JSON.
    fn value(usual: impl Strategy<Value = String> + 'static) -> BoxedStrategy<String> {
        let odd = prop_oneof![
            Just("null"), Just("true"), Just("false"), Just("0"), Just("-1"), Just("12"), Just("1.5"),
            Just("-0.0E+3"), Just("1e5"), Just("01"), Just("1."), Just("-"), Just("1e"), Just(".5"), Just("+1"),
            Just("\"\""), Just(r#""a\"b""#), Just(r#""\u0041""#), Just(r#""\ud800""#), Just(r#""\x""#),
            Just("\"a\u{1}b\""), Just("\"é\""), Just("{}"), Just("[]"), Just(r#"{"a":[1,{"b":null}]}"#),
            Just(r#"{"a" :1}"#), Just(r#"["x",]"#), Just(r#"{"a":1"#), Just(r#"{"\u0061":1}"#), Just("tru"),
            Just("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"),
        ];
        prop_oneof![24 => usual, 1 => odd.prop_map(String::from)].boxed()
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[A-Za-z0-9 _.]{0,12}".prop_map(|t| format!("\"{t}\"")),
            1 => any::<String>().prop_map(|t| serde_json::to_string(&t).unwrap()),
        ]
    }

    fn one_of(names: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop::sample::select(names).prop_map(|n| format!("\"{n}\""))
    }

    /// An object of the given fields, in a shuffled order: the first `required` always
    /// there (nearly: now and then one is missing), the others now and then; now and then
    /// one of them twice.
    fn object(required: usize, fields: Vec<(&'static str, BoxedStrategy<String>)>) -> impl Strategy<Value = String> {
        let n = fields.len();
        let chosen: Vec<_> = fields
            .into_iter()
            .enumerate()
            .map(|(i, (k, v))| {
                (prop::bool::weighted(if i < required { 0.98 } else { 0.5 }), v).prop_map(move |(on, v)| on.then_some((k, v)))
            })
            .collect();
        (chosen, prop::bool::weighted(0.05), 0..n.max(1)).prop_flat_map(|(fields, twice, which)| {
            let mut fields: Vec<(&str, String)> = fields.into_iter().flatten().collect();
            if twice && which < fields.len() {
                fields.push(fields[which].clone());
            }
            Just(fields).prop_shuffle().prop_map(|fields| {
                let fields: Vec<String> = fields.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", fields.join(","))
            })
        })
    }

    fn part() -> impl Strategy<Value = String> {
        let state = object(1, vec![
            ("status", value(one_of(&["pending", "running", "completed", "error", "done"]))),
            ("input", value(prop_oneof![
                Just(r#"{"command":"ls","n":[1,2.5,null,true]}"#.to_string()),
                Just(r#"{"n":[1,2.5,null,true],"command":"ls"}"#.to_string()),
                Just(r#"[{"todos":[]},-3e2]"#.to_string()),
                text(),
            ])),
            ("metadata", value(prop_oneof![Just(r#"{"sessionId":"ses_child"}"#.to_string()), text()])),
            ("output", value(text())),
            ("time", value(Just(r#"{"start":1795975376690}"#.to_string()))),
        ]);
        object(4, vec![
            ("id", value(one_of(&["prt_1", "prt_2"]))),
            ("messageID", value(one_of(&["msg_1"]))),
            ("sessionID", value(one_of(&["ses_A"]))),
            ("type", value(one_of(&["text", "tool", "reasoning", "step-start", "step-finish", "compaction", "patch"]))),
            ("text", value(text())),
            ("synthetic", value(prop_oneof![Just("true".to_string()), Just("false".to_string())])),
            ("ignored", value(Just("false".to_string()))),
            ("metadata", value(Just(r#"{"shepherd":{"kind":"nudge","instance":"i"}}"#.to_string()))),
            ("tool", value(one_of(&["bash", "todowrite", "task"]))),
            ("state", value(state)),
            ("snapshot", value(text())),
        ])
    }

    /// Whatever a part holds, a frame this reader takes is the event the decoder reads;
    /// and it takes a good share of them (the test says nothing otherwise).
    #[test]
    fn a_part_read_here_is_the_part_the_decoder_reads() {
        let frames = (part(), value(Just("1795975376690".to_string())))
            .prop_map(|(part, time)| frame("message.part.updated", &format!(r#"{{"sessionID":"ses_A","part":{part},"time":{time}}}"#)));
        let (taken, cases) = read_as_decoded(frames);
        assert!(taken * 3 > cases, "{taken} of {cases} taken");
    }

    /// Generates frames: each one this reader takes must be what the decoder reads.
    /// How many it took, of how many.
    fn read_as_decoded(frames: impl Strategy<Value = String>) -> (usize, usize) {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut taken, cases) = (0, 4000);
        for _ in 0..cases {
            let f = frames.new_tree(&mut runner).unwrap().current();
            if let Some(envelope) = read(&f) {
                assert_eq!(Ok(envelope), decoded(&f), "{f}");
                taken += 1;
            }
        }
        (taken, cases)
    }

    /// A count or a time as JSON might spell it: mostly plain, now and then what the
    /// decoder refuses or reads otherwise (signs, fractions, exponents, overflow).
    fn number() -> BoxedStrategy<String> {
        prop_oneof![
            8 => (0u64..2_000_000_000_000).prop_map(|n| n.to_string()),
            1 => prop::sample::select(&["0", "-1", "-0", "1.0", "1e3", "01", "9223372036854775808", "18446744073709551616", "null"][..])
                .prop_map(String::from),
        ]
        .boxed()
    }

    fn message_info() -> impl Strategy<Value = String> {
        let tokens = object(0, vec![
            ("input", number()),
            ("output", number()),
            ("total", number()),
            ("cache", value(object(0, vec![("read", number()), ("write", number())]))),
        ]);
        let time = object(0, vec![("created", number()), ("completed", number()), ("updated", number())]);
        let model = object(2, vec![("providerID", value(one_of(&["fake"]))), ("modelID", value(text())), ("x", value(text()))]);
        let error = prop::sample::select(&[
            r#"{"name":"MessageAbortedError","data":{"message":"Aborted"}}"#,
            r#"{"name":"APIError","data":{"statusCode":429,"isRetryable":true,"metadata":{"code":"X"}}}"#,
            r#"{"data":{}}"#,
        ][..])
        .prop_map(String::from);
        object(3, vec![
            ("id", value(one_of(&["msg_1"]))),
            ("sessionID", value(one_of(&["ses_A"]))),
            ("role", value(one_of(&["user", "assistant", "system"]))),
            ("agent", value(text())),
            ("mode", value(one_of(&["build", "plan"]))),
            ("model", value(model)),
            ("providerID", value(one_of(&["fake"]))),
            ("modelID", value(text())),
            ("finish", value(one_of(&["stop", "tool-calls"]))),
            ("error", value(error)),
            ("time", value(time)),
            ("summary", value(prop_oneof![Just("true".to_string()), Just(r#"{"diffs":[]}"#.to_string())])),
            ("tokens", value(tokens)),
            ("path", value(Just(r#"{"cwd":"/p","root":"/p"}"#.to_string()))),
        ])
    }

    /// Whatever a message's info holds, a frame this reader takes is the event the
    /// decoder reads; and it takes a good share of them.
    #[test]
    fn a_message_read_here_is_the_message_the_decoder_reads() {
        let frames = message_info().prop_map(|info| frame("message.updated", &format!(r#"{{"sessionID":"ses_A","info":{info}}}"#)));
        let (taken, cases) = read_as_decoded(frames);
        assert!(taken * 5 > cases, "{taken} of {cases} taken");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn a_status_or_todo_list_read_here_is_the_one_the_decoder_reads(
            status in value(
                prop::sample::select(&[r#"{"type":"busy"}"#, r#"{"type":"idle"}"#, r#"{"type":"retry","attempt":1}"#][..])
                    .prop_map(String::from)
            ),
            todo in object(2, vec![
                ("content", value(text())),
                ("status", value(one_of(&["pending", "in_progress", "completed", "cancelled", "done"]))),
                ("priority", value(one_of(&["high", "low"]))),
                ("id", value(text())),
            ]),
            n in 0usize..3,
        ) {
            let f = frame("session.status", &format!(r#"{{"sessionID":"ses_A","status":{status}}}"#));
            if let Some(envelope) = read(&f) {
                prop_assert_eq!(Ok(envelope), decoded(&f), "{}", f);
            }
            let todos = vec![todo; n].join(",");
            let f = frame("todo.updated", &format!(r#"{{"sessionID":"ses_A","todos":[{todos}]}}"#));
            if let Some(envelope) = read(&f) {
                prop_assert_eq!(Ok(envelope), decoded(&f), "{}", f);
            }
        }
    }
}
