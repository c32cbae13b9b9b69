//! Private state: how Shepherd creates the folders and files it keeps (the ledger and
//! SQLite's `-wal`/`-shm` beside it, the status file, the hand-off notes, the control
//! token), and the start-up check of an existing state folder.
//!
//! What it decides: folders are created 0700 and files 0600, whatever the process's
//! umask (so it holds when Shepherd is embedded as a library, not only under
//! `shepherd run`, which also sets the umask to 0o077 with [`restrict_umask`]); a file is
//! opened with `O_NOFOLLOW`, so a symlink planted at a state path is refused, never
//! followed; a temp file is created with `O_EXCL` (`create_new`). An existing folder or
//! file that is group- or world-accessible is reported by [`warn_if_loose`], naming the
//! path and the `chmod` that fixes it; Shepherd does not change modes it did not set.
//!
//! What it must not do: decide where the files live (the store, the status writer and
//! the token module do), or follow a link.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The mode of every folder Shepherd creates.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file Shepherd creates.
pub const FILE_MODE: u32 = 0o600;
/// The umask `shepherd run` sets at start: nothing Shepherd (or SQLite) creates is
/// readable by the group or others.
pub const PROCESS_UMASK: u32 = 0o077;

/// Sets the process's umask to [`PROCESS_UMASK`]; returns the previous one. Call it
/// once, before any thread starts (the umask is process-wide).
pub fn restrict_umask() -> libc::mode_t {
    // SAFETY: umask(2) cannot fail and touches no memory.
    unsafe { libc::umask(PROCESS_UMASK as libc::mode_t) }
}

/// Creates `dir` and its missing parents with mode 0700. An existing folder is left as
/// it is (see [`warn_if_loose`]); a symlink at `dir` itself is refused.
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(dir) {
        if meta.file_type().is_symlink() {
            return Err(symlink_refused(dir));
        }
        if meta.is_dir() {
            return Ok(());
        }
    }
    std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    // The umask may have taken bits away, never added them; make sure of the last one.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))
}

/// Creates the parent folder of `path` (0700) if it has one and it is missing.
pub fn create_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => create_dir(dir),
        None => Ok(()),
    }
}

fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

fn symlink_refused(path: &Path) -> std::io::Error {
    std::io::Error::other(format!("{} is a symbolic link; Shepherd does not follow links in its state", path.display()))
}

/// Names the path in an error from opening it (`ELOOP` from `O_NOFOLLOW` reads as a
/// refused link).
fn opening(path: &Path, e: std::io::Error) -> std::io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return symlink_refused(path);
    }
    e
}

/// A new file at `path`, mode 0600; fails if anything (a file, a link) is already there.
pub fn create_new(path: &Path) -> std::io::Result<File> {
    options().write(true).create_new(true).open(path).map_err(|e| opening(path, e))
}

/// Opens `path` for writing, creating it 0600 if missing and never following a link.
/// An existing file keeps its content (SQLite opens it next) but is set to 0600.
pub fn ensure_file(path: &Path) -> std::io::Result<File> {
    let f = options().write(true).create(true).truncate(false).open(path).map_err(|e| opening(path, e))?;
    f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Writes `bytes` to `path` (0600), replacing what was there without following a link:
/// a temp file created with `O_EXCL` beside it, renamed over it.
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    create_parent(path)?;
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = create_new(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The temp file beside `path` that [`write_file`] and the status writer write first:
/// `.NAME.PID.tmp`.
pub fn temp_path(path: &Path) -> PathBuf {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dir.join(format!(".{name}.{}.tmp", std::process::id()))
}

/// A folder or file that the group or others may access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loose {
    pub path: PathBuf,
    pub mode: u32,
    pub is_dir: bool,
}

impl Loose {
    /// The command that makes it private.
    pub fn fix(&self) -> String {
        format!("chmod {} {}", if self.is_dir { "700" } else { "600" }, self.path.display())
    }
}

/// The state folder `dir` and those of Shepherd's own `files` in it (given by name:
/// the folder may be shared, e.g. `/tmp`, and other people's files are not Shepherd's
/// to judge) whose mode gives the group or others any access. Missing ones have none.
/// Links are not followed.
pub fn loose_entries(dir: &Path, files: &[&str]) -> Vec<Loose> {
    let loose = |path: PathBuf, meta: &std::fs::Metadata| {
        let mode = meta.mode() & 0o7777;
        (mode & 0o077 != 0 && !meta.file_type().is_symlink()).then(|| Loose { path, mode, is_dir: meta.is_dir() })
    };
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return Vec::new() };
    let mut found: Vec<Loose> = loose(dir.to_path_buf(), &meta).into_iter().collect();
    if meta.is_dir() {
        let ours = files.iter().map(|name| dir.join(name));
        found.extend(ours.filter_map(|p| std::fs::symlink_metadata(&p).ok().and_then(|m| loose(p, &m))));
    }
    found
}

/// Logs a warning for every loose entry of the state folder `dir` (see
/// [`loose_entries`]), naming the path and the `chmod` that fixes it — once per path
/// in this process (the ledger and the status file share a folder: it was warned about
/// twice). Returns the entries warned about.
pub fn warn_if_loose(dir: &Path, files: &[&str]) -> Vec<Loose> {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let found: Vec<Loose> = loose_entries(dir, files).into_iter().filter(|l| warned.insert(l.path.clone())).collect();
    for l in &found {
        tracing::warn!(
            path = %l.path.display(),
            mode = %format!("{:o}", l.mode),
            fix = %l.fix(),
            "state: {} is readable or writable by other users; Shepherd keeps session state, \
             hand-off notes and its journal here. Fix: {}",
            l.path.display(),
            l.fix()
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn a_created_folder_is_private_and_its_new_files_too() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        write_file(&dir.join("note.md"), b"hello").unwrap();
        assert_eq!(mode(&dir.join("note.md")), 0o600);
        assert_eq!(std::fs::read(dir.join("note.md")).unwrap(), b"hello");
    }

    #[test]
    fn a_symlink_at_a_state_path_is_refused_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = root.path().join("ledger.sqlite3");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = ensure_file(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(create_new(&link).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let dir_link = root.path().join("state");
        std::os::unix::fs::symlink(root.path(), &dir_link).unwrap();
        assert!(create_dir(&dir_link).is_err());
    }

    #[test]
    fn a_loose_state_folder_and_file_are_named_with_the_fix() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("shepherd");
        create_dir(&dir).unwrap();
        write_file(&dir.join("ledger.sqlite3"), b"").unwrap();
        std::fs::write(dir.join("someone-elses.txt"), b"").unwrap();
        std::fs::set_permissions(dir.join("someone-elses.txt"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(loose_entries(&dir, &["ledger.sqlite3"]).is_empty(), "only Shepherd's files are judged");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.join("ledger.sqlite3"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let found = warn_if_loose(&dir, &["ledger.sqlite3", "ledger.sqlite3-wal"]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].fix(), format!("chmod 700 {}", dir.display()));
        assert_eq!(found[1].fix(), format!("chmod 600 {}", dir.join("ledger.sqlite3").display()));
        let again = warn_if_loose(&dir, &["status.json"]);
        assert!(again.is_empty(), "the folder was warned about already: {again:?}");
    }
}
