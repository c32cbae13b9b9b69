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
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: String,
    has_data: bool,
    oversized: bool,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk; returns the frames it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Frames {
        let mut out = Frames::default();
        for &b in chunk {
            if b == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.end_line(&line, &mut out);
            } else if self.line.len() <= MAX_FRAME_BYTES {
                self.line.push(b);
            } else {
                self.oversized = true;
            }
        }
        out
    }

    fn end_line(&mut self, raw: &[u8], out: &mut Frames) {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.is_empty() {
            if self.oversized {
                out.dropped += 1;
            } else if self.has_data {
                out.data.push(std::mem::take(&mut self.data));
            }
            self.data.clear();
            self.has_data = false;
            self.oversized = false;
            return;
        }
        if raw.starts_with(b":") {
            return; // comment / keep-alive
        }
        let (field, value) = match raw.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &raw[i + 1..];
                (&raw[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (raw, &b""[..]),
        };
        if field != b"data" {
            return;
        }
        let Ok(text) = std::str::from_utf8(value) else {
            self.oversized = true; // treat as unusable: the frame is dropped whole
            return;
        };
        if self.has_data {
            self.data.push('\n');
        }
        if self.data.len() + text.len() > MAX_FRAME_BYTES {
            self.oversized = true;
            return;
        }
        self.data.push_str(text);
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
    fn invalid_utf8_drops_the_frame_and_keeps_the_stream() {
        let mut d = SseDecoder::new();
        let f = d.push(b"data: \xff\xfe\n\ndata: ok\n\n");
        assert_eq!(f.dropped, 1);
        assert_eq!(f.data, vec!["ok".to_string()]);
    }
}
