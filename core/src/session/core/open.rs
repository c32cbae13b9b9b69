//! What a session has open: running tools, questions and permissions waiting on the
//! person.

use std::collections::HashMap;

/// Ids of a session's open things (with a value each: the tool's name for a running
/// tool). Boxed: most sessions of a fleet have none open most of the time, and an
/// empty `HashMap` is 48 bytes inline in every session; boxed, it is 8 until the first
/// one opens (memory per session is a scale target). Emptied by replacing at the idle
/// edge, as the map was (an idle session keeps no capacity).
#[derive(Debug)]
#[allow(clippy::box_collection)] // the box is the point: 8 bytes inline, not 48
pub(super) struct Open<V>(Option<Box<HashMap<String, V>>>);

impl<V> Default for Open<V> {
    fn default() -> Self {
        Open(None)
    }
}

impl<V> Open<V> {
    pub(super) fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|m| m.is_empty())
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub(super) fn contains_key(&self, id: &str) -> bool {
        self.0.as_ref().is_some_and(|m| m.contains_key(id))
    }

    pub(super) fn insert(&mut self, id: String, value: V) {
        self.0.get_or_insert_with(Default::default).insert(id, value);
    }

    pub(super) fn remove(&mut self, id: &str) {
        if let Some(m) = &mut self.0 {
            m.remove(id);
        }
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = &String> {
        self.0.iter().flat_map(|m| m.keys())
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().flat_map(|m| m.values())
    }
}
