//! The layers as sources of the `config` crate: what each contributes, under which key
//! and with which [`Origin`].
//!
//! `config` merges the sources in the order they are added (a table key by key; a
//! string, a number or a whole list replaces what was there) and keeps each value's
//! origin with it, so an error found later can name the layer. Three things it does not
//! do the way Shepherd's users expect are done here, thinly:
//! - its `Environment` source reads `SHEPHERD_SERVERS__0__URL` as a table key `"0"`, not
//!   as a list index, and gives every variable the same origin ("the environment"); so
//!   [`Layer::environment`] makes one key per variable, `servers[0].url`, with the
//!   variable's name as its origin;
//! - its overrides (`set_override`) are kept by key, not in the order given, so that
//!   `--set servers[0].url=…` after `--server` could be applied before it; so `--server`
//!   and every `--set` is a source of its own, added in order;
//! - its file source names a file relative to the current directory; so the file is read
//!   by the caller and parsed here with `config`'s TOML format under the path as given.
//!
//! This module knows nothing about which keys exist: that is the schema's business.

use std::fmt;
use std::path::{Path, PathBuf};

use config::{FileFormat, Format, Map, Source, Value, ValueKind};

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "SHEPHERD_";

/// Separator between the levels of a key in an environment variable name.
const ENV_SEPARATOR: &str = "__";

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// No layer set it: the schema's default.
    Default,
    /// A TOML file.
    File(PathBuf),
    /// An environment variable, by name (never its value).
    Env(String),
    /// A command-line flag, e.g. `--set recovery.stall_timeout` or `--server`.
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("built-in default"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(name) => write!(f, "environment variable {name}"),
            Self::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// One layer's keys (in `config`'s spelling: `recovery.stall_timeout`, `servers[0].url`)
/// and their values, each value carrying its origin as text (the [`Origin`]'s display).
#[derive(Debug, Clone, Default)]
pub(crate) struct Layer {
    values: Map<String, Value>,
    /// Every origin used in this layer.
    pub(crate) origins: Vec<Origin>,
    /// A file layer's text, to find the line of a key an error names.
    pub(crate) text: Option<String>,
}

impl Layer {
    /// A TOML file's text, read from `path`; the error is the parser's message.
    pub(crate) fn file(path: &Path, text: &str) -> Result<Self, String> {
        let origin = Origin::File(path.to_owned());
        let values = FileFormat::Toml.parse(Some(&origin.to_string()), text).map_err(|e| e.to_string())?;
        Ok(Self { values, origins: vec![origin], text: Some(text.to_owned()) })
    }

    /// The configuration variables among `env` (name, value pairs), sorted by key; the
    /// error names the malformed variable.
    pub(crate) fn environment(env: &[(String, String)]) -> Result<Self, (Origin, String)> {
        let mut assignments = Vec::new();
        for (name, value) in env {
            let Some(key) = key_of_env_name(name) else {
                continue;
            };
            let origin = Origin::Env(name.clone());
            match key {
                Ok(key) => assignments.push((key, value, origin)),
                Err(reason) => return Err((origin, reason)),
            }
        }
        assignments.sort_by(|a, b| a.0.cmp(&b.0));
        let mut layer = Self::default();
        for (key, value, origin) in assignments {
            layer.insert(key, ValueKind::String(value.clone()), origin);
        }
        Ok(layer)
    }

    /// `--server URL`: the server list, replaced by one server named `name`.
    pub(crate) fn server_flag(name: &str, url: &str) -> Self {
        let origin = Origin::Flag("--server".to_owned());
        let text = origin.to_string();
        let server: Map<String, Value> = [("name", name), ("url", url)]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), Value::new(Some(&text), value)))
            .collect();
        let servers = ValueKind::Array(vec![Value::new(Some(&text), server)]);
        let mut layer = Self::default();
        layer.insert("servers".to_owned(), servers, origin);
        layer
    }

    /// `--set key.path=value`; the error names the flag and what is wrong with it.
    pub(crate) fn set_flag(assignment: &str) -> Result<Self, (Origin, String)> {
        let Some((key, value)) = assignment.split_once('=') else {
            let reason = "expected KEY=VALUE, e.g. recovery.stall_timeout=5m".to_owned();
            return Err((Origin::Flag(format!("--set {assignment}")), reason));
        };
        let origin = Origin::Flag(format!("--set {}", key.trim()));
        let key = match key_of_dotted(key) {
            Ok(key) => key,
            Err(reason) => return Err((origin, reason)),
        };
        let mut layer = Self::default();
        layer.insert(key, ValueKind::String(value.to_owned()), origin);
        Ok(layer)
    }

    fn insert(&mut self, key: String, value: ValueKind, origin: Origin) {
        self.values.insert(key, Value::new(Some(&origin.to_string()), value));
        self.origins.push(origin);
    }
}

impl Source for Layer {
    fn clone_into_box(&self) -> Box<dyn Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<Map<String, Value>, config::ConfigError> {
        Ok(self.values.clone())
    }
}

/// Whether an environment variable is configuration (see [`key_of_env_name`]).
pub(crate) fn is_configuration_var(name: &str) -> bool {
    key_of_env_name(name).is_some()
}

/// The key an environment variable names, or `None` when the variable is not
/// configuration: no [`ENV_PREFIX`], or no `__` after it (`SHEPHERD_OPENCODE_BIN`,
/// `SHEPHERD_CONTROL_TOKEN` belong to someone else). `SHEPHERD_SERVERS__0__URL` is
/// `servers[0].url`; keys are lower-cased.
fn key_of_env_name(name: &str) -> Option<Result<String, String>> {
    let rest = name.strip_prefix(ENV_PREFIX)?;
    if !rest.contains(ENV_SEPARATOR) {
        return None;
    }
    let lower = rest.to_ascii_lowercase();
    Some(key_of_parts(lower.split(ENV_SEPARATOR)).map_err(|_| {
        format!("{name} has an empty key or a character other than letters, digits, `_` and `-` between `__`")
    }))
}

/// The key a `--set` flag names: keys separated by `.`, list indices as `[0]` or `.0`.
fn key_of_dotted(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("the key is empty".to_owned());
    }
    let mut parts = Vec::new();
    for part in text.split('.') {
        // `servers[0][1]` is the parts `servers`, `0`, `1`.
        let (name, brackets) = part.split_once('[').map_or((part, None), |(name, rest)| (name, Some(rest)));
        parts.push(name);
        let Some(brackets) = brackets else { continue };
        let Some(indices) = brackets.strip_suffix(']') else {
            return Err(format!("{text:?}: `[` without a closing `]` at the end of {part:?}"));
        };
        for index in indices.split("][") {
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{text:?}: `[{index}]` is not a list index"));
            }
            parts.push(index);
        }
    }
    key_of_parts(parts.into_iter()).map_err(|part| match part.is_empty() {
        true => format!("{text:?} has an empty key between dots"),
        false => format!("{text:?}: `{part}` is not a key (letters, digits, `_` and `-`)"),
    })
}

/// Joins the parts of a key in `config`'s spelling: a part made only of digits, after
/// the first, is a list index (`servers[0].url`). The error is the part that is not a
/// key.
fn key_of_parts<'a>(parts: impl Iterator<Item = &'a str>) -> Result<String, &'a str> {
    let mut key = String::new();
    for part in parts {
        let is_key = !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !is_key {
            return Err(part);
        }
        if !key.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            key.push_str(&format!("[{part}]"));
        } else {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(part);
        }
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_accept_brackets_and_numeric_segments_for_list_indices() {
        assert_eq!(key_of_dotted("servers[0].url").unwrap(), "servers[0].url");
        assert_eq!(key_of_dotted("servers.0.url").unwrap(), "servers[0].url");
    }

    #[test]
    fn malformed_dotted_keys_are_refused() {
        assert!(key_of_dotted("").is_err());
        assert!(key_of_dotted("recovery..stall_timeout").is_err());
        assert!(key_of_dotted("servers[x].url").is_err());
        assert!(key_of_dotted("servers[-1].url").is_err());
        assert!(key_of_dotted("servers[0").is_err());
    }

    #[test]
    fn only_prefixed_names_with_a_double_underscore_are_configuration() {
        assert_eq!(key_of_env_name("SHEPHERD_OPENCODE_BIN"), None);
        assert_eq!(key_of_env_name("PATH"), None);
        assert_eq!(key_of_env_name("SHEPHERD_RECOVERY__STALL_TIMEOUT"), Some(Ok("recovery.stall_timeout".into())));
        assert_eq!(key_of_env_name("SHEPHERD_SERVERS__0__URL"), Some(Ok("servers[0].url".into())));
        assert!(matches!(key_of_env_name("SHEPHERD_RECOVERY____X"), Some(Err(_))));
    }
}
