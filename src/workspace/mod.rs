//! The sessions' directories as Shepherd can see them: the [`Workspace`] port over local
//! `git`, read-only.
//!
//! A hand-off's continuation records the repository state (branch, HEAD, uncommitted
//! files) so the fresh session knows where the work stands. Shepherd only ever *reads*:
//! `rev-parse` and `status`, never reset, clean, checkout or commit. A directory that is
//! not a local git checkout (another machine's session, no git installed) is `None`.

use std::time::Duration;

use async_trait::async_trait;
use shepherd_actors::ports::{RepoState, Workspace};

/// How long one `git` call may take before the state is left out.
const GIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Local `git`, read-only.
#[derive(Debug, Clone, Copy, Default)]
pub struct GitWorkspace;

#[async_trait]
impl Workspace for GitWorkspace {
    async fn repo_state(&self, directory: &str) -> Option<RepoState> {
        if !std::path::Path::new(directory).is_dir() {
            return None;
        }
        let head = git(directory, &["rev-parse", "--short", "HEAD"]).await;
        let branch = git(directory, &["rev-parse", "--abbrev-ref", "HEAD"]).await;
        let status = git(directory, &["status", "--porcelain"]).await?; // not a repository: None
        Some(RepoState {
            branch: branch.map(|b| b.trim().to_string()).filter(|b| !b.is_empty()),
            head: head.map(|h| h.trim().to_string()).filter(|h| !h.is_empty()),
            dirty: status.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect(),
        })
    }
}

/// Runs one read-only git command; its stdout, or `None` on any failure.
async fn git(directory: &str, args: &[&str]) -> Option<String> {
    let run = tokio::process::Command::new("git")
        .arg("-C")
        .arg(directory)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0") // `status` must not take the index lock
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(GIT_TIMEOUT, run).await.ok()?.ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(dir: &std::path::Path, args: &[&str]) {
        let ok = std::process::Command::new("git").arg("-C").arg(dir).args(args).output().unwrap().status.success();
        assert!(ok, "git {args:?}");
    }

    #[tokio::test]
    async fn a_checkout_reports_branch_head_and_uncommitted_files_and_is_left_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q", "-b", "work"]);
        sh(p, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "first"]);
        std::fs::write(p.join("new.rs"), "fn main() {}").unwrap();
        let state = GitWorkspace.repo_state(p.to_str().unwrap()).await.unwrap();
        assert_eq!(state.branch.as_deref(), Some("work"));
        assert_eq!(state.head.as_ref().map(String::len), Some(7));
        assert_eq!(state.dirty, vec!["?? new.rs".to_string()]);
        assert!(p.join("new.rs").exists(), "nothing was cleaned");
    }

    #[tokio::test]
    async fn a_directory_that_is_not_a_checkout_or_does_not_exist_has_no_state() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GitWorkspace.repo_state(dir.path().to_str().unwrap()).await, None);
        assert_eq!(GitWorkspace.repo_state("/no/such/dir").await, None);
    }
}
