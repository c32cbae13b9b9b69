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

/// The durable state with the last nudge reduced to "was there one" (its exported
/// value moves with the clock, not with the session).
fn durable(core: &SessionCore, now: Now) -> shepherd_actors::ledger::DurableState {
    let mut d = core.export(now);
    d.last_nudge_ms = d.last_nudge_ms.map(|_| 0);
    d
}

/// The session actor writes the ledger only when the core's durable generation moved:
/// replaying every capture in its own time (deadlines firing, prompts and recoveries
/// reported back), every change of the exported state must come with a new generation.
#[test]
fn every_change_of_the_durable_state_moves_the_generation() {
    use shepherd_actors::session::procedures::deliver::Delivery;
    let rules = Arc::new(SessionRules::default());
    let mut changes = 0;
    for (name, lines) in captures() {
        let t0 = tokio::time::Instant::now();
        let mut first_ms = None;
        let mut cores: std::collections::HashMap<String, SessionCore> = Default::default();
        for (i, line) in lines.iter().enumerate() {
            let recv_ms = serde_json::from_str::<serde_json::Value>(line).unwrap()["_recv"]
                .as_f64()
                .map_or(i as i64, |s| (s * 1000.0) as i64);
            let elapsed = recv_ms - *first_ms.get_or_insert(recv_ms);
            let now = Now { mono: t0 + Duration::from_millis(elapsed as u64), wall_ms: recv_ms };
            let mut step = |core: &mut SessionCore, what: &str, f: &mut dyn FnMut(&mut SessionCore) -> Vec<Effect>| {
                let (before, generation) = (durable(core, now), core.durable_generation());
                let mut effects = f(core);
                while let Some(effect) = effects.pop() {
                    effects.extend(match effect {
                        Effect::Prompt(order) => {
                            let sent = Delivery::Sent {
                                text: String::new(),
                                todos: order.known_todos.clone(),
                                waited_ms: 0,
                                tool_call_as_text: None,
                            };
                            core.on_prompt_finished(&order, &sent, now)
                        }
                        Effect::Recover(_) => core.on_recovery_finished(
                            &shepherd_actors::session::RecoveryReport::Continued {
                                idle_after_ms: Some(1),
                                open_todos: 0,
                                compacted: None,
                                waited_ms: 0,
                                tool_call_as_text: None,
                            },
                            now,
                        ),
                        Effect::Compact(order) => core.on_compaction_finished(&order, Ok(()), now),
                        Effect::Record(_)
                        | Effect::Stop
                        | Effect::HandOff(_)
                        | Effect::Advise(_)
                        | Effect::Finish(_)
                        | Effect::FindIntents
                        | Effect::Breaker(_) => Vec::new(),
                    });
                }
                if durable(core, now) != before {
                    changes += 1;
                    assert_ne!(core.durable_generation(), generation, "{name}:{}: {what} changed the state", i + 1);
                }
            };
            for core in cores.values_mut() {
                if core.deadline().is_some_and(|d| d <= now.mono) {
                    step(core, "a deadline", &mut |c| c.on_deadline(now));
                }
            }
            let event = decode(&frame(line)).unwrap().event;
            let Some(id) = event.session_id().map(str::to_string) else { continue };
            let core = cores.entry(id.clone()).or_insert_with(|| SessionCore::new("srv", &id, Arc::clone(&rules), now));
            step(core, event.kind(), &mut |c| c.observe(&event, now));
        }
    }
    assert!(changes >= 10, "the captures exercise the durable state ({changes} changes)");
}
