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
//! It also reads the log ahead of the writer ([`ReadAhead`]). Once a checkpoint has
//! copied the whole log, the writer starts it over from the top, writing over the
//! previous rounds' blocks; a log frame is 24 bytes longer than a page, so nearly every
//! write covers part of a block, and a block no longer in memory — the system reclaims
//! cold file pages under memory pressure, or proactively — is read from the disk before
//! the write can go on. On the fleet bench's host such a read took 0.3 ms on a quiet
//! disk and 20–50 ms behind a checkpoint's writes, and every intent (an abort waits for
//! its intent) waited with it. So the writer tells the read-ahead where it is: SQLite's
//! WAL hook gives the log's frames after each commit, the writer publishes them
//! ([`WriterEnd`]) and sends a note when it comes within half a read-ahead of the end
//! of what was read, or has started the log over; a thread of the read-ahead's own then
//! reads the next stretch — one second of the writer's current pace ([`ahead_bytes`])
//! — before the writer gets there. A burst that follows a lull is followed within its
//! first megabyte; an idle log sends no note and reads nothing.

use std::cell::Cell;
use std::io::Read as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

/// How often the log is copied back. Not a tuning knob: short enough that what was
/// written is copied back within a second, long enough to cost nothing when idle. Under
/// writes that never pause the log still grows (a passive checkpoint never catches up
/// with such a writer, and the log starts over only after one has): the fleet bench's
/// 10,000 sessions tracked at once leave ~100 MB, started over at the next lull.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// How far ahead of the writer the log is read: what the writer writes in this long at
/// its current pace, within [`AHEAD_MIN`]..[`AHEAD_MAX`]. Not a tuning knob: the
/// writer notes at half of it, so the read-ahead has half a second to answer, and pages
/// read are written over within a second, long before the system counts them cold.
const AHEAD: Duration = Duration::from_secs(1);
/// What was read ahead longer ago than this is not counted on: the system may have
/// taken it back (on the fleet bench's host a log's pages were gone within ~5 s of their
/// use). Not a tuning knob: twice [`AHEAD`], so a steady writer (it notes every half a
/// read-ahead, half a second at its pace) never finds its stretch counted stale, and one
/// back from a lull, or slower than [`AHEAD_MIN`] a second, has it read again.
const STALE: Duration = Duration::from_secs(2);
/// The least read ahead: a writer just back from a lull, whose pace is not known yet.
/// Half of it is the slack before its first note is answered (~15 ms at the busiest pace
/// measured; the read-ahead's thread sleeps until then, and answers at once), and what
/// an idle ledger's occasional write costs: 1 MiB read from memory.
const AHEAD_MIN: u64 = 1 << 20;
/// The most read ahead in one go: above twice what the busiest second measured wrote
/// (the fleet bench's stall phase, ~30 MB/s).
const AHEAD_MAX: u64 = 64 << 20;

/// The shortest span a pace is measured over: notes closer together than this would
/// measure noise.
const PACE_SPAN: Duration = Duration::from_millis(10);

/// The checkpointer thread's nice value (0 is normal, 19 the lowest): its work can wait. A
/// checkpoint under load is ~100 ms of copying and syncing once a second (the fleet
/// bench's stall phase), and on a machine with no core to spare the pumps, the sessions
/// and the ledger's writer — what an abort waits for — should have the cores first.
const NICE: libc::c_int = 10;

/// The log's header, and each frame's header before its page (SQLite's WAL format).
const WAL_HEADER: u64 = 32;
const FRAME_HEADER: u64 = 24;

/// Starts the checkpointer and the read-ahead for the database at `path`, whose writer
/// commits through `writer`; they run until the returned [`WriterEnd`] is dropped (the
/// writer thread drops it as it exits).
///
/// Two threads: the checkpointer's work can wait (it runs at [`NICE`]); the
/// read-ahead's cannot — the writer is on its way — and costs little CPU (it mostly
/// waits for a note, or for the disk), so it keeps the normal priority.
pub fn start(path: PathBuf, writer: &Connection) -> std::io::Result<WriterEnd> {
    let page: u64 = writer.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap_or(4096);
    let (notes, inbox) = mpsc::channel();
    let (done, writer_done) = mpsc::channel();
    let cursor = Arc::new(Cursor::default());
    let theirs = Arc::clone(&cursor);
    let log = log_path(&path);
    std::thread::Builder::new()
        .name("shepherd-ledger-readahead".into())
        .spawn(move || read_ahead(ReadAhead::new(log, FRAME_HEADER + page, Instant::now()), &theirs, &inbox))?;
    let checkpoints = notes.clone();
    std::thread::Builder::new()
        .name("shepherd-ledger-checkpoint".into())
        .spawn(move || run(&path, &writer_done, &checkpoints))?;
    follow_commits(writer);
    Ok(WriterEnd { cursor, notes, _done: done, last: 0, started_over: false })
}

/// The checkpointer's thread: a `PASSIVE` checkpoint every [`INTERVAL`], each that
/// found the log changed told to the read-ahead; a `TRUNCATE` one once the writer has
/// stopped.
fn run(path: &Path, writer_done: &mpsc::Receiver<()>, read_ahead: &mpsc::Sender<Note>) {
    crate::priority::lower_this_thread(NICE);
    let flags = OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = match Connection::open_with_flags(path, flags) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ledger: the checkpointer could not open the file; the log grows until the next start");
            return;
        }
    };
    // What the previous round left: a round that finds the log as it was (idle) tells
    // the read-ahead nothing, so an idle ledger wakes no thread but this one.
    let mut left = None;
    loop {
        match writer_done.recv_timeout(INTERVAL) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(log) = checkpoint(&conn, path, "PASSIVE") {
                    if left.replace(log) != Some(log) {
                        let _ = read_ahead.send(Note::Checkpointed(log));
                    }
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

/// What the read-ahead's thread is told.
enum Note {
    /// The writer nears the end of what was read, or started the log over.
    Moved,
    /// A checkpoint left the log so.
    Checkpointed(Log),
}

/// The read-ahead's thread: sleeps until told something; ends once the writer and the
/// checkpointer have both stopped.
fn read_ahead(mut ahead: ReadAhead, cursor: &Cursor, inbox: &mpsc::Receiver<Note>) {
    while let Ok(note) = inbox.recv() {
        match note {
            Note::Moved => ahead.follow(cursor, Instant::now()),
            Note::Checkpointed(log) => ahead.after_checkpoint(log, cursor, Instant::now()),
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

thread_local! {
    /// The log's frames after this thread's last commit, as SQLite's WAL hook told it.
    static LOG_FRAMES: Cell<u64> = const { Cell::new(0) };
}

/// Has `conn`'s commits leave the log's frames in [`LOG_FRAMES`] (of the committing
/// thread). SQLite's `wal_autocheckpoint` uses the same hook: set it after that pragma.
fn follow_commits(conn: &Connection) {
    conn.wal_hook(Some(|_, frames| {
        LOG_FRAMES.with(|f| f.set(u64::try_from(frames).unwrap_or(0)));
        Ok(())
    }));
}

/// Where the writer is in the log, shared by the writer and the read-ahead.
#[derive(Default)]
struct Cursor {
    /// The log's frames after the writer's last commit.
    frames: AtomicU64,
    /// The writer sends a note once the log holds this many frames.
    wake_at: AtomicU64,
    /// A note is on its way and not yet taken: the writer sends no other meanwhile.
    noted: AtomicBool,
}

/// The writer's end of the checkpointer and the read-ahead: told of each batch, it
/// publishes where the writer is and sends the read-ahead a note when it should read
/// further ahead. Dropping it tells the checkpointer the writer has stopped.
pub struct WriterEnd {
    cursor: Arc<Cursor>,
    notes: mpsc::Sender<Note>,
    /// Dropped with this end: the checkpointer's sign that the writer has stopped.
    _done: mpsc::Sender<()>,
    /// The frames after the previous batch.
    last: u64,
    /// The log was started over and no note has said so yet.
    started_over: bool,
}

impl WriterEnd {
    /// After a batch of the writer's (on the writer's thread).
    pub fn after_batch(&mut self) {
        self.committed(LOG_FRAMES.with(Cell::get));
    }

    /// The log holds `frames` frames after the writer's last commit. Costs two atomic
    /// loads and a store; a note is a channel send, a few a second under load.
    fn committed(&mut self, frames: u64) {
        if frames < self.last {
            self.started_over = true;
        }
        self.last = frames;
        self.cursor.frames.store(frames, Ordering::Release);
        let due = self.started_over || frames >= self.cursor.wake_at.load(Ordering::Acquire);
        if due && !self.cursor.noted.swap(true, Ordering::AcqRel) {
            self.started_over = false;
            // The read-ahead's thread gone (it panicked): nothing to tell.
            let _ = self.notes.send(Note::Moved);
        }
    }
}

/// Reads the log ahead of the writer (module doc).
struct ReadAhead {
    log: PathBuf,
    /// A frame's bytes: its header and a page.
    frame: u64,
    /// The writer's frames when last seen, and when.
    seen: (u64, Instant),
    /// The writer's pace when last measured, in frames a second.
    pace: f64,
    /// The stretch of the log (bytes) read for the writer's way ahead, and when it was
    /// last read further ([`STALE`]).
    warm: Range<u64>,
    warmed: Instant,
    /// A checkpoint copied the log back whole when it held this many frames: the
    /// writer's next commit starts it over, and should say so.
    start_over_due: Option<u64>,
}

impl ReadAhead {
    fn new(log: PathBuf, frame: u64, now: Instant) -> Self {
        Self { log, frame, seen: (0, now), pace: 0.0, warm: 0..0, warmed: now, start_over_due: None }
    }

    /// The writer's note: it nears the end of what was read, or started the log over.
    fn follow(&mut self, cursor: &Cursor, now: Instant) {
        let frames = cursor.frames.load(Ordering::Acquire);
        self.measure(frames, now);
        let at = WAL_HEADER + frames * self.frame;
        let ahead = ahead_bytes(self.pace, self.frame);
        // A log that cannot be read wakes the read-ahead only when started over, not at
        // every commit.
        let mut wake_at = match self.len() {
            Some(len) if self.warm_up(at, ahead, len, now) => wake_at(self.warm.end, ahead, self.frame, len),
            _ => u64::MAX,
        };
        // Not started over yet (another note came first): the next commit still tells.
        match self.start_over_due {
            Some(copied) if frames == copied => wake_at = 0,
            _ => self.start_over_due = None,
        }
        cursor.wake_at.store(wake_at, Ordering::Release);
        cursor.noted.store(false, Ordering::Release);
    }

    /// After a checkpoint: when it copied the whole log back, the writer starts over
    /// at the top with its next commit — read that stretch now, ahead of it, and have
    /// that commit note (a log started over may hold more frames at once than the old
    /// one did, which the writer alone would not tell from going on). Once read, the
    /// top is not read again while the log is idle (the checkpointer tells no idle round).
    fn after_checkpoint(&mut self, log: Log, cursor: &Cursor, now: Instant) {
        self.measure(log.frames, now);
        if log.copied < log.frames {
            return; // the writer goes on where it is, and its notes say where
        }
        if let Some(len) = self.len() {
            self.warm_up(WAL_HEADER, ahead_bytes(self.pace, self.frame), len, now);
        }
        self.start_over_due = Some(log.frames);
        cursor.wake_at.store(0, Ordering::Release);
    }

    /// The writer's pace since it was last seen; notes closer together than
    /// [`PACE_SPAN`] measure from the earlier one.
    fn measure(&mut self, frames: u64, now: Instant) {
        let (before, then) = self.seen;
        let span = now.saturating_duration_since(then);
        // Fewer frames than before: the log was started over; at least these are new.
        let (written, started_over) = if frames >= before { (frames - before, false) } else { (frames, true) };
        if span < PACE_SPAN && !started_over {
            return;
        }
        self.pace = written as f64 / span.max(PACE_SPAN).as_secs_f64();
        self.seen = (frames, now);
    }

    fn len(&self) -> Option<u64> {
        std::fs::metadata(&self.log).map(|m| m.len()).ok()
    }

    /// Reads what [`plan`] says is missing of `ahead` bytes past `at`; `false` when the
    /// log could not be read (logged at debug: the writer then reads for itself).
    fn warm_up(&mut self, at: u64, ahead: u64, len: u64, now: Instant) -> bool {
        if now.saturating_duration_since(self.warmed) > STALE {
            self.warm = 0..0; // read too long ago to count on
        }
        let (warm, read) = plan(&self.warm, at, ahead, len);
        if let Some(range) = read {
            if let Err(e) = self.read(range) {
                tracing::debug!(path = %self.log.display(), error = %e, "ledger: could not read the log ahead of the writer");
                return false;
            }
        }
        if warm != self.warm {
            self.warm = warm;
            self.warmed = now;
        }
        true
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

/// How far ahead of the writer to read at `pace` frames a second of `frame` bytes:
/// [`AHEAD`] of it, within [`AHEAD_MIN`]..[`AHEAD_MAX`].
fn ahead_bytes(pace: f64, frame: u64) -> u64 {
    let bytes = pace * frame as f64 * AHEAD.as_secs_f64();
    (bytes as u64).clamp(AHEAD_MIN, AHEAD_MAX)
}

/// With `warm` read already, what to read (byte offsets) so that `ahead` bytes past `at`
/// (where the writer's next frame goes) are in memory, in a file of `len` bytes, and
/// what is warm then. From the end of `warm` when the writer is within it; from `at`
/// when it is elsewhere (it started the log over, or passed the end). Nothing past the
/// file's end: appending reads nothing.
fn plan(warm: &Range<u64>, at: u64, ahead: u64, len: u64) -> (Range<u64>, Option<Range<u64>>) {
    let within = warm.start <= at && at <= warm.end;
    let (start, from) = if within { (warm.start, warm.end) } else { (at, at) };
    let end = at.saturating_add(ahead).min(len).max(from);
    (start..end, (from < end).then_some(from..end))
}

/// The log's frames at which the writer should note again: half a read-ahead before the
/// end of `warm_end`; never (`u64::MAX`, only a new start of the log notes) once what was
/// read reaches the file's end, past which the writer appends.
fn wake_at(warm_end: u64, ahead: u64, frame: u64, len: u64) -> u64 {
    if warm_end >= len {
        return u64::MAX;
    }
    warm_end.saturating_sub(ahead / 2).saturating_sub(WAL_HEADER) / frame
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: u64 = FRAME_HEADER + 4096;
    const MIB: u64 = 1 << 20;

    #[test]
    fn the_writer_is_read_ahead_one_second_of_its_pace_within_bounds() {
        assert_eq!(ahead_bytes(0.0, FRAME), AHEAD_MIN, "a writer back from a lull: the least");
        assert_eq!(ahead_bytes(2_000.0, FRAME), 2_000 * FRAME);
        assert_eq!(ahead_bytes(1e9, FRAME), AHEAD_MAX);
    }

    #[test]
    fn a_writer_within_what_was_read_has_only_the_rest_read() {
        let (warm, read) = plan(&(0..10 * MIB), 6 * MIB, 8 * MIB, 100 * MIB);
        assert_eq!(read, Some(10 * MIB..14 * MIB));
        assert_eq!(warm, 0..14 * MIB);
        let (_, read) = plan(&(0..14 * MIB), 6 * MIB, 8 * MIB, 100 * MIB);
        assert_eq!(read, None, "already read");
    }

    #[test]
    fn a_writer_that_started_over_is_read_ahead_from_where_it_is() {
        let (warm, read) = plan(&(50 * MIB..60 * MIB), WAL_HEADER, 4 * MIB, 100 * MIB);
        assert_eq!(read, Some(WAL_HEADER..WAL_HEADER + 4 * MIB));
        assert_eq!(warm, WAL_HEADER..WAL_HEADER + 4 * MIB);
    }

    #[test]
    fn nothing_past_the_files_end_is_read() {
        let (warm, read) = plan(&(0..0), 90 * MIB, 20 * MIB, 100 * MIB);
        assert_eq!(read, Some(90 * MIB..100 * MIB), "up to the file's end");
        assert_eq!(wake_at(warm.end, 20 * MIB, FRAME, 100 * MIB), u64::MAX, "past it the writer appends: no note");
        assert_eq!(plan(&(0..0), 120 * MIB, 20 * MIB, 100 * MIB).1, None, "appending reads nothing");
    }

    #[test]
    fn the_writer_notes_half_a_read_ahead_before_the_end_of_what_was_read() {
        let end = WAL_HEADER + 3_000 * FRAME;
        assert_eq!(wake_at(end, 2_000 * FRAME, FRAME, 100 * MIB), 2_000);
    }

    /// The writer's end and the cursor it shares, with the checkpointer's inbox.
    fn writer_end() -> (WriterEnd, Arc<Cursor>, mpsc::Receiver<Note>) {
        let (notes, inbox) = mpsc::channel();
        let cursor = Arc::new(Cursor::default());
        let (done, _) = mpsc::channel();
        (WriterEnd { cursor: Arc::clone(&cursor), notes, _done: done, last: 0, started_over: false }, cursor, inbox)
    }

    /// The checkpointer takes every note waiting, as its thread would.
    fn take_notes(inbox: &mpsc::Receiver<Note>, cursor: &Cursor, wake_at: u64) -> usize {
        let n = inbox.try_iter().count();
        if n > 0 {
            cursor.wake_at.store(wake_at, Ordering::Release);
            cursor.noted.store(false, Ordering::Release);
        }
        n
    }

    #[test]
    fn the_writer_notes_once_it_reaches_the_mark_and_not_again_until_the_note_is_taken() {
        let (mut w, cursor, inbox) = writer_end();
        w.committed(5);
        assert_eq!(take_notes(&inbox, &cursor, 100), 1, "nothing read yet: the first commit notes");
        w.committed(50);
        assert_eq!(take_notes(&inbox, &cursor, 100), 0, "below the mark");
        w.committed(100);
        w.committed(120);
        w.committed(140);
        assert_eq!(cursor.frames.load(Ordering::Acquire), 140, "where the writer is, published");
        assert_eq!(take_notes(&inbox, &cursor, 1_000), 1, "one note until it is taken");
    }

    #[test]
    fn a_log_started_over_is_noted_even_when_a_note_was_on_its_way() {
        let (mut w, cursor, inbox) = writer_end();
        w.committed(500);
        w.committed(3); // started over while the first note waits
        assert_eq!(inbox.try_iter().count(), 1);
        cursor.wake_at.store(10_000, Ordering::Release);
        cursor.noted.store(false, Ordering::Release);
        w.committed(4);
        assert_eq!(take_notes(&inbox, &cursor, 10_000), 1, "the new start is told, though below the mark");
        w.committed(5);
        assert_eq!(take_notes(&inbox, &cursor, 10_000), 0);
    }

    #[test]
    fn the_commit_after_a_checkpoint_copied_the_log_back_whole_notes_whatever_it_holds() {
        let (mut w, cursor, inbox) = writer_end();
        let dir = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        // No log file to read: only the notes are looked at here.
        let mut ahead = ReadAhead::new(dir.path().join("none-wal"), FRAME, t0);
        w.committed(1);
        assert_eq!(inbox.try_iter().count(), 1);
        ahead.follow(&cursor, t0);
        ahead.after_checkpoint(Log { frames: 1, copied: 1 }, &cursor, t0 + INTERVAL);
        // Started over, the log holds more frames than the old one did: the writer
        // alone would not tell.
        w.committed(4);
        assert_eq!(inbox.try_iter().count(), 1, "the start over is noted");
        ahead.follow(&cursor, t0 + INTERVAL);
        w.committed(5);
        assert_eq!(inbox.try_iter().count(), 0, "then quiet again");
    }

    #[test]
    fn what_was_read_long_ago_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("l-wal");
        std::fs::write(&log, vec![0u8; 4 << 20]).unwrap();
        let t0 = Instant::now();
        let mut ahead = ReadAhead::new(log, FRAME, t0);
        assert!(ahead.warm_up(WAL_HEADER, MIB, 4 * MIB, t0));
        assert_eq!(ahead.warm, WAL_HEADER..WAL_HEADER + MIB);
        assert!(ahead.warm_up(WAL_HEADER + 100, MIB, 4 * MIB, t0 + STALE / 2));
        assert_eq!(ahead.warm.start, WAL_HEADER, "recent: only the rest was read");
        assert!(ahead.warm_up(WAL_HEADER + 200, MIB, 4 * MIB, t0 + STALE * 2));
        assert_eq!(ahead.warm, WAL_HEADER + 200..WAL_HEADER + 200 + MIB, "stale: read again from the writer");
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

    /// A log a burst filled and a checkpoint copied back whole, its pages gone from
    /// memory as after a lull: the writer's connection (its commits told through the WAL
    /// hook), a read-ahead of the log that has read nothing yet, the log's path, and a
    /// commit of one row.
    #[cfg(target_os = "linux")]
    fn cold_log(dir: &Path) -> (Connection, ReadAhead, PathBuf, impl Fn(&Connection)) {
        let db = dir.join("l.sqlite3");
        let w = Connection::open(&db).unwrap();
        w.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT)").unwrap();
        follow_commits(&w);
        let row = "x".repeat(3000);
        let commit = move |c: &Connection| {
            c.execute("INSERT INTO t(s) VALUES (?1)", [&row]).unwrap();
        };
        for _ in 0..3000 {
            commit(&w);
        }
        let checkpointer = Connection::open(&db).unwrap();
        let log = checkpoint(&checkpointer, &db, "PASSIVE").unwrap();
        assert_eq!(log.copied, log.frames, "copied back whole: the writer starts over at its next commit");
        let wal = log_path(&db);
        evict(&wal);
        let page: u64 = w.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        let ahead = ReadAhead::new(wal.clone(), FRAME_HEADER + page, Instant::now());
        (w, ahead, wal, commit)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_burst_after_a_lull_finds_the_log_it_writes_over_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut ahead, wal, commit) = cold_log(dir.path());
        let (mut end, cursor, inbox) = writer_end();
        // The writer's first commit after the lull starts the log over at the top, and
        // may read its first blocks; from there on its notes keep it ahead.
        commit(&w);
        end.after_batch();
        let mut cold = 0;
        for _ in 0..600 {
            // The read-ahead's thread, here in step with the writer's.
            if inbox.try_iter().count() > 0 {
                ahead.follow(&cursor, Instant::now());
            }
            let before = storage_reads();
            commit(&w);
            end.after_batch();
            cold += storage_reads() - before;
        }
        assert!(cursor.frames.load(Ordering::Acquire) > 600, "the burst wrote over the log's old blocks");
        // The same burst without the read-ahead reads what it writes over.
        evict(&wal);
        let before = storage_reads();
        for _ in 0..600 {
            commit(&w);
        }
        let without = storage_reads() - before;
        if without == 0 {
            eprintln!("this file system keeps the log in memory (or cannot drop it): nothing to read ahead of here");
            return;
        }
        assert_eq!(cold, 0, "the writer read {without} bytes from storage without the read-ahead");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_checkpoint_that_copied_the_log_back_reads_the_top_before_the_writer_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let (w, mut ahead, _, commit) = cold_log(dir.path());
        ahead.after_checkpoint(Log { frames: 3_000, copied: 3_000 }, &Cursor::default(), Instant::now() + Duration::from_secs(1));
        let before = storage_reads();
        for _ in 0..50 {
            commit(&w);
        }
        assert_eq!(storage_reads() - before, 0, "the top of the log was read ahead of the first commits");
    }
}
