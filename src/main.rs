//! The `shepherd` command line: `run`, `demo`, `config check`, `fake-model`, the
//! control API's clients `sessions`, `prompt`, `handoff`, `top` and `config reload`, and
//! the system's own `doctor`, `completions` and `man`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use shepherd::config::{load, load_with_origins, render_with_origins, ConfigSources};
use shepherd::control::table::render_sessions;
use shepherd::control::ControlClient;
use shepherd::daemon::Daemon;
use shepherd_actors::config::LogFormat;
use shepherd_actors::control::CustomPromptRequest;

#[derive(Parser)]
#[command(name = "shepherd", version, about = "Keeps many OpenCode agent sessions working unattended")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Supervise the servers in the configuration (the main job).
    Run(ConfigArgs),
    /// Start a fake model and a real OpenCode server, supervise scripted sessions, and
    /// print what Shepherd did.
    Demo(DemoArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run the scriptable OpenAI-compatible fake model on its own.
    FakeModel,
    /// Print a session's journal (what Shepherd did and why) from the configured ledger.
    History(shepherd::store::history::HistoryArgs),
    /// List the sessions the running daemon supervises (through its control API).
    Sessions(SessionsArgs),
    /// Send a prompt to a session through the running daemon (template variables such
    /// as {pending}, {total}, {todoList} are rendered).
    Prompt(PromptArgs),
    /// Hand a session over to a fresh one now, show where its hand-off stands
    /// (`--status`), or restore a stored snapshot (`--resume ID`).
    Handoff(HandoffArgs),
    /// Stop Shepherd acting on a session (`SESSION`) or on every session (`--all`) —
    /// through the running daemon, ledgered so a restart keeps it; the person writing in
    /// the session does not lift it. `shepherd resume` undoes it.
    Pause(PauseArgs),
    /// Let Shepherd act on a paused session (or, with `--all`, the fleet) again; a
    /// session that stalled meanwhile is recovered at once.
    Resume(ResumeArgs),
    /// Print the status file (per-session recoveries, stalls, follow-ups) readably.
    Status(StatusArgs),
    /// A live view of the fleet from the running daemon (q quits; a plain refreshing
    /// table when stdout is not a terminal).
    Top(TopArgs),
    /// Write a first, commented configuration (default: the user's,
    /// `$XDG_CONFIG_HOME/shepherd/shepherd.toml`), after asking whether an OpenCode
    /// server answers at its default address.
    Init(InitArgs),
    /// Print a completion script for a shell, e.g.
    /// `shepherd completions bash > ~/.local/share/bash-completion/completions/shepherd`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `shepherd man | man -l -`.
    Man,
    /// Notification targets (`[[notify]]`).
    Notify {
        #[command(subcommand)]
        command: NotifyCommand,
    },
    /// Look at everything `run` depends on (each server: reachable, password, version,
    /// event stream; the state directory; Redis; the advisor; the control API's address)
    /// and print one line per finding with its fix. Exits non-zero on a problem.
    Doctor(ConfigArgs),
}

#[derive(Args, Clone)]
struct TopArgs {
    /// Print one snapshot as a plain table and exit.
    #[arg(long)]
    once: bool,
    /// Show the fleet's counts in the terminal's title (also `top.terminal_title`).
    #[arg(long)]
    title: bool,
    /// Show the most-stalled session's way to recovery as the terminal's progress
    /// indicator, OSC 9;4 (also `top.progress`).
    #[arg(long)]
    progress: bool,
    /// Poll this often, e.g. `1s` (default `top.refresh_interval`).
    #[arg(long, value_name = "DURATION")]
    refresh: Option<String>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct StatusArgs {
    /// Read this file instead of the configured `status.path`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Print the file's JSON as it is.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

/// Where the running daemon's control API is: the same configuration `run` reads.
#[derive(Args, Clone)]
struct DaemonArgs {
    /// TOML file (default: ./shepherd.toml if present).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Set a key, e.g. `--set control.bind=127.0.0.1:7500` (repeatable; wins over all).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl DaemonArgs {
    fn load(&self) -> anyhow::Result<shepherd_actors::config::Config> {
        let sources = ConfigSources { file: self.config.clone(), overrides: self.set.clone(), server_url: None };
        load(&sources).context("invalid configuration")
    }

    fn client(&self) -> anyhow::Result<ControlClient> {
        Ok(ControlClient::from_config(&self.load()?.control)?)
    }
}

#[derive(Args, Clone)]
struct SessionsArgs {
    /// Print the daemon's JSON instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct PromptArgs {
    /// The session id (`ses_…`).
    session: String,
    /// The text to send.
    text: String,
    /// Append the session's open todos.
    #[arg(long)]
    with_todos: bool,
    /// Append a short summary of the session's state.
    #[arg(long)]
    with_summary: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct HandoffArgs {
    /// The session id (`ses_…`); not needed with `--resume`.
    #[arg(required_unless_present = "resume")]
    session: Option<String>,
    /// Only show where the session's hand-off stands.
    #[arg(long, conflicts_with = "resume")]
    status: bool,
    /// Restore this stored snapshot (`hf_…`) into a fresh session.
    #[arg(long, value_name = "ID")]
    resume: Option<String>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct InitArgs {
    /// Write here instead of the user's configuration file.
    #[arg(long)]
    path: Option<PathBuf>,
    /// The OpenCode server to configure (asked whether it answers).
    #[arg(long, default_value = shepherd::init::DEFAULT_OPENCODE_URL)]
    server: String,
    /// Replace an existing file.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Clone)]
struct PauseArgs {
    /// The session id (`ses_…`); or `--all`.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    session: Option<String>,
    /// Every session, and those seen later, until `shepherd resume --all`.
    #[arg(long)]
    all: bool,
    /// For this long only, e.g. `2h` (at most 30 days); without it, until resumed.
    #[arg(long = "for", value_name = "DURATION")]
    span: Option<String>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct ResumeArgs {
    /// The session id (`ses_…`); or `--all`.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    session: Option<String>,
    /// The fleet (sessions paused one by one stay paused).
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Subcommand)]
enum NotifyCommand {
    /// Send one test message to every `[[notify]]` target (retries included) and print
    /// how each answered. Exits non-zero when one fails.
    Test(ConfigArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (secrets masked) or the first error.
    Check(ConfigArgs),
    /// Make the running daemon re-read its configuration (as SIGHUP does) and print
    /// what changed; fails, naming the key, when the new configuration is rejected.
    Reload(ReloadArgs),
}

#[derive(Args, Clone)]
struct ReloadArgs {
    /// Print the daemon's JSON answer.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    daemon: DaemonArgs,
}

#[derive(Args, Clone)]
struct ConfigArgs {
    /// TOML file (default: ./shepherd.toml if present).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Supervise this one server instead of the configured list.
    #[arg(long)]
    server: Option<String>,
    /// Set a key, e.g. `--set recovery.stall_timeout=30s` (repeatable; wins over all).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Log format (overrides `log.format`).
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
}

#[derive(Args, Clone)]
struct DemoArgs {
    /// Stall timeout used in the demo (the default is minutes; the demo shows seconds).
    #[arg(long, default_value = "4s")]
    stall_timeout: String,
    /// Print Shepherd's own log lines too (on stderr, interleaved with the narrative);
    /// by default they go to a file whose path the demo prints.
    #[arg(long, short)]
    verbose: bool,
    /// Log format for Shepherd's own log lines with `--verbose`.
    #[arg(long, value_enum, requires = "verbose")]
    log_format: Option<LogFormatArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Json,
    Pretty,
}

impl From<LogFormatArg> for LogFormat {
    fn from(f: LogFormatArg) -> Self {
        match f {
            LogFormatArg::Json => LogFormat::Json,
            LogFormatArg::Pretty => LogFormat::Pretty,
        }
    }
}

impl ConfigArgs {
    fn load(&self) -> anyhow::Result<shepherd_actors::config::Config> {
        load(&self.sources()).context("invalid configuration")
    }

    /// Where the configuration comes from (a reload reads the same sources again).
    fn sources(&self) -> ConfigSources {
        let mut overrides = self.set.clone();
        if let Some(f) = self.log_format {
            let name = match f {
                LogFormatArg::Json => "json",
                LogFormatArg::Pretty => "pretty",
            };
            overrides.push(format!("log.format={name}"));
        }
        self.sources_with(overrides)
    }

    fn sources_with(&self, overrides: Vec<String>) -> ConfigSources {
        ConfigSources { file: self.config.clone(), overrides, server_url: self.server.clone() }.or_default_file()
    }
}

/// Errors end the process with one readable line (the cause chain), not a backtrace:
/// they are the user's to fix (a config key, an unreachable daemon), not a crash.
fn main() -> std::process::ExitCode {
    // Before any thread starts (the daemon does it again; it is idempotent).
    shepherd::memory::limit_arenas();
    match run_cli(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Config { command: ConfigCommand::Check(args) } => {
            let (cfg, origins) = load_with_origins(&args.sources()).context("invalid configuration")?;
            print!("{}", render_with_origins(&cfg, &origins));
            Ok(())
        }
        Command::Config { command: ConfigCommand::Reload(args) } => client_runtime()?.block_on(reload(args)),
        Command::Run(args) => {
            // Before any thread starts: nothing the daemon (or SQLite) creates is
            // readable by the group or others. The writers also set modes explicitly.
            shepherd::private_state::restrict_umask();
            let cfg = args.load()?;
            shepherd::logging::init(cfg.log.format, &cfg.log.level);
            install_kill_point();
            if cfg.servers.is_empty() {
                anyhow::bail!("no servers configured: add [[servers]] to the config or pass --server URL");
            }
            let sources = args.sources();
            let loader: shepherd::reload::ConfigLoader = std::sync::Arc::new(move || load(&sources));
            actix::System::new().block_on(run(cfg, loader))
        }
        Command::Demo(args) => {
            let level = "warn,shepherd=info,shepherd_actors=info";
            if args.verbose {
                shepherd::logging::init(args.log_format.map(Into::into).unwrap_or(LogFormat::Pretty), level);
            } else {
                // The narrative alone on the terminal; the decisions in detail in a file.
                let path = std::env::temp_dir().join(format!("shepherd-demo-{}.log", std::process::id()));
                shepherd::logging::init_file(level, &path).with_context(|| format!("creating {}", path.display()))?;
                println!("Shepherd's own log: {} (or run with --verbose)", path.display());
            }
            let stall = humantime::parse_duration(&args.stall_timeout)
                .with_context(|| format!("--stall-timeout {:?}", args.stall_timeout))?;
            actix::System::new().block_on(shepherd::demo::run(stall))
        }
        Command::History(args) => shepherd::store::history::run(args),
        Command::FakeModel => {
            shepherd::logging::init(LogFormat::Auto, "info");
            let fake = shepherd::testbed::fake_model::FakeModel::start()?;
            println!("fake model listening: {}", fake.base_url());
            tokio::runtime::Runtime::new()?.block_on(wait_for_signal());
            Ok(())
        }
        Command::Sessions(args) => client_runtime()?.block_on(sessions(args)),
        Command::Prompt(args) => client_runtime()?.block_on(prompt(args)),
        Command::Handoff(args) => client_runtime()?.block_on(handoff(args)),
        Command::Pause(args) => client_runtime()?.block_on(set_pause(
            &args.daemon,
            args.session.as_deref(),
            true,
            args.span.as_deref(),
        )),
        Command::Resume(args) => {
            client_runtime()?.block_on(set_pause(&args.daemon, args.session.as_deref(), false, None))
        }
        Command::Status(args) => status(args),
        Command::Top(args) => top(args),
        Command::Init(args) => {
            let path = match args.path {
                Some(p) => p,
                None => shepherd::config::user_config_path(&|name| std::env::var_os(name))
                    .context("neither XDG_CONFIG_HOME nor HOME is set to an absolute path: pass --path")?,
            };
            let found = client_runtime()?.block_on(shepherd::init::write(&path, &args.server, args.force))?;
            println!("wrote {} ({}: {found})", path.display(), args.server);
            println!("next: `shepherd doctor` checks it, `shepherd run` uses it");
            Ok(())
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "shepherd", &mut std::io::stdout());
            Ok(())
        }
        Command::Doctor(args) => {
            let cfg = args.load()?;
            let findings = client_runtime()?.block_on(shepherd::doctor::examine(&cfg));
            print!("{}", shepherd::doctor::render(&findings));
            if shepherd::doctor::failed(&findings) {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Notify { command: NotifyCommand::Test(args) } => {
            let cfg = args.load()?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
            match client_runtime()?.block_on(shepherd::notify::probe::send_tests(&cfg.notify, now)) {
                Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
                Err(lines) => {
                    lines.iter().for_each(|l| println!("{l}"));
                    std::process::exit(1);
                }
            }
            Ok(())
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(())
        }
    }
}

fn top(args: TopArgs) -> anyhow::Result<()> {
    let cfg = args.daemon.load()?;
    let client = ControlClient::from_config(&cfg.control)?;
    let refresh_interval = match &args.refresh {
        Some(text) => humantime::parse_duration(text).with_context(|| format!("--refresh {text:?}"))?,
        None => cfg.top.refresh_interval,
    }
    .max(std::time::Duration::from_millis(100));
    let opts = shepherd::top::TopOptions {
        once: args.once,
        title: args.title || cfg.top.terminal_title,
        progress: args.progress || cfg.top.progress,
        refresh_interval,
        journal_entries: cfg.top.journal_entries,
    };
    shepherd::top::run(client, opts)
}

fn status(args: StatusArgs) -> anyhow::Result<()> {
    let path = match args.file {
        Some(p) => p,
        None => {
            let d = &args.daemon;
            let sources = ConfigSources { file: d.config.clone(), overrides: d.set.clone(), server_url: None };
            let cfg = load(&sources).context("invalid configuration")?;
            shepherd::status::status_path(&cfg.status, &|name| std::env::var_os(name))?
        }
    };
    let doc = shepherd::status::read(&path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let text = shepherd::status::render::render_status(&doc, now_ms);
    // `shepherd status | head` closes the pipe early: that is not an error.
    match std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

async fn sessions(args: SessionsArgs) -> anyhow::Result<()> {
    let client = args.daemon.client()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&client.sessions_json().await?)?);
        return Ok(());
    }
    let sessions = client.sessions().await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    print!("{}", render_sessions(&sessions, now_ms));
    Ok(())
}

async fn prompt(args: PromptArgs) -> anyhow::Result<()> {
    let client = args.daemon.client()?;
    let request = CustomPromptRequest {
        message: Some(args.text),
        include_todo_context: args.with_todos,
        include_context_summary: args.with_summary,
        ..CustomPromptRequest::default()
    };
    let reply = client.prompt(&args.session, &request).await?;
    if !reply.success {
        anyhow::bail!(
            "not sent to {}: {}",
            args.session,
            reply.reason.as_deref().unwrap_or("the daemon gave no reason")
        );
    }
    println!("sent to {}:\n{}", args.session, reply.message);
    Ok(())
}

async fn handoff(args: HandoffArgs) -> anyhow::Result<()> {
    let client = args.daemon.client()?;
    let (what, view) = match (&args.resume, &args.session) {
        (Some(snapshot), _) => ("resuming", client.resume_handoff(snapshot).await?),
        (None, Some(session)) if args.status => ("status", client.handoff_status(session).await?),
        (None, Some(session)) => ("started", client.handoff(session).await?),
        (None, None) => anyhow::bail!("a session id or --resume ID is needed"),
    };
    println!("hand-off {what}: phase {}", view.phase);
    for (label, value) in
        [("id", &view.id), ("new session", &view.new_session), ("continues", &view.from), ("why", &view.reason)]
    {
        if let Some(v) = value {
            println!("  {label}: {v}");
        }
    }
    Ok(())
}

/// Pauses or resumes a session (`Some`) or the fleet through the daemon, and says where
/// it stands.
async fn set_pause(daemon: &DaemonArgs, session: Option<&str>, pause: bool, span: Option<&str>) -> anyhow::Result<()> {
    let client = daemon.client()?;
    let view = client.set_pause(session, pause, span, "cli").await?;
    let what = session.map_or("the fleet".to_string(), |s| format!("session {s}"));
    let until = view.until_ms.map(|ms| {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
        format!(" until {}", humantime::format_rfc3339_seconds(at))
    });
    match (&view.paused, pause) {
        (Some(why), true) => println!("{what} paused ({why}){}", until.unwrap_or_default()),
        (None, false) => println!("{what} resumed"),
        (Some(why), false) => println!("{what} is still paused ({why}): resume it by its own id"),
        (None, true) => println!("{what} is not paused"),
    }
    Ok(())
}

async fn reload(args: ReloadArgs) -> anyhow::Result<()> {
    // The CLI reads the same sources to find the daemon: a file that does not load
    // here would not load there either, and the daemon is not asked.
    let client =
        args.daemon.client().context("the daemon was not asked to reload; it keeps its running configuration")?;
    let answer =
        client.reload_config().await.context("configuration not reloaded; the daemon keeps the running one")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let lines = |key: &str| -> Vec<String> {
        answer[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let field = |k: &str| c[k].as_str().unwrap_or("?").to_string();
                        format!("  {}: {} → {}", field("key"), field("old"), field("new"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (live, restart) = (lines("live"), lines("needs_restart"));
    if live.is_empty() && restart.is_empty() {
        println!("configuration reloaded: nothing changed");
        return Ok(());
    }
    println!("configuration reloaded: {} key(s) applied", live.len());
    live.iter().for_each(|l| println!("{l}"));
    for (label, key) in [
        ("servers added", "servers_added"),
        ("servers removed", "servers_removed"),
        ("servers restarted", "servers_changed"),
    ] {
        let names: Vec<&str> =
            answer[key].as_array().map(|a| a.iter().filter_map(|v| v.as_str()).collect()).unwrap_or_default();
        if !names.is_empty() {
            println!("{label}: {}", names.join(", "));
        }
    }
    if !restart.is_empty() {
        println!("needs a restart (ignored until then):");
        restart.iter().for_each(|l| println!("{l}"));
    }
    Ok(())
}

async fn run(cfg: shepherd_actors::config::Config, loader: shepherd::reload::ConfigLoader) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let daemon = Daemon::start_reloadable(&cfg, loader)?;
    // Started by systemd: it hears when Shepherd is ready, reloading, alive and stopping.
    let manager = shepherd::systemd::ServiceManager::from_env();
    if let Some(manager) = manager {
        actix::spawn(manager.attend(daemon.supervisor().clone()));
    }
    let mut hangup = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    let reload = daemon.reload_handle().clone();
    let stop = wait_for_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            // The reload task logs the outcome (what changed, or why it was rejected).
            Some(()) = hangup.recv() => {
                manager.inspect(|m| m.reloading());
                let outcome = match reload.reload("SIGHUP").await {
                    Ok(_) => "supervising (configuration reloaded)",
                    Err(_) => "supervising (reload rejected; the previous configuration runs)",
                };
                manager.inspect(|m| m.reloaded(outcome));
            }
        }
    }
    tracing::info!("signal received: shutting down");
    manager.inspect(|m| m.stopping());
    daemon.shutdown().await;
    Ok(())
}

/// The test-only variable naming the step at which `shepherd run` kills itself
/// (`shepherd_actors::killpoint`): the crash-consistency tests restart it after.
const KILL_AT_ENV: &str = "SHEPHERD_KILL_AT";

/// Arms the kill point named by `SHEPHERD_KILL_AT`, if any: the process sends itself
/// `SIGKILL` the first time a procedure reaches that step. Never set it in production.
fn install_kill_point() {
    let Ok(target) = std::env::var(KILL_AT_ENV) else { return };
    if !shepherd_actors::killpoint::step::ALL.contains(&target.as_str()) {
        tracing::warn!(variable = KILL_AT_ENV, value = %target, known = ?shepherd_actors::killpoint::step::ALL, "unknown kill point; ignored");
        return;
    }
    tracing::warn!(variable = KILL_AT_ENV, step = %target, "TEST ONLY: this process kills itself (SIGKILL) when it reaches this step");
    shepherd_actors::killpoint::install(move |step| {
        if step == target {
            eprintln!("kill point {step} reached: SIGKILL");
            // SAFETY: `kill` on our own pid with a signal number has no memory effects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    });
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops Shepherd");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
