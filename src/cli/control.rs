//! The running daemon's clients, through its control API: `sessions`, `prompt`,
//! `handoff`, `pause`/`resume`, `top` and `config reload`.

use anyhow::Context as _;
use shepherd::control::table::render_sessions;
use shepherd::control::ControlClient;
use shepherd_actors::control::CustomPromptRequest;

use crate::{DaemonArgs, HandoffArgs, PromptArgs, ReloadArgs, SessionsArgs, TopArgs};

pub(crate) fn top(args: TopArgs) -> anyhow::Result<()> {
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

pub(crate) async fn sessions(args: SessionsArgs) -> anyhow::Result<()> {
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

pub(crate) async fn prompt(args: PromptArgs) -> anyhow::Result<()> {
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

pub(crate) async fn handoff(args: HandoffArgs) -> anyhow::Result<()> {
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
pub(crate) async fn set_pause(
    daemon: &DaemonArgs,
    session: Option<&str>,
    pause: bool,
    span: Option<&str>,
) -> anyhow::Result<()> {
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

pub(crate) async fn reload(args: ReloadArgs) -> anyhow::Result<()> {
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
