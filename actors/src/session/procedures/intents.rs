//! The ledger's intents around an action: written before the step they announce,
//! ended once its outcome is known. A failed write never stops the action (it only
//! costs this one action its crash consistency).

use crate::ledger::{Intent, IntentLog};

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

