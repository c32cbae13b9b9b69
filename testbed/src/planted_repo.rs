//! A hostile git repository for tests: every configuration key (and hook) git could run a
//! program from names a command that leaves a marker file, so a test can tell whether a
//! reading of the repository ran anything the repository planted.
//!
//! Its state is known: branch `planted`, two tracked files modified in place (same size,
//! newer mtime, so git must hash them through their clean filters), one staged file whose
//! mtime moved (hashed too) and one untracked file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};

/// The branch the planted repository is on.
pub const BRANCH: &str = "planted";

/// What `git status --porcelain` of the planted repository is (read without its config).
pub const DIRTY: [&str; 4] = [" M other.bin", "A  staged.inc", " M tracked.txt", "?? untracked.rs"];

/// The hooks planted (in `.git/hooks` and in a `core.hooksPath` directory).
const HOOKS: [&str; 28] = [
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// A planted repository at `path`, its markers written to `markers`.
#[derive(Debug)]
pub struct PlantedRepo {
    pub path: PathBuf,
    pub markers: PathBuf,
}

impl PlantedRepo {
    /// Creates the repository in `path` (created; must not exist) with markers going to
    /// `markers` (created). Nothing planted runs while it is built.
    pub fn create(path: &Path, markers: &Path) -> anyhow::Result<PlantedRepo> {
        std::fs::create_dir_all(markers)?;
        std::fs::create_dir_all(path)?;
        let repo = PlantedRepo { path: path.to_path_buf(), markers: markers.to_path_buf() };
        repo.git(&["init", "-q", "-b", BRANCH])?;
        // Content first, with a clean configuration: attributes naming drivers that are not
        // defined yet are harmless.
        std::fs::write(path.join("tracked.txt"), "original\n")?;
        std::fs::write(path.join("other.bin"), "hello\n")?;
        std::fs::write(
            path.join(".gitattributes"),
            "tracked.txt filter=evil diff=evil\nother.bin filter=proc diff=inc\n*.inc filter=inc diff=inc\n",
        )?;
        repo.git(&["add", "tracked.txt", "other.bin", ".gitattributes"])?;
        repo.git(&["commit", "-q", "-m", "first"])?;
        std::fs::write(path.join("staged.inc"), "staged\n")?;
        repo.git(&["add", "staged.inc"])?;
        repo.plant()?;
        // Same sizes, later mtimes: only hashing the content (through the filters) tells.
        std::fs::write(path.join("tracked.txt"), "changed!\n")?;
        std::fs::write(path.join("other.bin"), "HELLO\n")?;
        let later = SystemTime::now() + Duration::from_secs(5);
        for f in ["tracked.txt", "other.bin", "staged.inc"] {
            std::fs::File::options().append(true).open(path.join(f))?.set_modified(later)?;
        }
        std::fs::write(path.join("untracked.rs"), "fn main() {}\n")?;
        Ok(repo)
    }

    /// The markers left so far (file names, e.g. `pwned-fsmonitor`), sorted.
    pub fn markers_left(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.markers)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    fn mark(&self, key: &str, tail: &str) -> String {
        format!("touch '{}'; {tail}", self.markers.join(format!("pwned-{key}")).display())
    }

    fn plant(&self) -> anyhow::Result<()> {
        let git_dir = self.path.join(".git");
        let hooks = git_dir.join("planted-hooks");
        let settings: Vec<(String, String)> = [
            ("core.fsmonitor", self.mark("fsmonitor", ":")),
            ("core.fsmonitorHookVersion", "2".into()),
            ("core.pager", self.mark("core-pager", "cat")),
            ("pager.status", self.mark("pager-status", "cat")),
            ("pager.rev-parse", self.mark("pager-rev-parse", "cat")),
            ("pager.config", self.mark("pager-config", "cat")),
            ("core.editor", self.mark("editor", ":")),
            ("sequence.editor", self.mark("sequence-editor", ":")),
            ("core.sshCommand", self.mark("ssh-command", ":")),
            ("core.gitProxy", self.mark("git-proxy", ":")),
            ("core.askPass", self.mark("askpass", ":")),
            ("credential.helper", format!("!{}", self.mark("credential-helper", ":"))),
            ("gpg.program", self.mark("gpg", ":")),
            ("gpg.ssh.program", self.mark("gpg-ssh", ":")),
            ("diff.external", self.mark("diff-external", ":")),
            ("diff.evil.textconv", self.mark("textconv", "cat")),
            ("diff.evil.command", self.mark("diff-command", ":")),
            ("filter.evil.clean", self.mark("clean", "cat")),
            ("filter.evil.smudge", self.mark("smudge", "cat")),
            ("filter.evil.required", "true".into()),
            ("filter.proc.process", self.mark("process", ":")),
            ("filter.proc.required", "true".into()),
            ("merge.evil.driver", self.mark("merge-driver", ":")),
            ("core.alternateRefsCommand", self.mark("alternate-refs", ":")),
            ("uploadpack.packObjectsHook", self.mark("pack-objects-hook", ":")),
            ("remote.origin.uploadpack", self.mark("uploadpack", ":")),
            ("web.browser", "evil".into()),
            ("browser.evil.cmd", self.mark("browser", ":")),
            ("difftool.evil.cmd", self.mark("difftool", ":")),
            ("mergetool.evil.cmd", self.mark("mergetool", ":")),
            ("alias.st", format!("!{}", self.mark("alias", ":"))),
            ("alias.status", format!("!{}", self.mark("alias-status", ":"))),
            ("alias.rev-parse", format!("!{}", self.mark("alias-rev-parse", ":"))),
            ("core.hooksPath", hooks.display().to_string()),
            ("include.path", git_dir.join("planted.inc").display().to_string()),
            ("includeIf.gitdir:/.path", git_dir.join("planted-if.inc").display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (key, value) in &settings {
            self.git(&["config", key, value])?;
        }
        // Included files plant the same under other names (and win: they come later).
        let included = |prefix: &str| {
            format!(
                "[core]\n\tfsmonitor = {}\n\tpager = {}\n[filter \"inc\"]\n\tclean = {}\n\tprocess = {}\n\trequired = true\n[diff \"inc\"]\n\ttextconv = {}\n",
                self.mark(&format!("{prefix}-fsmonitor"), ":"),
                self.mark(&format!("{prefix}-pager"), "cat"),
                self.mark(&format!("{prefix}-clean"), "cat"),
                self.mark(&format!("{prefix}-process"), ":"),
                self.mark(&format!("{prefix}-textconv"), "cat"),
            )
        };
        std::fs::write(git_dir.join("planted.inc"), included("include"))?;
        std::fs::write(git_dir.join("planted-if.inc"), included("include-if"))?;
        // Attributes outside the worktree name drivers too.
        std::fs::create_dir_all(git_dir.join("info"))?;
        std::fs::write(git_dir.join("info").join("attributes"), "*.txt filter=inc diff=inc\n")?;
        for dir in [hooks, git_dir.join("hooks")] {
            std::fs::create_dir_all(&dir)?;
            for hook in HOOKS {
                let file = dir.join(hook);
                std::fs::write(
                    &file,
                    format!("#!/bin/sh\n{}\n", self.mark(&format!("hook-{hook}"), "cat >/dev/null")),
                )?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))?;
                }
            }
        }
        Ok(())
    }

    /// Builds the repository with git kept away from everything planted so far.
    fn git(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("git")
            .current_dir(&self.path)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", "user.email=t@t", "-c", "user.name=t", "-c", "commit.gpgsign=false"])
            .args(args)
            .output()
            .context("running git (is it installed?)")?;
        if !out.status.success() {
            bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}
