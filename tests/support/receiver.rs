//! A tiny HTTP receiver for notification tests: a std `TcpListener` on `127.0.0.1:0`,
//! one thread per connection, HTTP/1.1 with `Content-Length` bodies, `Connection:
//! close`. It records every request and answers with the next scripted status (then
//! 200), or never answers at all (`Receiver::hanging`: a dead receiver that accepts).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == &name.to_ascii_lowercase()).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    script: VecDeque<u16>,
}

pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl Receiver {
    /// Answers the scripted statuses in order, then 200.
    pub fn start(script: &[u16]) -> Receiver {
        Self::spawn(script, false)
    }

    /// Accepts, reads the request, and never answers.
    pub fn hanging() -> Receiver {
        Self::spawn(&[], true)
    }

    fn spawn(script: &[u16], hang: bool) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State { received: Vec::new(), script: script.iter().copied().collect() }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(conn, &state, hang));
            }
        });
        Receiver { url, state }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Waits until at least `n` requests arrived; returns them all.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.received();
            if got.len() >= n || Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>, hang: bool) {
    let Ok(read_half) = conn.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let received =
        Received { method, path, headers, body: String::from_utf8_lossy(&body).into_owned(), at: Instant::now() };
    let status = {
        let mut s = state.lock().unwrap();
        s.received.push(received);
        s.script.pop_front().unwrap_or(200)
    };
    if hang {
        std::thread::sleep(Duration::from_secs(3600));
        return;
    }
    let mut conn = conn;
    let _ = write!(conn, "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    let _ = conn.flush();
}
