//! The circuit breaker of one OpenCode server's model provider: when many sessions fail
//! on provider errors at once, one session probes (resumes) and the others wait for its
//! answer, so a recovering provider is not stampeded.
//!
//! [`Breaker`] is the pure state machine (`closed → open` on `breaker_sessions` failures
//! within `breaker_window`; while open one probe at a time; the probe's normal finish
//! closes it, its failure re-opens it with the back-off). [`ProviderBreaker`] shares it
//! between the server's session actors (a mutex, and a watch channel that wakes the
//! sessions waiting on it). It decides nothing about single sessions: each session's
//! own back-off says when it asks.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RecoveryConfig;
use crate::journal::{Action, ActionRecord, Numbers, Outcome};
use crate::session::outage::backoff;

/// May this session resume now?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permit {
    /// Closed: go ahead.
    Go,
    /// Open: this session is the probe.
    Probe,
    /// Open and another session probes (`probe`): ask again at `retry_at`, or when the
    /// breaker changes.
    Wait { probe: Option<String>, retry_at: Option<Instant> },
}

/// A change of the breaker's state, with the numbers that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// `sessions` failed within the window.
    Opened { sessions: u32, window: Duration },
    /// The probe failed again: the next probe waits `backoff`.
    Reopened { probe: String, reopens: u32, backoff: Duration },
    /// A session finished normally again.
    Closed { by: String, open_for: Duration },
    /// The probe did not answer within `breaker_probe_timeout`: another may probe.
    ProbeExpired { probe: String, timeout: Duration },
}

impl Transition {
    /// The journal record of this transition, about the session that caused it.
    pub fn record(&self, server: &str, session: &str, at_ms: i64) -> ActionRecord {
        let ms = |d: &Duration| d.as_millis().min(u64::MAX as u128) as u64;
        let (reason, numbers) = match self {
            Transition::Opened { sessions, window } => (
                format!(
                    "provider breaker opened: {sessions} sessions failed on provider errors within \
                     recovery.breaker_window; one session probes, the others wait"
                ),
                Numbers { round: Some(*sessions), window_ms: Some(ms(window)), ..Numbers::default() },
            ),
            Transition::Reopened { probe, reopens, backoff } => (
                format!("provider breaker stays open: the probe ({probe}) failed again; next probe after the back-off"),
                Numbers { attempt: Some(*reopens), backoff_ms: Some(ms(backoff)), ..Numbers::default() },
            ),
            Transition::Closed { by, open_for } => (
                format!("provider breaker closed: {by} finished a turn normally; the waiting sessions resume"),
                Numbers { open_ms: Some(ms(open_for)), ..Numbers::default() },
            ),
            Transition::ProbeExpired { probe, timeout } => (
                format!("provider breaker: the probe ({probe}) did not answer within recovery.breaker_probe_timeout; another session probes"),
                Numbers { timeout_ms: Some(ms(timeout)), ..Numbers::default() },
            ),
        };
        ActionRecord {
            server: server.to_string(),
            session: session.to_string(),
            action: Action::Breaker,
            outcome: Outcome::Done,
            reason,
            numbers,
            at_ms,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Closed,
    Open {
        since: Instant,
        /// The probing session and when it started probing.
        probe: Option<(String, Instant)>,
        /// No probe before this.
        retry_at: Instant,
        /// Probes that failed since it opened.
        reopens: u32,
    },
}

/// The pure state machine.
#[derive(Debug, Clone)]
pub struct Breaker {
    state: State,
    /// Recent provider failures: (session, when), within the window.
    failures: VecDeque<(String, Instant)>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker { state: State::Closed, failures: VecDeque::new() }
    }
}

impl Breaker {
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// A session's turn ended on a provider error.
    pub fn on_failure(&mut self, session: &str, now: Instant, cfg: &RecoveryConfig) -> Option<Transition> {
        match &mut self.state {
            State::Closed => {
                self.failures.retain(|(s, at)| now.duration_since(*at) <= cfg.breaker_window && s != session);
                self.failures.push_back((session.to_string(), now));
                let sessions = self.failures.len() as u32;
                if sessions < cfg.breaker_sessions {
                    return None;
                }
                self.failures.clear();
                self.state = State::Open { since: now, probe: None, retry_at: now, reopens: 0 };
                Some(Transition::Opened { sessions, window: cfg.breaker_window })
            }
            State::Open { probe, retry_at, reopens, .. } => {
                if probe.as_ref().is_some_and(|(p, _)| p == session) {
                    *probe = None;
                    *reopens += 1;
                    let wait = backoff(*reopens, cfg);
                    *retry_at = now + wait;
                    Some(Transition::Reopened { probe: session.to_string(), reopens: *reopens, backoff: wait })
                } else {
                    None // a waiting session's own turn (e.g. the person's): the probe decides
                }
            }
        }
    }

    /// A session that had failed on provider errors finished a turn normally.
    pub fn on_success(&mut self, session: &str, now: Instant) -> Option<Transition> {
        self.failures.retain(|(s, _)| s != session);
        match &self.state {
            State::Closed => None,
            State::Open { since, .. } => {
                let open_for = now.duration_since(*since);
                self.state = State::Closed;
                Some(Transition::Closed { by: session.to_string(), open_for })
            }
        }
    }

    /// Whether `session` may resume now.
    pub fn permit(&mut self, session: &str, now: Instant, cfg: &RecoveryConfig) -> (Permit, Option<Transition>) {
        let State::Open { probe, retry_at, .. } = &mut self.state else { return (Permit::Go, None) };
        let mut expired = None;
        if let Some((p, since)) = probe.as_ref() {
            if p == session {
                return (Permit::Probe, None);
            }
            if now.duration_since(*since) < cfg.breaker_probe_timeout {
                let until = *since + cfg.breaker_probe_timeout;
                return (Permit::Wait { probe: Some(p.clone()), retry_at: Some(until) }, None);
            }
            expired = Some(Transition::ProbeExpired { probe: p.clone(), timeout: cfg.breaker_probe_timeout });
            *probe = None;
        }
        if now < *retry_at {
            return (Permit::Wait { probe: None, retry_at: Some(*retry_at) }, expired);
        }
        *probe = Some((session.to_string(), now));
        (Permit::Probe, expired)
    }
}

/// One server's breaker, shared by its session actors.
#[derive(Debug)]
pub struct ProviderBreaker {
    inner: Mutex<Breaker>,
    /// Bumped on every transition: sessions waiting on the breaker ask again.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for ProviderBreaker {
    fn default() -> Self {
        ProviderBreaker { inner: Mutex::new(Breaker::default()), changed: tokio::sync::watch::Sender::new(0) }
    }
}

impl ProviderBreaker {
    fn with<T>(&self, f: impl FnOnce(&mut Breaker) -> (T, Option<Transition>)) -> (T, Option<Transition>) {
        let (out, transition) = {
            let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut b)
        };
        if transition.is_some() {
            self.changed.send_modify(|g| *g = g.wrapping_add(1));
        }
        (out, transition)
    }

    pub fn on_failure(&self, session: &str, now: Instant, cfg: &RecoveryConfig) -> Option<Transition> {
        self.with(|b| ((), b.on_failure(session, now, cfg))).1
    }

    pub fn on_success(&self, session: &str, now: Instant) -> Option<Transition> {
        self.with(|b| ((), b.on_success(session, now))).1
    }

    pub fn permit(&self, session: &str, now: Instant, cfg: &RecoveryConfig) -> (Permit, Option<Transition>) {
        self.with(|b| b.permit(session, now, cfg))
    }

    /// Resolves at the breaker's next transition.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RecoveryConfig {
        RecoveryConfig {
            breaker_sessions: 3,
            breaker_window: Duration::from_secs(60),
            breaker_probe_timeout: Duration::from_secs(300),
            provider_backoff: Duration::from_secs(60),
            provider_max_backoff: Duration::from_secs(1800),
            ..RecoveryConfig::default()
        }
    }

    #[test]
    fn failures_of_fewer_sessions_than_breaker_sessions_leave_it_closed() {
        let (c, t0) = (cfg(), Instant::now());
        let mut b = Breaker::default();
        assert_eq!(b.on_failure("a", t0, &c), None);
        assert_eq!(b.on_failure("a", t0, &c), None, "one session failing twice is one session");
        assert_eq!(b.on_failure("b", t0 + Duration::from_secs(10), &c), None);
        // c fails after a's failure left the window: two sessions within it.
        assert_eq!(b.on_failure("c", t0 + Duration::from_secs(65), &c), None);
        assert_eq!(b.permit("a", t0, &c).0, Permit::Go);
    }

    #[test]
    fn many_sessions_failing_at_once_open_it_and_one_probes_while_the_others_wait() {
        let (c, t0) = (cfg(), Instant::now());
        let mut b = Breaker::default();
        b.on_failure("a", t0, &c);
        b.on_failure("b", t0, &c);
        let opened = b.on_failure("c", t0, &c);
        assert_eq!(opened, Some(Transition::Opened { sessions: 3, window: Duration::from_secs(60) }));
        let t = t0 + Duration::from_secs(60);
        assert_eq!(b.permit("b", t, &c).0, Permit::Probe);
        assert_eq!(b.permit("b", t, &c).0, Permit::Probe, "asking again changes nothing");
        let until = Some(t + Duration::from_secs(300));
        assert_eq!(b.permit("a", t, &c).0, Permit::Wait { probe: Some("b".into()), retry_at: until });
        // The probe's turn finishes normally: closed, everyone goes.
        assert!(matches!(b.on_success("b", t + Duration::from_secs(5)), Some(Transition::Closed { .. })));
        assert_eq!(b.permit("a", t, &c).0, Permit::Go);
        assert_eq!(b.permit("c", t, &c).0, Permit::Go);
    }

    #[test]
    fn a_failed_probe_reopens_it_with_a_growing_back_off() {
        let (c, t0) = (cfg(), Instant::now());
        let mut b = Breaker::default();
        for s in ["a", "b", "c"] {
            b.on_failure(s, t0, &c);
        }
        assert_eq!(b.permit("a", t0, &c).0, Permit::Probe);
        assert_eq!(b.on_failure("b", t0, &c), None, "only the probe's answer counts");
        let t1 = t0 + Duration::from_secs(10);
        let r = b.on_failure("a", t1, &c);
        assert_eq!(r, Some(Transition::Reopened { probe: "a".into(), reopens: 1, backoff: Duration::from_secs(60) }));
        assert_eq!(
            b.permit("b", t1, &c).0,
            Permit::Wait { probe: None, retry_at: Some(t1 + Duration::from_secs(60)) },
            "no probe before the back-off"
        );
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(b.permit("b", t2, &c).0, Permit::Probe, "then the next session to ask probes");
        let r = b.on_failure("b", t2, &c);
        assert_eq!(r, Some(Transition::Reopened { probe: "b".into(), reopens: 2, backoff: Duration::from_secs(120) }));
    }

    #[test]
    fn a_probe_that_never_answers_is_replaced_after_the_probe_timeout() {
        let (c, t0) = (cfg(), Instant::now());
        let mut b = Breaker::default();
        for s in ["a", "b", "c"] {
            b.on_failure(s, t0, &c);
        }
        b.permit("a", t0, &c);
        let (p, t) = b.permit("b", t0 + Duration::from_secs(300), &c);
        assert_eq!(p, Permit::Probe);
        assert_eq!(t, Some(Transition::ProbeExpired { probe: "a".into(), timeout: Duration::from_secs(300) }));
    }

    #[tokio::test]
    async fn waiting_sessions_are_woken_by_a_transition() {
        let (c, t0) = (cfg(), Instant::now());
        let shared = ProviderBreaker::default();
        let mut rx = shared.changes();
        for s in ["a", "b", "c"] {
            shared.on_failure(s, t0, &c);
        }
        rx.changed().await.expect("opened");
        let rx = shared.changes();
        shared.permit("a", t0, &c);
        assert!(!rx.has_changed().unwrap(), "a probe starting is no transition");
        shared.on_success("a", t0);
        assert!(rx.has_changed().unwrap(), "closing wakes the waiters");
    }
}
