//! The decider task under paused tokio time: the `after` clock, the catch-up after a
//! restart, and a full queue that drops instead of waiting.

use std::sync::atomic::Ordering;
use std::time::Duration;

use shepherd_actors::config::{NotifyConfig, NotifyEvent, NotifyKind};
use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
use shepherd_actors::ledger::{Ledger, MemoryLedger};
use tokio::time::Instant;

use super::*;
use crate::opencode::PumpStats;

/// Wall time that follows tokio's (paused) clock.
struct PausedClock {
    mono: Instant,
    wall_ms: i64,
}

impl Clock for PausedClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall_ms(&self) -> i64 {
        self.wall_ms + Instant::now().duration_since(self.mono).as_millis() as i64
    }
}

const T0: i64 = 1_700_000_000_000;

struct Bench {
    journal: Journal,
    messages: mpsc::Receiver<Message>,
    metrics: Arc<Metrics>,
    pumps: PumpTable,
    _stop: watch::Sender<bool>,
}

fn rec(session: &str, at_ms: i64, action: Action, outcome: Outcome, numbers: Numbers) -> ActionRecord {
    let reason = "a question or permission waits for the person".to_string();
    ActionRecord { server: "local".into(), session: session.into(), action, outcome, reason, numbers, at_ms }
}

fn waits(session: &str, at_ms: i64) -> ActionRecord {
    let n = Numbers { waits_on: Some("que_1".into()), ..Numbers::default() };
    rec(session, at_ms, Action::WaitsOnPerson, Outcome::Done, n)
}

async fn bench(cfg: NotifyConfig, ledger: Arc<MemoryLedger>) -> Bench {
    let journal = Journal::new();
    let metrics = Metrics::new();
    let pumps: PumpTable = Arc::default();
    let clock: Arc<dyn Clock> = Arc::new(PausedClock { mono: Instant::now(), wall_ms: T0 });
    let target = Target::new(&cfg, "http://127.0.0.1:9/".into()).unwrap();
    let n = Arc::new(Notifier { cfg: cfg.clone(), name: "webhook#0".into(), ledger_id: "t".into(), target });
    let (queue, messages) = mpsc::channel(cfg.queue);
    let (stop, stopped) = watch::channel(false);
    let w = Watch { ledger, pumps: Arc::clone(&pumps), clock, metrics: Arc::clone(&metrics) };
    tokio::spawn(decide_loop(n, journal.subscribe_to(&super::decide::ACTIONS), queue, w, stopped));
    tokio::time::sleep(Duration::from_millis(1)).await; // the task has read the journal back
    Bench { journal, messages, metrics, pumps, _stop: stop }
}

fn cfg() -> NotifyConfig {
    let mut c = NotifyConfig::new(NotifyKind::Webhook, "http://127.0.0.1:9/");
    c.after = Duration::from_secs(600);
    c.batch_window = Duration::from_secs(5);
    c.unreachable_after = Duration::from_secs(60);
    c
}

#[tokio::test(start_paused = true)]
async fn a_wait_is_sent_after_after_plus_the_batch_window_and_not_before() {
    let mut b = bench(cfg(), Arc::default()).await;
    b.journal.record(waits("ses_a", T0));
    tokio::time::sleep(Duration::from_secs(599)).await;
    assert!(b.messages.try_recv().is_err(), "not before `after`");
    tokio::time::sleep(Duration::from_secs(1 + 5 + 1)).await;
    let m = b.messages.try_recv().expect("due after `after` and the batch window");
    assert_eq!((m.event, m.count()), (NotifyEvent::WaitingOnPerson, 1));
    assert_eq!(m.keys, vec!["waiting_on_person|local|ses_a|que_1".to_string()]);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(b.messages.try_recv().is_err(), "once");
}

#[tokio::test(start_paused = true)]
async fn a_wait_answered_within_after_is_never_sent() {
    let mut b = bench(cfg(), Arc::default()).await;
    b.journal.record(waits("ses_a", T0));
    tokio::time::sleep(Duration::from_secs(300)).await;
    b.journal.record(rec("ses_a", T0 + 300_000, Action::WaitEnded, Outcome::Done, Numbers::default()));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(b.messages.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_a_wait_read_back_from_the_ledger_keeps_its_clock() {
    let ledger = Arc::new(MemoryLedger::default());
    ledger.append(&waits("ses_a", T0 - 540_000)).await.unwrap(); // asked 9 minutes before the start
    let mut b = bench(cfg(), ledger).await;
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(b.messages.try_recv().is_err());
    tokio::time::sleep(Duration::from_secs(10 + 5 + 1)).await;
    assert_eq!(b.messages.try_recv().expect("due a minute after the start").event, NotifyEvent::WaitingOnPerson);
}

/// At a start the journal is read back: a pause the person already ended is no news,
/// and a session paused, resumed and paused again is listed once (it was listed twice,
/// its old pause beside its new); so is a pause ended live before its batch went out.
#[tokio::test(start_paused = true)]
async fn a_pause_resumed_before_it_was_told_is_not_told_and_a_session_is_listed_once() {
    let ledger = Arc::new(MemoryLedger::default());
    let pause = |s: &str, at| rec(s, at, Action::Pause, Outcome::Done, Numbers::default());
    let resume = |s: &str, at| rec(s, at, Action::Resume, Outcome::Done, Numbers::default());
    for r in [pause("ses_a", T0 - 300_000), resume("ses_a", T0 - 200_000), pause("ses_a", T0 - 100_000)] {
        ledger.append(&r).await.unwrap();
    }
    ledger.append(&pause("ses_b", T0 - 250_000)).await.unwrap();
    ledger.append(&resume("ses_b", T0 - 150_000)).await.unwrap();
    let mut b = bench(cfg(), ledger).await;
    b.journal.record(pause("ses_c", T0 + 1_000));
    b.journal.record(resume("ses_c", T0 + 2_000));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let m = b.messages.try_recv().expect("the pause still in force");
    let listed: Vec<_> = m.items.iter().filter_map(|o| o.session.as_deref()).collect();
    assert_eq!((m.event, listed, m.more), (NotifyEvent::Paused, vec!["ses_a"], 0));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(b.messages.try_recv().is_err(), "nothing else: ses_b and ses_c were resumed");
}

#[tokio::test(start_paused = true)]
async fn many_sessions_giving_up_within_the_window_are_one_message() {
    let mut b = bench(cfg(), Arc::default()).await;
    for i in 0..12 {
        b.journal.record(rec(&format!("ses_{i}"), T0 + i, Action::GiveUp, Outcome::Done, Numbers::default()));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let m = b.messages.try_recv().unwrap();
    assert_eq!((m.event, m.count()), (NotifyEvent::GaveUp, 12));
    assert!(b.messages.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_and_counts_instead_of_waiting() {
    let mut c = cfg();
    c.queue = 1;
    c.batch_window = Duration::ZERO;
    let mut b = bench(c, Arc::default()).await;
    for (i, action) in [Action::GiveUp, Action::Pause].into_iter().enumerate() {
        b.journal.record(rec("ses_a", T0 + i as i64, action, Outcome::Done, Numbers::default()));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    b.journal.record(rec("ses_b", T0 + 5, Action::GiveUp, Outcome::Done, Numbers::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(b.messages.try_recv().unwrap().event, NotifyEvent::GaveUp);
    assert!(b.messages.try_recv().is_err(), "the queue held one");
    let text = b.metrics.render_now();
    assert!(
        text.lines().any(|l| l.starts_with("shepherd_notifications_total{") && l.contains("outcome=\"dropped\"")),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_down_past_unreachable_after_is_told_and_so_is_its_return() {
    let mut b = bench(cfg(), Arc::default()).await;
    let stats = Arc::new(PumpStats::default());
    b.pumps.write().unwrap().push(("local".into(), Arc::clone(&stats)));
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert!(b.messages.try_recv().is_err(), "not before the grace");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let down = b.messages.try_recv().expect("down past the grace");
    assert_eq!((down.event, down.phase), (NotifyEvent::ServerUnreachable, Some("began")));
    stats.connected.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(b.messages.try_recv().expect("back").phase, Some("ended"));
}
