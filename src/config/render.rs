//! The effective configuration as TOML, for `shepherd config check`.
//!
//! This module decides what may be shown: every string under a key that looks secret
//! (`password`, `token`, `secret`, `api_key`) is printed as `"***"`; a key ending in
//! `_env` holds the NAME of a variable, is shown, and for `servers[].password_env` and
//! `advisor.api_key_env` a comment says whether that variable is set — never its value.
//! Durations are printed as the human strings the schema parses back (`"3m"`, `"1s 500ms"`), so the output is a
//! valid config file. With the origins of a load, every value a layer set says which
//! (`# from environment variable SHEPHERD_RECOVERY__STALL_TIMEOUT`); the rest are defaults.

use std::ffi::OsString;

use shepherd_actors::config::Config;
use toml::Value;
use toml_edit::{DocumentMut, Item, Table};

use super::layers::Origin;
use super::password::PasswordVar;
use super::Origins;

/// What a secret value is printed as.
pub const MASK: &str = "***";

/// Words that make a key secret (matched case-insensitively anywhere in the key).
const SECRET_WORDS: [&str; 4] = ["password", "token", "secret", "api_key"];

/// The effective configuration as TOML with secrets masked; reads the process
/// environment only to say whether each `password_env` variable is set.
pub fn render_effective(cfg: &Config) -> String {
    render_with(cfg, |name| std::env::var_os(name))
}

/// As [`render_effective`], each value that a layer set followed by a comment naming
/// that layer (`# from file shepherd.toml`); values without one are built-in defaults.
pub fn render_with_origins(cfg: &Config, origins: &Origins) -> String {
    render_noted(cfg, |name| std::env::var_os(name), |key| origins.of(key))
}

pub(crate) fn render_with(cfg: &Config, lookup: impl Fn(&str) -> Option<OsString>) -> String {
    render_noted(cfg, lookup, |_| Origin::Default)
}

pub(crate) fn render_noted(
    cfg: &Config,
    lookup: impl Fn(&str) -> Option<OsString>,
    origin_of: impl Fn(&str) -> Origin,
) -> String {
    let mut tree = match Value::try_from(cfg) {
        Ok(tree) => tree,
        Err(e) => return format!("# the configuration cannot be rendered as TOML: {e}\n"),
    };
    mask_secrets(&mut tree);
    let text = match toml::to_string(&tree) {
        Ok(text) => text,
        Err(e) => return format!("# the configuration cannot be rendered as TOML: {e}\n"),
    };
    // Re-read as a document only to attach comments; without them the text is still right.
    let Ok(mut doc) = text.parse::<DocumentMut>() else {
        return text;
    };
    note_password_vars(&mut doc, &lookup);
    note_origins(doc.as_table_mut(), "", &origin_of);
    doc.to_string()
}

/// Whether a key's string values are secrets.
pub(crate) fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    // `*_env` names a variable and `*_file` a path: where a secret lives, not the secret.
    !key.ends_with("_env") && !key.ends_with("_file") && SECRET_WORDS.iter().any(|word| key.contains(word))
}

pub(super) fn mask_secrets(value: &mut Value) {
    match value {
        Value::Table(table) => {
            for (key, child) in table.iter_mut() {
                if is_secret_key(key) {
                    mask_every_string(child);
                } else if key == "notify" {
                    // A hook's path or a topic is the secret: scheme and host only.
                    // Empty when `url_env` names the variable that holds it: left empty.
                    for url in child.as_array_mut().into_iter().flatten().filter_map(|n| n.get_mut("url")) {
                        if let Value::String(text) = url {
                            if !text.is_empty() {
                                *text = crate::notify::display_url(text);
                            }
                        }
                    }
                } else {
                    mask_secrets(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_secrets),
        // A password inside a URL (`redis://:pass@host`) is a secret wherever it is.
        Value::String(text) if text.contains("://") && text.contains('@') => {
            *text = crate::guard::redis::display_url(text);
        }
        _ => {}
    }
}

fn mask_every_string(value: &mut Value) {
    match value {
        Value::String(text) => *text = MASK.to_owned(),
        Value::Table(table) => table.iter_mut().for_each(|(_, child)| mask_every_string(child)),
        Value::Array(items) => items.iter_mut().for_each(mask_every_string),
        _ => {}
    }
}

/// Appends `# VAR is set` (or `is not set`, …) to every `password_env` line, the
/// advisor's `api_key_env` and every notifier's `url_env`.
fn note_password_vars(doc: &mut DocumentMut, lookup: &impl Fn(&str) -> Option<OsString>) {
    if let Some(notifiers) = doc.get_mut("notify").and_then(Item::as_array_of_tables_mut) {
        for value in notifiers.iter_mut().filter_map(|n| n.get_mut("url_env")).filter_map(Item::as_value_mut) {
            note_var(value, lookup);
        }
    }
    // The advisor's key variable likewise (an empty name means no key: no note).
    let advisor_key = doc.get_mut("advisor").and_then(|a| a.get_mut("api_key_env")).and_then(Item::as_value_mut);
    if let Some(value) = advisor_key.filter(|v| v.as_str().is_some_and(|name| !name.is_empty())) {
        note_var(value, lookup);
    }
    if let Some(servers) = doc.get_mut("servers").and_then(Item::as_array_of_tables_mut) {
        for value in servers.iter_mut().filter_map(|s| s.get_mut("password_env")).filter_map(Item::as_value_mut) {
            note_var(value, lookup);
        }
    }
}

/// `# VAR is set` (or `is not set`, …) after a value naming a variable, never its value.
fn note_var(value: &mut toml_edit::Value, lookup: &impl Fn(&str) -> Option<OsString>) {
    if let Some(name) = value.as_str().map(str::to_owned) {
        let state = PasswordVar::read(&name, lookup);
        value.decor_mut().set_suffix(format!(" # {name} {state}"));
    }
}

/// Appends `# from <layer>` to every value below `table` that a layer set (after the
/// note on a `password_env` line, if there is one).
fn note_origins(table: &mut Table, at: &str, origin_of: &impl Fn(&str) -> Origin) {
    for (key, item) in table.iter_mut() {
        let path = if at.is_empty() { key.get().to_owned() } else { format!("{at}.{}", key.get()) };
        match item {
            Item::Value(value) => {
                let origin = origin_of(&path);
                if origin == Origin::Default {
                    continue;
                }
                let note = value.decor().suffix().and_then(|s| s.as_str()).unwrap_or_default().to_owned();
                let note = if note.is_empty() { format!(" # from {origin}") } else { format!("{note}; from {origin}") };
                value.decor_mut().set_suffix(note);
            }
            Item::Table(inner) => note_origins(inner, &path, origin_of),
            Item::ArrayOfTables(tables) => {
                for (index, inner) in tables.iter_mut().enumerate() {
                    note_origins(inner, &format!("{path}[{index}]"), origin_of);
                }
            }
            Item::None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::config::ServerConfig;

    use super::*;

    #[test]
    fn keys_naming_secrets_are_secret_unless_they_name_a_variable() {
        assert!(is_secret_key("password"));
        assert!(is_secret_key("control_token"));
        assert!(is_secret_key("OPENAI_API_KEY"));
        assert!(!is_secret_key("password_env"));
        assert!(!is_secret_key("token_file"));
        assert!(!is_secret_key("continue_message"));
    }

    #[test]
    fn strings_under_secret_keys_are_masked_wherever_they_are() {
        let mut tree: Value = toml::from_str(
            "token = 'abc'\n[auth]\nclient_secret = 'def'\napi_key_env = 'KEY'\n[[hooks]]\npassword = 'ghi'",
        )
        .unwrap();
        mask_secrets(&mut tree);
        let text = toml::to_string(&tree).unwrap();
        for secret in ["abc", "def", "ghi"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.contains("api_key_env = \"KEY\""), "{text}");
    }

    #[test]
    fn a_password_inside_a_url_is_masked() {
        let mut cfg = Config::default();
        cfg.guard.redis_url = "redis://:hunter2@cache.internal:6379/0".into();
        let text = render_with(&cfg, |_| None);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("redis://:***@cache.internal:6379/0"), "{text}");
    }

    #[test]
    fn password_env_is_shown_with_whether_it_is_set_but_never_the_value() {
        let mut cfg = Config::default();
        let mut server = ServerConfig::new("local", "http://127.0.0.1:4096");
        server.password_env = Some("OPENCODE_PW".into());
        cfg.servers.push(server);
        let mut other = ServerConfig::new("other", "http://127.0.0.1:4097");
        other.password_env = Some("OTHER_PW".into());
        cfg.servers.push(other);

        let text = render_with(&cfg, |name| (name == "OPENCODE_PW").then(|| "hunter2".into()));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("password_env = \"OPENCODE_PW\" # OPENCODE_PW is set"), "{text}");
        assert!(text.contains("password_env = \"OTHER_PW\" # OTHER_PW is not set"), "{text}");
    }

    /// A notifier whose URL is in a variable shows an empty `url` (it read `?://`) and
    /// says whether the variable is set, never its value.
    #[test]
    fn a_notifier_url_env_is_shown_with_whether_it_is_set_and_its_url_left_empty() {
        let mut cfg = Config::default();
        let mut n = shepherd_actors::config::NotifyConfig::new(shepherd_actors::config::NotifyKind::Webhook, "");
        n.url_env = Some("HOOK_URL".into());
        cfg.notify.push(n);
        let secret = "https://hooks.example/services/T0/B0/secret-path";
        let text = render_with(&cfg, |name| (name == "HOOK_URL").then(|| secret.into()));
        assert!(!text.contains("secret-path") && !text.contains("?://"), "{text}");
        assert!(text.contains("url = \"\""), "{text}");
        assert!(text.contains("url_env = \"HOOK_URL\" # HOOK_URL is set"), "{text}");
    }

    #[test]
    fn the_advisor_key_variable_is_shown_by_name_never_its_value() {
        let mut cfg = Config::default();
        cfg.advisor.api_key_env = "ADVISOR_KEY".into();
        let text = render_with(&cfg, |name| (name == "ADVISOR_KEY").then(|| "sk-live-123".into()));
        assert!(!text.contains("sk-live-123"), "{text}");
        assert!(text.contains("api_key_env = \"ADVISOR_KEY\" # ADVISOR_KEY is set"), "{text}");
    }

    #[test]
    fn the_rendered_text_is_a_config_file_that_loads_back_to_the_same_values() {
        let mut cfg = Config::default();
        cfg.recovery.wait_after_abort = Duration::from_millis(1500);
        let mut server = ServerConfig::new("local", "http://127.0.0.1:4096");
        server.password_env = Some("OPENCODE_PW".into());
        cfg.servers.push(server);
        let text = render_with(&cfg, |_| None);
        assert!(text.contains("stall_timeout = \"3m\""), "{text}");
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back, cfg);
    }
}
