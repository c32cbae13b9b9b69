//! The sessions' directories as Shepherd can see them: the [`Workspace`] port over local
//! `git`, read-only, running nothing the repository planted.
//!
//! A hand-off's continuation records the repository state (branch, HEAD, uncommitted
//! files) so the fresh session knows where the work stands. Shepherd only ever *reads*:
//! `rev-parse`, `config --get-regexp` and `status`, never reset, clean, checkout or commit.
//! A directory that is not a local git checkout (another machine's session, no git
//! installed, a repository git's ownership check refuses) is `None`.
//!
//! # Reading without running
//!
//! The repository is the agent's: it can set `core.fsmonitor`, a `filter.<name>.clean`
//! or `.process` driver named from `.gitattributes` or `.git/info/attributes`, hooks,
//! `include.path`, a pager, helpers… and git runs them as Shepherd's user, outside any
//! sandbox the agent is in. So the reading is split in two:
//! - **`rev-parse` and `config` in the repository** ([`git::locked`]): an environment of
//!   Shepherd's making (no system or global configuration, an empty `HOME`, no pager or
//!   prompt, fsmonitor and hooks pinned off on the command line). These commands read the
//!   repository's configuration and refs but no index or worktree content, so no driver
//!   is reached (the planted-repository tests check it). Git's ownership check
//!   (`safe.directory`) applies as usual; Shepherd's own global config is not read, so an
//!   entry there does not widen it.
//! - **`status` in a [`clean_room::CleanRoom`]**: a git directory of Shepherd's making
//!   (its own `config` and a detached `HEAD` at the commit just read) over the
//!   repository's objects, index, worktree and ignore rules. `status` is the one command
//!   that reads content (a modified file is hashed through its clean filter; fsmonitor
//!   and untracked caches, submodules); there, git never opens the repository's
//!   configuration, so no driver name the repository chose has a command behind it.
//!   A deny-list of `-c filter.<name>.clean=` overrides would have to find every name
//!   first, and an agent rewriting its config between that look and `status` would win
//!   the race; here there is nothing to race. What differs from a plain `git status`:
//!   submodules are compared by commit only (their own status would run under *their*
//!   configuration), untracked files are always listed (`status.showUntrackedFiles` is
//!   the repository's setting), and of the repository's configuration only the settings
//!   in [`clean_room::CARRIED_SETTINGS`] (`core.fileMode`, `core.autocrlf`, …) apply.
//!
//! Why not a library: `gix` would spare the processes, but its status is no safer: the
//! index-to-worktree comparison takes `Repository::filter_pipeline()`, whose drivers come
//! from the repository's `filter.<name>.*` configuration, and hashes a modified file
//! through it (running `clean`/`process`). Trust-restricted opening only limits
//! configuration from repositories owned by someone else; an agent owns its own. It would
//! also add a large dependency tree to every cold CI build (not measured here).
//!
//! What is kept is bounded ([`porcelain`]): at most [`porcelain::MAX_DIRTY_ENTRIES`]
//! entries of at most [`porcelain::MAX_STATUS_BYTES`] read, each Markdown-safe.

mod clean_room;
mod git;
mod porcelain;

use std::path::Path;

use async_trait::async_trait;
use shepherd_actors::ports::{RepoState, Workspace};

use clean_room::{CleanRoom, Layout};

/// At most this much of a `rev-parse` or `config` answer is read.
const MAX_ANSWER_BYTES: usize = 16 * 1024;

/// Local `git`, read-only, in a locked-down environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct GitWorkspace;

#[async_trait]
impl Workspace for GitWorkspace {
    async fn repo_state(&self, directory: &str) -> Option<RepoState> {
        let dir = Path::new(directory);
        if !dir.is_dir() {
            return None;
        }
        let room = CleanRoom::new().ok()?;
        let ask = |args: Vec<String>| {
            let mut cmd = git::locked(&room.home());
            cmd.current_dir(dir);
            async move { git::run(cmd, args, MAX_ANSWER_BYTES).await.filter(|o| !o.cut).map(|o| o.bytes) }
        };
        let words = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        // Not a repository (or a bare one, or refused by the ownership check): None.
        let layout = Layout::parse(&ask(words(&clean_room::LAYOUT_ARGS)).await?)?;
        let line = |out: Option<Vec<u8>>| {
            out.map(|b| String::from_utf8_lossy(&b).trim().to_string()).filter(|s| !s.is_empty())
        };
        let branch = line(ask(words(&["rev-parse", "--abbrev-ref", "HEAD"])).await);
        let head = line(ask(words(&["rev-parse", "--short", "HEAD"])).await);
        let commit = line(ask(words(&["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])).await);
        let pattern = clean_room::carried_settings_pattern();
        let settings = ask(vec!["config".into(), "--null".into(), "--get-regexp".into(), pattern])
            .await
            .map(|out| clean_room::carried_settings(&out))
            .unwrap_or_default(); // exit 1: none set
        room.furnish(&layout, commit.as_deref()).ok()?;
        let status = git::run(room.status(&layout, &settings), None::<&str>, porcelain::MAX_STATUS_BYTES).await?;
        let dirty = porcelain::dirty(&status.bytes, status.cut);
        Some(RepoState {
            branch: branch.map(|b| porcelain::markdown_safe(&b)),
            head: head.map(|h| porcelain::markdown_safe(&h)),
            dirty: dirty.kept,
            dirty_omitted: dirty.omitted,
            dirty_truncated: dirty.truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use shepherd_testbed::planted_repo::{self, PlantedRepo};

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
    async fn a_repository_that_plants_commands_everywhere_is_read_without_running_any() {
        let dir = tempfile::tempdir().unwrap();
        let repo = PlantedRepo::create(&dir.path().join("repo"), &dir.path().join("markers")).unwrap();
        // The bed is armed: git as people run it runs what was planted.
        let armed = dir.path().join("armed");
        let armed_repo = PlantedRepo::create(&armed, &dir.path().join("armed-markers")).unwrap();
        let _ = std::process::Command::new("git").current_dir(&armed).args(["status", "--porcelain"]).output();
        assert!(armed_repo.markers_left().contains(&"pwned-include-if-fsmonitor".to_string()), "the plant is live");

        let state = GitWorkspace.repo_state(repo.path.to_str().unwrap()).await;
        assert_eq!(repo.markers_left(), Vec::<String>::new(), "nothing planted ran");
        let state = state.expect("the planted repository is still read");
        assert_eq!(state.branch.as_deref(), Some(planted_repo::BRANCH));
        assert_eq!(state.head.as_ref().map(String::len), Some(7));
        assert_eq!(state.dirty, planted_repo::DIRTY);
        // A second reading (index and caches as the first left them) runs nothing either.
        GitWorkspace.repo_state(repo.path.to_str().unwrap()).await.unwrap();
        assert_eq!(repo.markers_left(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn staged_changes_a_subdirectory_and_an_unborn_branch_read_as_git_reports_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q", "-b", "fresh"]);
        std::fs::create_dir(p.join("src")).unwrap();
        std::fs::write(p.join("src/a.rs"), "a").unwrap();
        sh(p, &["add", "src/a.rs"]);
        let state = GitWorkspace.repo_state(p.join("src").to_str().unwrap()).await.unwrap();
        assert_eq!((state.branch, state.head), (None, None), "no commit yet: as before");
        assert_eq!(state.dirty, ["A  src/a.rs"], "paths are the repository's, not the subdirectory's");
        sh(p, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "a"]);
        std::fs::write(p.join("src/a.rs"), "ab").unwrap();
        std::fs::write(p.join("gone.rs"), "").unwrap();
        sh(p, &["add", "gone.rs"]);
        std::fs::write(p.join(".git/info/exclude"), "*.log\n").unwrap();
        std::fs::write(p.join("debug.log"), "").unwrap();
        let state = GitWorkspace.repo_state(p.to_str().unwrap()).await.unwrap();
        assert_eq!(state.branch.as_deref(), Some("fresh"));
        assert_eq!(state.dirty, ["A  gone.rs", " M src/a.rs"], "info/exclude still applies");
    }

    #[tokio::test]
    async fn a_linked_worktree_and_a_sha256_repository_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("main");
        std::fs::create_dir(&main).unwrap();
        sh(&main, &["init", "-q", "-b", "main", "--object-format=sha256"]);
        sh(&main, &["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "first"]);
        let linked = dir.path().join("linked");
        sh(&main, &["worktree", "add", "-q", "-b", "side", linked.to_str().unwrap()]);
        std::fs::write(linked.join("x.rs"), "").unwrap();
        let state = GitWorkspace.repo_state(linked.to_str().unwrap()).await.unwrap();
        assert_eq!(state.branch.as_deref(), Some("side"));
        assert_eq!(state.dirty, ["?? x.rs"]);
        let state = GitWorkspace.repo_state(main.to_str().unwrap()).await.unwrap();
        assert_eq!((state.branch.as_deref(), state.dirty.len()), (Some("main"), 0));
    }

    #[tokio::test]
    async fn a_submodule_is_compared_by_commit_and_its_own_config_is_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let (sub, sup) = (dir.path().join("sub"), dir.path().join("sup"));
        let commit = ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "c"];
        for d in [&sub, &sup] {
            std::fs::create_dir(d).unwrap();
            sh(d, &["init", "-q", "-b", "main"]);
            sh(d, &commit);
        }
        sh(&sup, &["-c", "protocol.file.allow=always", "submodule", "add", "-q", sub.to_str().unwrap(), "sub"]);
        sh(&sup, &commit);
        let inner = sup.join("sub");
        let marker = dir.path().join("pwned-submodule");
        sh(&inner, &["config", "core.fsmonitor", &format!("touch '{}'; :", marker.display())]);
        std::fs::write(inner.join("dirt"), "").unwrap();
        let state = GitWorkspace.repo_state(sup.to_str().unwrap()).await.unwrap();
        assert!(state.dirty.is_empty(), "{:?}", state.dirty);
        sh(&inner, &[&["-c", "core.fsmonitor=false"], &commit[..]].concat()); // the test's own git
        let state = GitWorkspace.repo_state(sup.to_str().unwrap()).await.unwrap();
        assert_eq!(state.dirty, [" M sub"], "a new commit in the submodule shows");
        assert!(!marker.exists(), "the submodule's fsmonitor did not run");
    }

    #[tokio::test]
    async fn many_untracked_files_are_counted_and_hostile_names_are_markdown_safe() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q", "-b", "work"]);
        let many = porcelain::MAX_DIRTY_ENTRIES + 5;
        for i in 0..many {
            std::fs::write(p.join(format!("f{i:04}")), "").unwrap();
        }
        std::fs::write(p.join("a`b\nc\u{1b}[2J\u{202e}.rs"), "").unwrap();
        let state = GitWorkspace.repo_state(p.to_str().unwrap()).await.unwrap();
        assert_eq!(state.dirty.len() + state.dirty_omitted, many + 1);
        assert_eq!(state.dirty.len(), porcelain::MAX_DIRTY_ENTRIES);
        assert!(!state.dirty_truncated);
        let hostile = &state.dirty[0];
        assert_eq!(hostile, r#"?? "a\x60b\nc\033[2J\342\200\256.rs""#);
        assert!(state.dirty.iter().all(|d| d.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'`')));
    }

    #[tokio::test]
    async fn output_past_the_byte_bound_is_cut_and_the_count_is_a_floor() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q", "-b", "work"]);
        let long = "n".repeat(240);
        let files = porcelain::MAX_STATUS_BYTES / 240 + 50;
        for i in 0..files {
            std::fs::write(p.join(format!("{i:05}{long}")), "").unwrap();
        }
        let state = GitWorkspace.repo_state(p.to_str().unwrap()).await.unwrap();
        assert!(state.dirty_truncated, "more than the bound was printed");
        assert_eq!(state.dirty.len(), porcelain::MAX_DIRTY_ENTRIES);
        let counted = state.dirty.len() + state.dirty_omitted;
        assert!(counted < files && counted > files / 2, "{counted} of {files}");
        assert!(state.dirty.iter().all(|d| d.starts_with("?? ") && d.len() <= porcelain::MAX_ENTRY_CHARS));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_repository_someone_else_owns_is_not_read_git_s_ownership_check_stays_on() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        sh(p, &["init", "-q", "-b", "theirs"]);
        let stranger = 4242;
        if std::os::unix::fs::chown(p.join(".git"), Some(stranger), Some(stranger)).is_err() {
            eprintln!("skipped: giving the repository away needs root");
            return;
        }
        std::os::unix::fs::chown(p, Some(stranger), Some(stranger)).unwrap();
        assert_eq!(GitWorkspace.repo_state(p.to_str().unwrap()).await, None, "git refuses a dubious owner");
    }

    #[tokio::test]
    async fn a_directory_that_is_not_a_checkout_or_does_not_exist_has_no_state() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(GitWorkspace.repo_state(dir.path().to_str().unwrap()).await, None);
        assert_eq!(GitWorkspace.repo_state("/no/such/dir").await, None);
    }
}
