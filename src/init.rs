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
    let probed = probe(url).await;
    let found = match &probed {
        Probed::Version(version) => format!("found answering at init: OpenCode {version}"),
        Probed::PasswordProtected => "found answering at init: OpenCode, password protected".to_string(),
        Probed::Nothing => "nothing answered at init: start `opencode serve` there, or change the url".to_string(),
    };
    let text = render(url, &found, probed == Probed::PasswordProtected);
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

/// What answered at the server's URL.
#[derive(Debug, PartialEq)]
enum Probed {
    Version(String),
    /// It wants a password (HTTP 401): a server is there.
    PasswordProtected,
    Nothing,
}

/// Asks the OpenCode at `url` its version (without a password).
async fn probe(url: &str) -> Probed {
    let Ok(http) = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() else { return Probed::Nothing };
    let Ok(answer) = http.get(format!("{url}/global/health")).send().await else { return Probed::Nothing };
    if answer.status() == reqwest::StatusCode::UNAUTHORIZED {
        return Probed::PasswordProtected;
    }
    match answer.error_for_status() {
        Ok(ok) => match ok.json::<serde_json::Value>().await {
            Ok(body) => Probed::Version(body["version"].as_str().unwrap_or("of an unknown version").to_string()),
            Err(_) => Probed::Nothing,
        },
        Err(_) => Probed::Nothing,
    }
}

/// The file's text; a server that wants a password gets `password_env` set to the
/// variable OpenCode itself reads (`run` then says plainly if it is not exported).
fn render(url: &str, found: &str, password: bool) -> String {
    let password_env = match password {
        true => "password_env = \"OPENCODE_SERVER_PASSWORD\"     # the NAME of the variable holding its password",
        false => "# password_env = \"OPENCODE_SERVER_PASSWORD\"   # the NAME of the variable holding its password",
    };
    format!(
        r#"# Shepherd's configuration, written by `shepherd init`.
# Every key not set here keeps its default: `shepherd config check` prints them all
# (and where each value came from); `shepherd doctor` checks this setup end to end.

[[servers]]
name = "local"
url = "{url}"   # {found}
{password_env}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that wants a password gets `password_env` set, not left commented out;
    /// both files load.
    #[test]
    fn a_password_protected_server_gets_password_env_set() {
        let protected = render("http://127.0.0.1:4096", "found", true);
        let open = render("http://127.0.0.1:4096", "found", false);
        for (text, set) in [(&protected, true), (&open, false)] {
            let file: toml::Value = toml::from_str(text).unwrap();
            let var = file["servers"][0].get("password_env").and_then(toml::Value::as_str);
            assert_eq!(var, set.then_some("OPENCODE_SERVER_PASSWORD"), "{text}");
        }
    }

    /// A 401 at the health endpoint is a server there that wants a password.
    #[tokio::test]
    async fn a_401_is_probed_as_password_protected() {
        let url = crate::test_support::Answer::status("401 Unauthorized").serve().await.url;
        assert_eq!(probe(&url).await, Probed::PasswordProtected);
    }
}
