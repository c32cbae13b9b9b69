//! Shepherd as the system runs it: `shepherd run` started the way the systemd unit in
//! `contrib/systemd/` starts it (its own command lines, a real `NOTIFY_SOCKET`, the
//! watchdog's variables) against a real OpenCode; the shell completions and the manual
//! page as a user installs them.

mod support;

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shepherd_actors::config::{Config, ServerConfig};
use support::process::ShepherdProcess;
use support::{Rig, PATIENCE};

/// The unit file users copy.
const UNIT: &str = include_str!("../contrib/systemd/shepherd.service");

/// The arguments of the unit's `KEY=` command line, with the unit's `%h` paths of the
/// binary and the config file replaced by this test's.
fn unit_command(key: &str, config: &Path) -> Vec<String> {
    let line = UNIT
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the unit has {key}="));
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("%h/.cargo/bin/shepherd"), "{key} runs the installed shepherd");
    words.map(|w| w.replace("%h/.config/shepherd/shepherd.toml", &config.display().to_string())).collect()
}

/// The service manager's end of `NOTIFY_SOCKET`: every datagram, as text.
struct NotifySocket {
    socket: tokio::net::UnixDatagram,
    path: PathBuf,
    heard: Vec<String>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join("notify.sock");
        let socket = tokio::net::UnixDatagram::from_std({
            let s = UnixDatagram::bind(&path)?;
            s.set_nonblocking(true)?;
            s
        })?;
        Ok(Self { socket, path, heard: Vec::new() })
    }

    /// The next message holding `line` (a whole line, e.g. `READY=1`), within `within`.
    async fn expect(&mut self, line: &str, within: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = match tokio::time::timeout_at(deadline, self.socket.recv(&mut buf)).await {
                Ok(n) => n?,
                Err(_) => anyhow::bail!("no {line} within {within:?}; heard {:?}", self.heard),
            };
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.heard.push(message.clone());
            if message.lines().any(|l| l == line) {
                return Ok(message);
            }
        }
    }
}

/// Started as the unit starts it, Shepherd tells systemd it is ready only once the
/// server is connected and reconciled, pings the watchdog, brackets a `SIGHUP` reload
/// with `RELOADING=1` (and the monotonic time systemd 253+ requires) and `READY=1`, and
/// says `STOPPING=1` when it is asked to stop — then exits cleanly.
#[actix::test]
async fn started_by_the_unit_shepherd_tells_systemd_ready_alive_reloading_and_stopping() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|_| {}).await?;
    if let Some(daemon) = rig.daemon.take() {
        daemon.shutdown().await;
    }
    let mut cfg = Config { servers: vec![ServerConfig::new("local", rig.opencode.url())], ..Default::default() };
    cfg.control.enabled = false;
    cfg.status.enabled = false;
    cfg.store.path = dir.path().join("ledger.sqlite3").display().to_string();
    let file = dir.path().join("shepherd.toml");
    Rig::write_config(&file, &cfg)?;

    // ExecStartPre: the configuration check passes on a good file.
    let pre = unit_command("ExecStartPre", &file);
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd")).args(&pre).output()?;
    assert!(checked.status.success(), "{pre:?}: {}", String::from_utf8_lossy(&checked.stderr));

    let mut systemd = NotifySocket::bind(dir.path())?;
    let args = unit_command("ExecStart", &file);
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let env = [("NOTIFY_SOCKET", systemd.path.as_os_str()), ("WATCHDOG_USEC", OsStr::new("2000000"))];
    let mut shepherd = ShepherdProcess::spawn(dir.path(), &args, &env)?;

    systemd.expect("READY=1", PATIENCE).await?;
    // WatchdogSec=2s: pings every second while the supervisor answers.
    for _ in 0..2 {
        systemd.expect("WATCHDOG=1", Duration::from_secs(3)).await?;
    }

    shepherd.signal(libc::SIGHUP);
    let reloading = systemd.expect("RELOADING=1", PATIENCE).await?;
    assert!(reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")), "{reloading:?}");
    systemd.expect("READY=1", PATIENCE).await?;

    shepherd.signal(libc::SIGTERM);
    systemd.expect("STOPPING=1", PATIENCE).await?;
    let exit = tokio::time::timeout(PATIENCE, shepherd.child.wait()).await??;
    assert!(exit.success(), "{exit:?}");
    rig.opencode.stop().await;
    Ok(())
}

/// While the server does not answer, systemd hears what Shepherd waits for, and no
/// `READY=1`: the unit stays "activating" with a reason, not "active" and blind.
#[actix::test]
async fn shepherd_is_not_ready_while_its_server_does_not_answer_and_says_why() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let mut cfg = Config { servers: vec![ServerConfig::new("local", format!("http://{closed}"))], ..Default::default() };
    cfg.control.enabled = false;
    cfg.status.enabled = false;
    cfg.store.path = dir.path().join("ledger.sqlite3").display().to_string();
    let file = dir.path().join("shepherd.toml");
    Rig::write_config(&file, &cfg)?;
    let mut systemd = NotifySocket::bind(dir.path())?;
    let args = unit_command("ExecStart", &file);
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let shepherd = ShepherdProcess::spawn(dir.path(), &args, &[("NOTIFY_SOCKET", systemd.path.as_os_str())])?;

    let status = systemd.expect("STATUS=waiting for local: stream not connected", PATIENCE).await?;
    assert!(!status.lines().any(|l| l == "READY=1"));
    let early = systemd.expect("READY=1", Duration::from_secs(3)).await;
    assert!(early.is_err(), "ready without its server: {:?}", systemd.heard);
    let exit = shepherd.stop().await.expect("exits on SIGTERM");
    assert!(exit.success(), "{exit:?}");
    systemd.expect("STOPPING=1", Duration::from_secs(1)).await?; // queued before the exit
    Ok(())
}

/// Not started by systemd: no socket, nothing sent, and `run` works as before.
/// `shepherd run` that cannot start — a password variable unset, the control port taken
/// by another process — says why and exits non-zero, having started and written
/// nothing: no panic as a half-started daemon was dropped, no token, ledger or status
/// file left in the state directory (a restart loop under systemd must not pile them up).
#[test]
fn a_run_that_cannot_start_says_why_and_leaves_nothing_behind() -> anyhow::Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    let unset = "SHEPHERD_TEST_UNSET_PASSWORD";
    for (set, says) in [
        (format!("servers[0].password_env={unset}"), format!("password_env names {unset}, which is not set")),
        (format!("control.bind=127.0.0.1:{port}"), format!("control.bind 127.0.0.1:{port}: cannot listen")),
    ] {
        let home = tempfile::tempdir()?;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["run", "--server", "http://127.0.0.1:9", "--set", &set])
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env("XDG_STATE_HOME", home.path().join("state"))
            .env_remove(unset)
            .output()?;
        let stderr = String::from_utf8(out.stderr)?;
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(&says), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let mut left = Vec::new();
        let mut dirs = vec![home.path().join("state")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                match entry.file_type()?.is_dir() {
                    true => dirs.push(entry.path()),
                    false => left.push(entry.path()),
                }
            }
        }
        assert!(left.is_empty(), "{set}: nothing written: {left:?}");
    }
    Ok(())
}

/// `config check` refuses what `run` refuses — no server to supervise — so the unit's
/// `ExecStartPre=… config check` stops a service that `run` would fail, not pass it into
/// a restart loop; with a server it passes.
#[test]
fn config_check_fails_where_run_would_refuse_to_start() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let check = |extra: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["config", "check"])
            .args(extra)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .current_dir(home.path())
            .output()?;
        Ok((out.status.success(), String::from_utf8(out.stderr)?))
    };
    let (ok, stderr) = check(&[])?;
    assert!(!ok && stderr.contains("no servers configured"), "{stderr}");
    let (ok, stderr) = check(&["--server", "http://127.0.0.1:4096"])?;
    assert!(ok, "{stderr}");
    Ok(())
}

/// A printing command whose reader has gone (`shepherd completions bash | head -1`)
/// ends quietly, as a Unix tool does, not with a panic on its first write.
#[test]
fn a_printing_command_whose_reader_went_away_ends_without_a_panic() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let commands: [&[&str]; 3] =
        [&["completions", "bash"], &["man"], &["config", "check", "--server", "http://127.0.0.1:4096"]];
    for args in commands {
        let (reader, writer) = std::io::pipe()?;
        drop(reader); // gone before the first write
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(args)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .current_dir(home.path())
            .stdout(writer)
            .output()?;
        let stderr = String::from_utf8(out.stderr)?;
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    Ok(())
}

/// `--log-format pretty` into a file (stderr redirected, as a service's log is) writes
/// plain text: no colour escape codes.
#[test]
fn a_pretty_log_redirected_to_a_file_has_no_colour_codes() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let log = std::fs::File::create(home.path().join("shepherd.log"))?;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["run", "--server", "http://127.0.0.1:9", "--log-format", "pretty", "--set", "control.enabled=false"])
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("XDG_STATE_HOME", home.path().join("state"))
        .env_remove("NO_COLOR")
        .stderr(log)
        .spawn()?;
    let deadline = std::time::Instant::now() + PATIENCE;
    let written = loop {
        let text = std::fs::read_to_string(home.path().join("shepherd.log"))?;
        if text.contains("started") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill()?;
    child.wait()?;
    assert!(written.contains("started"), "{written}");
    assert!(!written.contains('\x1b'), "{written}");
    Ok(())
}

#[test]
fn the_service_manager_is_absent_without_a_notify_socket() {
    // The test harness is not run by systemd (a CI runner that is would set it: skip).
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        assert!(shepherd::systemd::ServiceManager::from_env().is_none());
    }
}

/// The bash completion script is one bash accepts, and it completes the subcommands.
#[test]
fn the_bash_completion_script_is_accepted_by_bash_and_knows_the_subcommands() -> anyhow::Result<()> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd")).args(["completions", "bash"]).output()?;
    assert!(out.status.success());
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("shepherd.bash");
    std::fs::write(&script, &out.stdout)?;
    let syntax = std::process::Command::new("bash").arg("-n").arg(&script).output()?;
    assert!(syntax.status.success(), "bash -n: {}", String::from_utf8_lossy(&syntax.stderr));
    // What bash offers after `shepherd ` once the script is sourced.
    let probe = format!(
        "source {}; COMP_WORDS=(shepherd ''); COMP_CWORD=1; COMP_LINE='shepherd '; COMP_POINT=9; _shepherd shepherd '' shepherd; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let offered = std::process::Command::new("bash").arg("-c").arg(probe).output()?;
    let offered = String::from_utf8_lossy(&offered.stdout);
    for sub in ["run", "config", "top", "completions", "man"] {
        assert!(offered.lines().any(|l| l == sub), "{sub} offered: {offered}");
    }
    Ok(())
}

/// The manual page is roff with the program's name, its subcommands and options.
#[test]
fn the_manual_page_names_the_program_and_its_subcommands() -> anyhow::Result<()> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd")).arg("man").output()?;
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout)?;
    assert!(page.starts_with(".ie") || page.contains(".TH shepherd"), "{}", &page[..page.len().min(200)]);
    assert!(page.contains(".TH shepherd"));
    for sub in ["run", "config", "top", "completions"] {
        assert!(page.contains(sub), "the page mentions {sub}");
    }
    // The pages its SEE ALSO names exist: shepherd-run(1) is `shepherd man run`.
    assert!(page.contains("shepherd\\-run(1)"), "SEE ALSO names shepherd-run(1)");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd")).args(["man", "run"]).output()?;
    let run = String::from_utf8(out.stdout)?;
    assert!(out.status.success() && run.contains(".TH shepherd-run 1") && run.contains("\\-\\-server"), "{run}");
    Ok(())
}

/// `shepherd doctor` over the same configuration `run` reads, its output and exit code.
fn doctor(dir: &Path, cfg: &Config, env: &[(&str, &str)]) -> anyhow::Result<(bool, String)> {
    let file = dir.join("shepherd.toml");
    Rig::write_config(&file, cfg)?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["doctor", "--config"])
        .arg(&file)
        .envs(env.iter().copied())
        .output()?;
    Ok((out.status.success(), String::from_utf8(out.stdout)?))
}

/// On a real OpenCode with a password: `doctor` names the wrong password and its fix,
/// and says all is well (version, event stream) with the right one; an unreachable
/// server is named with its URL. Exit status non-zero exactly when there is a problem.
#[actix::test]
async fn doctor_names_a_wrong_password_and_an_unreachable_server_and_passes_a_good_setup() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::FakeModel;
    use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
    let fake = FakeModel::start()?;
    let mut opencode = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake).password("right-one")).await?;
    let dir = tempfile::tempdir()?;
    let mut server = ServerConfig::new("locked", opencode.url());
    server.password_env = Some("DOCTOR_TEST_PASSWORD".into());
    let mut cfg = Config { servers: vec![server], ..Default::default() };
    cfg.control.enabled = false;
    cfg.status.enabled = false;
    let state = dir.path().join("state");
    cfg.store.path = state.join("ledger.sqlite3").display().to_string();

    let (ok, report) = doctor(dir.path(), &cfg, &[("DOCTOR_TEST_PASSWORD", "wrong-one")])?;
    assert!(!ok, "{report}");
    let line = report.lines().find(|l| l.contains("server locked")).expect("a line for the server");
    assert!(line.starts_with("FAIL") && line.contains("password was refused"), "{report}");
    assert!(line.contains("DOCTOR_TEST_PASSWORD"), "the fix names the variable: {report}");
    assert!(!report.contains("wrong-one"), "the password is never printed: {report}");

    let (ok, report) = doctor(dir.path(), &cfg, &[("DOCTOR_TEST_PASSWORD", "right-one")])?;
    assert!(ok, "{report}");
    let version = shepherd_testbed::opencode::OPENCODE_VERSION;
    assert!(report.contains(&format!("ok    server locked: reachable at {}, OpenCode {version}", opencode.url())), "{report}");
    assert!(report.contains("ok    server locked event stream: connected"), "{report}");
    assert!(report.contains("will be created at start"), "{report}");
    assert!(!state.exists(), "doctor writes no state");

    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    cfg.servers.push(ServerConfig::new("gone", format!("http://{closed}")));
    let (ok, report) = doctor(dir.path(), &cfg, &[("DOCTOR_TEST_PASSWORD", "right-one")])?;
    assert!(!ok, "{report}");
    let line = report.lines().find(|l| l.contains("server gone")).expect("a line for the second server");
    assert!(line.starts_with("FAIL") && line.contains(&format!("unreachable at http://{closed}")), "{report}");
    assert!(line.contains("fix: start `opencode serve` there, or correct servers[1].url"), "{report}");
    opencode.stop().await;
    Ok(())
}

/// `shepherd init` on a machine with an OpenCode running: it finds the server, writes the
/// user's configuration (`$XDG_CONFIG_HOME/shepherd/shepherd.toml`), refuses to overwrite
/// it, and `config check` — with no `--config`, from another folder — reads that file.
#[actix::test]
async fn init_writes_a_config_that_config_check_finds_and_accepts() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::FakeModel;
    use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer, OPENCODE_VERSION};
    let fake = FakeModel::start()?;
    let mut opencode = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake)).await?;
    let xdg = tempfile::tempdir()?;
    let elsewhere = tempfile::tempdir()?;
    let shepherd = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(args)
            .current_dir(elsewhere.path())
            .env("XDG_CONFIG_HOME", xdg.path())
            .env_remove("SHEPHERD_KILL_AT")
            .output()
    };
    let out = shepherd(&["init", "--server", &opencode.url()])?;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file = xdg.path().join("shepherd").join("shepherd.toml");
    assert!(said.contains(&format!("OpenCode {OPENCODE_VERSION}")), "{said}");
    let text = std::fs::read_to_string(&file)?;
    assert!(text.contains(&format!("url = \"{}\"", opencode.url())), "{text}");

    let again = shepherd(&["init", "--server", &opencode.url()])?;
    assert!(!again.status.success(), "an existing file is not overwritten");
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));

    let check = shepherd(&["config", "check"])?;
    let effective = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert!(effective.contains(&format!("url = \"{}\" # from file {}", opencode.url(), file.display())), "{effective}");
    opencode.stop().await;
    Ok(())
}
