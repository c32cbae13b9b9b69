//! Log lines a test binary writes, captured as JSON from every thread, to look for what
//! must (or must never) appear in them.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use shepherd::logging::Redacting;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

static LOGS: OnceLock<Captured> = OnceLock::new();

/// Starts capturing (once per test binary: the first call's settings hold), written
/// the way `shepherd run` writes them — through the daemon's [`Redacting`] writer.
pub fn capture(level: tracing::Level) {
    install(level, true);
}

/// Starts capturing what the code logs, before redaction: for tests that a secret is
/// never handed to the log at all.
pub fn capture_raw(level: tracing::Level) {
    install(level, false);
}

fn install(level: tracing::Level, redacting: bool) {
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        let builder = tracing_subscriber::fmt().json().with_max_level(level);
        let installed = if redacting {
            tracing::subscriber::set_global_default(builder.with_writer(Redacting(move || writer.clone())).finish())
        } else {
            tracing::subscriber::set_global_default(builder.with_writer(move || writer.clone()).finish())
        };
        installed.expect("the only subscriber of this test binary");
        logs
    });
}

/// Everything captured so far (nothing before [`capture`]).
pub fn logged() -> String {
    LOGS.get().map(|l| String::from_utf8_lossy(&l.0.lock().unwrap()).into_owned()).unwrap_or_default()
}
