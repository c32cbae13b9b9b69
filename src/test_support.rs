//! What the library's unit tests share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// A server as seen at the worst moment of its keep-alive (OpenCode 1.19's, the control
/// API's: 5 s): it keeps a connection open between requests, and one that sat idle 5 s
/// or more it closes — here the moment the next request comes, so that request is never
/// answered. Each answer is `body` (JSON). Counts the connections it was given.
pub(crate) async fn closing_idle_connections(body: &'static str) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut last_answer = None::<std::time::Instant>;
                let mut buf = vec![0u8; 8192];
                while let Ok(n @ 1..) = sock.read(&mut buf).await {
                    if !buf[..n].ends_with(b"\r\n\r\n") {
                        continue; // a GET without a body: its head is whole at the blank line
                    }
                    if last_answer.is_some_and(|at| at.elapsed() >= KEEP_ALIVE) {
                        return; // closed unanswered
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if sock.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    last_answer = Some(std::time::Instant::now());
                }
            });
        }
    });
    (url, connections)
}
