//! `recovery`: the stall and its recovery — timeouts, attempts, back-off, prompts, provider outages.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};
use crate::event::ModelRef;

/// Stall detection and recovery (abort + continue).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// A busy session with no progress for this long is stalled.
    #[serde(with = "duration_str")]
    pub stall_timeout: Duration,
    /// While a tool part is `running`, the stall timeout is multiplied by this.
    pub tool_grace_factor: f64,
    /// Pause between the session reaching idle after our abort and our continue.
    #[serde(with = "duration_str")]
    pub wait_after_abort: Duration,
    /// How often to read `/session/status` while waiting for the abort to land, until
    /// the session's own events show it idle (they usually do within ~100 ms, and then
    /// no read is made).
    #[serde(with = "duration_str")]
    pub abort_poll_interval: Duration,
    /// Give up waiting for idle after an abort after this long (the continue is then
    /// still sent: OpenCode queues prompts to busy sessions).
    #[serde(with = "duration_str")]
    pub abort_poll_max: Duration,
    /// Consecutive recoveries before backing off.
    pub max_recoveries: u32,
    /// First back-off delay once `max_recoveries` is exceeded; doubles per attempt.
    #[serde(with = "duration_str")]
    pub cooldown: Duration,
    /// Upper bound of the back-off delay.
    #[serde(with = "duration_str")]
    pub max_backoff: Duration,
    /// Continues sent without real progress before Shepherd gives up on a session.
    pub max_auto_submits: u32,
    /// A stalled session with no real progress (a finished step, a completed tool, a
    /// changed todo list, a real user message) for this long is abandoned: given up, not
    /// recovered. Counted from the last progress, or from when Shepherd first saw the
    /// session (or last regained sight of it after a stream outage) if that is later —
    /// never from its creation, so an agent that works for hours and then stalls is
    /// recovered. (The name is kept for existing configurations.)
    #[serde(with = "duration_str")]
    pub max_session_age: Duration,
    /// Continue prompt for a session without open todos. Variables: `{attempts}`,
    /// `{maxAttempts}`.
    pub continue_message: String,
    /// Continue prompt for a session with open todos. Variables: `{pending}`, `{total}`,
    /// `{completed}`, `{todoList}` (at most five open items), `{attempts}`, `{maxAttempts}`.
    pub continue_with_todos_message: String,
    /// Scan the recent assistant messages for tool calls written as text before a
    /// continue or a nudge, and send `tool_call_as_text_message` when one is found.
    pub detect_tool_calls_as_text: bool,
    /// How many recent messages the scan reads.
    pub tool_call_scan_messages: u32,
    /// How many of a session's latest messages are read to see whether the prompt of
    /// an action left unfinished by a crash (an intent in the ledger) arrived.
    pub verify_messages: u32,
    /// Sent instead of the continue (or nudge) when the model wrote a tool call as
    /// text. Variables as for `continue_with_todos_message`, plus `{pattern}` (what
    /// was found).
    pub tool_call_as_text_message: String,
    /// The stall timeout of a session that is planning (agent `plan`, or its latest
    /// text announces a plan): thinking out a plan is slow and quiet.
    #[serde(with = "duration_str")]
    pub planning_timeout: Duration,
    /// Continue prompt for a planning session. Variables as for
    /// `continue_with_todos_message`.
    pub continue_with_plan_message: String,
    /// This many continues within `repeated_continue_window` without real progress:
    /// another continue will not help, escalate (compact; hand off once hand-off exists).
    pub repeated_continue_count: u32,
    #[serde(with = "duration_str")]
    pub repeated_continue_window: Duration,
    /// Resume a session whose turn ended on a provider error (5xx, 429, overloaded,
    /// timeouts, after OpenCode's own retries) and that has work left.
    pub resume_after_provider_error: bool,
    /// First wait before such a resume; doubles per consecutive failure.
    #[serde(with = "duration_str")]
    pub provider_backoff: Duration,
    /// Upper bound of that wait.
    #[serde(with = "duration_str")]
    pub provider_max_backoff: Duration,
    /// The resume prompt. Variables: `{attempts}` (the step), `{maxAttempts}`.
    pub provider_resume_message: String,
    /// The resume prompt for a session with open todos. Variables as for
    /// `continue_with_todos_message`.
    pub provider_resume_with_todos_message: String,
    /// `provider/model` pairs to resume on once the session's own model failed
    /// `fallback_after` resumes in a row (each in turn); empty: none.
    pub fallback_models: Vec<String>,
    pub fallback_after: u32,
    /// Back to the session's own model this long after switching to a fallback.
    #[serde(with = "duration_str")]
    pub fallback_cooldown: Duration,
    /// The server's circuit breaker opens when this many sessions failed on provider
    /// errors within `breaker_window`: one session probes, the others wait for it.
    pub breaker_sessions: u32,
    #[serde(with = "duration_str")]
    pub breaker_window: Duration,
    /// A probe that has not answered within this long is replaced by another session.
    #[serde(with = "duration_str")]
    pub breaker_probe_timeout: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            stall_timeout: Duration::from_secs(180),
            tool_grace_factor: 4.0,
            wait_after_abort: Duration::from_millis(1500),
            abort_poll_interval: Duration::from_millis(200),
            abort_poll_max: Duration::from_secs(5),
            max_recoveries: 3,
            cooldown: Duration::from_secs(60),
            max_backoff: Duration::from_secs(30 * 60),
            max_auto_submits: 3,
            max_session_age: Duration::from_secs(2 * 60 * 60),
            continue_message: "Your previous response stalled and was interrupted by the \
                supervisor (attempt {attempts} of {maxAttempts}). Please continue where you \
                left off."
                .to_string(),
            continue_with_todos_message: "Your previous response stalled and was interrupted \
                by the supervisor (attempt {attempts} of {maxAttempts}). You have {pending} \
                open of {total} todos ({completed} done):\n{todoList}\nPlease continue \
                working on them."
                .to_string(),
            detect_tool_calls_as_text: true,
            tool_call_scan_messages: 20,
            verify_messages: 50,
            tool_call_as_text_message: "Your previous response wrote a tool call as text ({pattern}) instead \
                of calling the tool, so nothing was executed. Make that call again through the \
                proper tool-calling mechanism (a real tool call, not text in your reply), then \
                continue with the task."
                .to_string(),
            planning_timeout: Duration::from_secs(5 * 60),
            continue_with_plan_message: "Your previous response stalled while planning and was \
                interrupted by the supervisor (attempt {attempts} of {maxAttempts}). Finish the \
                plan, then start carrying it out."
                .to_string(),
            repeated_continue_count: 3,
            repeated_continue_window: Duration::from_secs(10 * 60),
            resume_after_provider_error: true,
            provider_backoff: Duration::from_secs(60),
            provider_max_backoff: Duration::from_secs(30 * 60),
            provider_resume_message: "Your previous turn was cut short by an error of the model provider \
                (resume {attempts}). The provider answers again: please continue where you left off."
                .to_string(),
            provider_resume_with_todos_message: "Your previous turn was cut short by an error of the model \
                provider (resume {attempts}). You have {pending} open of {total} todos ({completed} \
                done):\n{todoList}\nPlease continue working on them."
                .to_string(),
            fallback_models: Vec::new(),
            fallback_after: 2,
            fallback_cooldown: Duration::from_secs(30 * 60),
            breaker_sessions: 3,
            breaker_window: Duration::from_secs(2 * 60),
            breaker_probe_timeout: Duration::from_secs(5 * 60),
        }
    }
}

/// `provider/model` pairs of `recovery.fallback_models` (validated at start-up).
pub fn parse_model(key: &str) -> Option<ModelRef> {
    let (provider, model) = key.split_once('/')?;
    (!provider.trim().is_empty() && !model.trim().is_empty())
        .then(|| ModelRef { provider_id: provider.trim().to_string(), model_id: model.trim().to_string() })
}

/// Checks `recovery.*`: ranges, and the relations between its durations.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    let r = &c.recovery;
    if r.stall_timeout.is_zero() {
        return Err(bad("recovery.stall_timeout", "must be greater than zero"));
    }
    if !(r.tool_grace_factor.is_finite() && r.tool_grace_factor >= 1.0) {
        return Err(bad("recovery.tool_grace_factor", "must be a number >= 1"));
    }
    if r.abort_poll_interval.is_zero() {
        return Err(bad("recovery.abort_poll_interval", "must be greater than zero"));
    }
    if r.abort_poll_max < r.abort_poll_interval {
        return Err(bad("recovery.abort_poll_max", "must be at least abort_poll_interval"));
    }
    if r.max_backoff < r.cooldown {
        return Err(bad("recovery.max_backoff", "must be at least recovery.cooldown"));
    }
    if r.max_auto_submits == 0 {
        return Err(bad("recovery.max_auto_submits", "must be at least 1"));
    }
    if r.continue_message.trim().is_empty() {
        return Err(bad("recovery.continue_message", "must not be empty"));
    }
    if r.continue_with_todos_message.trim().is_empty() {
        return Err(bad("recovery.continue_with_todos_message", "must not be empty"));
    }
    if r.detect_tool_calls_as_text && r.tool_call_as_text_message.trim().is_empty() {
        return Err(bad("recovery.tool_call_as_text_message", "must not be empty"));
    }
    if r.tool_call_scan_messages == 0 {
        return Err(bad("recovery.tool_call_scan_messages", "must be at least 1"));
    }
    if r.verify_messages == 0 {
        return Err(bad("recovery.verify_messages", "must be at least 1"));
    }
    if r.planning_timeout.is_zero() {
        return Err(bad("recovery.planning_timeout", "must be greater than zero"));
    }
    if r.continue_with_plan_message.trim().is_empty() {
        return Err(bad("recovery.continue_with_plan_message", "must not be empty"));
    }
    if r.repeated_continue_count < 2 {
        return Err(bad("recovery.repeated_continue_count", "must be at least 2"));
    }
    if r.repeated_continue_window.is_zero() {
        return Err(bad("recovery.repeated_continue_window", "must be greater than zero"));
    }
    if r.provider_backoff.is_zero() {
        return Err(bad("recovery.provider_backoff", "must be greater than zero"));
    }
    if r.provider_max_backoff < r.provider_backoff {
        return Err(bad("recovery.provider_max_backoff", "must be at least recovery.provider_backoff"));
    }
    for (key, text) in [
        ("recovery.provider_resume_message", &r.provider_resume_message),
        ("recovery.provider_resume_with_todos_message", &r.provider_resume_with_todos_message),
    ] {
        if r.resume_after_provider_error && text.trim().is_empty() {
            return Err(bad(key, "must not be empty"));
        }
    }
    for (i, m) in r.fallback_models.iter().enumerate() {
        if parse_model(m).is_none() {
            return Err(bad(
                &format!("recovery.fallback_models[{i}]"),
                "must be provider/model, e.g. \"anthropic/claude-sonnet-4\"",
            ));
        }
    }
    if r.fallback_after == 0 {
        return Err(bad("recovery.fallback_after", "must be at least 1"));
    }
    if r.breaker_sessions == 0 {
        return Err(bad("recovery.breaker_sessions", "must be at least 1"));
    }
    if r.breaker_window.is_zero() {
        return Err(bad("recovery.breaker_window", "must be greater than zero"));
    }
    if r.breaker_probe_timeout.is_zero() {
        return Err(bad("recovery.breaker_probe_timeout", "must be greater than zero"));
    }
    if r.max_session_age < r.stall_timeout {
        return Err(bad("recovery.max_session_age", "must be at least recovery.stall_timeout"));
    }
    Ok(())
}
