//! `advisor`: advice before an abort or a nudge (the heuristics, and a model if named).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

/// The advisor: a model that advises before an abort or a nudge ("the model advises,
/// rules decide"), with a heuristic fallback that is always there. On by default with
/// heuristics only; a model is asked only once `base_url` and `model` are set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdvisorConfig {
    /// Seek advice before a stall recovery's abort and before a nudge. On by default:
    /// without a model (`base_url` empty) the heuristic rules advise, in place. Off:
    /// neither decision is ever held back (no advice, not even the heuristics').
    pub enabled: bool,
    /// OpenAI-compatible API root (`POST {base_url}/chat/completions`), e.g.
    /// `https://api.openai.com/v1`. Empty (the default): the model advisor is disabled
    /// and the heuristics advise; no model is ever called.
    pub base_url: String,
    /// The model id sent in the request.
    pub model: String,
    /// NAME of the environment variable holding the API key (never the key itself, so
    /// config files can be shared and printed). Empty: no `Authorization` header.
    pub api_key_env: String,
    /// One model call, start to answer; past it the heuristic decides. A consultation
    /// also waits at most this long for a free slot (`max_concurrent`), so advice takes
    /// at most twice this.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    pub max_tokens: u32,
    pub temperature: f64,
    /// Advice `wait` at least this confident postpones an abort once, and skips a nudge.
    pub wait_confidence: f64,
    /// Advice `abort` at least this confident skips a nudge.
    pub abort_confidence: f64,
    /// How long a postponed abort waits (once per stall), and how long after a skipped
    /// nudge the nudge is considered again (once per idle spell, then without asking).
    #[serde(with = "duration_str")]
    pub postpone: Duration,
    /// Model calls under way at once, across all sessions; further consultations queue.
    pub max_concurrent: usize,
    /// How long an answer is reused for the same session in the same state.
    #[serde(with = "duration_str")]
    pub cache_ttl: Duration,
    /// A heuristic at least this confident is an obvious case: the model is not called.
    pub obvious_confidence: f64,
    /// Heuristic: a session younger than this is new (advice `wait`).
    #[serde(with = "duration_str")]
    pub new_session: Duration,
    /// Heuristic: planning (reasoning, or the `plan` agent) quiet for longer → `abort`.
    #[serde(with = "duration_str")]
    pub planning_limit: Duration,
    /// Heuristic: past this share of the window, `continue` (open todos) or `compact`.
    pub context_share: f64,
    /// How many of the session's latest messages the model is shown.
    pub history_messages: u32,
    /// The largest answer read from the model, bytes; a longer one is refused (the
    /// heuristic decides instead).
    pub max_response_bytes: usize,
}

impl Default for AdvisorConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            timeout: Duration::from_secs(5),
            max_tokens: 500,
            temperature: 0.1,
            wait_confidence: 0.7,
            abort_confidence: 0.6,
            postpone: Duration::from_secs(60),
            max_concurrent: 4,
            cache_ttl: Duration::from_secs(300),
            obvious_confidence: 0.9,
            new_session: Duration::from_secs(30),
            planning_limit: Duration::from_secs(60),
            context_share: 0.8,
            history_messages: 3,
            max_response_bytes: 1024 * 1024,
        }
    }
}

/// Checks `advisor.*`: confidences and shares in range, a model named when a URL is.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    let a = &c.advisor;
    for (key, v) in [
        ("advisor.temperature", a.temperature),
        ("advisor.wait_confidence", a.wait_confidence),
        ("advisor.abort_confidence", a.abort_confidence),
        ("advisor.obvious_confidence", a.obvious_confidence),
        ("advisor.context_share", a.context_share),
    ] {
        let max = if key == "advisor.temperature" { 2.0 } else { 1.0 };
        if !(v.is_finite() && (0.0..=max).contains(&v)) {
            return Err(bad(key, &format!("must be a number between 0 and {max}")));
        }
    }
    if a.timeout.is_zero() {
        return Err(bad("advisor.timeout", "must be greater than zero"));
    }
    if a.max_tokens == 0 {
        return Err(bad("advisor.max_tokens", "must be at least 1"));
    }
    if a.max_response_bytes < 4096 {
        return Err(bad("advisor.max_response_bytes", "must be at least 4096"));
    }
    if a.max_concurrent == 0 {
        return Err(bad("advisor.max_concurrent", "must be at least 1"));
    }
    if a.postpone.is_zero() || a.postpone > Duration::from_secs(3600) {
        return Err(bad("advisor.postpone", "must be between 1ms and 1h (a postponed abort is bounded)"));
    }
    if a.history_messages == 0 || a.history_messages > 50 {
        return Err(bad("advisor.history_messages", "must be between 1 and 50"));
    }
    if !a.base_url.is_empty() {
        if !(a.base_url.starts_with("http://") || a.base_url.starts_with("https://")) {
            return Err(bad("advisor.base_url", "must start with http:// or https:// (or be empty: heuristics only)"));
        }
        if a.model.trim().is_empty() {
            return Err(bad("advisor.model", "must name a model when advisor.base_url is set"));
        }
    }
    Ok(())
}
