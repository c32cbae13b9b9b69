//! Caps on what a server's data makes the supervisor remember (pure).
//!
//! Event types, child → parent links and directories are keyed by what a server sends;
//! a hostile or broken server could send a new one with every event. Each map has a cap
//! (`supervisor.max_event_types`, `max_parents`, `max_directories`):
//! - event types past the cap are counted under one [`OTHER_EVENT_TYPES`] entry (no
//!   count is lost, no name is kept);
//! - a new link or directory past the cap evicts an *arbitrary* one (the first in the
//!   map's iteration order, cheap and without bookkeeping): a forgotten link is learned
//!   again from the next `parentID` or task part, a forgotten directory from the next
//!   event or session list.
//!
//! The functions say when a cap turned something away, so the caller logs it once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

/// The entry that counts event types past `supervisor.max_event_types`.
pub const OTHER_EVENT_TYPES: &str = "other";

/// Counts `n` events of type `kind` in `events` (at most `cap` names, `other`
/// included). Returns `true` when the cap made them count under [`OTHER_EVENT_TYPES`].
pub fn count_events(events: &mut BTreeMap<String, u64>, kind: &str, n: u64, cap: usize) -> bool {
    if let Some(count) = events.get_mut(kind) {
        *count += n;
        return false;
    }
    // Room for the new name and for `other`, which must always fit.
    let capped = events.len() + 1 >= cap;
    let name = if capped { OTHER_EVENT_TYPES } else { kind };
    *events.entry(name.to_string()).or_insert(0) += n;
    capped
}

/// Inserts `item` into `set` of at most `cap` members, evicting an arbitrary one when
/// it is full. Returns `true` when it evicted.
pub fn insert_capped(set: &mut HashSet<String>, item: &str, cap: usize) -> bool {
    if set.contains(item) {
        return false;
    }
    let evicted = set.len() >= cap.max(1);
    if evicted {
        if let Some(victim) = set.iter().next().cloned() {
            set.remove(&victim);
        }
    }
    set.insert(item.to_string());
    evicted
}

/// Inserts `key → value` into `map` of at most `cap` entries, evicting an arbitrary
/// entry when the key is new and the map full. Returns `true` when it evicted.
pub fn insert_capped_map<K: Hash + Eq + Clone, V>(map: &mut HashMap<K, V>, key: K, value: V, cap: usize) -> bool {
    let evicted = !map.contains_key(&key) && map.len() >= cap.max(1);
    if evicted {
        if let Some(victim) = map.keys().next().cloned() {
            map.remove(&victim);
        }
    }
    map.insert(key, value);
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_past_the_cap_are_counted_as_other_and_the_map_stays_at_its_cap() {
        let mut events = BTreeMap::new();
        let mut capped = 0;
        for i in 0..10_000 {
            capped += usize::from(count_events(&mut events, &format!("plugin.{i}"), 1, 16));
        }
        assert_eq!(events.len(), 16);
        assert_eq!(events[OTHER_EVENT_TYPES], 10_000 - 15);
        assert_eq!(capped, 10_000 - 15);
        assert_eq!(events.values().sum::<u64>(), 10_000, "no event is lost from the counts");
        // A name already known still counts under its own name.
        assert!(!count_events(&mut events, "plugin.0", 1, 16));
        assert_eq!(events["plugin.0"], 2);
    }

    #[test]
    fn a_set_or_map_past_its_cap_stays_at_its_cap() {
        let mut dirs = HashSet::new();
        let evictions = (0..1_000).filter(|i| insert_capped(&mut dirs, &format!("/d/{i}"), 100)).count();
        assert_eq!((dirs.len(), evictions), (100, 900));
        assert!(dirs.contains("/d/999"), "the newest is always kept");
        assert!(!insert_capped(&mut dirs, "/d/999", 100));

        let mut parents = HashMap::new();
        let evictions =
            (0..1_000).filter(|i| insert_capped_map(&mut parents, format!("ses_{i}"), "ses_p", 100)).count();
        assert_eq!((parents.len(), evictions), (100, 900));
        assert!(!insert_capped_map(&mut parents, "ses_999".to_string(), "ses_q", 100), "an update evicts nothing");
        assert_eq!(parents["ses_999"], "ses_q");
    }
}
