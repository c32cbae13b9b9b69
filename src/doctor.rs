//! `shepherd doctor`: one command that says what stands between this configuration and
//! a working daemon, one line per finding and, for each problem, its fix.
//!
//! It reads what `run` would use (the same `--config`/`--server`/`--set`) and looks, with
//! bounded waits, at every part the daemon depends on: each server (reachable, the
//! password accepted, its version within the supported range, its event stream), the state directory (writable,
//! private), Redis when instances share through it, the advisor's model when one is
//! configured, and the control API's address. It changes nothing: no session is read or
//! touched, no state written (a probe file in the state directory is removed at once),
//! nothing sent to the model but a model list request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use shepherd_actors::config::{Config, GuardBackend, ServerConfig};

use crate::guard::redis::display_url;

mod notify;

/// The longest any one probe waits, whatever the configured timeouts.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the event stream has to send its first bytes (OpenCode sends
/// `server.connected` at once).
const STREAM_FIRST_BYTES: Duration = Duration::from_secs(5);

/// How a finding reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    /// Works, but not as it should (e.g. a state directory others can read).
    Warn,
    /// Stops Shepherd from doing its job.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Finding {
    pub level: Level,
    /// What was looked at: `server local`, `state directory`, `redis` …
    pub subject: String,
    pub detail: String,
    /// What to do about it (problems only).
    pub fix: Option<String>,
}

impl Finding {
    fn ok(subject: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { level: Level::Ok, subject: subject.into(), detail: detail.into(), fix: None }
    }
    fn problem(level: Level, subject: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { level, subject: subject.into(), detail: detail.into(), fix: Some(fix.into()) }
    }
}

/// Every finding for `cfg`, in a stable order: servers, state, Redis, advisor, control,
/// notification targets.
pub async fn examine(cfg: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    if cfg.servers.is_empty() {
        out.push(Finding::problem(
            Level::Fail,
            "servers",
            "no server configured",
            "`shepherd init` writes one for the OpenCode it finds; or add a [[servers]] table, or pass --server URL",
        ));
    }
    for (i, server) in cfg.servers.iter().enumerate() {
        out.extend(examine_server(i, server).await);
    }
    out.extend(examine_state(cfg));
    if cfg.guard.enabled && cfg.guard.backend == GuardBackend::Redis {
        out.push(examine_redis(&cfg.guard.redis_url).await);
    }
    if cfg.advisor.enabled && !cfg.advisor.base_url.is_empty() {
        out.push(examine_advisor(cfg).await);
    }
    if cfg.control.enabled {
        out.push(examine_control(&cfg.control.bind).await);
    }
    out.extend(notify::examine(&cfg.notify).await);
    out
}

/// The report: one line per finding, problems followed by their fix.
pub fn render(findings: &[Finding]) -> String {
    let mut text = String::new();
    for f in findings {
        let tag = match f.level {
            Level::Ok => "ok  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        text.push_str(&format!("{tag}  {}: {}", f.subject, f.detail));
        if let Some(fix) = &f.fix {
            text.push_str(&format!(" — fix: {fix}"));
        }
        text.push('\n');
    }
    let failed = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warned = findings.iter().filter(|f| f.level == Level::Warn).count();
    text.push_str(&match (failed, warned) {
        (0, 0) => "all good\n".to_string(),
        (0, w) => format!("{w} warning(s); Shepherd can run\n"),
        (f, _) => format!("{f} problem(s) to fix before Shepherd can do its job\n"),
    });
    text
}

/// Whether the report holds a problem (the command's exit status).
pub fn failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.level == Level::Fail)
}

async fn examine_server(index: usize, server: &ServerConfig) -> Vec<Finding> {
    let subject = format!("server {}", server.name);
    let url = server.url.trim_end_matches('/');
    let shown = display_url(url);
    let password = match crate::config::resolve_password(server) {
        Ok(p) => p,
        Err(e) => {
            return vec![Finding::problem(
                Level::Fail,
                subject,
                e.to_string(),
                format!("export the variable named by servers[{index}].password_env before starting Shepherd"),
            )]
        }
    };
    let timeout = server.request_timeout.min(PROBE_TIMEOUT);
    let http = match reqwest::Client::builder().timeout(timeout).connect_timeout(timeout).build() {
        Ok(h) => h,
        Err(e) => return vec![Finding::problem(Level::Fail, subject, format!("HTTP client: {e}"), "report this")],
    };
    let authed = |req: reqwest::RequestBuilder| match &password {
        Some(p) => req.basic_auth(&server.username, Some(p)),
        None => req,
    };
    let health = authed(http.get(format!("{url}/global/health"))).send().await;
    let answer = match health {
        Err(e) => {
            return vec![Finding::problem(
                Level::Fail,
                subject,
                format!("unreachable at {shown}: {}", error_chain(&e)),
                format!("start `opencode serve` there, or correct servers[{index}].url"),
            )]
        }
        Ok(a) => a,
    };
    let status = answer.status();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        let (detail, fix) = match &server.password_env {
            Some(var) => (
                format!("the password was refused (HTTP 401) at {shown}"),
                format!("set {var} to the server's OPENCODE_SERVER_PASSWORD (user {})", server.username),
            ),
            None => (
                format!("the server asks for a password (HTTP 401) at {shown}"),
                format!("set servers[{index}].password_env to the name of a variable holding it"),
            ),
        };
        return vec![Finding::problem(Level::Fail, subject, detail, fix)];
    }
    if !status.is_success() {
        return vec![Finding::problem(
            Level::Fail,
            subject,
            format!("GET /global/health answered {status} at {shown}"),
            "check that the URL points at `opencode serve`, not at something in front of it",
        )];
    }
    let version = answer
        .json::<serde_json::Value>()
        .await
        .ok()
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string());
    let mut out = vec![Finding::ok(&subject, format!("reachable at {shown}, OpenCode {version}"))];
    // Judged as the daemon judges it at every connect (`version::assess`).
    if let Some((problem, fix)) = crate::opencode::version::assess(&version).problem(&version) {
        out.push(Finding::problem(Level::Warn, format!("{subject} version"), problem, fix));
    }
    out.push(examine_stream(&subject, &http, url, authed).await);
    out
}

/// The event stream answers and sends its first bytes.
async fn examine_stream(
    subject: &str,
    http: &reqwest::Client,
    url: &str,
    authed: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> Finding {
    // The client's total timeout would cut the stream: this request has its own bound.
    let request = authed(http.get(format!("{url}/global/event")).header("accept", "text/event-stream"))
        .timeout(STREAM_FIRST_BYTES * 2);
    let first = async {
        let mut answer = request.send().await.map_err(|e| error_chain(&e))?;
        if !answer.status().is_success() {
            return Err(format!("GET /global/event answered {}", answer.status()));
        }
        match answer.chunk().await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err("the stream ended at once".to_string()),
            Err(e) => Err(error_chain(&e)),
        }
    };
    match tokio::time::timeout(STREAM_FIRST_BYTES, first).await {
        Ok(Ok(())) => Finding::ok(format!("{subject} event stream"), "connected, events arrive"),
        Ok(Err(e)) => Finding::problem(
            Level::Fail,
            format!("{subject} event stream"),
            e,
            "a proxy in front of OpenCode must pass Server-Sent Events through unbuffered",
        ),
        Err(_) => Finding::problem(
            Level::Fail,
            format!("{subject} event stream"),
            format!("no event within {}s", STREAM_FIRST_BYTES.as_secs()),
            "a proxy in front of OpenCode must pass Server-Sent Events through unbuffered",
        ),
    }
}

/// The folders the daemon writes: the ledger's and, with `status.enabled`, the status
/// file's.
fn examine_state(cfg: &Config) -> Vec<Finding> {
    let env = |name: &str| std::env::var_os(name);
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    match crate::store::ledger_path(&cfg.store, &env) {
        Ok(p) => dirs.push(("ledger".into(), p)),
        Err(e) => {
            return vec![Finding::problem(Level::Fail, "state directory", e.to_string(), "set store.path")];
        }
    }
    if cfg.status.enabled {
        if let Ok(p) = crate::status::status_path(&cfg.status, &env) {
            dirs.push(("status file".into(), p));
        }
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (what, file) in dirs {
        let Some(dir) = file.parent().map(Path::to_path_buf) else { continue };
        if seen.contains(&dir) {
            continue;
        }
        seen.push(dir.clone());
        out.push(examine_dir(&what, &dir));
    }
    out
}

fn examine_dir(what: &str, dir: &Path) -> Finding {
    use std::os::unix::fs::PermissionsExt;
    let subject = format!("state directory ({what})");
    let shown = dir.display();
    if !dir.exists() {
        // Created at start: the nearest existing folder above must be writable.
        let mut above = dir.parent();
        while let Some(p) = above.filter(|p| !p.exists()) {
            above = p.parent();
        }
        return match above {
            Some(p) if writable(p) => Finding::ok(subject, format!("{shown} will be created at start")),
            Some(p) => Finding::problem(
                Level::Fail,
                subject,
                format!("{shown} does not exist and {} is not writable", p.display()),
                format!("mkdir -p -m 700 {shown}, or set store.path"),
            ),
            None => Finding::problem(Level::Fail, subject, format!("{shown}: no existing folder above"), "set store.path"),
        };
    }
    if !dir.is_dir() {
        return Finding::problem(Level::Fail, subject, format!("{shown} is not a folder"), "set store.path");
    }
    if !writable(dir) {
        return Finding::problem(
            Level::Fail,
            subject,
            format!("{shown} is not writable by this user"),
            "chown it to this user, or set store.path",
        );
    }
    match std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o777) {
        Ok(mode) if mode & 0o077 != 0 => Finding::problem(
            Level::Warn,
            subject,
            format!("{shown} is readable by others (mode {mode:o}); it holds what the agents worked on"),
            format!("chmod 700 {shown}"),
        ),
        _ => Finding::ok(subject, format!("{shown} is writable and private")),
    }
}

/// Whether a file can be created in `dir` (the probe is removed at once).
fn writable(dir: &Path) -> bool {
    tempfile::Builder::new().prefix(".shepherd-doctor").tempfile_in(dir).is_ok()
}

async fn examine_redis(url: &str) -> Finding {
    let shown = display_url(url);
    let ping = async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(PROBE_TIMEOUT, ping).await {
        Ok(Ok(_)) => Finding::ok("redis", format!("{shown} answers")),
        Ok(Err(e)) => Finding::problem(
            Level::Fail,
            "redis",
            format!("{shown}: {e}"),
            "start redis-server there or correct guard.redis_url (instances fall back to a local limit meanwhile)",
        ),
        Err(_) => Finding::problem(
            Level::Fail,
            "redis",
            format!("{shown}: no answer within {}s", PROBE_TIMEOUT.as_secs()),
            "check guard.redis_url and the network between",
        ),
    }
}

async fn examine_advisor(cfg: &Config) -> Finding {
    let a = &cfg.advisor;
    let base = a.base_url.trim_end_matches('/');
    let key = match a.api_key_env.trim() {
        "" => None,
        var => match std::env::var(var).ok().filter(|k| !k.trim().is_empty()) {
            Some(k) => Some(k),
            None => {
                return Finding::problem(
                    Level::Fail,
                    "advisor",
                    format!("advisor.api_key_env names {var}, which is not set"),
                    format!("export {var}, or clear advisor.base_url to use the heuristics alone"),
                )
            }
        },
    };
    let http = reqwest::Client::new();
    let mut request = http.get(format!("{base}/models")).timeout(a.timeout.min(PROBE_TIMEOUT));
    if let Some(k) = &key {
        request = request.bearer_auth(k);
    }
    // A model out of reach is a warning: the heuristics advise meanwhile, and Shepherd
    // does its job. A key refused is a failure: no call will ever be answered.
    match request.send().await {
        Err(e) => Finding::problem(
            Level::Warn,
            "advisor",
            format!("{base} unreachable: {}", error_chain(&e)),
            "correct advisor.base_url if it is wrong (the heuristics advise meanwhile)",
        ),
        Ok(r) if matches!(r.status().as_u16(), 401 | 403) => Finding::problem(
            Level::Fail,
            "advisor",
            format!("{base} refused the key (HTTP {})", r.status().as_u16()),
            format!("check the key in {}", a.api_key_env),
        ),
        Ok(r) if r.status().is_server_error() => Finding::problem(
            Level::Warn,
            "advisor",
            format!("{base} answered {}", r.status()),
            "the provider is down; the heuristics advise meanwhile",
        ),
        Ok(_) => Finding::ok("advisor", format!("{base} answers (model {})", a.model)),
    }
}

async fn examine_control(bind: &str) -> Finding {
    let url = format!("http://{bind}/healthz");
    let http = reqwest::Client::new();
    match http.get(&url).timeout(Duration::from_secs(2)).send().await {
        Ok(r) if r.status().is_success() => {
            Finding::ok("control API", format!("{bind}: a Shepherd is running and answers there"))
        }
        Ok(r) => Finding::problem(
            Level::Fail,
            "control API",
            format!("{bind} is taken by something else (it answered {})", r.status()),
            "set control.bind to a free address",
        ),
        Err(e) if e.is_connect() => Finding::ok("control API", format!("{bind} is free for the daemon")),
        Err(e) => Finding::problem(
            Level::Warn,
            "control API",
            format!("{bind}: {}", error_chain(&e)),
            "check control.bind",
        ),
    }
}

/// What went wrong, briefly: the innermost cause ("Connection refused (os error 111)"),
/// which `reqwest` keeps at the end of its source chain under generic wrappers.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut root = e;
    while let Some(s) = root.source() {
        root = s;
    }
    root.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model out of reach leaves Shepherd working on its heuristics: a warning, and
    /// the report passes.
    #[tokio::test]
    async fn an_advisor_out_of_reach_is_a_warning_not_a_failure() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut cfg = Config::default();
        cfg.advisor.enabled = true;
        cfg.advisor.base_url = format!("http://{closed}/v1");
        cfg.advisor.api_key_env = String::new();
        let finding = examine_advisor(&cfg).await;
        assert_eq!(finding.level, Level::Warn, "{finding:?}");
        assert!(finding.detail.contains("unreachable"), "{finding:?}");
        assert!(!failed(&[finding]));
    }
}
