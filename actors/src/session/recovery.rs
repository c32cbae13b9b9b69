//! The abort + continue procedure, run through the [`Reads`] and
//! [`Control`](crate::ports::Control) ports.
//!
//! The core decided that a session is stalled; this carries the decision out, step by
//! step, and reports how far it got:
//! 1. confirm the session is still busy (`GET /session/status`) — never abort on a guess;
//! 2. `POST /abort`;
//! 3. poll the status every `abort_poll_interval` until idle, at most `abort_poll_max`;
//! 4. wait `wait_after_abort`;
//! 5. deliver the continue message ([`deliver`]: fresh todos, the last user turn's
//!    agent/model, one synthetic part tagged as Shepherd's) — the planning continue for
//!    a planning session, the specialised prompt when the model wrote a tool call as
//!    text. An escalation compacts between the abort and the continue.
//!
//! Once the abort is sent the procedure always goes on to its continue (or reports
//! that it could not send it): shutdown is only honoured before step 2.
//!
//! Crash consistency: the [`Intent`] is ledgered before the abort and again once the
//! abort was accepted, and removed when the continue's outcome is known. A crash in
//! between leaves it for [`crate::session::unfinished`] to finish after the restart; so does
//! a request that failed in a way that may still have reached OpenCode (the intent is
//! kept until the session itself shows what happened).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::RecoveryConfig;
use crate::event::{ModelRef, Status};
use crate::guard::Verdict;
use crate::killpoint::{self, step};
use crate::ledger::{Intent, IntentKind, IntentLog, IntentStep};
use crate::ports::{Control, EngineError, Reads};
use crate::session::core::{RecoveryOrder, RecoveryReport};
use crate::session::delivery::{deliver, holding_lease, Delivery, Outbound};
use crate::session::prompt::TodoCounts;

pub use shepherd_core::ports::may_have_arrived;
pub use shepherd_core::session::effect::continue_order;

/// Runs one recovery. `stopping` is checked before the abort only.
pub async fn recover(
    out: Outbound<'_>,
    cfg: &RecoveryConfig,
    order: &RecoveryOrder,
    stopping: &AtomicBool,
    intents: &dyn IntentLog,
    wall_ms: i64,
) -> RecoveryReport {
    let directory = match directory_of(out.reads, &order.session_id, order.directory.as_deref()).await {
        Ok(d) => d,
        // The server does not know the session: nothing to recover.
        Err(EngineError::NotFound(_)) => return RecoveryReport::NotBusy,
        Err(e) => return RecoveryReport::StatusUnavailable(e),
    };
    let mut intent = Intent {
        server: out.server.to_string(),
        session: order.session_id.clone(),
        decision: order.decision.clone(),
        kind: IntentKind::Recover,
        step: IntentStep::Intended,
        instance: out.instance.to_string(),
        started_ms: wall_ms,
        attempt: order.attempt,
    };
    // The status check and the intent's write go out together: each waits its turn (the
    // server, the ledger's writer), and one after the other they doubled the time from
    // the stall to its abort. An intent whose check then declines is ended at once; one
    // a crash leaves behind is moot (the last reply was not aborted).
    let (status, ()) = tokio::join!(out.reads.status(&directory, &order.session_id), write_intent(intents, &intent));
    let declined = match status {
        Ok(Some(Status::Busy)) if stopping.load(Ordering::SeqCst) => Some(RecoveryReport::Cancelled),
        Ok(Some(Status::Busy)) => None,
        Ok(_) => Some(RecoveryReport::NotBusy),
        Err(e) => Some(RecoveryReport::StatusUnavailable(e)),
    };
    // With instances sharing a store, only the lease holder aborts; it holds the lease
    // (renewed) until its continue is sent, which goes out under the same lease.
    let lease = match declined {
        Some(report) => Err(report),
        None => out.guard.may_act(out.server, &order.session_id).await.map_err(RecoveryReport::NotOurs),
    };
    let lease = match lease {
        Ok(lease) => lease,
        Err(report) => {
            end_intent(intents, &intent).await;
            return report;
        }
    };
    killpoint::reached(step::RECOVER_BEFORE_ABORT);
    if let Err(e) = out.control.abort(&order.session_id).await {
        // An abort that timed out may still have arrived: the intent stays, and the
        // session itself will show what happened.
        if !may_have_arrived(&e) {
            end_intent(intents, &intent).await;
        }
        return RecoveryReport::AbortFailed(e);
    }
    intent.step = IntentStep::Aborted;
    write_intent(intents, &intent).await;
    killpoint::reached(step::RECOVER_AFTER_ABORT);
    let out = Outbound { lease, ..out };
    let waits = after_abort(out, cfg, order, &directory);
    let (idle_after_ms, compacted) = match holding_lease(out, &order.session_id, lease, waits).await {
        Ok(done) => done,
        Err(holder) => {
            // Another instance holds the session now: the continue is its to send (it
            // sees the aborted turn); this instance's intent ends here.
            end_intent(intents, &intent).await;
            let reason = Verdict::NotOurs { holder }.reason().unwrap_or_default();
            return RecoveryReport::ContinueDeclined { idle_after_ms: None, reason };
        }
    };
    if !order.continue_after {
        end_intent(intents, &intent).await;
        return RecoveryReport::AbortedOnly { idle_after_ms };
    }
    let continue_order = continue_order(cfg, order, Some(directory));
    let delivery = deliver(out, &continue_order).await;
    if !matches!(&delivery, Delivery::Failed { error } if may_have_arrived(error)) {
        end_intent(intents, &intent).await;
    }
    continue_report(delivery, idle_after_ms, compacted)
}

/// Polls the session's status every `every` after an abort until it is idle (absent
/// from its directory's map, or listed idle): how long that took, or `None` when it was
/// not idle within `at_most` (a failed read counts as not yet). The recovery and the
/// hand-off's abort both wait this way.
pub(crate) async fn wait_until_idle(
    reads: &dyn Reads,
    directory: &str,
    session: &str,
    (every, at_most): (std::time::Duration, std::time::Duration),
) -> Option<std::time::Duration> {
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let waited = started.elapsed();
        match reads.status(directory, session).await {
            Ok(None | Some(Status::Idle)) => return Some(waited),
            _ if waited >= at_most => return None,
            _ => {}
        }
    }
}

/// Compacts the session with its model, waiting at most `max_wait`
/// (`compaction.max_wait`): the outcome as the core takes it. The compaction procedure
/// and a recovery's compaction before its continue both call it.
pub(crate) async fn summarize_within(
    control: &dyn Control,
    session: &str,
    model: &ModelRef,
    max_wait: std::time::Duration,
) -> Result<(), String> {
    match tokio::time::timeout(max_wait, control.summarize(session, model)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("not finished after compaction.max_wait ({max_wait:?})")),
    }
}

/// What follows the abort before the continue, while the lease is held: the wait until
/// idle (`idle_after_ms`), the pause after it and, when a continue follows, the hard
/// gate's compaction (its outcome).
async fn after_abort(
    out: Outbound<'_>,
    cfg: &RecoveryConfig,
    order: &RecoveryOrder,
    directory: &str,
) -> (Option<u64>, Option<Result<(), String>>) {
    let poll = (cfg.abort_poll_interval, cfg.abort_poll_max);
    let idle_after_ms =
        wait_until_idle(out.reads, directory, &order.session_id, poll).await.map(|waited| waited.as_millis() as u64);
    tokio::time::sleep(cfg.wait_after_abort).await;
    if !order.continue_after {
        return (idle_after_ms, None);
    }

    // The hard gate: past `handoff.hard`, compact before continuing (bounded), and
    // continue whatever the outcome so the session is never stranded.
    let compacted = match &order.compact_first {
        Some((model, max_wait)) => Some(summarize_within(out.control, &order.session_id, model, *max_wait).await),
        None => None,
    };
    (idle_after_ms, compacted)
}

/// The recovery's report once its continue was delivered (or not).
fn continue_report(delivery: Delivery, idle_after_ms: Option<u64>, compacted: Option<Result<(), String>>) -> RecoveryReport {
    match delivery {
        Delivery::Sent { todos, waited_ms, tool_call_as_text, .. } => RecoveryReport::Continued {
            idle_after_ms,
            open_todos: TodoCounts::of(&todos).open as u32,
            compacted,
            waited_ms,
            tool_call_as_text,
        },
        Delivery::Skipped { reason, .. } => RecoveryReport::ContinueFailed {
            idle_after_ms,
            error: EngineError::Decode(format!("continue skipped: {reason}")),
        },
        Delivery::Failed { error } => RecoveryReport::ContinueFailed { idle_after_ms, error },
        Delivery::Guarded { reason, .. } => RecoveryReport::ContinueDeclined { idle_after_ms, reason },
    }
}

/// The session's directory: the one the core knows, else the server's description of
/// the session (whose status is read per directory).
pub async fn directory_of(reads: &dyn Reads, session: &str, known: Option<&str>) -> Result<String, EngineError> {
    match known {
        Some(d) => Ok(d.to_string()),
        None => Ok(reads.session(session).await?.directory.unwrap_or_default()),
    }
}

/// Ledgers an intent before the step it announces. A failed write is logged and the
/// step goes ahead: a ledger outage must not strand the session (it only costs the
/// crash consistency of this one action).
pub async fn write_intent(intents: &dyn IntentLog, intent: &Intent) {
    if let Err(e) = intents.put_intent(intent).await {
        tracing::warn!(server = %intent.server, session = %intent.session, decision = %intent.decision, step = intent.step.as_str(), error = %e, "ledger: could not write the intent; acting without it");
    }
}

/// The intent's outcome is known: it is no longer open.
pub async fn end_intent(intents: &dyn IntentLog, intent: &Intent) {
    if let Err(e) = intents.end_intent(&intent.server, &intent.decision).await {
        tracing::warn!(server = %intent.server, session = %intent.session, decision = %intent.decision, error = %e, "ledger: could not close the intent; a restart will check the session again");
    }
}

/// Counts recoveries under way so shutdown can wait for them to finish.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    inner: Arc<InFlightInner>,
}

#[derive(Debug, Default)]
struct InFlightInner {
    count: std::sync::atomic::AtomicUsize,
    stopping: AtomicBool,
    changed: tokio::sync::Notify,
}

impl InFlight {
    /// Marks the start of a procedure; the guard marks its end when dropped.
    pub fn enter(&self) -> InFlightGuard {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard { inner: Arc::clone(&self.inner) }
    }

    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// From now on no new abort is sent.
    pub fn begin_shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    pub fn stopping(&self) -> &AtomicBool {
        &self.inner.stopping
    }

    /// Waits until no procedure is under way.
    pub async fn drained(&self) {
        loop {
            let notified = self.inner.changed.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Held while one procedure runs.
#[derive(Debug)]
pub struct InFlightGuard {
    inner: Arc<InFlightInner>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.inner.count.fetch_sub(1, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }
}
