//! The control API's HTTP server: actix-web on a thread with an actix `System` of its
//! own, so it answers while the daemon's actors are busy.
//!
//! It owns no session state: each request passes the [`Gate`], is parsed, and becomes one
//! control message to the supervisor, whose answer (or [`ControlError`]) is mapped to a
//! status and a JSON body. Each request is one tracing event under the
//! `shepherd::control` target (method, path, status, elapsed time); headers, and so the
//! token, are never logged.

use std::ffi::OsString;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::{Addr, MailboxError};
use actix_web::dev::{Payload, ServerHandle, Service as _};
use actix_web::http::{header, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{App, FromRequest, HttpRequest, HttpResponse, HttpServer, ResponseError};
use anyhow::Context as _;
use serde_json::json;
use shepherd_actors::config::ControlConfig;
use shepherd_actors::control::{
    ControlError, GetSession, PauseTarget, ResumeHandoff, SendCustomPrompt, SessionJournal, SetPause,
    StartHandoff,
};
use shepherd_actors::supervisor::{InspectLiveSources, InspectServers, Supervisor};

use super::auth::{Access, Denied, Gate};
use super::host::HostCheck;
use super::listener::ControlListener;
use super::request::{parse_pause_request, parse_prompt_request, BadBody};
use super::token::{ControlToken, IssuedToken};
use crate::metrics::fleet::readiness;
use crate::metrics::Metrics;
use crate::reload::{ReloadError, ReloadHandle};
use crate::status::StatusBoard;

/// Journal records `GET /v1/sessions/{id}/history` returns when no `limit` is given.
const DEFAULT_HISTORY_LIMIT: u32 = 50;

/// Worker threads of the control server: it serves a few people and scripts, not load.
const WORKERS: usize = 2;
/// How long a graceful stop waits for requests under way (a prompt being delivered).
const SHUTDOWN_GRACE_SECS: u64 = 5;
/// How long the server keeps a connection open between requests (actix-web's default,
/// said here because the client's pool must give one up before: [`CLIENT_POOL_IDLE`]).
pub(super) const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// How long [`ControlClient`](super::ControlClient) keeps an idle connection for the next
/// call (`shepherd top` polls at any `--refresh`): a second less than the server keeps it,
/// so no call goes out on a connection the server is closing, to go unanswered.
pub(super) const CLIENT_POOL_IDLE: Duration = KEEP_ALIVE.saturating_sub(Duration::from_secs(1));

/// A running control API.
pub struct ControlServer {
    url: String,
    issued: IssuedToken,
    handle: Option<ServerHandle>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer").field("url", &self.url).field("token_from", &self.issued.origin).finish()
    }
}

impl ControlServer {
    /// Establishes the token (from the environment, or generated and written to the
    /// token file) and starts serving on `listener`.
    pub fn start(
        cfg: &ControlConfig,
        listener: ControlListener,
        supervisor: Addr<Supervisor>,
        metrics: Arc<Metrics>,
        reload: Option<ReloadHandle>,
        status: StatusBoard,
    ) -> anyhow::Result<Self> {
        Self::start_with_env(cfg, listener, supervisor, metrics, reload, status, &|name| std::env::var_os(name))
    }

    /// [`ControlServer::start`] with the environment given as a lookup function.
    pub fn start_with_env(
        cfg: &ControlConfig,
        listener: ControlListener,
        supervisor: Addr<Supervisor>,
        metrics: Arc<Metrics>,
        reload: Option<ReloadHandle>,
        status: StatusBoard,
        lookup: &dyn Fn(&str) -> Option<OsString>,
    ) -> anyhow::Result<Self> {
        let ControlListener { listener, local } = listener;
        if !local.ip().is_loopback() {
            tracing::warn!(
                bind = %local,
                "control API bound to a non-loopback address (control.allow_remote): the bearer token and every \
                 answer travel in clear text unless a TLS proxy is in front; anyone who can reach it and holds the \
                 token can prompt sessions"
            );
        }
        let issued = IssuedToken::issue(cfg, lookup)?;
        let state = web::Data::new(ApiState {
            supervisor,
            metrics,
            reload,
            status,
            gate: Gate::new(issued.token.clone(), cfg.allow_unauthenticated_reads),
            hosts: HostCheck::new(local, &cfg.allowed_hosts),
        });
        let (handle, thread) = crate::http_thread::spawn_server(format!("control-api-{}", local.port()), move || {
            Ok(HttpServer::new(move || app(state.clone()))
                .workers(WORKERS)
                .keep_alive(KEEP_ALIVE)
                .disable_signals()
                .shutdown_timeout(SHUTDOWN_GRACE_SECS)
                .listen(listener)?
                .run())
        })
        .context("control API")?;
        let url = format!("http://{}", connectable(local));
        tracing::info!(url = %url, token_from = %issued.origin, "control API listening");
        Ok(Self { url, issued, handle: Some(handle), thread: Some(thread) })
    }

    /// `http://HOST:PORT` with the port actually bound (an unspecified bind address is
    /// reported as loopback, which is where a local client reaches it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token requests must carry.
    pub fn token(&self) -> &ControlToken {
        &self.issued.token
    }

    /// Stops accepting requests, lets those under way finish (bounded), and removes the
    /// token file the server wrote.
    pub async fn stop(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.stop(true).await;
        }
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        self.issued.withdraw();
        tracing::info!("control API stopped");
    }
}

impl Drop for ControlServer {
    /// Without [`ControlServer::stop`] (an error during start-up, a panicking test):
    /// ask the server to stop, without waiting. The token file goes with `issued`.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            drop(handle.stop(false));
        }
    }
}

/// Where a local client reaches a server bound to `addr`.
pub fn connectable(addr: SocketAddr) -> SocketAddr {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

struct ApiState {
    supervisor: Addr<Supervisor>,
    metrics: Arc<Metrics>,
    /// Where `POST /v1/config/reload` goes; `None` when the daemon cannot reload.
    reload: Option<ReloadHandle>,
    status: StatusBoard,
    gate: Gate,
    /// The `Host` values answered (DNS rebinding protection).
    hosts: HostCheck,
}

fn app(
    state: web::Data<ApiState>,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    App::new()
        .app_data(state)
        .wrap_fn(|req, srv| {
            let method = req.method().to_string();
            let path = req.path().to_string();
            let started = Instant::now();
            // Before routing and the token: a request for another name is refused.
            let hosts = req.app_data::<web::Data<ApiState>>().map(|s| s.hosts.clone());
            let host = req.headers().get(header::HOST).map(|v| v.as_bytes().to_vec());
            let response = match hosts.filter(|h| !h.admits(host.as_deref())) {
                Some(hosts) => {
                    let shown = host.map(|h| String::from_utf8_lossy(&h).chars().take(80).collect::<String>());
                    tracing::warn!(target: "shepherd::control", host = ?shown, path = %path, "refused a request for a Host this server does not answer (DNS rebinding?)");
                    let refused = ApiError::new(StatusCode::MISDIRECTED_REQUEST, hosts.refusal()).error_response();
                    futures::future::Either::Left(ready(Ok(req.into_response(refused))))
                }
                None => futures::future::Either::Right(srv.call(req)),
            };
            async move {
                let response = response.await;
                let status = match &response {
                    Ok(r) => r.status(),
                    Err(e) => e.as_response_error().status_code(),
                };
                log_request(&method, &path, status, started);
                response
            }
        })
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics))
        .service(
            web::resource("/v1/status").route(web::get().to(fleet_status)).default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions")
                .route(web::get().to(list_sessions))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}")
                .route(web::get().to(get_session))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}/history")
                .route(web::get().to(session_history))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}/prompt")
                .route(web::post().to(send_prompt))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}/handoff")
                .route(web::get().to(handoff_status))
                .route(web::post().to(start_handoff))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}/pause")
                .route(web::post().to(pause_session))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/sessions/{id}/resume")
                .route(web::post().to(resume_session))
                .default_service(web::to(method_not_allowed)),
        )
        .service(web::resource("/v1/pause").route(web::post().to(pause_fleet)).default_service(web::to(method_not_allowed)))
        .service(
            web::resource("/v1/resume").route(web::post().to(resume_fleet)).default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/handoffs/{id}/resume")
                .route(web::post().to(resume_handoff))
                .default_service(web::to(method_not_allowed)),
        )
        .service(
            web::resource("/v1/config/reload")
                .route(web::post().to(reload_config))
                .default_service(web::to(method_not_allowed)),
        )
        .default_service(web::to(not_found))
}

/// Paths polled by monitors and scrapers: logged at debug whatever they answer (a
/// `/readyz` probed every few seconds while a server is down answers 503 each time).
const POLLED: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// One event per request: at info what acts (anything but a read) or was refused;
/// answered reads and the [`POLLED`] paths at debug — monitors, scrapers and `shepherd
/// top` poll them, at its default refresh some 40,000 lines a day of a log people read
/// in the morning.
fn log_request(method: &str, path: &str, status: StatusCode, started: Instant) {
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let quiet = POLLED.contains(&path) || (method == "GET" && status.is_success());
    let status = status.as_u16();
    if quiet {
        tracing::debug!(target: "shepherd::control", method, path, status, elapsed_ms, "control request");
    } else {
        tracing::info!(target: "shepherd::control", method, path, status, elapsed_ms, "control request");
    }
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "ok": true }))
}

/// 200 when every server's stream is connected and reconciled; else 503 naming the
/// servers that are not and why. No token needed: the body holds server *names* and a
/// fixed reason only — no URL, no error text, no session.
async fn readyz(state: web::Data<ApiState>) -> HttpResponse {
    let servers = match state.supervisor.send(InspectServers).await {
        Ok(servers) => servers,
        Err(_) => return HttpResponse::ServiceUnavailable().json(json!({ "ready": false, "error": "shutting down" })),
    };
    match readiness(&servers) {
        Ok(()) => HttpResponse::Ok().json(json!({ "ready": true })),
        Err(not_ready) => HttpResponse::ServiceUnavailable().json(json!({ "ready": false, "not_ready": not_ready })),
    }
}

/// The Prometheus text exposition (a read: the token unless
/// `control.allow_unauthenticated_reads`).
async fn metrics(_: Authorized, state: web::Data<ApiState>) -> Result<HttpResponse, ApiError> {
    // Read on this thread from the registries the supervisor hands out (at 100,000
    // sessions a scrape was half a second of the thread the guard shares).
    let fleet = state.supervisor.send(InspectLiveSources).await?.read().await;
    let body = state.metrics.render(&fleet);
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(body))
}

async fn list_sessions(_: Authorized, state: web::Data<ApiState>) -> Result<HttpResponse, ApiError> {
    let r = crate::logging::redactor();
    // Read on this thread, like a scrape: at 100,000 sessions the full details are half
    // a second of work the guard's thread is spared.
    let details = state.supervisor.send(InspectLiveSources).await?.details().await;
    let sessions: Vec<_> = details.into_iter().map(|d| d.redacted(&r)).collect();
    Ok(HttpResponse::Ok().json(sessions))
}

async fn get_session(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let detail = state.supervisor.send(GetSession(id.into_inner())).await??;
    Ok(HttpResponse::Ok().json(detail.redacted(&crate::logging::redactor())))
}

/// `?history=N` on `/v1/status`: keep the newest N history entries per session (a
/// poller such as `shepherd top` asks for 0; without it, all, as in the status file).
#[derive(serde::Deserialize)]
struct StatusQuery {
    history: Option<usize>,
}

async fn fleet_status(
    _: Authorized,
    state: web::Data<ApiState>,
    query: web::Query<StatusQuery>,
) -> Result<HttpResponse, ApiError> {
    let mut doc = state.status.snapshot().await;
    if let Some(keep) = query.history {
        for s in doc.sessions.values_mut() {
            let drop = s.history.len().saturating_sub(keep);
            s.history.drain(..drop);
        }
    }
    Ok(HttpResponse::Ok().json(doc))
}

/// `?limit=N` on `/v1/sessions/{id}/history`.
#[derive(serde::Deserialize)]
struct HistoryQuery {
    limit: Option<u32>,
}

async fn session_history(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    query: web::Query<HistoryQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_HISTORY_LIMIT);
    let records = state.supervisor.send(SessionJournal { session: id.into_inner(), limit }).await??;
    Ok(HttpResponse::Ok().json(records))
}

async fn send_prompt(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    let request = parse_prompt_request(&body)?;
    let reply = state.supervisor.send(SendCustomPrompt { session: id.into_inner(), request }).await??;
    Ok(HttpResponse::Ok().json(reply))
}

async fn handoff_status(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let detail = state.supervisor.send(GetSession(id.into_inner())).await??;
    Ok(HttpResponse::Ok().json(detail.handoff))
}

async fn start_handoff(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let view = state.supervisor.send(StartHandoff(id.into_inner())).await??;
    Ok(HttpResponse::Accepted().json(view))
}

/// Pause or resume one session (`Some(id)`) or the fleet: the body says for how long
/// and who asked.
async fn set_pause(state: &ApiState, session: Option<String>, pause: bool, body: &[u8]) -> Result<HttpResponse, ApiError> {
    let (span, by) = parse_pause_request(body)?;
    let until_ms = match (pause, span) {
        (true, Some(d)) => Some(now_ms() + d.as_millis() as i64),
        (false, Some(_)) => {
            return Err(BadBody { field: "for".into(), reason: "only a pause has a duration".into() }.into());
        }
        _ => None,
    };
    let target = session.map_or(PauseTarget::Fleet, PauseTarget::Session);
    let view = state.supervisor.send(SetPause { target, pause, until_ms, by }).await??;
    Ok(HttpResponse::Ok().json(view))
}

fn now_ms() -> i64 {
    shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock)
}

async fn pause_session(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    set_pause(&state, Some(id.into_inner()), true, &body).await
}

async fn resume_session(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
    body: Bytes,
) -> Result<HttpResponse, ApiError> {
    set_pause(&state, Some(id.into_inner()), false, &body).await
}

async fn pause_fleet(_: Authorized, state: web::Data<ApiState>, body: Bytes) -> Result<HttpResponse, ApiError> {
    set_pause(&state, None, true, &body).await
}

async fn resume_fleet(_: Authorized, state: web::Data<ApiState>, body: Bytes) -> Result<HttpResponse, ApiError> {
    set_pause(&state, None, false, &body).await
}

async fn resume_handoff(
    _: Authorized,
    state: web::Data<ApiState>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let view = state.supervisor.send(ResumeHandoff(id.into_inner())).await??;
    Ok(HttpResponse::Accepted().json(view))
}

/// Re-reads the daemon's configuration: 200 with what changed, or the error naming the
/// key (400 for a configuration that does not load or cannot be used), 409 when the
/// daemon has no configuration source, 503 while it shuts down.
async fn reload_config(_: Authorized, state: web::Data<ApiState>) -> Result<HttpResponse, ApiError> {
    let Some(reload) = &state.reload else {
        return Err(ApiError::new(StatusCode::CONFLICT, "this daemon cannot reload its configuration"));
    };
    match reload.reload("api").await {
        Ok(diff) => Ok(HttpResponse::Ok().json(diff)),
        Err(e) => {
            let status = match e {
                ReloadError::Invalid(_) | ReloadError::Unusable { .. } => StatusCode::BAD_REQUEST,
                ReloadError::NoSource => StatusCode::CONFLICT,
                ReloadError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            };
            Err(ApiError { status, error: e.to_string(), field: e.key().map(str::to_string) })
        }
    }
}

async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("method {} not allowed on {}", req.method(), req.path()))
        .error_response()
}

async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::new(StatusCode::NOT_FOUND, format!("no such endpoint: {} {}", req.method(), req.path())).error_response()
}

/// Proof that a request passed the [`Gate`]: handlers that take it are protected.
struct Authorized;

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let Some(state) = req.app_data::<web::Data<ApiState>>() else {
            return ready(Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "control API state missing")));
        };
        let access = Access::of_method(req.method().as_str());
        let header = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
        ready(state.gate.check(access, header).map(|()| Authorized).map_err(ApiError::from))
    }
}

/// An error answer: a status and `{"error": "...", "field"?: "..."}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    error: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self { status, error: error.into(), field: None }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.error)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut body = json!({ "error": self.error });
        if let Some(field) = &self.field {
            body["field"] = json!(field);
        }
        let mut response = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        response.json(body)
    }
}

impl From<Denied> for ApiError {
    fn from(d: Denied) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, d.to_string())
    }
}

impl From<BadBody> for ApiError {
    fn from(b: BadBody) -> Self {
        Self { status: StatusCode::BAD_REQUEST, error: b.to_string(), field: Some(b.field) }
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::UnknownSession(_) | ControlError::UnknownSnapshot(_) => {
                Self::new(StatusCode::NOT_FOUND, e.to_string())
            }
            ControlError::Conflict(_) => Self::new(StatusCode::CONFLICT, e.to_string()),
            ControlError::BadRequest { ref field, .. } => {
                Self { status: StatusCode::BAD_REQUEST, field: Some(field.clone()), error: e.to_string() }
            }
            ControlError::ShuttingDown | ControlError::Unavailable(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }
}

impl From<MailboxError> for ApiError {
    fn from(e: MailboxError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, format!("shepherd is shutting down ({e})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_actors::config::StatusConfig;

    const TOKEN_ENV: &str = "SHEPHERD_TEST_HOST_CHECK_TOKEN";

    fn start(cfg: &ControlConfig) -> anyhow::Result<ControlServer> {
        let supervisor = crate::test_support::supervisor();
        let status = StatusBoard::new(&StatusConfig::default(), supervisor.clone(), Arc::default(), "test".into());
        let env = |name: &str| (name == TOKEN_ENV).then(|| OsString::from("secret"));
        ControlServer::start_with_env(cfg, ControlListener::bind(cfg)?, supervisor, Metrics::new(), None, status, &env)
    }

    fn local(bind: &str) -> ControlConfig {
        ControlConfig { bind: bind.into(), token_env: TOKEN_ENV.into(), ..ControlConfig::default() }
    }

    /// `GET /healthz` with this `Host` header (raw, so any value can be sent).
    async fn healthz_as(server: &ControlServer, host: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let addr = server.url().trim_start_matches("http://").to_string();
        let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut answer = String::new();
        sock.read_to_string(&mut answer).await.unwrap();
        let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, answer)
    }

    #[actix::test]
    async fn a_request_for_another_host_is_refused_with_421_and_the_bound_one_is_served() {
        let server = start(&local("127.0.0.1:0")).unwrap();
        let bound = server.url().trim_start_matches("http://").to_string();
        let port = bound.rsplit(':').next().unwrap().to_string();
        for good in [bound.clone(), format!("localhost:{port}"), format!("[::1]:{port}")] {
            let (status, answer) = healthz_as(&server, &good).await;
            assert_eq!(status, 200, "{good}: {answer}");
        }
        for bad in [format!("rebind.attacker.example:{port}"), "127.0.0.1:1".to_string()] {
            let (status, answer) = healthz_as(&server, &bad).await;
            assert_eq!(status, 421, "{bad}: {answer}");
            assert!(answer.contains("DNS rebinding protection"), "{answer}");
        }
        server.stop().await;
    }

    #[actix::test]
    async fn a_non_loopback_bind_is_refused_without_allow_remote() {
        let err = start(&local("0.0.0.0:0")).unwrap_err();
        assert!(err.to_string().contains("control.allow_remote = true"), "{err}");
        let allowed = ControlConfig { allow_remote: true, ..local("0.0.0.0:0") };
        let server = start(&allowed).unwrap();
        server.stop().await;
    }
}
