//! What the library's unit tests share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::{Actor as _, Addr};
use shepherd_actors::config::{SessionRules, SupervisorConfig};
use shepherd_actors::journal::Journal;
use shepherd_actors::ledger::MemoryLedger;
use shepherd_actors::supervisor::Supervisor;

/// A supervisor with the default rules and configuration, an in-memory ledger and the
/// system clock, started on the current actix system.
pub(crate) fn supervisor() -> Addr<Supervisor> {
    Supervisor::new(
        Arc::new(SessionRules::default()),
        SupervisorConfig::default(),
        Arc::new(MemoryLedger::default()),
        Arc::new(shepherd_actors::ports::SystemClock),
        Journal::new(),
        "test".into(),
    )
    .start()
}

/// A fake HTTP server that gives every request the same answer, records each request
/// line and counts the connections it was given: a stand-in for OpenCode or the control
/// API where a unit test needs only what one answer does to a client.
pub(crate) struct Answer {
    status: &'static str,
    body: Vec<u8>,
    chunked: bool,
    keep_alive: Option<std::time::Duration>,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
}

/// A running [`Answer`]: where it listens, the request lines it saw, its connections.
pub(crate) struct FakeHttp {
    pub url: String,
    pub requests: Arc<Mutex<Vec<String>>>,
    pub connections: Arc<AtomicUsize>,
}

impl Answer {
    /// `200 OK` with this JSON body, its length announced, each connection closed after
    /// its answer.
    pub(crate) fn json(body: impl Into<Vec<u8>>) -> Self {
        Self { status: "200 OK", body: body.into(), chunked: false, keep_alive: None, gate: None }
    }

    /// This status line's code and reason (`"401 Unauthorized"`), no body.
    pub(crate) fn status(status: &'static str) -> Self {
        Self { status, ..Self::json(Vec::new()) }
    }

    /// The body sent chunked: no length announces it.
    pub(crate) fn chunked(self) -> Self {
        Self { chunked: true, ..self }
    }

    /// A server as seen at the worst moment of its keep-alive (OpenCode 1.19's, the
    /// control API's: 5 s): it keeps a connection open between requests, and one that sat
    /// idle `idle` or more it closes — here the moment the next request comes, so that
    /// request is never answered. Requests without a body only (a GET's head ends the
    /// request).
    pub(crate) fn closing_idle_after(self, idle: std::time::Duration) -> Self {
        Self { keep_alive: Some(idle), ..self }
    }

    /// Each request recorded as it comes but answered only once `gate` is open: a server
    /// that holds its answers while a test lines calls up behind them.
    pub(crate) fn once_open(self, gate: tokio::sync::watch::Receiver<bool>) -> Self {
        Self { gate: Some(gate), ..self }
    }

    pub(crate) async fn serve(self) -> FakeHttp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let served = FakeHttp {
            url: format!("http://{}", listener.local_addr().unwrap()),
            requests: Arc::default(),
            connections: Arc::default(),
        };
        let (answer, keep_alive, gate) = (Arc::new(self.bytes()), self.keep_alive, self.gate.clone());
        let (requests, connections) = (Arc::clone(&served.requests), Arc::clone(&served.connections));
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let each = answer_each(sock, Arc::clone(&answer), keep_alive, gate.clone(), Arc::clone(&requests));
                tokio::spawn(each);
            }
        });
        served
    }

    fn bytes(&self) -> Vec<u8> {
        let (status, body) = (self.status, &self.body);
        let close = if self.keep_alive.is_some() { "" } else { "connection: close\r\n" };
        let mut a = format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{close}").into_bytes();
        if self.chunked {
            a.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
            for piece in body.chunks(16 * 1024) {
                a.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                a.extend_from_slice(piece);
                a.extend_from_slice(b"\r\n");
            }
            a.extend_from_slice(b"0\r\n\r\n");
        } else {
            a.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
            a.extend_from_slice(body);
        }
        a
    }
}

/// One connection of a [`FakeHttp`]: each request whose head has come is answered.
async fn answer_each(
    mut sock: tokio::net::TcpStream,
    answer: Arc<Vec<u8>>,
    keep_alive: Option<std::time::Duration>,
    mut gate: Option<tokio::sync::watch::Receiver<bool>>,
    requests: Arc<Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut last_answer = None::<std::time::Instant>;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 8192];
    while let Ok(n @ 1..) = sock.read(&mut buf).await {
        got.extend_from_slice(&buf[..n]);
        if !got.windows(4).any(|w| w == b"\r\n\r\n") {
            continue; // the head is not whole yet
        }
        let line = String::from_utf8_lossy(&got).lines().next().unwrap_or_default().to_string();
        requests.lock().unwrap().push(line);
        got.clear();
        if last_answer.is_some_and(|at| keep_alive.is_some_and(|idle| at.elapsed() >= idle)) {
            return; // closed unanswered
        }
        if let Some(gate) = &mut gate {
            if gate.wait_for(|open| *open).await.is_err() {
                return; // the test is gone
            }
        }
        if sock.write_all(&answer).await.is_err() || keep_alive.is_none() {
            return;
        }
        last_answer = Some(std::time::Instant::now());
    }
}
