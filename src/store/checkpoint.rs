//! Copies the ledger's write-ahead log back into the database file on a thread of its
//! own, so the writer never waits on the disk for it.
//!
//! Why: with `synchronous = NORMAL` in WAL mode a commit only appends to the log; the
//! fsyncs happen when the log is copied back (a checkpoint). SQLite does that by
//! itself every 1,000 pages, inside whichever commit crosses the mark — on the one
//! writer thread, so every action waiting on the ledger (an intent written before an
//! abort) waited for those fsyncs too: tens of ms at the fleet bench's p99. The writer
//! turns that off (`wal_autocheckpoint = 0`) and this thread checkpoints `PASSIVE`ly
//! (never blocking the writer or a reader) every [`INTERVAL`], and once more, truncating
//! the log, when the writer has stopped.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the log is copied back. Not a tuning knob: short enough that the log stays
/// small (a busy second writes a few MB at most), long enough to cost nothing when idle.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Starts the checkpointer for the database at `path`; it runs until `writer_done`
/// disconnects (the writer thread drops its end as it exits).
pub fn start(path: PathBuf, writer_done: mpsc::Receiver<()>) -> std::io::Result<()> {
    std::thread::Builder::new().name("shepherd-ledger-checkpoint".into()).spawn(move || run(&path, &writer_done))?;
    Ok(())
}

fn run(path: &Path, writer_done: &mpsc::Receiver<()>) {
    let flags = OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = match Connection::open_with_flags(path, flags) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ledger: the checkpointer could not open the file; the log grows until the next start");
            return;
        }
    };
    loop {
        match writer_done.recv_timeout(INTERVAL) {
            Err(mpsc::RecvTimeoutError::Timeout) => checkpoint(&conn, path, "PASSIVE"),
            // The writer has stopped: leave an empty log behind.
            _ => {
                checkpoint(&conn, path, "TRUNCATE");
                return;
            }
        }
    }
}

fn checkpoint(conn: &Connection, path: &Path, mode: &str) {
    let result = conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()));
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), mode, error = %e, "ledger: checkpoint failed; retried next time");
    }
}
