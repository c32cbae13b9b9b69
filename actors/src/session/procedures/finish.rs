//! Finishing an action that a crash (or an answer lost on the way back) left open.
//!
//! The ledger's [`Intent`] says what Shepherd was doing and under which decision id;
//! OpenCode's own messages say what actually happened. The procedure reads the session
//! and does only what is missing:
//! 1. another instance holds the session's lease → it acts; nothing here;
//! 2. a message of the session carries the decision id in Shepherd's tag → the prompt
//!    arrived before the crash: nothing is sent again;
//! 3. the session did something of its own after the decision (a message newer than the
//!    intent that is not ours), or it is busy now → the moment passed: nothing is sent;
//! 4. a recovery that had not yet seen its abort accepted → continued only if the last
//!    reply was in fact aborted (else the abort never took effect);
//! 5. otherwise the prompt goes out once, through the usual delivery and guard, under
//!    the same decision id — so a second crash during this step is resolved the same way.
//!
//! A person's prompt (control API) is verified and never re-sent: whoever asked was
//! told it failed. An unreadable session keeps the intent for the next start or
//! reconnect.

use shepherd_core::ports::may_have_arrived;

use crate::event::{Role, Status};
use crate::ledger::{Intent, IntentKind, IntentLog, IntentStep};
use crate::ports::{EngineError, HistoryMessage, HistoryPart};

use super::abort_and_wait::directory_of;
use super::deliver::{deliver, Delivery, Outbound, PromptOrder};
use super::intents::{end_intent, write_intent};

pub use shepherd_core::session::effect::{same_action, FinishOrder, FinishReport, RETRY};

/// Finishes one open intent. Never panics; every outcome is a [`FinishReport`], and the
/// intent is closed unless the session could not be read or a send may have arrived.
pub async fn finish(out: Outbound<'_>, intents: &dyn IntentLog, order: &FinishOrder) -> FinishReport {
    let mut open = order.intent.clone();
    let report = look_and_finish(out, intents, order, &mut open).await;
    let keep = match &report {
        FinishReport::Unreadable(_) => true,
        FinishReport::Sent(Delivery::Failed { error }) => may_have_arrived(error),
        _ => false,
    };
    if !keep {
        end_intent(intents, &open).await;
    }
    report
}

/// `open` is the intent that is open when it returns: the order's, or the retry's that
/// replaced it.
async fn look_and_finish(
    out: Outbound<'_>,
    intents: &dyn IntentLog,
    order: &FinishOrder,
    open: &mut Intent,
) -> FinishReport {
    let intent = &order.intent;
    let reads = out.reads;
    let lease = match out.guard.may_act(out.server, &intent.session).await {
        Ok(lease) => lease,
        Err(holder) => return FinishReport::NotOurs(holder),
    };
    // The prompt, if one is sent, goes out under this lease (fenced right before it).
    let out = Outbound { lease, ..out };
    let history = match reads.history(&intent.session, order.messages).await {
        Ok(h) => h,
        Err(EngineError::NotFound(_)) => return FinishReport::Gone,
        Err(e) => return FinishReport::Unreadable(e),
    };
    match what_happened(&history, intent) {
        Seen::Delivered => return FinishReport::Delivered,
        Seen::MovedOn => return FinishReport::Moot("the session did something of its own after the decision"),
        Seen::Nothing { last_reply_aborted } => {
            if intent.kind == IntentKind::Recover && intent.step == IntentStep::Intended && !last_reply_aborted {
                return FinishReport::Moot("the abort never took effect (the last reply was not aborted)");
            }
        }
    }
    let Some(prompt) = &order.prompt else {
        return FinishReport::Moot("a person's prompt that did not arrive is not sent again");
    };
    let directory = match directory_of(reads, &intent.session, prompt.directory.as_deref()).await {
        Ok(d) => d,
        Err(EngineError::NotFound(_)) => return FinishReport::Gone,
        Err(e) => return FinishReport::Unreadable(e),
    };
    match reads.status(&directory, &intent.session).await {
        Ok(Some(Status::Busy | Status::Retry { .. })) => return FinishReport::Moot("the session is busy again"),
        Ok(_) => {}
        Err(e) => return FinishReport::Unreadable(e),
    }
    // Verified missing: sent again under a decision id of its own, so that no memory of
    // the first attempt (this instance's guard, another instance's claim in Redis) takes
    // it for a duplicate of itself. The retry's intent replaces the first before the
    // send, so a crash now is resolved by looking for the retry's id.
    let retry = Intent { decision: retry_decision(&intent.decision), step: IntentStep::Sending, ..intent.clone() };
    write_intent(intents, &retry).await;
    end_intent(intents, intent).await;
    *open = retry;
    let prompt = PromptOrder { decision: open.decision.clone(), ..prompt.clone() };
    FinishReport::Sent(deliver(out, &prompt).await)
}

/// The decision id of a prompt sent again because the first one verifiably did not
/// arrive.
fn retry_decision(decision: &str) -> String {
    format!("{decision}{RETRY}")
}

/// What the session's messages say about an intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A message carries the decision id.
    Delivered,
    /// A message newer than the intent that is not Shepherd's: the session (or the
    /// person) moved on after the decision.
    MovedOn,
    Nothing {
        /// The latest assistant message ended with `MessageAbortedError`.
        last_reply_aborted: bool,
    },
}

/// Reads a history (oldest first) for the intent's traces. Pure.
fn what_happened(history: &[HistoryMessage], intent: &Intent) -> Seen {
    let ours = |m: &HistoryMessage| {
        m.parts.iter().any(|p| matches!(p, HistoryPart::Text { shepherd: Some(tag), .. } if tag.decision == intent.decision))
    };
    if history.iter().any(ours) {
        return Seen::Delivered;
    }
    let tagged = |m: &HistoryMessage| m.parts.iter().any(|p| matches!(p, HistoryPart::Text { shepherd: Some(_), .. }));
    let after = |m: &HistoryMessage| m.created_ms.is_some_and(|t| t > intent.started_ms);
    if history.iter().any(|m| after(m) && !tagged(m)) {
        return Seen::MovedOn;
    }
    let last_reply_aborted = history
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .is_some_and(|m| m.error.as_deref() == Some(crate::event::ErrorInfo::ABORTED));
    Seen::Nothing { last_reply_aborted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ShepherdTag;

    fn intent(kind: IntentKind, step: IntentStep) -> Intent {
        Intent {
            server: "local".into(),
            session: "ses_a".into(),
            decision: "ses_a-1000".into(),
            kind,
            step,
            instance: "i1".into(),
            started_ms: 1_000,
            attempt: 1,
        }
    }

    fn msg(role: Role, created_ms: i64, error: Option<&str>, tag: Option<&str>) -> HistoryMessage {
        HistoryMessage {
            id: format!("msg_{created_ms}"),
            role,
            created_ms: Some(created_ms),
            agent: None,
            error: error.map(str::to_string),
            summary: false,
            parts: vec![HistoryPart::Text {
                text: "text".into(),
                synthetic: tag.is_some(),
                ignored: false,
                shepherd: tag.map(|d| ShepherdTag { kind: "continue".into(), instance: "i1".into(), decision: d.into(), lease: None }),
            }],
        }
    }

    #[test]
    fn a_message_tagged_with_the_decision_means_the_prompt_arrived() {
        let h = vec![
            msg(Role::Assistant, 900, Some("MessageAbortedError"), None),
            msg(Role::User, 1_200, None, Some("ses_a-1000")),
            msg(Role::Assistant, 1_300, None, None),
        ];
        assert_eq!(what_happened(&h, &intent(IntentKind::Recover, IntentStep::Aborted)), Seen::Delivered);
    }

    #[test]
    fn a_message_of_the_session_after_the_decision_makes_the_intent_moot() {
        let h = vec![msg(Role::Assistant, 900, None, None), msg(Role::User, 1_500, None, None)];
        assert_eq!(what_happened(&h, &intent(IntentKind::Nudge, IntentStep::Sending)), Seen::MovedOn);
        // Another decision's prompt (ours, older or from another instance) is not the session moving on.
        let h = vec![msg(Role::Assistant, 900, Some("MessageAbortedError"), None), msg(Role::User, 1_500, None, Some("other"))];
        assert_eq!(
            what_happened(&h, &intent(IntentKind::Recover, IntentStep::Aborted)),
            Seen::Nothing { last_reply_aborted: true }
        );
    }

    #[test]
    fn the_aborted_reply_is_read_from_the_latest_assistant_message() {
        let aborted = vec![msg(Role::User, 100, None, None), msg(Role::Assistant, 900, Some("MessageAbortedError"), None)];
        assert_eq!(
            what_happened(&aborted, &intent(IntentKind::Recover, IntentStep::Intended)),
            Seen::Nothing { last_reply_aborted: true }
        );
        let running = vec![msg(Role::User, 100, None, None), msg(Role::Assistant, 900, None, None)];
        assert_eq!(
            what_happened(&running, &intent(IntentKind::Recover, IntentStep::Intended)),
            Seen::Nothing { last_reply_aborted: false }
        );
    }
}
