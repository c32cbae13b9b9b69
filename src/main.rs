//! The `shepherd` command line: `run`, `demo`, `config check`, `fake-model`, the
//! control API's clients `sessions`, `prompt`, `handoff`, `top` and `config reload`, and
//! the system's own `doctor`, `completions` and `man`.
//!
//! This file is the argument parsing (the clap definition) and the dispatch; each
//! subcommand's handler is in `cli/` (a module of this binary, not of the library).

mod cli;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use shepherd::config::{load, ConfigSources};
use shepherd::control::ControlClient;
use shepherd_actors::config::LogFormat;

use self::cli::{client_runtime, control, demo, run, setup, status};

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
    #[cfg_attr(
        not(feature = "demo"),
        command(about = "Not in this build (built without the `demo` feature): exits with an error", long_about = None)
    )]
    Demo(DemoArgs),
    /// Configuration tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run the scriptable OpenAI-compatible fake model on its own.
    #[cfg_attr(
        not(feature = "demo"),
        command(about = "Not in this build (built without the `demo` feature): exits with an error", long_about = None)
    )]
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
    /// Print the manual page (roff), e.g. `shepherd man | man -l -`; with a subcommand,
    /// its own page (`shepherd man run`: shepherd-run(1)).
    Man {
        /// The subcommand whose page to print.
        subcommand: Option<String>,
    },
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

/// `shepherd demo`'s arguments. A build without the `demo` feature parses them and reads
/// none (the command only says it is not in the build).
#[derive(Args, Clone)]
#[cfg_attr(not(feature = "demo"), allow(dead_code))]
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

/// The commands whose output a person pipes into `head`, `less` or `grep`: they read
/// and print, and change nothing. Not `top`: killed by the signal, it could not give a
/// person their terminal back.
fn prints_for_a_pipe(command: &Command) -> bool {
    matches!(
        command,
        Command::Config { command: ConfigCommand::Check(_) }
            | Command::History(_)
            | Command::Sessions(_)
            | Command::Status(_)
            | Command::Completions { .. }
            | Command::Man { .. }
    )
}

/// A reader that goes away (`shepherd status --json | head`) ends the command quietly,
/// as it ends any Unix tool: SIGPIPE's default action, which Rust's runtime replaced
/// with "ignore" — every write then failed and `print!` panicked. Not for the daemons
/// (`run`, `demo`: their children and state must be cleaned up) nor for commands that
/// act or probe other servers, whose sockets could raise it too: a reset connection
/// there must be reported, not end the process without a word.
fn end_quietly_when_the_reader_goes() {
    // SAFETY: called before any other thread starts; sets the signal's action only.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Errors end the process with one readable line (the cause chain), not a backtrace:
/// they are the user's to fix (a config key, an unreachable daemon), not a crash.
fn main() -> std::process::ExitCode {
    match run_cli(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli(cli: Cli) -> anyhow::Result<()> {
    if prints_for_a_pipe(&cli.command) {
        end_quietly_when_the_reader_goes();
    }
    match cli.command {
        Command::Config { command: ConfigCommand::Check(args) } => setup::config_check(&args),
        Command::Config { command: ConfigCommand::Reload(args) } => client_runtime()?.block_on(control::reload(args)),
        Command::Run(args) => run::run(&args),
        Command::Demo(args) => demo::demo(args),
        Command::History(args) => shepherd::store::history::run(args),
        Command::FakeModel => demo::fake_model(),
        Command::Sessions(args) => client_runtime()?.block_on(control::sessions(args)),
        Command::Prompt(args) => client_runtime()?.block_on(control::prompt(args)),
        Command::Handoff(args) => client_runtime()?.block_on(control::handoff(args)),
        Command::Pause(args) => client_runtime()?.block_on(control::set_pause(
            &args.daemon,
            args.session.as_deref(),
            true,
            args.span.as_deref(),
        )),
        Command::Resume(args) => {
            client_runtime()?.block_on(control::set_pause(&args.daemon, args.session.as_deref(), false, None))
        }
        Command::Status(args) => status::status(args),
        Command::Top(args) => control::top(args),
        Command::Init(args) => setup::init(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "shepherd", &mut std::io::stdout());
            Ok(())
        }
        Command::Doctor(args) => setup::doctor(&args),
        Command::Notify { command: NotifyCommand::Test(args) } => setup::notify_test(&args),
        Command::Man { subcommand } => {
            let mut cli = Cli::command();
            cli.build();
            let page = match subcommand {
                None => cli,
                Some(name) => {
                    let Some(sub) = cli.find_subcommand(&name).cloned() else {
                        let known: Vec<_> = cli.get_subcommands().map(|s| s.get_name().to_string()).collect();
                        anyhow::bail!("no subcommand {name:?}: one of {}", known.join(", "));
                    };
                    // The page its parent's SEE ALSO names: shepherd-run(1). (Leaked: a
                    // command name is `'static` without clap's `string` feature, and the
                    // process prints one page and ends.)
                    sub.name(&*format!("shepherd-{name}").leak())
                }
            };
            clap_mangen::Man::new(page).render(&mut std::io::stdout())?;
            Ok(())
        }
    }
}
