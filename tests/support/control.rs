//! The control API in end-to-end tests: a daemon serving it on a free loopback port,
//! its token generated into a private file, and plain HTTP to it.

use std::path::PathBuf;

use shepherd_actors::config::{Config, ControlConfig};
use tempfile::TempDir;

use super::{Rig, PATIENCE};

/// Where the daemon writes its generated token, under the test's `state` folder.
pub fn token_file(state: &TempDir) -> PathBuf {
    state.path().join("state").join("control.token")
}

/// A rig whose daemon serves the control API (token variable `token_env`, set nowhere,
/// so the daemon generates the token), with nudges and reviews off so the only prompts
/// Shepherd sends are the ones a test provokes; `configure` adjusts the rest.
pub async fn start(
    state: &TempDir,
    token_env: &'static str,
    configure: impl FnOnce(&mut Config),
) -> anyhow::Result<Rig> {
    let token_file = token_file(state);
    Rig::start_config(move |c| {
        c.control = ControlConfig {
            enabled: true,
            bind: "127.0.0.1:0".into(),
            token_env: token_env.into(),
            token_file: token_file.to_string_lossy().into_owned(),
            allow_unauthenticated_reads: false,
            allow_remote: false,
            allowed_hosts: Vec::new(),
        };
        c.nudge.enabled = false;
        c.review.enabled = false;
        configure(c);
    })
    .await
}

/// The control API of a rig's daemon, and plain HTTP to it (each test binary adds the
/// requests it needs).
pub struct Api {
    pub url: String,
    pub token: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn of(rig: &Rig) -> Api {
        let daemon = rig.daemon();
        Api {
            url: daemon.control_url().expect("control API enabled").to_string(),
            token: daemon.control_token().expect("control API enabled").expose().to_string(),
            http: reqwest::Client::builder().timeout(PATIENCE).build().unwrap(),
        }
    }
}
