//! Log output: JSON lines in production, human-readable in a terminal.
//!
//! Every action record is one event under the `shepherd::action` target with its
//! fields (`server`, `session`, `action`, `outcome`, `reason`, numbers), so JSON logs
//! can be filtered and aggregated without parsing messages.

use std::io::IsTerminal;

use shepherd_actors::config::LogFormat;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG` overrides the configured level.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // `try_init`: a second call (tests) keeps the first subscriber.
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}
