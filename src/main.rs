//! The `shepherd` command line: `run`, `demo`, `config check`, `fake-model`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use shepherd::config::{load, render_effective, ConfigSources};
use shepherd::daemon::Daemon;
use shepherd_actors::config::LogFormat;

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
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (secrets masked) or the first error.
    Check(ConfigArgs),
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
    /// Log format for Shepherd's own log lines (on stderr).
    #[arg(long, value_enum)]
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
        let mut overrides = self.set.clone();
        if let Some(f) = self.log_format {
            let name = match f {
                LogFormatArg::Json => "json",
                LogFormatArg::Pretty => "pretty",
            };
            overrides.push(format!("log.format={name}"));
        }
        let sources = ConfigSources { file: self.config.clone(), overrides, server_url: self.server.clone() };
        load(&sources).context("invalid configuration")
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Config { command: ConfigCommand::Check(args) } => {
            let cfg = args.load()?;
            print!("{}", render_effective(&cfg));
            Ok(())
        }
        Command::Run(args) => {
            let cfg = args.load()?;
            shepherd::logging::init(cfg.log.format, &cfg.log.level);
            if cfg.servers.is_empty() {
                anyhow::bail!("no servers configured: add [[servers]] to the config or pass --server URL");
            }
            actix::System::new().block_on(run(cfg))
        }
        Command::Demo(args) => {
            shepherd::logging::init(args.log_format.map(Into::into).unwrap_or(LogFormat::Pretty), "warn,shepherd=info,shepherd_actors=info");
            let stall = humantime::parse_duration(&args.stall_timeout)
                .with_context(|| format!("--stall-timeout {:?}", args.stall_timeout))?;
            actix::System::new().block_on(shepherd::demo::run(stall))
        }
        Command::FakeModel => {
            shepherd::logging::init(LogFormat::Auto, "info");
            let fake = shepherd::testbed::fake_model::FakeModel::start()?;
            println!("fake model listening: {}", fake.base_url());
            tokio::runtime::Runtime::new()?.block_on(wait_for_signal());
            Ok(())
        }
    }
}

async fn run(cfg: shepherd_actors::config::Config) -> anyhow::Result<()> {
    let daemon = Daemon::start(&cfg)?;
    wait_for_signal().await;
    tracing::info!("signal received: shutting down");
    daemon.shutdown().await;
    Ok(())
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
