//! Decoding any frame answers an event or an error, never a panic; an unknown type only
//! for a type the decoder does not name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shepherd_actors::event::{decode, is_known_kind, Event};

fuzz_target!(|input: &[u8]| {
    let frame = String::from_utf8_lossy(input);
    if let Ok(env) = decode(&frame) {
        if let Event::Unknown { kind } = &env.event {
            assert!(!is_known_kind(kind), "a known type decoded as unknown: {kind}");
        }
    }
});
