//! Fuzz-style properties of the SSE decoder (`src/opencode/sse.rs`), run by plain
//! `cargo test`: whatever bytes arrive, cut wherever the network cuts them, the decoder
//! never panics, yields the same frames, and honours its frame bound.

use proptest::collection::vec;
use proptest::prelude::*;
use shepherd::opencode::sse::{Frames, SseDecoder, MAX_FRAME_BYTES};

/// Feeds `stream` cut at `cuts` (offsets, any order, out-of-range ones folded in).
fn decode_in_chunks(stream: &[u8], cuts: &[usize]) -> Frames {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    at.push(0);
    at.push(stream.len());
    at.sort_unstable();
    at.dedup();
    let mut d = SseDecoder::new();
    let mut got = Frames::default();
    for w in at.windows(2) {
        let f = d.push(&stream[w[0]..w[1]]);
        got.data.extend(f.data);
        got.dropped += f.dropped;
    }
    got
}

/// Bytes that are mostly SSE syntax: field names, colons, both line ends, blank lines,
/// comments, multi-byte UTF-8 (so cuts land inside characters) and invalid UTF-8.
fn sse_ish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"data".to_vec()),
        Just(b"event: x".to_vec()),
        Just(b": keep-alive".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n\n".to_vec()),
        Just("é€😀".as_bytes().to_vec()),
        Just(vec![0xff, 0xfe]),
        Just(b"{\"type\":\"session.idle\"}".to_vec()),
        vec(any::<u8>(), 0..8),
    ];
    vec(token, 0..40).prop_map(|t| t.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary bytes: no panic, and the frames do not depend on where chunks end.
    #[test]
    fn frames_do_not_depend_on_chunk_boundaries(
        stream in prop_oneof![sse_ish_bytes(), vec(any::<u8>(), 0..300)],
        cuts in vec(any::<usize>(), 0..12),
    ) {
        let whole = SseDecoder::new().push(&stream);
        prop_assert_eq!(decode_in_chunks(&stream, &cuts), whole);
    }

    /// Well-formed frames (any text without line ends, multi-line, CRLF or LF, among
    /// comments and other fields) come out exactly, however they are cut.
    #[test]
    fn well_formed_frames_come_out_as_sent(
        frames in vec((vec("[^\r\n]{0,12}", 1..3), any::<bool>(), any::<bool>()), 0..6),
        cuts in vec(any::<usize>(), 0..12),
    ) {
        let mut stream = Vec::new();
        for (lines, crlf, comment) in &frames {
            let eol: &[u8] = if *crlf { b"\r\n" } else { b"\n" };
            if *comment {
                stream.extend_from_slice(b": ping");
                stream.extend_from_slice(eol);
                stream.extend_from_slice(b"event: message");
                stream.extend_from_slice(eol);
            }
            for line in lines {
                stream.extend_from_slice(b"data: ");
                stream.extend_from_slice(line.as_bytes());
                stream.extend_from_slice(eol);
            }
            stream.extend_from_slice(eol);
        }
        let want: Vec<String> = frames.iter().map(|(lines, _, _)| lines.join("\n")).collect();
        let got = decode_in_chunks(&stream, &cuts);
        prop_assert_eq!(got.data, want);
        prop_assert_eq!(got.dropped, 0);
    }
}

proptest! {
    // Each case moves ~8 MiB: a handful of cases covers both sides of the bound.
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// A frame is kept exactly when its data is within `MAX_FRAME_BYTES`, wherever the
    /// chunks end (also inside the `data:` prefix or the line end), and the next frame
    /// is kept either way.
    #[test]
    fn the_frame_bound_is_honoured_wherever_the_chunks_end(
        delta in -8i64..=8,
        crlf in any::<bool>(),
        cuts in vec(0usize..16, 0..4),
        far_cuts in vec(any::<usize>(), 0..3),
    ) {
        let len = (MAX_FRAME_BYTES as i64 + delta) as usize;
        let eol: &[u8] = if crlf { b"\r\n" } else { b"\n" };
        let mut stream = b"data: ".to_vec();
        stream.resize(stream.len() + len, b'x');
        stream.extend_from_slice(eol);
        stream.extend_from_slice(eol);
        stream.extend_from_slice(b"data: next\n\n");
        // Cuts near both ends of the big line, where the bound is decided, and anywhere.
        let end = 6 + len;
        let mut at: Vec<usize> = cuts.iter().flat_map(|c| [*c, end.saturating_sub(*c), end + c % 3]).collect();
        at.extend(far_cuts);
        let got = decode_in_chunks(&stream, &at);
        let kept = len <= MAX_FRAME_BYTES;
        prop_assert_eq!(got.dropped, usize::from(!kept));
        prop_assert_eq!(got.data.len(), 1 + usize::from(kept));
        prop_assert!(got.data.iter().all(|d| d.len() <= MAX_FRAME_BYTES));
        prop_assert_eq!(got.data.last().map(String::as_str), Some("next"));
    }
}

/// An over-long line that is not `data` (a proxy's comment, another field) changes no
/// frame, split or not: only data counts toward the bound.
#[test]
fn an_over_long_comment_drops_nothing_however_it_is_cut() {
    let mut stream = b"data: a\n".to_vec();
    stream.push(b':');
    stream.resize(stream.len() + MAX_FRAME_BYTES + 10, b'c');
    stream.extend_from_slice(b"\ndata: b\n\n");
    let whole = SseDecoder::new().push(&stream);
    assert_eq!((whole.data.clone(), whole.dropped), (vec!["a\nb".to_string()], 0));
    assert_eq!(decode_in_chunks(&stream, &[3, 9, 1 << 20, 5 << 20]), whole);
}
