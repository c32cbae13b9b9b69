//! Reading a session's status around an abort: where its status is read (its
//! directory), the abort and the wait until it is idle. The recovery and the hand-off
//! both abort a turn this way; there is no other.
//!
//! The wait ends as soon as the session's own events show it idle ([`StatusFeed`]: the
//! session actor feeds them in while the procedure runs), which saves the REST reads of
//! `/session/status` a poll would make; the poll stays as the fallback for a stream
//! that is behind or down, so an idle the events never show is still found.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::RecoveryConfig;
use crate::event::{Event, Status};
use crate::ports::{Control, EngineError, Reads};

/// The session's status as its own events show it (`true`: idle), fed by its actor
/// while a procedure that aborts runs.
pub struct StatusFeed(watch::Sender<bool>);

/// What a waiting procedure reads of a [`StatusFeed`].
#[derive(Clone)]
pub struct IdleSeen(watch::Receiver<bool>);

impl StatusFeed {
    /// A feed that has seen nothing yet (not idle), and what reads it.
    pub fn new() -> (Self, IdleSeen) {
        let (tx, rx) = watch::channel(false);
        (Self(tx), IdleSeen(rx))
    }

    /// One more reader of this feed (a second procedure while the first still runs).
    pub fn subscribe(&self) -> IdleSeen {
        IdleSeen(self.0.subscribe())
    }

    /// Whether any procedure still reads it (the actor drops it when none does).
    pub fn is_read(&self) -> bool {
        self.0.receiver_count() > 0
    }

    /// Takes in one event of the session: its status events move the feed, the rest
    /// leave it alone.
    pub fn observe(&self, event: &Event) {
        let idle = match event {
            Event::SessionIdle { .. } | Event::SessionStatus { status: Status::Idle, .. } => true,
            Event::SessionStatus { .. } => false,
            _ => return,
        };
        self.0.send_if_modified(|seen| std::mem::replace(seen, idle) != idle);
    }
}

impl IdleSeen {
    /// Resolves once the events show the session idle (at once when they already do);
    /// `false` when the feed is gone (its actor stopped) — then only the poll is left.
    async fn idle(&mut self) -> bool {
        self.0.wait_for(|idle| *idle).await.is_ok()
    }
}

/// How a procedure waits for idle after its abort: the session's events when it has
/// them, a poll of `/session/status` every `every` meanwhile, `at_most` in all.
#[derive(Clone)]
pub struct IdleWait {
    pub every: Duration,
    pub at_most: Duration,
    pub seen: Option<IdleSeen>,
}

impl IdleWait {
    /// The recovery settings' poll, with the session's events when there are any.
    pub fn new(cfg: &RecoveryConfig, seen: Option<IdleSeen>) -> Self {
        Self { every: cfg.abort_poll_interval, at_most: cfg.abort_poll_max, seen }
    }
}

/// Aborts the turn and waits (bounded by `wait.at_most`) until the session is idle;
/// how long that took, or `None` when it was not idle in time. The abort's failure is
/// the caller's to word.
pub async fn abort_and_wait(
    reads: &dyn Reads,
    control: &dyn Control,
    session: &str,
    directory: &str,
    wait: IdleWait,
) -> Result<Option<Duration>, EngineError> {
    control.abort(session).await?;
    Ok(wait_until_idle(reads, directory, session, wait).await)
}

/// Waits after an abort until the session is idle: as soon as its events show it, else
/// by its status read every `every` (absent from its directory's map, or listed idle).
/// How long that took, or `None` when it was not idle within `at_most` (a failed read
/// counts as not yet). The recovery and the hand-off's abort both wait this way.
pub(crate) async fn wait_until_idle(
    reads: &dyn Reads,
    directory: &str,
    session: &str,
    IdleWait { every, at_most, mut seen }: IdleWait,
) -> Option<Duration> {
    let started = tokio::time::Instant::now();
    loop {
        let next_read = tokio::time::sleep(every);
        tokio::pin!(next_read);
        match seen.as_mut() {
            Some(events) => tokio::select! {
                biased;
                shown = events.idle() => {
                    if shown {
                        return Some(started.elapsed());
                    }
                    // The feed is gone: the poll alone from here on.
                    seen = None;
                    next_read.await;
                }
                () = &mut next_read => {}
            },
            None => next_read.await,
        }
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

