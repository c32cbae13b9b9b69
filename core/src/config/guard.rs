//! `guard`: duplicate prompts and rate limits, and the shared store of several instances.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

/// The guard every prompt passes: one prompt per decision (dedupe by similarity) and
/// rate limits, shared across Shepherd instances with the `redis` backend.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    pub enabled: bool,
    /// A prompt similar to one that reached the session within this long is dropped.
    #[serde(with = "duration_str")]
    pub window: Duration,
    /// Word-shingle Jaccard similarity at or above which two prompts are "the same".
    pub similarity: f64,
    /// Words per shingle (1 = single words).
    pub shingle_words: usize,
    /// How many of the session's latest messages are compared too (other instances',
    /// other tools' and the person's prompts).
    pub history_messages: u32,
    /// Prompts per minute to one session, and to all sessions of this instance (or of
    /// every instance sharing the `redis` backend).
    pub session_per_minute: u32,
    pub global_per_minute: u32,
    /// How many prompts may go out at once before the per-minute pace applies.
    pub session_burst: u32,
    pub global_burst: u32,
    /// How long a prompt over the limit waits for its turn. A continue, a person's
    /// prompt or a hand-off prompt is sent then whatever the limiter says, so a session
    /// is never stranded; a nudge or review still over the limit is deferred (its
    /// decision comes back when the limiter has room), never dropped.
    #[serde(with = "duration_str")]
    pub max_wait: Duration,
    pub backend: GuardBackend,
    /// `redis://host:port/db`; a password in it is masked in `config check`.
    pub redis_url: String,
    /// Keys are `PREFIX:…`, so instances of one fleet share them and others do not.
    pub key_prefix: String,
    /// One instance acts for a session at a time; another takes over within this long
    /// when the holder dies. An action that waits renews it every third of this; with
    /// `max_wait` as long or longer it must be at least 3 s.
    #[serde(with = "duration_str")]
    pub lease_ttl: Duration,
    /// With the `redis` backend and Redis unreachable, this instance's own limit in
    /// place of the fleet-wide one (its share of `global_per_minute`, `global_burst`).
    pub fallback_per_minute: u32,
    pub fallback_burst: u32,
}

/// Where the guard keeps what instances share.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GuardBackend {
    /// This instance only.
    Memory,
    /// Fingerprints, the global rate limit and session leases in Redis.
    Redis,
}

/// The shortest `guard.lease_ttl` a waiting prompt can keep by renewing it (every third
/// of it: one renewal a second at least).
pub const MIN_RENEWED_LEASE_TTL: Duration = Duration::from_secs(3);

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_secs(30),
            similarity: 0.6,
            shingle_words: 1,
            history_messages: 10,
            session_per_minute: 6,
            global_per_minute: 120,
            session_burst: 3,
            global_burst: 20,
            max_wait: Duration::from_secs(120),
            backend: GuardBackend::Memory,
            redis_url: "redis://127.0.0.1:6379/0".to_string(),
            key_prefix: "shepherd".to_string(),
            lease_ttl: Duration::from_secs(30),
            fallback_per_minute: 60,
            fallback_burst: 10,
        }
    }
}

/// Checks `guard.*` (with the Redis backend: its URL and a lease long enough to renew).
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    let g = &c.guard;
    if !(g.similarity.is_finite() && g.similarity > 0.0 && g.similarity <= 1.0) {
        return Err(bad("guard.similarity", "must be a number in (0, 1]"));
    }
    if g.shingle_words == 0 || g.shingle_words > 5 {
        return Err(bad("guard.shingle_words", "must be between 1 and 5"));
    }
    if g.session_per_minute == 0 {
        return Err(bad("guard.session_per_minute", "must be at least 1"));
    }
    if g.global_per_minute == 0 {
        return Err(bad("guard.global_per_minute", "must be at least 1"));
    }
    if g.session_burst == 0 {
        return Err(bad("guard.session_burst", "must be at least 1"));
    }
    if g.global_burst == 0 {
        return Err(bad("guard.global_burst", "must be at least 1"));
    }
    if g.backend == GuardBackend::Redis {
        if !(g.redis_url.starts_with("redis://") || g.redis_url.starts_with("rediss://")) {
            return Err(bad("guard.redis_url", "must start with redis:// or rediss://"));
        }
        if g.lease_ttl < Duration::from_secs(1) {
            return Err(bad("guard.lease_ttl", "must be at least 1s"));
        }
        if g.key_prefix.trim().is_empty() {
            return Err(bad("guard.key_prefix", "must not be empty"));
        }
        // A prompt that waits longer than the lease lives keeps it by renewing it
        // every third of `lease_ttl`: each renewal is a Redis round trip that must
        // land before the lease lapses, so the lease must leave room for it.
        if g.max_wait >= g.lease_ttl && g.lease_ttl < MIN_RENEWED_LEASE_TTL {
            return Err(bad(
                "guard.lease_ttl",
                &format!(
                    "must be at least {}s when guard.max_wait ({}s) is as long or longer: a waiting prompt renews the session's lease every third of lease_ttl",
                    MIN_RENEWED_LEASE_TTL.as_secs(),
                    g.max_wait.as_secs_f64()
                ),
            ));
        }
        if g.fallback_per_minute == 0 {
            return Err(bad("guard.fallback_per_minute", "must be at least 1"));
        }
        if g.fallback_burst == 0 {
            return Err(bad("guard.fallback_burst", "must be at least 1"));
        }
    }
    Ok(())
}
