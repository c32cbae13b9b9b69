//! The event stream's HTTP connection, opened for the pump.
//!
//! A plain `http://` server (the usual `opencode serve` on loopback) gets a connection of
//! Shepherd's own, made with hyper, whose read buffer is bounded by
//! [`READ_BUFFER_BYTES`]. reqwest's buffer for the same stream grows while the pump is
//! behind — to about half a megabyte during a burst — and keeps that size for as long as
//! the connection lives, and reqwest offers no way to bound it. `https://` servers go
//! through reqwest (and its TLS).
//!
//! The plain connection is driven by the pump's own reads, not by a task of its own:
//! OpenCode sends every event as its own HTTP chunk, and hyper hands a body on one chunk
//! at a time, so a read finds the chunks hyper has already read only if it drives the
//! connection itself ([`EventStream::next_chunk`]).
//!
//! Either way the pump sees the same thing: an [`EventStream`] of byte chunks, after the
//! same checks of the response (401 names the password, any other failure its status).

use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use hyper::body::Body as _;

use shepherd_actors::stream_clock::{SocketBacklog, SocketGauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::client::Credentials;

/// The most the plain connection buffers while the pump is behind (hyper's minimum is
/// 8 KiB). A frame is read in as many reads as it needs, so nothing is lost to it. The
/// pump adds no more chunks to one read of its own once it holds this much
/// ([`super::pump`]).
pub(crate) const READ_BUFFER_BYTES: usize = 64 * 1024;

/// One open event stream: the body of `GET /global/event`, chunk by chunk.
pub struct EventStream {
    body: Body,
    /// What the plain connection's socket says about itself (none through reqwest).
    gauge: Option<Arc<TcpGauge>>,
}

/// hyper's side of the plain connection: it reads the socket and hands the body on.
type PlainConnection =
    hyper::client::conn::http1::Connection<hyper_util::rt::TokioIo<GaugedTcp>, http_body_util::Empty<Bytes>>;

enum Body {
    /// Our own connection, driven by the pump's own reads (`None` once it has ended):
    /// OpenCode sends every event as its own HTTP chunk, and hyper hands the body on
    /// one chunk at a time. Driven in a task of its own, the connection would run only
    /// once the pump had waited — a wait, a wake-up and a hand-over per event; driven
    /// here, a read finds what hyper has already read ([`EventStream::next_chunk`]).
    Plain { body: hyper::body::Incoming, connection: Option<Pin<Box<PlainConnection>>> },
    Reqwest(futures::stream::BoxStream<'static, reqwest::Result<Bytes>>),
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
            Body::Plain { body, connection } => loop {
                let next = std::future::poll_fn(|cx| {
                    // The connection first: it moves what it has read (or reads) into
                    // the body, which then has it at once.
                    if let Some(driving) = connection.as_mut() {
                        if let Poll::Ready(ended) = driving.as_mut().poll(cx) {
                            *connection = None;
                            if let Err(e) = ended {
                                return Poll::Ready(Some(Err(format!("read: {e}"))));
                            }
                        }
                    }
                    match Pin::new(&mut *body).poll_frame(cx) {
                        // Nothing more can come once the connection has ended.
                        Poll::Pending if connection.is_none() => Poll::Ready(None),
                        polled => polled.map(|frame| frame.map(|f| f.map_err(|e| format!("read: {e}")))),
                    }
                })
                .await?;
                match next {
                    Ok(frame) => match frame.into_data() {
                        Ok(data) => return Some(Ok(data)),
                        Err(_trailers) => continue,
                    },
                    Err(e) => return Some(Err(e)),
                }
            },
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
    let (tcp, gauge) = GaugedTcp::new(tcp);
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(READ_BUFFER_BYTES)
        .handshake::<_, http_body_util::Empty<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut connection = Box::pin(connection);
    let path = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    };
    let authority = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    let mut request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "text/event-stream");
    if let Some(c) = auth {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
        request = request.header(hyper::header::AUTHORIZATION, format!("Basic {token}"));
    }
    let request = request.body(http_body_util::Empty::new()).map_err(|e| format!("request: {e}"))?;
    // The connection is driven here until the answer's head has come (and by the
    // stream's reads after).
    let mut sending = std::pin::pin!(sender.send_request(request));
    let response = std::future::poll_fn(|cx| {
        if let Poll::Ready(ended) = connection.as_mut().poll(cx) {
            let why = ended.err().map_or_else(|| "the server closed the connection".to_string(), |e| e.to_string());
            return Poll::Ready(Err(format!("connect: {why}")));
        }
        sending.as_mut().poll(cx).map_err(|e| format!("connect: {e}"))
    })
    .await?;
    // Built before the check: dropped on a bad status, it closes the connection.
    let status = response.status().as_u16();
    let body = Body::Plain { body: response.into_body(), connection: Some(connection) };
    let stream = EventStream { body, gauge: Some(gauge) };
    check_status(status)?;
    Ok(stream)
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
        // Found nothing, or took less than it had room for: the kernel's buffer was
        // emptied, and the server had nothing more on its way then.
        let drained = match &polled {
            Poll::Pending => true,
            Poll::Ready(Ok(())) if read > 0 => read < room,
            Poll::Ready(_) => return polled, // the end of the stream, or an error
        };
        if read > 0 {
            self.gauge.reads.fetch_add(1, Ordering::Relaxed);
        }
        let mut backlog = self.gauge.backlog();
        backlog.polled(read as u64);
        if drained {
            backlog.emptied(tokio::time::Instant::now());
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

    fn look(&self) {
        if self.unread_bytes() == Some(0) {
            self.backlog().emptied(tokio::time::Instant::now());
        }
    }
}

impl TcpGauge {
    fn backlog(&self) -> std::sync::MutexGuard<'_, SocketBacklog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
