//! `servers[i]`: one OpenCode server — where, how to log in, how long to wait.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

/// One OpenCode server (`opencode serve`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Short name used in logs and status (`server = "local"`).
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:4096`.
    pub url: String,
    /// Basic-auth user name; OpenCode's default is `opencode`.
    #[serde(default = "default_username")]
    pub username: String,
    /// Name of the environment variable holding the server password (never the
    /// password itself, so config files can be shared and printed).
    #[serde(default)]
    pub password_env: Option<String>,
    /// Timeout of one REST call to this server.
    #[serde(default = "default_request_timeout", with = "duration_str")]
    pub request_timeout: Duration,
    /// The event stream is considered dead when nothing (not even the 10 s heartbeat)
    /// arrives for this long.
    #[serde(default = "default_stream_read_timeout", with = "duration_str")]
    pub stream_read_timeout: Duration,
    /// First delay before reconnecting a broken event stream; doubles per failure.
    #[serde(default = "default_reconnect_initial", with = "duration_str")]
    pub reconnect_initial: Duration,
    /// Upper bound of the reconnect delay.
    #[serde(default = "default_reconnect_max", with = "duration_str")]
    pub reconnect_max: Duration,
    /// Page size used when listing sessions (OpenCode silently caps unpaged lists at 100).
    #[serde(default = "default_list_limit")]
    pub list_limit: u32,
    /// The largest REST answer read from this server, bytes; a longer one is refused
    /// (an error naming this key), never read into memory whole.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// REST calls to this server at once, at most; more wait their turn (within
    /// `request_timeout`), the status reads and aborts of stalled sessions served before
    /// the rest. A fleet's recoveries falling due together open no more connections than
    /// this.
    #[serde(default = "default_max_requests_in_flight")]
    pub max_requests_in_flight: usize,
}

fn default_username() -> String {
    "opencode".to_string()
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_stream_read_timeout() -> Duration {
    Duration::from_secs(35)
}

fn default_reconnect_initial() -> Duration {
    Duration::from_millis(250)
}

fn default_reconnect_max() -> Duration {
    Duration::from_secs(30)
}

fn default_list_limit() -> u32 {
    1000
}

fn default_max_response_bytes() -> usize {
    32 * 1024 * 1024
}

fn default_max_requests_in_flight() -> usize {
    32
}

/// The most `servers[].max_requests_in_flight` may allow.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 4096;

impl ServerConfig {
    /// A server with every optional value at its default.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            username: default_username(),
            password_env: None,
            request_timeout: default_request_timeout(),
            stream_read_timeout: default_stream_read_timeout(),
            reconnect_initial: default_reconnect_initial(),
            reconnect_max: default_reconnect_max(),
            list_limit: default_list_limit(),
            max_response_bytes: default_max_response_bytes(),
            max_requests_in_flight: default_max_requests_in_flight(),
        }
    }
}

/// Whether `url` has a user-info part (`http://user:password@host/`): what comes between
/// the scheme and the first `/`, `?` or `#` holds an `@`.
fn carries_credentials(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?', '#']).next().is_some_and(|authority| authority.contains('@'))
}

/// Checks `servers[i].*`: names unique and non-empty, URLs, limits.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    let mut names = std::collections::HashSet::new();
    for (i, s) in c.servers.iter().enumerate() {
        if s.name.trim().is_empty() {
            return Err(bad(&format!("servers[{i}].name"), "must not be empty"));
        }
        if !names.insert(s.name.as_str()) {
            return Err(bad(&format!("servers[{i}].name"), "is used by two servers"));
        }
        if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
            return Err(bad(&format!("servers[{i}].url"), "must start with http:// or https://"));
        }
        if carries_credentials(&s.url) {
            return Err(bad(
                &format!("servers[{i}].url"),
                &format!(
                    "must not carry a user or password (user:password@host): name a variable holding the \
                     password in servers[{i}].password_env (the user is servers[{i}].username) — a URL is \
                     written to files, logs and process lists"
                ),
            ));
        }
        if s.list_limit == 0 {
            return Err(bad(&format!("servers[{i}].list_limit"), "must be at least 1"));
        }
        if s.max_response_bytes < 64 * 1024 {
            return Err(bad(&format!("servers[{i}].max_response_bytes"), "must be at least 65536 (64 KiB)"));
        }
        if !(1..=MAX_REQUESTS_IN_FLIGHT).contains(&s.max_requests_in_flight) {
            return Err(bad(&format!("servers[{i}].max_requests_in_flight"), "must be between 1 and 4096"));
        }
    }
    Ok(())
}
