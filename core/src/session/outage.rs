//! Provider outages: a turn that ended on the model provider's error (HTTP 5xx or 429
//! after OpenCode's own retries, overloaded, timeouts) leaves the session idle with its
//! work undone. This module decides what such an error is ([`classify`]) and keeps one
//! session's back-off ([`Outage`]): consecutive failures, the step whose resume is due,
//! the model to resume on (the primary, or a fallback after repeated failures). Pure;
//! part of the session core, which turns its answers into records and prompts.
//!
//! It must not: resume a session whose error a resume cannot fix (a context overflow is
//! the compaction's business, an abort is the person's, a missing model or a refused
//! key fails the same way again), resume twice for one failed turn, or read a clock.

use std::time::Duration;

use tokio::time::Instant;

pub use crate::config::parse_model;
use crate::config::RecoveryConfig;
use crate::event::{ErrorInfo, ModelRef};
use crate::ledger::OutageMemory;

/// What a failed reply's error means for Shepherd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The provider failed or was unreachable (`APIError`, 5xx, 429, overloaded,
    /// timeouts): the same request may well succeed later.
    Provider,
    /// The context window overflowed: compaction (or a hand-off) is the remedy.
    ContextOverflow,
    /// Someone aborted the turn.
    Aborted,
    /// Anything a later retry would not fix (`UnknownError "Model not found"`,
    /// `ProviderAuthError`, output length, content filter, …).
    Other,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Provider => "provider",
            ErrorClass::ContextOverflow => "context_overflow",
            ErrorClass::Aborted => "aborted",
            ErrorClass::Other => "other",
        }
    }
}

/// Error texts of provider failures that OpenCode may report under another name.
const PROVIDER_TEXTS: [&str; 8] = [
    "overloaded",
    "rate limit",
    "timed out",
    "timeout",
    "service unavailable",
    "bad gateway",
    "internal server error",
    "too many requests",
];

/// The class of one error as OpenCode reports it (`session.error` or a message's
/// `error`).
pub fn classify(e: &ErrorInfo) -> ErrorClass {
    match e.name.as_str() {
        ErrorInfo::ABORTED => return ErrorClass::Aborted,
        ErrorInfo::CONTEXT_OVERFLOW => return ErrorClass::ContextOverflow,
        "ProviderAuthError" | "MessageOutputLengthError" | "StructuredOutputError" | "ContentFilterError" => {
            return ErrorClass::Other
        }
        _ => {}
    }
    let data = e.data.as_ref();
    let status = data.and_then(|d| d.status_code);
    let text = data.and_then(|d| d.message.as_deref()).unwrap_or_default().to_ascii_lowercase();
    if e.name == "APIError" {
        return match status {
            // Throttled, timed out, or the provider's own failure: worth trying later.
            Some(408 | 409 | 425 | 429) | Some(500..=599) => ErrorClass::Provider,
            // Bad request, unauthorised, not found: the same request fails again.
            Some(_) => ErrorClass::Other,
            // No status: a stream or header timeout (`metadata.code`), a dropped
            // connection. OpenCode's own verdict decides.
            None if data.and_then(|d| d.is_retryable) == Some(true) => ErrorClass::Provider,
            None if PROVIDER_TEXTS.iter().any(|t| text.contains(t)) => ErrorClass::Provider,
            None => ErrorClass::Other,
        };
    }
    // `UnknownError` and names this version does not know: only an unmistakable
    // provider failure counts ("Model not found" does not).
    if status.is_some_and(|s| s == 429 || (500..=599).contains(&s)) || PROVIDER_TEXTS.iter().any(|t| text.contains(t)) {
        ErrorClass::Provider
    } else {
        ErrorClass::Other
    }
}

/// A short account of a provider error for records: `APIError 429 "Rate limit reached"`.
pub fn describe(e: &ErrorInfo) -> String {
    let data = e.data.as_ref();
    let mut out = e.name.clone();
    if let Some(s) = data.and_then(|d| d.status_code) {
        out.push_str(&format!(" {s}"));
    }
    if let Some(code) = data.and_then(|d| d.metadata.as_deref()) {
        out.push_str(&format!(" ({code})"));
    }
    if let Some(m) = data.and_then(|d| d.message.as_deref()) {
        let short: String = m.chars().take(120).collect();
        out.push_str(&format!(" \"{short}\""));
    }
    out
}

/// The back-off before resume step `step` (1-based): `provider_backoff` doubling per
/// consecutive failure, at most `provider_max_backoff`.
pub fn backoff(step: u32, cfg: &RecoveryConfig) -> Duration {
    let exp = step.saturating_sub(1).min(20);
    cfg.provider_backoff.saturating_mul(1u32 << exp).min(cfg.provider_max_backoff)
}

/// The resume Shepherd may send now: which step, on which model and why that model.
#[derive(Debug, Clone, PartialEq)]
pub struct Resume {
    pub step: u32,
    /// `None`: the session's own (primary) model.
    pub model: Option<ModelRef>,
    /// Why that model, when it is not simply the session's own (for the record).
    pub why_model: String,
}

/// One session's provider-outage state. Created on its first provider error (boxed in
/// the core: most sessions never have one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outage {
    /// The reply's provider error, seen but not yet counted (counted at the idle edge).
    pending: Option<(Option<String>, String)>,
    m: OutageMemory,
    /// When the next resume is due (monotonic; `m.due_ms` is its wall-clock copy).
    due: Option<Instant>,
    /// What holds the due resume back.
    hold: Hold,
    /// Real progress ended this many failures; not yet reported.
    recovered: Option<u32>,
    /// The last failure was counted before its message was known (a `session.error`
    /// for a message this core never saw): the message's own error, trailing it, is
    /// the same failure.
    counted_unnamed: bool,
}

/// What a due resume waits for.
#[derive(Debug, Clone, Default, PartialEq)]
enum Hold {
    #[default]
    Nothing,
    /// The server's breaker was asked; its answer comes to the core.
    Asking,
    /// The breaker is open and another session probes: ask again then (or when it changes).
    Breaker(Option<Instant>),
    /// The resume is being delivered (its decision id).
    Delivering(String),
}

impl Outage {
    pub fn memory(&self) -> &OutageMemory {
        &self.m
    }

    /// From the ledger: a due resume keeps its wall-clock time (`now` converts it).
    pub fn restore(m: &OutageMemory, now: Instant, wall_ms: i64) -> Self {
        let due = m.due_ms.map(|d| now + Duration::from_millis(d.saturating_sub(wall_ms).max(0) as u64));
        Outage { m: m.clone(), due, ..Outage::default() }
    }

    pub fn failures(&self) -> u32 {
        self.m.failures
    }

    /// A provider error was seen for `message` (its id, when known): counted at the
    /// next idle edge (or at once by [`Outage::count`] when the session is idle).
    pub fn note(&mut self, message: Option<String>, summary: String) {
        if message.is_some() && message == self.m.counted {
            return; // that failure was already counted
        }
        if message.is_some() && self.counted_unnamed && self.pending.is_none() {
            self.counted_unnamed = false;
            self.m.counted = message; // the trailing error of the failure just counted
            return;
        }
        let message = message.or_else(|| self.pending.as_ref().and_then(|(m, _)| m.clone()));
        self.pending = Some((message, summary));
    }

    /// Whether a provider error waits to be counted.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The turn ended (idle): count its provider failure once and schedule the next
    /// step. Returns `(step, backoff, summary)`, or `None` if there was none to count.
    pub fn count(&mut self, now: Instant, wall_ms: i64, cfg: &RecoveryConfig) -> Option<(u32, Duration, String)> {
        let (message, summary) = self.pending.take()?;
        if message.is_some() && message == self.m.counted {
            return None;
        }
        self.counted_unnamed = message.is_none();
        self.m.counted = message;
        self.m.failures += 1;
        if self.m.resumed_step > 0 {
            self.m.failures_on_model += 1; // a resume that failed again
        }
        let step = self.m.failures;
        let wait = backoff(step, cfg);
        self.due = Some(now + wait);
        self.m.due_ms = Some(wall_ms + wait.as_millis() as i64);
        self.hold = Hold::Nothing;
        Some((step, wait, summary))
    }

    /// When the next resume is due, if one is and nothing else holds it.
    pub fn deadline(&self) -> Option<Instant> {
        match &self.hold {
            Hold::Nothing => self.due,
            Hold::Breaker(at) => *at,
            Hold::Asking | Hold::Delivering(_) => None,
        }
    }

    /// A resume is scheduled or under way (the session must not be evicted).
    pub fn is_scheduled(&self) -> bool {
        self.due.is_some() || self.hold != Hold::Nothing
    }

    /// A step is due at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| d <= now)
    }

    /// Nothing to do any more (no work left, automation off): forget the schedule.
    pub fn drop_schedule(&mut self) {
        self.due = None;
        self.m.due_ms = None;
        self.hold = Hold::Nothing;
    }

    /// Try the same step again after `wait` (another procedure was under way).
    pub fn postpone(&mut self, now: Instant, wall_ms: i64, wait: Duration) {
        self.hold = Hold::Nothing;
        self.due = Some(now + wait);
        self.m.due_ms = Some(wall_ms + wait.as_millis() as i64);
    }

    /// The breaker is being asked.
    pub fn asking(&mut self) {
        self.hold = Hold::Asking;
    }

    /// The breaker said wait: ask again at `at`, or when it changes (`None`: only then).
    pub fn wait_for_breaker(&mut self, at: Option<Instant>) {
        self.hold = Hold::Breaker(at);
    }

    /// The breaker changed: a session waiting on it asks again now.
    pub fn on_breaker_changed(&mut self, now: Instant) -> bool {
        if matches!(self.hold, Hold::Breaker(_)) {
            self.hold = Hold::Breaker(Some(now));
            true
        } else {
            false
        }
    }

    /// The resume to send now: step and model. The model is the session's own
    /// (`primary`) until it failed `fallback_after` resumes in a row, then each fallback
    /// in turn gets as many; the session's own again once `fallback_cooldown` has passed
    /// since the switch.
    pub fn resume(&mut self, primary: Option<&ModelRef>, wall_ms: i64, cfg: &RecoveryConfig) -> Resume {
        let fallbacks: Vec<ModelRef> = cfg.fallback_models.iter().filter_map(|k| parse_model(k)).collect();
        let after = cfg.fallback_after.max(1);
        let mut why = String::new();
        let mut back = None;
        if let Some(own) = self.primary_due(wall_ms, cfg) {
            why = "back to the session's own model after recovery.fallback_cooldown".into();
            back = Some(own);
        }
        if !fallbacks.is_empty() && self.m.failures_on_model >= after {
            let next = (self.m.model_index as usize + 1).min(fallbacks.len());
            if next != self.m.model_index as usize {
                if self.m.model_index == 0 {
                    self.m.primary = back.as_ref().or(primary).map(|m| format!("{}/{}", m.provider_id, m.model_id));
                }
                self.m.model_index = next as u32;
                self.m.failures_on_model = 0;
                self.m.model_since_ms = Some(wall_ms);
                back = None;
                why = format!("fallback {next} of {}: the previous model failed {after} resumes", fallbacks.len());
            }
        }
        let model = match self.m.model_index as usize {
            0 => back,
            i => fallbacks.get(i - 1).cloned(),
        };
        if self.m.model_index > 0 && why.is_empty() {
            why = format!(
                "fallback {} of {} (still within recovery.fallback_cooldown)",
                self.m.model_index,
                fallbacks.len()
            );
        }
        Resume { step: self.m.failures, model, why_model: why }
    }

    /// The session runs on a fallback and `fallback_cooldown` has passed since the
    /// switch: its own model, once (the next prompt Shepherd sends carries it).
    pub fn primary_due(&mut self, wall_ms: i64, cfg: &RecoveryConfig) -> Option<ModelRef> {
        if self.m.model_index == 0 {
            return None;
        }
        let since = self.m.model_since_ms.unwrap_or(wall_ms);
        if wall_ms.saturating_sub(since) < cfg.fallback_cooldown.as_millis() as i64 {
            return None;
        }
        let own = self.m.primary.take().as_deref().and_then(parse_model);
        self.m.model_index = 0;
        self.m.failures_on_model = 0;
        self.m.model_since_ms = None;
        own
    }

    /// The resume for the current step is being delivered.
    pub fn sending(&mut self, decision: String) {
        self.counted_unnamed = false;
        self.hold = Hold::Delivering(decision);
    }

    pub fn is_in_flight(&self, decision: &str) -> bool {
        matches!(&self.hold, Hold::Delivering(d) if d == decision)
    }

    /// The delivery ended: `sent` marks the step done (a restart does not repeat it);
    /// otherwise it is tried again after `retry` (`None`: dropped).
    pub fn delivered(&mut self, sent: bool, retry: Option<(Instant, i64)>) {
        self.hold = Hold::Nothing;
        if sent {
            self.m.resumed_step = self.m.failures;
            self.due = None;
            self.m.due_ms = None;
        } else if let Some((at, at_ms)) = retry {
            self.due = Some(at);
            self.m.due_ms = Some(at_ms);
        } else {
            self.drop_schedule();
        }
    }

    /// Real progress: the provider answers again. The failures it ends are reported
    /// once by [`Outage::take_recovered`].
    pub fn on_progress(&mut self) {
        self.pending = None;
        self.counted_unnamed = false;
        if self.m.failures == 0 {
            return;
        }
        self.recovered = Some(self.m.failures);
        // The model in use stays (and the way back to the session's own).
        let (model_index, model_since_ms, primary) = (self.m.model_index, self.m.model_since_ms, self.m.primary.take());
        self.m = OutageMemory { model_index, model_since_ms, primary, ..OutageMemory::default() };
        self.due = None;
        self.hold = Hold::Nothing;
    }

    /// The failures the last real progress ended, once.
    pub fn take_recovered(&mut self) -> Option<u32> {
        self.recovered.take()
    }

    /// Nothing left worth keeping: the core may drop the box.
    pub fn is_quiet(&self) -> bool {
        *self == Outage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{decode, Event};

    /// The `session.error` and the failed message's error of a capture, decoded.
    fn errors_of(capture: &str) -> Vec<ErrorInfo> {
        capture
            .lines()
            .filter_map(|line| {
                let mut v: serde_json::Value = serde_json::from_str(line).ok()?;
                v.as_object_mut()?.remove("_recv");
                match decode(&v.to_string()).ok()?.event {
                    Event::SessionError { error, .. } => Some(*error),
                    Event::MessageUpdated(m) => m.error,
                    _ => None,
                }
            })
            .collect()
    }

    const HTTP429: &str = include_str!("../../../actors/tests/fixtures/captures/http429_retries_then_apierror.jsonl");
    const HTTP500: &str = include_str!("../../../actors/tests/fixtures/captures/http500_retries_then_apierror.jsonl");
    const OVERFLOW: &str =
        include_str!("../../../actors/tests/fixtures/captures/context_overflow_autocompact_disabled.jsonl");
    const ABORT: &str = include_str!("../../../actors/tests/fixtures/captures/stall_then_abort.jsonl");
    const NO_MODEL: &str = include_str!("../../../actors/tests/fixtures/captures/prompt_with_unknown_model.jsonl");
    const HEADER_TIMEOUT: &str =
        include_str!("../../../actors/tests/fixtures/captures/hang_before_headers_headertimeout_3s.jsonl");

    #[test]
    fn captured_429_and_500_after_opencodes_retries_are_provider_errors_with_their_status() {
        for (capture, status) in [(HTTP429, 429), (HTTP500, 500)] {
            let errors = errors_of(capture);
            assert_eq!(errors.len(), 2, "the session.error and the message's error");
            for e in &errors {
                assert_eq!(classify(e), ErrorClass::Provider, "{e:?}");
                assert_eq!(e.data.as_ref().and_then(|d| d.status_code), Some(status));
                assert!(describe(e).starts_with(&format!("APIError {status} ")), "{}", describe(e));
            }
        }
    }

    #[test]
    fn a_captured_header_timeout_is_a_provider_error() {
        let errors = errors_of(HEADER_TIMEOUT);
        assert!(!errors.is_empty());
        for e in &errors {
            assert_eq!(classify(e), ErrorClass::Provider, "{e:?}");
        }
        assert!(describe(&errors[0]).contains("ProviderHeaderTimeoutError"), "{}", describe(&errors[0]));
    }

    #[test]
    fn overflow_abort_and_a_missing_model_are_not_provider_errors() {
        let overflow = errors_of(OVERFLOW);
        assert!(!overflow.is_empty() && overflow.iter().all(|e| classify(e) == ErrorClass::ContextOverflow));
        let abort = errors_of(ABORT);
        assert!(!abort.is_empty() && abort.iter().all(|e| classify(e) == ErrorClass::Aborted));
        let missing = errors_of(NO_MODEL);
        assert!(!missing.is_empty(), "the capture has the model-not-found error");
        assert!(missing.iter().all(|e| classify(e) == ErrorClass::Other), "{missing:?}");
    }

    fn error(json: &str) -> ErrorInfo {
        #[derive(serde::Deserialize)]
        struct Wrap {
            error: ErrorInfo,
        }
        serde_json::from_str::<Wrap>(&format!("{{\"error\":{json}}}")).unwrap().error
    }

    #[test]
    fn auth_and_bad_requests_are_not_retried_but_an_overloaded_provider_is() {
        let auth = error(r#"{"name":"ProviderAuthError","data":{"message":"invalid key","providerID":"x"}}"#);
        assert_eq!(classify(&auth), ErrorClass::Other);
        let bad = error(r#"{"name":"APIError","data":{"message":"bad","statusCode":400,"isRetryable":false}}"#);
        assert_eq!(classify(&bad), ErrorClass::Other);
        let unauthorised = error(r#"{"name":"APIError","data":{"message":"no","statusCode":401}}"#);
        assert_eq!(classify(&unauthorised), ErrorClass::Other);
        let overloaded = error(r#"{"name":"APIError","data":{"message":"Overloaded","statusCode":529}}"#);
        assert_eq!(classify(&overloaded), ErrorClass::Provider);
        let stream = error(
            r#"{"name":"APIError","data":{"message":"SSE read timed out","isRetryable":true,"metadata":{"code":"ProviderResponseStreamError"}}}"#,
        );
        assert_eq!(classify(&stream), ErrorClass::Provider);
        let unknown = error(r#"{"name":"UnknownError","data":{"message":"Provider is overloaded, try later"}}"#);
        assert_eq!(classify(&unknown), ErrorClass::Provider);
    }

    fn cfg() -> RecoveryConfig {
        RecoveryConfig {
            provider_backoff: Duration::from_secs(60),
            provider_max_backoff: Duration::from_secs(30 * 60),
            fallback_models: vec!["fake/backup".into(), "other/second".into()],
            fallback_after: 2,
            fallback_cooldown: Duration::from_secs(3600),
            ..RecoveryConfig::default()
        }
    }

    #[test]
    fn the_back_off_doubles_per_step_up_to_its_cap() {
        let c = cfg();
        let steps: Vec<u64> = (1..=7).map(|s| backoff(s, &c).as_secs()).collect();
        assert_eq!(steps, [60, 120, 240, 480, 960, 1800, 1800]);
    }

    #[test]
    fn one_failed_turn_is_counted_once_however_often_its_error_is_seen() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outage::default();
        o.note(Some("msg_1".into()), "APIError 429".into());
        o.note(None, "APIError 429".into()); // the session.error, then the message's
        assert_eq!(o.count(t0, 0, &c).map(|(s, b, _)| (s, b.as_secs())), Some((1, 60)));
        o.note(Some("msg_1".into()), "again".into());
        assert_eq!(o.count(t0, 0, &c), None, "the same message is not a second failure");
        assert_eq!(o.deadline(), Some(t0 + Duration::from_secs(60)));
    }

    #[test]
    fn a_failure_counted_before_its_message_was_known_is_not_counted_again_by_the_message() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outage::default();
        o.note(None, "APIError 500".into()); // session.error of a message never seen
        assert!(o.count(t0, 0, &c).is_some());
        o.note(Some("msg_1".into()), "APIError 500".into()); // its message's error, trailing
        assert_eq!(o.count(t0, 0, &c), None);
        assert_eq!(o.failures(), 1);
        // The next turn's failure (after the resume) is a new one.
        o.sending("d".into());
        o.delivered(true, None);
        o.note(Some("msg_2".into()), "APIError 500".into());
        assert_eq!(o.count(t0, 0, &c).map(|(step, _, _)| step), Some(2));
    }

    #[test]
    fn after_fallback_after_failed_resumes_the_next_model_is_used_and_the_primary_after_the_cooldown() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outage::default();
        let mut models = Vec::new();
        let primary = ModelRef { provider_id: "fake".into(), model_id: "primary".into() };
        for i in 0..6 {
            o.note(Some(format!("msg_{i}")), "APIError 500".into());
            o.count(t0, 0, &c).unwrap();
            let r = o.resume(Some(&primary), 1_000, &c);
            models.push(r.model.map(|m| m.model_id).unwrap_or_else(|| "own".into()));
            o.sending(format!("d{i}"));
            o.delivered(true, None);
        }
        // Two failed resumes on the primary, then two on each fallback in turn.
        assert_eq!(models, ["own", "own", "backup", "backup", "second", "second"]);
        // An hour after the switch the primary is tried again.
        o.note(Some("msg_9".into()), "APIError 500".into());
        o.count(t0, 0, &c).unwrap();
        let r = o.resume(None, 1_000 + 3_600_000, &c);
        assert_eq!(r.model, Some(primary), "the session's own model, named: its last turn ran on the fallback");
        assert!(r.why_model.contains("fallback_cooldown"), "{}", r.why_model);
    }

    #[test]
    fn a_restored_resume_keeps_its_wall_clock_time_and_is_not_repeated() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outage::default();
        o.note(Some("msg_1".into()), "APIError 429".into());
        o.count(t0, 10_000, &c).unwrap();
        // Restarted 20 s later: 40 s left.
        let r = Outage::restore(o.memory(), t0, 30_000);
        assert_eq!(r.deadline(), Some(t0 + Duration::from_secs(40)));
        // Sent, then restarted: nothing is due.
        o.sending("d".into());
        o.delivered(true, None);
        let r = Outage::restore(o.memory(), t0, 30_000);
        assert_eq!(r.deadline(), None);
        assert_eq!(r.memory().resumed_step, 1);
    }

    #[test]
    fn progress_resets_the_count_and_reports_what_it_ended() {
        let (c, t0) = (cfg(), Instant::now());
        let mut o = Outage::default();
        o.note(Some("msg_1".into()), "x".into());
        o.count(t0, 0, &c).unwrap();
        o.on_progress();
        assert_eq!((o.failures(), o.deadline()), (0, None));
        assert_eq!(o.take_recovered(), Some(1));
        o.on_progress();
        assert_eq!(o.take_recovered(), None, "reported once");
    }
}
