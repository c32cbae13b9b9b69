//! A serde deserializer over the merged TOML tree that remembers where it is.
//!
//! It decides two things that serde and `toml` leave open:
//! - which key path an error belongs to, so every message starts with
//!   `recovery.stall_timeout:` or `servers[0].url:` (the innermost path wins);
//! - how a string from the environment or a flag becomes a number or a boolean
//!   (`"5"` for a `u32`, `"2.5"` for an `f64`): it is parsed when, and only when, the
//!   schema asks for one.
//!
//! It must not know the schema: unknown and missing keys are serde's findings (from
//! `deny_unknown_fields` and required fields), only re-worded here.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Unexpected, Visitor};
use serde::forward_to_deserialize_any;
use toml::Value;

use super::key_path::{join_index, join_key};

/// A deserialization failure and the key path it happened at (`None`: the top level).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    pub(crate) path: Option<String>,
    pub(crate) reason: String,
}

impl DeError {
    /// Attaches `path` unless a deeper one is already attached.
    fn at(mut self, path: &str) -> Self {
        if self.path.is_none() {
            self.path = Some(path.to_owned());
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self { path: None, reason: msg.to_string() }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let reason = match closest(field, expected) {
            Some(known) => format!("unknown key (did you mean `{known}`?)"),
            None if expected.is_empty() => "unknown key".to_owned(),
            None => format!("unknown key (known keys here: {})", expected.join(", ")),
        };
        Self { path: None, reason }
    }

    fn missing_field(field: &'static str) -> Self {
        Self { path: None, reason: format!("missing required key `{field}`") }
    }
}

/// Deserializes `T` from a tree of TOML values.
pub(crate) fn from_tree<T: DeserializeOwned>(tree: Value) -> Result<T, DeError> {
    T::deserialize(ValueDe { value: tree, path: String::new() })
}

struct ValueDe {
    value: Value,
    path: String,
}

impl ValueDe {
    fn integer<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::String(text) = &self.value else {
            return de::Deserializer::deserialize_any(self, visitor);
        };
        let trimmed = text.trim();
        if let Ok(number) = trimmed.parse::<i64>() {
            visitor.visit_i64(number)
        } else if let Ok(number) = trimmed.parse::<u64>() {
            visitor.visit_u64(number)
        } else {
            Err(de::Error::invalid_type(Unexpected::Str(text), &visitor))
        }
    }

    fn float<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::String(text) = &self.value else {
            return de::Deserializer::deserialize_any(self, visitor);
        };
        match text.trim().parse::<f64>() {
            Ok(number) => visitor.visit_f64(number),
            Err(_) => Err(de::Error::invalid_type(Unexpected::Str(text), &visitor)),
        }
    }

    fn boolean<'de, V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let Value::String(text) = &self.value else {
            return de::Deserializer::deserialize_any(self, visitor);
        };
        match text.trim() {
            "true" => visitor.visit_bool(true),
            "false" => visitor.visit_bool(false),
            _ => Err(de::Error::invalid_type(Unexpected::Str(text), &visitor)),
        }
    }
}

macro_rules! parse_strings_as {
    ($parse:ident: $($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
                self.$parse(visitor)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for ValueDe {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.value {
            Value::String(text) => visitor.visit_string(text),
            Value::Integer(number) => visitor.visit_i64(number),
            Value::Float(number) => visitor.visit_f64(number),
            Value::Boolean(flag) => visitor.visit_bool(flag),
            Value::Datetime(when) => visitor.visit_string(when.to_string()),
            Value::Array(items) => visitor.visit_seq(SeqDe { items: items.into_iter(), path: self.path, index: 0 }),
            Value::Table(table) => {
                visitor.visit_map(MapDe { entries: table.into_iter(), path: self.path, pending: None })
            }
        }
    }

    parse_strings_as!(integer: deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64);
    parse_strings_as!(float: deserialize_f32 deserialize_f64);
    parse_strings_as!(boolean: deserialize_bool);

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // TOML has no null: a present key is always `Some`.
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.value {
            Value::String(text) => visitor.visit_enum(IntoDeserializer::<DeError>::into_deserializer(text)),
            _ => self.deserialize_any(visitor),
        }
    }

    forward_to_deserialize_any! {
        i128 u128 char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map
        struct identifier ignored_any
    }
}

struct MapDe {
    entries: toml::map::IntoIter,
    path: String,
    /// The value of the key just handed out, with its path.
    pending: Option<(String, Value)>,
}

impl<'de> de::MapAccess<'de> for MapDe {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        let Some((key, value)) = self.entries.next() else {
            return Ok(None);
        };
        let path = join_key(&self.path, &key);
        let key = seed.deserialize(IntoDeserializer::<DeError>::into_deserializer(key)).map_err(|e| e.at(&path))?;
        self.pending = Some((path, value));
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let Some((path, value)) = self.pending.take() else {
            return Err(de::Error::custom("a value was requested before its key"));
        };
        // Attached here, not only inside: adapters such as `duration_str` fail after the
        // inner deserializer has already returned.
        seed.deserialize(ValueDe { value, path: path.clone() }).map_err(|e| e.at(&path))
    }
}

struct SeqDe {
    items: std::vec::IntoIter<Value>,
    path: String,
    index: usize,
}

impl<'de> de::SeqAccess<'de> for SeqDe {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        let Some(value) = self.items.next() else {
            return Ok(None);
        };
        let path = join_index(&self.path, self.index);
        self.index += 1;
        seed.deserialize(ValueDe { value, path: path.clone() }).map(Some).map_err(|e| e.at(&path))
    }
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

    fn tree(text: &str) -> Value {
        Value::Table(toml::from_str(text).unwrap())
    }

    #[test]
    fn strings_become_numbers_and_booleans_where_the_schema_asks_for_them() {
        let parsed: Outer = from_tree(tree(r#"items = [{ count = "5", factor = "2.5", on = "true" }]"#)).unwrap();
        assert_eq!(parsed.items[0], Inner { count: 5, factor: 2.5, on: true, wait: Duration::ZERO });
    }

    #[test]
    fn an_error_names_the_innermost_key_path() {
        let err = from_tree::<Outer>(tree(
            r#"items = [{ count = 1, factor = 1.0, on = true }, { count = "many", factor = 1.0, on = true }]"#,
        ))
        .unwrap_err();
        assert_eq!(err.path.as_deref(), Some("items[1].count"));
    }

    #[test]
    fn an_adapter_failing_after_reading_its_string_is_still_located() {
        let err = from_tree::<Outer>(tree(r#"items = [{ count = 1, factor = 1.0, on = true, wait = "3 parsecs" }]"#))
            .unwrap_err();
        assert_eq!(err.path.as_deref(), Some("items[0].wait"));
        assert!(err.reason.contains("invalid duration \"3 parsecs\""), "{err}");
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion_and_missing_keys_at_their_table() {
        let err = from_tree::<Outer>(tree(r#"items = [{ count = 1, factr = 1.0, on = true }]"#)).unwrap_err();
        assert_eq!(err.to_string(), "items[0].factr: unknown key (did you mean `factor`?)");
        let err = from_tree::<Outer>(tree(r#"items = [{ count = 1, on = true }]"#)).unwrap_err();
        assert_eq!(err.to_string(), "items[0]: missing required key `factor`");
    }
}
