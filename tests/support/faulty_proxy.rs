//! A reverse proxy in front of the real OpenCode server that forwards every request
//! unchanged, but slips malformed and unknown frames into `/global/event` — between
//! real frames, never inside one — so a test can show that bad input disturbs nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures::StreamExt;
use shepherd::opencode::sse::SseDecoder;

/// The frames injected, in turn, every 300 ms.
pub const BAD_FRAMES: &[&str] = &[
    "{this is not json",
    r#"{"payload":{"type":"session.status","properties":{"sessionID":"ses_x"}}}"#,
    r#"{"payload":{"type":"totally.new.event","properties":{"x":1}}}"#,
    r#"{"directory":"/nowhere","payload":{"type":"session.status","properties":{"sessionID":"ses_ghost","status":{"type":"busy"}}}}"#,
    "",
];

/// What the proxy does to the event stream.
#[derive(Default)]
pub struct Faults {
    /// Slip [`BAD_FRAMES`] into the stream.
    pub inject: AtomicBool,
    /// Refuse and cut event streams (REST still works): a network blip for the stream.
    pub cut_events: AtomicBool,
    /// Answer `GET /global/health` with this version instead of OpenCode's own.
    pub health_version: std::sync::Mutex<Option<String>>,
    /// Every request but the event stream's, in arrival order: `METHOD /path?query`.
    pub requests: std::sync::Mutex<Vec<String>>,
}

pub struct FaultyProxy {
    pub url: String,
    pub faults: Arc<Faults>,
    handle: actix_web::dev::ServerHandle,
}

impl FaultyProxy {
    /// A proxy injecting bad frames.
    pub fn start(upstream: String) -> anyhow::Result<FaultyProxy> {
        let p = Self::start_clean(upstream)?;
        p.faults.inject.store(true, Ordering::SeqCst);
        Ok(p)
    }

    /// A proxy that forwards faithfully until told otherwise.
    pub fn start_clean(upstream: String) -> anyhow::Result<FaultyProxy> {
        let faults = Arc::new(Faults::default());
        let shared = Arc::clone(&faults);
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        // Gives a pooled connection up before OpenCode may close it (as Shepherd does), so
        // a forwarded call never goes out on a connection the server is closing.
        let client = reqwest::Client::builder()
            .pool_idle_timeout(shepherd::opencode::client::POOL_IDLE)
            .build()?;
        let (handle, _thread) = shepherd::http_thread::spawn_server("faulty-proxy".into(), move || {
            Ok(HttpServer::new(move || {
                App::new()
                    .app_data(web::Data::new((client.clone(), upstream.clone(), Arc::clone(&shared))))
                    .default_service(web::to(forward))
            })
            .workers(1)
            .listen(listener)?
            .run())
        })?;
        Ok(FaultyProxy { url, faults, handle })
    }
}

/// A `via` for the rig (`Rig::start_via` and the like): Shepherd talks to OpenCode
/// through a proxy started by `start` (`FaultyProxy::start` or `start_clean`), kept in
/// `slot` for the test to steer and drop.
pub fn via(
    slot: &mut Option<FaultyProxy>,
    start: fn(String) -> anyhow::Result<FaultyProxy>,
) -> impl FnOnce(String) -> anyhow::Result<String> + '_ {
    move |url| {
        let proxy = start(url)?;
        let via = proxy.url.clone();
        *slot = Some(proxy);
        Ok(via)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        let h = self.handle.clone();
        std::thread::spawn(move || futures::executor::block_on(h.stop(false)));
    }
}

async fn forward(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<(reqwest::Client, String, Arc<Faults>)>,
) -> HttpResponse {
    let (client, upstream, faults) = state.get_ref();
    if req.path() != "/global/event" {
        let target = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/");
        faults.requests.lock().unwrap().push(format!("{} {target}", req.method()));
    }
    if req.path() == "/global/event" && faults.cut_events.load(Ordering::SeqCst) {
        return HttpResponse::ServiceUnavailable().body("event stream cut by the test");
    }
    if req.path() == "/global/health" {
        if let Some(version) = faults.health_version.lock().unwrap().clone() {
            return HttpResponse::Ok().json(serde_json::json!({ "healthy": true, "version": version }));
        }
    }
    let url = format!("{upstream}{}", req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/"));
    let method = reqwest::Method::from_bytes(req.method().as_str().as_bytes()).unwrap_or(reqwest::Method::GET);
    let mut rb = client.request(method, &url).body(body.to_vec());
    for name in ["content-type", "authorization", "accept"] {
        if let Some(v) = req.headers().get(name) {
            rb = rb.header(name, v.as_bytes());
        }
    }
    let resp = match rb.send().await {
        Ok(r) => r,
        Err(e) => return HttpResponse::BadGateway().body(e.to_string()),
    };
    let status = actix_web::http::StatusCode::from_u16(resp.status().as_u16())
        .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY);
    if req.path() != "/global/event" {
        let ct = resp.headers().get("content-type").map(|v| v.as_bytes().to_vec());
        let bytes = resp.bytes().await.unwrap_or_default();
        let mut out = HttpResponse::build(status);
        if let Some(ct) = ct {
            out.insert_header(("content-type", ct));
        }
        return out.body(bytes);
    }
    // Re-frame upstream so injected frames land between real ones.
    let real = resp.bytes_stream().scan(SseDecoder::new(), |dec, chunk| {
        let frames = match chunk {
            Ok(c) => dec.push(&c).data,
            Err(_) => Vec::new(),
        };
        futures::future::ready(Some(frames))
    });
    let inject = Arc::clone(faults);
    let bad = futures::stream::unfold(0usize, move |i| {
        let inject = Arc::clone(&inject);
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let frames = if inject.inject.load(Ordering::SeqCst) {
                vec![BAD_FRAMES[i % BAD_FRAMES.len()].to_string()]
            } else {
                Vec::new()
            };
            Some((frames, i + 1))
        }
    });
    let cut = Arc::clone(faults);
    let merged = futures::stream::select(real, bad)
        .take_while(move |_| futures::future::ready(!cut.cut_events.load(Ordering::SeqCst)))
        .flat_map(|frames| {
            futures::stream::iter(
                frames.into_iter().map(|f| Ok::<_, actix_web::Error>(web::Bytes::from(format!("data: {f}\n\n")))),
            )
        });
    HttpResponse::build(status).content_type("text/event-stream").streaming(merged)
}
