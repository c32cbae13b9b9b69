//! `shepherd init`: a first configuration file, commented, in the place `run` looks.
//!
//! It asks the OpenCode address (default: OpenCode's own default, `127.0.0.1:4096`)
//! whether a server answers there, and writes the `[[servers]]` entry either way — with
//! a comment saying what it found. Every other key is left to its default and listed,
//! commented out, with what it does; `shepherd config check` prints them all. The file is
//! never overwritten unless asked (`--force`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

/// Where OpenCode's `opencode serve` listens by default.
pub const DEFAULT_OPENCODE_URL: &str = "http://127.0.0.1:4096";

/// How long the probe of the server waits.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Writes the first configuration to `path`; returns what it said about the server.
pub async fn write(path: &Path, server_url: &str, force: bool) -> anyhow::Result<String> {
    let url = server_url.trim_end_matches('/');
    let found = match probe(url).await {
        Some(version) => format!("found answering at init: OpenCode {version}"),
        None => "nothing answered at init: start `opencode serve` there, or change the url".to_string(),
    };
    let text = render(url, &found);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if force {
        crate::private_state::write_file(path, text.as_bytes())
    } else {
        use std::io::Write as _;
        crate::private_state::create_new(path).and_then(|mut f| f.write_all(text.as_bytes()))
    }
    .with_context(|| match path.exists() && !force {
        true => format!("{} exists; --force replaces it", path.display()),
        false => format!("writing {}", path.display()),
    })?;
    Ok(found)
}

/// The version of the OpenCode at `url`, if one answers (no password: a server that
/// wants one answers 401, which still says a server is there).
async fn probe(url: &str) -> Option<String> {
    let http = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build().ok()?;
    let answer = http.get(format!("{url}/global/health")).send().await.ok()?;
    if answer.status() == reqwest::StatusCode::UNAUTHORIZED {
        return Some("(password protected: set password_env)".into());
    }
    let body: serde_json::Value = answer.error_for_status().ok()?.json().await.ok()?;
    Some(body["version"].as_str().unwrap_or("of an unknown version").to_string())
}

fn render(url: &str, found: &str) -> String {
    format!(
        r#"# Shepherd's configuration, written by `shepherd init`.
# Every key not set here keeps its default: `shepherd config check` prints them all
# (and where each value came from); `shepherd doctor` checks this setup end to end.

[[servers]]
name = "local"
url = "{url}"   # {found}
# password_env = "OPENCODE_SERVER_PASSWORD"   # the NAME of the variable holding its password

# A few keys people change first (defaults shown):
# [recovery]
# stall_timeout = "3m"          # busy with no progress this long = stalled
# max_recoveries = 3            # recoveries before the back-off
#
# [nudge]
# enabled = true                # idle with open todos: nudged once
#
# [review]
# enabled = true                # all todos done: asked once to review its work
#
# [advisor]
# base_url = ""                 # an OpenAI-compatible model to ask before aborts and nudges
#
# [control]
# bind = "127.0.0.1:7433"       # the control API (shepherd sessions, top, pause)
"#
    )
}
