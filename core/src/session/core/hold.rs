//! The off switch: a person pauses Shepherd for one session (`shepherd pause SESSION`,
//! [`Pause::Person`]) or for the fleet (`shepherd pause --all`, [`Pause::Fleet`]), for a
//! while or until resumed. Pure, like the rest of the core.
//!
//! A held session gets nothing from Shepherd: no stall recovery, nudge, review,
//! compaction, hand-off step or provider resume (every clock that measures silence
//! waits, as for the person's own abort). Unlike that pause, the person writing in the
//! session does not lift it — the person asked Shepherd to keep off. Resumed (by the
//! person, or at the end of `--for`), the session is judged as it stands: a turn that
//! went silent meanwhile is recovered at once.
//!
//! Precedence: a session's own hold is not lifted by resuming the fleet; a fleet hold
//! does not replace a pause the session already has (the person's abort, Shepherd
//! giving up), so resuming the fleet does not undo those.

use super::*;

/// Which switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldScope {
    Session,
    Fleet,
}

/// When a timed hold ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HoldUntil {
    pub(super) mono: Instant,
    pub(super) wall_ms: i64,
}

impl HoldUntil {
    /// The end at `wall_ms` (epoch ms), placed on the monotonic clock from `now`.
    pub(super) fn at(wall_ms: i64, now: Now) -> Self {
        Self { mono: mono_at(wall_ms, now), wall_ms }
    }
}

impl SessionCore {
    /// Pauses automation for this session (`Session`) or as part of the fleet (`Fleet`),
    /// until `until_ms` (epoch ms) or until resumed. `by` says who asked (journaled).
    pub fn on_hold(&mut self, scope: HoldScope, until_ms: Option<i64>, by: &str, now: Now) -> Vec<Effect> {
        let until = until_ms.map(|wall_ms| HoldUntil::at(wall_ms, now));
        match scope {
            HoldScope::Fleet if self.pause.is_some() => return Vec::new(), // already paused, for its own reason
            HoldScope::Fleet => {
                self.pause = Some(Pause::Fleet);
                self.hold_until = None; // the fleet's end is the supervisor's
            }
            HoldScope::Session => {
                self.pause = Some(Pause::Person);
                self.hold_until = until.map(Box::new);
            }
        }
        self.touch();
        self.backoff_until = None;
        let reason = match (scope, until) {
            (HoldScope::Fleet, _) => format!("the fleet was paused by {by}"),
            (HoldScope::Session, Some(u)) => {
                format!("paused by {by} for {}", describe_span(u.wall_ms.saturating_sub(now.wall_ms)))
            }
            (HoldScope::Session, None) => format!("paused by {by} until resumed"),
        };
        let numbers = Numbers {
            timeout_ms: until.map(|u| u.wall_ms.saturating_sub(now.wall_ms).max(0) as u64),
            ..Numbers::default()
        };
        vec![self.record(Action::Pause, Outcome::Done, &reason, numbers, now)]
    }

    /// Lifts a hold. `Session` lifts whatever pauses the session (the person says go);
    /// `Fleet` lifts only the fleet's hold.
    pub fn on_release(&mut self, scope: HoldScope, by: &str, now: Now) -> Vec<Effect> {
        let lifted = match (scope, self.pause) {
            (_, None) => return Vec::new(),
            (HoldScope::Fleet, Some(p)) if p != Pause::Fleet => return Vec::new(),
            (_, Some(p)) => p,
        };
        self.release(lifted, &format!("resumed by {by}"), now)
    }

    /// The end of a timed hold, when it is due (called first from `on_deadline`).
    pub(super) fn on_hold_deadline(&mut self, now: Now) -> Vec<Effect> {
        match self.hold_until.as_deref() {
            Some(u) if u.mono <= now.mono && self.pause == Some(Pause::Person) => {
                self.release(Pause::Person, "the pause's time is up", now)
            }
            _ => Vec::new(),
        }
    }

    /// When a timed hold ends (epoch ms).
    pub fn hold_until_ms(&self) -> Option<i64> {
        self.hold_until.as_deref().map(|u| u.wall_ms)
    }

    /// When a timed hold ends.
    pub(super) fn hold_deadline(&self) -> Option<Instant> {
        self.hold_until.as_deref().map(|u| u.mono)
    }

    fn release(&mut self, lifted: Pause, why: &str, now: Now) -> Vec<Effect> {
        self.pause = None;
        self.hold_until = None;
        self.touch();
        let reason = format!("{why} (was paused: {})", lifted.as_str());
        vec![self.record(Action::Resume, Outcome::Done, &reason, Numbers::default(), now)]
    }
}

/// The monotonic instant of an epoch-ms moment, from the present one.
fn mono_at(wall_ms: i64, now: Now) -> Instant {
    let ahead = wall_ms.saturating_sub(now.wall_ms);
    if ahead <= 0 {
        now.mono
    } else {
        now.mono + Duration::from_millis(ahead as u64)
    }
}

/// `2h`, `15m`, `40s`: how long a hold was asked for, roughly.
fn describe_span(ms: i64) -> String {
    let s = (ms.max(0) + 500) / 1000;
    match s {
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    //! The off switch as a specification.
    use super::super::testkit::{unadvised, Bench};
    use super::*;
    use crate::config::RecoveryConfig;

    fn bench() -> Bench {
        Bench::with_rules(unadvised(RecoveryConfig::default().into()))
    }

    fn recovers(effects: &[Effect]) -> bool {
        effects.iter().any(|e| matches!(e, Effect::Recover(_)))
    }

    fn reasons(effects: &[Effect]) -> Vec<(Action, String)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(r) => Some((r.action, r.reason.clone())),
                _ => None,
            })
            .collect()
    }

    const PERSON_WROTE: &str = r#"{"type":"message.updated","properties":{"info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#;

    #[test]
    fn a_held_session_that_stalls_is_left_alone_and_recovered_once_resumed() {
        let mut b = bench();
        b.busy(0);
        let at = b.at(10);
        let effects = b.core.on_hold(HoldScope::Session, None, "cli", at);
        assert_eq!(reasons(&effects), vec![(Action::Pause, "paused by cli until resumed".to_string())]);
        assert_eq!(b.core.deadline(), None, "no clock runs while held");
        assert!(!recovers(&b.tick(400)));
        let at = b.at(500);
        let effects = b.core.on_release(HoldScope::Session, "cli", at);
        assert_eq!(reasons(&effects), vec![(Action::Resume, "resumed by cli (was paused: person)".to_string())]);
        assert!(b.core.deadline().is_some_and(|d| d <= b.at(500).mono), "silent for 500 s: due now");
        assert!(recovers(&b.tick(500)));
    }

    #[test]
    fn the_person_writing_does_not_lift_a_hold_they_asked_for() {
        let mut b = bench();
        b.busy(0);
        let at = b.at(1);
        b.core.on_hold(HoldScope::Session, None, "cli", at);
        b.feed(5, PERSON_WROTE);
        assert_eq!(b.core.pause(), Some(Pause::Person));
        assert!(!recovers(&b.tick(400)));
    }

    #[test]
    fn a_timed_hold_ends_by_itself_and_the_stall_is_then_recovered() {
        let mut b = bench();
        b.busy(0);
        let at = b.at(0);
        let effects = b.core.on_hold(HoldScope::Session, Some(at.wall_ms + 600_000), "api", at);
        assert_eq!(reasons(&effects)[0].1, "paused by api for 10m");
        assert_eq!(b.core.deadline(), Some(b.at(600).mono), "the hold's end is the only clock");
        assert!(b.tick(599).is_empty());
        let effects = b.tick(600);
        assert_eq!(reasons(&effects)[0], (Action::Resume, "the pause's time is up (was paused: person)".to_string()));
        assert!(recovers(&effects), "silent since 0: recovered in the same moment");
    }

    #[test]
    fn resuming_the_fleet_does_not_lift_a_session_s_own_hold_nor_the_person_s_abort() {
        let mut own = bench();
        let at = own.at(0);
        own.core.on_hold(HoldScope::Session, None, "cli", at);
        assert!(own.core.on_hold(HoldScope::Fleet, None, "cli", at).is_empty());
        assert!(own.core.on_release(HoldScope::Fleet, "cli", at).is_empty());
        assert_eq!(own.core.pause(), Some(Pause::Person));

        let mut aborted = bench();
        aborted.core.pause = Some(Pause::UserAbort);
        let at = aborted.at(0);
        assert!(aborted.core.on_hold(HoldScope::Fleet, None, "cli", at).is_empty());
        assert!(aborted.core.on_release(HoldScope::Fleet, "cli", at).is_empty());
        assert_eq!(aborted.core.pause(), Some(Pause::UserAbort));

        let mut plain = bench();
        plain.busy(0);
        let at = plain.at(1);
        plain.core.on_hold(HoldScope::Fleet, None, "cli", at);
        assert_eq!(plain.core.pause(), Some(Pause::Fleet));
        assert!(!recovers(&plain.tick(400)));
        let at = plain.at(401);
        assert_eq!(reasons(&plain.core.on_release(HoldScope::Fleet, "cli", at))[0].0, Action::Resume);
        assert!(recovers(&plain.tick(401)));
    }

    #[test]
    fn a_hold_survives_a_restart_with_its_end() {
        let mut b = bench();
        let at = b.at(0);
        b.core.on_hold(HoldScope::Session, Some(at.wall_ms + 3_600_000), "cli", at);
        let saved = b.core.export(b.at(0));
        assert_eq!(saved.paused.as_deref(), Some("person"));
        let mut again = bench();
        again.core.restore(&saved, again.at(60));
        assert_eq!(again.core.pause(), Some(Pause::Person));
        assert_eq!(again.core.deadline(), Some(again.at(3600).mono), "the same end, not an hour from the restart");

        // The fleet's pause is the supervisor's to give again, not the session's to keep.
        let mut fleet = bench();
        let at = fleet.at(0);
        fleet.core.on_hold(HoldScope::Fleet, None, "cli", at);
        let mut again = bench();
        again.core.restore(&fleet.core.export(at), again.at(1));
        assert_eq!(again.core.pause(), None);
    }
}
