//! Writing the journal out: [`Journal::record`] is the only place that turns an
//! [`ActionRecord`] into a log event and a broadcast message. The record types are
//! `shepherd_core::journal`'s, re-exported here.

pub use shepherd_core::journal::*;

use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

/// How long a [`QueuedRecords`] reader lets records gather once they come in a
/// stream. Not a tuning knob: what follows the journal (metrics, the status file, toasts,
/// notifications) is read in seconds, and a burst of recoveries made a record every
/// half-millisecond, each waking every subscriber's thread from the session's.
pub const RECORDS_PACE: Duration = Duration::from_millis(50);

/// How many records the broadcast keeps for a subscriber that has not read them yet;
/// one that falls further behind loses the oldest (and is told how many).
const RECORDS_KEPT: usize = 4096;

/// What must see every record as it is made — the metrics' counters: called on the
/// thread that records, before the record is broadcast, so that no burst makes it miss
/// one (at 100,000 sessions a burst of recoveries made more records than the channel
/// keeps before a subscriber on a busy thread read them). It must be quick and never
/// block.
pub type RecordObserver = std::sync::Arc<dyn Fn(&ActionRecord) + Send + Sync>;

/// How many of its records a [`QueuedRecords`] subscriber of a few actions may leave
/// unread before it misses the newest (and is told how many).
const CHOSEN_KEPT: usize = 4096;

/// The same for a subscriber of every record ([`Journal::subscribe_queued`]): a burst of
/// 10,000 recoveries makes some 50,000 records, and the reader runs on a niced thread.
/// Queued records take memory only while they wait.
const QUEUED_KEPT: usize = 65_536;

/// Where records go: the log, the observer and every subscriber.
#[derive(Clone)]
pub struct Journal {
    tx: broadcast::Sender<ActionRecord>,
    observer: Option<RecordObserver>,
    queues: std::sync::Arc<std::sync::RwLock<Vec<Queue>>>,
}

/// A [`QueuedRecords`] subscriber's end: the actions it takes (`None`: all), where they
/// go, and how many did not fit.
struct Queue {
    actions: Option<&'static [Action]>,
    tx: tokio::sync::mpsc::Sender<ActionRecord>,
    missed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("observed", &self.observer.is_some()).finish_non_exhaustive()
    }
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

impl Journal {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(RECORDS_KEPT);
        Self { tx, observer: None, queues: Default::default() }
    }

    /// A journal whose every record `observer` sees as it is made (see
    /// [`RecordObserver`]).
    pub fn observed(observer: RecordObserver) -> Self {
        Self { observer: Some(observer), ..Self::new() }
    }

    /// Every record from now on (slow readers lose the oldest, never block Shepherd).
    pub fn subscribe(&self) -> broadcast::Receiver<ActionRecord> {
        self.tx.subscribe()
    }

    /// Every record of `actions` from now on, and no other ([`QueuedRecords`]): what
    /// follows a few kinds of record (the notifiers, toasts) is not made to miss one by
    /// a burst of others — a broadcast subscriber on a busy thread fell behind a burst
    /// of recoveries and lost the oldest records, whatever their kind — and costs the
    /// recording thread nothing for the others.
    pub fn subscribe_to(&self, actions: &'static [Action]) -> QueuedRecords {
        self.queue(Some(actions), CHOSEN_KEPT)
    }

    /// Every record from now on, queued for this reader as it is made (up to
    /// [`QUEUED_KEPT`] unread): the status file's counts, which a reader of the
    /// broadcast on its niced thread could lose in a burst.
    pub fn subscribe_queued(&self) -> QueuedRecords {
        self.queue(None, QUEUED_KEPT)
    }

    fn queue(&self, actions: Option<&'static [Action]>, kept: usize) -> QueuedRecords {
        let (tx, rx) = tokio::sync::mpsc::channel(kept);
        let missed = std::sync::Arc::default();
        let mut queues = self.queues.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        queues.retain(|q| !q.tx.is_closed());
        queues.push(Queue { actions, tx, missed: std::sync::Arc::clone(&missed) });
        QueuedRecords { rx, missed, gathering: false }
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
        if let Some(observe) = &self.observer {
            observe(&r);
        }
        for q in self.queues.read().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            let taken = q.actions.is_none_or(|actions| actions.contains(&r.action));
            if taken && q.tx.try_send(r.clone()).is_err() {
                q.missed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _ = self.tx.send(r);
    }
}

/// Records queued for one reader as they are made ([`Journal::subscribe_to`],
/// [`Journal::subscribe_queued`]): the thread that records only queues each (past the
/// queue's bound the newest are missed and counted). Read paced: the first record
/// after a quiet spell at once, and while records keep coming what gathered every
/// [`RECORDS_PACE`], the reader asleep between batches — a waiting reader is woken by
/// every record, from the thread that records (a session's), and a sleeping one costs
/// that thread nothing. In order, none lost that the queue keeps.
#[derive(Debug)]
pub struct QueuedRecords {
    rx: tokio::sync::mpsc::Receiver<ActionRecord>,
    missed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// A record came lately: when none is queued, let the next ones gather first.
    gathering: bool,
}

impl QueuedRecords {
    /// The next record, as [`broadcast::Receiver::recv`] answers: how many were missed
    /// since the last call, if any, first; `Closed` once the journal is gone.
    /// Cancel-safe (for `select!`): a record is only taken when returned.
    pub async fn recv(&mut self) -> Result<ActionRecord, RecvError> {
        loop {
            match self.missed.swap(0, std::sync::atomic::Ordering::Relaxed) {
                0 => {}
                n => return Err(RecvError::Lagged(n)),
            }
            match self.rx.try_recv() {
                Ok(r) => {
                    self.gathering = true;
                    return Ok(r);
                }
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => return Err(RecvError::Closed),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {}
            }
            if self.gathering {
                tokio::time::sleep(RECORDS_PACE).await;
                self.gathering = false;
                continue;
            }
            let next = self.rx.recv().await;
            self.gathering = next.is_some();
            return next.ok_or(RecvError::Closed);
        }
    }

    /// A queued record, without waiting.
    pub fn try_recv(&mut self) -> Option<ActionRecord> {
        self.rx.try_recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> ActionRecord {
        ActionRecord {
            server: "s".into(),
            session: "ses".into(),
            action: Action::Nudge,
            outcome: Outcome::Done,
            reason: format!("r{i}"),
            numbers: Numbers::default(),
            at_ms: i64::from(i),
        }
    }

    /// Records 1 to 20, one every 5 ms, from a task of their own.
    fn record_twenty_5_ms_apart(journal: &Journal) -> tokio::task::JoinHandle<()> {
        let sender = journal.clone();
        tokio::spawn(async move {
            for i in 1..=20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                sender.record(rec(i));
            }
        })
    }

    /// A filtered subscriber gets every record of its actions, in order, however many
    /// others came between them (the broadcast's reader, left unread as long, lost the
    /// oldest); one that leaves too many of its own unread is told how many it missed.
    #[tokio::test]
    async fn a_filtered_subscriber_misses_none_of_its_records_in_a_burst_of_others() {
        let journal = Journal::new();
        let mut broadcast = journal.subscribe();
        let mut filtered = journal.subscribe_to(&[Action::GiveUp]);
        let of = |action, i| ActionRecord { action, ..rec(i) };
        for i in 0..10_000 {
            journal.record(of(if i % 1_000 == 0 { Action::GiveUp } else { Action::Abort }, i));
        }
        let mut read = Vec::new();
        for _ in 0..10 {
            read.push(filtered.recv().await.unwrap().at_ms);
        }
        assert_eq!(read, (0..10).map(|i| i * 1_000).collect::<Vec<_>>());
        assert!(matches!(broadcast.recv().await, Err(RecvError::Lagged(_))), "the broadcast lost the oldest");

        for i in 0..(CHOSEN_KEPT as u32 + 5) {
            journal.record(of(Action::GiveUp, i));
        }
        assert!(matches!(filtered.recv().await, Err(RecvError::Lagged(5))));
        assert_eq!(filtered.recv().await.unwrap().at_ms, 0, "then the ones kept, oldest first");
    }

    /// A reader of every record (the status file's): a lone record is read at once;
    /// records that follow it within the pace are read together after it, in order;
    /// after a quiet spell the next one is read at once again; and it misses none of a
    /// burst larger than the broadcast keeps.
    #[tokio::test(start_paused = true)]
    async fn a_queued_reader_is_paced_and_misses_none_of_a_burst() {
        let journal = Journal::new();
        let mut queued = journal.subscribe_queued();
        let start = tokio::time::Instant::now();
        journal.record(rec(0));
        assert_eq!(queued.recv().await.unwrap().at_ms, 0);
        assert_eq!(start.elapsed(), Duration::ZERO, "the first record of a quiet spell is read at once");

        let stream = record_twenty_5_ms_apart(&journal);
        let mut reads_at = Vec::new();
        for i in 1..=20 {
            assert_eq!(queued.recv().await.unwrap().at_ms, i64::from(i), "in order");
            reads_at.push(start.elapsed());
        }
        stream.await.unwrap();
        reads_at.dedup();
        assert!(reads_at.len() <= 3, "20 records 5 ms apart were read in a few batches, not one by one: {reads_at:?}");
        let latest = Duration::from_millis(100) + RECORDS_PACE;
        assert!(reads_at.iter().all(|t| *t <= latest), "none later than the pace: {reads_at:?}");

        // Quiet for longer than the pace: the next record is read at once again.
        tokio::time::sleep(RECORDS_PACE * 3).await;
        let quiet_end = tokio::time::Instant::now();
        journal.record(rec(99));
        assert_eq!(queued.recv().await.unwrap().at_ms, 99);
        assert_eq!(quiet_end.elapsed(), Duration::ZERO, "read at once after a quiet spell");

        for i in 0..10_000 {
            journal.record(rec(i));
        }
        for i in 0..10_000 {
            assert_eq!(queued.recv().await.unwrap().at_ms, i64::from(i), "none lost, in order");
        }
    }
}
