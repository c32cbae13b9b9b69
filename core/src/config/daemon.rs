//! The daemon's own sections: `supervisor`, `status`, `top`, `toasts`, `control`,
//! `store`, `log`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

/// The fleet supervisor: discovery, idle cleanup, memory limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// How often every server's sessions are listed to find busy ones the stream missed.
    #[serde(with = "duration_str")]
    pub discovery_interval: Duration,
    /// How often idle session actors are looked for.
    #[serde(with = "duration_str")]
    pub cleanup_interval: Duration,
    /// A session with no event for this long leaves memory (its state stays in the ledger).
    #[serde(with = "duration_str")]
    pub idle_cleanup: Duration,
    /// Above this many session actors, the longest-quiet idle ones leave memory first.
    pub max_sessions_in_memory: usize,
    /// How long a parent may wait, idle after a background child failed or busy while
    /// all its children are idle, before Shepherd treats it as orphaned.
    #[serde(with = "duration_str")]
    pub orphan_wait: Duration,
    /// Caps on what a server's data can make Shepherd remember (each a count): event
    /// types counted per server (past it, new types are counted under one `other`
    /// entry), child → parent links (past it, the oldest link is forgotten), and
    /// directories per server (past it, an arbitrary one is forgotten; discovery
    /// re-learns it from the session list). A cap reached is logged once.
    pub max_event_types: usize,
    pub max_parents: usize,
    pub max_directories: usize,
    /// Threads the servers run on (their event pumps and their sessions' actors); more
    /// servers than threads share them in turn. 0 = one per CPU core. The supervisor, the
    /// guard, the advisor and the control API keep the main thread. Read at start-up.
    pub server_threads: usize,
    /// A server's event pump (reading, framing, decoding, routing) runs on one of the
    /// server threads and its sessions' actors (their decisions) are spread over all the
    /// others, each session always on the same one, so one server's stream uses every
    /// core; the events of one read cross to each sessions' thread together. Off, or
    /// with one thread, the pump and its sessions share a thread and no event crosses.
    /// Read at start-up.
    pub pump_apart: bool,
}

/// The most threads `supervisor.server_threads` may ask for.
pub const MAX_SERVER_THREADS: usize = 256;

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            discovery_interval: Duration::from_secs(60),
            cleanup_interval: Duration::from_secs(30),
            idle_cleanup: Duration::from_secs(10 * 60),
            max_sessions_in_memory: 20_000,
            orphan_wait: Duration::from_secs(15),
            max_event_types: 256,
            max_parents: 100_000,
            max_directories: 10_000,
            server_threads: 0,
            pump_apart: true,
        }
    }
}

/// The status file for external monitoring: per-session statistics and a rolling
/// history, written atomically (temp file, fsync, rename).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    pub enabled: bool,
    /// The file (a leading `~/` is the home directory); empty = the default
    /// `$XDG_STATE_HOME/shepherd/status.json` (`~/.local/state/shepherd/status.json`).
    pub path: String,
    /// At most one write per this interval (changes in between are batched).
    #[serde(with = "duration_str")]
    pub min_interval: Duration,
    /// The most of its time the writer spends writing, 0–1: after a write that took `t`
    /// (reading the fleet, building and writing the file) the next waits at least
    /// `t × (1 − share) / share`. At 100,000 sessions one write takes about half a second
    /// of a core; every `min_interval` it took a third of the machine's two cores from the
    /// sessions. Small fleets write in milliseconds and keep `min_interval`.
    pub max_write_share: f64,
    /// Archives kept at start-up (`status.json.1` newest … `status.json.N`); 0 = none.
    pub rotate: u32,
    /// Entries of each session's rolling history in the file (the whole journal is in
    /// the ledger: `shepherd history`). Each costs about 150 bytes of memory per session
    /// that has that many records, and a line of the file on every write.
    pub max_history: usize,
    /// Written at least this often (the live state — busy, todos, tokens — changes
    /// without records).
    #[serde(with = "duration_str")]
    pub refresh_interval: Duration,
    /// A session neither in memory nor acted on for this long leaves the file.
    #[serde(with = "duration_str")]
    pub forget_after: Duration,
}

/// The smallest `status.max_write_share`: a write then waits at most 999 times its own
/// length.
pub const MIN_WRITE_SHARE: f64 = 0.001;

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: String::new(),
            min_interval: Duration::from_secs(2),
            max_write_share: 0.05,
            rotate: 3,
            max_history: 10,
            refresh_interval: Duration::from_secs(30),
            forget_after: Duration::from_secs(60 * 60),
        }
    }
}

/// `shepherd top`, the live terminal view of the fleet (a client of the control API).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TopConfig {
    /// How often the view polls `GET /v1/status` (and redraws the times).
    #[serde(with = "duration_str")]
    pub refresh_interval: Duration,
    /// Journal records shown in the detail pane.
    pub journal_entries: u32,
    /// Show the fleet's counts in the terminal's title (`--title` turns it on too).
    pub terminal_title: bool,
    /// Show the most-stalled session's way towards recovery as the terminal's progress
    /// (OSC 9;4; `--progress` turns it on too).
    pub progress: bool,
}

impl Default for TopConfig {
    fn default() -> Self {
        Self { refresh_interval: Duration::from_secs(2), journal_entries: 20, terminal_title: false, progress: false }
    }
}

/// Toasts in an OpenCode TUI attached to the session's server (`POST /tui/show-toast`)
/// when Shepherd acts on a session: a continue after an abort, a nudge, a review, a
/// hand-off. Off by default; best effort (a failed toast never affects the action).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ToastsConfig {
    pub enabled: bool,
    /// How long the TUI shows a toast.
    #[serde(with = "duration_str")]
    pub duration: Duration,
}

impl Default for ToastsConfig {
    fn default() -> Self {
        Self { enabled: false, duration: Duration::from_secs(5) }
    }
}

/// The HTTP control API (status, custom prompts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    pub enabled: bool,
    /// Address to bind; loopback by default. Binding elsewhere needs `allow_remote`.
    pub bind: String,
    /// Name of the environment variable holding the bearer token. When it is unset, a
    /// random token is generated at start-up and written to `token_file`.
    pub token_env: String,
    /// Where the daemon writes (and the CLI reads) the token; empty = the default under
    /// the user's state directory.
    pub token_file: String,
    /// Serve read-only endpoints (`GET`) without a token.
    pub allow_unauthenticated_reads: bool,
    /// Allow a `bind` address that is not loopback. Off: such a bind refuses to start.
    /// On: it starts, and logs that the token travels in clear text unless a TLS proxy
    /// is in front.
    pub allow_remote: bool,
    /// `Host` values answered besides `localhost`, `127.0.0.1`, `[::1]` and the bound
    /// address (each with the bound port), e.g. `["shepherd.internal:7433"]` for a
    /// remote bind reached by name. Anything else is refused with 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:7433".to_string(),
            token_env: "SHEPHERD_CONTROL_TOKEN".to_string(),
            token_file: String::new(),
            allow_unauthenticated_reads: false,
            allow_remote: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The durable ledger: per-session state that survives eviction and restarts, and the
/// journal of every action (`shepherd history`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite` (on disk, the default) or `memory` (forgotten at exit: for tests and
    /// throw-away runs).
    pub backend: StoreBackend,
    /// The SQLite file (a leading `~/` is the home directory); empty = the default
    /// `$XDG_STATE_HOME/shepherd/ledger.sqlite3` (`~/.local/state/shepherd/ledger.sqlite3`).
    pub path: String,
    /// SQLite's page cache, KiB. The ledger mostly appends and reads one session's row
    /// when its actor starts; the operating system caches the file too. SQLite's own
    /// default (2 MiB) would be a fixed cost of 2 KiB per session in a fleet of 1,000;
    /// 256 KiB (64 pages) holds the upper levels of the ledger's trees.
    pub cache_kib: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { backend: StoreBackend::Sqlite, path: String::new(), cache_kib: 256 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Sqlite,
    Memory,
}

/// Log output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `json`, `pretty`, or `auto` (json when stdout is not a terminal).
    pub format: LogFormat,
    /// A `tracing` filter directive, e.g. `info` or `shepherd=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Auto, level: "info".to_string() }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Json,
    Pretty,
}

/// The levels a `log.level` directive may name.
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks `log.level`: each comma-separated directive is a level, or `target=level`. A
/// bare word is a valid `tracing` directive — every level of the target of that name —
/// so `level = "verbose"` would quietly log nothing else: refused. Span filters
/// (`target[span]=level`) are left to the filter's own parser.
pub(super) fn validate_log(c: &Config) -> Result<(), InvalidValue> {
    let is_level = |word: &str| LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(word.trim()));
    let wrong = c.log.level.split(',').find(|directive| {
        let directive = directive.trim();
        match directive.rsplit_once('=') {
            _ if directive.is_empty() || directive.contains('[') => false,
            Some((target, level)) => target.trim().is_empty() || !is_level(level),
            None => !is_level(directive),
        }
    });
    match wrong {
        Some(directive) => Err(bad(
            "log.level",
            &format!(
                "{:?} is not a level: write one of {} (e.g. \"info\"), or target=level directives \
                 (\"info,shepherd=debug\")",
                directive.trim(),
                LOG_LEVELS.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// Checks `status.*` when the status file is on.
pub(super) fn validate_status(c: &Config) -> Result<(), InvalidValue> {
    if c.status.enabled {
        if c.status.refresh_interval < c.status.min_interval {
            return Err(bad("status.refresh_interval", "must be at least status.min_interval"));
        }
        if !(MIN_WRITE_SHARE..=1.0).contains(&c.status.max_write_share) {
            return Err(bad("status.max_write_share", "must be between 0.001 and 1"));
        }
        if c.status.max_history == 0 {
            return Err(bad("status.max_history", "must be at least 1"));
        }
        let path = c.status.path.as_str();
        if path.trim() != path || path.ends_with('/') || path == "~" {
            return Err(bad("status.path", "must name a file, e.g. /var/lib/shepherd/status.json"));
        }
    }
    Ok(())
}

/// Checks `top.*`.
pub(super) fn validate_top(c: &Config) -> Result<(), InvalidValue> {
    if c.top.refresh_interval < Duration::from_millis(100) {
        return Err(bad("top.refresh_interval", "must be at least 100ms"));
    }
    if c.top.journal_entries == 0 {
        return Err(bad("top.journal_entries", "must be at least 1"));
    }
    Ok(())
}

/// Checks `supervisor.*`.
pub(super) fn validate_supervisor(c: &Config) -> Result<(), InvalidValue> {
    if c.supervisor.discovery_interval.is_zero() {
        return Err(bad("supervisor.discovery_interval", "must be greater than zero"));
    }
    if c.supervisor.cleanup_interval.is_zero() {
        return Err(bad("supervisor.cleanup_interval", "must be greater than zero"));
    }
    if c.supervisor.max_sessions_in_memory == 0 {
        return Err(bad("supervisor.max_sessions_in_memory", "must be at least 1"));
    }
    if c.supervisor.max_event_types < 16 {
        return Err(bad("supervisor.max_event_types", "must be at least 16 (OpenCode sends about 30 types)"));
    }
    if c.supervisor.max_parents == 0 {
        return Err(bad("supervisor.max_parents", "must be at least 1"));
    }
    if c.supervisor.max_directories == 0 {
        return Err(bad("supervisor.max_directories", "must be at least 1"));
    }
    if c.supervisor.server_threads > MAX_SERVER_THREADS {
        return Err(bad("supervisor.server_threads", "must be at most 256 (0 = one per CPU core)"));
    }
    Ok(())
}

/// Checks `toasts.*` when toasts are on.
pub(super) fn validate_toasts(c: &Config) -> Result<(), InvalidValue> {
    if c.toasts.enabled && c.toasts.duration.is_zero() {
        return Err(bad("toasts.duration", "must be greater than zero"));
    }
    Ok(())
}

/// Checks `control.*` when the control API is on: a loopback bind unless
/// `control.allow_remote`.
pub(super) fn validate_control(c: &Config) -> Result<(), InvalidValue> {
    if c.control.enabled {
        match c.control.bind.parse::<std::net::SocketAddr>() {
            Err(_) => return Err(bad("control.bind", "must be an address like 127.0.0.1:7433")),
            Ok(addr) if !addr.ip().is_loopback() && !c.control.allow_remote => {
                return Err(bad(
                    "control.bind",
                    "is not a loopback address: the control API (and its bearer token, in clear text) would be \
                     reachable from other hosts; bind 127.0.0.1 or [::1], or set control.allow_remote = true \
                     behind a TLS proxy",
                ))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Checks `store.*` for the SQLite ledger.
pub(super) fn validate_store(c: &Config) -> Result<(), InvalidValue> {
    if c.store.backend == StoreBackend::Sqlite {
        let path = c.store.path.as_str();
        if path.trim() != path {
            return Err(bad("store.path", "must not start or end with white space"));
        }
        if path.ends_with('/') || path == "~" {
            return Err(bad("store.path", "names a directory; give a file, e.g. /var/lib/shepherd/ledger.sqlite3"));
        }
        if c.store.cache_kib < 64 {
            return Err(bad("store.cache_kib", "must be at least 64"));
        }
    }
    Ok(())
}
