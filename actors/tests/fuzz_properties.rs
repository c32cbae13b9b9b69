//! Fuzz-style properties of the pure text handlers, run by plain `cargo test`: the event
//! decoder (`event::decode`), the tool-call-as-text scanner (`textual_tool_call`) and
//! the templates (`prompt::fill`, `prompt::render`). Each takes text from the network
//! or the configuration, so each must answer every input without panicking.

use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};
use shepherd_actors::event::{decode, is_known_kind, read_head, Envelope, Event, FrameHead, Todo, TodoStatus};
use shepherd_actors::session::prompt::{fill, render, PromptFacts};
use shepherd_actors::session::question::asks_the_person;
use shepherd_actors::session::textual_tool_call::{detect, detect_in, AssistantText, TAG_PATTERNS};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, ..ProptestConfig::default() }
}

// ── the event decoder ─────────────────────────────────────────────────────────────

/// Every event of the captured real streams (`fixtures/captures`), as the stream sends it.
fn real_frames() -> &'static [String] {
    static FRAMES: OnceLock<Vec<String>> = OnceLock::new();
    FRAMES.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/captures");
        let mut files: Vec<_> = std::fs::read_dir(dir).expect("fixtures present").map(|e| e.unwrap().path()).collect();
        files.sort();
        files
            .iter()
            .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(str::to_string).collect::<Vec<_>>())
            .map(|line| {
                let mut v: Value = serde_json::from_str(&line).expect("capture lines are JSON");
                v.as_object_mut().unwrap().remove("_recv"); // the study's receive time
                v.to_string()
            })
            .collect()
    })
}

/// Any JSON value, biased toward the keys and strings the decoder looks for.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("type".to_string()),
        Just("properties".to_string()),
        Just("payload".to_string()),
        Just("directory".to_string()),
        Just("sessionID".to_string()),
        Just("info".to_string()),
        Just("part".to_string()),
        Just("status".to_string()),
        Just("state".to_string()),
        Just("metadata".to_string()),
        Just("shepherd".to_string()),
        Just("error".to_string()),
        Just("id".to_string()),
        "[a-zA-Z]{1,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![Just("busy".to_string()), Just("tool".to_string()), Just("text".to_string()), ".{0,10}"]
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::from),
            vec((key.clone(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A known event type (or an unknown one) with arbitrary properties, in either shape.
fn event_shaped() -> impl Strategy<Value = String> {
    let kind = prop_oneof![
        Just("session.status"),
        Just("session.error"),
        Just("session.created"),
        Just("message.updated"),
        Just("message.part.updated"),
        Just("message.part.delta"),
        Just("todo.updated"),
        Just("permission.asked"),
        Just("question.replied"),
        Just("sync"),
        Just("plugin.added"),
    ];
    (kind, json_value(), any::<bool>(), json_value()).prop_map(|(kind, props, global, dir)| {
        let payload = json!({"type": kind, "properties": props});
        if global { json!({"directory": dir, "payload": payload}) } else { payload }.to_string()
    })
}

/// A real frame with a mutation: a byte changed, a cut, bytes inserted, or one of its
/// values replaced by an arbitrary one (so the shape is almost right).
fn mutated_real_frame() -> impl Strategy<Value = String> {
    let n = real_frames().len();
    prop_oneof![
        3 => mutated_bytes(real_frames(), ".{1,6}"),
        1 => (0..n, any::<usize>(), json_value()).prop_map(|(i, pick, value)| {
            let mut v: Value = serde_json::from_str(&real_frames()[i]).unwrap();
            replace_nth(&mut v, pick, value);
            v.to_string()
        }),
    ]
}

/// One of `frames` with a byte changed, a cut, or text matching `insert` inserted.
fn mutated_bytes(frames: &'static [String], insert: &'static str) -> impl Strategy<Value = String> {
    let n = frames.len();
    prop_oneof![
        (0..n, any::<usize>(), any::<u8>()).prop_map(move |(i, at, b)| {
            let mut bytes = frames[i].clone().into_bytes();
            let at = at % bytes.len();
            bytes[at] = b;
            String::from_utf8_lossy(&bytes).into_owned()
        }),
        (0..n, any::<usize>()).prop_map(move |(i, at)| {
            let f = &frames[i];
            String::from_utf8_lossy(&f.as_bytes()[..at % (f.len() + 1)]).into_owned()
        }),
        (0..n, any::<usize>(), insert).prop_map(move |(i, at, ins)| {
            let f = &frames[i];
            let at = (0..=at % (f.len() + 1)).rev().find(|k| f.is_char_boundary(*k)).unwrap_or(0);
            format!("{}{ins}{}", &f[..at], &f[at..])
        }),
    ]
}

/// Replaces the `n`th value (pre-order, modulo the count) of `v` with `with`.
fn replace_nth(v: &mut Value, n: usize, with: Value) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Value, n: &mut usize, with: &mut Option<Value>) {
        if *n == 0 {
            if let Some(w) = with.take() {
                *v = w;
            }
            return;
        }
        *n -= 1;
        match v {
            Value::Array(a) => a.iter_mut().for_each(|c| walk(c, n, with)),
            Value::Object(o) => o.values_mut().for_each(|c| walk(c, n, with)),
            _ => {}
        }
    }
    let mut n = n % count(v);
    walk(v, &mut n, &mut Some(with));
}

/// A captured delta as OpenCode writes it on `/global/event` (compact, in its key
/// order: what the head reader takes), with a byte changed, a cut or bytes inserted.
fn mutated_delta_frame() -> impl Strategy<Value = String> {
    static DELTAS: OnceLock<Vec<String>> = OnceLock::new();
    let deltas = DELTAS.get_or_init(|| {
        real_frames()
            .iter()
            .filter_map(|f| {
                let v: Value = serde_json::from_str(f).ok()?;
                let v = v.get("payload").unwrap_or(&v);
                let p = v.get("properties").filter(|_| v["type"] == "message.part.delta")?;
                Some(format!(
                    r#"{{"directory":"/scratch/project","project":"34a087cc","payload":{{"id":"evt_1","type":"message.part.delta","properties":{{"sessionID":{},"messageID":{},"partID":{},"field":{},"delta":{}}}}}}}"#,
                    p["sessionID"], p["messageID"], p["partID"], p["field"], p["delta"]
                ))
            })
            .collect()
    });
    mutated_bytes(deltas, r#"[\\"{},:a-z0-9 ]{1,4}"#)
}

/// What decoding may answer: an error, or an event; `Unknown` only for a type the
/// decoder does not name (a known type of the wrong shape is an error, not `Unknown`).
/// And what the frame's head says it is, the decoder agrees with: a delta read from the
/// head is the delta the decoder reads.
fn check_decode(frame: &str) -> Result<(), TestCaseError> {
    let decoded = decode(frame);
    if let Ok(env) = &decoded {
        if let Event::Unknown { kind } = &env.event {
            prop_assert!(!is_known_kind(kind), "a known type decoded as unknown: {kind}");
        }
        let _ = (env.event.kind(), env.event.session_id());
    }
    match read_head(frame) {
        FrameHead::Sync => prop_assert!(matches!(&decoded, Ok(e) if e.event == Event::Sync), "{frame}"),
        FrameHead::Delta(head) => {
            let Ok(Envelope { directory, event: Event::PartDelta { session_id, message_id, .. } }) = &decoded else {
                return Err(TestCaseError::fail(format!("a delta by its head, not by the decoder: {frame}")));
            };
            prop_assert_eq!(directory.as_deref(), head.directory);
            prop_assert_eq!((session_id.as_str(), message_id.as_str()), (head.session_id, head.message_id));
        }
        FrameHead::Other => {}
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in vec(any::<u8>(), 0..200)) {
        check_decode(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn decoding_arbitrary_json_never_panics(v in json_value()) {
        check_decode(&v.to_string())?;
    }

    #[test]
    fn decoding_event_shaped_json_never_panics(frame in event_shaped()) {
        check_decode(&frame)?;
    }

    #[test]
    fn decoding_mutated_real_frames_never_panics(frame in mutated_real_frame()) {
        check_decode(&frame)?;
    }

    #[test]
    fn a_mutated_delta_is_read_by_its_head_only_as_the_decoder_reads_it(frame in mutated_delta_frame()) {
        check_decode(&frame)?;
    }
}

// ── the tool-call-as-text scanner ─────────────────────────────────────────────────

/// Text made of the pieces the scanner reacts to: fences (open, closed, with
/// languages), backticks, tag openings, truncated tags, line ends, multi-byte
/// characters (so slicing around a match lands next to them).
fn scanner_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("```".to_string()),
        Just("```json\n".to_string()),
        Just("```html\n".to_string()),
        Just("```xml\n".to_string()),
        Just("`".to_string()),
        Just("\n".to_string()),
        Just("<".to_string()),
        Just("{\"function\": 1}".to_string()),
        Just("<div class=\"x\">".to_string()),
        Just("é€😀ß".to_string()),
        proptest::sample::select(TAG_PATTERNS).prop_map(str::to_string),
        proptest::sample::select(TAG_PATTERNS).prop_map(|p| p[..p.len() / 2].to_string()),
        ".{0,12}",
    ];
    vec(piece, 0..30).prop_map(|p| p.concat())
}

/// Prose that cannot itself be or hide a call: letters, digits, punctuation without
/// brackets or backticks, multi-byte letters.
fn prose() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,;:!?éüß€😀-]{0,60}"
}

/// A tool call as a model writes it into its reply (never containing a fence or a
/// backtick), with the name it is reported under.
fn written_call() -> impl Strategy<Value = (String, &'static str)> {
    prop_oneof![
        Just(("<function=bash><parameter=command>ls</parameter></function>".to_string(), "<function=")),
        Just(("<tool_call>{\"name\": \"read\", \"arguments\": {}}</tool_call>".to_string(), "<tool_call")),
        Just(("<invoke name=\"bash\"><parameter name=\"command\">ls".to_string(), "<invoke ")),
        Just(("[TOOL_CALLS][{\"name\": \"bash\"}]".to_string(), "[TOOL_CALLS]/[tool_calls]")),
        Just(("<|tool_call|>{\"name\":\"bash\"}".to_string(), "<|tool_call|>")),
        Just(("<function=read".to_string(), "<function=")), // cut off mid-stream
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Any text, in any number of messages: no panic, and an excerpt of bounded size.
    #[test]
    fn scanning_arbitrary_text_never_panics(
        texts in vec(prop_oneof![scanner_text(), any::<String>()], 0..4),
        called_tools in any::<bool>(),
    ) {
        for text in &texts {
            if let Some(found) = detect_in(text) {
                prop_assert!(found.excerpt.chars().count() <= 80);
            }
            let _ = asks_the_person(text);
        }
        let messages = vec![AssistantText { texts, called_tools }];
        let _ = detect(&messages);
    }

    /// A call written as text on its own line in prose is found, under its name.
    #[test]
    fn a_call_written_in_prose_is_found((call, name) in written_call(), before in prose(), after in prose()) {
        let text = format!("{before}\n{call}\n{after}");
        prop_assert_eq!(detect_in(&text).map(|f| f.pattern), Some(name));
    }

    /// The same call inside a fenced example in a markup or code language, or named in
    /// inline code, is an example, not a call (the module's documented rules).
    #[test]
    fn the_same_call_in_a_fenced_example_or_inline_code_is_not_found(
        (call, _) in written_call(),
        lang in proptest::sample::select(&["html", "jsx", "tsx", "markdown", "python", "bash", "rust"][..]),
        before in prose(),
        after in prose(),
    ) {
        let fenced = format!("{before}\n```{lang}\n{call}\n```\n{after}");
        prop_assert_eq!(detect_in(&fenced), None);
        let inline = format!("{before} `{call}` {after}");
        prop_assert_eq!(detect_in(&inline), None);
    }
}

/// Large inputs are scanned whole (no quadratic blow-up to wait out, no panic): over a
/// megabyte of example fences, inline code and tag fragments with multi-byte characters,
/// and the one real call at its very end is still found.
#[test]
fn a_megabyte_of_fences_and_tags_is_scanned_to_its_end() {
    let mut text = "```html\n<tool_call é\n```\nsee `<invoke` ü\n".repeat(30_000);
    assert!(text.len() > 1_000_000);
    assert_eq!(detect_in(&text), None);
    text.push_str("<function=😀");
    assert_eq!(detect_in(&text).map(|f| f.pattern), Some("<function="));
    let unclosed = format!("{}```\n<execute>", "é`x` ".repeat(200_000));
    assert_eq!(detect_in(&unclosed).map(|f| f.pattern), Some("<execute>"), "an unclosed fence runs to the end");
}

// ── the templates ─────────────────────────────────────────────────────────────────

/// The variables `render` fills, with values that themselves contain braces (values
/// are never expanded again).
fn vars() -> Vec<(&'static str, String)> {
    vec![("pending", "{total}".to_string()), ("todoList", "- [pending] a {b}".to_string()), ("attempts", "2".into())]
}

/// `fill` as it was written before it became one pass, kept as the oracle: the same
/// output on every template.
fn fill_oracle(template: &str, vars: &[(&str, String)]) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}').map(|close| (&after[..close], close)) {
            Some((name, close)) if vars.iter().any(|(n, _)| *n == name) => {
                out.push_str(&vars.iter().find(|(n, _)| *n == name).unwrap().1);
                rest = &after[close + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One piece of a template: text without braces, a known variable, an unknown
/// `{word}`, or a JSON-like object (braces of the template's own).
#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Known(usize),
    Unknown(String),
    Json(String),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        "[^{}]{0,10}".prop_map(Piece::Text),
        (0..3usize).prop_map(Piece::Known),
        "[a-zA-Z: ]{0,8}"
            .prop_filter("not a variable", |w| !vars().iter().any(|(n, _)| n == w))
            .prop_map(Piece::Unknown),
        "[a-z\": 0-9]{0,8}"
            .prop_filter("not a variable", |w| !vars().iter().any(|(n, _)| n == w))
            .prop_map(|inner| Piece::Json(format!("{{\"k\": {{{inner}}}}}"))),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// Arbitrary templates (brace-heavy or not): the same output as the old filler.
    #[test]
    fn filling_matches_the_old_filler_on_any_template(
        template in prop_oneof![any::<String>(), "[{}a-z é]{0,40}", "[{}]{0,40}"],
    ) {
        prop_assert_eq!(fill(&template, &vars()), fill_oracle(&template, &vars()));
    }

    /// Every known `{var}` is replaced by its value, everything else (unknown words,
    /// JSON braces) survives unchanged.
    #[test]
    fn known_variables_are_replaced_and_other_braces_survive(pieces in vec(piece(), 0..12)) {
        let vars = vars();
        let mut template = String::new();
        let mut want = String::new();
        for p in &pieces {
            match p {
                Piece::Text(t) | Piece::Json(t) => {
                    template.push_str(t);
                    want.push_str(t);
                }
                Piece::Known(i) => {
                    template.push_str(&format!("{{{}}}", vars[*i].0));
                    want.push_str(&vars[*i].1);
                }
                Piece::Unknown(w) => {
                    template.push_str(&format!("{{{w}}}"));
                    want.push_str(&format!("{{{w}}}"));
                }
            }
        }
        prop_assert_eq!(fill(&template, &vars), want);
    }

    /// `render` answers every template, todo list and fact without panicking.
    #[test]
    fn rendering_never_panics(
        template in prop_oneof![any::<String>(), "([{}]|\\{(pending|total|completed|todoList|attempts|maxAttempts|contextSummary)\\}|[a-z ]){0,30}"],
        todos in vec((any::<String>(), 0..4u8), 0..8),
        attempts in any::<u32>(),
        summary in any::<String>(),
    ) {
        let todos: Vec<Todo> = todos
            .into_iter()
            .map(|(content, s)| Todo {
                content,
                status: [TodoStatus::Pending, TodoStatus::InProgress, TodoStatus::Completed, TodoStatus::Cancelled][s as usize],
                priority: None,
            })
            .collect();
        let facts = PromptFacts { attempts, max_attempts: attempts, context_summary: summary };
        let _ = render(&template, &todos, &facts);
    }
}
