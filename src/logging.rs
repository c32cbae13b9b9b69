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

use std::io::{IsTerminal, Write};
use std::sync::RwLock;

use shepherd_actors::config::LogFormat;
use shepherd_actors::redact::Redactor;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

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
/// `write`, so a secret is never split between two calls.
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

pub fn init(format: LogFormat, level: &str) {
    let filter = env_filter(level);
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(Redacting(std::io::stderr));
    // `try_init`: a second call (tests) keeps the first subscriber.
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.try_init() };
}

/// Like [`init`], but every line goes to the file at `path` (created private, 0600),
/// in the plain format: the demo keeps its terminal for the narrative.
pub fn init_file(level: &str, path: &std::path::Path) -> std::io::Result<()> {
    let file = crate::private_state::create_new(path)?;
    let filter = env_filter(level);
    let writer = Redacting(std::sync::Mutex::new(file));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(writer).try_init();
    Ok(())
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
}
