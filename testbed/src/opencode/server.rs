//! One real `opencode serve` per test, fully isolated in a temp dir.
//!
//! Layout of the temp dir (nothing outside it is written):
//!
//! ```text
//! <tmp>/home/                      HOME, with XDG_{CONFIG,DATA,CACHE,STATE}_HOME inside
//! <tmp>/home/.config/opencode/opencode.json    provider block → the fake model
//! <tmp>/home/.config/opencode/package*.json    seeded so OpenCode skips its npm install
//! <tmp>/project/                   scratch git repository, the server's cwd
//! <tmp>/tmp/                       TMPDIR
//! <tmp>/opencode.log               the server's stdout + stderr (`--print-logs`)
//! ```

use std::fs::{self, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Map, Value};

use super::install::ensure_installed;
use super::process::{descendants, signal_each, signal_group};
use crate::client::OpenCodeClient;
use crate::fake_model::FakeModel;

/// Provider id of the fake model in the generated config.
pub const FAKE_PROVIDER: &str = "fake";
/// The default model id (`fake/fake-model`).
pub const FAKE_MODEL: &str = "fake-model";
/// A second model id, for tests that switch models.
pub const FAKE_MODEL_2: &str = "fake-model-2";
/// Context window of both fake models, tokens.
pub const FAKE_CONTEXT_LIMIT: u64 = 200_000;
/// Output limit of both fake models, tokens.
pub const FAKE_OUTPUT_LIMIT: u64 = 8_000;
/// User name for HTTP Basic when a password is set (OpenCode's default).
pub const SERVER_USERNAME: &str = "opencode";
/// Set to keep the temp dir of every server (for debugging).
pub const ENV_KEEP: &str = "SHEPHERD_TESTBED_KEEP";

/// How long a graceful stop may take before the process group is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How many fresh ports to try when the server dies at start (port taken meanwhile).
const START_ATTEMPTS: usize = 3;

/// How to start an [`OpenCodeServer`].
#[derive(Debug, Clone)]
pub struct OpenCodeOptions {
    /// `baseURL` of the fake model (`http://127.0.0.1:PORT/v1`).
    pub fake_base_url: String,
    /// JSON deep-merged into the generated `opencode.json` (e.g. `compaction`).
    pub extra_config: Map<String, Value>,
    /// Extra `provider.fake.options` (e.g. `chunkTimeout`, `headerTimeout`, ms).
    pub provider_options: Map<String, Value>,
    /// `OPENCODE_SERVER_PASSWORD`; clients then need HTTP Basic.
    pub password: Option<String>,
    /// Extra environment of the server (e.g. `OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS`).
    pub env: Vec<(String, String)>,
    /// Longest wait for `GET /global/health` at start and restart.
    pub startup_timeout: Duration,
    /// Binary to run; `None`: [`ensure_installed`].
    pub binary: Option<PathBuf>,
}

impl OpenCodeOptions {
    /// Options pointing at a fake model's base URL.
    pub fn new(fake_base_url: impl Into<String>) -> OpenCodeOptions {
        OpenCodeOptions {
            fake_base_url: fake_base_url.into(),
            extra_config: Map::new(),
            provider_options: Map::new(),
            password: None,
            env: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            binary: None,
        }
    }

    /// Options pointing at `fake`.
    pub fn for_fake(fake: &FakeModel) -> OpenCodeOptions {
        OpenCodeOptions::new(fake.base_url())
    }

    /// Sets top-level config key `key` (objects are merged into the generated ones).
    pub fn config(mut self, key: impl Into<String>, value: Value) -> Self {
        self.extra_config.insert(key.into(), value);
        self
    }

    /// Sets `provider.fake.options.<key>` (e.g. `chunkTimeout: 4000`).
    pub fn provider_option(mut self, key: impl Into<String>, value: Value) -> Self {
        self.provider_options.insert(key.into(), value);
        self
    }

    /// Protects the server with `OPENCODE_SERVER_PASSWORD`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Adds an environment variable for the server.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the start-up timeout.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The `opencode.json` these options produce.
    pub fn config_json(&self) -> Value {
        let model =
            |name: &str| json!({"name": name, "limit": {"context": FAKE_CONTEXT_LIMIT, "output": FAKE_OUTPUT_LIMIT}});
        let mut options = json!({"baseURL": self.fake_base_url, "apiKey": "x"});
        merge(&mut options, &Value::Object(self.provider_options.clone()));
        let mut config = json!({
            "model": format!("{FAKE_PROVIDER}/{FAKE_MODEL}"),
            "autoupdate": false,
            "share": "disabled",
            "provider": {
                FAKE_PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": options,
                    "models": {FAKE_MODEL: model("Fake"), FAKE_MODEL_2: model("Fake 2")},
                }
            }
        });
        merge(&mut config, &Value::Object(self.extra_config.clone()));
        config
    }
}

/// Deep merge: objects merge key by key, anything else replaces.
fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (into, from) => *into = from.clone(),
    }
}

/// A running `opencode serve` in its own temp dir. Dropping it kills the server and
/// everything it started, and removes the temp dir.
#[derive(Debug)]
pub struct OpenCodeServer {
    opts: OpenCodeOptions,
    binary: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl OpenCodeServer {
    /// Prepares the temp dir, starts the server and waits until it is healthy.
    pub async fn start(opts: OpenCodeOptions) -> anyhow::Result<OpenCodeServer> {
        let binary = match &opts.binary {
            Some(b) => b.clone(),
            None => tokio::task::spawn_blocking(ensure_installed).await.context("installer task failed")??,
        };
        let mut dir = tempfile::Builder::new()
            .prefix("shepherd-opencode-")
            .tempdir()
            .context("creating the test bed temp dir")?;
        if std::env::var_os(ENV_KEEP).is_some() {
            dir.disable_cleanup(true);
        }
        let mut server = OpenCodeServer { opts, binary, dir, port: 0, child: None };
        server.prepare_files()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            server.port = free_port()?;
            match server.spawn_and_wait().await {
                Ok(()) => return Ok(server),
                Err(e) => {
                    server.kill();
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("OpenCode did not start")))
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port (kept across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The scratch git project (the server's cwd and default directory).
    pub fn project_dir(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    /// The isolated HOME.
    pub fn home_dir(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The generated `opencode.json`.
    pub fn config_path(&self) -> PathBuf {
        self.home_dir().join(".config/opencode/opencode.json")
    }

    /// The server's combined stdout/stderr.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("opencode.log")
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The password, if the server has one (user name: [`SERVER_USERNAME`]).
    pub fn password(&self) -> Option<&str> {
        self.opts.password.as_deref()
    }

    /// The options it was started with.
    pub fn options(&self) -> &OpenCodeOptions {
        &self.opts
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A REST helper for this server (with credentials when a password is set).
    pub fn client(&self) -> OpenCodeClient {
        let c = OpenCodeClient::new(self.url());
        match self.password() {
            Some(p) => c.with_auth(SERVER_USERNAME, p),
            None => c,
        }
    }

    /// Stops the server gracefully (SIGTERM, then SIGKILL after 5 s) with everything it
    /// started. The temp dir stays; [`respawn`](Self::respawn) starts it again.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        let family = descendants(pid);
        signal_group(pid, libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        while tokio::time::Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        signal_group(pid, libc::SIGKILL);
        signal_each(&family, libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the server at once (SIGKILL, like a crash) with everything it started.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id();
        let family = descendants(pid);
        signal_group(pid, libc::SIGKILL);
        signal_each(&family, libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts the server again (same port, HOME and project) after [`stop`](Self::stop)
    /// or [`kill`](Self::kill), and waits until it is healthy.
    pub async fn respawn(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("OpenCode is still running; stop or kill it first");
        }
        self.spawn_and_wait().await
    }

    /// [`stop`](Self::stop) then [`respawn`](Self::respawn).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.respawn().await
    }

    fn prepare_files(&self) -> anyhow::Result<()> {
        let home = self.home_dir();
        for sub in [".config/opencode", ".local/share", ".local/state", ".cache"] {
            fs::create_dir_all(home.join(sub))?;
        }
        fs::create_dir_all(self.dir.path().join("tmp"))?;
        let config = serde_json::to_string_pretty(&self.opts.config_json())?;
        fs::write(self.config_path(), config).context("writing opencode.json")?;
        self.seed_config_dependencies()?;
        self.init_project()
    }

    /// At the first prompt OpenCode `npm install`s `@opencode-ai/plugin@<version>` into
    /// its config dir and makes the turn wait for it (~3 s; for 1.18.34 the install even
    /// fails: that version is not published). It skips the install when `node_modules`
    /// exists and `package-lock.json` lists every dependency of `package.json`, so the
    /// test bed writes exactly that.
    fn seed_config_dependencies(&self) -> anyhow::Result<()> {
        let dir = self.home_dir().join(".config/opencode");
        let version = super::install::OPENCODE_VERSION;
        let deps = json!({ "@opencode-ai/plugin": version });
        fs::create_dir_all(dir.join("node_modules"))?;
        fs::write(dir.join("package.json"), serde_json::to_string_pretty(&json!({ "dependencies": deps }))?)?;
        fs::write(
            dir.join("package-lock.json"),
            serde_json::to_string_pretty(&json!({
                "lockfileVersion": 3,
                "packages": { "": { "dependencies": deps } },
            }))?,
        )?;
        Ok(())
    }

    fn init_project(&self) -> anyhow::Result<()> {
        let project = self.project_dir();
        fs::create_dir_all(&project)?;
        fs::write(project.join("README.md"), "# Scratch project\n\nCreated by Shepherd's test bed.\n")?;
        let git = |args: &[&str]| -> anyhow::Result<()> {
            let out = Command::new("git")
                .args(args)
                .current_dir(&project)
                .env("HOME", self.home_dir())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env_remove("GIT_DIR")
                .env_remove("GIT_WORK_TREE")
                .output()
                .context("running git (is it installed?)")?;
            if !out.status.success() {
                bail!("git {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
            }
            Ok(())
        };
        git(&["init", "-q", "-b", "main"])?;
        git(&["config", "user.email", "testbed@shepherd.invalid"])?;
        git(&["config", "user.name", "Shepherd Test Bed"])?;
        git(&["config", "commit.gpgsign", "false"])?;
        git(&["add", "README.md"])?;
        git(&["commit", "-q", "-m", "Initial commit"])?;
        Ok(())
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        use std::io::Write as _;
        writeln!(log, "=== shepherd testbed: opencode serve --port {} ===", self.port)?;
        let home = self.home_dir();
        let mut cmd = Command::new(&self.binary);
        cmd.args(["serve", "--hostname", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--print-logs")
            .current_dir(self.project_dir())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_DATA_HOME", home.join(".local/share"))
            .env("XDG_STATE_HOME", home.join(".local/state"))
            .env("XDG_CACHE_HOME", home.join(".cache"))
            .env("TMPDIR", self.dir.path().join("tmp"))
            .env("LANG", "C.UTF-8")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // No network beyond the fake model: skip update checks and downloads.
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            .env("OPENCODE_DISABLE_SHARE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        if let Some(p) = &self.opts.password {
            cmd.env("OPENCODE_SERVER_PASSWORD", p);
        }
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        // SAFETY: the closure runs between fork and exec and only calls prctl(2), which is
        // async-signal-safe. It makes the server get SIGTERM if the thread that spawned it
        // dies (a test process killed mid-run), so servers are not left behind.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("spawning {}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    async fn spawn_and_wait(&mut self) -> anyhow::Result<()> {
        self.spawn()?;
        let client = self.client();
        let deadline = tokio::time::Instant::now() + self.opts.startup_timeout;
        let mut last_err: String;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    bail!(
                        "opencode serve exited at start ({status}); log {}:\n{}",
                        self.log_path().display(),
                        self.log_tail(30)
                    );
                }
            }
            match client.health_within(Duration::from_secs(1)).await {
                Ok(h) if h.healthy => {
                    // The project's instance boots on the first request for its directory
                    // (1-2 s); do that now rather than inside a test's first prompt.
                    client.status(None).await.context("warming up the project instance")?;
                    return Ok(());
                }
                Ok(h) => last_err = format!("unhealthy: {h:?}"),
                Err(e) => last_err = e.to_string(),
            }
            if tokio::time::Instant::now() >= deadline {
                self.kill();
                bail!(
                    "OpenCode not healthy after {:?} ({last_err}); log {}:\n{}",
                    self.opts.startup_timeout,
                    self.log_path().display(),
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for OpenCodeServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- OpenCode log {} (last 40 lines) ---\n{}\n---", self.log_path().display(), self.log_tail(40));
        }
        self.kill();
    }
}

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_two_fake_models_and_merges_extras() {
        let opts = OpenCodeOptions::new("http://127.0.0.1:9/v1")
            .config("compaction", json!({"auto": false}))
            .config("provider", json!({"fake": {"name": "Renamed"}}))
            .provider_option("chunkTimeout", json!(4000));
        let c = opts.config_json();
        assert_eq!(c["model"], "fake/fake-model");
        assert_eq!(c["autoupdate"], false);
        assert_eq!(c["share"], "disabled");
        assert_eq!(c["compaction"]["auto"], false);
        let fake = &c["provider"]["fake"];
        assert_eq!(fake["name"], "Renamed");
        assert_eq!(fake["npm"], "@ai-sdk/openai-compatible");
        assert_eq!(fake["options"]["baseURL"], "http://127.0.0.1:9/v1");
        assert_eq!(fake["options"]["chunkTimeout"], 4000);
        for m in [FAKE_MODEL, FAKE_MODEL_2] {
            assert_eq!(fake["models"][m]["limit"]["context"], 200_000);
            assert_eq!(fake["models"][m]["limit"]["output"], 8_000);
        }
    }
}
