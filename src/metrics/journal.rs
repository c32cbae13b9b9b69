//! Journal records → metric observations: pure, so the mapping is tested as a table.
//!
//! Every action Shepherd takes is one [`ActionRecord`]; the metrics of actions, prompts,
//! stalls, recoveries, follow-ups and advice are *folded from those records* — the same
//! facts the log and the status file show — rather than counted by macros inside the
//! core. [`JournalFold::observe`] turns one record into the observations it implies; the
//! adapter ([`super::Metrics`]) applies them to the recorder.
//!
//! Labels are low-cardinality by construction: an action, an outcome, a prompt kind and
//! a *category* of the free-text reason ([`reason_category`], a short fixed word). A
//! session id never becomes a label; it is only used here, in memory, to pair a stall
//! with the continue that ends it.

use std::collections::HashMap;

use shepherd_actors::journal::{Action, ActionRecord, Outcome};

/// Stalls awaiting their continue are remembered at most this many at once (a session
/// deleted mid-recovery never sends one): past it, the ones pending longer than
/// [`STALE_PENDING_MS`] are dropped.
const MAX_PENDING: usize = 10_000;
const STALE_PENDING_MS: i64 = 60 * 60 * 1000;
/// How often (in record time) a full memory is swept for stale stalls: a sweep reads
/// every entry, and a burst of more than [`MAX_PENDING`] stalls would sweep at each
/// (the fold runs on the thread that records: 10 µs a record instead of 0.7).
const SWEEP_EVERY_MS: i64 = 60 * 1000;

/// One thing a record means for the metrics. Label values are `'static`: bounded.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// `shepherd_actions_total{action, outcome, reason}`.
    Action { action: &'static str, outcome: &'static str, reason: &'static str },
    /// `shepherd_prompts_total{kind, outcome}`.
    Prompt { kind: &'static str, outcome: &'static str },
    /// `shepherd_stall_detections_total` and, when the record says it, how long after its
    /// deadline the stall was looked at (`shepherd_stall_detection_delay_seconds`).
    StallDetected { late_seconds: Option<f64> },
    /// `shepherd_recoveries_total{outcome}` and, for a success, the time from the stall's
    /// detection to its continue (`shepherd_recovery_duration_seconds`).
    Recovery { outcome: &'static str, seconds: Option<f64> },
    /// `shepherd_nudges_total`, `shepherd_reviews_total`, `shepherd_compactions_total`,
    /// `shepherd_handoffs_total` — `{outcome}`.
    FollowUp { metric: FollowUp, outcome: &'static str },
    /// `shepherd_advice_total{source}`.
    Advice { source: &'static str },
}

/// The follow-up families with a counter of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUp {
    Nudge,
    Review,
    Compaction,
    Handoff,
}

/// The fold's memory: which sessions have a recovery under way, since when.
#[derive(Debug, Default)]
pub struct JournalFold {
    pending: HashMap<(String, String), i64>,
    /// When `pending` was last swept for stale stalls (record time).
    swept_at_ms: Option<i64>,
}

impl JournalFold {
    pub fn new() -> Self {
        Self::default()
    }

    /// Recoveries awaiting their continue (for tests: the memory stays bounded).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The observations one record implies, in a fixed order.
    pub fn observe(&mut self, r: &ActionRecord) -> Vec<Observation> {
        let mut out = vec![Observation::Action {
            action: r.action.as_str(),
            outcome: r.outcome.as_str(),
            reason: reason_category(r),
        }];
        if let Some(kind) = prompt_kind(r.action) {
            // A hand-off record is a phase, not a prompt: only its resume prompt would be.
            out.push(Observation::Prompt { kind, outcome: prompt_outcome(r) });
        }
        let key = || (r.server.clone(), r.session.clone());
        match (r.action, r.outcome) {
            (Action::StallDetected, Outcome::Done) => {
                let late_seconds = r.numbers.late_ms.map(|ms| ms as f64 / 1000.0);
                out.push(Observation::StallDetected { late_seconds });
                self.start(key(), r.at_ms);
            }
            // An orphaned or interrupted turn taken up: a recovery without a stall.
            (Action::Recover, Outcome::Done) => self.start(key(), r.at_ms),
            // Nothing reached the session: the attempt did not happen.
            (Action::Recover, Outcome::Declined) => {
                self.pending.remove(&key());
            }
            (Action::Continue, Outcome::Done) => {
                if let Some(since) = self.pending.remove(&key()) {
                    let seconds = (r.at_ms - since).max(0) as f64 / 1000.0;
                    out.push(Observation::Recovery { outcome: "succeeded", seconds: Some(seconds) });
                }
            }
            (Action::Recover | Action::Continue, Outcome::Failed) | (Action::GiveUp, Outcome::Done) => {
                // Giving up ends the recovery whether or not its start was seen.
                let was_pending = self.pending.remove(&key()).is_some();
                let failed = was_pending || r.action == Action::GiveUp;
                out.extend(failed.then_some(Observation::Recovery { outcome: "failed", seconds: None }));
            }
            _ => {}
        }
        let follow_up = match r.action {
            Action::Nudge => Some(FollowUp::Nudge),
            Action::Review => Some(FollowUp::Review),
            Action::Compact => Some(FollowUp::Compaction),
            Action::Handoff => Some(FollowUp::Handoff),
            _ => None,
        };
        if let Some(metric) = follow_up {
            let outcome = match (metric, r.outcome) {
                // A hand-off is many phase records; it is counted once, when it completes.
                (FollowUp::Handoff, Outcome::Done) => {
                    (r.numbers.phase.as_deref() == Some("completed")).then_some("completed")
                }
                (_, outcome) => Some(outcome.as_str()),
            };
            if let Some(outcome) = outcome {
                out.push(Observation::FollowUp { metric, outcome });
            }
        }
        if let Some(source) = r.numbers.advice_source.as_deref() {
            out.push(Observation::Advice { source: advice_source(source) });
        }
        out
    }

    fn start(&mut self, key: (String, String), at_ms: i64) {
        let sweep_due = self.swept_at_ms.is_none_or(|swept| at_ms - swept >= SWEEP_EVERY_MS);
        if self.pending.len() >= MAX_PENDING && sweep_due {
            self.pending.retain(|_, since| at_ms - *since < STALE_PENDING_MS);
            self.swept_at_ms = Some(at_ms);
        }
        if self.pending.len() < MAX_PENDING {
            self.pending.insert(key, at_ms);
        }
    }
}

/// The prompt kind a record's action is, if it is one (`PromptKind` names).
fn prompt_kind(action: Action) -> Option<&'static str> {
    match action {
        Action::Continue => Some("continue"),
        Action::Nudge => Some("nudge"),
        Action::Review => Some("review"),
        Action::Prompt => Some("custom"),
        Action::Note => Some("note"),
        _ => None,
    }
}

/// `sent`, `deduplicated`, `rate_limited`, `failed`, or `declined` (not sent for any
/// other reason: the session went busy, automation is paused, the advisor said wait, …).
fn prompt_outcome(r: &ActionRecord) -> &'static str {
    match r.outcome {
        Outcome::Done => "sent",
        Outcome::Failed => "failed",
        Outcome::Declined => match reason_category(r) {
            "duplicate" => "deduplicated",
            "rate_limited" => "rate_limited",
            _ => "declined",
        },
    }
}

/// The reason of a record as one short word from a fixed set: `none` (done), `duplicate`,
/// `rate_limited`, `not_ours`, `shutting_down`, `paused`, `advisor`, `busy`, `cooldown`,
/// `todos`, `limit`, `error`, `other`.
///
/// The reasons are free text written by the core; this reads the phrases the core and
/// the guard use (the tests build them from the guard's own `Verdict::reason`, so a
/// change of wording there fails here). Anything unrecognised is `other`, never the text.
pub fn reason_category(r: &ActionRecord) -> &'static str {
    if r.outcome == Outcome::Done {
        return "none";
    }
    let reason = r.reason.to_ascii_lowercase();
    let has = |s: &str| reason.contains(s);
    if has("similar prompt") {
        "duplicate"
    } else if has("rate limit") {
        "rate_limited"
    } else if has("another shepherd instance") {
        "not_ours"
    } else if has("shutting down") {
        "shutting_down"
    } else if has("paused") {
        "paused"
    } else if has("advi") || r.numbers.advice.is_some() {
        "advisor"
    } else if has("busy") {
        "busy"
    } else if has("cooldown") || has("back-off") || has("backoff") {
        "cooldown"
    } else if has("todo") {
        "todos"
    } else if has("max_") || has("limit") || has("rounds") || has("loop guard") {
        "limit"
    } else if r.outcome == Outcome::Failed || has("could not") || has("failed") || has("error") {
        "error"
    } else {
        "other"
    }
}

/// The advisor's answer source as a label: `model`, `cached`, `obvious`, `no_model`,
/// `fallback`, `other`.
fn advice_source(source: &str) -> &'static str {
    if source == "model" {
        "model"
    } else if source == "cached" {
        "cached"
    } else if source.starts_with("heuristic (obvious") {
        "obvious"
    } else if source.starts_with("heuristic (no model") {
        "no_model"
    } else if source.starts_with("heuristic (fallback") {
        "fallback"
    } else {
        "other"
    }
}

#[cfg(test)]
pub(super) mod tests {
    use shepherd_actors::advisor::Source;
    use shepherd_actors::guard::Verdict;
    use shepherd_actors::journal::Numbers;

    use super::*;

    /// A journal record for the tests (the metrics module's tests use it too).
    pub(crate) fn rec(session: &str, at_ms: i64, action: Action, outcome: Outcome, reason: &str) -> ActionRecord {
        ActionRecord {
            server: "local".into(),
            session: session.into(),
            action,
            outcome,
            reason: reason.into(),
            numbers: Numbers::default(),
            at_ms,
        }
    }

    fn of<T>(obs: &[Observation], pick: impl Fn(&Observation) -> Option<T>) -> Vec<T> {
        obs.iter().filter_map(pick).collect()
    }

    #[test]
    fn a_stall_and_its_continue_make_one_detection_and_one_recovery_timed_from_detection_to_continue() {
        let mut fold = JournalFold::new();
        let detected = fold.observe(&rec("ses_1", 10_000, Action::StallDetected, Outcome::Done, "no progress"));
        assert!(detected.contains(&Observation::StallDetected { late_seconds: None }));
        fold.observe(&rec("ses_1", 11_000, Action::Abort, Outcome::Done, "stalled session aborted"));
        let cont = fold.observe(&rec("ses_1", 12_500, Action::Continue, Outcome::Done, "continue sent"));
        assert_eq!(
            of(&cont, |o| match o {
                Observation::Recovery { outcome, seconds } => Some((*outcome, *seconds)),
                _ => None,
            }),
            vec![("succeeded", Some(2.5))]
        );
        assert_eq!(
            of(&cont, |o| matches!(o, Observation::Prompt { kind: "continue", outcome: "sent" }).then_some(())).len(),
            1
        );
        assert_eq!(fold.pending(), 0);
    }

    #[test]
    fn a_continue_without_a_stall_is_a_prompt_but_no_recovery() {
        let mut fold = JournalFold::new();
        let obs = fold.observe(&rec("ses_1", 1, Action::Continue, Outcome::Done, "continue sent"));
        assert!(!obs.iter().any(|o| matches!(o, Observation::Recovery { .. })));
    }

    #[test]
    fn recoveries_of_two_sessions_are_paired_by_session() {
        let mut fold = JournalFold::new();
        fold.observe(&rec("a", 1_000, Action::StallDetected, Outcome::Done, ""));
        fold.observe(&rec("b", 5_000, Action::StallDetected, Outcome::Done, ""));
        let b = fold.observe(&rec("b", 6_000, Action::Continue, Outcome::Done, ""));
        assert!(b.contains(&Observation::Recovery { outcome: "succeeded", seconds: Some(1.0) }));
        let a =
            fold.observe(&rec("a", 9_000, Action::Continue, Outcome::Failed, "abort sent but the continue was not"));
        assert!(a.contains(&Observation::Recovery { outcome: "failed", seconds: None }));
        assert!(a.contains(&Observation::Prompt { kind: "continue", outcome: "failed" }));
    }

    #[test]
    fn guard_verdicts_become_deduplicated_and_rate_limited_prompts() {
        let duplicate = Verdict::Duplicate { similarity: 0.8, of: "Shepherd's custom prompt".into() }.reason().unwrap();
        let limited = Verdict::RateLimited { scope: "session", retry_after_ms: 2_000 }.reason().unwrap();
        let not_ours = Verdict::NotOurs { holder: "i-2".into() }.reason().unwrap();
        let mut fold = JournalFold::new();
        let cases = [
            (Action::Prompt, duplicate.as_str(), "custom", "deduplicated", "duplicate"),
            (Action::Nudge, limited.as_str(), "nudge", "rate_limited", "rate_limited"),
            (Action::Continue, not_ours.as_str(), "continue", "declined", "not_ours"),
            (Action::Review, "the session went busy again", "review", "declined", "busy"),
        ];
        for (action, reason, kind, outcome, category) in cases {
            let obs = fold.observe(&rec("s", 1, action, Outcome::Declined, reason));
            assert!(obs.contains(&Observation::Prompt { kind, outcome }), "{reason}: {obs:?}");
            assert!(
                obs.contains(&Observation::Action { action: action.as_str(), outcome: "declined", reason: category }),
                "{reason}: {obs:?}"
            );
        }
    }

    #[test]
    fn reasons_become_a_short_fixed_word_never_the_text() {
        let cases = [
            (Outcome::Done, "nudge sent", "none"),
            (Outcome::Declined, "automation is paused (user_abort)", "paused"),
            (Outcome::Declined, "shutting down: nothing was sent", "shutting_down"),
            (Outcome::Declined, "within compaction.cooldown", "cooldown"),
            (Outcome::Declined, "no open todos any more", "todos"),
            (Outcome::Failed, "could not send: HTTP 500 from ses_123", "error"),
            (Outcome::Declined, "something nobody wrote a category for ses_9", "other"),
        ];
        for (outcome, reason, want) in cases {
            assert_eq!(reason_category(&rec("s", 1, Action::Nudge, outcome, reason)), want, "{reason}");
        }
    }

    #[test]
    fn a_hand_off_is_counted_once_when_it_completes_and_follow_ups_by_outcome() {
        let mut fold = JournalFold::new();
        let phase = |p: &str| ActionRecord {
            numbers: Numbers { phase: Some(p.into()), ..Numbers::default() },
            ..rec("s", 1, Action::Handoff, Outcome::Done, "hand-off")
        };
        let follow_ups = |obs: Vec<Observation>| {
            of(&obs, |o| match o {
                Observation::FollowUp { metric, outcome } => Some((*metric, *outcome)),
                _ => None,
            })
        };
        assert!(follow_ups(fold.observe(&phase("persisting"))).is_empty());
        assert_eq!(follow_ups(fold.observe(&phase("completed"))), vec![(FollowUp::Handoff, "completed")]);
        let nudge = fold.observe(&rec("s", 1, Action::Nudge, Outcome::Done, "nudge sent"));
        assert_eq!(follow_ups(nudge), vec![(FollowUp::Nudge, "done")]);
        let compact = fold.observe(&rec("s", 1, Action::Compact, Outcome::Failed, "summarize failed"));
        assert_eq!(follow_ups(compact), vec![(FollowUp::Compaction, "failed")]);
    }

    #[test]
    fn advice_sources_are_bounded_labels() {
        let mut fold = JournalFold::new();
        // Written as the advisor writes them (`Source`'s Display), so a rewording fails here.
        let sources = [
            (Source::Model, "model"),
            (Source::Cached, "cached"),
            (Source::Obvious, "obvious"),
            (Source::NoModel, "no_model"),
            (Source::Fallback("timeout after 5s".into()), "fallback"),
        ];
        for (given, label) in sources {
            let r = ActionRecord {
                numbers: Numbers { advice_source: Some(given.to_string()), ..Numbers::default() },
                ..rec("s", 1, Action::Advise, Outcome::Done, "advised")
            };
            assert!(fold.observe(&r).contains(&Observation::Advice { source: label }), "{given}");
        }
    }

    #[test]
    fn the_memory_of_pending_recoveries_stays_bounded() {
        let mut fold = JournalFold::new();
        for i in 0..(MAX_PENDING + 10) {
            fold.observe(&rec(&format!("ses_{i}"), 0, Action::StallDetected, Outcome::Done, ""));
        }
        assert_eq!(fold.pending(), MAX_PENDING);
        fold.observe(&rec("late", STALE_PENDING_MS + 1, Action::StallDetected, Outcome::Done, ""));
        assert_eq!(fold.pending(), 1, "stale stalls made room");
    }
}
