//! `context`, `compaction` and `handoff`: the context window — what overflows it, when
//! to compact, when to hand a filling session over to a fresh one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

/// Reading a session's context size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Regular expressions over context-length error texts, with named groups `limit`
    /// (the window) and `used` (the size that overflowed), for exact counts.
    pub error_patterns: Vec<String>,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            error_patterns: vec![
                r"maximum context length is (?P<limit>\d+) tokens.*?resulted in (?P<used>\d+) tokens".to_string(),
                r"prompt is too long: (?P<used>\d+) tokens > (?P<limit>\d+) maximum".to_string(),
            ],
        }
    }
}

/// Compaction through `POST /session/{id}/summarize`. Thresholds are shares of the
/// model's context window and must rise strictly: `opportunistic < proactive <
/// handoff.soft < handoff.prepare < handoff.hard`, all below OpenCode's own
/// auto-compaction point (window − output limit).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    pub enabled: bool,
    /// Before a nudge or review to an idle session past this share (outside the
    /// cooldown), compact first; the prompt follows whatever the compaction gives.
    pub opportunistic: f64,
    /// Compact when the session goes idle past this share of its window.
    pub proactive: f64,
    /// At least this long between two compactions of one session.
    #[serde(with = "duration_str")]
    pub cooldown: Duration,
    /// A compaction not finished after this long is given up (and logged): Shepherd's
    /// own `POST /summarize`, and OpenCode's own compaction, counted from when it was
    /// first seen (summary text streaming meanwhile does not extend it), which is then
    /// treated as a stall: abort, continue.
    #[serde(with = "duration_str")]
    pub max_wait: Duration,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            opportunistic: 0.5,
            proactive: 0.7,
            cooldown: Duration::from_secs(5 * 60),
            max_wait: Duration::from_secs(3 * 60),
        }
    }
}

/// The hand-off ("rollover"): before a session's window fills, its work moves to a
/// fresh session that receives a continuation built from structured state. Thresholds
/// are shares of the window (see [`CompactionConfig`] for their order).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffConfig {
    /// Off: the thresholds still order compaction, and `hard` still gates prompts.
    pub enabled: bool,
    pub mode: HandoffMode,
    /// Past this share: one short note asks the model to keep its todos current.
    pub soft: f64,
    /// Past this share: hand off at the end of the current turn.
    pub prepare: f64,
    /// Past this share mid-turn: hand off after at most `drain`, aborting the turn if it
    /// has not ended. Follow-up prompts past it wait behind a compaction or hand-off.
    pub hard: f64,
    /// How long a turn past `hard` may go on before the hand-off aborts it.
    #[serde(with = "duration_str")]
    pub drain: Duration,
    /// The continuation's budget (≈ 4 characters a token); sections are trimmed by
    /// priority, never the objective or the resume protocol.
    pub max_continuation_tokens: u32,
    /// How many of the session's latest messages the continuation is built from.
    pub history_messages: u32,
    /// Ask the model itself (in a fork of the session) for objective, status,
    /// decisions and next steps.
    pub ask_model: bool,
    /// How long that question may take.
    #[serde(with = "duration_str")]
    pub question_timeout: Duration,
    /// The `noReply` note sent once past `soft`.
    pub soft_message: String,
    /// The question asked in the fork.
    pub question_message: String,
    /// The prompt that starts the fresh session's work after the continuation.
    pub resume_message: String,
    /// Regular expressions whose matches are replaced by `[REDACTED]` in every text
    /// Shepherd lets out (continuations, hand-off files, the advisor's prompt, journal
    /// reasons, status and API output, logs), *in addition to* the built-in secret
    /// shapes ([`crate::redact`]). A group named `secret` limits the replacement to it
    /// (`pin (?P<secret>\d{4})` keeps `pin `).
    pub redact_patterns: Vec<String>,
    /// `redact_patterns` replace the built-in shapes instead of adding to them (and an
    /// empty list then turns redaction off).
    pub redact_patterns_replace: bool,
}

/// What a hand-off does with the continuation.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HandoffMode {
    /// A new session in the same directory receives it; the old one is left untouched.
    Fresh,
    /// The same session is compacted and receives it.
    Compact,
    /// Persisted and reported; a person resumes it (`shepherd handoff --resume ID`).
    Manual,
}

impl HandoffMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HandoffMode::Fresh => "fresh",
            HandoffMode::Compact => "compact",
            HandoffMode::Manual => "manual",
        }
    }
}

impl Default for HandoffConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: HandoffMode::Fresh,
            soft: 0.75,
            prepare: 0.8,
            hard: 0.88,
            drain: Duration::from_secs(2 * 60),
            max_continuation_tokens: 6000,
            history_messages: 200,
            ask_model: true,
            question_timeout: Duration::from_secs(90),
            soft_message: "[Shepherd] Your context window is filling up ({percent}% used). Keep your todo list \
                           current and finish the step you are on cleanly: your work may soon continue in a \
                           fresh session that starts from your todos and a summary."
                .to_string(),
            question_message: "[Shepherd] Your work is about to move to a fresh session. In at most 300 words, \
                               for your successor: 1. OBJECTIVE - what the user wants. 2. STATUS - what is done \
                               and verified. 3. DECISIONS - choices made and why. 4. NEXT STEPS - what to do \
                               next, in order. Do not call tools."
                .to_string(),
            resume_message: "[Shepherd] You are continuing work handed over from session {previousSession}, \
                             whose context window was full. The message above is the continuation: the \
                             objective, todos, files and state. Re-read the files you need, re-create the \
                             open todos with your todo tool, and carry on with the next step. Do not redo \
                             finished work."
                .to_string(),
            redact_patterns: Vec::new(),
            redact_patterns_replace: false,
        }
    }
}

/// Checks `compaction.*`, `handoff.*` and `context.*`: the thresholds rise strictly
/// (opportunistic < proactive < soft < prepare < hard), and the patterns compile.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    if c.compaction.max_wait.is_zero() {
        return Err(bad("compaction.max_wait", "must be greater than zero (it bounds every compaction)"));
    }
    let shares = [
        ("compaction.opportunistic", c.compaction.opportunistic),
        ("compaction.proactive", c.compaction.proactive),
        ("handoff.soft", c.handoff.soft),
        ("handoff.prepare", c.handoff.prepare),
        ("handoff.hard", c.handoff.hard),
    ];
    for (i, (key, v)) in shares.iter().enumerate() {
        if !(v.is_finite() && *v > 0.0 && *v < 1.0) {
            return Err(bad(key, "must be a share of the window between 0 and 1"));
        }
        if i > 0 && *v <= shares[i - 1].1 {
            return Err(bad(key, &format!("must be above {} ({})", shares[i - 1].0, shares[i - 1].1)));
        }
    }
    let h = &c.handoff;
    if h.max_continuation_tokens < 500 {
        return Err(bad("handoff.max_continuation_tokens", "must be at least 500"));
    }
    if h.history_messages == 0 {
        return Err(bad("handoff.history_messages", "must be at least 1"));
    }
    if h.question_timeout.is_zero() {
        return Err(bad("handoff.question_timeout", "must be greater than zero"));
    }
    for (key, text) in [
        ("handoff.soft_message", &h.soft_message),
        ("handoff.question_message", &h.question_message),
        ("handoff.resume_message", &h.resume_message),
    ] {
        if text.trim().is_empty() {
            return Err(bad(key, "must not be empty"));
        }
    }
    if let Err(e) = crate::redact::Redactor::new(&h.redact_patterns, h.redact_patterns_replace) {
        let key = format!("handoff.redact_patterns[{}]", e.index);
        return Err(bad(&key, &format!("not a regular expression: {}", e.reason)));
    }
    for (i, p) in c.context.error_patterns.iter().enumerate() {
        if let Err(e) = regex::Regex::new(p) {
            return Err(bad(&format!("context.error_patterns[{i}]"), &format!("not a regular expression: {e}")));
        }
    }
    Ok(())
}
