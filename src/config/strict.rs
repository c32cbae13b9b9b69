//! The merged tree read into the schema strictly: a value keeps the type its layer gave
//! it, and only text from the environment or a flag becomes a number or a boolean, where
//! the schema asks for one.
//!
//! Why this exists: the `config` crate's own deserializer converts in every layer, and
//! leniently: in a file `max_recoveries = 2.7` would be read as 3, `name = 5` as `"5"`,
//! `enabled = "yes"` as true. Infrastructure must refuse those. So the merged tree is
//! copied into a [`toml::Value`] (file values are TOML's own types already) and read with
//! serde's rules, which also gives serde's own messages (`unknown variant `xml`, expected
//! one of …`, `invalid value: integer `300`, expected u8`).
//!
//! "Where the schema asks" is found by trying: when the schema refuses a string at a key
//! whose text came from the environment or a flag, and that text, trimmed, is a TOML
//! number or boolean, the key is given that number or boolean and the tree is read again.
//! Each retry turns one string into a non-string, so there are at most as many retries as
//! such strings. Text the schema takes as text (`name`, a duration `"30s"`) stays text.
//!
//! It must not know the schema, nor which layer is which: the caller says which keys hold
//! environment or flag text.

use config::ValueKind;
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

/// A deserialization error with the key path it happened at.
pub(crate) type StrictError = serde_path_to_error::Error<toml::de::Error>;

/// Reads `tree` as `T`. `is_text_layer(key)` says whether the value at `key`
/// (`servers[0].url`) is text from the environment or a flag, so may become a number or
/// a boolean.
pub(crate) fn deserialize<T: DeserializeOwned>(
    tree: &config::Value,
    is_text_layer: impl Fn(&str) -> bool,
) -> Result<T, StrictError> {
    let mut strict = strict_value(tree).unwrap_or_else(|| toml::Value::Table(toml::Table::new()));
    loop {
        let error = match serde_path_to_error::deserialize(strict.clone()) {
            Ok(parsed) => return Ok(parsed),
            Err(error) => error,
        };
        let refused_a_string = error.inner().message().starts_with("invalid type: string");
        if !refused_a_string || !is_text_layer(&error.path().to_string()) {
            return Err(error);
        }
        let Some(slot) = value_at_mut(&mut strict, error.path()) else { return Err(error) };
        let Some(scalar) = slot.as_str().and_then(scalar_of_text) else { return Err(error) };
        *slot = scalar;
    }
}

/// The number or boolean `text` spells in TOML (`5`, `2.5`, `true`, `1_000`), spaces
/// around it ignored; `None` for anything else.
fn scalar_of_text(text: &str) -> Option<toml::Value> {
    let value: toml::Value = text.trim().parse().ok()?;
    matches!(value, toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_)).then_some(value)
}

/// `value` with the type its layer gave it; `None` for a nil (an entry a layer skipped,
/// refused before this is called).
fn strict_value(value: &config::Value) -> Option<toml::Value> {
    Some(match &value.kind {
        ValueKind::Nil => return None,
        ValueKind::Boolean(b) => toml::Value::Boolean(*b),
        ValueKind::I64(n) => toml::Value::Integer(*n),
        // No layer makes these (TOML integers are i64); kept whole when they fit.
        ValueKind::I128(n) => i64::try_from(*n).map_or_else(|_| toml::Value::String(n.to_string()), Into::into),
        ValueKind::U64(n) => i64::try_from(*n).map_or_else(|_| toml::Value::String(n.to_string()), Into::into),
        ValueKind::U128(n) => i64::try_from(*n).map_or_else(|_| toml::Value::String(n.to_string()), Into::into),
        ValueKind::Float(x) => toml::Value::Float(*x),
        ValueKind::String(s) => toml::Value::String(s.clone()),
        ValueKind::Table(table) => toml::Value::Table(
            table.iter().filter_map(|(key, child)| Some((key.clone(), strict_value(child)?))).collect(),
        ),
        ValueKind::Array(items) => toml::Value::Array(items.iter().filter_map(strict_value).collect()),
    })
}

/// The value at `path` in `tree`, if there is one.
fn value_at_mut<'a>(tree: &'a mut toml::Value, path: &serde_path_to_error::Path) -> Option<&'a mut toml::Value> {
    path.iter().try_fold(tree, |node, segment| match (node, segment) {
        (toml::Value::Table(table), Segment::Map { key }) => table.get_mut(key),
        (toml::Value::Array(items), Segment::Seq { index }) => items.get_mut(*index),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numbers_and_booleans_are_scalars_of_text() {
        assert_eq!(scalar_of_text(" 5 "), Some(toml::Value::Integer(5)));
        assert_eq!(scalar_of_text("2.5"), Some(toml::Value::Float(2.5)));
        assert_eq!(scalar_of_text("true"), Some(toml::Value::Boolean(true)));
        assert_eq!(scalar_of_text("yes"), None);
        assert_eq!(scalar_of_text("\"5\""), None);
        assert_eq!(scalar_of_text("1979-05-27"), None);
    }
}
