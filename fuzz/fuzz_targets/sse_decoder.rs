//! The SSE decoder never panics, and the frames do not depend on where chunks end: the
//! first two bytes choose a cut, the rest is the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/opencode/sse.rs"]
#[allow(dead_code)] // the fuzz target uses only the decoder
mod sse;

use sse::SseDecoder;

fuzz_target!(|input: &[u8]| {
    let Some((cut, stream)) = input.split_first_chunk::<2>() else { return };
    let cut = usize::from(u16::from_le_bytes(*cut)) % (stream.len() + 1);
    let whole = SseDecoder::new().push(stream);
    let mut d = SseDecoder::new();
    let mut split = d.push(&stream[..cut]);
    let rest = d.push(&stream[cut..]);
    split.data.extend(rest.data);
    split.dropped += rest.dropped;
    assert_eq!(split, whole, "cut at {cut}");
});
