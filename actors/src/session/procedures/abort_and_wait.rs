//! Reading a session's status around an abort: where its status is read (its
//! directory), the abort and the wait until it is idle. The recovery and the hand-off
//! both abort a turn this way; there is no other.

use std::time::Duration;

use crate::event::Status;
use crate::ports::{Control, EngineError, Reads};

/// Aborts the turn and waits (bounded by `poll`'s `at_most`) until the session is
/// idle; how long that took, or `None` when it was not idle in time. The abort's
/// failure is the caller's to word.
pub async fn abort_and_wait(
    reads: &dyn Reads,
    control: &dyn Control,
    session: &str,
    directory: &str,
    poll: (Duration, Duration),
) -> Result<Option<Duration>, EngineError> {
    control.abort(session).await?;
    Ok(wait_until_idle(reads, directory, session, poll).await)
}

/// Polls the session's status every `every` after an abort until it is idle (absent
/// from its directory's map, or listed idle): how long that took, or `None` when it was
/// not idle within `at_most` (a failed read counts as not yet). The recovery and the
/// hand-off's abort both wait this way.
pub(crate) async fn wait_until_idle(
    reads: &dyn Reads,
    directory: &str,
    session: &str,
    (every, at_most): (Duration, Duration),
) -> Option<Duration> {
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

/// The session's directory: the one the core knows, else the server's description of
/// the session (whose status is read per directory).
pub async fn directory_of(reads: &dyn Reads, session: &str, known: Option<&str>) -> Result<String, EngineError> {
    match known {
        Some(d) => Ok(d.to_string()),
        None => Ok(reads.session(session).await?.directory.unwrap_or_default()),
    }
}

