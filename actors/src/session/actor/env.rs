//! What every session actor of one server shares, and the models' context windows in
//! it (the scratch sessions' set is the hand-off's: `procedures::hand_over::Scratch`).

use super::*;

/// What every session actor of one server shares (one `Arc` for all of them on one
/// thread: a clone shares every part, and may carry another engine — the same server
/// through connections of that thread's own, see `AttachServer::thread_engines`).
#[derive(Clone)]
pub struct SessionEnv {
    pub server: Arc<str>,
    /// The whole server; each procedure is handed the ports it uses.
    pub engine: Arc<dyn Engine>,
    pub clock: Arc<dyn Clock>,
    pub journal: Journal,
    pub in_flight: InFlight,
    /// This Shepherd instance's id, written into the metadata of its prompts.
    pub instance: String,
    /// Where durable state and the journal go.
    pub ledger: Arc<dyn Ledger>,
    /// Context windows of this server's models.
    pub windows: Arc<ModelWindows>,
    /// The sessions' directories as Shepherd can see them (read-only `git`).
    pub workspace: Arc<dyn Workspace>,
    /// Sessions Shepherd made for its own questions: the supervisor leaves them alone.
    pub scratch: Scratch,
    /// The guard every prompt passes (dedupe, rate limits, leases).
    pub guard: Arc<dyn PromptGuard>,
    /// The advisor (`advisor.enabled`); without it advice comes from the heuristic.
    pub advisor: AdvisorSlot,
    /// The circuit breaker of this server's model provider.
    pub breaker: Arc<ProviderBreaker>,
    /// Up to when this server's events are handled: deadlines fall due in it.
    pub stream: Arc<crate::stream_clock::StreamClock>,
    /// The server's sessions whose actor does not think them idle (the registry's):
    /// each actor keeps its own entry as its view changes.
    pub not_idle: Arc<crate::session::view::NotIdle>,
}

/// Context windows of one server's models (`provider/model` → tokens), read by the
/// supervisor and looked up by each session when its model or the table changes.
#[derive(Debug, Default)]
pub struct ModelWindows {
    table: std::sync::RwLock<std::collections::HashMap<String, u64>>,
    /// Bumped on every replacement, so sessions look up again only then.
    generation: std::sync::atomic::AtomicU64,
}

impl ModelWindows {
    pub fn replace(&self, table: std::collections::HashMap<String, u64>) {
        if let Ok(mut t) = self.table.write() {
            *t = table;
        }
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn get(&self, model: &ModelRef) -> Option<u64> {
        let key = format!("{}/{}", model.provider_id, model.model_id);
        self.table.read().ok()?.get(&key).copied()
    }
}

impl SessionEnv {
    pub fn now(&self) -> Now {
        Now { mono: self.clock.now(), wall_ms: self.clock.wall_ms() }
    }

    /// Where this server's prompts go, through the guard.
    pub fn outbound(&self) -> Outbound<'_> {
        Outbound {
            server: &self.server,
            reads: self.engine.as_ref(),
            control: self.engine.as_ref(),
            guard: self.guard.as_ref(),
            instance: &self.instance,
            lease: None,
        }
    }
}
