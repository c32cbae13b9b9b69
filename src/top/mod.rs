//! `shepherd top`: a live terminal view of the fleet, polling the running daemon's
//! `GET /v1/status` through the control API's client.
//!
//! Parts, pure first:
//! - [`model`]: the status document → rows, sort orders, filters, bar fills.
//! - [`app`]: selection, detail pane, dialogs; keys in, [`app::Command`]s out.
//! - [`render`]: the ratatui screen and the plain table (a pipe, `--once`).
//! - [`terminal`]: the title and OSC 9;4 progress sequences (opt-in).
//! - here, the edge: the event loop (crossterm keys, a redraw at most every
//!   `TICK`), a worker thread that talks to the daemon so a slow answer never freezes
//!   the screen, and the terminal's set-up and restoration (also on a panic).
//!
//! It decides nothing about sessions: a prompt or a hand-off is the control API's
//! `POST /v1/sessions/{id}/prompt` / `handoff`, authenticated like every CLI command.

pub mod app;
pub mod model;
pub mod render;
pub mod terminal;

#[cfg(test)]
mod fixtures;

use std::io::{IsTerminal as _, Write as _};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{cursor, execute, terminal as term};
use shepherd_actors::control::CustomPromptRequest;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::stats::StatusDocument;

use self::app::{App, Command, Key};
use self::model::{visible, Filter, Fleet, SortKey};
use self::render::Palette;
use crate::control::ControlClient;

/// The longest the screen goes without a redraw (the times it shows age meanwhile).
const TICK: Duration = Duration::from_millis(250);

/// How `shepherd top` runs.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// Print one snapshot as a plain table and exit.
    pub once: bool,
    /// The terminal title shows the fleet's counts.
    pub title: bool,
    /// OSC 9;4 progress shows the most-stalled session's way to recovery.
    pub progress: bool,
    pub refresh_interval: Duration,
    pub journal_entries: u32,
}

/// Runs the view: interactive on a terminal, a plain refreshing table otherwise (or
/// once, with `--once`).
pub fn run(client: ControlClient, opts: TopOptions) -> anyhow::Result<()> {
    let tty = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if opts.once || !tty {
        return plain_loop(&client, &opts);
    }
    let palette = Palette::from_env(std::env::var_os("NO_COLOR").as_deref());
    interactive(client, &opts, palette)
}

/// Status polls return sessions' history cut to this many entries (the view shows the
/// journal from the ledger instead).
const POLL_HISTORY: usize = 0;

fn plain_loop(client: &ControlClient, opts: &TopOptions) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut out = std::io::stdout().lock();
    loop {
        let text = match runtime.block_on(client.status(POLL_HISTORY)) {
            Ok(doc) => {
                let fleet = Fleet::of(&doc);
                render::plain(&fleet, &visible(&fleet.rows, SortKey::State, &Filter::default()))
            }
            Err(e) if opts.once => return Err(e.into()),
            Err(e) => format!("error: {e}\n"),
        };
        // A reader that went away (`| head`) ends the view; that is not an error.
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            r => r.context("writing to stdout")?,
        }
        if opts.once {
            return Ok(());
        }
        std::thread::sleep(opts.refresh_interval);
        let _ = out.write_all(b"\n");
    }
}

/// A request to the daemon, carried out by the worker thread.
enum Request {
    Status,
    Journal(String, u32),
    Prompt(String, String),
    Handoff(String),
    Pause(String, bool),
}

/// Its answer.
enum Reply {
    Status(Result<StatusDocument, String>),
    Journal(String, Result<Vec<ActionRecord>, String>),
    Done(String),
}

/// Talks to the daemon on a thread of its own, each request a task of its own, so a
/// slow prompt does not hold up the polls.
fn spawn_worker(
    client: ControlClient,
) -> anyhow::Result<(tokio::sync::mpsc::UnboundedSender<Request>, mpsc::Receiver<Reply>)> {
    let (req_tx, mut req_rx) = tokio::sync::mpsc::unbounded_channel::<Request>();
    let (reply_tx, reply_rx) = mpsc::channel();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("top-client".into()).spawn(move || {
        runtime.block_on(async move {
            let local = tokio::task::LocalSet::new();
            local
                .run_until(async move {
                    while let Some(request) = req_rx.recv().await {
                        let (client, reply_tx) = (client.clone(), reply_tx.clone());
                        tokio::task::spawn_local(async move {
                            let _ = reply_tx.send(answer(&client, request).await);
                        });
                    }
                })
                .await;
        });
    })?;
    Ok((req_tx, reply_rx))
}

async fn answer(client: &ControlClient, request: Request) -> Reply {
    match request {
        Request::Status => Reply::Status(client.status(POLL_HISTORY).await.map_err(|e| e.to_string())),
        Request::Journal(id, limit) => {
            let records = client.session_history(&id, limit).await.map_err(|e| e.to_string());
            Reply::Journal(id, records)
        }
        Request::Prompt(id, text) => {
            let request = CustomPromptRequest { message: Some(text), ..CustomPromptRequest::default() };
            Reply::Done(match client.prompt(&id, &request).await {
                Ok(r) if r.success => format!("prompt sent to {id}"),
                Ok(r) => format!("prompt not sent to {id}: {}", r.reason.unwrap_or_else(|| "no reason given".into())),
                Err(e) => format!("prompt not sent to {id}: {e}"),
            })
        }
        Request::Handoff(id) => Reply::Done(match client.handoff(&id).await {
            Ok(view) => format!("hand-off of {id}: {}", view.phase),
            Err(e) => format!("hand-off of {id} not started: {e}"),
        }),
        Request::Pause(id, pause) => Reply::Done(match client.set_pause(Some(&id), pause, None, "top").await {
            Ok(view) => match view.paused {
                Some(why) => format!("{id} paused ({why})"),
                None => format!("{id} resumed"),
            },
            Err(e) => format!("{id}: {e}"),
        }),
    }
}

/// Raw mode and the alternate screen, undone on drop — also when the loop fails or
/// panics — so the shell gets its terminal back as it was.
struct Screen {
    extras: bool,
}

impl Screen {
    fn enter(extras: bool) -> anyhow::Result<Screen> {
        term::enable_raw_mode().context("switching the terminal to raw mode")?;
        let screen = Screen { extras };
        let mut out = std::io::stdout();
        execute!(out, term::EnterAlternateScreen, cursor::Hide).context("entering the alternate screen")?;
        if extras {
            let _ = out.write_all(terminal::PUSH_TITLE.as_bytes());
        }
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore(true);
            previous(info);
        }));
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore(self.extras);
    }
}

fn restore(extras: bool) {
    let mut out = std::io::stdout();
    if extras {
        let _ = out.write_all(terminal::CLEAR_PROGRESS.as_bytes());
        let _ = out.write_all(terminal::POP_TITLE.as_bytes());
    }
    let _ = execute!(out, cursor::Show, term::LeaveAlternateScreen);
    let _ = term::disable_raw_mode();
}

fn interactive(client: ControlClient, opts: &TopOptions, palette: Palette) -> anyhow::Result<()> {
    let (requests, replies) = spawn_worker(client)?;
    let screen = Screen::enter(opts.title || opts.progress)?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut terminal = ratatui::Terminal::new(backend).context("drawing on the terminal")?;
    terminal.clear()?;
    let mut app = App::default();
    let mut next_poll = Instant::now();
    let mut polling = false;
    // The session whose journal was asked for last.
    let mut journal_for: Option<String> = None;
    loop {
        if !polling && Instant::now() >= next_poll {
            polling = requests.send(Request::Status).is_ok();
            next_poll = Instant::now() + opts.refresh_interval;
        }
        while let Ok(reply) = replies.try_recv() {
            match reply {
                Reply::Status(answer) => {
                    polling = false;
                    app.on_status(answer);
                    if let Some(id) = app.detail_session() {
                        let _ = requests.send(Request::Journal(id.clone(), opts.journal_entries));
                        journal_for = Some(id);
                    }
                    if let Some(fleet) = &app.fleet {
                        let mut out = std::io::stdout();
                        if opts.title {
                            let _ = out.write_all(terminal::set_title(&terminal::title_text(fleet)).as_bytes());
                        }
                        if opts.progress {
                            let _ = out.write_all(terminal::progress(fleet).as_bytes());
                        }
                    }
                }
                Reply::Journal(id, answer) => app.on_journal(id, answer),
                Reply::Done(message) => {
                    app.on_done(message);
                    next_poll = Instant::now(); // show the effect at once
                }
            }
        }
        terminal.draw(|f| render::draw(f, &app, palette))?;
        let wait = next_poll.saturating_duration_since(Instant::now()).min(TICK);
        if !event::poll(wait)? {
            continue;
        }
        let Event::Key(key) = event::read()? else { continue };
        let Some(key) = map_key(key) else { continue };
        let command = app.on_key(key);
        match command {
            None => {}
            Some(Command::Quit) => break,
            Some(Command::Refresh) => next_poll = Instant::now(),
            Some(Command::Journal(id)) => {
                let _ = requests.send(Request::Journal(id.clone(), opts.journal_entries));
                journal_for = Some(id);
            }
            Some(Command::Prompt { session, text }) => {
                let _ = requests.send(Request::Prompt(session, text));
            }
            Some(Command::Handoff(session)) => {
                let _ = requests.send(Request::Handoff(session));
            }
            Some(Command::SetPause { session, pause }) => {
                let _ = requests.send(Request::Pause(session, pause));
            }
        }
        // The detail pane moved to another session: read that one's journal.
        match app.detail_session() {
            Some(id) if journal_for.as_deref() != Some(id.as_str()) => {
                let _ = requests.send(Request::Journal(id.clone(), opts.journal_entries));
                journal_for = Some(id);
            }
            Some(_) => {}
            None => journal_for = None,
        }
    }
    drop(terminal);
    drop(screen);
    Ok(())
}

fn map_key(key: KeyEvent) -> Option<Key> {
    if key.kind != KeyEventKind::Press {
        return None;
    }
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Some(Key::Interrupt);
    }
    Some(match key.code {
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        _ => return None,
    })
}
