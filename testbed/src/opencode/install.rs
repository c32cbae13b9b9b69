//! Finds or installs the pinned OpenCode binary. The pinned version,
//! [`OPENCODE_VERSION`], lives in one place, `src/opencode/pinned.rs` at the repository
//! root, which this crate compiles in by path (the daemon's version warning names it too;
//! `scripts/install-opencode.sh` reads it from that file).
//!
//! Lookup order: env `SHEPHERD_OPENCODE_BIN`; else the cache directory
//! ([`cache_dir`]); if the binary is not there, `npm install` of the platform package
//! (`opencode-linux-x64@VERSION`; the `opencode-ai` meta package is not published for
//! this version) into a temp dir that is renamed into place, under an exclusive file lock
//! so parallel tests install once.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, Context as _};

pub use crate::pinned::OPENCODE_VERSION;

/// Env var: path of an OpenCode binary to use as is.
pub const ENV_BIN: &str = "SHEPHERD_OPENCODE_BIN";
/// Env var: cache directory to install into (holds `node_modules/…`).
pub const ENV_CACHE: &str = "SHEPHERD_OPENCODE_CACHE";

/// The npm platform package for this machine.
pub fn platform_package() -> anyhow::Result<&'static str> {
    match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => Ok("opencode-linux-x64"),
        ("linux", "aarch64") => Ok("opencode-linux-arm64"),
        (os, arch) => bail!("no OpenCode package known for {os}/{arch}"),
    }
}

/// Where the pinned version is (or will be) installed:
/// `$SHEPHERD_OPENCODE_CACHE`, else `<repo>/.opencode-cache/<version>` when the source
/// tree this was built from still exists (`<repo>` is the workspace root, the parent of
/// this crate's `testbed/`: the same directory `scripts/install-opencode.sh` installs
/// into), else `$XDG_CACHE_HOME` (or `~/.cache`)
/// `/shepherd/opencode/<version>`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = non_empty_env(ENV_CACHE) {
        return Ok(PathBuf::from(dir));
    }
    let repo = repo_root();
    if repo.join("Cargo.toml").is_file() {
        return Ok(repo.join(".opencode-cache").join(OPENCODE_VERSION));
    }
    let base = match non_empty_env("XDG_CACHE_HOME") {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(non_empty_env("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?).join(".cache"),
    };
    Ok(base.join("shepherd").join("opencode").join(OPENCODE_VERSION))
}

/// The workspace root this crate was built in: the parent of its manifest directory
/// (`<repo>/testbed`).
fn repo_root() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest)
}

/// The binary's path inside a cache directory.
pub fn binary_in(cache: &Path) -> anyhow::Result<PathBuf> {
    Ok(cache.join("node_modules").join(platform_package()?).join("bin").join("opencode"))
}

fn non_empty_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The version a binary reports.
pub fn binary_version(bin: &Path) -> anyhow::Result<String> {
    let out =
        Command::new(bin).arg("--version").output().with_context(|| format!("running {} --version", bin.display()))?;
    if !out.status.success() {
        bail!("{} --version exited with {}", bin.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Result of the first successful lookup in this process.
static FOUND: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Returns the path of the pinned OpenCode binary, installing it with `npm` if needed.
///
/// Blocking (may run `npm install`, a few seconds); call it from `spawn_blocking` in async
/// code that must stay responsive. The first successful answer is remembered for the
/// process.
pub fn ensure_installed() -> anyhow::Result<PathBuf> {
    let mut found = FOUND.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = found.as_ref() {
        return Ok(path.clone());
    }
    let path = locate_or_install()?;
    *found = Some(path.clone());
    Ok(path)
}

fn locate_or_install() -> anyhow::Result<PathBuf> {
    if let Some(bin) = non_empty_env(ENV_BIN) {
        let bin = PathBuf::from(bin);
        if !is_executable(&bin) {
            bail!("{ENV_BIN}={} is not an executable file", bin.display());
        }
        return Ok(bin);
    }
    let cache = cache_dir()?;
    let bin = binary_in(&cache)?;
    if is_executable(&bin) {
        return Ok(bin);
    }
    install_into(&cache)?;
    Ok(bin)
}

/// Installs the pinned version into `cache` (replacing whatever incomplete install is
/// there). Holds an exclusive lock on `<cache>.lock` meanwhile.
pub fn install_into(cache: &Path) -> anyhow::Result<()> {
    let parent = cache.parent().with_context(|| format!("cache dir {} has no parent", cache.display()))?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let lock_path = sibling(cache, ".lock");
    let lock = File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    // SAFETY: flock on a file descriptor we own; the lock is released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("locking the OpenCode cache");
    }
    let bin = binary_in(cache)?;
    if is_executable(&bin) {
        return Ok(()); // another process installed it while we waited
    }

    let pkg = platform_package()?;
    let tmp = sibling(cache, &format!(".tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    tracing::info!(package = pkg, version = OPENCODE_VERSION, dir = %cache.display(), "installing OpenCode with npm");
    let spec = format!("{pkg}@{OPENCODE_VERSION}");
    let out = Command::new("npm")
        .args(["install", "--no-save", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
        .arg(&tmp)
        .arg(&spec)
        .output()
        .context("running npm (is Node.js installed?)")?;
    if !out.status.success() {
        let _ = fs::remove_dir_all(&tmp);
        bail!("npm install {spec} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let tmp_bin = binary_in(&tmp)?;
    let version = binary_version(&tmp_bin)?;
    if version != OPENCODE_VERSION {
        let _ = fs::remove_dir_all(&tmp);
        bail!("npm installed OpenCode {version}, expected {OPENCODE_VERSION}");
    }
    if cache.exists() {
        fs::remove_dir_all(cache).with_context(|| format!("removing stale {}", cache.display()))?;
    }
    fs::rename(&tmp, cache).with_context(|| format!("moving {} to {}", tmp.display(), cache.display()))?;
    Ok(())
}

/// `dir` with `suffix` appended to its last component.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sibling_appends_to_the_last_component() {
        assert_eq!(sibling(Path::new("/a/b/1.18.34"), ".lock"), PathBuf::from("/a/b/1.18.34.lock"));
    }

    #[test]
    fn binary_lives_under_node_modules() {
        let bin = binary_in(Path::new("/c")).unwrap();
        assert!(bin.starts_with("/c/node_modules"));
        assert!(bin.ends_with("bin/opencode"));
    }
}
