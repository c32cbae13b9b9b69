//! `shepherd status`: the status file (per-session recoveries, stalls, follow-ups),
//! rendered, or its JSON as it is.

use anyhow::Context as _;
use shepherd::config::{load, ConfigSources};

use crate::StatusArgs;

pub(crate) fn status(args: StatusArgs) -> anyhow::Result<()> {
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
