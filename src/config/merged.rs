//! The merged layers, read into the schema, and what an error says: the key path, the
//! reason and the layer that set the value.
//!
//! The key path is `serde_path_to_error`'s (`servers[0].url`); the reason is serde's,
//! with "unknown field" and "missing field" re-worded (a typo gets a suggestion); the
//! layer is the origin `config` kept with the value at that path ([`Merged::origin_of`]).
//! The tree is read through [`strict`], not `config`'s lenient deserializer: strings from
//! the environment and flags become numbers and booleans where the schema asks for one,
//! and no other value changes type.
//!
//! It must not know the schema: unknown and missing keys are serde's findings (from
//! `deny_unknown_fields` and required fields), only re-worded here.

use config::{Value, ValueKind};
use serde::de::DeserializeOwned;

use super::layers::{Layer, Origin};
use super::{strict, ConfigError};

/// Every layer merged, and the origins its values may name.
pub(crate) struct Merged {
    tree: Value,
    origins: Vec<Origin>,
    /// Each file layer's text, by its origin: where an error's line is looked up.
    texts: Vec<(Origin, String)>,
}

impl Merged {
    /// The layers, lowest first, merged by the `config` crate. It fails only when a
    /// source cannot be read, and a [`Layer`] was read before.
    pub(crate) fn of(layers: Vec<Layer>) -> Result<Self, config::ConfigError> {
        let mut builder = config::Config::builder();
        let (mut origins, mut texts) = (Vec::new(), Vec::new());
        for mut layer in layers {
            origins.extend(layer.origins.iter().cloned());
            if let (Some(text), Some(origin)) = (layer.text.take(), layer.origins.first()) {
                texts.push((origin.clone(), text));
            }
            builder = builder.add_source(layer);
        }
        Ok(Self { tree: builder.build()?.cache, origins, texts })
    }

    /// Reads the tree as `T`, strictly (see [`strict`]): text from the environment and
    /// flags may become a number or a boolean, nothing else changes type.
    pub(crate) fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        self.refuse_list_gaps(&self.tree, "")?;
        strict::deserialize(&self.tree, |key| self.is_text_layer(key)).map_err(|e| {
            let key = if e.path().iter().next().is_none() { String::new() } else { e.path().to_string() };
            self.invalid(key, reason(e.inner()))
        })
    }

    /// Whether the value at `key` was set by the environment or a flag (whose values are
    /// text).
    fn is_text_layer(&self, key: &str) -> bool {
        let origin = self.lookup(key).0.and_then(config::Value::origin);
        origin.is_some_and(|text| matches!(self.origin_named(text), Origin::Env(_) | Origin::Flag(_)))
    }

    /// An error about `key` (empty: the top level), from the layer that set it.
    pub(crate) fn invalid(&self, key: String, reason: String) -> ConfigError {
        let origin = self.origin_of(&key);
        let text = self.texts.iter().find(|(written, _)| *written == origin).map(|(_, text)| text);
        let line = text.and_then(|text| line_of(text, &key));
        let key = if key.is_empty() { "(top level)".to_owned() } else { key };
        ConfigError::Invalid { key, reason, origin, line }
    }

    /// Which layer set `key`: the key itself, else the first layer that wrote below it
    /// (a table whose required key is missing), else the first that wrote below its
    /// nearest ancestor (`config` keeps origins on values, not on the tables it merges),
    /// else the built-in default.
    fn origin_of(&self, key: &str) -> Origin {
        let (node, ancestor) = self.lookup(key);
        let written = node.and_then(written_at_or_below).or_else(|| ancestor.and_then(written_at_or_below));
        written.map_or(Origin::Default, |text| self.origin_named(text))
    }

    /// Which layer set `key`, if one did: the key itself, else the first that wrote below
    /// it; [`Origin::Default`] when no layer wrote there.
    pub(crate) fn written_by(&self, key: &str) -> Origin {
        let (node, _) = self.lookup(key);
        node.and_then(written_at_or_below).map_or(Origin::Default, |text| self.origin_named(text))
    }

    /// The value at `key` if there is one, and the nearest value above it (not the top).
    fn lookup(&self, key: &str) -> (Option<&Value>, Option<&Value>) {
        let mut node = Some(&self.tree);
        let mut ancestor = None;
        for (depth, step) in steps(key).enumerate() {
            let Some(here) = node else { break };
            if depth > 0 {
                ancestor = Some(here);
            }
            node = match (&here.kind, step) {
                (ValueKind::Table(table), Step::Key(name)) => table.get(name),
                (ValueKind::Array(items), Step::Index(index)) => items.get(index),
                _ => None,
            };
        }
        (node, ancestor)
    }

    fn origin_named(&self, text: &str) -> Origin {
        let known = self.origins.iter().find(|origin| origin.to_string() == text);
        known.cloned().unwrap_or(Origin::Default)
    }

    /// A list grows by one entry at its end: `config` fills the entries a layer skipped
    /// (`--set servers[5].url=…` on an empty list) with nothing; that is refused here,
    /// naming the entry that was set.
    fn refuse_list_gaps(&self, node: &Value, at: &str) -> Result<(), ConfigError> {
        match &node.kind {
            ValueKind::Table(table) => {
                for (key, child) in table {
                    let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
                    self.refuse_list_gaps(child, &path)?;
                }
            }
            ValueKind::Array(items) => {
                if let Some(gap) = items.iter().position(|item| matches!(item.kind, ValueKind::Nil)) {
                    let set = items.iter().skip(gap).position(|item| !matches!(item.kind, ValueKind::Nil));
                    let set = format!("{at}[{}]", gap + set.unwrap_or(0));
                    let reason = format!("no such entry: {at} has {gap}, so the next new one is {at}[{gap}]");
                    return Err(self.invalid(set, reason));
                }
                for (index, child) in items.iter().enumerate() {
                    self.refuse_list_gaps(child, &format!("{at}[{index}]"))?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The origin of `node`, else the first found below it, depth first in the order the
/// keys were written.
fn written_at_or_below(node: &Value) -> Option<&str> {
    if let Some(origin) = node.origin() {
        return Some(origin);
    }
    match &node.kind {
        ValueKind::Table(table) => table.values().find_map(written_at_or_below),
        ValueKind::Array(items) => items.iter().find_map(written_at_or_below),
        _ => None,
    }
}

/// The line (from 1) in a TOML file's `text` of what an error about `key` names: the key's
/// value, else the nearest table above it the file writes (a table a required key is
/// missing from: its header). `None` when the file writes nothing on the way, or does
/// not parse as the `config` crate parsed it.
fn line_of(text: &str, key: &str) -> Option<usize> {
    let document = toml_edit::Document::parse(text).ok()?;
    let mut item = document.as_item();
    let mut span = None;
    for step in steps(key) {
        let next = match step {
            Step::Key(name) => item.get(name),
            Step::Index(index) => item.get(index),
        };
        let Some(next) = next else { break };
        span = next.span().or(span);
        item = next;
    }
    span.map(|span| text[..span.start].matches('\n').count() + 1)
}

enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps of a key path: `servers[0].url` is `servers`, 0, `url`.
fn steps(key: &str) -> impl Iterator<Item = Step<'_>> {
    key.split(['.', '[']).filter(|part| !part.is_empty()).map(|part| match part.strip_suffix(']') {
        Some(index) => index.parse().map_or(Step::Key(part), Step::Index),
        None => Step::Key(part),
    })
}

/// Why deserializing failed: serde's message, with "unknown field" and "missing field"
/// re-worded.
fn reason(error: &toml::de::Error) -> String {
    let message = error.message();
    if let Some(field) = message.strip_prefix("missing field `").and_then(|rest| rest.strip_suffix('`')) {
        return format!("missing required key `{field}`");
    }
    reword_unknown_field(message).unwrap_or_else(|| message.to_owned())
}

/// serde's "unknown field `x`, expected one of `a`, `b`" (its only way to pass on the
/// known keys, as the error keeps serde's default wording) as "unknown key (did you mean
/// `a`?)".
fn reword_unknown_field(message: &str) -> Option<String> {
    let (field, rest) = message.strip_prefix("unknown field `")?.split_once("`, ")?;
    let known: Vec<&str> = match rest.strip_prefix("expected ") {
        Some(list) => list.split('`').skip(1).step_by(2).collect(),
        None => Vec::new(),
    };
    Some(match closest(field, &known) {
        Some(near) => format!("unknown key (did you mean `{near}`?)"),
        None if known.is_empty() => "unknown key".to_owned(),
        None => format!("unknown key (known keys here: {})", known.join(", ")),
    })
}

/// The known key a typo most likely meant: at most two edits away, and closer than half
/// its length.
fn closest<'a>(typed: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(typed, k), *k))
        .filter(|(d, k)| *d <= 2 && *d * 2 < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        count: u32,
        factor: f64,
        on: bool,
        #[serde(default, with = "shepherd_actors::config::duration_str")]
        wait: Duration,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        items: Vec<Inner>,
    }

    fn merged(layers: Vec<Layer>) -> Merged {
        Merged::of(layers).unwrap()
    }

    fn file(text: &str) -> Merged {
        merged(vec![Layer::file(Path::new("a.toml"), text).unwrap()])
    }

    fn flags(assignments: &[&str]) -> Merged {
        merged(assignments.iter().map(|a| Layer::set_flag(a).unwrap()).collect())
    }

    fn error_of<T: DeserializeOwned + std::fmt::Debug>(merged: &Merged) -> (String, String, Origin) {
        match merged.deserialize::<T>().unwrap_err() {
            ConfigError::Invalid { key, reason, origin, .. } => (key, reason, origin),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn strings_become_numbers_and_booleans_where_the_schema_asks_for_them() {
        let parsed: Outer =
            flags(&["items[0].count=5", "items[0].factor=2.5", "items[0].on=true"]).deserialize().unwrap();
        assert_eq!(parsed.items[0], Inner { count: 5, factor: 2.5, on: true, wait: Duration::ZERO });
    }

    #[test]
    fn an_error_names_the_innermost_key_path() {
        let text = "items = [{ count = 1, factor = 1.0, on = true }, { count = \"many\", factor = 1.0, on = true }]";
        let (key, reason, origin) = error_of::<Outer>(&file(text));
        assert_eq!(key, "items[1].count");
        assert_eq!(reason, "invalid type: string \"many\", expected u32");
        assert_eq!(origin, Origin::File("a.toml".into()));
    }

    #[test]
    fn an_adapter_failing_after_reading_its_string_is_still_located() {
        let (key, reason, _) =
            error_of::<Outer>(&file("items = [{ count = 1, factor = 1.0, on = true, wait = \"3 parsecs\" }]"));
        assert_eq!(key, "items[0].wait");
        assert!(reason.starts_with("invalid duration \"3 parsecs\""), "{reason}");
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion_and_missing_keys_at_their_table() {
        let (key, reason, _) = error_of::<Outer>(&file("items = [{ count = 1, factr = 1.0, on = true }]"));
        assert_eq!(format!("{key}: {reason}"), "items[0].factr: unknown key (did you mean `factor`?)");
        let (key, reason, _) = error_of::<Outer>(&file("items = [{ count = 1, on = true }]"));
        assert_eq!(format!("{key}: {reason}"), "items[0]: missing required key `factor`");
    }

    #[test]
    fn a_whole_number_out_of_range_for_its_key_says_so() {
        #[derive(Debug, Deserialize)]
        struct Narrow {
            #[allow(dead_code)] // read only to be refused
            small: u8,
        }
        let (key, reason, _) = error_of::<Narrow>(&file("small = 300"));
        assert_eq!(format!("{key}: {reason}"), "small: invalid value: integer `300`, expected u8");
    }

    /// The line of an error's key in a file (from 1): a bad value's, an unknown key's, the
    /// header of a table a required key is missing from, the element of an inline list.
    #[test]
    fn an_error_from_a_file_names_the_line_that_wrote_it() {
        let line_of_error = |text: &str| match file(text).deserialize::<Outer>().unwrap_err() {
            ConfigError::Invalid { line, .. } => line,
            other => panic!("{other}"),
        };
        let tables = "# items\n\n[[items]]\ncount = 1\nfactor = 1.0\non = true\n\n[[items]]\ncount = 2\n";
        assert_eq!(line_of_error(&format!("{tables}factor = 1.0\non = 'yes'\n")), Some(11), "a bad value");
        assert_eq!(line_of_error(&format!("{tables}factor = 1.0\non = true\nfactr = 2\n")), Some(12), "unknown");
        assert_eq!(line_of_error(&format!("{tables}on = true\n")), Some(8), "missing: its table's header");
        let inline =
            "items = [\n  { count = 1, factor = 1.0, on = true },\n  { count = 'x', factor = 1.0, on = true },\n]";
        assert_eq!(line_of_error(inline), Some(3), "an element of an inline list");
        let message = file(&format!("{tables}on = true\n")).deserialize::<Outer>().unwrap_err().to_string();
        assert!(message.ends_with("(from file a.toml, line 8)"), "{message}");
    }

    /// A value a flag or a variable set has no line; nor has one the file did not write.
    #[test]
    fn an_error_from_another_layer_names_no_line() {
        let file = Layer::file(Path::new("a.toml"), "[[items]]\ncount = 1\nfactor = 1.0\non = true\n").unwrap();
        let set = Layer::set_flag("items[0].count=many").unwrap();
        let err = merged(vec![file, set]).deserialize::<Outer>().unwrap_err();
        assert!(matches!(&err, ConfigError::Invalid { line: None, .. }), "{err:?}");
        assert!(err.to_string().ends_with("(from flag --set items[0].count)"), "{err}");
    }

    #[test]
    fn the_origin_is_the_layer_that_wrote_the_key_else_below_it_else_above_it() {
        let file = Layer::file(Path::new("a.toml"), "[log]\nformat = 'json'\nlevel = 'info'").unwrap();
        let env = Layer::environment(&[("SHEPHERD_LOG__LEVEL".into(), "debug".into())]).unwrap();
        let set = Layer::set_flag("servers[0].name=a").unwrap();
        let merged = merged(vec![file, env, set]);
        assert_eq!(merged.origin_of("log.format"), Origin::File("a.toml".into()));
        assert_eq!(merged.origin_of("log.level"), Origin::Env("SHEPHERD_LOG__LEVEL".into()));
        assert_eq!(merged.origin_of("log.unknown"), Origin::File("a.toml".into()));
        assert_eq!(merged.origin_of("servers[0]"), Origin::Flag("--set servers[0].name".into()));
        assert_eq!(merged.origin_of("recovery.cooldown"), Origin::Default);
    }

    #[test]
    fn a_key_below_a_plain_value_fails_at_that_value_naming_the_flag_that_went_below() {
        let (key, reason, origin) = error_of::<Outer>(&flags(&["items[0].count=1", "items[0].count.x=1"]));
        assert_eq!(key, "items[0].count");
        assert_eq!(reason, "invalid type: map, expected u32");
        assert_eq!(origin, Origin::Flag("--set items[0].count.x".into()));
    }

    #[test]
    fn a_list_grows_by_one_entry_at_its_end_only() {
        let (key, reason, origin) = error_of::<Outer>(&flags(&["items[0].count=1", "items[5].count=1"]));
        assert_eq!(key, "items[5]");
        assert_eq!(reason, "no such entry: items has 1, so the next new one is items[1]");
        assert_eq!(origin, Origin::Flag("--set items[5].count".into()));
    }
}
