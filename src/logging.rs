//! Log output: JSON lines in production, human-readable in a terminal.
//!
//! Every action record is one event under the `shepherd::action` target with its
//! fields (`server`, `session`, `action`, `outcome`, `reason`, numbers), so JSON logs
//! can be filtered and aggregated without parsing messages.
//!
//! Every line passes the redactor ([`Redacting`]) on its way out, whatever it carries
//! (a title, a prompt, an error body that echoes a request): one door, not a call at
//! each `tracing::` site. The daemon hands it the configured redactor
//! ([`set_redactor`]); until then the built-in secret shapes apply.
//!
//! Lines are written by a thread of their own (`shepherd-log`), never by the thread that
//! logs: a log reader that stops reading — a terminal paused with Ctrl-S, a stuck
//! journald, a full pipe — would otherwise stop every session on that thread at its next
//! line. At most [`QUEUED_LINES`] wait; past that a line is dropped and counted
//! (`shepherd_log_lines_dropped_total`) rather than supervision waiting: the ledger's
//! journal keeps every action whatever the log loses. Lines still queued are written
//! when the [`LogGuard`] is dropped, at the end of the process.

use std::io::{IsTerminal, Write};
use std::sync::{OnceLock, RwLock};

use shepherd_actors::config::LogFormat;
use shepherd_actors::redact::Redactor;
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::format::{DefaultFields, Format};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The most log lines waiting for the log's thread (a few MB at most); past it lines are
/// dropped and counted. A burst of a fleet's recoveries logs some ten lines each.
pub const QUEUED_LINES: usize = 16 * 1024;

/// The process's count of dropped log lines, once its log is set up.
static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines dropped so far because the log's reader did not keep up.
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |c| c.dropped_lines() as u64)
}

/// Keeps the log's thread; dropping it writes out the lines still queued. Hold it until
/// the process ends.
#[must_use = "dropping the guard stops the log's thread"]
pub struct LogGuard {
    _worker: WorkerGuard,
}

/// A writer that hands each line to a thread of its own, which redacts it and writes it
/// to `sink`; at most `queued` lines wait, the rest are dropped and counted.
fn off_thread<W: Write + Send + 'static>(sink: W, queued: usize) -> (NonBlocking, WorkerGuard) {
    NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(queued)
        .thread_name("shepherd-log")
        .finish(RedactingWriter(sink))
}

/// The writer of the process's log, its count of dropped lines published.
fn process_writer<W: Write + Send + 'static>(sink: W) -> (NonBlocking, LogGuard) {
    let (writer, guard) = off_thread(sink, QUEUED_LINES);
    let _ = DROPPED.set(writer.error_counter());
    (writer, LogGuard { _worker: guard })
}

/// The redactor log lines pass: one per process, as the log subscriber is.
static LOG_REDACTOR: RwLock<Option<Redactor>> = RwLock::new(None);

/// Log lines from now on pass `redactor` (at start-up and after every reload).
pub fn set_redactor(redactor: Redactor) {
    if let Ok(mut r) = LOG_REDACTOR.write() {
        *r = Some(redactor);
    }
}

/// The redactor in force (the configured one once the daemon started; the built-in
/// shapes before): for every text leaving by another way than the log, on the thread
/// that sends it.
pub fn redactor() -> Redactor {
    LOG_REDACTOR.read().ok().and_then(|r| r.clone()).unwrap_or_default()
}

/// A [`MakeWriter`] whose writers redact each formatted event before writing it.
#[derive(Debug, Clone)]
pub struct Redacting<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Redacting<M> {
    type Writer = RedactingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        RedactingWriter(self.0.make_writer_for(meta))
    }
}

/// Writes what it is given, redacted. The fmt layer hands over one whole event per
/// `write`, and the log's thread writes each line it is handed in one `write_all` (one
/// call here), so a secret is never split between two calls.
#[derive(Debug)]
pub struct RedactingWriter<W>(W);

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(redactor().redact(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the configured level.
/// `RUST_LOG` if set, else `level`, else `info`.
fn env_filter(level: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(level)).unwrap_or_else(|_| EnvFilter::new("info"))
}

pub fn init(format: LogFormat, level: &str) -> LogGuard {
    let filter = env_filter(level);
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let (writer, guard) = process_writer(std::io::stderr());
    // Colours for a person at a terminal only: a redirected log (`2>>shepherd.log`, the
    // journal) gets none of their escape codes.
    let colours = std::io::stderr().is_terminal();
    install(tracing_subscriber::fmt().with_env_filter(filter).with_ansi(colours).with_writer(writer), json);
    guard
}

/// Installs the process's subscriber, JSON lines or plain. `try_init`: a second call
/// (tests) keeps the first subscriber.
fn install<W>(builder: tracing_subscriber::fmt::SubscriberBuilder<DefaultFields, Format, EnvFilter, W>, json: bool)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}

/// Like [`init`], but every line goes to the file at `path` (created private, 0600; it
/// must not exist), plain or JSON lines: the demo keeps its terminal for the narrative,
/// the fleet bench logs as production does without a terminal to write to.
pub fn init_file(format: LogFormat, level: &str, path: &std::path::Path) -> std::io::Result<LogGuard> {
    let file = crate::private_state::create_new(path)?;
    let filter = env_filter(level);
    let (writer, guard) = process_writer(file);
    install(tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(writer), format == LogFormat::Json);
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_log_line_carrying_session_text_is_written_redacted() {
        let lines = Lines::default();
        let out = lines.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(Redacting(move || out.clone())).finish();
        tracing::subscriber::with_default(subscriber, || {
            let body = r#"{"error":"bad request","echo":{"password":"hunter2-in-json"}}"#;
            tracing::warn!(title = "deploy with DATABASE_PASSWORD=hunter2-in-title", error = %body, "prompt failed");
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("DATABASE_PASSWORD=[REDACTED]") && text.contains("prompt failed"), "{text}");
        serde_json::from_str::<serde_json::Value>(text.trim()).expect("still one JSON line");
    }

    /// A log reader that takes nothing until it is opened: a terminal paused with Ctrl-S,
    /// a stuck journald.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, std::sync::Condvar)>,
        lines: Lines,
    }

    impl Gate {
        fn open(&self) {
            *self.open.0.lock().unwrap() = true;
            self.open.1.notify_all();
        }

        fn text(&self) -> String {
            String::from_utf8(self.lines.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, opened) = &*self.open;
            let _open = opened.wait_while(open.lock().unwrap(), |open| !*open).unwrap();
            self.lines.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs `n` lines through `writer` on a thread of its own, and says whether it got
    /// through them (it must, whatever the reader does).
    fn log_lines(writer: NonBlocking, n: usize) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(writer).finish();
            tracing::subscriber::with_default(subscriber, || {
                for i in 0..n {
                    tracing::info!(i, "a decision, with DATABASE_PASSWORD=hunter2");
                }
            });
            let _ = done.send(());
        });
        finished.recv_timeout(std::time::Duration::from_secs(60)).is_ok()
    }

    /// Logs `lines` lines through a queue of `queued` to a reader that reads nothing
    /// until they are all logged (which must not wait for it), then reads: what it got,
    /// and how many lines were dropped.
    fn log_to_a_stopped_reader(queued: usize, lines: usize) -> (String, usize) {
        let gate = Gate::default();
        let (writer, guard) = off_thread(gate.clone(), queued);
        let counter = writer.error_counter();
        assert!(log_lines(writer, lines), "logging waited for the stopped reader");
        gate.open();
        drop(guard);
        (gate.text(), counter.dropped_lines())
    }

    /// The thread that logs never waits for the log's reader: with the reader stopped it
    /// gets through its lines, and once the reader reads again every line it had room
    /// for is written, redacted, in order.
    #[test]
    fn a_log_reader_that_stops_reading_stops_no_one_and_loses_nothing_there_was_room_for() {
        let (text, dropped) = log_to_a_stopped_reader(100, 50);
        let numbers: Vec<&str> = text.lines().filter_map(|l| l.split("i=").nth(1)).collect();
        assert_eq!(numbers, (0..50).map(|i| i.to_string()).collect::<Vec<_>>(), "{text}");
        assert_eq!(dropped, 0);
        assert!(!text.contains("hunter2") && text.contains("DATABASE_PASSWORD=[REDACTED]"), "{text}");
    }

    /// Past the queue's bound a line is dropped and counted, not waited for.
    #[test]
    fn past_the_queue_lines_are_dropped_and_counted() {
        let (text, dropped) = log_to_a_stopped_reader(10, 200);
        let written = text.lines().count();
        assert_eq!(written + dropped, 200, "every line written or counted");
        assert!(written <= 20, "{written} written: the queue holds 10 (and the one being written)");
    }
}
