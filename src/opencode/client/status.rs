//! `GET /session/status`, the one call a fleet makes in bursts: reads of one directory
//! are coalesced ([`StatusReads`]), and each answer is scanned once for every reader it
//! answers ([`entries`]: the sessions they asked about, without building the rest).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use reqwest::Method;
use shepherd_actors::event::Status;
use shepherd_actors::ports::EngineError;

use super::transport::{parse_apart_if_long, read_capped, undecodable, PARSE_APART_BYTES, STATUS_READ};
use super::OpenCodeClient;

/// What one reader asks of a `GET /session/status`.
#[derive(Debug)]
pub(super) enum Want {
    /// One session's entry (`None` in the answer: absent, i.e. idle).
    One(String),
    /// The whole map.
    All,
}

/// The entries a round's readers asked for: only theirs, or every entry if one of them
/// asked for all.
type Entries = std::sync::Arc<HashMap<String, Status>>;

/// A reader waiting for the next round, and what it wants of it.
type Waiter = (Want, tokio::sync::oneshot::Sender<Result<Entries, EngineError>>);

/// How many `GET /session/status` reads of one directory may be in flight at once.
/// With one, a reader that asks while a read is under way waits for it to end and then
/// for the next — two reads' time, the longest step between a stall deadline and its
/// abort at 10,000 sessions; with two, the next read goes out at once. A bound, not a
/// tuning knob: a burst still costs a handful of reads, not one per reader.
const READS_IN_FLIGHT: usize = 2;

/// What a reader's wait for a (shared) `GET /session/status` answer is timed as: the
/// call's own time leaves out the wait for a read to go out and the hand-back, which a
/// burst of readers of one directory makes the larger part.
pub const READER_WAIT: &str = "GET /session/status (a reader's wait, shared reads)";

/// Coalesces `GET /session/status` reads per directory. A reader never gets an answer
/// to a request sent before it asked (a recovery must see the status *after* its
/// stall deadline): a reader joins the next read to go out, which answers every reader
/// that asked before it was sent. A read goes out as soon as readers wait and fewer
/// than [`READS_IN_FLIGHT`] of the directory's are under way; otherwise the readers
/// wait for one to end. So a burst of N concurrent readers costs a few requests, not
/// N — and one scan of each answer, not N: a directory with 100,000 busy sessions
/// answers with megabytes.
#[derive(Debug, Default)]
pub(super) struct StatusReads {
    /// Directories with a read under way or readers waiting → their state.
    directories: Mutex<HashMap<String, DirectoryReads>>,
}

/// One directory's reads: how many are under way, and the readers waiting for the next.
#[derive(Debug, Default)]
struct DirectoryReads {
    in_flight: usize,
    waiting: Vec<Waiter>,
}

/// A read that may go out now: counted as under way until its guard drops, and the
/// readers it answers.
type Round = (UnderWay, Vec<Waiter>);

impl StatusReads {
    /// Adds a reader of `directory`, and takes the next read if one may go out now.
    fn join(self: &Arc<Self>, directory: &str, reader: Waiter) -> Option<Round> {
        let mut directories = self.directories.lock().unwrap_or_else(|e| e.into_inner());
        directories.entry(directory.to_string()).or_default().waiting.push(reader);
        self.take_round(&mut directories, directory)
    }

    /// The next read of `directory`, if readers wait and one may go out now.
    fn next_round(self: &Arc<Self>, directory: &str) -> Option<Round> {
        let mut directories = self.directories.lock().unwrap_or_else(|e| e.into_inner());
        self.take_round(&mut directories, directory)
    }

    /// Takes the waiting readers into a round counted as under way (the guard made with
    /// the count); `None` when none waits or the directory is at its bound.
    fn take_round(self: &Arc<Self>, directories: &mut HashMap<String, DirectoryReads>, directory: &str) -> Option<Round> {
        let reads = directories.get_mut(directory)?;
        if reads.waiting.is_empty() || reads.in_flight >= READS_IN_FLIGHT {
            return None;
        }
        reads.in_flight += 1;
        let under_way = UnderWay { reads: Arc::clone(self), directory: directory.to_string() };
        Some((under_way, std::mem::take(&mut reads.waiting)))
    }

    /// A read of `directory` ended; a directory with nothing under way and nobody
    /// waiting is forgotten.
    fn round_ended(&self, directory: &str) {
        let mut directories = self.directories.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(reads) = directories.get_mut(directory) {
            reads.in_flight = reads.in_flight.saturating_sub(1);
            if reads.in_flight == 0 && reads.waiting.is_empty() {
                directories.remove(directory);
            }
        }
    }
}

/// A read of `directory` counted as under way: ended when dropped, however its task
/// ends (a runtime may drop it before it ran, or mid-read), so the directory never
/// counts a read for ever.
struct UnderWay {
    reads: Arc<StatusReads>,
    directory: String,
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.reads.round_ended(&self.directory);
    }
}

impl OpenCodeClient {
    /// The entries `want` names of a `GET /session/status` for `directory` sent after
    /// this call began, possibly shared with other readers (see [`StatusReads`]).
    ///
    /// The reader's whole wait — for a read to go out, the read, the scan — is timed as
    /// [`READER_WAIT`], beside the calls themselves.
    pub(super) async fn status_entries(&self, directory: &str, want: Want) -> Result<Entries, EngineError> {
        let started = std::time::Instant::now();
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(round) = self.status_reads.join(directory, (want, tx)) {
            // Detached, so that no reader's cancellation strands the others.
            let client = self.clone();
            tokio::spawn(async move { client.status_rounds(round).await });
        }
        let answer =
            rx.await.unwrap_or_else(|_| Err(EngineError::Unreachable("GET /session/status: read abandoned".into())));
        if let Some(timer) = &self.timer {
            (timer.0)(READER_WAIT, started.elapsed(), if answer.is_ok() { "ok" } else { "failed" });
        }
        answer
    }

    /// Reads for `round`, then for whoever waits when it ends (while the directory's
    /// bound lets a read go out): each round answers the readers that asked before it
    /// was sent, from one scan of its body.
    async fn status_rounds(&self, mut round: Round) {
        loop {
            let (under_way, readers) = round;
            self.status_round(&under_way.directory, readers).await;
            let directory = under_way.directory.clone();
            drop(under_way);
            match self.status_reads.next_round(&directory) {
                Some(next) => round = next,
                None => return,
            }
        }
    }

    /// One read of `directory`'s statuses, answering `readers`.
    async fn status_round(&self, directory: &str, readers: Vec<Waiter>) {
        let mut rb = self.request(Method::GET, "/session/status");
        if !directory.is_empty() {
            rb = rb.query(&[("directory", directory)]);
        }
        let body = match self.send_first(rb, STATUS_READ).await {
            Ok(resp) => read_capped(resp, self.max_response_bytes, STATUS_READ).await,
            Err(e) => Err(e),
        };
        let answer = match body {
            Ok(body) if body.len() < PARSE_APART_BYTES => {
                entries(&body, wanted_ids(&readers).as_ref()).map_err(|e| undecodable(STATUS_READ, e))
            }
            Ok(body) => {
                // Scanned on the blocking pool, with a copy of the ids asked for.
                let wanted: Option<Vec<String>> =
                    wanted_ids(&readers).map(|ids| ids.into_iter().map(str::to_string).collect());
                parse_apart_if_long(body.len(), STATUS_READ, move || {
                    let wanted: Option<HashSet<&str>> =
                        wanted.as_ref().map(|ids| ids.iter().map(String::as_str).collect());
                    entries(&body, wanted.as_ref())
                })
                .await
            }
            Err(e) => Err(e),
        }
        .map(Arc::new);
        for (_, reader) in readers {
            let _ = reader.send(answer.clone());
        }
    }
}

/// The ids `readers` asked for; `None` when one of them asked for every entry.
fn wanted_ids(readers: &[Waiter]) -> Option<HashSet<&str>> {
    readers
        .iter()
        .map(|(want, _)| match want {
            Want::One(id) => Some(id.as_str()),
            Want::All => None,
        })
        .collect()
}

/// Up to this many wanted ids are compared one by one rather than looked up: most
/// reads answer one reader or a few, and hashing every key of a directory's thousands
/// cost more than skipping their entries.
const FEW_WANTED: usize = 8;

/// Whether `key` is one of `wanted`.
fn is_wanted(wanted: &HashSet<&str>, key: &[u8]) -> bool {
    if wanted.len() <= FEW_WANTED {
        wanted.iter().any(|w| w.as_bytes() == key)
    } else {
        std::str::from_utf8(key).is_ok_and(|k| wanted.contains(k))
    }
}

/// The entries of a `GET /session/status` body (`{id: status, …}`) whose ids are in
/// `wanted` (all of them if `None`), found by scanning: other entries are skipped
/// unparsed and their keys are not copied.
pub(super) fn entries(body: &[u8], wanted: Option<&HashSet<&str>>) -> Result<HashMap<String, Status>, serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

    /// A map key: kept (copied) only when it is wanted. Read as raw bytes: most keys are
    /// compared and dropped, and checking each as text cost as much as skipping its
    /// entry; a kept one is checked then.
    struct Key<'w>(Option<&'w HashSet<&'w str>>);
    impl<'de> DeserializeSeed<'de> for Key<'_> {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            d.deserialize_bytes(self)
        }
    }
    impl Visitor<'_> for Key<'_> {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a session id")
        }
        fn visit_bytes<E: serde::de::Error>(self, key: &[u8]) -> Result<Option<String>, E> {
            if !self.0.is_none_or(|w| is_wanted(w, key)) {
                return Ok(None);
            }
            String::from_utf8(key.to_vec()).map(Some).map_err(|_| E::custom("a session id that is not UTF-8"))
        }
    }

    struct Scan<'w>(Option<&'w HashSet<&'w str>>);
    impl<'de> Visitor<'de> for Scan<'_> {
        type Value = HashMap<String, Status>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of session id to status")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = HashMap::new();
            while let Some(key) = map.next_key_seed(Key(self.0))? {
                match key {
                    Some(id) => {
                        found.insert(id, map.next_value::<Status>()?);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(found)
        }
    }

    let mut de = serde_json::Deserializer::from_slice(body);
    let found = de.deserialize_map(Scan(wanted))?;
    de.end()?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use shepherd_actors::config::ServerConfig;
    use shepherd_actors::ports::Reads;

    use super::*;

    /// One session's entry, as `status` finds it.
    fn status_of(body: &[u8], id: &str) -> Result<Option<Status>, serde_json::Error> {
        Ok(entries(body, Some(&HashSet::from([id])))?.remove(id))
    }

    #[test]
    fn one_sessions_status_is_found_in_the_directorys_map() {
        let body = br#"{"ses_a":{"type":"busy"},"ses_b":{"type":"retry","attempt":2,"message":"x","next":9},"ses_c":{"type":"busy"}}"#;
        assert_eq!(status_of(body, "ses_a").unwrap(), Some(Status::Busy));
        assert_eq!(status_of(body, "ses_b").unwrap(), Some(Status::Retry { attempt: Some(2), next: Some(9) }));
        assert_eq!(status_of(body, "ses_z").unwrap(), None);
        assert_eq!(status_of(b"{}", "ses_a").unwrap(), None);
        assert!(status_of(b"[1]", "ses_a").is_err());
        assert!(status_of(br#"{"ses_a":{"type":"busy"}"#, "ses_a").is_err());
    }

    #[test]
    fn one_scan_finds_every_wanted_entry_and_keeps_no_other() {
        let body = br#"{"ses_a":{"type":"busy"},"ses_b":{"type":"retry","attempt":2,"message":"x","next":9},"ses_c":{"type":"busy"}}"#;
        let some = entries(body, Some(&HashSet::from(["ses_a", "ses_b", "ses_z"]))).unwrap();
        assert_eq!(some.len(), 2, "{some:?}");
        assert_eq!(some.get("ses_b"), Some(&Status::Retry { attempt: Some(2), next: Some(9) }));
        assert_eq!(entries(body, None).unwrap().len(), 3);
    }

    /// Keys are compared as they are sent, escapes undone; one that is not text fails
    /// the read only when it would be kept (another session's odd key costs nobody
    /// their answer). Past a few wanted ids they are looked up rather than compared.
    #[test]
    fn keys_are_matched_unescaped_and_only_a_kept_one_must_be_text() {
        let body = b"{\"ses_\xff\":{\"type\":\"busy\"},\"ses_\\u0061\":{\"type\":\"busy\"},\"ses_b\":{\"type\":\"busy\"}}";
        assert_eq!(status_of(body, "ses_a").unwrap(), Some(Status::Busy), "the escaped key is ses_a");
        assert_eq!(status_of(body, "ses_b").unwrap(), Some(Status::Busy));
        assert!(entries(body, None).is_err(), "kept whole, the key that is not text fails the read");

        let ids: Vec<String> = (0..20).map(|i| format!("ses_{i:02}")).collect();
        let body = serde_json::to_vec(&ids.iter().map(|id| (id.clone(), json!({"type": "busy"}))).collect::<serde_json::Map<_, _>>()).unwrap();
        let many: HashSet<&str> = ids.iter().step_by(2).map(String::as_str).chain(["ses_zz"]).collect();
        assert!(many.len() > FEW_WANTED);
        let found = entries(&body, Some(&many)).unwrap();
        assert_eq!(found.len(), 10, "{found:?}");
        assert!(found.keys().all(|k| many.contains(k.as_str())));
    }

    /// A status endpoint that holds each answer until the test lets it go, numbering it
    /// after its request (`ses_a` retrying, its `attempt` the request's number). The
    /// test, not the host's pace, decides which reads are under way when a reader asks.
    struct HeldStatusServer {
        url: String,
        requests: Arc<std::sync::atomic::AtomicUsize>,
        answers: Arc<tokio::sync::Semaphore>,
    }

    impl HeldStatusServer {
        async fn start() -> Self {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let answers = Arc::new(tokio::sync::Semaphore::new(0));
            let (counter, gate) = (Arc::clone(&requests), Arc::clone(&answers));
            tokio::spawn(async move {
                loop {
                    let (mut sock, _) = listener.accept().await.unwrap();
                    let (counter, gate) = (Arc::clone(&counter), Arc::clone(&gate));
                    tokio::spawn(async move {
                        let mut buf = Vec::new();
                        let mut chunk = [0u8; 1024];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            let Ok(n) = sock.read(&mut chunk).await else { return };
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                        // Counted and queued for the gate in one step: answers go in
                        // the order the requests came.
                        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        gate.acquire().await.unwrap().forget();
                        let body = format!(r#"{{"ses_a":{{"type":"retry","attempt":{n},"message":"x","next":0}}}}"#);
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             content-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = sock.write_all(format!("{head}{body}").as_bytes()).await;
                    });
                }
            });
            Self { url, requests, answers }
        }

        /// Lets the `n` oldest held answers go.
        fn answer(&self, n: usize) {
            self.answers.add_permits(n);
        }

        /// Returns once `n` requests have come.
        async fn requests_came(&self, n: usize) {
            until(|| self.requests.load(std::sync::atomic::Ordering::SeqCst) >= n).await;
        }
    }

    /// Returns once `ready` holds (checked every millisecond).
    async fn until(ready: impl Fn() -> bool) {
        while !ready() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Returns once `n` readers of `directory` wait for the next read.
    async fn readers_wait(client: &OpenCodeClient, directory: &str, n: usize) {
        until(|| {
            let directories = client.status_reads.directories.lock().unwrap();
            directories.get(directory).is_some_and(|reads| reads.waiting.len() >= n)
        })
        .await;
    }

    /// What a [`CallTimer`](super::super::CallTimer) was told: each call, its time, its
    /// outcome, in order.
    type Told = Arc<std::sync::Mutex<Vec<(String, std::time::Duration, &'static str)>>>;

    /// A call timer that keeps what it is told.
    fn recording_timer() -> (super::super::CallTimer, Told) {
        let told = Told::default();
        let keep = Arc::clone(&told);
        let timer = super::super::CallTimer(Arc::new(move |call: &str, took, outcome| {
            keep.lock().unwrap().push((call.to_string(), took, outcome))
        }));
        (timer, told)
    }

    #[tokio::test]
    async fn every_call_is_timed_by_its_template_with_how_it_ended() {
        let server = HeldStatusServer::start().await;
        let (timer, told) = recording_timer();
        let config: ServerConfig = serde_json::from_value(json!({"name": "t", "url": server.url})).unwrap();
        let client = OpenCodeClient::new(&config, None).unwrap().with_call_timer(timer.clone());
        let read = tokio::spawn({
            let client = client.clone();
            async move { client.status("/p", "ses_a").await }
        });
        server.requests_came(1).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        server.answer(1);
        read.await.unwrap().unwrap();
        // A port nobody listens on: no answer.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let gone: ServerConfig = serde_json::from_value(json!({"name": "g", "url": format!("http://{closed}")})).unwrap();
        let gone = OpenCodeClient::new(&gone, None).unwrap().with_call_timer(timer);
        assert!(gone.status("/p", "ses_a").await.is_err());
        let told = told.lock().unwrap();
        let seen: Vec<_> = told.iter().map(|(call, _, outcome)| (call.as_str(), *outcome)).collect();
        assert_eq!(
            seen,
            [
                ("GET /session/status", "ok"),
                (READER_WAIT, "ok"),
                ("GET /session/status", "failed"),
                (READER_WAIT, "failed")
            ]
        );
        assert!(told[0].1 >= std::time::Duration::from_millis(100), "held 100 ms after it came: {told:?}");
    }

    /// A reader that joins a later read waits for the read under way to end and then for
    /// its own: its wait is timed whole, beside the calls, which are each one read.
    #[tokio::test]
    async fn a_readers_wait_for_a_shared_read_is_timed_beside_the_calls() {
        let server = HeldStatusServer::start().await;
        let (timer, told) = recording_timer();
        let config: ServerConfig = serde_json::from_value(json!({"name": "t", "url": server.url})).unwrap();
        let client = OpenCodeClient::new(&config, None).unwrap().with_call_timer(timer);
        let read = |c: &OpenCodeClient| {
            let c = c.clone();
            tokio::spawn(async move { c.status("/p", "ses_a").await })
        };
        let hold = std::time::Duration::from_millis(100);
        let first = read(&client);
        server.requests_came(1).await;
        let later: Vec<_> = (0..5).map(|_| read(&client)).collect();
        // The first of them sends a second read; four wait for the first read to end.
        server.requests_came(2).await;
        readers_wait(&client, "/p", 4).await;
        tokio::time::sleep(hold).await;
        server.answer(1);
        // The four share the third read.
        server.requests_came(3).await;
        tokio::time::sleep(hold).await;
        server.answer(2);
        first.await.unwrap().unwrap();
        for reader in later {
            reader.await.unwrap().unwrap();
        }
        let told = told.lock().unwrap();
        let took = |which: &str| told.iter().filter(|(call, ..)| call == which).map(|(_, t, _)| *t).collect::<Vec<_>>();
        let (calls, waits) = (took("GET /session/status"), took(READER_WAIT));
        assert_eq!((calls.len(), waits.len()), (3, 6), "{told:?}");
        // The four waited through both holds, the third read only through the second.
        let long = waits.iter().filter(|t| **t >= 2 * hold).count();
        assert!(long >= 4, "{told:?}");
    }

    /// A directory whose statuses run past a megabyte (100,000 busy sessions) is scanned
    /// apart from the thread that asked, with the same answers: a session's entry, an
    /// absent one (idle), the whole map.
    #[tokio::test]
    async fn a_long_status_map_is_read_like_a_short_one() {
        let ids: Vec<String> = (0..40_000).map(|i| format!("ses_{i:026}")).collect();
        let map: serde_json::Map<String, serde_json::Value> =
            ids.iter().map(|id| (id.clone(), json!({"type": "busy"}))).collect();
        let body = serde_json::to_vec(&map).unwrap();
        assert!(body.len() >= PARSE_APART_BYTES, "{} bytes", body.len());
        let (url, _) = super::super::tests::recording_server(body, true).await;
        let server: ServerConfig = serde_json::from_value(json!({"name": "t", "url": url})).unwrap();
        let client = OpenCodeClient::new(&server, None).unwrap();
        assert_eq!(client.status("/p", &ids[39_999]).await.unwrap(), Some(Status::Busy));
        assert_eq!(client.status("/p", "ses_00000000000000000000000000x").await.unwrap(), None, "absent: idle");
        assert_eq!(client.statuses("/p").await.unwrap().len(), 40_000);
    }

    #[tokio::test]
    async fn concurrent_status_reads_of_a_directory_share_requests_sent_after_they_asked() {
        let server = HeldStatusServer::start().await;
        let config: ServerConfig = serde_json::from_value(json!({"name": "t", "url": server.url})).unwrap();
        let client = OpenCodeClient::new(&config, None).unwrap();
        let answered_by = |status: Result<Option<Status>, EngineError>| match status {
            Ok(Some(Status::Retry { attempt: Some(n), .. })) => n,
            other => panic!("not a numbered answer: {other:?}"),
        };
        let first = tokio::spawn({
            let c = client.clone();
            async move { c.status("/p", "ses_a").await }
        });
        server.requests_came(1).await; // the first read is in flight
        let later: Vec<_> = (0..5)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(async move { c.status("/p", "ses_a").await })
            })
            .collect();
        server.requests_came(2).await;
        readers_wait(&client, "/p", 4).await;
        server.answer(3);
        assert_eq!(answered_by(first.await.unwrap()), 1);
        let mut later_answers = Vec::new();
        for reader in later {
            later_answers.push(answered_by(reader.await.unwrap()));
        }
        later_answers.sort();
        // Never the answer to the request already in flight when they asked: the first
        // of them sends a second read at once, the others share the third, sent when
        // the first read ends (two under way at most).
        assert_eq!(later_answers, [2, 3, 3, 3, 3]);
        assert_eq!(server.requests.load(std::sync::atomic::Ordering::SeqCst), 3);
        // Another directory is another read; the directory's books were emptied.
        server.answer(1);
        assert_eq!(answered_by(client.status("/q", "ses_a").await), 4);
        assert!(client.status_reads.directories.lock().unwrap().is_empty());
    }
}
