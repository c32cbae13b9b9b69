//! Key paths — `recovery.stall_timeout`, `servers[0].url` — and how the environment
//! (`SHEPHERD_RECOVERY__STALL_TIMEOUT`) and flags (`--set servers[0].url=…`) spell them.
//!
//! This module decides which environment variables are configuration at all: only names
//! that start with [`ENV_PREFIX`] and contain a double underscore. Everything else
//! (`SHEPHERD_OPENCODE_BIN`, `SHEPHERD_CONTROL_TOKEN`, …) belongs to someone else and is
//! left alone. It knows nothing about which keys exist; that is the schema's business.

use std::fmt;

/// Prefix of every configuration environment variable.
pub const ENV_PREFIX: &str = "SHEPHERD_";

/// Separator between the levels of a key in an environment variable name.
pub const ENV_SEPARATOR: &str = "__";

/// One step of a key path: a table key or a list index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// A path from the top of the configuration to one value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KeyPath(Vec<Segment>);

impl KeyPath {
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.0
    }

    pub(crate) fn key(name: &str) -> Self {
        Self(vec![Segment::Key(name.to_owned())])
    }

    /// Parses the flag spelling: keys separated by `.`, list indices as `[0]` or `.0`.
    pub(crate) fn parse_dotted(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the key is empty".to_owned());
        }
        let mut segments = Vec::new();
        for part in text.split('.') {
            let (name, mut indices) = part.split_once('[').map_or((part, ""), |(n, rest)| (n, rest));
            if name.is_empty() {
                return Err(format!("{text:?} has an empty key between dots"));
            }
            segments.push(segment_from(name));
            if !indices.is_empty() {
                // `indices` is what followed the first `[`: `0]`, `0][1]`, …
                loop {
                    let Some((number, rest)) = indices.split_once(']') else {
                        return Err(format!("{text:?} has an unclosed `[`"));
                    };
                    let index =
                        number.parse::<usize>().map_err(|_| format!("{text:?}: `[{number}]` is not a list index"))?;
                    segments.push(Segment::Index(index));
                    match rest.strip_prefix('[') {
                        Some(more) => indices = more,
                        None if rest.is_empty() => break,
                        None => return Err(format!("{text:?}: unexpected {rest:?} after `]`")),
                    }
                }
            }
        }
        Ok(Self(segments))
    }

    /// The key an environment variable names, or `None` when the variable is not
    /// configuration (no [`ENV_PREFIX`], or no [`ENV_SEPARATOR`] after it).
    /// `SHEPHERD_SERVERS__0__URL` is `servers[0].url`; keys are lower-cased.
    pub(crate) fn from_env_name(name: &str) -> Option<Result<Self, String>> {
        let rest = name.strip_prefix(ENV_PREFIX)?;
        if !rest.contains(ENV_SEPARATOR) {
            return None;
        }
        let mut segments = Vec::new();
        for part in rest.split(ENV_SEPARATOR) {
            if part.is_empty() {
                return Some(Err(format!("{name} has an empty key between `{ENV_SEPARATOR}`")));
            }
            segments.push(segment_from(&part.to_ascii_lowercase()));
        }
        Some(Ok(Self(segments)))
    }
}

/// A key made only of digits is a list index (`servers.0.url`, `SHEPHERD_SERVERS__0__URL`).
fn segment_from(part: &str) -> Segment {
    match part.parse::<usize>() {
        Ok(index) if part.bytes().all(|b| b.is_ascii_digit()) => Segment::Index(index),
        _ => Segment::Key(part.to_owned()),
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = String::new();
        for segment in &self.0 {
            text = match segment {
                Segment::Key(key) => join_key(&text, key),
                Segment::Index(index) => join_index(&text, *index),
            };
        }
        f.write_str(&text)
    }
}

/// `recovery` + `stall_timeout` → `recovery.stall_timeout`; the top level is `""`.
pub(crate) fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `servers` + 0 → `servers[0]`.
pub(crate) fn join_index(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// Whether `path` is `ancestor` or lies below it (`servers[1].url` is within `servers[1]`,
/// `servers[10]` is not).
pub(crate) fn is_within(path: &str, ancestor: &str) -> bool {
    match path.strip_prefix(ancestor) {
        Some(rest) => ancestor.is_empty() || rest.is_empty() || rest.starts_with(['.', '[']),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_accept_brackets_and_numeric_segments_for_list_indices() {
        let bracketed = KeyPath::parse_dotted("servers[0].url").unwrap();
        let dotted = KeyPath::parse_dotted("servers.0.url").unwrap();
        assert_eq!(bracketed, dotted);
        assert_eq!(bracketed.to_string(), "servers[0].url");
    }

    #[test]
    fn malformed_dotted_keys_are_refused() {
        assert!(KeyPath::parse_dotted("").is_err());
        assert!(KeyPath::parse_dotted("recovery..stall_timeout").is_err());
        assert!(KeyPath::parse_dotted("servers[x].url").is_err());
        assert!(KeyPath::parse_dotted("servers[0").is_err());
    }

    #[test]
    fn only_prefixed_names_with_a_double_underscore_are_configuration() {
        assert_eq!(KeyPath::from_env_name("SHEPHERD_OPENCODE_BIN"), None);
        assert_eq!(KeyPath::from_env_name("PATH"), None);
        let path = KeyPath::from_env_name("SHEPHERD_RECOVERY__STALL_TIMEOUT").unwrap().unwrap();
        assert_eq!(path.to_string(), "recovery.stall_timeout");
        let path = KeyPath::from_env_name("SHEPHERD_SERVERS__0__URL").unwrap().unwrap();
        assert_eq!(path.to_string(), "servers[0].url");
    }

    #[test]
    fn containment_respects_key_boundaries() {
        assert!(is_within("servers[1].url", "servers[1]"));
        assert!(is_within("servers[1]", "servers[1]"));
        assert!(!is_within("servers[10]", "servers[1]"));
        assert!(!is_within("recovery.stall_timeout_x", "recovery.stall_timeout"));
        assert!(is_within("log", ""));
    }
}
