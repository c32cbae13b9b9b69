//! Batching: occurrences of one event (and phase) within `batch_window` of the first go
//! out as one [`Message`] ("12 sessions gave up"), listing at most `batch_max` of them
//! and counting the rest. Pure: every method takes `now_ms`.

use std::collections::BTreeMap;

use shepherd_actors::config::{NotifyConfig, NotifyEvent};

use super::decide::Occurrence;

/// What one POST says: one occurrence, or several of the same event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub event: NotifyEvent,
    pub phase: Option<&'static str>,
    /// The occurrences listed, in the order they came.
    pub items: Vec<Occurrence>,
    /// Occurrences beyond `batch_max`, counted but not listed.
    pub more: usize,
    /// The key of every occurrence in it (listed or counted), for the ledger.
    pub keys: Vec<String>,
}

impl Message {
    /// How many occurrences it stands for.
    pub fn count(&self) -> usize {
        self.items.len() + self.more
    }
}

#[derive(Debug)]
struct Open {
    due_ms: i64,
    message: Message,
}

/// The open batches of one target.
#[derive(Debug)]
pub struct Batcher {
    window_ms: i64,
    max: usize,
    open: BTreeMap<(NotifyEvent, Option<&'static str>), Open>,
}

impl Batcher {
    pub fn new(cfg: &NotifyConfig) -> Self {
        Batcher { window_ms: cfg.batch_window.as_millis() as i64, max: cfg.batch_max.max(1), open: BTreeMap::new() }
    }

    /// Adds an occurrence: to the open batch of its event, or opening one due at the end
    /// of the window. The same key twice (a record seen live and read back) counts once.
    pub fn push(&mut self, o: Occurrence, now_ms: i64) {
        let open = self.open.entry((o.event, o.phase)).or_insert_with(|| Open {
            due_ms: now_ms + self.window_ms,
            message: Message { event: o.event, phase: o.phase, items: Vec::new(), more: 0, keys: Vec::new() },
        });
        let m = &mut open.message;
        if m.keys.contains(&o.key) {
            return;
        }
        m.keys.push(o.key.clone());
        if m.items.len() < self.max {
            m.items.push(o);
        } else {
            m.more += 1;
        }
    }

    /// The batches whose window ended by `now_ms`.
    pub fn due(&mut self, now_ms: i64) -> Vec<Message> {
        let ready: Vec<_> = self.open.iter().filter(|(_, o)| o.due_ms <= now_ms).map(|(k, _)| *k).collect();
        ready.into_iter().filter_map(|k| self.open.remove(&k)).map(|o| o.message).collect()
    }

    /// Takes back the occurrences of `event` for `server`'s `session` not sent yet: what a
    /// later record undid (a pause ended by a resume) is no news by the time the batch
    /// goes out. Their keys stay (the same record read back again is no news either); a
    /// batch left with nothing is dropped.
    pub fn withdraw(&mut self, event: NotifyEvent, server: &str, session: &str) {
        for ((e, _), open) in self.open.iter_mut() {
            if *e == event {
                open.message.items.retain(|o| !(o.server == server && o.session.as_deref() == Some(session)));
            }
        }
        self.open.retain(|_, open| open.message.count() > 0);
    }

    /// Everything still open (at shutdown: sent rather than lost).
    pub fn drain(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.open).into_values().map(|o| o.message).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::config::NotifyKind;

    use super::*;

    fn occ(event: NotifyEvent, session: &str) -> Occurrence {
        Occurrence {
            event,
            phase: None,
            server: "local".into(),
            session: Some(session.into()),
            reason: "why".into(),
            at_ms: 0,
            key: format!("{}|{session}", event.as_str()),
        }
    }

    fn batcher(window_ms: u64, max: usize) -> Batcher {
        let mut c = NotifyConfig::new(NotifyKind::Webhook, "http://x");
        c.batch_window = Duration::from_millis(window_ms);
        c.batch_max = max;
        Batcher::new(&c)
    }

    #[test]
    fn twelve_sessions_giving_up_within_the_window_are_one_message_listing_a_bounded_number() {
        let mut b = batcher(1_000, 5);
        for i in 0..12 {
            b.push(occ(NotifyEvent::GaveUp, &format!("ses_{i}")), 100 + i);
        }
        assert!(b.due(1_099).is_empty(), "the window counts from the first");
        let due = b.due(1_100);
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].count(), due[0].items.len(), due[0].more, due[0].keys.len()), (12, 5, 7, 12));
        assert!(b.due(5_000).is_empty());
    }

    #[test]
    fn different_events_are_different_messages_and_a_late_one_opens_a_new_window() {
        let mut b = batcher(1_000, 5);
        b.push(occ(NotifyEvent::GaveUp, "a"), 0);
        b.push(occ(NotifyEvent::Paused, "b"), 0);
        b.push(occ(NotifyEvent::GaveUp, "c"), 500);
        assert_eq!(b.due(1_000).len(), 2);
        b.push(occ(NotifyEvent::GaveUp, "d"), 1_200);
        assert!(b.due(2_100).is_empty());
        assert_eq!(b.due(2_200)[0].items[0].session.as_deref(), Some("d"));
    }

    #[test]
    fn an_occurrence_withdrawn_before_its_batch_is_due_is_not_sent_and_an_empty_batch_is_dropped() {
        let mut b = batcher(1_000, 5);
        b.push(occ(NotifyEvent::Paused, "a"), 0);
        b.push(occ(NotifyEvent::Paused, "b"), 0);
        b.push(occ(NotifyEvent::GaveUp, "a"), 0);
        b.withdraw(NotifyEvent::Paused, "local", "a");
        let due = b.due(1_000);
        let listed = |m: &Message| m.items.iter().map(|o| o.session.clone().unwrap()).collect::<Vec<_>>();
        assert_eq!(due.iter().map(|m| (m.event, listed(m))).collect::<Vec<_>>(), [
            (NotifyEvent::GaveUp, vec!["a".to_string()]),
            (NotifyEvent::Paused, vec!["b".to_string()])
        ]);
        b.push(occ(NotifyEvent::Paused, "c"), 2_000);
        b.withdraw(NotifyEvent::Paused, "local", "c");
        assert!(b.drain().is_empty(), "nothing left to send");
    }

    #[test]
    fn the_same_occurrence_pushed_twice_counts_once() {
        let mut b = batcher(0, 5);
        b.push(occ(NotifyEvent::GaveUp, "a"), 0);
        b.push(occ(NotifyEvent::GaveUp, "a"), 0);
        assert_eq!(b.due(0)[0].count(), 1);
    }
}
