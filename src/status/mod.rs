//! The status file: per-session statistics for external monitoring, written atomically.
//!
//! An edge adapter, off the hot path: the [`StatusWriter`] runs on a thread of its own.
//! It folds every journal record into a [`StatsBook`] (pure, in `shepherd-actors`),
//! and — when records arrived, at most every `status.min_interval`, and at least every
//! `status.refresh_interval` — asks the supervisor for its sessions (status, todos,
//! tokens), builds the [`StatusDocument`] and writes it with [`write_atomic`]: temp file
//! in the same folder, fsync, rename, fsync the folder. A reader (or a crash at any
//! point) sees the old file or the new one, never half of one. At start-up the previous
//! file is rotated into `status.rotate` archives (`status.json.1` the newest).
//!
//! Parts: [`render`] (the `shepherd status` command's readable view of the file).

pub mod render;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use actix::Addr;
use anyhow::Context as _;
use shepherd_actors::config::StatusConfig;
use shepherd_actors::control::{ListSessions, SessionDetail};
use shepherd_actors::journal::Journal;
use shepherd_actors::stats::{StatsBook, StatusDocument};
use shepherd_actors::supervisor::Supervisor;
use tokio::sync::{broadcast, watch};

use crate::store::STATE_SUBDIR;

/// How long the writer waits for the supervisor's list of sessions (a wedged or
/// stopped supervisor must not stop the statistics from being written).
const LIVE_READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
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

/// The running writer.
pub struct StatusWriter {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl StatusWriter {
    /// Rotates the previous file and starts writing `path` on a thread of its own.
    /// Subscribes to the journal before returning, so no record is missed.
    pub fn start(
        cfg: &StatusConfig,
        path: PathBuf,
        journal: &Journal,
        supervisor: Addr<Supervisor>,
        instance: String,
    ) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("status: creating {}", dir.display()))?;
        }
        remove_stale_temp_files(&path);
        rotate(&path, cfg.rotate).with_context(|| format!("status: rotating {}", path.display()))?;
        let records = journal.subscribe();
        let (stop, stop_rx) = watch::channel(false);
        let cfg = cfg.clone();
        let file = path.clone();
        let thread = std::thread::Builder::new()
            .name("shepherd-status".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(run(cfg, file, records, supervisor, instance, stop_rx));
            })
            .context("spawning the status writer thread")?;
        tracing::info!(path = %path.display(), "status file");
        Ok(Self { stop, thread: Some(thread), path })
    }

    pub fn path(&self) -> &Path {
        &self.path
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
    path: PathBuf,
    mut records: broadcast::Receiver<shepherd_actors::journal::ActionRecord>,
    supervisor: Addr<Supervisor>,
    instance: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut book = StatsBook::new(cfg.max_history);
    // The supervisor's view (status, todos, tokens) costs one message per session
    // actor: it is re-read every `refresh_interval`, not on every write.
    let mut live: Vec<SessionDetail> = Vec::new();
    let mut live_stale = true;
    let mut dirty = true; // the first write shows the fleet as it is
    let mut last_write: Option<tokio::time::Instant> = None;
    let mut refresh = tokio::time::interval(cfg.refresh_interval);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next_allowed = last_write.map_or_else(tokio::time::Instant::now, |t| t + cfg.min_interval);
        tokio::select! {
            r = records.recv() => match r {
                Ok(record) => {
                    book.apply(&record);
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
            _ = tokio::time::sleep_until(next_allowed), if dirty => {
                if live_stale {
                    live = read_live(&supervisor).await;
                    live_stale = false;
                }
                write(&cfg, &path, &mut book, &live, &instance);
                last_write = Some(tokio::time::Instant::now());
                dirty = false;
            }
            _ = stop.changed() => break,
        }
    }
    // Drain what is queued, then the final write.
    while let Ok(record) = records.try_recv() {
        book.apply(&record);
    }
    write(&cfg, &path, &mut book, &live, &instance);
}

/// The supervisor's sessions. A stopped supervisor (shutdown) answers nothing: the
/// statistics are still written, the sessions then shown as untracked.
async fn read_live(supervisor: &Addr<Supervisor>) -> Vec<SessionDetail> {
    tokio::time::timeout(LIVE_READ_TIMEOUT, supervisor.send(ListSessions))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

fn write(cfg: &StatusConfig, path: &Path, book: &mut StatsBook, live: &[SessionDetail], instance: &str) {
    let now_ms = shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock);
    book.forget_quiet(live, now_ms, cfg.forget_after.as_millis() as i64);
    let doc = book.document(live, now_ms, instance);
    let bytes = match serde_json::to_vec_pretty(&doc) {
        Ok(b) => b,
        Err(e) => return tracing::warn!(error = %e, "status: could not serialise the document"),
    };
    if let Err(e) = write_atomic(path, &bytes) {
        tracing::warn!(path = %path.display(), error = %e, "status: write failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
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
