//! Which facts make which notification, and when: pure, one [`Decider`] per `[[notify]]`
//! target. Journal records and the servers' stream state go in with the time; each
//! [`Occurrence`] comes out once, with the key that names it for good (the ledger
//! remembers keys sent, so a restart that reads the same records back sends nothing
//! twice).
//!
//! - `waiting_on_person`: a `waits_on_person` record starts the target's `after` clock;
//!   `wait_ended` stops it; past `after` the occurrence is due, once per wait (keyed by
//!   the question, permission or message waited on).
//! - `gave_up`: a `give_up` record. `handoff_failed`: a failed `handoff` record.
//! - `paused`: a `pause` record, once until the session's `resume` (a fleet pause given
//!   again to each session after a restart is the same pause).
//! - `provider_outage`: the server's breaker opened (began) or closed (ended).
//! - `server_unreachable`: a server's event stream down for `unreachable_after` (began),
//!   and up again after that (ended).
//!
//! It does no I/O and reads no clock: every method takes `now_ms` (epoch ms).

use std::collections::HashMap;

use shepherd_actors::config::{NotifyConfig, NotifyEvent};
use shepherd_actors::journal::{Action, ActionRecord, Outcome};

/// At most this many sessions' open waits and pauses are remembered per target; beyond
/// it the oldest entry is forgotten (a deleted session's wait that never ended).
pub const TRACKED_MAX: usize = 50_000;

/// The journal actions a decider reads (also what the catch-up reads back).
pub const ACTIONS: [Action; 7] = [
    Action::WaitsOnPerson,
    Action::WaitEnded,
    Action::GiveUp,
    Action::Handoff,
    Action::Pause,
    Action::Resume,
    Action::Breaker,
];

/// One thing to tell a person about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    pub event: NotifyEvent,
    /// `began` / `ended` for an outage or an unreachable server.
    pub phase: Option<&'static str>,
    pub server: String,
    /// `None` when the server as a whole is concerned.
    pub session: Option<String>,
    pub reason: String,
    /// Epoch ms: when it happened (for `waiting_on_person`, when the wait began).
    pub at_ms: i64,
    /// Names this occurrence for good: the same one read back after a restart has the
    /// same key.
    pub key: String,
}

#[derive(Debug, Clone)]
struct Wait {
    on: String,
    since_ms: i64,
    reason: String,
    told: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stream {
    down_since_ms: Option<i64>,
    told: bool,
}

/// The decisions of one target.
#[derive(Debug)]
pub struct Decider {
    cfg: NotifyConfig,
    waits: HashMap<(String, String), Wait>,
    paused: HashMap<(String, String), i64>,
    streams: HashMap<String, Stream>,
}

impl Decider {
    pub fn new(cfg: &NotifyConfig) -> Self {
        Decider { cfg: cfg.clone(), waits: HashMap::new(), paused: HashMap::new(), streams: HashMap::new() }
    }

    /// A journal record (live, or read back at start-up).
    pub fn on_record(&mut self, r: &ActionRecord) -> Option<Occurrence> {
        let id = (r.server.clone(), r.session.clone());
        let occurrence = |event: NotifyEvent, phase: Option<&'static str>, session: bool, tag: String| Occurrence {
            event,
            phase,
            server: r.server.clone(),
            session: session.then(|| r.session.clone()),
            reason: r.reason.clone(),
            at_ms: r.at_ms,
            key: format!("{}|{}|{}|{tag}", event.as_str(), r.server, if session { &r.session } else { "" }),
        };
        let found = match (r.action, r.outcome) {
            (Action::WaitsOnPerson, _) => {
                let on = r.numbers.waits_on.clone().unwrap_or_else(|| r.at_ms.to_string());
                bounded_insert(
                    &mut self.waits,
                    id,
                    Wait { on, since_ms: r.at_ms, reason: r.reason.clone(), told: false },
                );
                None
            }
            (Action::WaitEnded, _) => {
                self.waits.remove(&id);
                None
            }
            (Action::GiveUp, Outcome::Done) => Some(occurrence(NotifyEvent::GaveUp, None, true, r.at_ms.to_string())),
            (Action::Handoff, Outcome::Failed) => {
                Some(occurrence(NotifyEvent::HandoffFailed, None, true, r.at_ms.to_string()))
            }
            (Action::Pause, Outcome::Done) => match self.paused.get(&id) {
                Some(_) => None, // the same pause, given again
                None => {
                    bounded_insert(&mut self.paused, id, r.at_ms);
                    Some(occurrence(NotifyEvent::Paused, None, true, r.at_ms.to_string()))
                }
            },
            (Action::Resume, Outcome::Done) => {
                self.paused.remove(&id);
                None
            }
            (Action::Breaker, Outcome::Done) if r.numbers.open_ms.is_some() => {
                Some(occurrence(NotifyEvent::ProviderOutage, Some("ended"), false, format!("ended|{}", r.at_ms)))
            }
            (Action::Breaker, Outcome::Done) if r.numbers.window_ms.is_some() && r.numbers.round.is_some() => {
                Some(occurrence(NotifyEvent::ProviderOutage, Some("began"), false, format!("began|{}", r.at_ms)))
            }
            _ => None,
        };
        found.filter(|o| self.cfg.wants(o.event))
    }

    /// The event a record undoes for its session, so that one not sent yet is taken back:
    /// a resume ends the pause (read back at a start, a pause already resumed would be
    /// told, and a session paused again listed twice).
    pub fn undone_by(r: &ActionRecord) -> Option<NotifyEvent> {
        matches!((r.action, r.outcome), (Action::Resume, Outcome::Done)).then_some(NotifyEvent::Paused)
    }

    /// A server's event stream is (not) connected at `now_ms`.
    pub fn on_stream(&mut self, server: &str, connected: bool, now_ms: i64) -> Option<Occurrence> {
        let stream = self.streams.entry(server.to_string()).or_default();
        let found = match (connected, stream.down_since_ms) {
            (true, Some(since)) => {
                let told = std::mem::take(stream);
                told.told.then(|| Occurrence {
                    event: NotifyEvent::ServerUnreachable,
                    phase: Some("ended"),
                    server: server.to_string(),
                    session: None,
                    reason: format!("the event stream is back after {}", span(now_ms - since)),
                    at_ms: now_ms,
                    key: format!("server_unreachable|{server}||ended|{since}"),
                })
            }
            (false, None) => {
                stream.down_since_ms = Some(now_ms);
                None
            }
            _ => None,
        };
        found.filter(|o| self.cfg.wants(o.event))
    }

    /// Only these servers are configured now (a reload removed the others): nothing
    /// more about the rest.
    pub fn keep_servers(&mut self, configured: &[&str]) {
        self.streams.retain(|s, _| configured.contains(&s.as_str()));
    }

    /// What has become due by `now_ms`: waits past `after`, streams down past
    /// `unreachable_after`. Each once.
    pub fn due(&mut self, now_ms: i64) -> Vec<Occurrence> {
        let mut out = Vec::new();
        let after = ms(self.cfg.after);
        if self.cfg.wants(NotifyEvent::WaitingOnPerson) {
            for ((server, session), w) in self.waits.iter_mut().filter(|(_, w)| !w.told) {
                if now_ms.saturating_sub(w.since_ms) >= after {
                    w.told = true;
                    out.push(Occurrence {
                        event: NotifyEvent::WaitingOnPerson,
                        phase: None,
                        server: server.clone(),
                        session: Some(session.clone()),
                        reason: format!("{}, unanswered for {}", w.reason, span(now_ms - w.since_ms)),
                        at_ms: w.since_ms,
                        key: format!("waiting_on_person|{server}|{session}|{}", w.on),
                    });
                }
            }
        }
        let grace = ms(self.cfg.unreachable_after);
        if self.cfg.wants(NotifyEvent::ServerUnreachable) {
            for (server, s) in self.streams.iter_mut().filter(|(_, s)| !s.told) {
                let Some(since) = s.down_since_ms else { continue };
                if now_ms.saturating_sub(since) >= grace {
                    s.told = true;
                    out.push(Occurrence {
                        event: NotifyEvent::ServerUnreachable,
                        phase: Some("began"),
                        server: server.clone(),
                        session: None,
                        reason: format!("the event stream has been down for {}", span(now_ms - since)),
                        at_ms: since,
                        key: format!("server_unreachable|{server}||began|{since}"),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

fn bounded_insert<V>(map: &mut HashMap<(String, String), V>, key: (String, String), value: V) {
    if map.len() >= TRACKED_MAX && !map.contains_key(&key) {
        if let Some(any) = map.keys().next().cloned() {
            map.remove(&any);
        }
    }
    map.insert(key, value);
}

fn ms(d: std::time::Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// `12m`, `3h 5m`, `40s`, `250ms`: a span as a person reads it.
pub fn span(ms: i64) -> String {
    let ms = ms.max(0) as u64;
    let secs = ms / 1000;
    match secs {
        0 => format!("{ms}ms"),
        1..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h {}m", secs / 3600, (secs % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::config::NotifyKind;
    use shepherd_actors::journal::Numbers;

    use super::*;

    fn cfg() -> NotifyConfig {
        let mut c = NotifyConfig::new(NotifyKind::Webhook, "http://127.0.0.1:9/hook");
        c.after = Duration::from_secs(600);
        c.unreachable_after = Duration::from_secs(60);
        c
    }

    fn rec(session: &str, at_ms: i64, action: Action, outcome: Outcome, numbers: Numbers) -> ActionRecord {
        ActionRecord {
            server: "local".into(),
            session: session.into(),
            action,
            outcome,
            reason: format!("{} {}", action.as_str(), outcome.as_str()),
            numbers,
            at_ms,
        }
    }

    fn waits(session: &str, at_ms: i64, on: &str) -> ActionRecord {
        let n = Numbers { waits_on: Some(on.into()), ..Numbers::default() };
        rec(session, at_ms, Action::WaitsOnPerson, Outcome::Done, n)
    }

    #[test]
    fn a_question_unanswered_for_after_is_due_once_and_not_before() {
        let mut d = Decider::new(&cfg());
        assert_eq!(d.on_record(&waits("ses_a", 1_000, "que_1")), None);
        assert!(d.due(1_000 + 599_999).is_empty());
        let due = d.due(1_000 + 600_000);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].event, NotifyEvent::WaitingOnPerson);
        assert_eq!(due[0].key, "waiting_on_person|local|ses_a|que_1");
        assert!(due[0].reason.ends_with("unanswered for 10m"), "{}", due[0].reason);
        assert!(d.due(10_000_000).is_empty(), "once per wait");
    }

    #[test]
    fn a_wait_that_ended_before_after_is_never_due() {
        let mut d = Decider::new(&cfg());
        d.on_record(&waits("ses_a", 0, "que_1"));
        d.on_record(&rec("ses_a", 599_000, Action::WaitEnded, Outcome::Done, Numbers::default()));
        assert!(d.due(700_000).is_empty());
    }

    #[test]
    fn the_same_wait_read_back_after_a_restart_has_the_same_key() {
        let (mut before, mut after) = (Decider::new(&cfg()), Decider::new(&cfg()));
        before.on_record(&waits("ses_a", 0, "que_1"));
        after.on_record(&waits("ses_a", 0, "que_1"));
        assert_eq!(before.due(600_000)[0].key, after.due(900_000)[0].key);
    }

    #[test]
    fn a_pause_given_again_before_a_resume_is_the_same_occurrence() {
        let mut d = Decider::new(&cfg());
        let pause = |at| rec("ses_a", at, Action::Pause, Outcome::Done, Numbers::default());
        let first = d.on_record(&pause(10)).expect("a pause is notified");
        assert_eq!((first.event, first.key.as_str()), (NotifyEvent::Paused, "paused|local|ses_a|10"));
        assert_eq!(d.on_record(&pause(20)), None, "the fleet's pause given again after a restart");
        d.on_record(&rec("ses_a", 30, Action::Resume, Outcome::Done, Numbers::default()));
        assert!(d.on_record(&pause(40)).is_some(), "a new pause after the resume");
    }

    #[test]
    fn give_up_and_a_failed_hand_off_are_notified_declined_records_are_not() {
        let mut d = Decider::new(&cfg());
        let n = Numbers::default;
        assert_eq!(d.on_record(&rec("s", 1, Action::GiveUp, Outcome::Done, n())).unwrap().event, NotifyEvent::GaveUp);
        let failed = d.on_record(&rec("s", 2, Action::Handoff, Outcome::Failed, n())).unwrap();
        assert_eq!(failed.event, NotifyEvent::HandoffFailed);
        assert_eq!(d.on_record(&rec("s", 3, Action::Handoff, Outcome::Done, n())), None);
        assert_eq!(d.on_record(&rec("s", 4, Action::Continue, Outcome::Done, n())), None);
    }

    #[test]
    fn the_breaker_opening_and_closing_is_an_outage_beginning_and_ending_of_the_server() {
        let mut d = Decider::new(&cfg());
        let opened = Numbers { round: Some(3), window_ms: Some(60_000), ..Numbers::default() };
        let began = d.on_record(&rec("s", 5, Action::Breaker, Outcome::Done, opened)).unwrap();
        assert_eq!((began.event, began.phase, began.session), (NotifyEvent::ProviderOutage, Some("began"), None));
        let waiting = Numbers { backoff_ms: Some(1), ..Numbers::default() };
        assert_eq!(d.on_record(&rec("s", 6, Action::Breaker, Outcome::Declined, waiting)), None);
        let closed = Numbers { open_ms: Some(9_000), ..Numbers::default() };
        assert_eq!(d.on_record(&rec("s", 7, Action::Breaker, Outcome::Done, closed)).unwrap().phase, Some("ended"));
    }

    #[test]
    fn a_stream_down_past_the_grace_is_due_once_and_its_return_is_told() {
        let mut d = Decider::new(&cfg());
        assert_eq!(d.on_stream("local", false, 0), None);
        assert!(d.due(59_999).is_empty());
        let began = d.due(60_000);
        assert_eq!((began.len(), began[0].phase), (1, Some("began")));
        assert!(d.due(120_000).is_empty());
        assert_eq!(d.on_stream("local", false, 130_000), None);
        let ended = d.on_stream("local", true, 180_000).unwrap();
        assert_eq!(ended.reason, "the event stream is back after 3m");
    }

    #[test]
    fn a_server_removed_by_a_reload_is_not_told_about() {
        let mut d = Decider::new(&cfg());
        d.on_stream("gone", false, 0);
        d.keep_servers(&["local"]);
        assert!(d.due(100_000).is_empty());
    }

    #[test]
    fn a_short_blip_is_not_told() {
        let mut d = Decider::new(&cfg());
        d.on_stream("local", false, 0);
        assert_eq!(d.on_stream("local", true, 30_000), None);
        assert!(d.due(100_000).is_empty());
    }

    #[test]
    fn events_the_target_did_not_ask_for_are_not_decided() {
        let mut c = cfg();
        c.events = vec![NotifyEvent::Paused];
        let mut d = Decider::new(&c);
        assert_eq!(d.on_record(&rec("s", 1, Action::GiveUp, Outcome::Done, Numbers::default())), None);
        d.on_record(&waits("s", 0, "que_1"));
        d.on_stream("local", false, 0);
        assert!(d.due(10_000_000).is_empty());
    }
}
