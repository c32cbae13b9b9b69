//! The guard: every prompt Shepherd sends passes it — one prompt per decision, and
//! never a flood.
//!
//! - [`similarity`]: are two prompts the same request in other words? (pure)
//! - [`dedupe`]: what reached each session lately, and the verdict on a new prompt (pure)
//! - [`actor`]: the global guard actor — dedupe memory, `governor` rate limits, and the
//!   [`Shared`] store other instances see (Redis: fingerprints, the global limit, leases)
//!
//! The decision path calls the guard through the [`PromptGuard`] port: `delivery`
//! before every nudge, review, continue and custom prompt, `handover` before the hand-off's
//! notes. Over a rate limit every prompt waits its turn (bounded by `guard.max_wait`);
//! then a continue, a person's prompt or a hand-off prompt goes anyway, and a nudge,
//! review or note is deferred with a retry time — never dropped. With a shared store a
//! prompt is admitted under the session's lease (its fencing token), which is renewed
//! while it waits and checked right before the send ([`PromptGuard::fence`]).
//! Fail open: when the session's history cannot be read, or the shared store is
//! unreachable, the prompt is judged on what this instance knows (with a local stand-in
//! for the fleet-wide limit), and that is logged.

pub mod actor;

use async_trait::async_trait;

pub use actor::{GuardActor, GuardHandle};
pub use shepherd_core::guard::{dedupe, similarity, GuardRequest};

/// The guard's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Send it (`waited_ms`: held back by a rate limit this long first), under this
    /// lease (its fencing token; `None` without a shared store or with it unreachable).
    Send { waited_ms: u64, lease: Option<u64> },
    /// A similar prompt reached the session within the window: do not send.
    Duplicate { similarity: f64, of: String },
    /// Still over a rate limit (`scope`: `session` or `global`) after waiting
    /// `guard.max_wait`: deferred, not dropped — the decision tries again in
    /// `retry_after_ms` (the limiter's estimate). Only nudges, reviews and notes: a
    /// continue, a person's prompt and a hand-off prompt go out after `max_wait`.
    RateLimited { scope: &'static str, retry_after_ms: u64 },
    /// Another Shepherd instance holds this session's lease: it acts, this one does not.
    NotOurs { holder: String },
}

impl Verdict {
    /// The lease a prompt to send was admitted under.
    pub fn lease(&self) -> Option<u64> {
        match self {
            Verdict::Send { lease, .. } => *lease,
            _ => None,
        }
    }

    /// Why the prompt was not sent, for the journal.
    pub fn reason(&self) -> Option<String> {
        match self {
            Verdict::Send { .. } => None,
            Verdict::Duplicate { similarity, of } => Some(format!(
                "a similar prompt ({of}, similarity {similarity:.2}) reached the session within guard.window"
            )),
            Verdict::RateLimited { scope, retry_after_ms } => Some(format!(
                "over the {scope} rate limit (guard) after waiting guard.max_wait: deferred, tried again in {retry_after_ms} ms"
            )),
            Verdict::NotOurs { holder } => Some(format!("another Shepherd instance ({holder}) acts for this session")),
        }
    }
}

/// The port the decision path calls before sending a prompt.
#[async_trait]
pub trait PromptGuard: Send + Sync + 'static {
    /// May this prompt go out now? Over a rate limit it waits its turn (bounded by
    /// `guard.max_wait`).
    async fn admit(&self, req: &GuardRequest) -> Verdict;
    /// The admitted prompt could not be sent after all: forget it (a retry is no duplicate).
    async fn forget(&self, server: &str, session: &str, text: &str, not_before_ms: Option<i64>);
    /// May this instance act on the session (abort it)? Takes or renews its lease:
    /// `Ok(token)` with the lease's fencing token (`None` without a shared store, or
    /// with it unreachable: fail open), `Err(holder)` when another instance holds it.
    async fn may_act(&self, server: &str, session: &str) -> Result<Option<u64>, String>;
    /// Is the lease taken with `token` still ours? Renews it if so. Checked right
    /// before every send and while an action waits: `Err(holder)` once another instance
    /// holds the lease or it lapsed — the action must not go on. `Ok` without a token.
    async fn fence(&self, server: &str, session: &str, token: Option<u64>) -> Result<(), String>;
    /// How often an action that holds a lease renews it while it waits (`None`: no
    /// shared store, nothing to renew).
    fn renew_every(&self) -> Option<std::time::Duration>;
    /// How many of the session's latest messages to compare with (0: none).
    fn history_messages(&self) -> u32;
}

/// No guard: everything is sent (tests of other parts, `guard.enabled = false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGuard;

#[async_trait]
impl PromptGuard for NoGuard {
    async fn admit(&self, _: &GuardRequest) -> Verdict {
        Verdict::Send { waited_ms: 0, lease: None }
    }
    async fn forget(&self, _: &str, _: &str, _: &str, _: Option<i64>) {}
    async fn may_act(&self, _: &str, _: &str) -> Result<Option<u64>, String> {
        Ok(None)
    }
    async fn fence(&self, _: &str, _: &str, _: Option<u64>) -> Result<(), String> {
        Ok(())
    }
    fn renew_every(&self) -> Option<std::time::Duration> {
        None
    }
    fn history_messages(&self) -> u32 {
        0
    }
}

/// What instances share (the `redis` backend implements it in the binary).
#[async_trait]
pub trait Shared: Send + Sync + 'static {
    /// Claims a prompt fingerprint for `ttl_ms`: false if another instance claimed the
    /// same prompt for the session within the window (this instance's own earlier claim
    /// is no obstacle: whether its new decision repeats its old one, its memory judged).
    async fn claim_fingerprint(
        &self,
        server: &str,
        session: &str,
        fingerprint: u64,
        ttl_ms: u64,
    ) -> Result<bool, String>;
    /// Releases a claim (the send failed).
    async fn release_fingerprint(&self, server: &str, session: &str, fingerprint: u64) -> Result<(), String>;
    /// One permit of the fleet-wide limit of `per_minute` (with `burst`): `Ok(None)`
    /// granted, `Ok(Some(ms))` denied, retry in `ms`.
    async fn global_permit(&self, per_minute: u32, burst: u32) -> Result<Option<u64>, String>;
    /// Takes or renews this instance's lease on the session for `ttl_ms`. A lease taken
    /// afresh gets a new fencing token, higher than every earlier one; a renewal keeps it.
    async fn lease(&self, server: &str, session: &str, ttl_ms: u64) -> Result<Lease, String>;
    /// Renews the lease only if it is still the one taken with `token`: `Ok(None)`
    /// renewed, `Ok(Some(holder))` not ours any more (another instance's, or lapsed).
    async fn renew(&self, server: &str, session: &str, token: u64, ttl_ms: u64) -> Result<Option<String>, String>;
}

/// A session's lease as the shared store answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This instance holds it, under this fencing token.
    Ours { token: u64 },
    /// Another instance holds it.
    Theirs { holder: String },
}
