//! The event pump: one per server, following `GET /global/event` (every directory).
//!
//! The stream's connection is [`EventStream`]'s (bounded buffers on plain HTTP); each
//! read is bounded by `stream_read_timeout`, the stream as a whole is not (it is
//! endless). The pump hands each frame to the server's [`Registry`]
//! ([`Registry::route_frame`]), which reads its head (a `sync` duplicate is only
//! counted, a delta noted in its session's cell), decodes the rest, and routes each
//! event straight to its session's actor, or — when the supervisor has something to
//! learn or do with it — back for the supervisor; the pump counts the types. An
//! undecodable frame is logged (truncated) and skipped, never fatal. When the stream
//! breaks or goes silent past `stream_read_timeout` (OpenCode sends a heartbeat every
//! 10 s), it reconnects with exponential back-off, and after every (re)connect the
//! supervisor reconciles by REST, because the stream replays nothing. Beside each
//! connect it reads the server's OpenCode version once ([`super::version`]), which warns
//! when the version is outside the supported range.
//!
//! A read is everything that has already arrived, up to a read buffer's worth (OpenCode
//! sends each event as its own HTTP chunk; the plain connection hands a socket read's
//! chunks on as one): one mark, one count, one crossing to the sessions' threads for a
//! few hundred events, not one per event.
//!
//! It also keeps the server's stream time ([`StreamClock`]): each read's events carry
//! the read's mark, saying how far the read is proven to reach, and the last of them
//! handled drops it; the pump waits when `MAX_UNHANDLED_READS` marks are unhandled — the
//! actors' backlog is bounded, the rest waits in the socket. (That wait is a tokio
//! semaphore, so the pump also yields when its task's co-operative budget is spent: a
//! backlog does not starve the actors.)

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use actix::Addr;
use futures::FutureExt as _;
use shepherd_actors::config::ServerConfig;
use shepherd_actors::stream_clock::StreamClock;
use shepherd_actors::supervisor::{Ingest, Registry, RouteState, Routed, StreamDown, StreamUp, Supervisor};
use tokio::sync::watch;

use super::client::Credentials;
use super::sse::SseDecoder;
use super::stream::{EventStream, READ_BUFFER_BYTES};
use super::version;

/// Malformed frames are logged with at most this many characters of their text.
const LOGGED_FRAME_CHARS: usize = 200;

/// Counters of one pump, readable from outside (status, metrics at scrape time, tests).
#[derive(Debug, Default)]
pub struct PumpStats {
    pub frames: AtomicU64,
    /// Reads handed on (each with its mark): a read takes everything that has already
    /// arrived, so a busy stream has far fewer reads than frames.
    pub reads: AtomicU64,
    pub malformed: AtomicU64,
    pub connects: AtomicU64,
    /// The stream is connected now.
    pub connected: AtomicBool,
    /// Epoch milliseconds of the latest frame (heartbeats included); 0 before the first.
    pub last_frame_ms: AtomicI64,
    /// The OpenCode version the server reported at the latest connect; `None` before the
    /// first successful read.
    pub opencode_version: std::sync::RwLock<Option<String>>,
    /// Up to when this server's events are handled: the sessions' deadlines fall due in
    /// it ([`StreamClock`]).
    pub clock: Arc<StreamClock>,
}

impl PumpStats {
    /// Epoch ms of the latest frame, if any arrived.
    pub fn last_frame_ms(&self) -> Option<i64> {
        Some(self.last_frame_ms.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }

    /// The OpenCode version read at the latest connect, if any was.
    pub fn opencode_version(&self) -> Option<String> {
        self.opencode_version.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// How far behind the server Shepherd works, if it is: the time since stream time
    /// (everything sent before it handled).
    pub fn lag(&self) -> Option<std::time::Duration> {
        Some(self.clock.lag(tokio::time::Instant::now())).filter(|lag| !lag.is_zero())
    }
}

/// Every pump's counters by server name. Shared with the status board, so a pump
/// started or stopped while Shepherd runs is shown (or no longer) without a restart.
pub type PumpRegistry = Arc<std::sync::RwLock<Vec<(String, Arc<PumpStats>)>>>;

/// Follows one server's event stream until shutdown.
pub struct EventPump {
    server: ServerConfig,
    auth: Option<Credentials>,
    supervisor: Addr<Supervisor>,
    stats: Arc<PumpStats>,
    /// The server's tracked sessions: most events go straight to theirs.
    registry: Arc<Registry>,
}

impl EventPump {
    pub fn new(server: ServerConfig, auth: Option<Credentials>, supervisor: Addr<Supervisor>) -> Self {
        Self { server, auth, supervisor, stats: Arc::default(), registry: Arc::default() }
    }

    /// The registry to attach the server with, so the supervisor and the pump share it.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    pub fn stats(&self) -> Arc<PumpStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `shutdown` turns true. `batching`: it runs on another thread than the
    /// server's sessions, so the events it routes straight cross in batches
    /// ([`Registry::end_of_read`](shepherd_actors::supervisor::Registry::end_of_read)).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>, batching: bool) {
        let name = self.server.name.clone();
        // Its pooled connection sits idle between a version read and the next connect.
        let built = reqwest::Client::builder()
            .connect_timeout(self.server.request_timeout)
            .pool_idle_timeout(crate::opencode::client::POOL_IDLE)
            .build();
        let client = match built {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(server = %name, error = %e, "cannot build the event-stream client; this server is not supervised");
                return;
            }
        };
        let mut delay = self.server.reconnect_initial;
        let mut route = RouteState::new(batching);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let started = tokio::time::Instant::now();
            let result = tokio::select! {
                r = self.follow(&client, &mut route) => r,
                _ = shutdown.changed() => return,
            };
            // What the connection read before it ended reaches its sessions.
            self.registry.flush(&mut route);
            self.stats.connected.store(false, Ordering::Relaxed);
            self.stats.clock.disconnected();
            self.supervisor.do_send(StreamDown { server: name.clone() });
            // A connection that lived a while resets the back-off.
            if started.elapsed() > self.server.reconnect_max {
                delay = self.server.reconnect_initial;
            }
            match result {
                Ok(()) => {
                    tracing::warn!(server = %name, retry_in_ms = delay.as_millis() as u64, "event stream ended; reconnecting")
                }
                Err(e) => {
                    tracing::warn!(server = %name, retry_in_ms = delay.as_millis() as u64, error = %e, "event stream failed; reconnecting")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            delay = (delay * 2).min(self.server.reconnect_max);
        }
    }

    /// One connection: connect, announce, pump frames until the stream ends.
    /// `route` outlives the connection: an event still on its way through the
    /// supervisor keeps the session's next ones behind it after a reconnect too.
    async fn follow(&self, client: &reqwest::Client, route: &mut RouteState) -> Result<(), String> {
        let name = &self.server.name;
        let url = format!("{}/global/event", self.server.url.trim_end_matches('/'));
        // A server that is still booting may accept the connection and never answer:
        // the wait for the response headers is bounded by the REST timeout, then retried.
        let mut stream = EventStream::open(&url, self.auth.as_ref(), client, self.server.request_timeout).await?;
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        self.stats.connected.store(true, Ordering::Relaxed);
        self.stats.clock.connected(stream.gauge());
        tracing::info!(server = %name, url = %url, "event stream connected");
        self.spawn_version_read(client);
        self.supervisor.do_send(StreamUp { server: name.clone() });
        let shared_name: Arc<str> = name.as_str().into();

        let mut decoder = SseDecoder::new();
        let mut kinds = KindTally::default();
        // Silence past `stream_read_timeout` (heartbeats come every 10 s) is a dead stream.
        let read_timeout = self.server.stream_read_timeout;
        // The next chunk, when it was already waiting as the previous one was handled.
        let mut waiting = None;
        let clock = &self.stats.clock;
        loop {
            let (next, park) = match waiting.take() {
                Some(next) => (next, None),
                None => {
                    let park = clock.parked();
                    match tokio::time::timeout(read_timeout, stream.next_chunk()).await {
                        Ok(next) => (next, Some(park)),
                        Err(_) => return Err(format!("read: nothing for {read_timeout:?}")),
                    }
                }
            };
            clock.reading();
            let through = clock.read_through(park);
            let Some(chunk) = next else { break };
            let chunk = chunk?;
            // Waits while too many reads are unhandled: the backlog stays in the socket.
            // Every event of the read carries its mark; the last one handled drops it.
            let read = Arc::new(clock.mark(through).await);
            let now = tokio::time::Instant::now();
            let (mut frames, mut dropped, mut bytes) = (0u64, 0, 0);
            let mut chunk = chunk;
            loop {
                bytes += chunk.len();
                dropped += decoder.push_each(&chunk, |data| {
                    frames += 1;
                    match self.registry.route_frame(route, data, &read, now, |kind| kinds.add(kind)) {
                        Ok(Routed::Long(long)) => {
                            let server = Arc::clone(&shared_name);
                            let (envelope, seq, read) = (long.envelope, long.seq, Some(Arc::clone(&read)));
                            self.supervisor.do_send(Ingest { server, envelope, read, seq });
                        }
                        Ok(Routed::Straight | Routed::Skipped) => {}
                        Err(e) => {
                            self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                            let excerpt: String = data.chars().take(LOGGED_FRAME_CHARS).collect();
                            tracing::warn!(server = %name, error = %e, frame = %excerpt, "skipping a malformed event frame");
                        }
                    }
                });
                // Let go of the bytes before the next read: the plain connection then
                // reads into the same buffer rather than a new one.
                drop(std::mem::take(&mut chunk));
                // What has already arrived joins this read, up to a read buffer's worth
                // (through reqwest, whose chunks are OpenCode's, one event each) — one
                // mark, one crossing to the sessions, not one per event. Past that
                // bound, the end of the stream or an error, what came waits for the next
                // read.
                // Asked outside tokio's co-operative budget, whose forced "not yet" would
                // read as "nothing more".
                match tokio::task::unconstrained(stream.next_chunk()).now_or_never() {
                    Some(Some(Ok(more))) if bytes < READ_BUFFER_BYTES => chunk = more,
                    next => {
                        waiting = next;
                        break;
                    }
                }
            }
            read.read_ends();
            drop(read);
            self.stats.reads.fetch_add(1, Ordering::Relaxed);
            if frames > 0 {
                self.stats.frames.fetch_add(frames, Ordering::Relaxed);
                self.stats.last_frame_ms.store(epoch_ms(), Ordering::Relaxed);
            }
            kinds.flush(&self.registry, name);
            if dropped > 0 {
                self.stats.malformed.fetch_add(dropped as u64, Ordering::Relaxed);
                tracing::warn!(server = %name, dropped, "dropped oversized or non-UTF-8 event frames");
            }
            self.registry.end_of_read(route, waiting.is_some());
        }
        Ok(())
    }

    /// Reads the server's OpenCode version beside the stream (a slow answer delays no
    /// frame), records it and checks it against the supported range. A failed read is
    /// logged and is no reason to drop the stream.
    fn spawn_version_read(&self, client: &reqwest::Client) {
        let (client, stats) = (client.clone(), Arc::clone(&self.stats));
        let (name, base, auth) = (self.server.name.clone(), self.server.url.clone(), self.auth.clone());
        let timeout = self.server.request_timeout;
        tokio::spawn(async move {
            match version::read_version(&client, &base, auth.as_ref(), timeout).await {
                Ok(reported) => {
                    version::WARNINGS.check(&name, &reported);
                    *stats.opencode_version.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reported);
                }
                Err(e) => {
                    tracing::warn!(server = %name, error = %e, "cannot read the OpenCode version; supervising anyway")
                }
            }
        });
    }
}

/// A read's event types and counts, handed to the registry's counts once per read.
#[derive(Debug, Default)]
struct KindTally {
    counts: Vec<(String, u64)>,
}

impl KindTally {
    /// Past this many names the list is emptied after a flush, so a hostile stream
    /// sending a new type with every event leaves no long list between reads.
    const MAX_NAMES: usize = 64;

    fn add(&mut self, kind: &str) {
        match self.counts.iter_mut().find(|(k, _)| k == kind) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((kind.to_string(), 1)),
        }
    }

    fn flush(&mut self, registry: &Registry, server: &str) {
        for (kind, n) in &mut self.counts {
            if *n > 0 {
                registry.count(server, kind, *n);
                *n = 0;
            }
        }
        if self.counts.len() > Self::MAX_NAMES {
            self.counts.clear();
        }
    }
}

fn epoch_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::supervisor;

    /// A fake OpenCode whose event stream sends `frames` and ends: each in its own HTTP
    /// chunk when `chunked` (as OpenCode does; here all in one write, as a burst reaches
    /// the socket), or as one plain body.
    async fn stream_server(frames: Vec<String>, chunked: bool) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let framing = if chunked { "transfer-encoding: chunked" } else { "connection: close" };
            let mut answer = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{framing}\r\n\r\n").into_bytes();
            let frames: Vec<String> = frames.iter().map(|f| format!("data: {f}\n\n")).collect();
            match chunked {
                true => answer.extend(super::super::body::encode_chunked(&frames, "", "")),
                false => answer.extend(frames.concat().into_bytes()),
            }
            let _ = sock.write_all(&answer).await;
        });
        url
    }

    /// OpenCode sends every event as its own HTTP chunk. What the connection has already
    /// read is handed on as one read (one mark, one crossing to the sessions), not one
    /// per event: at one read per event, a busy fleet cost four times the CPU per event.
    #[actix::test]
    async fn a_burst_of_one_chunk_per_event_is_handed_on_in_a_few_reads() {
        let frames: Vec<String> = (0..400)
            .map(|i| format!(r#"{{"directory":"/p","payload":{{"type":"session.idle","properties":{{"sessionID":"ses_{i}"}}}}}}"#))
            .collect();
        let url = stream_server(frames, true).await;
        let pump = EventPump::new(ServerConfig::new("a", &url), None, supervisor());
        pump.follow(&reqwest::Client::new(), &mut RouteState::default()).await.unwrap();
        let stats = pump.stats();
        assert_eq!(stats.frames.load(Ordering::Relaxed), 400, "every frame was read");
        let reads = stats.reads.load(Ordering::Relaxed);
        assert!(reads <= 10, "{reads} reads for 400 events sent in one write");
    }

    #[actix::test]
    async fn events_with_hostile_ids_are_skipped_and_the_stream_goes_on() {
        let long = "A".repeat(10 * 1024);
        let hostile = ["../../etc/x", "a/b", "..", "%2e%2e", "ses_..", "ses_a/../b", r"ses_a\u0000b", long.as_str()];
        let mut frames: Vec<String> = hostile
            .iter()
            .map(|id| format!(r#"{{"payload":{{"type":"session.idle","properties":{{"sessionID":"{id}"}}}}}}"#))
            .collect();
        frames.push(r#"{"payload":{"type":"session.idle","properties":{"sessionID":"ses_good"}}}"#.into());
        let url = stream_server(frames, false).await;
        let pump = EventPump::new(ServerConfig::new("a", &url), None, supervisor());
        pump.follow(&reqwest::Client::new(), &mut RouteState::default()).await.unwrap();
        let stats = pump.stats();
        assert_eq!(stats.frames.load(Ordering::Relaxed), hostile.len() as u64 + 1, "every frame was read");
        assert_eq!(stats.malformed.load(Ordering::Relaxed), hostile.len() as u64, "each hostile one skipped");
    }
}
