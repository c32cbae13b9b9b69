//! The abort + continue procedure, run through the [`Reads`] and
//! [`Control`](crate::ports::Control) ports.
//!
//! The core decided that a session is stalled; this carries the decision out, step by
//! step, and reports how far it got:
//! 1. confirm the session is still busy (`GET /session/status`) — never abort on a guess;
//! 2. `POST /abort`;
//! 3. wait until idle, at most `abort_poll_max`: until the session's events show it
//!    (`seen`), reading the status every `abort_poll_interval` meanwhile;
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
//! between leaves it for [`super::finish`] to finish after the restart; so does
//! a request that failed in a way that may still have reached OpenCode (the intent is
//! kept until the session itself shows what happened).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::RecoveryConfig;
use crate::event::Status;
use crate::guard::Verdict;
use crate::killpoint::{self, step};
use crate::ledger::{Intent, IntentKind, IntentLog, IntentStep};
use crate::ports::EngineError;
use crate::session::core::{RecoveryOrder, RecoveryReport};
use crate::session::prompt::TodoCounts;

use super::abort_and_wait::{directory_of, wait_until_idle, IdleSeen, IdleWait};
use super::compact::summarize_within;
use super::deliver::{deliver, holding_lease, Delivery, Outbound};
use super::intents::{end_intent, write_intent};

pub use shepherd_core::ports::may_have_arrived;
pub use shepherd_core::session::effect::continue_order;

/// Runs one recovery. `stopping` is checked before the abort only; `seen` is the
/// session's status as its events show it, when its actor feeds it.
pub async fn recover(
    out: Outbound<'_>,
    cfg: &RecoveryConfig,
    order: &RecoveryOrder,
    stopping: &AtomicBool,
    intents: &dyn IntentLog,
    wall_ms: i64,
    seen: Option<IdleSeen>,
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
    let waits = after_abort(out, cfg, order, &directory, IdleWait::new(cfg, seen));
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

/// What follows the abort before the continue, while the lease is held: the wait until
/// idle (`idle_after_ms`), the pause after it and, when a continue follows, the hard
/// gate's compaction (its outcome).
async fn after_abort(
    out: Outbound<'_>,
    cfg: &RecoveryConfig,
    order: &RecoveryOrder,
    directory: &str,
    wait: IdleWait,
) -> (Option<u64>, Option<Result<(), String>>) {
    let idle_after_ms =
        wait_until_idle(out.reads, directory, &order.session_id, wait).await.map(|waited| waited.as_millis() as u64);
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

