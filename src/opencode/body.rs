//! The event stream's response body, taken out of its HTTP/1.1 framing in place: chunked
//! (as OpenCode sends it), of a stated length, or until the server closes.
//!
//! Why our own rather than hyper's: OpenCode sends every event as its own HTTP chunk,
//! and hyper hands a body on one chunk at a time — a channel send, a `Bytes` and a call
//! of the SSE decoder per event, about a sixth of Shepherd's CPU per event in the fleet
//! bench. Here the chunks one socket read brought are moved together at the front of the
//! read's buffer (a `copy_within` per chunk, no allocation), and the read's body goes on
//! as one piece: the SSE decoder meets a few hundred events in one call. Chunk-size lines
//! are read by `httparse` (the parser hyper reads heads with).
//!
//! Pure: bytes in, body bytes out. A line cut by the buffer's end is left for the next
//! call, with more bytes after it; the caller bounds the buffer, so a line can never
//! grow without bound.

/// How the response's body ends, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// `Transfer-Encoding: chunked`: chunks up to a last, empty one (and trailers).
    Chunked,
    /// `Content-Length`: this many bytes.
    Length(u64),
    /// Neither: the body ends when the server closes the connection.
    UntilClose,
}

/// The body's framing broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("a malformed chunk-size line")]
    ChunkSize,
    #[error("a chunk's data is not followed by CRLF")]
    ChunkEnd,
}

/// Where the decoder stands in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a chunk's size line.
    Size,
    /// Inside a chunk's data: this many bytes to come.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
    /// A body of a stated length: this many bytes to come.
    Length(u64),
    UntilClose,
    /// The body is complete; whatever follows is not its.
    Done,
}

/// What one [`BodyDecoder::decode_in_place`] did to its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// `buf[..data]` is body.
    pub data: usize,
    /// `buf[..consumed]` has been read; the rest (a line the buffer's end cut) waits
    /// for more bytes.
    pub consumed: usize,
}

/// Reads one response body, buffer after buffer.
#[derive(Debug)]
pub(crate) struct BodyDecoder {
    state: State,
}

impl BodyDecoder {
    pub(crate) fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Chunked => State::Size,
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::UntilClose => State::UntilClose,
        };
        Self { state }
    }

    /// The body has ended (its last chunk and trailers, or its length, read).
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The server closed the connection here: the body is complete only when it ends
    /// with the connection, or has already ended.
    pub(crate) fn complete_at_close(&self) -> bool {
        matches!(self.state, State::Done | State::UntilClose)
    }

    /// Reads `buf` (whatever was left unconsumed last time, then new bytes): the body
    /// bytes it holds are moved, in order, to `buf[..data]`. Stops at a line the
    /// buffer's end cuts (left unconsumed) or at the body's end (what follows is left).
    pub(crate) fn decode_in_place(&mut self, buf: &mut [u8]) -> Result<Decoded, BodyError> {
        let (mut data, mut pos) = (0, 0);
        loop {
            match self.state {
                State::Done => break,
                State::UntilClose => {
                    buf.copy_within(pos.., data);
                    data += buf.len() - pos;
                    pos = buf.len();
                    break;
                }
                State::Length(left) | State::Data(left) => {
                    let take = left.min((buf.len() - pos) as u64) as usize;
                    if take == 0 {
                        break;
                    }
                    buf.copy_within(pos..pos + take, data);
                    (data, pos) = (data + take, pos + take);
                    let left = left - take as u64;
                    self.state = match (self.state, left) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), _) => State::Length(left),
                        (_, 0) => State::DataEnd,
                        _ => State::Data(left),
                    };
                }
                State::DataEnd => match &buf[pos..] {
                    [b'\r', b'\n', ..] => {
                        pos += 2;
                        self.state = State::Size;
                    }
                    [] | [b'\r'] => break,
                    _ => return Err(BodyError::ChunkEnd),
                },
                State::Size => match httparse::parse_chunk_size(&buf[pos..]) {
                    Ok(httparse::Status::Complete((read, size))) => {
                        pos += read;
                        self.state = if size == 0 { State::Trailers } else { State::Data(size) };
                    }
                    Ok(httparse::Status::Partial) => break,
                    Err(httparse::InvalidChunkSize) => return Err(BodyError::ChunkSize),
                },
                State::Trailers => {
                    let Some(end) = memchr::memchr(b'\n', &buf[pos..]) else { break };
                    let line = &buf[pos..pos + end];
                    pos += end + 1;
                    if line.is_empty() || line == b"\r" {
                        self.state = State::Done;
                    }
                }
            }
        }
        Ok(Decoded { data, consumed: pos })
    }
}

/// `pieces` as a chunked body (each piece a chunk, its size line carrying `extension`),
/// ended by the last, empty chunk and `trailers`: the tests' server side.
#[cfg(test)]
pub(crate) fn encode_chunked<P: AsRef<[u8]>>(pieces: &[P], extension: &str, trailers: &str) -> Vec<u8> {
    let mut wire = Vec::new();
    for p in pieces {
        let p = p.as_ref();
        wire.extend_from_slice(format!("{:x}{extension}\r\n", p.len()).as_bytes());
        wire.extend_from_slice(p);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(format!("0\r\n{trailers}\r\n").as_bytes());
    wire
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `wire` to a decoder in pieces ending at `cuts` (as reads would bring it,
    /// the unconsumed rest kept in front of the next piece, as the stream does); returns
    /// the body, whether it ended, and what followed its end.
    fn decode(framing: Framing, wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, bool), BodyError> {
        let mut decoder = BodyDecoder::new(framing);
        let (mut body, mut buf, mut at) = (Vec::new(), Vec::new(), 0);
        let mut ends: Vec<usize> = cuts.iter().map(|&c| c.min(wire.len())).collect();
        ends.push(wire.len());
        ends.sort_unstable();
        for end in ends {
            buf.extend_from_slice(&wire[at..end.max(at)]);
            at = end.max(at);
            let d = decoder.decode_in_place(&mut buf)?;
            body.extend_from_slice(&buf[..d.data]);
            buf.drain(..d.consumed);
            if decoder.is_done() {
                break;
            }
        }
        Ok((body, decoder.is_done()))
    }

    #[test]
    fn opencodes_chunks_give_the_events_back_in_one_piece() {
        let frames: [&[u8]; 3] = [b"data: {\"a\":1}\n\n", b"data: {\"b\":2}\n\n", b"data: {\"c\":3}\n\n"];
        let wire = encode_chunked(&frames, "", "");
        let mut decoder = BodyDecoder::new(Framing::Chunked);
        let mut buf = wire.clone();
        let d = decoder.decode_in_place(&mut buf).unwrap();
        assert_eq!(&buf[..d.data], frames.concat().as_slice(), "one buffer, every event");
        assert_eq!(d.consumed, wire.len());
        assert!(decoder.is_done());
    }

    #[test]
    fn what_follows_the_last_chunk_is_not_body() {
        let mut wire = encode_chunked(&[b"data: x\n\n"], "", "");
        wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let mut buf = wire.clone();
        let mut decoder = BodyDecoder::new(Framing::Chunked);
        let d = decoder.decode_in_place(&mut buf).unwrap();
        assert_eq!(&buf[..d.data], b"data: x\n\n");
        assert_eq!(d.consumed, wire.len() - b"HTTP/1.1 200 OK\r\n".len());
    }

    #[test]
    fn a_stated_length_ends_the_body_and_a_closing_server_ends_the_other() {
        assert_eq!(decode(Framing::Length(5), b"hello, world", &[2, 3]).unwrap(), (b"hello".to_vec(), true));
        assert!(BodyDecoder::new(Framing::Length(0)).is_done());
        let (body, done) = decode(Framing::UntilClose, b"data: a\n\n", &[4]).unwrap();
        assert_eq!((body.as_slice(), done), (&b"data: a\n\n"[..], false));
        assert!(BodyDecoder::new(Framing::UntilClose).complete_at_close());
        assert!(!BodyDecoder::new(Framing::Chunked).complete_at_close(), "a chunked body cut by a close is not whole");
    }

    #[test]
    fn broken_framing_is_an_error_not_a_guess() {
        let bad_size = b"zz\r\ndata\r\n0\r\n\r\n";
        assert_eq!(decode(Framing::Chunked, bad_size, &[]), Err(BodyError::ChunkSize));
        let too_long = b"4\r\ndata!!\r\n0\r\n\r\n";
        assert_eq!(decode(Framing::Chunked, too_long, &[]), Err(BodyError::ChunkEnd));
        let overflow = b"ffffffffffffffffff\r\n";
        assert_eq!(decode(Framing::Chunked, overflow, &[]), Err(BodyError::ChunkSize));
    }

    #[test]
    fn a_huge_declared_chunk_costs_nothing_until_its_bytes_come() {
        let mut decoder = BodyDecoder::new(Framing::Chunked);
        let mut buf = b"7fffffffffffffff\r\nabc".to_vec();
        let d = decoder.decode_in_place(&mut buf).unwrap();
        assert_eq!((&buf[..d.data], d.consumed), (&b"abc"[..], buf.len()));
        assert!(!decoder.is_done());
    }

    proptest! {
        /// Any chunking of any body, with extensions and trailers, read in pieces cut
        /// anywhere (inside size lines, the CRLFs, the trailers), gives the body back
        /// whole and ends where the body ends.
        #[test]
        fn any_chunking_cut_anywhere_gives_the_body_back(
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 0..12),
            extension in prop_oneof![Just(""), Just(";x=1"), Just(" ;name=\"v\"")],
            trailers in prop_oneof![Just(""), Just("X-A: 1\r\n"), Just("A: b\r\nC: d\r\n")],
            cuts in proptest::collection::vec(0usize..4000, 0..20),
        ) {
            let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let wire = encode_chunked(&refs, extension, trailers);
            let (body, done) = decode(Framing::Chunked, &wire, &cuts).unwrap();
            prop_assert_eq!(body, pieces.concat());
            prop_assert!(done);
        }

        /// Whatever the server sends (any bytes, cut anywhere), reading it in pieces
        /// reads what reading it whole does: the same body, the same end or the same
        /// kind of error — where the reads fall never changes what Shepherd sees — and
        /// nothing panics.
        #[test]
        fn hostile_bytes_read_in_pieces_read_as_they_do_whole(
            wire in proptest::collection::vec(
                prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'0'), Just(b'a'), Just(b';'), any::<u8>()], 0..600),
            cuts in proptest::collection::vec(0usize..600, 0..12),
        ) {
            let whole = decode(Framing::Chunked, &wire, &[]);
            let pieces = decode(Framing::Chunked, &wire, &cuts);
            match (whole, pieces) {
                (Ok(whole), Ok(pieces)) => prop_assert_eq!(whole, pieces),
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                (whole, pieces) => prop_assert!(false, "whole {:?}, in pieces {:?}", whole, pieces),
            }
        }

        #[test]
        fn a_stated_length_cut_anywhere_gives_exactly_that_many_bytes(
            wire in proptest::collection::vec(any::<u8>(), 0..2000),
            length in 0u64..2500,
            cuts in proptest::collection::vec(0usize..2000, 0..10),
        ) {
            let (body, done) = decode(Framing::Length(length), &wire, &cuts).unwrap();
            let expected = &wire[..wire.len().min(length as usize)];
            prop_assert_eq!(body.as_slice(), expected);
            prop_assert_eq!(done, length as usize <= wire.len());
        }
    }
}
