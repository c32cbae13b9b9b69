//! The guard's edge: the shared store instances coordinate through (Redis), and the
//! choice of backend from `[guard]`.

pub mod redis;

use std::sync::Arc;

use shepherd_actors::config::{GuardBackend, GuardConfig};
use shepherd_actors::guard::{GuardHandle, NoGuard, PromptGuard, Shared};
use shepherd_actors::ports::Clock;

/// The guard the daemon's prompts pass: the guard actor (started on the current
/// arbiter) with Redis as the shared store when configured; `None` when disabled (every
/// prompt goes: [`NoGuard`], see [`as_port`]). The handle is kept to retune it on reload.
pub fn start(cfg: &GuardConfig, clock: Arc<dyn Clock>, instance: &str) -> anyhow::Result<Option<GuardHandle>> {
    if !cfg.enabled {
        tracing::info!("guard disabled: prompts are neither deduplicated nor rate-limited");
        return Ok(None);
    }
    let shared: Option<Arc<dyn Shared>> = match cfg.backend {
        GuardBackend::Memory => None,
        GuardBackend::Redis => {
            let store = redis::RedisShared::new(&cfg.redis_url, &cfg.key_prefix, instance)?;
            tracing::info!(redis = %redis::display_url(&cfg.redis_url), prefix = %cfg.key_prefix, "guard shares fingerprints, the global limit and session leases through Redis");
            Some(Arc::new(store))
        }
    };
    Ok(Some(GuardHandle::start(cfg.clone(), clock, shared)))
}

/// The [`PromptGuard`] port over a started guard, or [`NoGuard`].
pub fn as_port(guard: &Option<GuardHandle>) -> Arc<dyn PromptGuard> {
    match guard {
        Some(handle) => Arc::new(handle.clone()),
        None => Arc::new(NoGuard),
    }
}
