//! Hot reload against the real OpenCode server: a reload changes the stall timeout the
//! next decision uses, an invalid one changes nothing, servers added and removed by a
//! reload start and stop being supervised, `SIGHUP` reloads a real `shepherd run`, and
//! toasts reach OpenCode's TUI API.

mod support;

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt as _;
use shepherd::config::diff::Change;
use shepherd_actors::config::ServerConfig;
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
use support::{Rig, PATIENCE};
use tempfile::TempDir;

const LONG: Duration = Duration::from_secs(3600);
const SHORT: Duration = Duration::from_secs(4);

fn stalled_prompt() -> &'static str {
    "[[fake:stall]] work on it"
}

#[actix::test]
async fn a_reload_changes_the_stall_timeout_of_the_next_decision_and_an_invalid_one_changes_nothing(
) -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let mut rig = Rig::start_reloadable(&file, |c| c.recovery.stall_timeout = LONG).await?;
    let id = rig.client.create_session(Some("reload")).await?;
    rig.client.prompt_async(&id, stalled_prompt(), None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await?;

    // Invalid: a shorter timeout, but also a value out of range. Rejected whole, naming
    // the key; the running configuration stays.
    let mut bad = rig.cfg.clone();
    bad.recovery.stall_timeout = SHORT;
    let text = shepherd::config::render_effective(&bad).replace("max_auto_submits = 3", "max_auto_submits = 0");
    std::fs::write(&file, text)?;
    let err = rig.daemon().reload().await.expect_err("an invalid config is rejected");
    assert_eq!(err.key(), Some("recovery.max_auto_submits"), "{err}");
    assert!(err.to_string().contains("must be at least 1"), "{err}");
    assert_eq!(rig.daemon().config().await.recovery.stall_timeout, LONG);
    // Stalled for longer than the rejected timeout: the old one still applies.
    tokio::time::sleep(SHORT + Duration::from_secs(3)).await;
    assert!(rig.records_for(&id).is_empty(), "{:?}", rig.records_for(&id));

    // Valid: the same shorter timeout. The session stalled since long before is
    // recovered by the next decision, and its record carries the new timeout.
    Rig::write_config(&file, &bad)?;
    let diff = rig.daemon().reload().await?;
    assert_eq!(
        diff.live,
        vec![Change { key: "recovery.stall_timeout".into(), old: "\"1h\"".into(), new: "\"4s\"".into() }]
    );
    assert!(diff.needs_restart.is_empty());
    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert_eq!(stall.numbers.timeout_ms, Some(4000), "{stall:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;

    // The same file again: nothing changes.
    assert!(rig.daemon().reload().await?.is_empty());
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_setting_read_only_at_start_up_is_reported_as_needing_a_restart_and_kept() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let rig = Rig::start_reloadable(&file, |c| c.recovery.stall_timeout = LONG).await?;
    let mut next = rig.cfg.clone();
    next.store.backend = shepherd_actors::config::StoreBackend::Sqlite;
    next.store.path = dir.path().join("other.sqlite3").to_string_lossy().into_owned();
    next.nudge.cooldown = Duration::from_secs(7);
    Rig::write_config(&file, &next)?;
    let diff = rig.daemon().reload().await?;
    let keys = |v: &[Change]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&diff.needs_restart), ["store.backend", "store.path"]);
    assert_eq!(keys(&diff.live), ["nudge.cooldown"]);
    let running = rig.daemon().config().await;
    assert_eq!(running.store, rig.cfg.store, "the ledger in use stays");
    assert_eq!(running.nudge.cooldown, Duration::from_secs(7));
    assert!(!dir.path().join("other.sqlite3").exists(), "no second ledger was opened");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_server_added_by_a_reload_is_supervised_and_a_removed_one_no_longer_is() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let mut rig = Rig::start_reloadable(&file, |c| c.recovery.stall_timeout = SHORT).await?;
    let mut second = OpenCodeServer::start(OpenCodeOptions::for_fake(&rig.fake)).await?;
    let client2 = second.client();

    let mut with_second = rig.cfg.clone();
    let mut entry = ServerConfig::new("second", second.url());
    entry.reconnect_max = Duration::from_secs(2);
    with_second.servers.push(entry);
    Rig::write_config(&file, &with_second)?;
    let diff = rig.daemon().reload().await?;
    assert_eq!(diff.servers_added, ["second"]);
    assert!(diff.servers_removed.is_empty() && diff.servers_changed.is_empty());
    rig.wait_connected().await?;
    assert_eq!(rig.daemon().fleet().await.servers.len(), 2);

    // A stalled session on the new server is seen and recovered.
    let id = client2.create_session(Some("on second")).await?;
    client2.prompt_async(&id, stalled_prompt(), None, None, false).await?;
    let continued = rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert_eq!(continued.server, "second");
    client2.wait_idle(&id, PATIENCE).await?;

    // Removed again: its pump stops and its sessions leave the fleet.
    Rig::write_config(&file, &rig.cfg)?;
    let diff = rig.daemon().reload().await?;
    assert_eq!(diff.servers_removed, ["second"]);
    let fleet = rig.daemon().fleet().await;
    assert_eq!(fleet.servers.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["local"]);
    assert!(fleet.sessions.iter().all(|s| s.server != "second"), "{:?}", fleet.sessions);
    assert!(rig.daemon().pump_stats().iter().all(|(name, _)| name != "second"));
    // A session that stalls there now is left alone.
    let other = client2.create_session(Some("unsupervised")).await?;
    client2.prompt_async(&other, stalled_prompt(), None, None, false).await?;
    client2.wait_busy(&other, PATIENCE).await?;
    tokio::time::sleep(SHORT + Duration::from_secs(3)).await;
    assert!(rig.records_for(&other).is_empty(), "{:?}", rig.records_for(&other));
    assert!(client2.is_busy(&other).await?, "still stalled: nobody recovered it");

    second.stop().await;
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn with_toasts_on_a_recovery_shows_a_toast_that_opencode_publishes_to_its_tui() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.toasts.enabled = true;
        c.toasts.duration = Duration::from_secs(3);
    })
    .await?;
    let mut events = Box::pin(rig.client.global_events().await?);
    let id = rig.client.create_session(Some("toast")).await?;
    rig.client.prompt_async(&id, stalled_prompt(), None, None, false).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;

    // OpenCode accepted the toast: it published it to the TUI of the session's project.
    let toast = tokio::time::timeout(PATIENCE, async {
        while let Some(event) = events.next().await {
            let event = event?;
            if event["payload"]["type"] == "tui.toast.show" {
                return anyhow::Ok(event);
            }
        }
        anyhow::bail!("the event stream ended")
    })
    .await??;
    let props = &toast["payload"]["properties"];
    assert_eq!(props["variant"], "warning");
    assert_eq!(props["duration"], 3000);
    assert!(props["message"].as_str().unwrap().contains("(continue)"), "{toast}");
    assert_eq!(toast["directory"], rig.opencode.project_dir().to_string_lossy().as_ref(), "{toast}");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn toasts_are_off_by_default_and_a_reload_turns_them_on() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let mut rig = Rig::start_reloadable(&file, |c| c.recovery.stall_timeout = SHORT).await?;
    let mut events = Box::pin(rig.client.global_events().await?);
    let first = rig.client.create_session(Some("no toast")).await?;
    rig.client.prompt_async(&first, stalled_prompt(), None, None, false).await?;
    rig.wait_record(&first, Action::Continue, Outcome::Done, PATIENCE).await?;

    let mut on = rig.cfg.clone();
    on.toasts.enabled = true;
    Rig::write_config(&file, &on)?;
    rig.daemon().reload().await?;
    let second = rig.client.create_session(Some("toast")).await?;
    rig.client.prompt_async(&second, stalled_prompt(), None, None, false).await?;
    rig.wait_record(&second, Action::Continue, Outcome::Done, PATIENCE).await?;

    let mut toasts = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(event)) = events.next().await {
            if event["payload"]["type"] == "tui.toast.show" {
                toasts.push(event["payload"]["properties"]["message"].as_str().unwrap_or_default().to_string());
            }
        }
    })
    .await;
    assert_eq!(toasts.len(), 1, "only the recovery after the reload: {toasts:?}");
    assert!(toasts[0].starts_with(&second[..12]), "{toasts:?}");
    rig.stop().await;
    Ok(())
}

/// Reads `shepherd run`'s JSON log lines (stderr) on a thread, handing them over.
fn follow_log(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<serde_json::Value> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Waits for a log line `matches` accepts.
fn wait_log(
    log: &std::sync::mpsc::Receiver<serde_json::Value>,
    what: &str,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match log.recv_timeout(left) {
            Ok(v) if matches(&v) => return Ok(v),
            Ok(_) => {}
            Err(_) => anyhow::bail!("no log line: {what}"),
        }
    }
}

#[actix::test]
async fn sighup_makes_a_running_shepherd_reload_its_file_and_recover_with_the_new_timeout() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    // The rig's OpenCode and fake model; its own in-process daemon is stopped at once.
    let mut rig = Rig::start_config(|c| c.recovery.stall_timeout = LONG).await?;
    if let Some(daemon) = rig.daemon.take() {
        daemon.shutdown().await;
    }
    let mut cfg = shepherd_actors::config::Config {
        servers: vec![ServerConfig::new("local", rig.opencode.url())],
        recovery: support::fast_recovery(),
        advisor: support::fast_advice(),
        ..Default::default()
    };
    cfg.recovery.stall_timeout = LONG;
    cfg.control.enabled = false;
    cfg.status.enabled = false;
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    Rig::write_config(&file, &cfg)?;

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .current_dir(dir.path())
        .args(["run", "--config"])
        .arg(&file)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id() as libc::pid_t;
    let log = follow_log(child.stderr.take().expect("piped"));
    let result = async {
        wait_log(&log, "reconciled", |v| v["message"].as_str().is_some_and(|m| m.starts_with("reconciled")))?;
        let id = rig.client.create_session(Some("sighup")).await?;
        rig.client.prompt_async(&id, stalled_prompt(), None, None, false).await?;
        rig.client.wait_busy(&id, PATIENCE).await?;

        cfg.recovery.stall_timeout = SHORT;
        cfg.store.path = "/nonexistent/ledger.sqlite3".into();
        Rig::write_config(&file, &cfg)?;
        // SAFETY: `kill` with a child's pid and a signal number has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
        let reload = wait_log(&log, "the reload event", |v| v["target"] == "shepherd::reload")?;
        assert_eq!(reload["trigger"], "SIGHUP", "{reload}");
        assert_eq!(reload["changed"], "recovery.stall_timeout: \"1h\" → \"4s\"", "{reload}");
        assert_eq!(reload["needs_restart"], "store.path: \"\" → \"/nonexistent/ledger.sqlite3\"", "{reload}");
        assert!(reload["message"].as_str().unwrap().contains("needs a restart"), "{reload}");
        let cont = wait_log(&log, "the continue", |v| {
            v["target"] == "shepherd::action" && v["action"] == "continue" && v["session"] == id.as_str()
        })?;
        assert_eq!(cont["outcome"], "done", "{cont}");
        // An invalid file on the next SIGHUP: rejected, naming the key; the daemon runs on.
        std::fs::write(&file, "[recovery]\nstall_timeout = \"soon\"\n")?;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
        let rejected = wait_log(&log, "the rejection", |v| v["target"] == "shepherd::reload")?;
        assert_eq!(rejected["key"], "recovery.stall_timeout", "{rejected}");
        assert_eq!(rejected["level"], "WARN", "{rejected}");
        assert!(child.try_wait()?.is_none(), "still running");
        anyhow::Ok(())
    }
    .await;
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = child.wait();
    rig.opencode.stop().await;
    result
}

/// A variable nobody sets: the daemon generates its token and writes the token file.
const UNSET_TOKEN_ENV: &str = "SHEPHERD_TEST_RELOAD_TOKEN_UNSET";

#[actix::test]
async fn shepherd_config_reload_reports_what_changed_and_fails_naming_the_key_of_a_bad_value() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let token_file = dir.path().join("control.token");
    let rig = Rig::start_reloadable(&file, |c| {
        c.recovery.stall_timeout = LONG;
        c.control.enabled = true;
        c.control.bind = "127.0.0.1:0".into();
        c.control.token_env = UNSET_TOKEN_ENV.into();
        c.control.token_file = token_file.to_string_lossy().into_owned();
    })
    .await?;
    let port = rig.daemon().control_url().unwrap().rsplit(':').next().unwrap().to_string();
    // Elsewhere, so the CLI does not read the daemon's file: the daemon judges it.
    let elsewhere = TempDir::new()?;
    let cli = || {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_shepherd"));
        cmd.current_dir(elsewhere.path())
            .args(["config", "reload", "--set"])
            .arg(format!("control.bind=127.0.0.1:{port}"))
            .arg("--set")
            .arg(format!("control.token_env={UNSET_TOKEN_ENV}"))
            .arg("--set")
            .arg(format!("control.token_file={}", token_file.display()))
            .env_remove(UNSET_TOKEN_ENV)
            .kill_on_drop(true);
        cmd
    };

    let mut next = rig.cfg.clone();
    next.review.max_rounds = 5;
    Rig::write_config(&file, &next)?;
    let out = tokio::time::timeout(PATIENCE, cli().output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 key(s) applied") && stdout.contains("review.max_rounds: 3 → 5"), "{stdout}");
    assert_eq!(rig.daemon().config().await.review.max_rounds, 5);

    std::fs::write(&file, "[review]\nmax_rounds = \"many\"\n")?;
    let out = tokio::time::timeout(PATIENCE, cli().output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a rejected reload is a failure");
    assert!(stderr.contains("review.max_rounds"), "{stderr}");
    assert!(stderr.contains("the daemon keeps the running one"), "{stderr}");
    assert_eq!(rig.daemon().config().await.review.max_rounds, 5, "nothing changed");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn the_reload_endpoint_needs_the_token_and_says_when_there_is_nothing_to_re_read() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let mut cfg = shepherd_actors::config::Config::default();
    cfg.control.bind = "127.0.0.1:0".into();
    cfg.control.token_env = UNSET_TOKEN_ENV.into();
    cfg.control.token_file = dir.path().join("control.token").to_string_lossy().into_owned();
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    // Started from a value, not from files (as tests and the demo do).
    let daemon = shepherd::daemon::Daemon::start(&cfg)?;
    let url = format!("{}/v1/config/reload", daemon.control_url().unwrap());
    let http = reqwest::Client::new();
    assert_eq!(http.post(&url).send().await?.status(), 401);
    let answer = http.post(&url).bearer_auth(daemon.control_token().unwrap().expose()).send().await?;
    assert_eq!(answer.status(), 409);
    let body: serde_json::Value = answer.json().await?;
    assert!(body["error"].as_str().unwrap().contains("nothing to re-read"), "{body}");
    daemon.shutdown().await;
    Ok(())
}

#[actix::test]
async fn a_model_advisor_added_by_a_reload_is_asked_and_one_removed_is_not() -> anyhow::Result<()> {
    let dir = TempDir::new()?;
    let file = dir.path().join("shepherd.toml");
    let mut rig = Rig::start_reloadable(&file, |c| c.recovery.stall_timeout = SHORT).await?;
    assert!(rig.cfg.advisor.base_url.is_empty(), "heuristics only at start");

    let mut with_model = rig.cfg.clone();
    with_model.advisor.base_url = rig.fake.base_url();
    with_model.advisor.model = shepherd_testbed::fake_model::ADVISOR_MODEL.into();
    // Test sessions are seconds old: "new session" would make every case obvious.
    with_model.advisor.new_session = Duration::ZERO;
    Rig::write_config(&file, &with_model)?;
    rig.daemon().reload().await?;
    rig.fake.set_advisor_answers(vec![shepherd_testbed::fake_model::Behaviour::Say("Go on. @continue:0.8".into())]);
    let id = rig.client.create_session(Some("advised")).await?;
    rig.client.prompt_async(&id, stalled_prompt(), None, None, false).await?;
    let advice = rig.wait_record(&id, Action::Advise, Outcome::Done, PATIENCE).await?;
    assert_eq!(advice.numbers.advice_source.as_deref(), Some("model"), "{advice:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert_eq!(rig.fake.advisor_requests().len(), 1);

    // Back to heuristics: the next stall is decided without asking the model.
    let mut without = with_model.clone();
    without.advisor.base_url = String::new();
    without.advisor.model = String::new();
    Rig::write_config(&file, &without)?;
    rig.daemon().reload().await?;
    let other = rig.client.create_session(Some("unadvised")).await?;
    rig.client.prompt_async(&other, stalled_prompt(), None, None, false).await?;
    rig.wait_record(&other, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert_eq!(rig.fake.advisor_requests().len(), 1, "the model was not asked again");
    rig.stop().await;
    Ok(())
}
