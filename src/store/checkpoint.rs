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
//!
//! It also reads ahead of the writer ([`warm_range`]). Once a checkpoint has copied the
//! whole log, the writer starts it over from the top, writing over the previous round's
//! blocks; a log frame is 24 bytes longer than a page, so nearly every write covers part
//! of a block, and a block no longer (or not wholly) in memory — the system reclaims
//! cold file pages under memory pressure, or proactively — is read from the disk before
//! the write can go on: on the fleet bench's host the writer waited 10–30 ms at a time
//! in ext4's `write_begin`, tens of times a run, and every intent (an abort waits for
//! its intent) waited with it. Reading the part of the log the writer is about to
//! overwrite, here, keeps those blocks in memory; appending past the end needs nothing.

use std::io::Read as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How often the log is copied back. Not a tuning knob: short enough that what was
/// written is copied back within a second, long enough to cost nothing when idle. Under
/// writes that never pause the log still grows (a passive checkpoint never catches up
/// with such a writer, and the log starts over only after one has): the fleet bench's
/// 10,000 sessions tracked at once leave ~100 MB, started over at the next lull.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// At most this much of the log is read ahead of the writer in one round. Not a tuning
/// knob: twice what the busiest second measured wrote (the fleet bench's stall phase,
/// ~25 MB/s); an idle log reads nothing.
const WARM_AHEAD_MAX: u64 = 64 << 20;

/// The log's header, and each frame's header before its page (SQLite's WAL format).
const WAL_HEADER: u64 = 32;
const FRAME_HEADER: u64 = 24;

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
    let page: u64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap_or(4096);
    let mut ahead = ReadAhead { log: log_path(path), frame: FRAME_HEADER + page, frames: 0 };
    loop {
        match writer_done.recv_timeout(INTERVAL) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(log) = checkpoint(&conn, path, "PASSIVE") {
                    ahead.after_checkpoint(log);
                }
            }
            // The writer has stopped: leave an empty log behind.
            _ => {
                checkpoint(&conn, path, "TRUNCATE");
                return;
            }
        }
    }
}

/// What a checkpoint left: the frames the log holds, and how many of them are copied
/// back (all: the writer starts the log over at its next write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Log {
    frames: u64,
    copied: u64,
}

/// Checkpoints; what it left, when SQLite says.
fn checkpoint(conn: &Connection, path: &Path, mode: &str) -> Option<Log> {
    let result =
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)));
    match result {
        Ok((frames, copied)) => Some(Log { frames: u64::try_from(frames).ok()?, copied: u64::try_from(copied).ok()? }),
        Err(e) => {
            tracing::warn!(path = %path.display(), mode, error = %e, "ledger: checkpoint failed; retried next time");
            None
        }
    }
}

/// The log's file beside the database's.
fn log_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// Reads the part of the log the writer is about to overwrite (module doc).
struct ReadAhead {
    log: PathBuf,
    /// A frame's bytes: its header and a page.
    frame: u64,
    /// The log's frames at the previous round.
    frames: u64,
}

impl ReadAhead {
    fn after_checkpoint(&mut self, log: Log) {
        let before = std::mem::replace(&mut self.frames, log.frames);
        if log.frames == before {
            return; // nothing written: an idle log costs nothing
        }
        let Ok(len) = std::fs::metadata(&self.log).map(|m| m.len()) else { return };
        let Some(range) = warm_range(log, before, self.frame, len) else { return };
        if let Err(e) = self.read(range) {
            tracing::debug!(path = %self.log.display(), error = %e, "ledger: could not read the log ahead of the writer");
        }
    }

    /// Reads `range` of the log and forgets it: what matters is that it is in memory.
    fn read(&self, range: Range<u64>) -> std::io::Result<()> {
        use std::io::Seek as _;
        #[cfg(unix)]
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&self.log)?
        };
        #[cfg(not(unix))]
        let mut file = std::fs::File::open(&self.log)?;
        file.seek(std::io::SeekFrom::Start(range.start))?;
        // Read and forgotten: a small buffer, let go of with the round.
        let mut buf = vec![0; 64 << 10];
        let mut left = range.end - range.start;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = file.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            left -= n as u64;
        }
        Ok(())
    }
}

/// The part of the log (byte offsets) to read ahead of the writer, now that it holds
/// `log.frames` frames of `frame` bytes and held `before` at the previous round, in a
/// file of `len` bytes: from where the next frame goes — the top, when every frame is
/// copied back and the writer starts over — twice what was written since (at most
/// [`WARM_AHEAD_MAX`]), within the file. `None` when nothing was written (an idle log
/// costs nothing) or the writer is at the file's end (appending reads nothing).
fn warm_range(log: Log, before: u64, frame: u64, len: u64) -> Option<Range<u64>> {
    let frames = log.frames;
    // Fewer frames than before: the log was started over; at least these are new.
    let written = if frames >= before { frames - before } else { frames };
    if written == 0 {
        return None;
    }
    let next = if log.copied >= frames { 0 } else { frames };
    let start = WAL_HEADER + next * frame;
    let end = start.saturating_add((2 * written * frame).min(WARM_AHEAD_MAX)).min(len);
    (start < end).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: u64 = FRAME_HEADER + 4096;

    /// A log of `frames`, `copied` of them copied back.
    fn log(frames: u64, copied: u64) -> Log {
        Log { frames, copied }
    }

    #[test]
    fn an_idle_log_is_not_read() {
        assert_eq!(warm_range(log(10, 5), 10, FRAME, 100 * FRAME), None);
        assert_eq!(warm_range(log(10, 10), 10, FRAME, 100 * FRAME), None, "copied back, and nothing more written");
        assert_eq!(warm_range(log(0, 0), 0, FRAME, 100 * FRAME), None);
    }

    #[test]
    fn a_log_started_over_is_read_ahead_of_the_writer_twice_as_far_as_it_wrote() {
        // The previous round ended at 5,000 frames; the writer started over and is at 100.
        let r = warm_range(log(100, 0), 5_000, FRAME, 10_000 * FRAME).unwrap();
        assert_eq!(r, WAL_HEADER + 100 * FRAME..WAL_HEADER + 300 * FRAME);
    }

    #[test]
    fn a_log_copied_back_whole_is_read_from_the_top_where_the_writer_starts_over() {
        let r = warm_range(log(5_000, 5_000), 4_000, FRAME, 10_000 * FRAME).unwrap();
        assert_eq!(r, WAL_HEADER..WAL_HEADER + 2_000 * FRAME);
    }

    #[test]
    fn a_growing_log_is_read_only_where_the_file_already_has_blocks() {
        assert_eq!(warm_range(log(200, 0), 100, FRAME, WAL_HEADER + 200 * FRAME), None, "appending: nothing to read");
        let r = warm_range(log(200, 0), 100, FRAME, WAL_HEADER + 250 * FRAME).unwrap();
        assert_eq!(r.end, WAL_HEADER + 250 * FRAME, "up to the file's end");
    }

    /// Bytes this thread has had read from storage (`/proc/thread-self/io`).
    #[cfg(target_os = "linux")]
    fn storage_reads() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines().find_map(|l| l.strip_prefix("read_bytes: ")).unwrap().trim().parse().unwrap()
    }

    /// The log's pages leave memory, as the system's reclaim would take them.
    #[cfg(target_os = "linux")]
    fn evict(log: &Path) {
        use std::os::fd::AsRawFd as _;
        let f = std::fs::File::open(log).unwrap();
        f.sync_all().unwrap();
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_log_started_over_is_read_ahead_so_the_writer_waits_on_no_disk_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.sqlite3");
        let w = Connection::open(&db).unwrap();
        w.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT)").unwrap();
        let row = "x".repeat(3000);
        let commits = |n: usize| {
            for _ in 0..n {
                w.execute("INSERT INTO t(s) VALUES (?1)", [&row]).unwrap();
            }
        };
        // A burst fills the log; the checkpointer copies all of it back.
        commits(3000);
        let checkpointer = Connection::open(&db).unwrap();
        let page: u64 = checkpointer.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        let burst = checkpoint(&checkpointer, &db, "PASSIVE").unwrap().frames;
        let mut ahead = ReadAhead { log: log_path(&db), frame: FRAME_HEADER + page, frames: burst };
        // The writer starts the log over; a reader keeps the next checkpoint from
        // finishing, so the writer goes on where it is rather than starting over again.
        commits(1);
        let reader = Connection::open(&db).unwrap();
        reader.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
        // The system takes the cold log's pages; the writer writes over them.
        evict(&ahead.log);
        let before = storage_reads();
        commits(300);
        let cold = storage_reads() - before;
        if cold == 0 {
            eprintln!("this file system keeps the log in memory (or cannot drop it): nothing to read ahead of here");
            return;
        }
        // The checkpointer's round reads ahead; the writer's next second needs no disk.
        let now = checkpoint(&checkpointer, &db, "PASSIVE").unwrap();
        assert!(now.frames < burst && now.copied < now.frames, "the log was started over, and the reader holds it");
        ahead.after_checkpoint(now);
        let before = storage_reads();
        commits(300);
        assert_eq!(storage_reads() - before, 0, "the writer read {cold} bytes from storage without the read-ahead");
        reader.execute_batch("COMMIT").unwrap();
    }

    #[test]
    fn a_burst_reads_ahead_at_most_the_bound() {
        let r = warm_range(log(100_000, 0), 1, FRAME, u64::MAX).unwrap();
        assert_eq!(r.end - r.start, WARM_AHEAD_MAX);
    }
}
