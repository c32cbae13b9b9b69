//! The tool-call-as-text scanner answers any text without panicking, with a bounded
//! excerpt.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shepherd_actors::session::textual_tool_call::{detect, AssistantText};

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input).into_owned();
    let messages = [AssistantText { texts: vec![text], called_tools: input.first().is_some_and(|b| b & 1 == 1) }];
    if let Some(found) = detect(&messages) {
        assert!(found.excerpt.chars().count() <= 80);
    }
});
