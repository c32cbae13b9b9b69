//! The layered tree: each source writes its values over the ones before it, and the
//! tree remembers which source set every key.
//!
//! This module decides what "over" means: a table from a later layer is merged key by
//! key into the earlier one; anything else (a string, a number, a whole list) replaces
//! what was there. It records an [`Origin`] for every key written, so an error found
//! later can say "from environment variable SHEPHERD_RECOVERY__STALL_TIMEOUT". Built-in
//! defaults are not in the tree: serde fills in what no layer wrote.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use toml::{Table, Value};

use super::key_path::{is_within, join_index, join_key, KeyPath, Segment};

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

/// A value could not be written at a path: the path where it went wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetError {
    pub(crate) key: String,
    pub(crate) reason: String,
}

/// The merged tree of every layer written so far, with the origin of every key.
#[derive(Debug, Clone)]
pub(crate) struct Layers {
    tree: Value,
    origins: BTreeMap<String, Origin>,
}

impl Default for Layers {
    fn default() -> Self {
        Self { tree: Value::Table(Table::new()), origins: BTreeMap::new() }
    }
}

impl Layers {
    /// The merged tree (always a table).
    pub(crate) fn tree(&self) -> &Value {
        &self.tree
    }

    /// Merges a whole table (a file) over what is there.
    pub(crate) fn merge(&mut self, table: Table, origin: &Origin) {
        let Value::Table(root) = &mut self.tree else { unreachable!("the root is always a table") };
        let mut written = Vec::new();
        merge_into(root, "", table, &mut written);
        for (path, value) in written {
            self.record(&path, &value, origin);
        }
    }

    /// Writes one value at `path`, creating the tables and list entries on the way (a
    /// list grows only by one entry at its end).
    pub(crate) fn set(&mut self, path: &KeyPath, value: Value, origin: &Origin) -> Result<(), SetError> {
        if path.segments().is_empty() {
            return Err(SetError { key: String::new(), reason: "the key is empty".to_owned() });
        }
        let mut created = Vec::new();
        set_in(&mut self.tree, "", path.segments(), value.clone(), &mut created)?;
        for key in created {
            self.origins.insert(key, origin.clone());
        }
        self.record(&path.to_string(), &value, origin);
        Ok(())
    }

    /// Which layer set `key`: the key itself, else the first layer that wrote below it
    /// (a table whose required key is missing), else its nearest ancestor that a layer
    /// wrote, else the built-in default.
    pub(crate) fn origin_of(&self, key: &str) -> Origin {
        if let Some(origin) = self.origins.get(key) {
            return origin.clone();
        }
        if let Some((_, origin)) = self.origins.iter().find(|(path, _)| is_within(path, key)) {
            return origin.clone();
        }
        self.origins
            .iter()
            .filter(|(path, _)| is_within(key, path))
            .max_by_key(|(path, _)| path.len())
            .map_or(Origin::Default, |(_, origin)| origin.clone())
    }

    /// Notes `origin` for `path` and everything below it, forgetting older notes there.
    fn record(&mut self, path: &str, value: &Value, origin: &Origin) {
        self.origins.retain(|known, _| !is_within(known, path));
        let mut stack = vec![(path.to_owned(), value)];
        while let Some((path, value)) = stack.pop() {
            match value {
                Value::Table(table) => {
                    stack.extend(table.iter().map(|(key, child)| (join_key(&path, key), child)));
                }
                Value::Array(items) => {
                    stack.extend(items.iter().enumerate().map(|(i, child)| (join_index(&path, i), child)));
                }
                _ => {}
            }
            self.origins.insert(path, origin.clone());
        }
    }
}

/// Merges `from` into `into`; collects the (path, value) of every key it wrote.
fn merge_into(into: &mut Table, at: &str, from: Table, written: &mut Vec<(String, Value)>) {
    for (key, value) in from {
        let path = join_key(at, &key);
        match (into.get_mut(&key), value) {
            (Some(Value::Table(existing)), Value::Table(table)) => merge_into(existing, &path, table, written),
            (_, value) => {
                written.push((path, value.clone()));
                into.insert(key, value);
            }
        }
    }
}

fn set_in(
    node: &mut Value,
    at: &str,
    rest: &[Segment],
    value: Value,
    created: &mut Vec<String>,
) -> Result<(), SetError> {
    let Some((first, after)) = rest.split_first() else {
        *node = value;
        return Ok(());
    };
    let kind = node.type_str();
    match first {
        Segment::Key(key) => {
            let here = join_key(at, key);
            let Value::Table(table) = node else {
                return Err(SetError { key: at.to_owned(), reason: format!("is a {kind}, so it has no key `{key}`") });
            };
            let child = table.entry(key.clone()).or_insert_with(|| {
                created.push(here.clone());
                empty_for(after)
            });
            set_in(child, &here, after, value, created)
        }
        Segment::Index(index) => {
            let here = join_index(at, *index);
            let Value::Array(items) = node else {
                return Err(SetError { key: at.to_owned(), reason: format!("is a {kind}, not a list") });
            };
            if *index == items.len() {
                items.push(empty_for(after));
                created.push(here.clone());
            }
            let len = items.len();
            let Some(child) = items.get_mut(*index) else {
                return Err(SetError {
                    key: here,
                    reason: format!("no such entry: {at} has {len}, so the next new one is {}", join_index(at, len)),
                });
            };
            set_in(child, &here, after, value, created)
        }
    }
}

/// What to create for a missing key: a list if the next step is an index, else a table.
fn empty_for(after: &[Segment]) -> Value {
    match after.first() {
        Some(Segment::Index(_)) => Value::Array(Vec::new()),
        _ => Value::Table(Table::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> KeyPath {
        KeyPath::parse_dotted(text).unwrap()
    }

    #[test]
    fn a_later_table_merges_key_by_key_and_remembers_each_origin() {
        let file = Origin::File("a.toml".into());
        let env = Origin::Env("SHEPHERD_LOG__LEVEL".into());
        let mut layers = Layers::default();
        layers.merge(toml::from_str("[log]\nformat = 'json'\nlevel = 'info'").unwrap(), &file);
        layers.set(&path("log.level"), Value::String("debug".into()), &env).unwrap();
        assert_eq!(layers.tree()["log"]["format"].as_str(), Some("json"));
        assert_eq!(layers.tree()["log"]["level"].as_str(), Some("debug"));
        assert_eq!(layers.origin_of("log.format"), file);
        assert_eq!(layers.origin_of("log.level"), env);
        assert_eq!(layers.origin_of("recovery.cooldown"), Origin::Default);
    }

    #[test]
    fn a_list_grows_by_one_entry_at_its_end_only() {
        let flag = Origin::Flag("--set".into());
        let mut layers = Layers::default();
        layers.set(&path("servers[0].url"), Value::String("http://a".into()), &flag).unwrap();
        layers.set(&path("servers[1].url"), Value::String("http://b".into()), &flag).unwrap();
        let err = layers.set(&path("servers[5].url"), Value::String("http://c".into()), &flag).unwrap_err();
        assert_eq!(err.key, "servers[5]");
        assert_eq!(layers.origin_of("servers[1]"), flag);
    }

    #[test]
    fn a_key_below_a_plain_value_is_refused_at_that_value() {
        let flag = Origin::Flag("--set".into());
        let mut layers = Layers::default();
        layers.set(&path("log.level"), Value::String("info".into()), &flag).unwrap();
        let err = layers.set(&path("log.level.x"), Value::String("1".into()), &flag).unwrap_err();
        assert_eq!(err.key, "log.level");
    }
}
