//! Notifications (`[[notify]]`): telling a person what needs them — a session waiting on
//! them past `after`, given up, a failed hand-off, a pause, a provider outage, a server
//! out of reach — through a generic JSON webhook, ntfy or a Slack-compatible hook.
//!
//! Parts: [`decide`] (pure: which facts make which occurrence, the `after` clock, the
//! once-per-occurrence keys), [`batch`] (pure: one message per event per window),
//! [`body`] (pure: what each kind of target receives; redaction), [`send`] (the HTTP
//! edge with bounded retries). This module wires them, two tasks per target:
//!
//! - the **decider** follows the journal (a broadcast receiver: a slow notifier loses
//!   records, never holds up an actor), reads each server's stream state from the pumps'
//!   counters on a tick, and puts each finished batch in a bounded queue with
//!   `try_send` — a full queue drops the message (logged, counted), never waits;
//! - the **sender** takes messages one by one: skips what the ledger says was sent
//!   (a restart reads the journal of the last `catch_up` back), asks the supervisor for
//!   each session's title and directory, redacts, POSTs with retries, and ledgers the
//!   keys it delivered.
//!
//! Every message ends in one `shepherd::notify` log event and one count of
//! `shepherd_notifications_total{kind,event,outcome}`. Delivery is at least once: a
//! crash between the POST and the ledger write sends it again after the restart.

pub mod batch;
pub mod body;
pub mod decide;
#[cfg(test)]
mod driver_tests;
pub mod probe;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use shepherd_actors::config::{check_url, NotifyConfig, CATCH_UP_MAX_RECORDS, NOTIFIED_KEEP, NOTIFY_SHUTDOWN_GRACE};
use shepherd_actors::control::GetSession;
use shepherd_actors::journal::{ActionRecord, Journal, QueuedRecords};
use shepherd_actors::ledger::NotifyLedger;
use shepherd_actors::ports::Clock;
use shepherd_actors::redact::Redactor;
use shepherd_actors::supervisor::Supervisor;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use self::batch::{Batcher, Message};
use self::body::Item;
use self::decide::{Decider, ACTIONS};
pub use self::send::display_url;
use self::send::Target;
use crate::metrics::Metrics;
use crate::reload::PumpTable;

/// What the notifiers need from the daemon.
#[derive(Clone)]
pub struct Wiring {
    pub journal: Journal,
    pub ledger: Arc<dyn NotifyLedger>,
    pub supervisor: Addr<Supervisor>,
    pub pumps: PumpTable,
    pub redactor: Redactor,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
}

/// What a decider reads besides the journal.
#[derive(Clone)]
struct Watch {
    ledger: Arc<dyn NotifyLedger>,
    pumps: PumpTable,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
}

impl Watch {
    fn of(w: &Wiring) -> Self {
        Watch {
            ledger: Arc::clone(&w.ledger),
            pumps: Arc::clone(&w.pumps),
            clock: Arc::clone(&w.clock),
            metrics: Arc::clone(&w.metrics),
        }
    }
}

/// The running notifiers.
pub struct Notifiers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// How long shutdown waits for the queues to empty (`NOTIFY_SHUTDOWN_GRACE` at most).
    grace: Duration,
}

/// One target, resolved.
struct Notifier {
    cfg: NotifyConfig,
    /// `webhook#0`: how logs name it (never by its URL).
    name: String,
    /// Prefixes its ledger keys: the kind and a hash of the URL, so reordering the
    /// entries or adding one does not resend, and two targets never share keys.
    ledger_id: String,
    target: Target,
}

impl Notifiers {
    /// Resolves every target (a `url_env` that is unset or not a URL fails start-up,
    /// naming the key) and starts the tasks; each first reads the journal of the last
    /// `catch_up` back. Call inside the runtime.
    pub fn start(cfgs: &[NotifyConfig], w: Wiring) -> anyhow::Result<Notifiers> {
        let (stop, _) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut grace = Duration::ZERO;
        let now = w.clock.wall_ms();
        if !cfgs.is_empty() {
            let ledger = Arc::clone(&w.ledger);
            tokio::spawn(async move {
                if let Err(e) = ledger.forget_notified(now - NOTIFIED_KEEP.as_millis() as i64).await {
                    tracing::warn!(target: "shepherd::notify", error = %e, "could not forget old notification keys");
                }
            });
        }
        for (i, cfg) in cfgs.iter().enumerate() {
            let url = resolve_url(cfg, i, &|name| std::env::var(name).ok())?;
            let name = format!("{}#{i}", cfg.kind.as_str());
            let ledger_id = format!("{}:{:016x}", cfg.kind.as_str(), fnv1a(url.as_bytes()));
            let target = Target::new(cfg, url)?;
            tracing::info!(target: "shepherd::notify", notifier = %name, url = %target.shown(),
                events = ?cfg.events.iter().map(|e| e.as_str()).collect::<Vec<_>>(), "notifier started");
            let notifier = Arc::new(Notifier { cfg: cfg.clone(), name, ledger_id, target });
            // Subscribed before the journal is read back: no record falls between. Only
            // the actions a notifier reads: a burst of recoveries makes it miss none.
            let records = w.journal.subscribe_to(&ACTIONS);
            let (queue, messages) = mpsc::channel(cfg.queue.max(1));
            tasks.push(tokio::spawn(decide_loop(
                Arc::clone(&notifier),
                records,
                queue,
                Watch::of(&w),
                stop.subscribe(),
            )));
            tasks.push(tokio::spawn(send_loop(Arc::clone(&notifier), messages, w.clone())));
            grace = grace.max(cfg.timeout.min(NOTIFY_SHUTDOWN_GRACE));
        }
        Ok(Notifiers { stop, tasks, grace })
    }

    /// Sends what is batched and waits for the queues, at most `NOTIFY_SHUTDOWN_GRACE`.
    /// What is still unsent then is not ledgered, so the next start's catch-up sends it
    /// (when it starts within `catch_up`).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + self.grace;
        for mut task in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

/// The target's URL: `url`, or the variable `url_env` names (checked like `url`).
pub fn resolve_url(cfg: &NotifyConfig, i: usize, lookup: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let Some(var) = cfg.url_env.as_deref() else { return Ok(cfg.url.clone()) };
    let url = lookup(var).filter(|u| !u.trim().is_empty());
    let url = url.ok_or_else(|| anyhow::anyhow!("notify[{i}].url_env: the variable {var} is not set"))?;
    check_url(url.trim()).map_err(|reason| anyhow::anyhow!("notify[{i}].url_env: the URL in {var} {reason}"))?;
    Ok(url.trim().to_string())
}

/// FNV-1a, 64 bits: a stable name for a URL in the ledger (not a secret's protection:
/// the ledger is private to the user anyway).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

async fn decide_loop(
    n: Arc<Notifier>,
    mut records: QueuedRecords,
    queue: mpsc::Sender<Message>,
    w: Watch,
    mut stop: watch::Receiver<bool>,
) {
    let mut decider = Decider::new(&n.cfg);
    let mut batcher = Batcher::new(&n.cfg);
    let now = w.clock.wall_ms();
    let since = now - n.cfg.catch_up.as_millis() as i64;
    let catch_up = w.ledger.journal_since(since, &ACTIONS, CATCH_UP_MAX_RECORDS).await.unwrap_or_else(|e| {
        tracing::warn!(target: "shepherd::notify", notifier = %n.name, error = %e, "could not read the journal back; no catch-up");
        Vec::new()
    });
    for r in &catch_up {
        take(&mut decider, &mut batcher, r, now);
    }
    if !catch_up.is_empty() {
        tracing::debug!(target: "shepherd::notify", notifier = %n.name, records = catch_up.len(), "caught up with the journal");
    }
    let mut tick = tokio::time::interval(n.cfg.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = records.recv() => match r {
                Ok(r) => take(&mut decider, &mut batcher, &r, w.clock.wall_ms()),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(target: "shepherd::notify", notifier = %n.name, missed, "fell behind the journal: some occurrences may not be notified");
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = tick.tick() => {
                let now = w.clock.wall_ms();
                let streams: Vec<(String, bool)> = w.pumps.read().map(|p| {
                    p.iter().map(|(server, s)| (server.clone(), s.connected.load(std::sync::atomic::Ordering::Relaxed))).collect()
                }).unwrap_or_default();
                decider.keep_servers(&streams.iter().map(|(s, _)| s.as_str()).collect::<Vec<_>>());
                for (server, connected) in streams {
                    if let Some(o) = decider.on_stream(&server, connected, now) {
                        batcher.push(o, now);
                    }
                }
                for o in decider.due(now) {
                    batcher.push(o, now);
                }
                for m in batcher.due(now) {
                    enqueue(&n, &queue, m, &w.metrics);
                }
            }
            _ = stop.changed() => break,
        }
    }
    for m in batcher.drain() {
        enqueue(&n, &queue, m, &w.metrics);
    }
}

/// One record, read back or live: what the decider makes news of is batched, and what
/// it undoes is taken back from the batches not sent yet.
fn take(decider: &mut Decider, batcher: &mut Batcher, r: &ActionRecord, now_ms: i64) {
    if let Some(o) = decider.on_record(r) {
        batcher.push(o, now_ms);
    }
    if let Some(event) = Decider::undone_by(r) {
        batcher.withdraw(event, &r.server, &r.session);
    }
}

/// Never waits: a full queue drops the message.
fn enqueue(n: &Notifier, queue: &mpsc::Sender<Message>, m: Message, metrics: &Metrics) {
    if let Err(mpsc::error::TrySendError::Full(m)) = queue.try_send(m) {
        tracing::warn!(target: "shepherd::notify", notifier = %n.name, url = %n.target.shown(), event = m.event.as_str(),
            count = m.count(), queue = n.cfg.queue, outcome = "dropped",
            "notification dropped: the receiver is too slow and notify.queue is full");
        metrics.notification(n.cfg.kind.as_str(), m.event.as_str(), "dropped");
    }
}

async fn send_loop(n: Arc<Notifier>, mut messages: mpsc::Receiver<Message>, w: Wiring) {
    while let Some(mut m) = messages.recv().await {
        let keyed = |k: &str| format!("{}|{k}", n.ledger_id);
        let keys: Vec<String> = m.keys.iter().map(|k| keyed(k)).collect();
        let sent = w.ledger.notified(&keys).await.unwrap_or_else(|e| {
            tracing::warn!(target: "shepherd::notify", notifier = %n.name, error = %e, "could not read which notifications were sent; sending");
            Default::default()
        });
        m.items.retain(|o| !sent.contains(&keyed(&o.key)));
        let fresh: Vec<String> = keys.into_iter().filter(|k| !sent.contains(k)).collect();
        if m.items.is_empty() {
            tracing::debug!(target: "shepherd::notify", notifier = %n.name, event = m.event.as_str(), outcome = "skipped", "notification already sent (before a restart)");
            w.metrics.notification(n.cfg.kind.as_str(), m.event.as_str(), "skipped");
            continue;
        }
        let items = enrich(&m, &w, n.cfg.timeout).await;
        let request = body::request(&n.cfg, &m, &items);
        let sessions: Vec<&str> = m.items.iter().filter_map(|o| o.session.as_deref()).collect();
        let server = m.items.first().map_or("", |o| o.server.as_str());
        match n.target.post(&request).await {
            Ok(attempts) => {
                tracing::info!(target: "shepherd::notify", notifier = %n.name, url = %n.target.shown(), event = m.event.as_str(),
                    phase = m.phase, server, sessions = ?sessions, count = m.count(), attempts, outcome = "sent", "notification sent");
                w.metrics.notification(n.cfg.kind.as_str(), m.event.as_str(), "sent");
                if let Err(e) = w.ledger.mark_notified(&fresh, w.clock.wall_ms()).await {
                    tracing::warn!(target: "shepherd::notify", notifier = %n.name, error = %e, "could not ledger the notification: a restart may send it again");
                }
            }
            Err((attempts, e)) => {
                tracing::warn!(target: "shepherd::notify", notifier = %n.name, url = %n.target.shown(), event = m.event.as_str(),
                    phase = m.phase, server, sessions = ?sessions, count = m.count(), attempts, error = %e, outcome = "failed", "notification failed");
                w.metrics.notification(n.cfg.kind.as_str(), m.event.as_str(), "failed");
            }
        }
    }
}

/// Each listed occurrence with its session's title and directory (as the supervisor
/// knows them, within `timeout`), redacted.
async fn enrich(m: &Message, w: &Wiring, timeout: Duration) -> Vec<Item> {
    let mut items = Vec::with_capacity(m.items.len());
    for o in &m.items {
        let detail = match &o.session {
            Some(s) => tokio::time::timeout(timeout, w.supervisor.send(GetSession(s.clone())))
                .await
                .ok()
                .and_then(|r| r.ok())
                .and_then(|r| r.ok()),
            None => None,
        };
        let (title, directory) = detail.map_or((None, None), |d| (d.title, d.directory));
        items.push(Item { occurrence: o.clone(), title, directory }.redacted(&w.redactor));
    }
    items
}

#[cfg(test)]
mod tests {
    use shepherd_actors::config::NotifyKind;

    use super::*;

    #[test]
    fn a_url_from_the_environment_is_checked_and_an_unset_variable_names_the_key() {
        let mut cfg = NotifyConfig::new(NotifyKind::Slack, "");
        cfg.url_env = Some("HOOK".into());
        let err = resolve_url(&cfg, 1, &|_| None).unwrap_err().to_string();
        assert_eq!(err, "notify[1].url_env: the variable HOOK is not set");
        let err = resolve_url(&cfg, 1, &|_| Some("hooks.example".into())).unwrap_err().to_string();
        assert!(err.contains("must start with http"), "{err}");
        assert_eq!(resolve_url(&cfg, 1, &|_| Some("https://h.example/x ".into())).unwrap(), "https://h.example/x");
    }

    #[test]
    fn ledger_ids_are_stable_and_differ_by_url() {
        assert_eq!(fnv1a(b"http://a"), fnv1a(b"http://a"));
        assert_ne!(fnv1a(b"http://a"), fnv1a(b"http://b"));
    }
}
