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

fn report(what: &str, n: usize, took: Duration) {
    let per_sec = n as f64 / took.as_secs_f64();
    println!("{what:<12} {n:>9} in {:>8.2} ms  = {per_sec:>12.0}/s", took.as_secs_f64() * 1000.0);
}
