//! `GET /v1/status`, the session journal endpoint and `shepherd top` against a real
//! daemon supervising the real OpenCode server (driven by the fake model): the JSON a
//! monitor reads, the plain table a pipe gets, and the live view in a pseudo-terminal.

mod support;

use std::io::{Read as _, Write as _};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use shepherd_actors::journal::{Action, Outcome};
use support::control::token_file;
use support::{Rig, PATIENCE};
use tempfile::TempDir;

/// Named by the test config, set nowhere: the daemon generates its token.
const UNSET_TOKEN_ENV: &str = "SHEPHERD_E2E_TOP_TOKEN_NEVER_SET";

async fn start(state: &TempDir) -> anyhow::Result<Rig> {
    support::control::start(state, UNSET_TOKEN_ENV, |_| {}).await
}

async fn get(rig: &Rig, path: &str, token: bool) -> anyhow::Result<(u16, Value)> {
    let daemon = rig.daemon();
    let mut req = reqwest::Client::new().get(format!("{}{path}", daemon.control_url().unwrap()));
    if token {
        req = req.bearer_auth(daemon.control_token().unwrap().expose());
    }
    let response = req.timeout(PATIENCE).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

/// A session with `title`, prompted with `text` (not waited for).
async fn session(rig: &Rig, title: &str, text: &str) -> anyhow::Result<String> {
    let id = rig.client.create_session(Some(title)).await?;
    rig.client.prompt_async(&id, text, None, None, false).await?;
    Ok(id)
}

/// The `shepherd` flags that point a CLI command at the rig's daemon and token file.
fn daemon_flags(rig: &Rig, state: &TempDir) -> Vec<String> {
    let port = rig.daemon().control_url().unwrap().rsplit(':').next().unwrap().to_string();
    vec![
        "--set".into(),
        format!("control.bind=127.0.0.1:{port}"),
        "--set".into(),
        format!("control.token_env={UNSET_TOKEN_ENV}"),
        "--set".into(),
        format!("control.token_file={}", token_file(state).display()),
    ]
}

#[actix::test]
async fn the_status_api_shows_each_session_and_stream_and_the_journal_endpoint_what_was_done() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let mut rig = start(&state).await?;
    let planned = session(&rig, "top e2e: plan the parser", "[[fake:todo:create]] plan it").await?;
    rig.client.wait_busy(&planned, PATIENCE).await.ok();
    rig.client.wait_idle(&planned, PATIENCE).await?;
    let stalled = session(&rig, "top e2e: stalls once", "[[fake:stall]] go").await?;
    rig.wait_record(&stalled, Action::Continue, Outcome::Done, PATIENCE).await?;

    let (status, _) = get(&rig, "/v1/status", false).await?;
    assert_eq!(status, 401, "a read needs the token unless configured otherwise");

    let (status, doc) = get(&rig, "/v1/status", true).await?;
    assert_eq!(status, 200, "{doc}");
    let server = &doc["servers"][0];
    assert_eq!((server["name"].as_str(), server["connected"].as_bool()), (Some("local"), Some(true)), "{server}");
    assert_eq!(server["reconciled"], true, "{server}");
    assert_eq!(server["reconnects"], 0, "{server}");
    let since = server["since_last_event_ms"].as_i64().expect("an event arrived");
    assert!(since < 15_000, "OpenCode sends a heartbeat every 10 s: {server}");

    let p = &doc["sessions"][&planned];
    assert_eq!(p["title"], "top e2e: plan the parser", "{p}");
    assert_eq!(p["state"], "idle", "{p}");
    assert_eq!((p["todos"]["completed"].as_u64(), p["todos"]["total"].as_u64()), (Some(0), Some(3)), "{p}");
    assert!(p["quiet_ms"].as_i64().is_some(), "{p}");
    assert!(p["stall_timeout_ms"].is_null(), "an idle session has no stall timer: {p}");

    let s = &doc["sessions"][&stalled];
    assert!(s["recovery"]["attempts"].as_u64() >= Some(1), "{s}");
    assert_eq!(s["stall"]["detections"], 1, "{s}");
    assert!(!s["last_action"].is_null(), "{s}");
    assert!(!s["history"].as_array().unwrap().is_empty(), "the history is there unless asked away: {s}");
    let counted: u64 = doc["totals"].as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert_eq!(counted as usize, doc["sessions"].as_object().unwrap().len(), "{doc}");

    let (_, lean) = get(&rig, "/v1/status?history=0", true).await?;
    assert!(lean["sessions"].as_object().unwrap().values().all(|s| s["history"].as_array().unwrap().is_empty()));

    let (status, journal) = get(&rig, &format!("/v1/sessions/{stalled}/history?limit=20"), true).await?;
    assert_eq!(status, 200, "{journal}");
    let actions: Vec<&str> = journal.as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).collect();
    let at = |a: &str| actions.iter().position(|x| *x == a).unwrap_or_else(|| panic!("{a} in {actions:?}"));
    assert!(at("stall_detected") < at("abort") && at("abort") < at("continue"), "{actions:?}");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn top_once_and_off_a_terminal_prints_a_plain_table() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let id = session(&rig, "top e2e: plain table", "[[fake:todo:create]] plan it").await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    // The daemon learns the todos from the stream: wait until the API shows them.
    support_wait_todos(&rig, &id, 3).await?;

    let once = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .current_dir(state.path())
        .arg("top")
        .arg("--once")
        .args(daemon_flags(&rig, &state))
        .env_remove(UNSET_TOKEN_ENV)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&once.stdout);
    assert!(once.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&once.stderr));
    assert!(stdout.contains("stream local: up"), "{stdout}");
    let header = stdout.lines().find(|l| l.starts_with("SERVER")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(header.contains("STATE") && header.contains("QUIET/TIMEOUT") && header.contains("TODOS"), "{header}");
    let row = stdout.lines().find(|l| l.contains(&id)).unwrap_or_else(|| panic!("a row for {id}: {stdout}"));
    assert!(row.starts_with("local") && row.contains("top e2e: plain table"), "{row}");
    assert!(row.contains(" idle ") && row.contains(" 0/3 "), "{row}");
    assert!(!stdout.contains('\x1b'), "no escape sequences off a terminal: {stdout:?}");

    // Without --once, off a terminal: the table again every refresh, until stopped.
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .current_dir(state.path())
        .args(["top", "--refresh", "300ms"])
        .args(daemon_flags(&rig, &state))
        .env_remove(UNSET_TOKEN_ENV)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut out = watch.stdout.take().unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + PATIENCE;
    while seen.matches(&id).count() < 2 && Instant::now() < deadline {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(PATIENCE, tokio::io::AsyncReadExt::read(&mut out, &mut buf)).await??;
        if n == 0 {
            break;
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.matches(&id).count() >= 2, "two snapshots: {seen}");
    assert!(watch.try_wait()?.is_none(), "it keeps refreshing");
    watch.kill().await?;
    rig.stop().await;
    Ok(())
}

async fn support_wait_todos(rig: &Rig, id: &str, total: u64) -> anyhow::Result<()> {
    shepherd_testbed::client::wait_until("the todos in /v1/status", PATIENCE, || async {
        let (_, doc) = get(rig, "/v1/status?history=0", true).await?;
        anyhow::Ok((doc["sessions"][id]["todos"]["total"].as_u64() == Some(total)).then_some(()))
    })
    .await
}

/// What a pseudo-terminal shows: the screen (a VT100 emulator fed with every byte the
/// program wrote) and the raw bytes.
struct PtyScreen {
    parser: vt100::Parser,
    raw: Vec<u8>,
}

fn read_into(mut reader: Box<dyn std::io::Read + Send>, screen: Arc<Mutex<PtyScreen>>) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut s = screen.lock().unwrap();
        s.parser.process(&buf[..n]);
        s.raw.extend_from_slice(&buf[..n]);
    }
}

/// Whether the terminal's line discipline is back in canonical mode with echo (what a
/// shell expects after a full-screen program exits).
fn cooked(fd: std::os::unix::io::RawFd) -> bool {
    // SAFETY: `termios` is plain data that tcgetattr fills; `fd` is the pty's master.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::tcgetattr(fd, &mut t) } == 0;
    ok && t.c_lflag & libc::ICANON != 0 && t.c_lflag & libc::ECHO != 0
}

async fn wait_screen(screen: &Arc<Mutex<PtyScreen>>, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let text = screen.lock().unwrap().parser.screen().contents();
        if check(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what} never appeared; the screen:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix::test]
async fn top_in_a_terminal_shows_a_working_session_and_q_exits_and_restores_the_terminal() -> anyhow::Result<()> {
    use portable_pty::{native_pty_system, CommandBuilder, PtySize};

    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let id = session(&rig, "top e2e: in a terminal", "[[fake:slow:60]] take your time").await?;
    rig.client.wait_busy(&id, PATIENCE).await?;

    let pty = native_pty_system().openpty(PtySize { rows: 24, cols: 80, pixel_width: 0, pixel_height: 0 })?;
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.cwd(state.path());
    cmd.arg("top");
    cmd.args(daemon_flags(&rig, &state));
    cmd.args(["--refresh", "300ms"]);
    cmd.env("TERM", "xterm-256color");
    cmd.env("NO_COLOR", "1");
    cmd.env_remove(UNSET_TOKEN_ENV);
    let mut child = pty.slave.spawn_command(cmd)?;
    drop(pty.slave);
    let screen = Arc::new(Mutex::new(PtyScreen { parser: vt100::Parser::new(24, 80, 0), raw: Vec::new() }));
    let reader = pty.master.try_clone_reader()?;
    let feeding = Arc::clone(&screen);
    std::thread::spawn(move || read_into(reader, feeding));
    let fd = pty.master.as_raw_fd().expect("a unix pty");

    let shown = wait_screen(&screen, "the session's row, working", |text| {
        text.lines().any(|l| l.contains("top e2e: in a") && l.contains("working"))
    })
    .await;
    assert!(shown.contains("streams: local up"), "{shown}");
    assert!(shown.lines().any(|l| l.contains("SERVER") && l.contains("QUIET") && l.contains("CONTEXT")), "{shown}");
    assert!(!cooked(fd), "raw mode while the view runs");

    let mut keys = pty.master.take_writer()?;
    keys.write_all(b"\r")?;
    keys.flush()?;
    // The detail pane: the session's id, its stall clock, and its journal as read from
    // the ledger (nothing recorded yet: the session works).
    wait_screen(&screen, "the detail pane with the journal read", |text| {
        text.contains(&id)
            && text.contains("of a 4s stall timeout")
            && text.contains("nothing recorded for this session")
    })
    .await;

    keys.write_all(b"q")?;
    keys.flush()?;
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        assert!(Instant::now() < deadline, "top did not exit on q");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    // The reader drains the last bytes at its own pace: the screen is read once it shows
    // the terminal given back, or once the patience runs out (then the asserts say why).
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let restored = {
            let s = screen.lock().unwrap();
            !s.parser.screen().alternate_screen() && !s.parser.screen().hide_cursor()
        };
        if restored {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    {
        let s = screen.lock().unwrap();
        assert!(!s.parser.screen().alternate_screen(), "back on the main screen");
        assert!(!s.parser.screen().hide_cursor(), "the cursor is shown again");
        assert!(cooked(fd), "the terminal is out of raw mode");
        let raw = String::from_utf8_lossy(&s.raw);
        let colours = ["\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[38;5;"];
        assert!(!colours.iter().any(|c| raw.contains(c)), "NO_COLOR: no colour sequences");
    }
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn with_unauthenticated_reads_allowed_the_status_is_served_without_the_token_but_actions_are_not() {
    let state = TempDir::new().unwrap();
    let mut cfg = shepherd_actors::config::Config::default();
    cfg.control.bind = "127.0.0.1:0".into();
    cfg.control.token_env = UNSET_TOKEN_ENV.into();
    cfg.control.token_file = token_file(&state).to_string_lossy().into_owned();
    cfg.control.allow_unauthenticated_reads = true;
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    let daemon = shepherd::daemon::Daemon::start(&cfg).unwrap();
    let url = daemon.control_url().unwrap().to_string();
    let http = reqwest::Client::builder().timeout(PATIENCE).build().unwrap();

    let status = http.get(format!("{url}/v1/status")).send().await.unwrap();
    assert_eq!(status.status().as_u16(), 200);
    let doc: Value = status.json().await.unwrap();
    assert_eq!(doc["sessions"], serde_json::json!({}), "{doc}");
    assert!(doc["instance"].as_str().is_some_and(|i| !i.is_empty()), "{doc}");
    let handoff = http.post(format!("{url}/v1/sessions/ses_x/handoff")).send().await.unwrap();
    assert_eq!(handoff.status().as_u16(), 401, "acting still needs the token");
    daemon.shutdown().await;
}
