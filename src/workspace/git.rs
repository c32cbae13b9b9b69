//! One `git` call with nothing of the caller's or the user's configuration, no pager, no
//! prompt, no hooks, no fsmonitor, a deadline, and a bound on what is kept of its output.
//!
//! It decides nothing about what a repository means; [`super::clean_room`] decides which
//! repository configuration git may see at all.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// How long one `git` call may take before the state is left out (it is killed).
pub(super) const GIT_TIMEOUT: Duration = Duration::from_secs(5);

/// What one call printed, at most the bound it was run with.
#[derive(Debug)]
pub(super) struct Output {
    pub bytes: Vec<u8>,
    /// Git printed more than the bound: `bytes` is its beginning and git was killed.
    pub cut: bool,
}

/// `git` with an environment of our own making: `PATH` only is inherited (to find git),
/// `HOME` is `home` (an empty directory), the system and global configuration are off,
/// and the settings that could run a program or wait for a person are pinned on the
/// command line (command-line settings win over every configuration file).
pub(super) fn locked(home: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("LC_ALL", "C")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0") // `status` must not take (or refresh) the index lock
        .env("GIT_NO_LAZY_FETCH", "1") // a partial clone's missing object is not fetched
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_PAGER", "cat")
        .env("PAGER", "cat");
    cmd.args(["--no-pager", "--no-optional-locks"]);
    for setting in [
        "core.fsmonitor=false",
        "core.hooksPath=/dev/null",
        "core.untrackedCache=false",
        "core.pager=cat",
        "core.quotePath=true", // paths come C-quoted: no control or non-ASCII bytes
        "color.ui=false",
    ] {
        cmd.arg("-c").arg(setting);
    }
    cmd
}

/// Runs `cmd` with `args` and returns its stdout (at most `max_bytes`), or `None` when it
/// fails, cannot start or outlives [`GIT_TIMEOUT`]. Output past `max_bytes` kills git and
/// is reported as `cut` (not a failure): what was read is still the beginning of the truth.
pub(super) async fn run<I, S>(mut cmd: Command, args: I, max_bytes: usize) -> Option<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true);
    let work = async {
        let mut child = cmd.spawn().ok()?;
        let mut stdout = child.stdout.take()?;
        let mut bytes = Vec::new();
        let limit = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
        (&mut stdout).take(limit).read_to_end(&mut bytes).await.ok()?;
        let cut = bytes.len() > max_bytes;
        if cut {
            bytes.truncate(max_bytes);
            let _ = child.start_kill(); // it may have just exited by itself
            drop(stdout);
            let _ = child.wait().await;
            return Some(Output { bytes, cut });
        }
        child.wait().await.ok()?.success().then_some(Output { bytes, cut })
    };
    tokio::time::timeout(GIT_TIMEOUT, work).await.ok()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_bound_is_cut_and_the_writer_is_killed() {
        // `yes` never ends by itself: only the bound ends it (well before the timeout).
        let started = std::time::Instant::now();
        let out = run(Command::new("yes"), ["y"], 10_000).await.expect("a cut output is an output");
        assert!(out.cut);
        assert_eq!(out.bytes.len(), 10_000);
        assert!(started.elapsed() < GIT_TIMEOUT, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_failing_call_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = locked(dir.path());
        cmd.current_dir(dir.path());
        assert!(run(cmd, ["rev-parse", "--git-dir"], 1024).await.is_none(), "not a repository");
    }
}
