//! The event stream's HTTP connection, opened for the pump.
//!
//! A plain `http://` server (the usual `opencode serve` on loopback) gets a connection of
//! Shepherd's own: the request written by hand, the answer's head read by `httparse`, and
//! the body taken out of its framing in place ([`super::body`]), in a read buffer bounded
//! by [`READ_BUFFER_BYTES`]. OpenCode sends every event as its own HTTP chunk; a client
//! library hands a body on one chunk at a time, here one socket read's chunks go on as
//! one piece, and the socket is read only when the pump asks for more. (reqwest's buffer
//! for the same stream also grew while the pump was behind — to about half a megabyte
//! during a burst — and kept that size for as long as the connection lived.) `https://`
//! servers go through reqwest (and its TLS).
//!
//! Either way the pump sees the same thing: an [`EventStream`] of byte chunks, after the
//! same checks of the response (401 names the password, any other failure its status).

use std::pin::Pin;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use futures::StreamExt;

use shepherd_actors::stream_clock::{SocketBacklog, SocketGauge};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};

use super::body::{BodyDecoder, Framing};
use super::client::Credentials;

/// The most the plain connection buffers while the pump is behind, and the most one
/// read takes from the socket. A frame is read in as many reads as it needs, so nothing
/// is lost to it; a chunk-size line or a response head longer than this is refused. The
/// pump adds no more chunks to one read of its own once it holds this much
/// ([`super::pump`]).
pub(crate) const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Headers read from the answer's head; more is refused.
const MAX_HEADERS: usize = 64;

/// One open event stream: the body of `GET /global/event`, chunk by chunk.
pub struct EventStream {
    body: Body,
    /// What the plain connection's socket says about itself (none through reqwest).
    gauge: Option<Arc<TcpGauge>>,
}

enum Body {
    Plain(PlainBody),
    Reqwest(futures::stream::BoxStream<'static, reqwest::Result<Bytes>>),
}

/// The plain connection after the answer's head: the socket, what was read of it and not
/// yet handed on, and where the body stands.
struct PlainBody {
    tcp: GaugedTcp,
    /// Bytes read and not yet handed on: a line a read cut (a chunk's size, a trailer).
    buf: BytesMut,
    decoder: BodyDecoder,
}

impl EventStream {
    /// Connects to `url` (`…/global/event`) and checks the answer. `client` serves
    /// `https://` URLs; `request_timeout` bounds the connect and the wait for the
    /// response headers (a server still booting may accept and never answer).
    pub async fn open(
        url: &str,
        auth: Option<&Credentials>,
        client: &reqwest::Client,
        request_timeout: Duration,
    ) -> Result<EventStream, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("bad URL {url}: {e}"))?;
        let opening = async {
            if parsed.scheme() == "http" {
                open_plain(&parsed, auth).await
            } else {
                open_reqwest(url, auth, client).await
            }
        };
        tokio::time::timeout(request_timeout, opening)
            .await
            .map_err(|_| format!("no response headers within {request_timeout:?}"))?
    }

    /// The socket's gauge, for the stream clock (plain connections only).
    pub fn gauge(&self) -> Option<Arc<dyn SocketGauge>> {
        self.gauge.clone().map(|g| g as Arc<dyn SocketGauge>)
    }

    /// The next chunk of the body; `None` when the server ended the stream.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, String>> {
        match &mut self.body {
            Body::Plain(plain) => plain.next_chunk().await,
            Body::Reqwest(stream) => stream.next().await.map(|r| r.map_err(|e| format!("read: {e}"))),
        }
    }
}

/// The checks both kinds of connection make of the response's status.
fn check_status(status: u16) -> Result<(), String> {
    match status {
        401 => Err("401 unauthorized: check the server's password (password_env)".into()),
        200..=299 => Ok(()),
        other => Err(format!("HTTP {other}")),
    }
}

async fn open_plain(url: &reqwest::Url, auth: Option<&Credentials>) -> Result<EventStream, String> {
    use base64::Engine as _;
    let host = url.host_str().ok_or_else(|| format!("no host in {url}"))?;
    let port = url.port_or_known_default().unwrap_or(80);
    // An IPv6 literal comes in brackets (as the Host header wants it, not the resolver).
    let address = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((address, port)).await.map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let (mut tcp, gauge) = GaugedTcp::new(tcp);
    // The parsed URL's path, query and host are percent-encoded and checked: no CR or LF
    // can reach the request's lines from them, nor from the base64 of the credentials.
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/event-stream\r\n");
    if let Some(c) = auth {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
        request.push_str(&format!("Authorization: Basic {token}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes()).await.map_err(|e| format!("connect: {e}"))?;
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let (status, framing) = read_head(&mut tcp, &mut buf).await?;
    check_status(status)?;
    let body = Body::Plain(PlainBody { tcp, buf, decoder: BodyDecoder::new(framing) });
    Ok(EventStream { body, gauge: Some(gauge) })
}

/// Reads the answer's head into `buf` (what follows it stays there): its status and how
/// its body ends. Interim answers (1xx) are skipped.
async fn read_head(tcp: &mut GaugedTcp, buf: &mut BytesMut) -> Result<(u16, Framing), String> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(buf) {
            Ok(httparse::Status::Complete(length)) => {
                let status = response.code.unwrap_or(0);
                let framing = framing(response.headers);
                let _ = buf.split_to(length);
                match status {
                    100..=199 => continue,
                    _ => return Ok((status, framing?)),
                }
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(format!("connect: a malformed response head ({e})")),
        }
        let room = READ_BUFFER_BYTES - buf.len();
        if room == 0 {
            return Err(format!("connect: a response head longer than {READ_BUFFER_BYTES} bytes"));
        }
        match tcp.read_buf(&mut (&mut *buf).limit(room)).await {
            Ok(0) => return Err("connect: the server closed the connection".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("connect: {e}")),
        }
    }
}

/// How the body ends, from the head (RFC 9112 §6.3): chunked when that is the last
/// transfer coding, else the stated length, else the connection's close. A body in any
/// other transfer coding, or with lengths that disagree, is refused.
fn framing(headers: &[httparse::Header<'_>]) -> Result<Framing, String> {
    let named = |name: &'static str| headers.iter().filter(move |h| h.name.eq_ignore_ascii_case(name));
    if let Some(codings) = named("transfer-encoding").next_back() {
        let last = codings.value.rsplit(|&b| b == b',').next().unwrap_or_default();
        return match last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            true => Ok(Framing::Chunked),
            false => Err(format!("connect: an unsupported transfer coding ({})", String::from_utf8_lossy(codings.value))),
        };
    }
    let mut length = None;
    for header in named("content-length") {
        let stated = std::str::from_utf8(header.value).ok().and_then(|v| v.trim().parse::<u64>().ok());
        match (stated, length) {
            (None, _) => return Err("connect: a malformed content-length".into()),
            (Some(n), Some(seen)) if n != seen => return Err("connect: content-lengths that disagree".into()),
            (Some(n), _) => length = Some(n),
        }
    }
    Ok(length.map_or(Framing::UntilClose, Framing::Length))
}

impl PlainBody {
    /// The body a socket read brought, out of its framing; `None` once the body has
    /// ended. Safe to drop while pending: nothing is taken from the socket until a read
    /// is ready, and what a read took is decoded before the next await.
    async fn next_chunk(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            // What is already here first (the head's read may have brought body too).
            if !self.buf.is_empty() {
                let decoded = match self.decoder.decode_in_place(&mut self.buf) {
                    Ok(d) => d,
                    Err(e) => return Some(Err(format!("read: {e}"))),
                };
                // What the read cut (consumed nothing of) moves next to the body, and the
                // body goes on: the rest waits for the next read.
                let cut = self.buf.len() - decoded.consumed;
                self.buf.copy_within(decoded.consumed.., decoded.data);
                self.buf.truncate(decoded.data + cut);
                if decoded.data > 0 {
                    return Some(Ok(self.buf.split_to(decoded.data).freeze()));
                }
            }
            if self.decoder.is_done() {
                return None;
            }
            // Only a line a read cut waits here, and it is bounded by the buffer.
            let room = READ_BUFFER_BYTES - self.buf.len();
            if room == 0 {
                return Some(Err(format!("read: a chunk-size line or trailer longer than {READ_BUFFER_BYTES} bytes")));
            }
            // Reuses the allocation once the previous read's bytes have been let go of.
            self.buf.reserve(room);
            match self.tcp.read_buf(&mut (&mut self.buf).limit(room)).await {
                Ok(0) if self.decoder.complete_at_close() && self.buf.is_empty() => return None,
                Ok(0) => return Some(Err("read: the server closed the connection inside the body".into())),
                Ok(_) => {}
                Err(e) => return Some(Err(format!("read: {e}"))),
            }
        }
    }
}

async fn open_reqwest(url: &str, auth: Option<&Credentials>, client: &reqwest::Client) -> Result<EventStream, String> {
    let mut rb = client.get(url).header("accept", "text/event-stream");
    if let Some(c) = auth {
        rb = rb.basic_auth(&c.username, Some(&c.password));
    }
    let resp = rb.send().await.map_err(|e| format!("connect: {e}"))?;
    check_status(resp.status().as_u16())?;
    Ok(EventStream { body: Body::Reqwest(resp.bytes_stream().boxed()), gauge: None })
}

/// The plain connection's socket, counting its reads for the stream clock: whether the
/// latest read found it empty, and how many bytes the kernel holds that nobody has read.
struct GaugedTcp {
    tcp: tokio::net::TcpStream,
    gauge: Arc<TcpGauge>,
}

/// What [`GaugedTcp`] has seen, shared with the stream clock.
#[derive(Debug)]
struct TcpGauge {
    reads: AtomicU64,
    backlog: Mutex<SocketBacklog>,
    /// The socket's descriptor while it is open (-1 once closed, so a reused number is
    /// never asked).
    fd: AtomicI32,
}

impl GaugedTcp {
    fn new(tcp: tokio::net::TcpStream) -> (Self, Arc<TcpGauge>) {
        #[cfg(unix)]
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        #[cfg(not(unix))]
        let fd = -1;
        let gauge = Arc::new(TcpGauge { reads: AtomicU64::new(0), backlog: Mutex::default(), fd: AtomicI32::new(fd) });
        (GaugedTcp { tcp, gauge: Arc::clone(&gauge) }, gauge)
    }
}

impl Drop for GaugedTcp {
    fn drop(&mut self) {
        self.gauge.fd.store(-1, Ordering::SeqCst);
    }
}

impl AsyncRead for GaugedTcp {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining());
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        match &polled {
            // Nothing to take. The connection asks only once the pump has everything it
            // read, so if the kernel holds nothing either, all that was sent is the
            // pump's. (Pending is tokio's last look, not the kernel's now: data may have
            // come since, unseen by a reactor on a busy thread — the kernel is asked.)
            Poll::Pending => {
                let now = tokio::time::Instant::now();
                let mut backlog = self.gauge.backlog();
                backlog.polled(0);
                if self.gauge.unread_bytes() == Some(0) {
                    backlog.found_nothing(now);
                }
            }
            Poll::Ready(Ok(())) if read > 0 => {
                self.gauge.reads.fetch_add(1, Ordering::Relaxed);
                let mut backlog = self.gauge.backlog();
                backlog.polled(read as u64);
                // Took less than it had room for: the kernel's buffer was emptied, and
                // the server had nothing more on its way then.
                if read < room {
                    backlog.emptied(tokio::time::Instant::now());
                }
            }
            Poll::Ready(_) => {} // the end of the stream, or an error
        }
        polled
    }
}

impl AsyncWrite for GaugedTcp {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl SocketGauge for TcpGauge {
    fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    fn proven(&self) -> Option<tokio::time::Instant> {
        self.backlog().proven()
    }

    /// `FIONREAD`: the bytes waiting in the socket's receive buffer.
    fn unread_bytes(&self) -> Option<usize> {
        let fd = self.fd.load(Ordering::SeqCst);
        if fd < 0 {
            return None;
        }
        #[cfg(unix)]
        {
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int through the pointer; the descriptor is the
            // open socket's (cleared before it closes), and a failed call is answered None.
            let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
            (rc == 0).then_some(n.max(0) as usize)
        }
        #[cfg(not(unix))]
        None
    }

    fn last_emptied(&self) -> (Option<tokio::time::Instant>, u64) {
        self.backlog().last_emptied()
    }
}

impl TcpGauge {
    fn backlog(&self) -> std::sync::MutexGuard<'_, SocketBacklog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers the first request with `answer`, written in pieces of the
    /// given sizes (cycled) with a pause between them, then closes.
    async fn answering(answer: Vec<u8>, pieces: &'static [usize]) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/global/event", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let _ = sock.set_nodelay(true);
            let mut request = vec![0u8; 4096];
            let _ = sock.read(&mut request).await;
            let mut at = 0;
            for &size in pieces.iter().cycle() {
                let end = (at + size).min(answer.len());
                if sock.write_all(&answer[at..end]).await.is_err() {
                    return;
                }
                at = end;
                if at == answer.len() {
                    return;
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        });
        url
    }

    async fn open(url: &str) -> Result<EventStream, String> {
        EventStream::open(url, None, &reqwest::Client::new(), Duration::from_secs(5)).await
    }

    /// Every chunk until the end, concatenated; or the error that ended it.
    async fn read_all(stream: &mut EventStream) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        while let Some(chunk) = stream.next_chunk().await {
            body.extend_from_slice(&chunk?);
        }
        Ok(body)
    }

    /// The whole answer (head and chunked body) carrying `frames`, and its body.
    fn chunked(frames: &[String]) -> (Vec<u8>, Vec<u8>) {
        let mut wire = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        wire.extend(super::super::body::encode_chunked(frames, "", ""));
        (wire, frames.concat().into_bytes())
    }

    fn frames(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("data: {{\"payload\":{{\"type\":\"session.idle\",\"n\":{i}}}}}\n\n")).collect()
    }

    /// The head, the size lines, the CRLFs and the data arrive cut anywhere (pieces of
    /// 1 to 13 bytes): the body read is the events sent, in order, and it ends cleanly.
    #[tokio::test]
    async fn an_answer_cut_anywhere_gives_back_every_event() {
        let (wire, body) = chunked(&frames(40));
        let url = answering(wire, &[1, 2, 3, 5, 7, 11, 13]).await;
        let mut stream = open(&url).await.unwrap();
        assert_eq!(read_all(&mut stream).await.unwrap(), body);
    }

    /// A burst that arrived at once is handed on in one piece, not one per chunk.
    #[tokio::test]
    async fn chunks_that_arrived_together_go_on_together() {
        let (wire, body) = chunked(&frames(100));
        let url = answering(wire, &[usize::MAX]).await;
        let mut stream = open(&url).await.unwrap();
        let first = stream.next_chunk().await.unwrap().unwrap();
        assert_eq!(first.as_ref(), body.as_slice(), "the whole burst in the first read");
        assert!(stream.next_chunk().await.is_none());
    }

    /// The stream clock's proof: once the pump has the burst and the connection finds
    /// the socket empty, everything sent before that poll is in the pump's hands — proven
    /// then, not only by a later poll from beyond it (which under steady traffic left
    /// stream time a read behind).
    #[tokio::test]
    async fn a_poll_that_finds_the_socket_empty_proves_everything_before_it_was_handed_on() {
        let (mut wire, body) = chunked(&frames(10));
        wire.truncate(wire.len() - b"0\r\n\r\n".len()); // the body goes on
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/global/event", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let _ = sock.read(&mut vec![0u8; 4096]).await;
            sock.write_all(&wire).await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await; // then silence, the connection open
        });
        let mut stream = open(&url).await.unwrap();
        let gauge = stream.gauge().expect("a plain connection is gauged");
        let first = stream.next_chunk().await.unwrap().unwrap();
        assert_eq!(first.as_ref(), body.as_slice());
        let handed_on = tokio::time::Instant::now();
        assert!(futures::FutureExt::now_or_never(stream.next_chunk()).is_none(), "nothing more sent");
        let proven = gauge.proven().expect("a moment proven");
        assert!(proven >= handed_on, "proven {:?} before the burst was handed on", handed_on - proven);
    }

    #[tokio::test]
    async fn interim_answers_are_skipped_and_the_final_status_is_checked() {
        let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n".to_vec();
        let url = answering(wire, &[usize::MAX]).await;
        let error = open(&url).await.err().unwrap();
        assert!(error.contains("401 unauthorized"), "{error}");
    }

    #[tokio::test]
    async fn a_body_cut_by_the_servers_close_is_an_error_but_an_unframed_body_just_ends() {
        let (wire, _) = chunked(&frames(3));
        let cut = wire[..wire.len() - b"0\r\n\r\n".len()].to_vec();
        let mut stream = open(&answering(cut, &[usize::MAX]).await).await.unwrap();
        let error = read_all(&mut stream).await.unwrap_err();
        assert!(error.contains("closed the connection inside the body"), "{error}");

        let unframed = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\ndata: a\n\n".to_vec();
        let mut stream = open(&answering(unframed, &[4]).await).await.unwrap();
        assert_eq!(read_all(&mut stream).await.unwrap(), b"data: a\n\n");
    }

    fn framing_of(head: &[u8]) -> Result<Framing, String> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut headers);
        response.parse(head).unwrap();
        framing(response.headers)
    }

    /// How the body ends follows the head (RFC 9112 §6.3); what cannot be read safely
    /// is refused with a reason: a coding Shepherd cannot undo, lengths that disagree.
    #[test]
    fn the_body_ends_as_the_head_says_or_is_refused() {
        let head = |fields: &str| format!("HTTP/1.1 200 OK\r\n{fields}\r\n").into_bytes();
        assert_eq!(framing_of(&head("Transfer-Encoding: chunked\r\n")), Ok(Framing::Chunked));
        assert_eq!(framing_of(&head("transfer-encoding: gzip, CHUNKED\r\n")), Ok(Framing::Chunked));
        assert_eq!(framing_of(&head("Content-Length: 12\r\n")), Ok(Framing::Length(12)));
        assert_eq!(framing_of(&head("Content-Length: 5\r\ncontent-length: 5\r\n")), Ok(Framing::Length(5)));
        assert_eq!(framing_of(&head("")), Ok(Framing::UntilClose));
        let refused = [
            ("Transfer-Encoding: chunked, gzip\r\n", "unsupported transfer coding"),
            ("Content-Length: 5\r\nContent-Length: 6\r\n", "disagree"),
            ("Content-Length: -1\r\n", "malformed content-length"),
        ];
        for (fields, why) in refused {
            let error = framing_of(&head(fields)).unwrap_err();
            assert!(error.contains(why), "{fields}: {error}");
        }
    }

    /// Nothing grows past the read buffer: a head or a chunk-size line longer than it is
    /// refused, not buffered.
    #[tokio::test]
    async fn a_head_or_a_size_line_past_the_read_buffer_is_refused() {
        let huge_head = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &vec![b'a'; READ_BUFFER_BYTES]].concat();
        let error = open(&answering(huge_head, &[usize::MAX]).await).await.err().unwrap();
        assert!(error.contains("response head longer than"), "{error}");

        let mut long_line = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
        long_line.extend(std::iter::repeat_n(b'x', READ_BUFFER_BYTES + 10));
        let mut stream = open(&answering(long_line, &[usize::MAX]).await).await.unwrap();
        let error = read_all(&mut stream).await.unwrap_err();
        assert!(error.contains("chunk-size line or trailer longer than"), "{error}");
    }
}
