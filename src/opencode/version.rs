//! Which OpenCode releases Shepherd is tested with, and the check of a server's version
//! at connect.
//!
//! [`SUPPORTED`] is the one place the range lives; CI runs the full suite on the pinned
//! release ([`super::pinned::OPENCODE_VERSION`], the newest) and a smoke subset on
//! [`SUPPORTED`]'s oldest (`scripts/test.sh` reads it from this file). The pump reads
//! `GET /global/health` once per connect ([`read_version`]); [`VersionWarnings`] warns
//! once per server and version per process when the version is outside the range or
//! unparseable. A failed read is logged and never stops supervision: the version only
//! informs a person, it decides nothing.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use super::client::Credentials;

/// A release version, `MAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }

    /// `1.18.34` (a leading `v` and surrounding blanks are allowed). Anything else — a
    /// pre-release or build suffix, a missing part — is `None`: such builds were never
    /// tried.
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = text.split('.');
        let mut next = || -> Option<u32> {
            let p = parts.next()?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()
        };
        let v = Version::new(next()?, next()?, next()?);
        parts.next().is_none().then_some(v)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A range of releases: from `oldest` (inclusive) to every patch of `newest_minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    pub oldest: Version,
    /// `(major, minor)` of the newest minor tested; its later patches are in range, the
    /// next minor is not.
    pub newest_minor: (u32, u32),
}

impl VersionRange {
    pub fn contains(&self, v: Version) -> bool {
        v >= self.oldest && (v.major, v.minor) <= self.newest_minor
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} to {}.{}.x", self.oldest, self.newest_minor.0, self.newest_minor.1)
    }
}

/// The OpenCode releases Shepherd supports. Each tested release ran the real-OpenCode
/// suites (`testbed_smoke`, `e2e_recovery`, `e2e_followup`, `e2e_handoff`,
/// `e2e_context`, `e2e_subagents`, `e2e_versions`) with the fake model (December 2026;
/// 1.19.5 ran the whole workspace's suite):
/// - 1.19.5, the newest release (`opencode-linux-x64`'s `latest` on npm; the meta
///   package `opencode-ai` stops at 1.18.33) and the pinned one: everything passes.
/// - 1.18.34, the pinned release before it: everything passes (the whole workspace's
///   suite ran on it in every CI run until 1.19.5 was pinned).
/// - 1.17.19, the last 1.17 published for Linux (`opencode-ai@1.17.20` exists, its
///   `opencode-linux-x64` does not): everything passes but the runaway loop
///   (`a_runaway_loop_is_aborted…`, the `cut` case of `scripted_behaviours…`): before
///   1.18 a model stream cut without a finish reason ends the turn (`finish: "unknown"`,
///   then idle) instead of calling the model again and again, so there is no loop to
///   catch.
/// - 1.15.13, the last 1.15 (no 1.16 was published): as 1.17.19, and OpenCode compacts
///   an overflowed context by itself even with `compaction.auto = false`, so Shepherd's
///   emergency compaction has nothing to do (`an_overflow_left_idle…` expects it).
///
/// Event shapes and the endpoints Shepherd uses are the same in all four (1.15 also
/// sends `session.next.*` events, which Shepherd ignores; 1.19.5 against 1.18.34: the
/// same OpenAPI paths and event, session, message, part, todo and ask schemas, the same
/// frames and sequences live); the test bed's launcher and configuration work
/// unchanged. 1.19 closes a keep-alive connection idle for 5 s (see
/// `client::POOL_IDLE`). Releases between the ends are assumed to behave like
/// them; older releases and newer minors were never tried and get a warning.
pub const SUPPORTED: VersionRange = VersionRange { oldest: OLDEST_SUPPORTED, newest_minor: (1, 19) };

/// The oldest supported release; CI runs a smoke subset on it (`scripts/test.sh` reads
/// this line).
pub const OLDEST_SUPPORTED: Version = Version::new(1, 15, 13);

/// What a server's reported version means to Shepherd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    Supported(Version),
    /// A release outside [`SUPPORTED`].
    Outside(Version),
    /// Not `MAJOR.MINOR.PATCH` (a dev build, an empty string).
    Unparseable,
}

impl Support {
    /// What is wrong with a server that reports `reported`, and what to do about it
    /// (`None`: nothing) — the daemon's warning and `shepherd doctor` say the same. No
    /// install command: npm's `opencode-ai` is not published for every release (not for
    /// the pinned one), and the platform packages put no `opencode` on the `PATH`.
    pub fn problem(self, reported: &str) -> Option<(String, String)> {
        let pinned = super::pinned::OPENCODE_VERSION;
        match self {
            Support::Supported(_) => None,
            Support::Outside(_) => Some((
                format!(
                    "OpenCode {reported} is outside the versions Shepherd is tested with ({SUPPORTED}): \
                     supervision may misread its events"
                ),
                format!(
                    "run a supported OpenCode (Shepherd's tests run {pinned}) or a Shepherd that supports {reported}"
                ),
            )),
            Support::Unparseable => Some((
                format!(
                    "OpenCode reports version {reported:?}, which is no release Shepherd knows ({SUPPORTED}): \
                     supervision may misread its events"
                ),
                format!("run a supported OpenCode release (Shepherd's tests run {pinned})"),
            )),
        }
    }
}

/// Judges a reported version against [`SUPPORTED`].
pub fn assess(reported: &str) -> Support {
    match Version::parse(reported) {
        Some(v) if SUPPORTED.contains(v) => Support::Supported(v),
        Some(v) => Support::Outside(v),
        None => Support::Unparseable,
    }
}

/// Reads the version a server reports at `GET /global/health`
/// (`{"healthy":true,"version":"1.18.34"}`), bounded by `timeout`.
pub async fn read_version(
    http: &reqwest::Client,
    base_url: &str,
    auth: Option<&Credentials>,
    timeout: Duration,
) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Health {
        version: Option<String>,
    }
    let url = format!("{}/global/health", base_url.trim_end_matches('/'));
    let mut rb = http.get(&url).timeout(timeout);
    if let Some(c) = auth {
        rb = rb.basic_auth(&c.username, Some(&c.password));
    }
    let resp = rb.send().await.map_err(|e| format!("GET /global/health: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET /global/health: HTTP {status}"));
    }
    // The answer is a few dozen bytes; a larger one is not a health answer.
    const MAX_BYTES: usize = 16 * 1024;
    if resp.content_length().is_some_and(|n| n > MAX_BYTES as u64) {
        return Err("GET /global/health: answer too large".into());
    }
    let body = resp.bytes().await.map_err(|e| format!("GET /global/health: {e}"))?;
    if body.len() > MAX_BYTES {
        return Err("GET /global/health: answer too large".into());
    }
    let health: Health = serde_json::from_slice(&body).map_err(|e| format!("GET /global/health: {e}"))?;
    health.version.ok_or_else(|| "GET /global/health: no version in the answer".into())
}

/// The (server, version) pairs already warned about in this process, so a server that
/// reconnects, or a pump restarted by a reload, does not repeat the warning.
#[derive(Debug, Default)]
pub struct VersionWarnings {
    warned: Mutex<BTreeSet<(String, String)>>,
}

/// The process's warnings (the pumps share it).
pub static WARNINGS: VersionWarnings = VersionWarnings { warned: Mutex::new(BTreeSet::new()) };

impl VersionWarnings {
    /// Logs `server`'s `reported` version, and warns the first time in this process that
    /// this server reports this version outside [`SUPPORTED`] or unparseable. Returns the
    /// judgement.
    pub fn check(&self, server: &str, reported: &str) -> Support {
        let support = assess(reported);
        let first = || {
            self.warned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert((server.to_string(), reported.to_string()))
        };
        match support.problem(reported) {
            None => {
                tracing::info!(server = %server, opencode_version = %reported, supported = %SUPPORTED, "OpenCode version read")
            }
            Some((problem, fix)) if first() => tracing::warn!(
                server = %server,
                opencode_version = %reported,
                supported = %SUPPORTED,
                "{problem}: {fix}"
            ),
            Some(_) => {
                tracing::info!(server = %server, opencode_version = %reported, supported = %SUPPORTED, "OpenCode version read (unsupported, warned before)")
            }
        }
        support
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_versions_parse_and_others_do_not() {
        assert_eq!(Version::parse("1.18.34"), Some(Version::new(1, 18, 34)));
        assert_eq!(Version::parse(" v1.15.13\n"), Some(Version::new(1, 15, 13)));
        for bad in ["", "1.18", "1.18.34.1", "1.18.x", "0.0.0-dev-202612", "local", "1..3"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_range_holds_the_tested_releases_and_later_patches_of_the_newest_minor() {
        for ok in ["1.15.13", "1.17.19", "1.18.0", "1.18.34", "1.19.0", "1.19.5", "1.19.99"] {
            assert!(matches!(assess(ok), Support::Supported(_)), "{ok}");
        }
        for out in ["1.15.12", "1.14.41", "0.9.0", "1.20.0", "2.0.0"] {
            assert!(matches!(assess(out), Support::Outside(_)), "{out}");
        }
        assert_eq!(assess("dev"), Support::Unparseable);
    }

    #[test]
    fn the_pinned_release_is_supported() {
        assert!(matches!(assess(shepherd_testbed::opencode::OPENCODE_VERSION), Support::Supported(_)));
    }

    #[test]
    fn the_range_reads_as_its_ends() {
        assert_eq!(SUPPORTED.to_string(), "1.15.13 to 1.19.x");
    }
}
