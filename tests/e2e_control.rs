//! The control API and its CLI against the real OpenCode server, driven by the fake model.
//!
//! Each test runs a daemon whose control API listens on `127.0.0.1:0` with a generated
//! token written to a private temporary file (the variable the config names is never
//! set), so tests run in parallel without sharing a port or a token.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::client::{wait_until, Message};
use support::control::{token_file, Api};
use support::{Rig, PATIENCE};
use tempfile::TempDir;

/// Named by the test config, set nowhere: the daemon generates its token.
const UNSET_TOKEN_ENV: &str = "SHEPHERD_E2E_CONTROL_TOKEN_NEVER_SET";

async fn start(state: &TempDir) -> anyhow::Result<Rig> {
    support::control::start(state, UNSET_TOKEN_ENV, |_| {}).await
}

impl Api {
    async fn send(&self, req: reqwest::RequestBuilder, token: Option<&str>) -> anyhow::Result<(u16, Value)> {
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let response = req.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        let body =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{status} body is not JSON ({e}): {text}"))?;
        Ok((status, body))
    }

    async fn get_as(&self, path: &str, token: Option<&str>) -> anyhow::Result<(u16, Value)> {
        self.send(self.http.get(format!("{}{path}", self.url)), token).await
    }

    async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.get_as(path, Some(&self.token)).await
    }

    async fn post_as(&self, path: &str, token: Option<&str>, body: &str) -> anyhow::Result<(u16, Value)> {
        let req = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body.to_string());
        self.send(req, token).await
    }

    async fn post(&self, path: &str, body: &str) -> anyhow::Result<(u16, Value)> {
        self.post_as(path, Some(&self.token), body).await
    }

    /// Waits until the daemon describes the session as idle with `todos` todos.
    async fn wait_session(&self, id: &str, todos: usize) -> anyhow::Result<Value> {
        wait_until(&format!("session {id} idle with {todos} todos in the control API"), PATIENCE, || async {
            let (status, body) = self.get(&format!("/v1/sessions/{id}")).await?;
            let ready = status == 200 && body["busy"] == false && body["todos"].as_array().map_or(0, Vec::len) == todos;
            anyhow::Ok(ready.then_some(body))
        })
        .await
    }
}

fn kind_of(m: &Message) -> Option<String> {
    m.parts.iter().find_map(|p| p.pointer("/metadata/shepherd/kind").and_then(Value::as_str).map(str::to_string))
}

async fn user_messages(rig: &Rig, id: &str) -> anyhow::Result<Vec<Message>> {
    Ok(rig.client.messages(id).await?.into_iter().filter(|m| m.role() == "user").collect())
}

/// A session that ran one turn and is idle.
async fn ran_once(rig: &Rig, text: &str) -> anyhow::Result<String> {
    let id = rig.client.create_session(Some("control")).await?;
    rig.client.prompt_async(&id, text, None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    Ok(id)
}

#[actix::test]
async fn control_api_refuses_requests_without_the_right_token_and_sends_nothing() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let id = ran_once(&rig, "[[fake:ok]] hello").await?;
    api.wait_session(&id, 0).await?;
    let turns_before = rig.fake.turn_requests().len();

    let prompt = format!("/v1/sessions/{id}/prompt");
    let body = r#"{"message":"[[fake:ok]] must never arrive"}"#;
    for token in [None, Some("wrong"), Some(""), Some(&api.token[..api.token.len() - 1])] {
        let (status, error) = api.post_as(&prompt, token, body).await?;
        assert_eq!(status, 401, "token {token:?}: {error}");
        assert!(error["error"].as_str().is_some_and(|e| !e.contains(&api.token)), "{error}");
        let (status, _) = api.get_as("/v1/sessions", token).await?;
        assert_eq!(status, 401, "token {token:?}");
        let (status, _) = api.get_as(&format!("/v1/sessions/{id}"), token).await?;
        assert_eq!(status, 401, "token {token:?}");
    }
    // Health needs no token; everything else does.
    assert_eq!(api.get_as("/healthz", None).await?, (200, json!({"ok": true})));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let users = user_messages(&rig, &id).await?;
    assert_eq!(users.len(), 1, "nothing was sent: {:?}", users.iter().map(Message::text).collect::<Vec<_>>());
    assert_eq!(rig.fake.turn_requests().len(), turns_before);
    assert!(!rig.client.is_busy(&id).await?);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn sessions_are_listed_after_they_ran_and_an_unknown_session_is_404() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let id = ran_once(&rig, "[[fake:todo:create]] plan it").await?;

    let detail = api.wait_session(&id, 3).await?;
    assert_eq!(detail["server"], "local");
    assert_eq!(detail["id"], id.as_str());
    assert_eq!(detail["paused"], Value::Null);
    let (status, list) = api.get("/v1/sessions").await?;
    assert_eq!(status, 200);
    let listed = list.as_array().unwrap().iter().find(|s| s["id"] == id.as_str()).expect("the session is listed");
    assert_eq!(listed["todos"][0]["content"], "Write the parser");
    assert_eq!(listed["busy"], false);

    let (status, error) = api.get("/v1/sessions/ses_does_not_exist").await?;
    assert_eq!((status, error), (404, json!({"error": "unknown session: ses_does_not_exist"})));
    let (status, error) = api.post("/v1/sessions/ses_does_not_exist/prompt", r#"{"message":"[[fake:ok]] hi"}"#).await?;
    assert_eq!((status, error), (404, json!({"error": "unknown session: ses_does_not_exist"})));
    rig.stop().await;
    Ok(())
}

/// The control API's own log: a read answered is a debug line (`shepherd top` polls it all
/// night), what acts or is refused an info line.
#[actix::test]
async fn answered_reads_are_logged_at_debug_and_actions_and_refusals_at_info() -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::DEBUG);
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    assert_eq!(api.get("/v1/sessions?read=answered").await?.0, 200);
    assert_eq!(api.get_as("/v1/sessions?read=refused", None).await?.0, 401);
    assert_eq!(api.post("/v1/sessions/ses_log_level_probe/prompt", r#"{"message":"hi"}"#).await?.0, 404);
    rig.stop().await;
    let level_of = |method: &str, status: u16, path: &str| -> Option<String> {
        support::logs::logged()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == "control request" && v["fields"]["method"] == method)
            .filter(|v| v["fields"]["status"] == status)
            .filter(|v| v["fields"]["path"].as_str().is_some_and(|p| p.contains(path)))
            .find_map(|v| v["level"].as_str().map(str::to_string))
    };
    assert_eq!(level_of("GET", 200, "/v1/sessions").as_deref(), Some("DEBUG"));
    assert_eq!(level_of("GET", 401, "/v1/sessions").as_deref(), Some("INFO"));
    assert_eq!(level_of("POST", 404, "ses_log_level_probe").as_deref(), Some("INFO"));
    Ok(())
}

#[actix::test]
async fn a_bad_prompt_body_is_refused_with_400_naming_the_field() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let id = ran_once(&rig, "[[fake:ok]] hello").await?;
    api.wait_session(&id, 0).await?;
    let prompt = format!("/v1/sessions/{id}/prompt");

    let cases = [
        (r#"{"message":"[[fake:ok]] x","with_todos":true}"#, "with_todos", "unknown field"),
        (r#"{"message":"[[fake:ok]] x","include_todo_context":"yes"}"#, "include_todo_context", "expected a boolean"),
        (r#"{"message":["[[fake:ok]] x"]}"#, "message", "expected a string"),
        (r#"{"include_todo_context":true}"#, "message", "required"),
        (r#"{"message":"[[fake:ok]] x""#, "body", "not valid JSON"),
    ];
    for (body, field, reason) in cases {
        let (status, error) = api.post(&prompt, body).await?;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["field"], field, "{body}: {error}");
        let text = error["error"].as_str().unwrap();
        assert!(text.starts_with(&format!("{field}: ")) && text.contains(reason), "{body}: {text}");
    }

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(user_messages(&rig, &id).await?.len(), 1, "nothing was sent");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_custom_prompt_with_variables_arrives_in_the_session_rendered_and_tagged() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let id = ran_once(&rig, "[[fake:todo:create]] plan it").await?;
    api.wait_session(&id, 3).await?;

    let body = json!({
        "custom_prompt": "[[fake:ok]] {pending} of {total} open: {todoList}",
        "include_todo_context": true,
    });
    let (status, reply) = api.post(&format!("/v1/sessions/{id}/prompt"), &body.to_string()).await?;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["success"], true, "{reply}");
    assert_eq!(reply["todos"].as_array().map(Vec::len), Some(3), "{reply}");
    let sent = reply["message"].as_str().unwrap().to_string();
    assert!(sent.starts_with("[[fake:ok]] 3 of 3 open: - [in progress] Write the parser"), "{sent}");

    let custom = wait_until("the custom prompt in the session", PATIENCE, || async {
        let users = user_messages(&rig, &id).await?;
        anyhow::Ok(users.into_iter().find(|m| kind_of(m).as_deref() == Some("custom")))
    })
    .await?;
    let text = custom.text();
    assert_eq!(text, sent, "the session got what the reply says was sent");
    for expected in ["3 of 3 open", "Write the parser", "Add tests", "Update docs"] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    assert!(!text.contains('{') && !text.contains('}'), "every variable rendered: {text}");
    rig.client.wait_idle(&id, PATIENCE).await?;
    let last = rig.client.messages(&id).await?.pop().unwrap();
    assert_eq!((last.role(), last.finish()), ("assistant", Some("stop")), "the model answered it");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn the_control_api_answers_while_the_daemons_own_thread_is_blocked() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let token_file = token_file(&state);
    let mut cfg = shepherd_actors::config::Config::default();
    cfg.control.bind = "127.0.0.1:0".into();
    cfg.control.token_env = UNSET_TOKEN_ENV.into();
    cfg.control.token_file = token_file.to_string_lossy().into_owned();
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    let daemon = shepherd::daemon::Daemon::start(&cfg)?;
    let addr = daemon.control_url().unwrap().trim_start_matches("http://").to_string();
    let probe = std::thread::spawn(move || -> std::io::Result<String> {
        use std::io::{Read as _, Write as _};
        let mut conn = std::net::TcpStream::connect(&addr)?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        conn.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    });
    // The supervisor's thread (this one) is blocked until the probe is answered or gives
    // up: an API served from it could not answer.
    let answer = probe.join().unwrap()?;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with(r#"{"ok":true}"#), "{answer}");
    assert!(token_file.exists());
    daemon.shutdown().await;
    assert!(!token_file.exists(), "the token file goes with the daemon");
    Ok(())
}

/// Runs the `shepherd` binary in `dir` (no stray `shepherd.toml`), pointed at the
/// daemon's port and token file, with `env` added.
async fn shepherd_cli(
    dir: &Path,
    api_url: &str,
    token_file: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> anyhow::Result<Output> {
    let port = api_url.rsplit(':').next().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.current_dir(dir)
        .args(args)
        .arg("--set")
        .arg(format!("control.bind=127.0.0.1:{port}"))
        .arg("--set")
        .arg(format!("control.token_env={UNSET_TOKEN_ENV}"))
        .arg("--set")
        .arg(format!("control.token_file={}", token_file.display()))
        .env("RUST_BACKTRACE", "0")
        .env_remove(UNSET_TOKEN_ENV)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Ok(tokio::time::timeout(PATIENCE, cmd.output()).await??)
}

fn out(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[actix::test]
async fn the_cli_lists_sessions_and_sends_prompts_through_the_running_daemon() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let file = token_file(&state);
    let id = ran_once(&rig, "[[fake:todo:create]] plan it").await?;
    api.wait_session(&id, 3).await?;
    let cli = |env: &'static [(&'static str, &'static str)], args: Vec<String>| {
        let (dir, url, file) = (state.path().to_path_buf(), api.url.clone(), file.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            shepherd_cli(&dir, &url, &file, env, &args).await
        }
    };

    // The token the daemon generated is in its file, for the owner only.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file)?.permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file)?.trim(), api.token);

    let o = cli(&[], vec!["sessions".into()]).await?;
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{stderr}");
    let line = stdout.lines().find(|l| l.contains(&id)).unwrap_or_else(|| panic!("{id} listed in:\n{stdout}"));
    assert!(line.starts_with("local") && line.contains(" idle ") && line.contains(" 3/3 "), "{line}");

    let o = cli(&[], vec!["sessions".into(), "--json".into()]).await?;
    let listed: Value = serde_json::from_slice(&o.stdout)?;
    assert!(listed.as_array().unwrap().iter().any(|s| s["id"] == id.as_str()), "{listed}");

    let o = cli(
        &[],
        vec!["prompt".into(), id.clone(), "[[fake:ok]] from the cli: {pending} left".into(), "--with-todos".into()],
    )
    .await?;
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains(&format!("sent to {id}")) && stdout.contains("from the cli: 3 left"), "{stdout}");
    wait_until("the CLI's prompt in the session", PATIENCE, || async {
        let users = user_messages(&rig, &id).await?;
        anyhow::Ok(
            users
                .iter()
                .find(|m| kind_of(m).as_deref() == Some("custom") && m.text().contains("from the cli: 3 left"))
                .map(|_| ()),
        )
    })
    .await?;

    let o = cli(&[], vec!["prompt".into(), "ses_does_not_exist".into(), "[[fake:ok]] hi".into()]).await?;
    assert!(!o.status.success());
    assert!(out(&o).1.contains("unknown session: ses_does_not_exist"), "{}", out(&o).1);

    let o = cli(&[(UNSET_TOKEN_ENV, "wrong")], vec!["sessions".into()]).await?;
    assert!(!o.status.success());
    assert!(out(&o).1.contains(&format!("refused the token from the variable {UNSET_TOKEN_ENV}")), "{}", out(&o).1);

    rig.client.wait_idle(&id, PATIENCE).await?;
    rig.stop().await;

    // Stopped: the token file is gone, and the CLI says what is wrong.
    assert!(!file.exists(), "the daemon removed its token file");
    let o = cli(&[], vec!["sessions".into()]).await?;
    assert!(!o.status.success());
    assert!(out(&o).1.contains("is the daemon running"), "{}", out(&o).1);
    let o = cli(&[(UNSET_TOKEN_ENV, "some-token")], vec!["sessions".into()]).await?;
    assert!(!o.status.success());
    assert!(out(&o).1.contains("cannot reach the Shepherd daemon"), "{}", out(&o).1);
    Ok(())
}

#[actix::test]
async fn the_cli_hands_a_session_over_now_and_reports_where_it_stands() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let rig = start(&state).await?;
    let api = Api::of(&rig);
    let file = token_file(&state);
    // A small session: a person may hand it over whatever its fill.
    let id = ran_once(&rig, "[[fake:todo:create]] Port the lexer").await?;
    api.wait_session(&id, 3).await?;
    let cli = |args: Vec<String>| {
        let (dir, url, file) = (state.path().to_path_buf(), api.url.clone(), file.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            shepherd_cli(&dir, &url, &file, &[], &args).await
        }
    };
    let o = cli(vec!["handoff".into(), id.clone()]).await?;
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("hand-off started: phase persisting") && stdout.contains("id: hf_"), "{stdout}");

    let status = wait_until("the hand-off to complete", PATIENCE, || async {
        let o = cli(vec!["handoff".into(), id.clone(), "--status".into()]).await?;
        let (stdout, _) = out(&o);
        anyhow::Ok(stdout.contains("phase completed").then_some(stdout))
    })
    .await?;
    let new = status
        .lines()
        .find_map(|l| l.trim().strip_prefix("new session: "))
        .unwrap_or_else(|| panic!("{status}"))
        .to_string();
    let users = user_messages(&rig, &new).await?;
    assert!(
        users
            .iter()
            .any(|m| kind_of(m).as_deref() == Some("handoff_continuation") && m.text().contains("Port the lexer")),
        "the fresh session got the continuation"
    );

    // A second request while nothing runs is a new hand-off; an unknown snapshot is 404.
    let o = cli(vec!["handoff".into(), "--resume".into(), "hf_nope".into()]).await?;
    assert!(!o.status.success());
    assert!(out(&o).1.contains("unknown hand-off snapshot: hf_nope"), "{}", out(&o).1);
    rig.stop().await;
    Ok(())
}

/// The off switch through the CLI against a running daemon: a paused session that
/// stalls is left alone (no abort, no continue) well past its stall timeout; resumed,
/// it is recovered at once. The fleet's switch answers the same way.
#[actix::test]
async fn a_session_paused_from_the_cli_is_left_alone_in_its_stall_and_recovered_once_resumed() -> anyhow::Result<()>
{
    let state = TempDir::new()?;
    let mut rig = start(&state).await?;
    let api = Api::of(&rig);
    let file = token_file(&state);
    let cli = |args: &[&str]| {
        let (dir, url, file) = (state.path().to_path_buf(), api.url.clone(), file.clone());
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = shepherd_cli(&dir, &url, &file, &[], &args).await?;
            let (stdout, stderr) = out(&o);
            anyhow::ensure!(o.status.success(), "shepherd {args:?}: {stderr}");
            anyhow::Ok(stdout)
        }
    };
    let id = rig.client.create_session(Some("paused")).await?;
    let said = cli(&["pause", &id]).await?;
    assert_eq!(said.trim(), format!("session {id} paused (person)"));

    rig.client.prompt_async(&id, "[[fake:stall]] work while paused", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;
    tokio::time::sleep(rig.cfg.recovery.stall_timeout * 3).await;
    assert_eq!(rig.count(&id, Action::Recover), 0, "paused: not recovered");
    assert_eq!(rig.count(&id, Action::Continue), 0);
    let (_, detail) = api.get(&format!("/v1/sessions/{id}")).await?;
    assert_eq!(detail["paused"], "person", "{detail}");

    let said = cli(&["resume", &id]).await?;
    assert_eq!(said.trim(), format!("session {id} resumed"));
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    let records = rig.records_for(&id);
    let kinds: Vec<Action> = records.iter().filter(|(_, o, _)| *o == Outcome::Done).map(|(a, _, _)| *a).collect();
    assert_eq!(kinds.iter().filter(|a| **a == Action::Continue).count(), 1, "continued once: {records:?}");
    assert!(kinds.contains(&Action::Abort), "the stalled turn was aborted: {records:?}");

    let said = cli(&["pause", "--all", "--for", "1h"]).await?;
    assert!(said.starts_with("the fleet paused (fleet) until "), "{said}");
    let (_, detail) = api.get(&format!("/v1/sessions/{id}")).await?;
    assert_eq!(detail["paused"], "fleet", "{detail}");
    let said = cli(&["resume", "--all"]).await?;
    assert_eq!(said.trim(), "the fleet resumed");
    let (_, detail) = api.get(&format!("/v1/sessions/{id}")).await?;
    assert!(detail["paused"].is_null(), "{detail}");
    rig.stop().await;
    Ok(())
}
