//! Prometheus metrics: one edge adapter that turns what Shepherd already records into
//! the text exposition served at `GET /metrics` (by the control API; no listener of its
//! own).
//!
//! Where each number comes from — the same facts the log and the status file show:
//! - **the journal** (actions, prompts, stalls, recoveries, follow-ups, advice): a task
//!   subscribed to the journal folds every [`ActionRecord`](shepherd_actors::journal::ActionRecord)
//!   through [`journal::JournalFold`] (pure) and counts what it implies;
//! - **the supervisor, at scrape time** (sessions by state, events ingested by type,
//!   stream connected): [`Metrics::render`] is given the [`LiveView`] just read;
//! - **the event pumps, at scrape time** (frames, malformed frames, reconnects, seconds
//!   since the last frame): their [`PumpStats`] counters, registered with [`Metrics::add_pump`];
//! - **the edges where it happens** ([`edge`]): advisor model calls and ledger write errors.
//!
//! One recorder per daemon, never a global one: `metrics` allows one global recorder per
//! process, and the tests run several daemons in one process. Each [`Metrics`] owns a
//! `PrometheusRecorder` (not installed) and records through the `metrics` facade with
//! [`metrics::with_local_recorder`], so each daemon's `/metrics` shows only its own facts.
//!
//! Labels are bounded: server names, fixed words (action, outcome, prompt kind, session
//! state, event type with unknown types as `unknown`, a reason *category*); never a
//! session id, a free-text reason, a URL or anything from the configuration's secrets.

pub mod edge;
pub mod exposition;
pub mod fleet;
pub mod journal;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use shepherd_actors::event::is_known_kind;
#[cfg(doc)]
use shepherd_actors::journal::Journal;
use shepherd_actors::journal::RecordObserver;
use shepherd_actors::supervisor::LiveView;

use self::fleet::{session_state, SESSION_STATES};
use self::journal::{FollowUp, JournalFold, Observation};
use crate::opencode::PumpStats;

/// Histogram buckets of a recovery (stall detected → continue sent), seconds: the abort,
/// its poll and the wait after it take seconds; a rate-limited continue can take minutes.
const RECOVERY_BUCKETS: [f64; 10] = [1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0];
/// Histogram buckets of one call to an OpenCode server, seconds: a few ms on a quiet
/// server, the status read of a busy fleet tens of ms, `request_timeout` 10 s by default.
const OPENCODE_CALL_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Histogram buckets of one ledger write, seconds: well under a millisecond on a quiet
/// disk; a disk that stalls holds every write behind it.
const LEDGER_WRITE_BUCKETS: [f64; 10] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];
/// Histogram buckets of a stall's detection after its deadline, seconds: a few ms while
/// Shepherd keeps up with its stream, seconds while it is behind (a CPU-starved host).
const DETECTION_DELAY_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0];
/// Histogram buckets of one advisor model call, seconds (`advisor.timeout` is 5 s by default).
const ADVISOR_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0];

/// One daemon's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    pumps: Mutex<Vec<(String, Arc<PumpStats>)>>,
    /// The `shepherd_opencode_info` labels last exported per server, set to 0 when the
    /// server reports another version.
    opencode_info: Mutex<std::collections::HashMap<String, (String, &'static str)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let histograms: [(&str, &[f64]); 5] = [
            ("shepherd_recovery_duration_seconds", &RECOVERY_BUCKETS),
            ("shepherd_stall_detection_delay_seconds", &DETECTION_DELAY_BUCKETS),
            ("shepherd_advisor_call_duration_seconds", &ADVISOR_BUCKETS),
            ("shepherd_opencode_request_duration_seconds", &OPENCODE_CALL_BUCKETS),
            ("shepherd_ledger_write_duration_seconds", &LEDGER_WRITE_BUCKETS),
        ];
        let recorder = histograms
            .iter()
            .try_fold(PrometheusBuilder::new(), |b, (name, buckets)| {
                b.set_buckets_for_metric(Matcher::Full((*name).into()), buckets)
            })
            .expect("the bucket lists are constant and not empty")
            .build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics { recorder, handle, pumps: Mutex::default(), opencode_info: Mutex::default() };
        metrics.with(describe);
        Arc::new(metrics)
    }

    /// Runs `f` with this daemon's recorder as the `metrics` facade's recorder.
    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(&self.recorder, f)
    }

    /// What counts the journal's records ([`Journal::observed`]): each is folded into
    /// the counters and histograms as it is made, on the thread that records it (a few
    /// hundred nanoseconds), so none is ever missed — a subscriber reading the broadcast
    /// on a busy thread fell behind a burst of 10,000 recoveries and lost records.
    pub fn journal_observer(self: &Arc<Self>) -> RecordObserver {
        let metrics = Arc::clone(self);
        let fold = Mutex::new(JournalFold::new());
        Arc::new(move |record| {
            let observations = fold.lock().unwrap_or_else(std::sync::PoisonError::into_inner).observe(record);
            metrics.with(|| observations.iter().for_each(apply));
        })
    }

    /// Exports this pump's counters (per server) from now on.
    pub fn add_pump(&self, server: &str, stats: Arc<PumpStats>) {
        if let Ok(mut pumps) = self.pumps.lock() {
            pumps.retain(|(name, _)| name != server);
            pumps.push((server.to_string(), stats));
        }
    }

    /// Stops sampling a server's pump (the server left the configuration). The series
    /// already exported keep their last value until the process restarts.
    pub fn remove_pump(&self, server: &str) {
        if let Ok(mut pumps) = self.pumps.lock() {
            pumps.retain(|(name, _)| name != server);
        }
    }

    /// One ledger write ended after `seconds`, failed or not.
    pub fn ledger_write(&self, operation: &'static str, seconds: f64) {
        self.with(|| histogram!("shepherd_ledger_write_duration_seconds", "operation" => operation).record(seconds));
    }

    /// One ledger write failed.
    pub fn ledger_write_error(&self, operation: &'static str) {
        self.with(|| counter!("shepherd_ledger_write_errors_total", "operation" => operation).increment(1));
    }

    /// One notification (or batch) ended: `sent`, `failed` (after its retries),
    /// `dropped` (the queue was full) or `skipped` (already sent before a restart).
    pub fn notification(&self, kind: &'static str, event: &'static str, outcome: &'static str) {
        self.with(|| {
            counter!("shepherd_notifications_total", "kind" => kind, "event" => event, "outcome" => outcome)
                .increment(1)
        });
    }

    /// One advisor model call ended (`ok`, `error`, `timeout`) after `seconds`.
    pub fn advisor_call(&self, outcome: &'static str, seconds: f64) {
        self.with(|| {
            counter!("shepherd_advisor_calls_total", "outcome" => outcome).increment(1);
            histogram!("shepherd_advisor_call_duration_seconds", "outcome" => outcome).record(seconds);
        });
    }

    /// One call to OpenCode server `server` ended after `seconds` (see
    /// [`CallTimer`](crate::opencode::client::CallTimer): `call` is a template, never
    /// an id).
    pub fn opencode_call(&self, server: &str, call: &str, outcome: &'static str, seconds: f64) {
        self.with(|| {
            histogram!(
                "shepherd_opencode_request_duration_seconds",
                "server" => server.to_string(),
                "call" => call.to_string(),
                "outcome" => outcome
            )
            .record(seconds)
        });
    }

    /// The exposition, with the scrape-time facts taken from `fleet` and the pumps.
    pub fn render(&self, fleet: &LiveView) -> String {
        self.with(|| {
            sample_fleet(fleet);
            self.sample_pumps();
            counter!("shepherd_log_lines_dropped_total").absolute(crate::logging::dropped_lines());
        });
        self.handle.render()
    }

    /// The exposition of what is recorded so far, without sampling anything (tests).
    pub fn render_now(&self) -> String {
        self.handle.render()
    }

    /// `shepherd_opencode_info{server,version,supported}` = 1 for the version read at the
    /// latest connect; a version reported before on this server drops to 0.
    fn export_opencode_version(&self, server: &str, version: String) {
        use crate::opencode::version::{assess, Support};
        let supported = if matches!(assess(&version), Support::Supported(_)) { "yes" } else { "no" };
        let Ok(mut exported) = self.opencode_info.lock() else { return };
        let now = (version, supported);
        if let Some((old, old_supported)) = exported.insert(server.to_string(), now.clone()) {
            if old != now.0 {
                gauge!("shepherd_opencode_info", "server" => server.to_string(), "version" => old, "supported" => old_supported)
                    .set(0.0);
            }
        }
        gauge!("shepherd_opencode_info", "server" => server.to_string(), "version" => now.0, "supported" => now.1)
            .set(1.0);
    }

    fn sample_pumps(&self) {
        let Ok(pumps) = self.pumps.lock() else { return };
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        for (server, stats) in pumps.iter() {
            let server = server.clone();
            counter!("shepherd_stream_frames_total", "server" => server.clone())
                .absolute(stats.frames.load(Ordering::Relaxed));
            counter!("shepherd_events_malformed_total", "server" => server.clone())
                .absolute(stats.malformed.load(Ordering::Relaxed));
            // The first connect is no reconnect.
            let connects = stats.connects.load(Ordering::Relaxed);
            counter!("shepherd_stream_reconnects_total", "server" => server.clone())
                .absolute(connects.saturating_sub(1));
            if let Some(version) = stats.opencode_version() {
                self.export_opencode_version(&server, version);
            }
            let lag = stats.lag().unwrap_or_default().as_secs_f64();
            gauge!("shepherd_stream_lag_seconds", "server" => server.clone()).set(lag);
            counter!("shepherd_deadlines_waited_for_stream_total", "server" => server.clone())
                .absolute(stats.clock.deferred());
            let last = stats.last_frame_ms.load(Ordering::Relaxed);
            if last > 0 {
                let age = (now_ms - last).max(0) as f64 / 1000.0;
                gauge!("shepherd_stream_last_event_age_seconds", "server" => server).set(age);
            }
        }
    }
}

/// One observation from the journal, counted.
fn apply(o: &Observation) {
    match *o {
        Observation::Action { action, outcome, reason } => {
            counter!("shepherd_actions_total", "action" => action, "outcome" => outcome, "reason" => reason)
                .increment(1);
        }
        Observation::Prompt { kind, outcome } => {
            counter!("shepherd_prompts_total", "kind" => kind, "outcome" => outcome).increment(1);
        }
        Observation::StallDetected { late_seconds } => {
            counter!("shepherd_stall_detections_total").increment(1);
            if let Some(seconds) = late_seconds {
                histogram!("shepherd_stall_detection_delay_seconds").record(seconds);
            }
        }
        Observation::Recovery { outcome, seconds } => {
            counter!("shepherd_recoveries_total", "outcome" => outcome).increment(1);
            if let Some(seconds) = seconds {
                histogram!("shepherd_recovery_duration_seconds").record(seconds);
            }
        }
        Observation::FollowUp { metric, outcome } => {
            let name = match metric {
                FollowUp::Nudge => "shepherd_nudges_total",
                FollowUp::Review => "shepherd_reviews_total",
                FollowUp::Compaction => "shepherd_compactions_total",
                FollowUp::Handoff => "shepherd_handoffs_total",
            };
            counter!(name, "outcome" => outcome).increment(1);
        }
        Observation::Advice { source } => counter!("shepherd_advice_total", "source" => source).increment(1),
    }
}

/// Sessions by server and state, events by server and type, stream state: set from the
/// supervisor's view (every state of every server, so a state left reads 0).
fn sample_fleet(fleet: &LiveView) {
    let now_ms = shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock);
    gauge!("shepherd_fleet_paused").set(f64::from(u8::from(fleet.fleet_paused)));
    // One pass over the fleet (100,000 sessions at a scrape), counted by server and state.
    let mut counts: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    for s in &fleet.sessions {
        *counts.entry((&*s.server, session_state(s, now_ms))).or_default() += 1;
    }
    for server in &fleet.servers {
        let name = server.name.clone();
        for state in SESSION_STATES {
            let n = counts.get(&(name.as_str(), state)).copied().unwrap_or(0);
            gauge!("shepherd_sessions", "server" => name.clone(), "state" => state).set(n as f64);
        }
        gauge!("shepherd_stream_connected", "server" => name.clone()).set(f64::from(u8::from(server.connected)));
        gauge!("shepherd_server_ready", "server" => name.clone())
            .set(f64::from(u8::from(server.connected && server.reconciled)));
        let mut unknown = 0;
        for (kind, n) in &server.events {
            if is_known_kind(kind) {
                counter!("shepherd_events_ingested_total", "server" => name.clone(), "type" => kind.clone())
                    .absolute(*n);
            } else {
                unknown += n;
            }
        }
        counter!("shepherd_events_ingested_total", "server" => name.clone(), "type" => "unknown").absolute(unknown);
        counter!("shepherd_events_unknown_total", "server" => name).absolute(unknown);
    }
}

/// HELP lines and units of every metric.
fn describe() {
    describe_counter!(
        "shepherd_notifications_total",
        "Notifications ([[notify]]) by kind, event and outcome (sent, failed, dropped, skipped); a batch counts once"
    );
    describe_gauge!("shepherd_sessions", "Sessions in memory by server and state (read at scrape time)");
    describe_gauge!("shepherd_fleet_paused", "1 while the fleet is paused (shepherd pause --all), else 0");
    describe_counter!(
        "shepherd_actions_total",
        "Journal records: actions taken (done), declined or failed, by action, outcome and reason category"
    );
    describe_counter!(
        "shepherd_prompts_total",
        "Prompts by kind and outcome (sent, deduplicated, rate_limited, declined, failed)"
    );
    describe_counter!("shepherd_stall_detections_total", "Busy sessions found without progress past their timeout");
    describe_histogram!(
        "shepherd_stall_detection_delay_seconds",
        Unit::Seconds,
        "How long after its deadline a stall was detected (the timer's lateness and the wait for events read before the deadline)"
    );
    describe_counter!("shepherd_recoveries_total", "Recoveries (abort + continue) by outcome");
    describe_histogram!(
        "shepherd_recovery_duration_seconds",
        Unit::Seconds,
        "Time from a stall's detection to its continue being sent"
    );
    describe_counter!("shepherd_nudges_total", "Nudges (idle with open todos) by outcome");
    describe_counter!("shepherd_reviews_total", "Reviews (all todos done) by outcome");
    describe_counter!("shepherd_compactions_total", "Compactions by outcome");
    describe_counter!("shepherd_handoffs_total", "Hand-offs to a fresh session: completed, declined, failed");
    describe_counter!("shepherd_advice_total", "Advisor consultations by where the answer came from");
    describe_counter!("shepherd_advisor_calls_total", "Advisor model calls by outcome (ok, error, timeout)");
    describe_histogram!("shepherd_advisor_call_duration_seconds", Unit::Seconds, "Advisor model call latency");
    describe_histogram!(
        "shepherd_opencode_request_duration_seconds",
        Unit::Seconds,
        "Calls to an OpenCode server by call and outcome (ok, http_error, failed): sent to the answer's head"
    );
    describe_counter!("shepherd_ledger_write_errors_total", "Failed ledger writes by operation");
    describe_histogram!(
        "shepherd_ledger_write_duration_seconds",
        Unit::Seconds,
        "Ledger writes by operation, failed ones included"
    );
    describe_counter!(
        "shepherd_events_ingested_total",
        "Decoded stream events by server and type (types Shepherd does not know: unknown)"
    );
    describe_counter!("shepherd_events_unknown_total", "Stream events of a type Shepherd does not know");
    describe_counter!("shepherd_events_malformed_total", "Stream frames that could not be decoded (skipped)");
    describe_counter!("shepherd_stream_frames_total", "Stream frames received, heartbeats included");
    describe_counter!("shepherd_stream_reconnects_total", "Event-stream connects after the first");
    describe_gauge!(
        "shepherd_stream_lag_seconds",
        "How far behind the server Shepherd works: time since everything it sent was handled (0 when keeping up)"
    );
    describe_counter!(
        "shepherd_deadlines_waited_for_stream_total",
        "Session deadlines that passed while events were still waiting to be handled, and waited for them"
    );
    describe_gauge!("shepherd_stream_connected", "1 while the server's event stream is connected");
    describe_gauge!("shepherd_server_ready", "1 while the stream is connected and reconciled (see /readyz)");
    describe_gauge!(
        "shepherd_opencode_info",
        "1 for the OpenCode version the server reported at its latest connect (supported: yes/no)"
    );
    describe_gauge!(
        "shepherd_stream_last_event_age_seconds",
        Unit::Seconds,
        "Seconds since the server's last stream frame (OpenCode sends a heartbeat every 10 s)"
    );
    describe_counter!(
        "shepherd_log_lines_dropped_total",
        "Log lines dropped because the log's reader did not keep up (supervision never waits for it)"
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use shepherd_actors::journal::{Action, Journal, Outcome};
    use shepherd_actors::supervisor::ServerView;

    use super::exposition::{parse, value};
    use super::*;

    use super::journal::tests::rec;

    /// The journal's records are counted as they are made: read back at once, and not
    /// one lost to a burst larger than the journal keeps for its subscribers.
    #[test]
    fn journal_records_become_counters_and_detection_and_recovery_histograms_without_session_ids() {
        let metrics = Metrics::new();
        let journal = Journal::observed(metrics.journal_observer());
        let _unread = journal.subscribe(); // a subscriber that never reads
        let mut detected = rec("ses_secret_1", 1_000, Action::StallDetected, Outcome::Done, "no progress");
        detected.numbers.late_ms = Some(40);
        journal.record(detected);
        journal.record(rec("ses_secret_1", 2_000, Action::Abort, Outcome::Done, "stalled session aborted"));
        journal.record(rec("ses_secret_1", 4_000, Action::Continue, Outcome::Done, "continue sent"));
        journal.record(rec("ses_secret_2", 5_000, Action::Nudge, Outcome::Done, "nudge sent"));
        let text = metrics.render_now();
        let s = parse(&text);
        assert_eq!(value(&s, "shepherd_nudges_total", &[("outcome", "done")]), Some(1.0));
        assert_eq!(value(&s, "shepherd_stall_detections_total", &[]), Some(1.0));
        assert_eq!(value(&s, "shepherd_stall_detection_delay_seconds_count", &[]), Some(1.0));
        assert_eq!(value(&s, "shepherd_stall_detection_delay_seconds_bucket", &[("le", "0.025")]), Some(0.0));
        assert_eq!(value(&s, "shepherd_stall_detection_delay_seconds_bucket", &[("le", "0.05")]), Some(1.0));
        assert_eq!(value(&s, "shepherd_recovery_duration_seconds_count", &[]), Some(1.0));
        assert_eq!(value(&s, "shepherd_recovery_duration_seconds_sum", &[]), Some(3.0));
        assert_eq!(value(&s, "shepherd_recovery_duration_seconds_bucket", &[("le", "2")]), Some(0.0));
        assert_eq!(value(&s, "shepherd_recovery_duration_seconds_bucket", &[("le", "3")]), Some(1.0));
        assert_eq!(value(&s, "shepherd_prompts_total", &[("kind", "continue"), ("outcome", "sent")]), Some(1.0));
        assert_eq!(
            value(&s, "shepherd_actions_total", &[("action", "abort"), ("outcome", "done"), ("reason", "none")]),
            Some(1.0)
        );
        assert!(!text.contains("ses_secret"), "no session id in the exposition:\n{text}");

        // A burst of recoveries, twice what the journal keeps for a subscriber.
        for i in 0..5_000 {
            let id = format!("ses_burst_{i}");
            journal.record(rec(&id, 10_000, Action::StallDetected, Outcome::Done, "no progress"));
            journal.record(rec(&id, 10_500, Action::Abort, Outcome::Done, "stalled session aborted"));
        }
        let s = parse(&metrics.render_now());
        assert_eq!(value(&s, "shepherd_stall_detections_total", &[]), Some(5_001.0), "none missed");
    }

    #[test]
    fn every_state_of_every_server_is_exported_and_unknown_event_types_are_one_label() {
        let metrics = Metrics::new();
        let events = BTreeMap::from([
            ("session.status".to_string(), 5),
            ("plugin.added".to_string(), 2),
            ("lsp.updated".to_string(), 1),
        ]);
        let fleet = LiveView {
            fleet_paused: false,
            servers: vec![ServerView { name: "local".into(), connected: true, reconciled: false, events }],
            sessions: vec![],
        };
        let s = parse(&metrics.render(&fleet));
        for state in SESSION_STATES {
            assert_eq!(value(&s, "shepherd_sessions", &[("server", "local"), ("state", state)]), Some(0.0), "{state}");
        }
        let ingested = |t| value(&s, "shepherd_events_ingested_total", &[("server", "local"), ("type", t)]);
        assert_eq!(ingested("session.status"), Some(5.0));
        assert_eq!(ingested("unknown"), Some(3.0));
        assert_eq!(ingested("plugin.added"), None);
        assert_eq!(value(&s, "shepherd_stream_connected", &[("server", "local")]), Some(1.0));
        assert_eq!(value(&s, "shepherd_server_ready", &[("server", "local")]), Some(0.0));
    }

    /// Each server's sessions are counted by state (a scrape reads the whole fleet in
    /// one pass), and a paused fleet says so.
    #[test]
    fn sessions_are_counted_by_their_server_and_state() {
        use shepherd_actors::control::SessionDetail;
        use shepherd_actors::stats::LiveSession;
        let metrics = Metrics::new();
        let server =
            |name: &str| ServerView { name: name.into(), connected: true, reconciled: true, events: BTreeMap::new() };
        let session =
            |server: &str, id: &str, busy| LiveSession::from(&SessionDetail { busy, ..SessionDetail::new(server, id) });
        let fleet = LiveView {
            servers: vec![server("a"), server("b")],
            sessions: vec![session("a", "ses_1", true), session("a", "ses_2", true), session("b", "ses_3", false)],
            fleet_paused: true,
        };
        let s = parse(&metrics.render(&fleet));
        let sessions = |server, state| value(&s, "shepherd_sessions", &[("server", server), ("state", state)]);
        assert_eq!(sessions("a", "working"), Some(2.0));
        assert_eq!(sessions("a", "idle"), Some(0.0));
        assert_eq!(sessions("b", "idle"), Some(1.0));
        assert_eq!(sessions("b", "working"), Some(0.0));
        assert_eq!(value(&s, "shepherd_fleet_paused", &[]), Some(1.0));
    }

    #[test]
    fn the_opencode_version_read_at_connect_is_an_info_series_and_an_upgrade_zeroes_the_old_one() {
        let metrics = Metrics::new();
        let stats = Arc::new(PumpStats::default());
        metrics.add_pump("local", Arc::clone(&stats));
        let fleet = LiveView::default();
        let info = |s: &_, v, ok| {
            value(s, "shepherd_opencode_info", &[("server", "local"), ("version", v), ("supported", ok)])
        };
        assert_eq!(info(&parse(&metrics.render(&fleet)), "1.18.34", "yes"), None, "nothing before the first read");
        *stats.opencode_version.write().unwrap() = Some("1.14.41".into());
        assert_eq!(info(&parse(&metrics.render(&fleet)), "1.14.41", "no"), Some(1.0));
        *stats.opencode_version.write().unwrap() = Some("1.18.34".into());
        let s = parse(&metrics.render(&fleet));
        assert_eq!(info(&s, "1.18.34", "yes"), Some(1.0));
        assert_eq!(info(&s, "1.14.41", "no"), Some(0.0));
    }

    #[test]
    fn a_call_to_opencode_is_a_histogram_by_server_call_and_outcome() {
        let metrics = Metrics::new();
        metrics.opencode_call("local", "GET /session/status", "ok", 0.004);
        metrics.opencode_call("local", "GET /session/status", "ok", 0.3);
        metrics.opencode_call("local", "POST /session/{id}/abort", "failed", 10.0);
        let s = parse(&metrics.render_now());
        let status = [("server", "local"), ("call", "GET /session/status"), ("outcome", "ok")];
        assert_eq!(value(&s, "shepherd_opencode_request_duration_seconds_count", &status), Some(2.0));
        let within = |le| value(&s, "shepherd_opencode_request_duration_seconds_bucket", &[status[0], status[1], status[2], ("le", le)]);
        assert_eq!(within("0.005"), Some(1.0), "the quick read within 5 ms");
        assert_eq!(within("0.5"), Some(2.0));
        let abort = [("server", "local"), ("call", "POST /session/{id}/abort"), ("outcome", "failed")];
        assert_eq!(value(&s, "shepherd_opencode_request_duration_seconds_count", &abort), Some(1.0));
    }

    #[test]
    fn two_daemons_in_one_process_keep_their_own_numbers() {
        let a = Metrics::new();
        let b = Metrics::new();
        a.ledger_write_error("save");
        assert_eq!(value(&parse(&a.render_now()), "shepherd_ledger_write_errors_total", &[]), Some(1.0));
        assert_eq!(value(&parse(&b.render_now()), "shepherd_ledger_write_errors_total", &[]), None);
    }
}
