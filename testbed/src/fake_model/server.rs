//! The fake model's HTTP side: an actix-web server on a thread of its own, the request
//! log, and the translation of a planned [`Reply`] into an HTTP response.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context as _;
use bytes::Bytes;
use futures::Stream;
use serde_json::{json, Value};

use super::marker::{Behaviour, Script, StepChoice};
use super::reply::{self, Frame, Reply, ReplyContext, RequestView, Wait};

/// Largest request body accepted (OpenCode sends the whole conversation every call).
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Model ids listed by `GET /v1/models`.
const MODEL_IDS: [&str; 2] = ["fake-model", "fake-model-2"];
/// Requests for this model are Shepherd's advisor asking, never a session's turn: they
/// are answered from [`FakeModel::set_advisor_answers`].
pub const ADVISOR_MODEL: &str = "advisor-model";

/// How the fake chose its answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestKind {
    /// A marker of the last user message.
    Scripted(Behaviour),
    /// The last user message had no marker: the default behaviour.
    Default(Behaviour),
    /// The markers were used up: the final `Done.`.
    Finished,
    /// A request without tools (title / summary helper call), answered at once.
    Helper,
    /// A helper call answered with the behaviour set by
    /// [`FakeModel::set_helper_behaviour`].
    HelperOverride(Behaviour),
    /// The marker for this step did not parse; the message says why.
    InvalidMarker(String),
    /// A request for [`ADVISOR_MODEL`], answered with the next scripted advisor answer.
    Advisor(Behaviour),
    /// A session's turn during an outage ([`FakeModel::set_outage`]): markers ignored.
    Outage(Behaviour),
}

/// How the response to a request ended, as far as the fake can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The whole response was handed to the connection.
    Completed,
    /// The client went away (or the server stopped) before the response ended.
    Disconnected,
}

/// One received chat request, as logged by the fake.
#[derive(Debug, Clone)]
pub struct FakeRequest {
    /// Position in the log (0-based).
    pub index: usize,
    /// When it arrived.
    pub at: SystemTime,
    /// `model` of the request.
    pub model: String,
    /// Text of the last user message.
    pub last_user_text: String,
    /// Step index (assistant messages after the last user message).
    pub step: usize,
    /// What the fake did.
    pub kind: RequestKind,
    /// Tool names offered by the request.
    pub tools: Vec<String>,
    /// Whether the request asked for SSE.
    pub stream: bool,
    /// The full request body.
    pub body: Value,
    /// `None` while the response is still being sent.
    pub ended: Option<StreamEnd>,
}

impl FakeRequest {
    /// Whether this was Shepherd's advisor asking (model [`ADVISOR_MODEL`]).
    pub fn is_advisor(&self) -> bool {
        matches!(self.kind, RequestKind::Advisor(_))
    }

    /// Whether this was a helper call (no tools).
    pub fn is_helper(&self) -> bool {
        matches!(self.kind, RequestKind::Helper | RequestKind::HelperOverride(_))
    }

    /// The behaviour run for this request, if any (scripted or default).
    pub fn behaviour(&self) -> Option<&Behaviour> {
        match &self.kind {
            RequestKind::Scripted(b)
            | RequestKind::Default(b)
            | RequestKind::HelperOverride(b)
            | RequestKind::Advisor(b)
            | RequestKind::Outage(b) => Some(b),
            _ => None,
        }
    }

    /// The marker spec chosen (`"todo:create"`), `"done"` for the final answer,
    /// `"helper"` for helper calls, `"invalid"` for a bad marker.
    pub fn marker(&self) -> String {
        match &self.kind {
            RequestKind::Scripted(b) | RequestKind::Default(b) => b.spec(),
            RequestKind::HelperOverride(b) => format!("helper:{}", b.spec()),
            RequestKind::Advisor(b) => format!("advisor:{}", b.spec()),
            RequestKind::Outage(b) => format!("outage:{}", b.spec()),
            RequestKind::Finished => "done".into(),
            RequestKind::Helper => "helper".into(),
            RequestKind::InvalidMarker(_) => "invalid".into(),
        }
    }

    /// The JSON schema of the parameters of tool `name` as offered in this request.
    pub fn tool_schema(&self, name: &str) -> Option<&Value> {
        self.body
            .get("tools")?
            .as_array()?
            .iter()
            .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))?
            .pointer("/function/parameters")
    }
}

/// State shared between the handle and the server's workers.
struct Shared {
    log: Mutex<Vec<FakeRequest>>,
    default: Mutex<Behaviour>,
    helper: Mutex<Option<Behaviour>>,
    /// Answers for advisor requests, in order; the last one repeats.
    advisor: Mutex<VecDeque<Behaviour>>,
    /// While set, every session turn gets this (a provider outage).
    outage: Mutex<Option<Behaviour>>,
    counter: AtomicU64,
}

impl Shared {
    fn log(&self) -> MutexGuard<'_, Vec<FakeRequest>> {
        // A panic while holding the lock cannot leave the log half-written in a way that
        // matters to tests, so a poisoned lock is simply used.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn default_behaviour(&self) -> Behaviour {
        self.default.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A running fake model. Dropping it stops the server.
pub struct FakeModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    handle: Option<ServerHandle>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FakeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeModel").field("addr", &self.addr).finish()
    }
}

impl FakeModel {
    /// Binds `127.0.0.1:0` and starts serving on a thread of its own.
    pub fn start() -> anyhow::Result<FakeModel> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the fake model")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            log: Mutex::new(Vec::new()),
            default: Mutex::new(Behaviour::Ok),
            helper: Mutex::new(None),
            advisor: Mutex::new(VecDeque::new()),
            outage: Mutex::new(None),
            counter: AtomicU64::new(0),
        });
        let app_shared = shared.clone();
        let (handle, thread) = crate::http_thread::spawn_server(format!("fake-model-{}", addr.port()), move || {
            Ok(HttpServer::new(move || {
                App::new()
                    .app_data(web::Data::from(app_shared.clone()))
                    .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
                    .route("/v1/chat/completions", web::post().to(chat_completions))
                    .route("/v1/models", web::get().to(models))
                    .route("/chat/completions", web::post().to(chat_completions))
                    .route("/models", web::get().to(models))
            })
            .workers(2)
            .disable_signals()
            .shutdown_timeout(0)
            // Notice a client that hangs up while a stalled stream sends nothing.
            .h1_allow_half_closed(false)
            .listen(listener)?
            .run())
        })
        .context("fake model")?;
        tracing::debug!(%addr, "fake model listening");
        Ok(FakeModel { addr, shared, handle: Some(handle), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT/v1`, the `baseURL` for OpenCode's provider block.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A copy of the request log, oldest first.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.shared.log().clone()
    }

    /// The logged requests that were not helper calls (the model turns), oldest first.
    pub fn turn_requests(&self) -> Vec<FakeRequest> {
        self.shared.log().iter().filter(|r| !r.is_helper() && !r.is_advisor()).cloned().collect()
    }

    /// Polls the request log until `pred` holds or `timeout` passes; returns whether it held.
    pub async fn wait_for_requests(&self, timeout: Duration, pred: impl Fn(&[FakeRequest]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if pred(&self.shared.log()) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.shared.log().clear();
    }

    /// The behaviour for tool-bearing requests whose last user message has no marker.
    pub fn set_default(&self, behaviour: Behaviour) {
        *self.shared.default.lock().unwrap_or_else(|p| p.into_inner()) = behaviour;
    }

    /// A provider outage: while `Some`, every session turn (a request with tools, not
    /// the advisor's) is answered with `behaviour` whatever its markers say — e.g.
    /// `Some(Behaviour::Err429(1))` (OpenCode gives up after ~6 s of retries) or
    /// `Some(Behaviour::Err500)`. `None` ends the outage: markers and the default apply
    /// again. Helper calls (titles, summaries) are left alone.
    pub fn set_outage(&self, behaviour: Option<Behaviour>) {
        *self.shared.outage.lock().unwrap_or_else(|p| p.into_inner()) = behaviour;
    }

    /// Makes helper calls (requests without tools: title generation, compaction summary)
    /// run `behaviour` instead of the instant answer; `None` restores the instant answer.
    /// E.g. `Some(Behaviour::Ctx400)` makes OpenCode's compaction overflow too.
    pub fn set_helper_behaviour(&self, behaviour: Option<Behaviour>) {
        *self.shared.helper.lock().unwrap_or_else(|p| p.into_inner()) = behaviour;
    }

    /// How requests for [`ADVISOR_MODEL`] are answered, in order (the last answer
    /// repeats; none set: `say:@continue:0.5`). E.g. `Say("@wait:0.9")` for a good
    /// answer, `Say("no idea")` for garbage, `Hang(None)` for a timeout, `Err500`.
    /// Sessions' own turns are untouched: they never ask for that model.
    pub fn set_advisor_answers(&self, answers: Vec<Behaviour>) {
        *self.shared.advisor.lock().unwrap_or_else(|p| p.into_inner()) = answers.into();
    }

    /// The logged advisor requests, oldest first.
    pub fn advisor_requests(&self) -> Vec<FakeRequest> {
        self.shared.log().iter().filter(|r| r.is_advisor()).cloned().collect()
    }

    /// Stops the server (open streams are dropped) and joins its thread.
    pub fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // `stop` sends the command eagerly; the returned future only awaits completion.
            drop(handle.stop(false));
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("fake model thread panicked");
            }
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Marks a log entry when the response ends, or as disconnected if it is dropped first.
struct EndGuard {
    shared: Arc<Shared>,
    index: usize,
    completed: bool,
}

impl EndGuard {
    fn complete(&mut self) {
        self.completed = true;
        self.mark(StreamEnd::Completed);
    }
    fn mark(&self, end: StreamEnd) {
        if let Some(r) = self.shared.log().get_mut(self.index) {
            r.ended.get_or_insert(end);
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        if !self.completed {
            self.mark(StreamEnd::Disconnected);
        }
    }
}

async fn models() -> HttpResponse {
    let data: Vec<Value> =
        MODEL_IDS.iter().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "fake"})).collect();
    HttpResponse::Ok().json(json!({"object": "list", "data": data}))
}

async fn chat_completions(shared: web::Data<Shared>, body: Bytes) -> HttpResponse {
    let shared = shared.into_inner();
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return HttpResponse::BadRequest().json(json!({"error": {
                "message": format!("fake model: request body is not JSON: {e}"),
                "type": "invalid_request_error",
            }}))
        }
    };
    let view = RequestView::from_body(&body);
    let n = shared.counter.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now();
    let ctx = ReplyContext {
        completion_id: format!("chatcmpl-fake-{n}"),
        call_id: format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]),
        created: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: view.model.clone(),
    };

    let helper_override = shared.helper.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let outage = shared.outage.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (kind, planned) = if view.model == ADVISOR_MODEL {
        let b = {
            let mut answers = shared.advisor.lock().unwrap_or_else(|p| p.into_inner());
            if answers.len() > 1 {
                answers.pop_front()
            } else {
                answers.front().cloned()
            }
        }
        .unwrap_or_else(|| Behaviour::Say("@continue:0.5".into()));
        let r = reply::plan(&b, &ctx);
        (RequestKind::Advisor(b), r)
    } else if view.is_helper() {
        match helper_override {
            Some(b) => {
                let r = reply::plan(&b, &ctx);
                (RequestKind::HelperOverride(b), r)
            }
            None => (RequestKind::Helper, reply::plan_helper(&view, &ctx)),
        }
    } else if let Some(b) = outage {
        let r = reply::plan(&b, &ctx);
        (RequestKind::Outage(b), r)
    } else {
        match Script::parse(&view.last_user_text).choose(view.step) {
            StepChoice::Scripted(b) => {
                let r = reply::plan(&b, &ctx);
                (RequestKind::Scripted(b), r)
            }
            StepChoice::Unscripted => {
                let b = shared.default_behaviour();
                let r = reply::plan(&b, &ctx);
                (RequestKind::Default(b), r)
            }
            StepChoice::Finished => (RequestKind::Finished, reply::plan_finished(&ctx)),
            StepChoice::Invalid(e) => {
                let text = format!("fake model: {e}");
                let r = reply::plan_text(&text, &ctx);
                (RequestKind::InvalidMarker(e.to_string()), r)
            }
        }
    };

    let index = {
        let mut log = shared.log();
        let index = log.len();
        tracing::debug!(index, step = view.step, kind = ?kind, "fake model request");
        log.push(FakeRequest {
            index,
            at: now,
            model: view.model.clone(),
            last_user_text: view.last_user_text.clone(),
            step: view.step,
            kind,
            tools: view.tool_names.clone(),
            stream: view.stream,
            body,
            ended: None,
        });
        index
    };
    let mut guard = EndGuard { shared: shared.clone(), index, completed: false };

    match planned {
        Reply::Error { status, body, retry_after } => {
            guard.complete();
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp = HttpResponse::build(status);
            if let Some(secs) = retry_after {
                resp.insert_header(("retry-after", secs.to_string()));
            }
            resp.json(body)
        }
        Reply::Ok { before_headers, frames } => {
            if let Some(wait) = before_headers {
                sleep(wait).await;
            }
            if view.stream {
                HttpResponse::Ok()
                    .content_type("text/event-stream")
                    .insert_header(("cache-control", "no-cache"))
                    .streaming(sse_stream(frames, guard))
            } else {
                let (json, delay) = reply::collapse(&frames, &ctx);
                sleep(delay.map_or(Wait::Forever, Wait::For)).await;
                guard.complete();
                HttpResponse::Ok().json(json)
            }
        }
    }
}

async fn sleep(wait: Wait) {
    match wait {
        Wait::For(d) if d.is_zero() => {}
        Wait::For(d) => tokio::time::sleep(d).await,
        Wait::Forever => futures::future::pending::<()>().await,
    }
}

/// The SSE body: frames in order, pauses honoured, the guard marked when the last frame
/// is out (or left to mark a disconnect when actix drops the stream).
fn sse_stream(frames: Vec<Frame>, guard: EndGuard) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let state = (VecDeque::from(frames), guard);
    futures::stream::unfold(state, |(mut frames, mut guard)| async move {
        loop {
            let Some(frame) = frames.pop_front() else {
                guard.complete();
                return None;
            };
            let bytes = match frame {
                Frame::Chunk(v) => Bytes::from(format!("data: {v}\n\n")),
                Frame::Done => Bytes::from_static(b"data: [DONE]\n\n"),
                Frame::Pause(wait) => {
                    sleep(wait).await;
                    continue;
                }
                Frame::KeepAlive { total, every } => {
                    // Emit one comment now and push the rest of the phase back.
                    let rest = match total {
                        Wait::Forever => Some(Wait::Forever),
                        Wait::For(left) if left > every => Some(Wait::For(left - every)),
                        Wait::For(_) => None,
                    };
                    let pause = match total {
                        Wait::For(left) if left < every => left,
                        _ => every,
                    };
                    if let Some(rest) = rest {
                        frames.push_front(Frame::KeepAlive { total: rest, every });
                    }
                    frames.push_front(Frame::Pause(Wait::For(pause)));
                    Bytes::from_static(b": keep-alive\n\n")
                }
            };
            return Some((Ok(bytes), (frames, guard)));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// Posts one chat request with `text` as the last user message.
    async fn post_chat(fake: &FakeModel, text: &str, stream: bool) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("{}/chat/completions", fake.base_url()))
            .json(&chat(text, stream))
            .send()
            .await
            .unwrap()
    }

    fn chat(text: &str, stream: bool) -> Value {
        json!({
            "model": "fake-model",
            "stream": stream,
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
            "messages": [{"role": "user", "content": text}],
        })
    }

    async fn sse_text(resp: reqwest::Response) -> String {
        let mut out = String::new();
        let mut s = resp.bytes_stream();
        while let Some(Ok(b)) = s.next().await {
            out.push_str(&String::from_utf8_lossy(&b));
        }
        out
    }

    #[tokio::test]
    async fn ok_streams_text_and_done() {
        let fake = FakeModel::start().unwrap();
        let resp = post_chat(&fake, "hi [[fake:ok]]", true).await;
        assert_eq!(resp.status(), 200);
        let text = sse_text(resp).await;
        assert!(text.contains("\"content\":\"Hello \""), "{text}");
        assert!(text.contains("\"finish_reason\":\"stop\""));
        assert!(text.ends_with("data: [DONE]\n\n"));
        let log = fake.requests();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].marker(), "ok");
        assert!(fake.wait_for_requests(Duration::from_secs(2), |l| l[0].ended == Some(StreamEnd::Completed)).await);
    }

    #[tokio::test]
    async fn non_streaming_request_gets_one_json() {
        let fake = FakeModel::start().unwrap();
        let v: Value = post_chat(&fake, "[[fake:bash:ls -l]]", false).await.json().await.unwrap();
        assert_eq!(v.pointer("/choices/0/finish_reason"), Some(&json!("tool_calls")));
        assert_eq!(v.pointer("/choices/0/message/tool_calls/0/function/name"), Some(&json!("bash")));
    }

    #[tokio::test]
    async fn err429_sets_retry_after() {
        let fake = FakeModel::start().unwrap();
        let resp = post_chat(&fake, "[[fake:err429:7]]", true).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers().get("retry-after").unwrap(), "7");
    }

    #[tokio::test]
    async fn an_outage_fails_every_turn_whatever_its_marker_until_it_ends() {
        let fake = FakeModel::start().unwrap();
        fake.set_outage(Some(Behaviour::Err500));
        assert_eq!(post_chat(&fake, "[[fake:ok]]", true).await.status(), 500);
        assert_eq!(post_chat(&fake, "no marker", true).await.status(), 500);
        fake.set_outage(None);
        assert_eq!(post_chat(&fake, "[[fake:ok]]", true).await.status(), 200);
        let markers: Vec<String> = fake.requests().iter().map(FakeRequest::marker).collect();
        assert_eq!(markers, ["outage:err500", "outage:err500", "ok"]);
    }

    #[tokio::test]
    async fn stalled_stream_is_dropped_when_the_client_disconnects() {
        let fake = FakeModel::start().unwrap();
        let resp = post_chat(&fake, "[[fake:stall]]", true).await;
        let mut s = resp.bytes_stream();
        let first = s.next().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&first).contains("Starting"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(fake.requests()[0].ended, None, "still open while stalled");
        drop(s);
        assert!(
            fake.wait_for_requests(Duration::from_secs(3), |l| l[0].ended == Some(StreamEnd::Disconnected)).await,
            "the fake noticed the disconnect"
        );
    }

    #[tokio::test]
    async fn dropping_the_fake_ends_open_streams_promptly() {
        let fake = FakeModel::start().unwrap();
        let resp = post_chat(&fake, "[[fake:stall]]", true).await;
        let mut s = resp.bytes_stream();
        s.next().await.unwrap().unwrap();
        let started = std::time::Instant::now();
        drop(fake);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let rest =
            tokio::time::timeout(Duration::from_secs(2), async { while let Some(Ok(_)) = s.next().await {} }).await;
        assert!(rest.is_ok(), "the client sees the stream end");
    }

    #[tokio::test]
    async fn hang_sends_no_headers_and_notices_the_client_leaving() {
        let fake = FakeModel::start().unwrap();
        let sent = reqwest::Client::new()
            .post(format!("{}/chat/completions", fake.base_url()))
            .timeout(Duration::from_millis(500))
            .json(&chat("[[fake:hang]]", true))
            .send()
            .await;
        assert!(sent.unwrap_err().is_timeout());
        assert!(fake.wait_for_requests(Duration::from_secs(3), |l| l[0].ended == Some(StreamEnd::Disconnected)).await);
    }

    #[tokio::test]
    async fn keepalive_stall_sends_comments() {
        let fake = FakeModel::start().unwrap();
        let resp = post_chat(&fake, "[[fake:stall-ka:1.5]]", true).await;
        let text = sse_text(resp).await;
        assert_eq!(text.matches(": keep-alive").count(), 2, "{text}");
        assert!(text.contains("resumed."));
    }

    #[actix::test]
    async fn works_inside_an_actix_system() {
        let fake = FakeModel::start().unwrap();
        let resp = reqwest::Client::new().get(format!("{}/models", fake.base_url())).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }

    #[tokio::test]
    async fn helper_calls_answer_at_once_unless_overridden() {
        let fake = FakeModel::start().unwrap();
        let no_tools = json!({"model": "m", "stream": false, "messages": [
            {"role": "system", "content": "You are a title generator."},
            {"role": "user", "content": "x [[fake:stall]]"},
        ]});
        let url = format!("{}/chat/completions", fake.base_url());
        let v: Value = reqwest::Client::new().post(&url).json(&no_tools).send().await.unwrap().json().await.unwrap();
        assert_eq!(v.pointer("/choices/0/message/content"), Some(&json!("Fake title")));
        fake.set_helper_behaviour(Some(Behaviour::Ctx400));
        let resp = reqwest::Client::new().post(&url).json(&no_tools).send().await.unwrap();
        assert_eq!(resp.status(), 400);
        assert_eq!(fake.requests()[1].marker(), "helper:ctx400");
    }

    #[test]
    fn works_from_a_plain_thread_and_stops_on_drop() {
        let fake = FakeModel::start().unwrap();
        let addr = fake.addr();
        drop(fake);
        assert!(std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err());
    }
}
