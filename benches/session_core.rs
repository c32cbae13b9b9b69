//! How fast the pure session core decides: events per second through `observe` and
//! deadlines per second through `on_deadline`, for a fleet-sized number of sessions.
//! Run with `cargo bench`; numbers are printed, never asserted.

use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use shepherd_core::config::SessionRules;
use shepherd_core::event::decode;
use shepherd_core::session::{Now, SessionCore};

const SESSIONS: usize = 2_000;
const EVENTS_PER_SESSION: usize = 200;

fn main() {
    let frames = [
        r#"{"directory":"/p","payload":{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}}"#,
        r#"{"directory":"/p","payload":{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_T","field":"text","delta":"Hello "}}}"#,
        r#"{"directory":"/p","payload":{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_X","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{"status":"running"}}}}}"#,
        r#"{"directory":"/p","payload":{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_B","sessionID":"ses_A","role":"assistant","finish":"tool-calls","time":{"created":1}}}}}"#,
    ];

    let t = StdInstant::now();
    let mut decoded = Vec::new();
    for i in 0..100_000 {
        decoded.push(decode(frames[i % frames.len()]).expect("bench frames decode").event);
    }
    report("decode", 100_000, t.elapsed());
    decode_captures();

    let cfg = Arc::new(SessionRules::default());
    let t0 = tokio::time::Instant::now();
    let now = Now { mono: t0, wall_ms: 0 };
    let mut cores: Vec<SessionCore> =
        (0..SESSIONS).map(|i| SessionCore::new("srv", format!("ses_{i}"), Arc::clone(&cfg), now)).collect();

    let t = StdInstant::now();
    let mut effects = 0usize;
    for (i, core) in cores.iter_mut().enumerate() {
        for j in 0..EVENTS_PER_SESSION {
            let now = Now { mono: t0 + Duration::from_millis(j as u64), wall_ms: j as i64 };
            effects += core.observe(&decoded[(i + j) % decoded.len()], now).len();
        }
    }
    report("observe", SESSIONS * EVENTS_PER_SESSION, t.elapsed());

    let t = StdInstant::now();
    let late = Now { mono: t0 + Duration::from_secs(3600), wall_ms: 3_600_000 };
    for core in cores.iter_mut() {
        effects += core.on_deadline(late).len();
    }
    report("on_deadline", SESSIONS, t.elapsed());
    println!("({effects} effects produced)");
}

/// Every frame of the captured OpenCode streams (the test fixtures), decoded by
/// Shepherd's decoder against a full `serde_json` parse of the same frames — the
/// ceiling a decoder that builds every field would have. Frames are weighted as the
/// captures have them (deltas and `sync` duplicates are most of a busy stream), each in
/// the global stream's shape, as the pump reads them ([`global_shape`]).
fn decode_captures() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("actors/tests/fixtures/captures");
    let mut frames = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the captures are in the repository") {
        let text = std::fs::read_to_string(entry.expect("readable").path()).expect("readable");
        frames.extend(text.lines().filter(|l| !l.trim().is_empty()).map(global_shape));
    }
    let bytes: usize = frames.iter().map(String::len).sum();
    const ROUNDS: usize = 50;
    let n = frames.len() * ROUNDS;
    let t = StdInstant::now();
    let mut parsed = 0usize;
    for _ in 0..ROUNDS {
        for f in &frames {
            parsed += usize::from(serde_json::from_str::<serde_json::Value>(f).is_ok());
        }
    }
    let full = t.elapsed();
    report("full parse", n, full);
    let t = StdInstant::now();
    let mut decoded = 0usize;
    for _ in 0..ROUNDS {
        for f in &frames {
            decoded += usize::from(decode(f).is_ok());
        }
    }
    let ours = t.elapsed();
    report("decode", n, ours);
    println!(
        "(captured frames: {}, {:.0} bytes on average; {parsed} parsed, {decoded} decoded; decode takes {:.0}% of a full parse's time)",
        frames.len(),
        bytes as f64 / frames.len() as f64,
        100.0 * ours.as_secs_f64() / full.as_secs_f64()
    );
}

/// A captured line as the pump reads it from `/global/event`: most captures were taken
/// from a directory's own stream (`{"type", "properties"}` at the top), and every line
/// carries the capture's `_recv` time; OpenCode's global frames are
/// `{"directory", "project", "payload": {"id", "type", "properties"}}`, in that order,
/// without spaces (the captures were written with a space after each `:` and `,`).
fn global_shape(line: &str) -> String {
    compact(&spaced_global_shape(line))
}

/// The JSON text without the whitespace between its tokens (strings kept as they are).
fn compact(json: &str) -> String {
    let (mut out, mut in_string, mut escaped) = (String::with_capacity(json.len()), false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if !c.is_whitespace() {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

fn spaced_global_shape(line: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
        #[serde(rename = "type", borrow)]
        kind: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        properties: Option<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_str::<Line>(line) {
        Ok(Line { id: Some(id), kind: Some(kind), properties: Some(props) }) => format!(
            r#"{{"directory":"/scratch/project","project":"34a087cc2cab9675f8102d62afcd43ca","payload":{{"id":{},"type":{},"properties":{}}}}}"#,
            id.get(),
            kind.get(),
            props.get()
        ),
        _ => line.to_string(), // already in the global shape
    }
}

fn report(what: &str, n: usize, took: Duration) {
    let per_sec = n as f64 / took.as_secs_f64();
    println!("{what:<12} {n:>9} in {:>8.2} ms  = {per_sec:>12.0}/s", took.as_secs_f64() * 1000.0);
}
