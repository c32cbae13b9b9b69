//! The stand-in git directory `git status` runs in: the repository's objects, index and
//! ignore rules, but a `config` and a `HEAD` of Shepherd's own making. No setting the
//! repository chose — a filter or diff driver under any name, `core.fsmonitor`, hooks,
//! `include.path`, a pager, a helper — reaches the git that reads its files, because that
//! git never opens the repository's configuration. Only a short list of settings that
//! change *what status reports* and cannot name a program (`core.fileMode`,
//! `core.autocrlf`, …) is carried over, and only as a plain word.
//!
//! Nothing here reads the worktree or runs git; it decides the room's layout.

use std::io;
use std::path::PathBuf;

use tokio::process::Command;

use super::git;

/// Where the repository's parts are, as the repository's own git reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    /// The worktree's top (what `status` walks).
    pub toplevel: PathBuf,
    /// This worktree's git directory (its `index`, a split index's `sharedindex.*`).
    pub git_dir: PathBuf,
    /// The directory shared by all worktrees (`objects`, `info/exclude`).
    pub common_dir: PathBuf,
    pub sha256: bool,
}

/// The `rev-parse` arguments whose output [`Layout::parse`] reads.
pub(super) const LAYOUT_ARGS: [&str; 6] = [
    "rev-parse",
    "--show-toplevel",
    "--absolute-git-dir",
    "--path-format=absolute",
    "--git-common-dir",
    "--show-object-format",
];

/// Settings carried from the repository's configuration into the room: each changes which
/// files status calls modified, none can name a program, and each value must be a word.
pub(super) const CARRIED_SETTINGS: [&str; 8] = [
    "core.filemode",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.checkstat",
    "core.trustctime",
    "core.autocrlf",
    "core.eol",
];

impl Layout {
    /// The four lines of [`LAYOUT_ARGS`]' output; `None` for anything else (a path with a
    /// newline in it, an unknown object format).
    pub fn parse(out: &[u8]) -> Option<Layout> {
        let text = out.strip_suffix(b"\n")?;
        let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
        let [toplevel, git_dir, common_dir, format] = lines.as_slice() else { return None };
        let path = |b: &[u8]| -> Option<PathBuf> {
            let p = bytes_path(b);
            p.is_absolute().then_some(p)
        };
        let sha256 = match *format {
            b"sha1" => false,
            b"sha256" => true,
            _ => return None,
        };
        Some(Layout { toplevel: path(toplevel)?, git_dir: path(git_dir)?, common_dir: path(common_dir)?, sha256 })
    }

    fn oid_len(&self) -> usize {
        if self.sha256 {
            64
        } else {
            40
        }
    }
}

/// `git config --null --get-regexp` output (`key\nvalue\0`…) as `-c key=value` settings,
/// keeping only [`CARRIED_SETTINGS`] whose value is a short word.
pub(super) fn carried_settings(out: &[u8]) -> Vec<String> {
    out.split(|b| *b == 0)
        .filter_map(|record| {
            let record = std::str::from_utf8(record).ok()?;
            // A bare `[core] symlinks` line (no `=`) is printed without a value: true.
            let (key, value) = record.split_once('\n').unwrap_or((record, "true"));
            let key = key.to_ascii_lowercase();
            let word = !value.is_empty()
                && value.len() <= 16
                && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            (CARRIED_SETTINGS.contains(&key.as_str()) && word).then(|| format!("{key}={value}"))
        })
        .collect()
}

/// The regular expression for `git config --get-regexp` matching [`CARRIED_SETTINGS`].
pub(super) fn carried_settings_pattern() -> String {
    let names: Vec<&str> = CARRIED_SETTINGS.iter().map(|k| k.trim_start_matches("core.")).collect();
    format!("^core\\.({})$", names.join("|"))
}

/// A private temporary git directory (removed when dropped), with an empty `home/` for
/// every git call of one reading.
pub(super) struct CleanRoom {
    dir: tempfile::TempDir,
}

impl CleanRoom {
    pub fn new() -> io::Result<CleanRoom> {
        let dir = tempfile::Builder::new().prefix("shepherd-git-").tempdir()?; // 0700
        std::fs::create_dir(dir.path().join("home"))?;
        std::fs::create_dir(dir.path().join("refs"))?;
        Ok(CleanRoom { dir })
    }

    /// An empty directory, `HOME` for every call (no `~/.gitconfig`, no `~` expansion
    /// into the user's files).
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// Writes the room's `config` and `HEAD` for `layout`: `head` (a full object id) as a
    /// detached HEAD, so staged changes compare against the same commit; no commit yet
    /// (an unborn branch) when `None`.
    pub fn furnish(&self, layout: &Layout, head: Option<&str>) -> io::Result<()> {
        let room = self.dir.path();
        let config = if layout.sha256 {
            "[core]\n\trepositoryformatversion = 1\n\tbare = false\n[extensions]\n\tobjectformat = sha256\n"
        } else {
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        };
        std::fs::write(room.join("config"), config)?;
        let head = match head {
            Some(id) if id.len() == layout.oid_len() && id.bytes().all(|b| b.is_ascii_hexdigit()) => format!("{id}\n"),
            Some(_) => return Err(io::Error::new(io::ErrorKind::InvalidData, "HEAD is not an object id")),
            None => "ref: refs/heads/unborn\n".to_string(),
        };
        std::fs::write(room.join("HEAD"), head)?;
        // A split index (`core.splitIndex`) names its shared part, looked up beside HEAD.
        #[cfg(unix)]
        for entry in std::fs::read_dir(&layout.git_dir)?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("sharedindex.") {
                std::os::unix::fs::symlink(entry.path(), room.join(entry.file_name()))?;
            }
        }
        Ok(())
    }

    /// `git status --porcelain` of `layout`'s worktree, run in the room with `settings`
    /// (from [`carried_settings`]). Submodules are compared by commit only: their own
    /// status would be read by a git that honours *their* configuration.
    pub fn status(&self, layout: &Layout, settings: &[String]) -> Command {
        let mut cmd = git::locked(&self.home());
        cmd.current_dir(&layout.toplevel)
            .env("GIT_DIR", self.dir.path())
            .env("GIT_WORK_TREE", &layout.toplevel)
            .env("GIT_INDEX_FILE", layout.git_dir.join("index"))
            .env("GIT_OBJECT_DIRECTORY", layout.common_dir.join("objects"));
        for s in settings {
            cmd.arg("-c").arg(s);
        }
        let mut exclude = std::ffi::OsString::from("core.excludesFile=");
        exclude.push(layout.common_dir.join("info").join("exclude"));
        cmd.arg("-c").arg(exclude);
        cmd.args(["status", "--porcelain", "--untracked-files=normal", "--ignore-submodules=dirty"]);
        cmd
    }
}

#[cfg(unix)]
fn bytes_path(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

#[cfg(not(unix))]
fn bytes_path(b: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(b).into_owned())
}

impl std::fmt::Debug for CleanRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CleanRoom").field("dir", &self.dir.path()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_layout_is_four_absolute_lines_with_a_known_object_format() {
        let ok = Layout::parse(b"/w\n/w/.git\n/w/.git\nsha1\n").unwrap();
        assert_eq!(ok.toplevel, Path::new("/w"));
        assert!(!ok.sha256);
        assert!(Layout::parse(b"/w\n/w/.git\n/w/.git\nsha256\n").unwrap().sha256);
        assert_eq!(Layout::parse(b"/w\nline\n/w/.git\n/w/.git\nsha1\n"), None, "a path with a newline");
        assert_eq!(Layout::parse(b"w\n/w/.git\n/w/.git\nsha1\n"), None, "relative");
        assert_eq!(Layout::parse(b"/w\n/w/.git\n/w/.git\nmd5\n"), None);
    }

    #[test]
    fn only_listed_settings_with_a_plain_word_are_carried() {
        let out =
            b"core.filemode\nfalse\0core.autocrlf\ninput\0core.symlinks\0core.fsmonitor\ntouch x\0core.eol\n$(x)\0";
        assert_eq!(carried_settings(out), ["core.filemode=false", "core.autocrlf=input", "core.symlinks=true"]);
        assert_eq!(
            carried_settings_pattern(),
            "^core\\.(filemode|ignorecase|precomposeunicode|symlinks|checkstat|trustctime|autocrlf|eol)$"
        );
    }
}
