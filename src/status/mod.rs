//! The fleet's status — the status file and `GET /v1/status` — and the file's writer.
//!
//! An edge adapter, off the hot path. The [`StatusBoard`] holds the [`StatsBook`]
//! (pure, in `shepherd-actors`) and builds the one [`StatusDocument`] both the file and
//! the control API show, from the book, the supervisor's sessions and servers, and the
//! event pumps' counters. The [`StatusWriter`] runs on a thread of its own: it folds
//! every journal record into the board's book and — with `status.enabled`, when records
//! arrived, at most every `status.min_interval`, and at least every
//! `status.refresh_interval` — asks the supervisor for its sessions (status, todos,
//! tokens; read in slices, so the guard beside it waits for one at most) — kept between
//! refreshes as [`LiveFleet`], about a third of the supervisor's full view — builds the
//! document and streams it into the file with [`write_atomic_with`]: temp file in the
//! same folder (created 0600 with `O_EXCL|O_NOFOLLOW`), fsync, rename, fsync the
//! folder. A reader (or a crash at any point) sees the old file or the new one, never
//! half of one. At start-up the previous file is rotated into `status.rotate` archives
//! (`status.json.1` the newest).
//!
//! Parts: [`render`] (the `shepherd status` command's readable view of the file).

pub mod render;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::Addr;
use anyhow::Context as _;
use shepherd_actors::config::{StatusConfig, MIN_WRITE_SHARE};
use shepherd_actors::journal::{ActionRecord, Journal, QueuedRecords};
use shepherd_actors::stats::{LiveSession, StatsBook, StatusDocument, StreamFacts};
use shepherd_actors::supervisor::{InspectLive, LiveView, Supervisor};
use tokio::sync::{broadcast, watch};

use crate::opencode::PumpRegistry;
use crate::store::STATE_SUBDIR;

/// How long the writer waits for the supervisor's list of sessions (a wedged or
/// stopped supervisor must not stop the statistics from being written).
const LIVE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The status file is written through a buffer of this size.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// The writer's thread runs at this nice value (0 is normal, 19 the lowest): on a
/// machine with no core to spare it takes the time the pumps and the sessions leave.
/// At 100,000 sessions one write is about 100 MB of JSON, a core for a second or two;
/// at normal priority it took that from the pump in the middle of a burst of stalls.
const WRITER_NICE: libc::c_int = 10;

/// The status file's name in the state folder when `status.path` is empty.
pub const STATUS_FILE_NAME: &str = "status.json";

/// Where the status file lives: `status.path` (a leading `~/` is the home directory), or
/// `$XDG_STATE_HOME/shepherd/status.json`, or `~/.local/state/shepherd/status.json`.
pub fn status_path(cfg: &StatusConfig, lookup: &dyn Fn(&str) -> Option<OsString>) -> anyhow::Result<PathBuf> {
    let absolute = |name: &str| lookup(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let configured = cfg.path.trim();
    if !configured.is_empty() {
        return match configured.strip_prefix("~/") {
            Some(rest) => Ok(absolute("HOME").context("status.path: cannot expand ~/ (HOME is not set)")?.join(rest)),
            None => Ok(PathBuf::from(configured)),
        };
    }
    let state =
        absolute("XDG_STATE_HOME")
            .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))
            .context("status.path: no default location (neither XDG_STATE_HOME nor HOME is set); set status.path")?;
    Ok(state.join(STATE_SUBDIR).join(STATUS_FILE_NAME))
}

/// Writes `bytes` to `path` so that `path` always holds either its old content or all
/// of the new: a temp file beside it, written and fsynced, renamed over it, and the
/// folder fsynced so the rename itself survives a power cut.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// [`write_atomic`] with the content written by `fill` through a buffer, so a large
/// document is never whole in memory as bytes.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = crate::private_state::temp_path(path);
    // A leftover (or planted) entry at the temp path is removed, never followed: the
    // temp file is then created 0600 with O_EXCL|O_NOFOLLOW, and renamed into place.
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let file = crate::private_state::create_new(&tmp)?;
        let mut w = std::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        fill(&mut w)?;
        let f = w.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Temp files a killed writer left beside `path` ([`write_atomic`]'s `.NAME.PID.tmp`).
fn remove_stale_temp_files(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.starts_with(&prefix) && file.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Shifts `path` into numbered archives: `path.1` (newest) … `path.keep`; the oldest
/// falls off. With `keep` 0 nothing is kept (the file is replaced by the first write).
pub fn rotate(path: &Path, keep: u32) -> std::io::Result<()> {
    if !path.exists() || keep == 0 {
        return Ok(());
    }
    let archive = |n: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    let _ = std::fs::remove_file(archive(keep));
    for n in (1..keep).rev() {
        let from = archive(n);
        if from.exists() {
            std::fs::rename(&from, archive(n + 1))?;
        }
    }
    std::fs::rename(path, archive(1))
}

/// Reads and parses a status file.
pub fn read(path: &Path) -> anyhow::Result<StatusDocument> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a Shepherd status file", path.display()))
}

/// The fleet's status: the statistics folded from the journal, and the live view read
/// on demand. Cloned freely (the control API holds one); [`StatusBoard::document`] is
/// the one builder of the status file and `GET /v1/status`.
#[derive(Clone)]
pub struct StatusBoard {
    inner: Arc<Board>,
}

struct Board {
    book: Mutex<StatsBook>,
    supervisor: Addr<Supervisor>,
    pumps: PumpRegistry,
    instance: String,
    forget_after_ms: i64,
}

impl StatusBoard {
    pub fn new(cfg: &StatusConfig, supervisor: Addr<Supervisor>, pumps: PumpRegistry, instance: String) -> Self {
        let forget_after_ms = i64::try_from(cfg.forget_after.as_millis()).unwrap_or(i64::MAX);
        let book = Mutex::new(StatsBook::new(cfg.max_history));
        Self { inner: Arc::new(Board { book, supervisor, pumps, instance, forget_after_ms }) }
    }

    /// Folds one journal record into the statistics.
    pub fn apply(&self, record: &ActionRecord) {
        self.inner.book.lock().unwrap_or_else(PoisonError::into_inner).apply(record);
    }

    /// The supervisor's sessions and servers, as the document needs them. A stopped or
    /// wedged supervisor answers nothing within `LIVE_READ_TIMEOUT`: the statistics are
    /// still shown, the sessions then as untracked.
    pub async fn read_live(&self) -> LiveFleet {
        // Before the question: no session's quiet time is overstated by the read's length.
        let read_ms = shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock);
        // Read on the supervisor's thread, in slices (`InspectLive`), not on this niced
        // one: a reader preempted while it holds a registry shard's lock holds up the
        // pump waiting on that shard.
        let fleet: LiveView = tokio::time::timeout(LIVE_READ_TIMEOUT, self.inner.supervisor.send(InspectLive))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        // Sorted and redacted here, on the status thread, not on the supervisor's or by
        // each session actor.
        let r = crate::logging::redactor();
        let mut sessions = fleet.sessions;
        for live in &mut sessions {
            if let Some(title) = live.title.as_mut() {
                r.redact_in_place(title);
            }
        }
        sessions.sort_unstable_by(|a, b| (&*a.server, &*a.id).cmp(&(&*b.server, &*b.id)));
        LiveFleet {
            read_ms,
            reconciled: fleet.servers.iter().filter(|s| s.connected && s.reconciled).map(|s| s.name.clone()).collect(),
            sessions,
        }
    }

    /// The status document from `fleet` (as [`StatusBoard::read_live`] gave it), the
    /// statistics and the pumps' counters now. Sessions gone from memory and quiet for
    /// `status.forget_after` are forgotten first.
    pub fn document(&self, fleet: &LiveFleet) -> StatusDocument {
        let now_ms = shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock);
        let streams = self.streams(fleet);
        let mut book = self.inner.book.lock().unwrap_or_else(PoisonError::into_inner);
        book.forget_quiet(&fleet.sessions, now_ms, self.inner.forget_after_ms);
        book.document(&fleet.sessions, fleet.read_ms, &streams, now_ms, &self.inner.instance)
    }

    /// The document with the fleet as it is now (`GET /v1/status`).
    pub async fn snapshot(&self) -> StatusDocument {
        let fleet = self.read_live().await;
        self.document(&fleet)
    }

    /// Each pump's counters joined with the supervisor's view of its server.
    fn streams(&self, fleet: &LiveFleet) -> Vec<StreamFacts> {
        use std::sync::atomic::Ordering::Relaxed;
        let pumps = self.inner.pumps.read().unwrap_or_else(PoisonError::into_inner);
        pumps
            .iter()
            .map(|(name, stats)| StreamFacts {
                name: name.clone(),
                connected: stats.connected.load(Relaxed),
                reconciled: fleet.reconciled.contains(name),
                connects: stats.connects.load(Relaxed),
                frames: stats.frames.load(Relaxed),
                malformed: stats.malformed.load(Relaxed),
                last_event_ms: stats.last_frame_ms(),
                opencode_version: stats.opencode_version(),
                behind_ms: stats.lag().map_or(0, |lag| lag.as_millis() as u64),
            })
            .collect()
    }
}

/// The fleet as the status document needs it: the servers connected and reconciled, and
/// a [`LiveSession`] per session in memory (kept by the writer between refreshes).
#[derive(Debug, Default)]
pub struct LiveFleet {
    /// Epoch ms the supervisor was asked: the sessions' states are as of then.
    read_ms: i64,
    reconciled: Vec<String>,
    sessions: Vec<LiveSession>,
}

/// The thread that folds the journal into the [`StatusBoard`] and, when the status file
/// is enabled, writes it.
pub struct StatusWriter {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    path: Option<PathBuf>,
}

impl StatusWriter {
    /// Rotates the previous file (when there is one to write) and starts folding (and
    /// writing `path`) on a thread of its own. Subscribes to the journal before
    /// returning, so no record is missed.
    pub fn start(
        cfg: &StatusConfig,
        path: Option<PathBuf>,
        journal: &Journal,
        board: StatusBoard,
    ) -> anyhow::Result<Self> {
        if let Some(path) = &path {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                crate::private_state::warn_if_loose(dir, &[name]);
                crate::private_state::create_dir(dir).with_context(|| format!("status: creating {}", dir.display()))?;
            }
            remove_stale_temp_files(path);
            rotate(path, cfg.rotate).with_context(|| format!("status: rotating {}", path.display()))?;
        }
        // Queued as they are made: a burst of recoveries cannot make the counts miss one.
        let records = journal.subscribe_queued();
        let (stop, stop_rx) = watch::channel(false);
        let cfg = cfg.clone();
        let file = path.clone();
        let thread = std::thread::Builder::new()
            .name("shepherd-status".into())
            .spawn(move || {
                crate::priority::lower_this_thread(WRITER_NICE);
                let system = actix::System::new();
                system.block_on(run(cfg, file, records, board, stop_rx));
            })
            .context("spawning the status writer thread")?;
        if let Some(path) = &path {
            tracing::info!(path = %path.display(), "status file");
        }
        Ok(Self { stop, thread: Some(thread), path })
    }

    /// The status file, when one is written.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Writes once more (the final state) and stops.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

async fn run(
    cfg: StatusConfig,
    path: Option<PathBuf>,
    mut records: QueuedRecords,
    board: StatusBoard,
    mut stop: watch::Receiver<bool>,
) {
    // The supervisor's view (status, todos, tokens) costs one message per session
    // actor: it is re-read every `refresh_interval`, not on every write. (Not keeping it
    // while the fleet is quiet saves little and moves the read into the first busy
    // moment after: on the 10k bench that took the abort latency's p99 from 6 to 13 ms.)
    let mut live = LiveFleet::default();
    let mut live_stale = true;
    let mut dirty = true; // the first write shows the fleet as it is
    let mut next_allowed = tokio::time::Instant::now();
    let mut refresh = tokio::time::interval(cfg.refresh_interval);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = records.recv() => match r {
                Ok(record) => {
                    board.apply(&record);
                    dirty = true;
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "status: fell behind the journal; some records are not counted");
                    dirty = true;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = refresh.tick() => {
                dirty = true;
                live_stale = true;
            }
            _ = tokio::time::sleep_until(next_allowed), if dirty && path.is_some() => {
                let started = tokio::time::Instant::now();
                let refreshed = live_stale;
                if live_stale {
                    live = board.read_live().await;
                    live_stale = false;
                }
                if let Some(path) = &path {
                    write(path, &board.document(&live));
                }
                if refreshed {
                    // The supervisor's full view and the document were the daemon's
                    // largest short-lived allocations: give their pages back.
                    crate::memory::trim();
                }
                let ended = tokio::time::Instant::now();
                let took = ended - started;
                next_allowed = next_write_at(ended, took, &cfg);
                if next_allowed - ended > cfg.min_interval {
                    tracing::debug!(
                        took_ms = took.as_millis() as u64,
                        next_in_ms = (next_allowed - ended).as_millis() as u64,
                        sessions = live.sessions.len(),
                        "status: the write took long; the next waits to keep within status.max_write_share"
                    );
                }
                dirty = false;
            }
            _ = stop.changed() => break,
        }
    }
    // Drain what is queued, then the final write: marked stopped, with the sessions as
    // last read (the supervisor, stopped before, has let them go: a read now would find
    // none, and the file said "0 session(s)" as if the fleet had gone).
    while let Some(record) = records.try_recv() {
        board.apply(&record);
    }
    if let Some(path) = &path {
        let mut last = board.document(&live);
        last.stopped_at_ms = Some(last.timestamp);
        write(path, &last);
    }
}

/// When the next write may start, after one that ended at `ended` and took `took`:
/// `status.min_interval` later, or later still so that writing keeps to
/// `status.max_write_share` of the time. The file of a large fleet is written less
/// often rather than taking a core from the sessions (and a write slowed by a busy
/// machine or disk spaces the next one out too).
fn next_write_at(ended: tokio::time::Instant, took: Duration, cfg: &StatusConfig) -> tokio::time::Instant {
    let share = cfg.max_write_share.clamp(MIN_WRITE_SHARE, 1.0);
    let rest = took.mul_f64((1.0 - share) / share);
    ended + rest.max(cfg.min_interval)
}

/// Serialises `doc` straight into the file (at 10k sessions the text is tens of MB).
fn write(path: &Path, doc: &StatusDocument) {
    if let Err(e) = write_atomic_with(path, |w| serde_json::to_writer_pretty(w, doc).map_err(std::io::Error::from)) {
        tracing::warn!(path = %path.display(), error = %e, "status: write failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    /// A fleet whose file takes long to write gets it written less often: writing keeps
    /// to its share of the time, and a quick write keeps `min_interval`.
    #[test]
    fn a_long_write_spaces_the_next_one_to_keep_the_writers_share() {
        let cfg = StatusConfig { max_write_share: 0.05, ..StatusConfig::default() };
        let t = tokio::time::Instant::now();
        let quick = next_write_at(t, Duration::from_millis(40), &cfg);
        assert_eq!(quick - t, cfg.min_interval, "40 ms every 2 s is 2 %: the interval stands");
        let slow = next_write_at(t, Duration::from_millis(500), &cfg);
        assert_eq!(slow - t, Duration::from_millis(9_500), "half a second of writing is followed by 9.5 s without");
        let share = 0.5 / (0.5 + (slow - t).as_secs_f64());
        assert!((share - 0.05).abs() < 1e-9, "{share}");
        let all = StatusConfig { max_write_share: 1.0, ..StatusConfig::default() };
        assert_eq!(next_write_at(t, Duration::from_secs(5), &all) - t, all.min_interval, "share 1: no spacing");
    }


    #[test]
    fn the_default_path_is_beside_the_ledger() {
        let cfg = StatusConfig::default();
        let p = status_path(&cfg, &env(&[("XDG_STATE_HOME", "/st")])).unwrap();
        assert_eq!(p, PathBuf::from("/st/shepherd/status.json"));
        let cfg = StatusConfig { path: "~/s.json".into(), ..StatusConfig::default() };
        assert_eq!(status_path(&cfg, &env(&[("HOME", "/h")])).unwrap(), PathBuf::from("/h/s.json"));
    }

    #[test]
    fn rotation_keeps_the_newest_archives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        for gen in 0..4 {
            std::fs::write(&path, format!("{gen}")).unwrap();
            rotate(&path, 2).unwrap();
        }
        assert!(!path.exists());
        let read = |n: u32| std::fs::read_to_string(dir.path().join(format!("status.json.{n}"))).unwrap();
        assert_eq!((read(1).as_str(), read(2).as_str()), ("3", "2"));
        assert!(!dir.path().join("status.json.3").exists());
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        write_atomic(&path, b"{\"a\":1}").unwrap();
        write_atomic(&path, b"{\"a\":2}").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":2}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
