//! The 43 real event streams captured from OpenCode 1.18.34 (copied from the field study
//! into `fixtures/captures/`), replayed through the decoder and the session core.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use shepherd_actors::config::SessionRules;
use shepherd_actors::event::{decode, Event};
use shepherd_actors::journal::Action;
use shepherd_actors::session::{Effect, Now, SessionCore};

fn captures() -> Vec<(String, Vec<String>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/captures");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures present")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let lines = std::fs::read_to_string(&p).unwrap().lines().map(str::to_string).collect();
            (name, lines)
        })
        .collect();
    out.sort();
    out
}

/// A capture line without the study's `_recv` receive time (not part of the payload).
fn frame(line: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(line).expect("capture lines are JSON");
    if let Some(o) = v.as_object_mut() {
        o.remove("_recv");
    }
    v.to_string()
}

#[test]
fn every_event_of_every_capture_decodes() {
    let all = captures();
    assert_eq!(all.len(), 43);
    let mut unknown = std::collections::BTreeSet::new();
    for (name, lines) in &all {
        for (i, line) in lines.iter().enumerate() {
            let env = decode(&frame(line)).unwrap_or_else(|e| panic!("{name}:{}: {e}", i + 1));
            if let Event::Unknown { kind } = env.event {
                unknown.insert(kind);
            }
        }
    }
    // Only types Shepherd deliberately ignores are left unknown.
    for kind in &unknown {
        assert!(
            ["plugin.added", "catalog.updated", "reference.updated", "integration.updated"].contains(&kind.as_str()),
            "unexpected unknown type {kind}"
        );
    }
}

/// Replays one capture into a core for each session in it; returns all records' actions.
fn replay(name: &str) -> Vec<(String, Action)> {
    let (_, lines) = captures().into_iter().find(|(n, _)| n == name).expect("capture exists");
    let t0 = tokio::time::Instant::now();
    let rules = Arc::new(SessionRules::default());
    let mut cores: std::collections::HashMap<String, SessionCore> = Default::default();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let event = decode(&frame(line)).unwrap().event;
        let Some(id) = event.session_id().map(str::to_string) else { continue };
        let now = Now { mono: t0 + Duration::from_millis(i as u64), wall_ms: 1_795_974_000_000 + i as i64 };
        let core = cores.entry(id.clone()).or_insert_with(|| SessionCore::new("srv", &id, Arc::clone(&rules), now));
        for e in core.observe(&event, now) {
            if let Effect::Record(r) = e {
                out.push((id.clone(), r.action));
            }
        }
    }
    out
}

#[test]
fn an_abort_by_someone_else_in_a_real_stream_pauses_the_session() {
    let actions: Vec<_> = replay("stall_then_abort").into_iter().map(|(_, a)| a).collect();
    assert_eq!(actions.iter().filter(|a| **a == Action::Pause).count(), 1, "{actions:?}");
}

#[test]
fn a_normal_turn_in_a_real_stream_needs_no_action() {
    assert_eq!(replay("basic_turn"), vec![]);
}
