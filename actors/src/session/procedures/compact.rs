//! Compacting a session: `POST /session/{id}/summarize` with its model, bounded by
//! `compaction.max_wait`. The compaction procedure (the core's `Effect::Compact`) and a
//! recovery's compaction before its continue both run it.

use crate::event::ModelRef;
use crate::ports::Control;

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

