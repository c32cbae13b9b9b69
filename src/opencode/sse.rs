//! Server-Sent Events framing: bytes in, `data:` payloads out.
//!
//! Pure and incremental: chunks may split lines and frames anywhere. OpenCode sends
//! only `data:` lines (no `id:`/`event:`), but the parser follows the SSE rules so a
//! proxy's comments (`: keep-alive`) or CRLF line ends change nothing. A frame longer
//! than [`MAX_FRAME_BYTES`] is dropped (and reported) rather than growing without bound.

/// A single event larger than this is dropped: no OpenCode event comes near it, and a
/// broken peer must not make Shepherd buffer without limit.
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// What one chunk produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Frames {
    /// Complete `data:` payloads, in order.
    pub data: Vec<String>,
    /// Frames dropped for being too large or not UTF-8.
    pub dropped: usize,
}

/// Incremental decoder of one SSE stream.
///
/// Lines are found with `memchr`; a frame that lies whole inside one chunk (nearly all
/// of them) is handed out as a slice of that chunk, never copied. Only a line or frame
/// split across chunks is assembled in a buffer.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// The start of a line whose end is in a later chunk.
    line: Vec<u8>,
    /// The rest of a line that grew past the limit is skipped up to its end.
    skipping_line: bool,
    /// The data of the frame so far, once it could not stay a slice of the chunk.
    data: String,
    has_data: bool,
    oversized: bool,
}

/// The data of the frame being read: still a slice of the current chunk, or copied.
enum Pending {
    None,
    Borrowed(usize, usize),
    Owned,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; returns the frames it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Frames {
        let mut data = Vec::new();
        let dropped = self.push_each(chunk, |frame| data.push(frame.to_string()));
        Frames { data, dropped }
    }

    /// Feeds a chunk and hands each completed frame's data to `on_frame`, in order;
    /// returns how many frames were dropped (too large or not UTF-8).
    pub fn push_each(&mut self, chunk: &[u8], mut on_frame: impl FnMut(&str)) -> usize {
        let mut dropped = 0;
        let mut pending = if self.has_data { Pending::Owned } else { Pending::None };
        let mut pos = 0;
        while pos < chunk.len() {
            let Some(nl) = memchr::memchr(b'\n', &chunk[pos..]).map(|i| pos + i) else {
                // An unfinished line: keep it (bounded) for the next chunk.
                self.keep_partial(&chunk[pos..]);
                break;
            };
            if self.skipping_line {
                self.skipping_line = false;
            } else if self.line.is_empty() {
                self.end_line(chunk, true, pos, nl, &mut pending, &mut dropped, &mut on_frame);
            } else {
                self.keep_partial(&chunk[pos..nl]);
                if self.skipping_line {
                    self.skipping_line = false;
                } else {
                    let line = std::mem::take(&mut self.line);
                    self.end_line(&line, false, 0, line.len(), &mut pending, &mut dropped, &mut on_frame);
                    self.line = line;
                    self.line.clear();
                }
            }
            pos = nl + 1;
        }
        // A frame still open at the chunk's end must outlive the chunk.
        if let Pending::Borrowed(a, b) = pending {
            if !self.own(&chunk[a..b]) {
                self.oversized = true;
            }
        }
        dropped
    }

    /// Buffers part of a line, up to the longest line a kept frame can have; a longer
    /// line is skipped to its end and, if it is a `data` line, drops its frame. The same
    /// as a line whole in one chunk: the bound is on the data, never on where the
    /// chunks end.
    fn keep_partial(&mut self, part: &[u8]) {
        /// `data: ` before the value and a `\r` after it do not count toward the bound.
        const MAX_LINE_BYTES: usize = MAX_FRAME_BYTES + b"data: \r".len();
        if self.skipping_line {
            return;
        }
        if self.line.len() + part.len() > MAX_LINE_BYTES {
            let head: Vec<u8> = self.line.iter().chain(part).take(5).copied().collect();
            if head == b"data:" {
                self.oversized = true;
            }
            self.skipping_line = true;
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(part);
        }
    }

    /// Copies frame data into the buffer (the frame continues past this chunk or has
    /// more than one `data:` line) if it is UTF-8; false (nothing copied) if not, and
    /// the frame is then dropped whole. Data is checked once: here, or when a frame
    /// borrowed from its chunk ends.
    #[must_use]
    fn own(&mut self, text: &[u8]) -> bool {
        match simdutf8::basic::from_utf8(text) {
            Ok(text) => {
                self.data.push_str(text);
                true
            }
            Err(_) => false,
        }
    }

    /// One complete line, `buf[start..end]` (without its `\n`). `in_chunk`: `buf` is the
    /// chunk being pushed (so the frame's data may stay a slice of it).
    #[allow(clippy::too_many_arguments)] // one call site per buffer; a struct would only rename them
    fn end_line(
        &mut self,
        buf: &[u8],
        in_chunk: bool,
        start: usize,
        end: usize,
        pending: &mut Pending,
        dropped: &mut usize,
        on_frame: &mut impl FnMut(&str),
    ) {
        let end = if end > start && buf[end - 1] == b'\r' { end - 1 } else { end };
        let raw = &buf[start..end];
        if raw.is_empty() {
            if self.oversized {
                *dropped += 1;
            } else {
                match *pending {
                    Pending::Borrowed(a, b) => match simdutf8::basic::from_utf8(&buf[a..b]) {
                        Ok(text) => on_frame(text),
                        Err(_) => *dropped += 1,
                    },
                    Pending::Owned => on_frame(&self.data),
                    Pending::None => {}
                }
            }
            *pending = Pending::None;
            self.data.clear();
            self.has_data = false;
            self.oversized = false;
            return;
        }
        if raw[0] == b':' {
            return; // comment / keep-alive
        }
        let (field, value_start) = match memchr::memchr(b':', raw) {
            Some(i) => (&raw[..i], start + i + 1 + usize::from(raw.get(i + 1) == Some(&b' '))),
            None => (raw, end),
        };
        if field != b"data" {
            return;
        }
        let value = &buf[value_start..end];
        if self.oversized {
            return; // unusable: the frame is dropped whole
        }
        let so_far = match *pending {
            Pending::Borrowed(a, b) => b - a,
            _ => self.data.len(),
        };
        if so_far + usize::from(self.has_data) + value.len() > MAX_FRAME_BYTES {
            self.oversized = true;
            return;
        }
        if !self.has_data && in_chunk {
            *pending = Pending::Borrowed(value_start, end);
        } else {
            let earlier_kept = match *pending {
                Pending::Borrowed(a, b) => self.own(&buf[a..b]),
                _ => true,
            };
            if self.has_data {
                self.data.push('\n');
            }
            if !(earlier_kept && self.own(value)) {
                self.oversized = true;
                return;
            }
            *pending = Pending::Owned;
        }
        self.has_data = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_chunks_are_reassembled() {
        let mut d = SseDecoder::new();
        assert!(d.push(b"data: {\"a\"").data.is_empty());
        assert_eq!(d.push(b":1}\n\ndata: x\r\n\r\n").data, vec!["{\"a\":1}".to_string(), "x".to_string()]);
    }

    #[test]
    fn comments_and_other_fields_are_ignored() {
        let mut d = SseDecoder::new();
        let f = d.push(b": keep-alive\n\nevent: x\nid: 3\ndata: y\n\n");
        assert_eq!(f.data, vec!["y".to_string()]);
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let mut d = SseDecoder::new();
        assert_eq!(d.push(b"data: a\ndata: b\n\n").data, vec!["a\nb".to_string()]);
    }

    #[test]
    fn any_split_of_a_stream_gives_the_same_frames() {
        let stream: &[u8] = b"data: {\"a\":1}\n\n: ping\r\n\r\ndata: one\r\ndata: two\n\nevent: e\ndata:x\n\ndata: \xff\n\ndata: last\n\n";
        let whole = SseDecoder::new().push(stream);
        assert_eq!(whole.data, vec!["{\"a\":1}", "one\ntwo", "x", "last"]);
        assert_eq!(whole.dropped, 1);
        for size in 1..stream.len() {
            let mut d = SseDecoder::new();
            let mut got = Frames::default();
            for chunk in stream.chunks(size) {
                let f = d.push(chunk);
                got.data.extend(f.data);
                got.dropped += f.dropped;
            }
            assert_eq!(got, whole, "chunks of {size} bytes");
        }
    }

    #[test]
    fn a_frame_past_the_limit_is_dropped_and_the_next_one_kept() {
        let mut d = SseDecoder::new();
        let big = vec![b'x'; MAX_FRAME_BYTES / 2 + 1];
        assert_eq!(d.push(b"data: ").dropped, 0);
        for _ in 0..3 {
            assert!(d.push(&big).data.is_empty());
        }
        let f = d.push(b"\n\ndata: ok\n\n");
        assert_eq!((f.data, f.dropped), (vec!["ok".to_string()], 1));
    }

    #[test]
    fn a_frame_of_exactly_the_limit_is_kept_when_split_too() {
        // The buffer for a split line once counted `data: ` against the data's bound:
        // such a frame was kept whole in one chunk and dropped when split.
        let mut stream = b"data: ".to_vec();
        stream.resize(6 + MAX_FRAME_BYTES, b'x');
        stream.extend_from_slice(b"\r\n\r\n");
        let (head, tail) = stream.split_at(1 << 20);
        let mut d = SseDecoder::new();
        assert_eq!(d.push(head), Frames::default());
        let f = d.push(tail);
        assert_eq!((f.data.len(), f.dropped), (1, 0));
        assert_eq!(f.data[0].len(), MAX_FRAME_BYTES);
    }

    #[test]
    fn invalid_utf8_drops_the_frame_and_keeps_the_stream() {
        let mut d = SseDecoder::new();
        let f = d.push(b"data: \xff\xfe\n\ndata: ok\n\n");
        assert_eq!(f.dropped, 1);
        assert_eq!(f.data, vec!["ok".to_string()]);
    }

    /// However a frame's data is held (borrowed from its chunk, copied because the frame
    /// outlives the chunk, or joined from several `data:` lines), a byte that is not
    /// UTF-8 anywhere in it drops that frame and only it.
    #[test]
    fn invalid_utf8_drops_the_frame_however_it_is_held() {
        let cases: [&[&[u8]]; 5] = [
            &[b"data: a\xff\n", b"\ndata: ok\n\n"],                 // borrowed, then the chunk ends
            &[b"data: a\xff", b"b\n\ndata: ok\n\n"],                // a line across chunks
            &[b"data: \xffa\ndata: b\n\ndata: ok\n\n"],              // the first of two lines
            &[b"data: a\ndata: \xffb\n\ndata: ok\n\n"],              // the second of two lines
            &[b"data: a\n", b"data: \xff\n\ndata: ok\n\n"],          // the second line, next chunk
        ];
        for chunks in cases {
            let mut d = SseDecoder::new();
            let (mut data, mut dropped) = (Vec::new(), 0);
            for chunk in chunks {
                let f = d.push(chunk);
                data.extend(f.data);
                dropped += f.dropped;
            }
            assert_eq!((data, dropped), (vec!["ok".to_string()], 1), "{chunks:?}");
        }
    }
}
