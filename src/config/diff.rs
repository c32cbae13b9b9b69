//! What a reload changes: every key whose value differs between the running and the new
//! configuration (old → new, secrets masked as in `config check`), which of them apply
//! while running and which need a restart, and which servers come, go or change.
//!
//! Pure: it compares two [`Config`] values and reads nothing else. The daemon applies
//! the live part ([`crate::reload`]) and keeps the running value of every key that
//! needs a restart ([`keep_restart_only`]), so the next reload reports it again.

use std::collections::BTreeMap;

use serde::Serialize;
use shepherd_actors::config::Config;
use toml::Value;

use super::render::mask_secrets;

/// Keys (or sections, ending in `.`) whose new value is only read at start-up: the
/// ledger file, the control API's socket and token, the log subscriber, the status
/// file's writer, and the guard's backend (its Redis connection and key space).
const RESTART_ONLY: [&str; 11] = [
    "store.",
    "control.",
    "log.",
    "status.",
    "guard.enabled",
    "guard.backend",
    "guard.redis_url",
    "guard.key_prefix",
    "notify", // the [[notify]] list is one leaf; the notifiers start with the daemon
    "supervisor.server_threads",
    "supervisor.pump_apart",
];

/// One changed key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// `recovery.stall_timeout`, `servers.local.url`.
    pub key: String,
    /// As `config check` would print it (`"3m"`, `true`, `"***"`); `(none)` when absent.
    pub old: String,
    pub new: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} → {}", self.key, self.old, self.new)
    }
}

/// Everything a reload would change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigDiff {
    /// Changes that apply while running (server entries included).
    pub live: Vec<Change>,
    /// Changes that are ignored until the next start.
    pub needs_restart: Vec<Change>,
    /// Servers by name: new ones, gone ones, and ones whose entry changed.
    pub servers_added: Vec<String>,
    pub servers_removed: Vec<String>,
    pub servers_changed: Vec<String>,
}

impl ConfigDiff {
    /// The differences between the running configuration and the new one.
    pub fn between(old: &Config, new: &Config) -> ConfigDiff {
        let (before, after) = (flatten(old), flatten(new));
        let mut diff = ConfigDiff::default();
        let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        for key in keys {
            let (o, n) = (before.get(key), after.get(key));
            if o == n {
                continue;
            }
            let none = || "(none)".to_string();
            let change =
                Change { key: key.clone(), old: o.cloned().unwrap_or_else(none), new: n.cloned().unwrap_or_else(none) };
            if needs_restart(key) {
                diff.needs_restart.push(change);
            } else {
                diff.live.push(change);
            }
        }
        for server in &new.servers {
            match old.servers.iter().find(|s| s.name == server.name) {
                None => diff.servers_added.push(server.name.clone()),
                Some(before) if before != server => diff.servers_changed.push(server.name.clone()),
                Some(_) => {}
            }
        }
        for server in &old.servers {
            if !new.servers.iter().any(|s| s.name == server.name) {
                diff.servers_removed.push(server.name.clone());
            }
        }
        diff
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty() && self.needs_restart.is_empty()
    }

    /// Whether any live key under `section` (e.g. `"guard."`) changed.
    pub fn touches(&self, section: &str) -> bool {
        self.live.iter().any(|c| c.key.starts_with(section))
    }
}

/// Whether a key's new value is only read at start-up.
pub fn needs_restart(key: &str) -> bool {
    RESTART_ONLY.iter().any(|p| if p.ends_with('.') { key.starts_with(p) } else { key == *p })
}

/// The configuration a reload leaves running: `new`, except every key that needs a
/// restart, which keeps its running value.
pub fn keep_restart_only(running: &Config, new: Config) -> Config {
    let mut kept = new;
    kept.store = running.store.clone();
    kept.control = running.control.clone();
    kept.log = running.log.clone();
    kept.status = running.status.clone();
    kept.notify = running.notify.clone(); // the notifiers start with the daemon
    kept.guard.enabled = running.guard.enabled;
    kept.guard.backend = running.guard.backend;
    kept.guard.redis_url = running.guard.redis_url.clone();
    kept.guard.key_prefix = running.guard.key_prefix.clone();
    kept.supervisor.server_threads = running.supervisor.server_threads;
    kept.supervisor.pump_apart = running.supervisor.pump_apart;
    kept
}

/// Every leaf as `dotted.key → value as TOML`, secrets masked; servers are keyed by name
/// (`servers.local.url`), so a reordered list is no change.
fn flatten(cfg: &Config) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(mut tree) = Value::try_from(cfg) else { return out };
    mask_secrets(&mut tree);
    let Value::Table(mut table) = tree else { return out };
    if let Some(Value::Array(servers)) = table.remove("servers") {
        for server in servers {
            let name = server.get("name").and_then(Value::as_str).unwrap_or("?").to_string();
            walk(&format!("servers.{name}"), &server, &mut out);
        }
    }
    walk("", &Value::Table(table), &mut out);
    out
}

fn walk(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Table(table) => {
            for (key, child) in table {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                walk(&path, child, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::config::ServerConfig;

    use super::*;

    fn with_servers(names: &[(&str, &str)]) -> Config {
        Config { servers: names.iter().map(|(n, u)| ServerConfig::new(*n, *u)).collect(), ..Config::default() }
    }

    #[test]
    fn the_same_configuration_is_no_change() {
        let cfg = with_servers(&[("a", "http://a:1")]);
        assert!(ConfigDiff::between(&cfg, &cfg.clone()).is_empty());
    }

    #[test]
    fn a_changed_timeout_is_one_live_change_with_its_old_and_new_value() {
        let old = Config::default();
        let mut new = old.clone();
        new.recovery.stall_timeout = Duration::from_secs(30);
        let diff = ConfigDiff::between(&old, &new);
        assert_eq!(
            diff.live,
            vec![Change { key: "recovery.stall_timeout".into(), old: "\"3m\"".into(), new: "\"30s\"".into() }]
        );
        assert_eq!(diff.live[0].to_string(), "recovery.stall_timeout: \"3m\" → \"30s\"");
        assert!(diff.needs_restart.is_empty());
    }

    #[test]
    fn settings_read_only_at_start_up_are_reported_as_needing_a_restart() {
        let old = Config::default();
        let mut new = old.clone();
        new.store.path = "/tmp/other.sqlite3".into();
        new.control.bind = "127.0.0.1:7500".into();
        new.guard.backend = shepherd_actors::config::GuardBackend::Redis;
        new.guard.window = Duration::from_secs(10);
        new.supervisor.server_threads = 4;
        let diff = ConfigDiff::between(&old, &new);
        let keys = |v: &[Change]| v.iter().map(|c| c.key.clone()).collect::<Vec<_>>();
        assert_eq!(
            keys(&diff.needs_restart),
            ["control.bind", "guard.backend", "store.path", "supervisor.server_threads"]
        );
        assert_eq!(keys(&diff.live), ["guard.window"]);
    }

    #[test]
    fn servers_are_matched_by_name_added_removed_or_changed() {
        let old = with_servers(&[("a", "http://a:1"), ("b", "http://b:1"), ("c", "http://c:1")]);
        let new = with_servers(&[("c", "http://c:2"), ("a", "http://a:1"), ("d", "http://d:1")]);
        let diff = ConfigDiff::between(&old, &new);
        assert_eq!(diff.servers_added, ["d"]);
        assert_eq!(diff.servers_removed, ["b"]);
        assert_eq!(diff.servers_changed, ["c"], "a moved in the list but did not change");
        assert!(diff.live.iter().any(|c| c.key == "servers.c.url" && c.new == "\"http://c:2\""), "{diff:?}");
        assert!(diff.live.iter().any(|c| c.key == "servers.b.url" && c.new == "(none)"), "{diff:?}");
    }

    #[test]
    fn secrets_are_masked_in_the_change_list() {
        let old = Config::default();
        let mut new = old.clone();
        new.guard.redis_url = "redis://:hunter2@cache:6379/0".into();
        new.advisor.api_key_env = "ADVISOR_KEY".into();
        let diff = ConfigDiff::between(&old, &new);
        let text = format!("{diff:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("ADVISOR_KEY"), "the variable's name is not a secret: {text}");
    }

    #[test]
    fn notifiers_need_a_restart_and_their_urls_are_not_shown() {
        use shepherd_actors::config::{NotifyConfig, NotifyKind};
        let running = Config::default();
        let mut new = Config::default();
        new.notify = vec![NotifyConfig::new(NotifyKind::Slack, "https://hooks.example/T0/B0/SECRET")];
        let diff = ConfigDiff::between(&running, &new);
        assert_eq!(diff.needs_restart.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), ["notify"]);
        assert!(!format!("{diff:?}").contains("SECRET"), "{diff:?}");
        assert!(keep_restart_only(&running, new).notify.is_empty());
    }

    #[test]
    fn what_needs_a_restart_keeps_its_running_value() {
        let running = Config::default();
        let mut new = running.clone();
        new.store.path = "/tmp/other.sqlite3".into();
        new.recovery.stall_timeout = Duration::from_secs(30);
        let kept = keep_restart_only(&running, new);
        assert_eq!(kept.store.path, running.store.path);
        assert_eq!(kept.recovery.stall_timeout, Duration::from_secs(30));
        // So the next reload of the same file says it again.
        let mut again = kept.clone();
        again.store.path = "/tmp/other.sqlite3".into();
        assert_eq!(ConfigDiff::between(&kept, &again).needs_restart.len(), 1);
    }
}
