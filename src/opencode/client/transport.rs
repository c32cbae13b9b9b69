//! Requests to the server and what their answers become: the base URL and HTTP Basic
//! auth on every request, each failure mapped to an [`EngineError`] kind the cores can
//! branch on (a change whose answer never came is `Unconfirmed`, not `Unreachable`),
//! error bodies cut short, and answers refused past `servers[].max_response_bytes`
//! rather than read whole.

use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use shepherd_actors::ports::EngineError;

use super::turns::{Lane, Turn};
use super::OpenCodeClient;

/// The status read, as its calls are named (timings, errors).
pub(super) const STATUS_READ: &str = "GET /session/status";
/// The abort, as its calls are named.
pub(super) const ABORT: &str = "POST /session/{id}/abort";

/// Error bodies are cut to this many characters in errors and logs.
const ERROR_BODY_CHARS: usize = 300;
/// Of an error answer, at most this many bytes are read.
const ERROR_BODY_BYTES: usize = 4 * 1024;

impl OpenCodeClient {
    pub(super) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}{}", self.base, path));
        match &self.auth {
            Some(c) => rb.basic_auth(&c.username, Some(&c.password)),
            None => rb,
        }
    }

    pub(super) async fn send(&self, rb: RequestBuilder, what: &str) -> Result<reqwest::Response, EngineError> {
        self.send_in(rb, what, Lane::InTurn).await
    }

    /// Like [`Self::send`], for a call a stalled session's abort waits on — the status
    /// read that confirms it is still busy, the abort itself: it gets a free turn before
    /// the other calls waiting ([`super::turns`]).
    pub(super) async fn send_first(&self, rb: RequestBuilder, what: &str) -> Result<reqwest::Response, EngineError> {
        self.send_in(rb, what, Lane::First).await
    }

    async fn send_in(&self, rb: RequestBuilder, what: &str, lane: Lane) -> Result<reqwest::Response, EngineError> {
        let _turn = self.turn(what, lane).await?;
        let resp = self.timed(what, rb.send()).await.map_err(|e| EngineError::Unreachable(format!("{what}: {e}")))?;
        Self::checked(resp, what).await
    }

    /// Sends, telling the client's [`CallTimer`](super::CallTimer) how long the answer's
    /// head took and how the call ended.
    async fn timed(
        &self,
        what: &str,
        sent: impl std::future::Future<Output = reqwest::Result<reqwest::Response>>,
    ) -> reqwest::Result<reqwest::Response> {
        let Some(timer) = &self.timer else { return sent.await };
        let started = std::time::Instant::now();
        let answer = sent.await;
        let outcome = match &answer {
            Ok(resp) if resp.status().is_success() => "ok",
            Ok(_) => "http_error",
            Err(_) => "failed",
        };
        (timer.0)(what, started.elapsed(), outcome);
        answer
    }

    /// Waits for one of `servers[].max_requests_in_flight` turns (at most
    /// `request_timeout`; then the call fails as never sent), held until the answer's
    /// head is in; `lane` says whether it goes before the calls waiting in turn.
    async fn turn(&self, what: &str, lane: Lane) -> Result<Turn, EngineError> {
        tokio::time::timeout(self.permit_wait, self.in_flight.take(lane)).await.map_err(|_| {
            EngineError::Unreachable(format!(
                "{what}: not sent: servers[].max_requests_in_flight calls stayed under way for {:?}",
                self.permit_wait
            ))
        })
    }

    /// Like [`Self::send`], for a request that changes the session: a transport error
    /// after the connection was made (a timeout, a connection broken while waiting for
    /// the answer) may come after OpenCode acted on it — [`EngineError::Unconfirmed`].
    pub(super) async fn send_effect(&self, rb: RequestBuilder, what: &str) -> Result<reqwest::Response, EngineError> {
        let _turn = self.turn(what, Lane::InTurn).await?;
        let resp = self.timed(what, rb.send()).await.map_err(|e| {
            if e.is_connect() || e.is_builder() {
                EngineError::Unreachable(format!("{what}: {e}"))
            } else {
                EngineError::Unconfirmed(format!("{what}: {e}"))
            }
        })?;
        Self::checked(resp, what).await
    }

    async fn checked(resp: reqwest::Response, what: &str) -> Result<reqwest::Response, EngineError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = read_prefix(resp, ERROR_BODY_BYTES).await;
        let body: String = String::from_utf8_lossy(&body).chars().take(ERROR_BODY_CHARS).collect();
        if status == StatusCode::NOT_FOUND {
            return Err(EngineError::NotFound(format!("{what}: {body}")));
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(EngineError::Http {
                status: 401,
                body: format!("{what}: unauthorized (check the server password)"),
            });
        }
        Err(EngineError::Http { status: status.as_u16(), body: format!("{what}: {body}") })
    }

    pub(super) async fn get_json<T: DeserializeOwned + Send + 'static>(
        &self,
        rb: RequestBuilder,
        what: &str,
    ) -> Result<T, EngineError> {
        let resp = self.send(rb, what).await?;
        self.read_json(resp, what).await
    }

    /// The answer's body (at most `max_response_bytes`), parsed — a long one apart from
    /// the thread that asked ([`parse_apart_if_long`]).
    pub(super) async fn read_json<T: DeserializeOwned + Send + 'static>(
        &self,
        resp: reqwest::Response,
        what: &str,
    ) -> Result<T, EngineError> {
        let body = read_capped(resp, self.max_response_bytes, what).await?;
        parse_apart_if_long(body.len(), what, move || serde_json::from_slice(&body)).await
    }
}

/// An answer at least this long is parsed on the runtime's blocking pool. Parsing runs
/// at a few hundred MB/s: a megabyte is a few milliseconds of the thread that asked,
/// and the whole fleet's listing at 100,000 sessions (~40 MB) or a directory's statuses
/// (~4 MB) held up everything else on it — the guard and the control API on the main
/// thread, every session on a sessions' thread — for that long. Shorter answers (a
/// continue's thirty messages, 10,000 statuses) are parsed where they were read: the
/// hand-off would cost more than it saves.
pub(super) const PARSE_APART_BYTES: usize = 1024 * 1024;

/// `parse`'s result for an answer of `len` bytes: run here when it is short, on the
/// blocking pool when it is long ([`PARSE_APART_BYTES`]); its error, or a parse that
/// did not finish (a panic), is the answer's decode error.
pub(super) async fn parse_apart_if_long<T, E>(
    len: usize,
    what: &str,
    parse: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, EngineError>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let parsed = if len < PARSE_APART_BYTES {
        parse()
    } else {
        tokio::task::spawn_blocking(parse)
            .await
            .map_err(|e| undecodable(what, format_args!("the answer's parse did not finish: {e}")))?
    };
    parsed.map_err(|e| undecodable(what, e))
}

/// An answer that could not be read as what `what` returns.
pub(super) fn undecodable(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Decode(format!("{what}: {e}"))
}

/// The body of `resp`, refused (never read whole) when it is longer than `max` bytes.
pub(super) async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
    what: &str,
) -> Result<bytes::Bytes, EngineError> {
    let too_large = || {
        EngineError::Decode(format!(
            "{what}: the answer is larger than {max} bytes (servers[].max_response_bytes); refused"
        ))
    };
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| undecodable(what, e))? {
        if body.len() + chunk.len() > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The first `max` bytes or so of an error answer (the rest is not read).
async fn read_prefix(mut resp: reqwest::Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(max - body.len())]),
            _ => break,
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use shepherd_actors::config::ServerConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use shepherd_actors::ports::{Control, Reads};

    use super::super::tests::{prompt, recording_server};
    use super::*;

    /// Whether a task of the asking thread ran while `parse_apart_if_long` parsed an
    /// answer of `len` bytes: the "parse" waits up to `patience` for that task, which
    /// can only run if the parse is not holding its thread.
    async fn asker_ran_during_a_parse_of(len: usize, patience: std::time::Duration) -> bool {
        let (ran, heard) = std::sync::mpsc::channel::<()>();
        tokio::spawn(async move { ran.send(()) });
        let parse = move || Ok::<_, EngineError>(heard.recv_timeout(patience).is_ok());
        parse_apart_if_long(len, "GET /test", parse).await.expect("parsed")
    }

    /// A long answer (the fleet's listing, a large directory's statuses) is parsed while
    /// the thread that asked goes on with its other tasks — the guard and the control
    /// API on the main thread, the sessions on theirs; a short one where it was read.
    #[tokio::test]
    async fn a_long_answer_is_parsed_while_the_thread_that_asked_runs_its_other_tasks() {
        let long = asker_ran_during_a_parse_of(PARSE_APART_BYTES, std::time::Duration::from_secs(10)).await;
        assert!(long, "the asking thread's task ran while the long answer was parsed");
        let short = asker_ran_during_a_parse_of(PARSE_APART_BYTES - 1, std::time::Duration::from_millis(100)).await;
        assert!(!short, "a short answer is parsed on the thread that read it");
    }

    /// A long answer that is not what was asked for is a decode error naming the call,
    /// like a short one.
    #[tokio::test]
    async fn a_long_answer_that_does_not_parse_is_a_decode_error_naming_the_call() {
        let body = format!("[{}", "1,".repeat(PARSE_APART_BYTES));
        let len = body.len();
        let parsed =
            parse_apart_if_long(len, "GET /experimental/session", move || serde_json::from_str::<Vec<u8>>(&body)).await;
        match parsed {
            Err(EngineError::Decode(e)) => assert!(e.starts_with("GET /experimental/session: "), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_prompt_whose_answer_never_came_is_unconfirmed_and_one_never_sent_is_unreachable() {
        // A server that reads the request and never answers: it may have acted on it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            drop(socket);
        });
        let mut server = ServerConfig::new("a", &url);
        server.request_timeout = std::time::Duration::from_millis(300);
        let client = OpenCodeClient::new(&server, None).unwrap();
        let err = client.prompt("ses_A", &prompt()).await.unwrap_err();
        assert!(matches!(err, EngineError::Unconfirmed(_)), "{err:?}");
        held.abort();

        // Nothing listens: the prompt surely did not arrive.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let err = client.prompt("ses_A", &prompt()).await.unwrap_err();
        assert!(matches!(err, EngineError::Unreachable(_)), "{err:?}");
    }

    /// A server that takes every connection and answers none: how many it was given.
    async fn silent_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        (url, connections)
    }

    /// With every turn taken, an abort and a status read asked for after other calls go
    /// before them: a stalled session's abort does not wait behind other sessions' reads
    /// and prompts.
    #[tokio::test]
    async fn an_abort_waiting_for_a_turn_goes_before_calls_that_asked_earlier() {
        let (open, gate) = tokio::sync::watch::channel(false);
        let held = crate::test_support::Answer::json("[]").once_open(gate).serve().await;
        let mut server = ServerConfig::new("a", &held.url);
        server.max_requests_in_flight = 1;
        let client = OpenCodeClient::new(&server, None).unwrap();
        let spawn_todos = |id: &'static str| {
            let client = client.clone();
            tokio::spawn(async move { client.todos(id).await.map(drop) })
        };
        let under_way = spawn_todos("ses_A");
        let wait = || tokio::time::sleep(std::time::Duration::from_millis(50));
        wait().await;
        let waiting = spawn_todos("ses_B");
        wait().await;
        let abort = {
            let client = client.clone();
            tokio::spawn(async move { client.abort("ses_C").await })
        };
        wait().await;
        // The status read that confirms a stall goes first too (its answer, `[]`, is
        // no status map: only its place in the order matters here).
        let status_read = {
            let client = client.clone();
            tokio::spawn(async move { client.statuses("").await.map(drop) })
        };
        wait().await;
        open.send(true).unwrap();
        for call in [under_way, waiting, abort] {
            call.await.unwrap().unwrap();
        }
        let _ = status_read.await.unwrap();
        let lines = held.requests.lock().unwrap().clone();
        let order: Vec<&str> = lines.iter().map(|l| l.split(' ').nth(1).unwrap_or_default()).collect();
        let expected = ["/session/ses_A/todo", "/session/ses_C/abort", "/session/status", "/session/ses_B/todo"];
        assert_eq!(order, expected);
    }

    #[tokio::test]
    async fn calls_past_max_requests_in_flight_wait_their_turn() {
        let (url, connections) = silent_server().await;
        let mut server = ServerConfig::new("a", &url);
        // A second's timeout: the count below is taken well before the first two end.
        server.request_timeout = std::time::Duration::from_secs(1);
        server.max_requests_in_flight = 2;
        let client = OpenCodeClient::new(&server, None).unwrap();
        let calls: Vec<_> = (0..5)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.abort(&format!("ses_{i}")).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert_eq!(connections.load(Ordering::SeqCst), 2, "two under way; three wait their turn");
        let mut unsent = 0;
        for call in calls {
            // Sent and never answered: the client's timeout; never sent: no turn came.
            let err = call.await.unwrap().unwrap_err();
            if matches!(&err, EngineError::Unreachable(e) if e.contains("servers[].max_requests_in_flight")) {
                unsent += 1;
            }
        }
        assert!(unsent >= 1, "the last one waited two timeouts: it failed unsent, naming the key");
        assert!(connections.load(Ordering::SeqCst) <= 4, "never more than two at once");
    }

    #[tokio::test]
    async fn an_answer_past_max_response_bytes_is_refused_with_a_clear_error() {
        let mut server = ServerConfig::new("a", "");
        server.max_response_bytes = 64 * 1024;
        // A JSON array a little past the cap: announced by its length, or chunked.
        let big = format!("[{}1]", "1,".repeat(40 * 1024)).into_bytes();
        for chunked in [false, true] {
            let (url, _) = recording_server(big.clone(), chunked).await;
            server.url = url;
            let client = OpenCodeClient::new(&server, None).unwrap();
            let err = client.todos("ses_A").await.unwrap_err();
            assert!(err.to_string().contains("larger than 65536 bytes (servers[].max_response_bytes)"), "{err}");
        }
        // Under the cap it is read as before.
        let (url, _) = recording_server(b"[]".to_vec(), true).await;
        server.url = url;
        assert_eq!(OpenCodeClient::new(&server, None).unwrap().todos("ses_A").await.unwrap(), vec![]);
    }

    /// Calls close together share a connection; a call after the connection sat idle
    /// longer than OpenCode 1.19 keeps one open goes on a new one, and is answered (on
    /// the old one it was never answered: a client that kept idle connections 90 s,
    /// reqwest's default, failed it).
    #[tokio::test]
    async fn a_connection_opencode_may_have_closed_for_idleness_is_not_used_again() {
        // OpenCode 1.19 closes a connection idle 5 s.
        let answer = crate::test_support::Answer::json("[]").closing_idle_after(std::time::Duration::from_secs(5));
        let served = answer.serve().await;
        let (url, connections) = (served.url, served.connections);
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        assert_eq!(client.todos("ses_A").await.unwrap(), vec![]);
        assert_eq!(client.todos("ses_A").await.unwrap(), vec![]);
        assert_eq!(connections.load(Ordering::SeqCst), 1, "kept and used again");

        // Real time: under a paused clock the client's timeouts would fire at once.
        tokio::time::sleep(std::time::Duration::from_millis(5_200)).await;
        assert_eq!(client.todos("ses_A").await.unwrap(), vec![], "answered on a new connection");
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }
}
