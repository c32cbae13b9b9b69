//! Rendering any template never panics, and a template without a known `{name}` comes
//! out unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shepherd_actors::session::prompt::{fill, render, PromptFacts};

fuzz_target!(|input: &[u8]| {
    let template = String::from_utf8_lossy(input);
    let vars = [("pending", "1".to_string()), ("todoList", "- [pending] {x}".to_string())];
    if !template.contains("{pending}") && !template.contains("{todoList}") {
        assert_eq!(fill(&template, &vars), template);
    }
    let _ = render(&template, &[], &PromptFacts::default());
});
