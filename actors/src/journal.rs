//! Writing the journal out: [`Journal::record`] is the only place that turns an
//! [`ActionRecord`] into a log event and a broadcast message. The record types are
//! `shepherd_core::journal`'s, re-exported here.

pub use shepherd_core::journal::*;

use tokio::sync::broadcast;

/// Where records go: the log and every subscriber.
#[derive(Debug, Clone)]
pub struct Journal {
    tx: broadcast::Sender<ActionRecord>,
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

impl Journal {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self { tx }
    }

    /// Every record from now on (slow readers lose the oldest, never block Shepherd).
    pub fn subscribe(&self) -> broadcast::Receiver<ActionRecord> {
        self.tx.subscribe()
    }

    pub fn record(&self, r: ActionRecord) {
        let n = &r.numbers;
        macro_rules! emit {
            ($level:ident) => {
                tracing::$level!(
                    target: "shepherd::action",
                    server = %r.server,
                    session = %r.session,
                    action = r.action.as_str(),
                    outcome = r.outcome.as_str(),
                    reason = %r.reason,
                    idle_for_ms = n.idle_for_ms,
                    timeout_ms = n.timeout_ms,
                    attempt = n.attempt,
                    max_attempts = n.max_attempts,
                    backoff_ms = n.backoff_ms,
                    auto_submits = n.auto_submits,
                    age_ms = n.age_ms,
                    running_tools = n.running_tools,
                    open_todos = n.open_todos,
                    abort_to_idle_ms = n.abort_to_idle_ms,
                    round = n.round,
                    context_tokens = n.context_tokens,
                    context_window = n.context_window,
                    window_ms = n.window_ms,
                    last_part = n.last_part.as_deref(),
                    advice = n.advice.as_deref(),
                    advice_source = n.advice_source.as_deref(),
                    open_ms = n.open_ms,
                    without_progress_ms = n.without_progress_ms,
                    compacting_for_ms = n.compacting_for_ms,
                    waits_on = n.waits_on.as_deref(),
                    late_ms = n.late_ms,
                    "{} {}: {}", r.action.as_str(), r.outcome.as_str(), r.reason
                )
            };
        }
        match r.outcome {
            Outcome::Failed => emit!(warn),
            _ => emit!(info),
        }
        let _ = self.tx.send(r);
    }
}
