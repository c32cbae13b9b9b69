//! The captured OpenCode streams, for the decoders' tests.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The captured OpenCode streams (per-directory shape, one event per line), as
/// (`type`, `properties`) JSON texts.
pub(super) fn captured_events() -> Vec<(String, String)> {
    #[derive(Deserialize)]
    struct Line<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a RawValue>,
        #[serde(borrow)]
        properties: Option<&'a RawValue>,
        #[serde(borrow)]
        payload: Option<Box<Line<'a>>>,
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../actors/tests/fixtures/captures");
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the captures are in the repository") {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut l: Line = serde_json::from_str(line).expect("a captured event");
            if let Some(payload) = l.payload.take() {
                l = *payload; // the global stream's shape
            }
            if let (Some(kind), Some(props)) = (l.kind, l.properties) {
                events.push((kind.get().to_string(), props.get().to_string()));
            }
        }
    }
    assert!(events.len() > 1000, "{} captured events", events.len());
    events
}

