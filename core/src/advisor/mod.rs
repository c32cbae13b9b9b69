//! The advisor: "the model advises, rules decide".
//!
//! Before a stall recovery's abort and before a nudge, the session core may ask for
//! advice. An answer is an [`Advice`] — one of wait / abort / continue / compact /
//! handoff with a confidence — and the core alone decides what to do with it (postpone
//! the abort once, skip the nudge, or go ahead). Nothing here acts on a session.
//!
//! - [`heuristic`]: the rules that always answer (used when no model is configured, when
//!   the model times out, errors or answers garbage, and to recognise obvious cases).
//! - [`reply`]: parsing the model's answer (`@ACTION:CONFIDENCE`, or a parse failure).
//! - [`prompt`]: the chat request built from the session's [`Situation`].
//! - [`gate`]: the core's memory of advice (pending, postponed once, stall part types).
//!
//! All pure; the actix shell (cache, bounded concurrency, timeout, fallback, logging) is
//! `shepherd-actors::advisor::actor`.

pub mod gate;
pub mod heuristic;
pub mod prompt;
pub mod reply;

use std::time::Duration;

use serde::Serialize;

use crate::event::Todo;

/// What the advisor recommends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdviceAction {
    Wait,
    Abort,
    Continue,
    Compact,
    Handoff,
}

impl AdviceAction {
    pub const ALL: [AdviceAction; 5] =
        [AdviceAction::Wait, AdviceAction::Abort, AdviceAction::Continue, AdviceAction::Compact, AdviceAction::Handoff];

    pub fn as_str(self) -> &'static str {
        match self {
            AdviceAction::Wait => "wait",
            AdviceAction::Abort => "abort",
            AdviceAction::Continue => "continue",
            AdviceAction::Compact => "compact",
            AdviceAction::Handoff => "handoff",
        }
    }
}

/// One piece of advice: an action and how sure its source is (0..=1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Advice {
    pub action: AdviceAction,
    pub confidence: f64,
}

impl std::fmt::Display for Advice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{:.2}", self.action.as_str(), self.confidence)
    }
}

/// Where a piece of advice came from — journalled with every consultation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The model answered and the answer parsed.
    Model,
    /// The same session in the same state was answered within `cache_ttl`.
    Cached,
    /// The heuristic was sure enough (`obvious_confidence`): no model call.
    Obvious,
    /// No model is configured (`advisor.base_url` empty): heuristics only.
    NoModel,
    /// The model was asked and failed; the heuristic decided. The text says why
    /// (timeout, HTTP status, unparsable answer) and never carries a secret.
    Fallback(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Model => f.write_str("model"),
            Source::Cached => f.write_str("cached"),
            Source::Obvious => f.write_str("heuristic (obvious)"),
            Source::NoModel => f.write_str("heuristic (no model configured)"),
            Source::Fallback(why) => write!(f, "heuristic (fallback: {why})"),
        }
    }
}

/// A consultation's answer: the advice, where it came from, and which rule (for a
/// heuristic answer) or the model's own words (trimmed) explain it.
#[derive(Debug, Clone, PartialEq)]
pub struct Consulted {
    pub advice: Advice,
    pub source: Source,
    pub why: String,
}

/// The decision the advice is sought for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum About {
    /// A stalled busy session is about to be aborted (and continued).
    Abort,
    /// An idle session with open todos is about to be nudged.
    Nudge,
}

impl About {
    pub fn as_str(self) -> &'static str {
        match self {
            About::Abort => "abort",
            About::Nudge => "nudge",
        }
    }
}

/// What the core knows about the session when it asks: the facts the heuristic reads
/// and the model is shown (the latest messages are read by the actor, if needed).
#[derive(Debug, Clone, PartialEq)]
pub struct Situation {
    pub about: About,
    /// Since the session was created, when known.
    pub session_age: Option<Duration>,
    /// Since the last activity of the session (events that were not Shepherd's).
    pub since_activity: Duration,
    pub todos: Vec<Todo>,
    pub context_tokens: Option<u64>,
    pub context_window: Option<u64>,
    /// Recovery attempts since the last real progress.
    pub attempts: u32,
    /// The type of the part the session was last working on (`text`, `reasoning`,
    /// `tool:bash`, …).
    pub part: Option<String>,
    /// The part types of earlier stalls of this session, oldest first.
    pub recent_stall_parts: Vec<String>,
    /// The agent of the session's last turn (`build`, `plan`, …).
    pub agent: Option<String>,
}

/// The share of the context window a prompt of `tokens` takes, when both numbers are
/// known: the one formula behind the advisor's situation, the core's compaction and
/// hand-off thresholds and the share a session's detail shows.
pub fn context_share(tokens: Option<u64>, window: Option<u64>) -> Option<f64> {
    match (tokens, window) {
        (Some(t), Some(w)) if w > 0 => Some(t as f64 / w as f64),
        _ => None,
    }
}

impl Situation {
    pub fn open_todos(&self) -> usize {
        self.todos.iter().filter(|t| t.status.is_open()).count()
    }

    pub fn context_share(&self) -> Option<f64> {
        context_share(self.context_tokens, self.context_window)
    }

    /// Identifies the state for the cache: what would change the advice, not the
    /// clock (time is bounded by `cache_ttl` instead).
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = crate::fingerprint::hasher();
        self.about.hash(&mut h);
        for t in &self.todos {
            t.content.hash(&mut h);
            t.status.is_open().hash(&mut h);
        }
        // Context in whole percent: a few tokens more is the same state.
        self.context_share().map(|s| (s * 100.0) as u32).hash(&mut h);
        self.attempts.hash(&mut h);
        self.part.hash(&mut h);
        self.recent_stall_parts.hash(&mut h);
        self.agent.hash(&mut h);
        h.finish()
    }
}
