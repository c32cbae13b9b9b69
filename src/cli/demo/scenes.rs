//! `shepherd demo`: Shepherd supervising real sessions on a real OpenCode server, in
//! about a minute, on a fresh machine.
//!
//! It installs the pinned OpenCode if needed, starts the project's fake model and a
//! private OpenCode server wired to it, starts the same daemon `shepherd run` starts,
//! and drives seven scripted sessions — one that works normally, one that stalls
//! mid-stream, one that stops with open todos, one that waits on a question, one that
//! runs a long tool, one whose person presses Esc, and one whose context window fills up
//! and is handed over to a fresh session. It prints every decision Shepherd takes as it
//! happens, then a summary, and cleans everything up.
//!
//! A module of the binary, not of the library: it runs the test bed
//! (`shepherd-testbed`), which only the binary links, and only with the `demo` feature.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use shepherd::daemon::Daemon;
use shepherd_actors::config::{Config, NudgeConfig, RecoveryConfig, ServerConfig};
use shepherd_actors::journal::{Action, ActionRecord, Outcome};
use shepherd_testbed::client::PromptOptions;
use shepherd_testbed::fake_model::FakeModel;
use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer};
use tokio::time::Instant;

/// One scripted session: its title, what it shows, and the prompt (fake-model markers
/// choose the model's behaviour step by step).
struct Scene {
    title: &'static str,
    shows: &'static str,
    prompt: &'static str,
}

const SCENES: &[Scene] = &[
    Scene {
        title: "steady-worker",
        shows: "works through its todos; when the last is done, Shepherd asks once for a review",
        prompt: "[[fake:todo:create]][[fake:todo:partial]][[fake:todo:done]] Build the parser.",
    },
    Scene {
        title: "stalls-mid-stream",
        shows: "the model stops sending mid-answer; Shepherd aborts and continues it with its todos",
        prompt: "[[fake:todo:create]][[fake:stall]] Write the tests.",
    },
    Scene {
        title: "stops-with-todos",
        shows: "stops with todos still open; Shepherd nudges it once, it finishes, then a review",
        prompt: "[[fake:todo:create]] Plan the migration.",
    },
    Scene {
        title: "asks-a-question",
        shows: "waits on the person; never aborted (the demo answers after a while)",
        prompt: "[[fake:question]] Which option?",
    },
    Scene {
        title: "long-running-tool",
        shows: "a tool runs longer than the stall timeout; the tool grace keeps it safe",
        prompt: "[[fake:bash:sleep 7]] Run the slow build.",
    },
    Scene {
        title: "person-presses-esc",
        shows: "the person aborts; Shepherd pauses automation for it",
        prompt: "[[fake:stall]] Refactor everything.",
    },
    Scene {
        title: "fills-its-context",
        shows: "its context window is 85% full; Shepherd hands the work over to a fresh session",
        prompt: "[[fake:todo:create]][[fake:bigusage:170000]] Port the whole codebase.",
    },
];

/// Runs the demo; `stall_timeout` replaces the 3-minute default so it fits in a minute.
pub(super) async fn run(stall_timeout: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    say(started, "starting the fake model and a real OpenCode server (installing the pinned version on first use)…");
    let fake = FakeModel::start().context("starting the fake model")?;
    let mut opencode = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake)).await.context("starting OpenCode")?;
    let client = opencode.client();
    say(started, &format!("OpenCode {} at {}", client.health().await?.version, opencode.url()));

    let cfg = Config {
        servers: vec![ServerConfig::new("demo", opencode.url())],
        recovery: RecoveryConfig {
            stall_timeout,
            wait_after_abort: Duration::from_millis(500),
            // The fake model follows markers in the last user message: this one tells
            // it to finish the todos once Shepherd has continued it.
            continue_with_todos_message: "[[fake:todo:done]] You stalled and were interrupted \
                (attempt {attempts} of {maxAttempts}). Open todos ({pending} of {total}):\n\
                {todoList}\nPlease continue."
                .into(),
            ..RecoveryConfig::default()
        },
        nudge: NudgeConfig {
            // As above: this nudge tells the fake model to finish its todos.
            message: "[[fake:todo:done]] You stopped with {pending} of {total} todos open:\n{todoList}\nPlease go on."
                .into(),
            user_quiet: Duration::from_secs(1),
            ..NudgeConfig::default()
        },
        ..Config::default()
    };
    // The demo must not collide with a running daemon's control port or token file.
    let mut cfg = cfg;
    // The heuristic advice scaled to the demo's short stall timeout (its sessions are
    // seconds old when they stall; the production "new session" is 30 s).
    cfg.advisor.new_session = Duration::from_secs(2);
    cfg.advisor.postpone = stall_timeout;
    cfg.control.enabled = false;
    cfg.store.backend = shepherd_actors::config::StoreBackend::Memory;
    cfg.status.enabled = false;
    cfg.validate()?;
    let daemon = Daemon::start(&cfg)?;
    let mut records = daemon.journal().subscribe();
    say(
        started,
        &format!(
            "Shepherd supervising (stall timeout {}, tool grace ×{})",
            humantime::format_duration(stall_timeout),
            cfg.recovery.tool_grace_factor
        ),
    );

    let mut titles = HashMap::new();
    for scene in SCENES {
        let id = client.create_session(Some(scene.title)).await?;
        client.prompt_async_body(&id, &PromptOptions::default().body(scene.prompt)).await?;
        say(started, &format!("session {:<18} {}", scene.title, scene.shows));
        titles.insert(id, scene.title);
    }
    let esc = session_titled(&titles, "person-presses-esc");
    let scenes_started = started.elapsed();

    let deadline = started + stall_timeout * 4 + Duration::from_secs(45);
    let filler = session_titled(&titles, "fills-its-context");
    let mut esc_done = false;
    let mut question_answered = false;
    let mut log: Vec<ActionRecord> = Vec::new();
    loop {
        while let Ok(r) = records.try_recv() {
            let title = titles.get(&r.session).copied().unwrap_or("(other)");
            say(started, &format!("  shepherd -> {:<18} {:<15} {}", title, r.action.as_str(), describe(&r)));
            log.push(r);
        }
        let elapsed = started.elapsed();
        if !esc_done && elapsed > scenes_started + stall_timeout / 2 {
            client.abort(&esc).await?;
            say(started, "the person presses Esc in person-presses-esc");
            esc_done = true;
        }
        if !question_answered && elapsed > scenes_started + stall_timeout * 3 {
            let dir = opencode.project_dir().to_string_lossy().to_string();
            if let Some(q) = client.questions(Some(&dir)).await?.into_iter().next() {
                let qid = q["id"].as_str().unwrap_or_default().to_string();
                client.reply_question(&qid, &[vec!["A".into()]]).await?;
                say(started, "the person answers the question in asks-a-question");
                question_answered = true;
            }
        }
        let mut all_idle = true;
        for id in titles.keys() {
            all_idle &= !client.is_busy(id).await.unwrap_or(true);
        }
        let handed_over = log.iter().any(|r| {
            r.session == filler
                && r.action == Action::Handoff
                && matches!(r.numbers.phase.as_deref(), Some("completed" | "failed"))
        });
        if (all_idle && question_answered && esc_done && handed_over) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    println!();
    println!("{:<20} {:<8} {:<8} shepherd actions", "session", "state", "todos");
    let mut ids: Vec<_> = titles.iter().collect();
    ids.sort_by_key(|(_, t)| SCENES.iter().position(|s| s.title == **t));
    for (id, title) in ids {
        let busy = client.is_busy(id).await.unwrap_or(false);
        let todos = client.todos(id).await.unwrap_or_default();
        let done = todos.iter().filter(|t| t.status == "completed" || t.status == "cancelled").count();
        let actions: Vec<&str> = log.iter().filter(|r| &r.session == id).map(|r| r.action.as_str()).collect();
        println!(
            "{:<20} {:<8} {:<8} {}",
            title,
            if busy { "busy" } else { "idle" },
            format!("{done}/{}", todos.len()),
            if actions.is_empty() { "-".to_string() } else { actions.join(", ") }
        );
    }
    let count = |a: Action| log.iter().filter(|r| r.action == a && r.outcome == Outcome::Done).count();
    println!();
    println!(
        "{} stall(s) recovered, {} nudge(s), {} review(s), {} session(s) left to the person, {} hand-off(s) to a fresh session.",
        count(Action::Continue),
        count(Action::Nudge),
        count(Action::Review),
        count(Action::Pause),
        log.iter().filter(|r| r.action == Action::Handoff && r.numbers.phase.as_deref() == Some("completed")).count()
    );
    println!(
        "Each `shepherd ->` line is one decision from Shepherd's journal; the same decisions, with their numbers, are its \
         structured log (in the file named at the top, or on stderr with --verbose; --log-format json for JSON lines). \
         Cleaning up."
    );
    daemon.shutdown().await;
    opencode.stop().await;
    drop(fake);
    Ok(())
}

fn session_titled(titles: &HashMap<String, &str>, title: &str) -> String {
    titles.iter().find(|(_, t)| **t == title).map(|(id, _)| id.clone()).unwrap_or_default()
}

fn describe(r: &ActionRecord) -> String {
    let n = &r.numbers;
    let mut facts = Vec::new();
    if let Some(v) = n.idle_for_ms {
        facts.push(format!("silent {:.1}s", v as f64 / 1000.0));
    }
    if let Some(v) = n.abort_to_idle_ms {
        facts.push(format!("idle {v} ms after the abort"));
    }
    if let (Some(a), Some(m)) = (n.attempt, n.max_attempts) {
        facts.push(format!("attempt {a}/{m}"));
    }
    if let Some(v) = n.open_todos {
        facts.push(format!("{v} open todos"));
    }
    if let (Some(t), Some(w)) = (n.context_tokens, n.context_window) {
        facts.push(format!("context {t} of {w} tokens"));
    }
    if let Some(p) = &n.phase {
        facts.push(format!("phase {p}"));
    }
    if facts.is_empty() {
        r.reason.clone()
    } else {
        format!("{} ({})", r.reason, facts.join(", "))
    }
}

fn say(started: Instant, text: &str) {
    println!("[{:>5.1}s] {text}", started.elapsed().as_secs_f64());
}
