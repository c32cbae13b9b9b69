//! The guard's decisions: is this prompt a repeat of what reached the session lately?
//!
//! - [`similarity`]: are two prompts the same request in other words?
//! - [`dedupe`]: what reached each session lately, and the verdict on a new prompt
//!
//! The guard actor (rate limits, the shared store, leases) is `shepherd-actors::guard`.

pub mod dedupe;
pub mod similarity;

use crate::session::effect::PromptKind;

/// A prompt about to be sent.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardRequest {
    pub server: String,
    pub session: String,
    pub kind: PromptKind,
    pub text: String,
    /// The decision this prompt carries out (`metadata.shepherd.decision`). Shepherd's
    /// own new decision is never a duplicate of its previous, different one; the same
    /// decision twice is.
    pub decision: String,
    /// The session's lease the caller already holds (its fencing token): a recovery
    /// took it before its abort. `None`: the guard takes it.
    pub lease: Option<u64>,
    /// The session's recent user messages `(created_ms, text)`; `None` when they could
    /// not be read (fail open: judged on this instance's memory only).
    pub recent: Option<Vec<(i64, String)>>,
    /// Prompts before this moment (epoch ms) do not count: a continue after Shepherd's
    /// own abort is not a duplicate of what was sent before the abort.
    pub not_before_ms: Option<i64>,
}
