//! Per-session statistics, built from the journal, and the status document made of them.
//!
//! Pure: [`StatsBook::apply`] folds one [`ActionRecord`] in; [`StatsBook::document`]
//! joins the statistics with what the supervisor knows now (status, todos, tokens) into
//! the [`StatusDocument`] the status file holds. Nothing here reads a clock or touches a
//! file: the status writer (an edge adapter in the binary) does, off the actors' thread.
//!
//! [`SessionStats`] is a plain serialisable struct so a metrics endpoint can export it
//! as it is. The fold is here; the document and the session states are `document.rs`.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::journal::HistoryEntry;
use crate::journal::{Action, ActionRecord, Outcome};

/// The status document's format version (bumped on incompatible changes).
pub const STATUS_VERSION: u32 = 1;

/// How many recovery times are kept for the histogram (the newest; older ones drop).
const HISTOGRAM_SAMPLES: usize = 256;

/// How many part types the stall patterns list.
pub const TOP_PATTERNS: usize = 5;

/// What Shepherd did to one session, counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    pub server: String,
    /// Epoch ms of the first record about the session.
    pub first_seen_ms: i64,
    pub last_record_ms: i64,
    pub recovery: RecoveryStats,
    pub stall: StallStats,
    pub nudge: Counts,
    pub review: Counts,
    pub compaction: Counts,
    /// Hand-offs: `done` = completed, `failed`, `declined` (e.g. the loop guard).
    pub handoff: Counts,
    /// Escalations after repeated continues.
    pub escalations: u32,
    /// Spinning tool runs reported.
    pub spinning_tools: u32,
    /// Prompts sent as the tool-call-as-text prompt.
    pub tool_calls_as_text: u32,
    /// The latest context size and window seen in a record.
    pub tokens: Option<u64>,
    pub window: Option<u64>,
    /// The newest records, oldest first.
    pub history: VecDeque<HistoryEntry>,
}

/// Recoveries: a stall detected (or an orphan/interrupted turn taken up) is an attempt;
/// its continue sent is a success; a continue that could not be sent, a failed abort or
/// giving up is a failure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecoveryStats {
    pub attempts: u32,
    pub successes: u32,
    pub failures: u32,
    pub last_attempt_ms: Option<i64>,
    /// Time from the stall's detection to its continue, milliseconds (newest samples).
    pub recover_ms: VecDeque<u64>,
    /// The attempt under way (epoch ms of its detection).
    #[serde(skip)]
    pending_since_ms: Option<i64>,
}

/// Stalls and where they happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StallStats {
    pub detections: u32,
    /// The type of the last part before the latest stall.
    pub last_part: Option<String>,
    /// Stalls per last part type.
    pub by_last_part: BTreeMap<String, u32>,
}

/// Done / declined / failed counts of one kind of action.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub done: u32,
    pub declined: u32,
    pub failed: u32,
    pub last_ms: Option<i64>,
}

impl Counts {
    fn add(&mut self, r: &ActionRecord) {
        match r.outcome {
            Outcome::Done => self.done += 1,
            Outcome::Declined => self.declined += 1,
            Outcome::Failed => self.failed += 1,
        }
        self.last_ms = Some(r.at_ms);
    }
}

/// min / median / max of a set of durations, and how many there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    pub min_ms: Option<u64>,
    pub median_ms: Option<u64>,
    pub max_ms: Option<u64>,
    pub samples: usize,
}

impl Histogram {
    pub fn of<'a>(values: impl IntoIterator<Item = &'a u64>) -> Self {
        let mut v: Vec<u64> = values.into_iter().copied().collect();
        v.sort_unstable();
        Histogram {
            min_ms: v.first().copied(),
            median_ms: (!v.is_empty()).then(|| v[v.len() / 2]),
            max_ms: v.last().copied(),
            samples: v.len(),
        }
    }
}

impl SessionStats {
    fn apply(&mut self, r: &ActionRecord, reason: Arc<str>, max_history: usize) {
        self.last_record_ms = r.at_ms;
        if r.numbers.context_tokens.is_some() {
            self.tokens = r.numbers.context_tokens;
        }
        if r.numbers.context_window.is_some() {
            self.window = r.numbers.context_window;
        }
        let rec = &mut self.recovery;
        match (r.action, r.outcome) {
            (Action::StallDetected, Outcome::Done) => {
                self.stall.detections += 1;
                let part = r.numbers.last_part.clone().unwrap_or_else(|| "unknown".to_string());
                *self.stall.by_last_part.entry(part.clone()).or_default() += 1;
                self.stall.last_part = Some(part);
                rec.attempts += 1;
                rec.last_attempt_ms = Some(r.at_ms);
                rec.pending_since_ms = Some(r.at_ms);
            }
            // An orphaned or interrupted turn taken up: an attempt without a stall.
            (Action::Recover, Outcome::Done) => {
                rec.attempts += 1;
                rec.last_attempt_ms = Some(r.at_ms);
                rec.pending_since_ms = Some(r.at_ms);
            }
            // Nothing reached the session: the attempt did not happen.
            (Action::Recover, Outcome::Declined) if rec.pending_since_ms.take().is_some() => {
                rec.attempts = rec.attempts.saturating_sub(1);
            }
            (Action::Recover | Action::Continue, Outcome::Failed) | (Action::GiveUp, Outcome::Done) => {
                rec.failures += 1;
                rec.pending_since_ms = None;
            }
            (Action::Continue, Outcome::Done) => {
                if let Some(since) = rec.pending_since_ms.take() {
                    rec.successes += 1;
                    rec.recover_ms.push_back(r.at_ms.saturating_sub(since).max(0) as u64);
                    if rec.recover_ms.len() > HISTOGRAM_SAMPLES {
                        rec.recover_ms.pop_front();
                    }
                }
            }
            (Action::Nudge, _) => self.nudge.add(r),
            (Action::Review, _) => self.review.add(r),
            (Action::Compact, _) => self.compaction.add(r),
            (Action::Handoff, outcome) => {
                match outcome {
                    Outcome::Done if r.numbers.phase.as_deref() == Some("completed") => self.handoff.done += 1,
                    Outcome::Done => {}
                    Outcome::Declined => self.handoff.declined += 1,
                    Outcome::Failed => self.handoff.failed += 1,
                }
                self.handoff.last_ms = Some(r.at_ms);
            }
            (Action::Escalate, Outcome::Done) => self.escalations += 1,
            (Action::SpinningTool, Outcome::Done) => self.spinning_tools += 1,
            _ => {}
        }
        if matches!(r.action, Action::Continue | Action::Nudge)
            && r.outcome == Outcome::Done
            && r.reason.contains("tool-call-as-text")
        {
            self.tool_calls_as_text += 1;
        }
        self.history.push_back(HistoryEntry { at_ms: r.at_ms, action: r.action, outcome: r.outcome, reason });
        while self.history.len() > max_history {
            self.history.pop_front();
        }
    }

    /// The time-to-recover histogram.
    pub fn recover_histogram(&self) -> Histogram {
        Histogram::of(&self.recovery.recover_ms)
    }

    /// The [`TOP_PATTERNS`] part types most stalls happened after, most first.
    pub fn top_patterns(&self) -> Vec<PatternCount> {
        let mut v: Vec<PatternCount> = self
            .stall
            .by_last_part
            .iter()
            .map(|(part, count)| PatternCount { part: part.clone(), count: *count })
            .collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.part.cmp(&b.part)));
        v.truncate(TOP_PATTERNS);
        v
    }
}

/// Statistics of every session Shepherd acted on, keyed by session id. Boxed: the
/// table keeps spare slots, and a slot is then a pointer rather than a whole record.
#[derive(Debug, Default)]
pub struct StatsBook {
    sessions: HashMap<String, Box<SessionStats>>,
    max_history: usize,
    /// One copy of each reason the histories hold (most reasons recur across sessions
    /// and records); texts no history holds any more are dropped by `forget_quiet`.
    reasons: HashSet<Arc<str>>,
}

impl StatsBook {
    pub fn new(max_history: usize) -> Self {
        Self { sessions: HashMap::new(), max_history, reasons: HashSet::new() }
    }

    /// Folds one record in.
    pub fn apply(&mut self, r: &ActionRecord) {
        let reason = match self.reasons.get(r.reason.as_str()) {
            Some(shared) => Arc::clone(shared),
            None => {
                let shared: Arc<str> = r.reason.as_str().into();
                self.reasons.insert(Arc::clone(&shared));
                shared
            }
        };
        let stats = self.sessions.entry(r.session.clone()).or_insert_with(|| {
            Box::new(SessionStats { server: r.server.clone(), first_seen_ms: r.at_ms, ..SessionStats::default() })
        });
        stats.apply(r, reason, self.max_history);
    }

    pub fn get(&self, session: &str) -> Option<&SessionStats> {
        self.sessions.get(session).map(|s| &**s)
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Forgets sessions that are not `live` and had no record for `forget_after_ms`.
    pub fn forget_quiet(&mut self, live: &[LiveSession], now_ms: i64, forget_after_ms: i64) {
        let live: std::collections::HashSet<&str> = live.iter().map(|d| &*d.id).collect();
        self.sessions.retain(|id, s| live.contains(id.as_str()) || now_ms - s.last_record_ms < forget_after_ms);
        self.reasons.retain(|reason| Arc::strong_count(reason) > 1);
    }

    /// The status document at `now_ms`: every live session (as `live` was read at
    /// `live_at_ms`) and every session with statistics, and each server's stream. The one
    /// builder of the status file and `GET /v1/status`.
    ///
    /// A live session's state and quiet time are as of `live_at_ms`, not `now_ms`: the
    /// file's writer keeps the supervisor's view between refreshes, and a busy session
    /// read then and judged later by the clock alone would look stalled however much it
    /// streamed meanwhile.
    pub fn document(
        &self,
        live: &[LiveSession],
        live_at_ms: i64,
        streams: &[StreamFacts],
        now_ms: i64,
        instance: &str,
    ) -> StatusDocument {
        let empty = SessionStats::default();
        let mut sessions = BTreeMap::new();
        let at = document::Moments { now_ms, live_at_ms };
        for d in live {
            let stats = self.sessions.get(&*d.id).map_or(&empty, |s| &**s);
            sessions.insert(d.id.to_string(), SessionStatus::of(stats, Some(d), &d.server, at));
        }
        for (id, stats) in &self.sessions {
            if !sessions.contains_key(id) {
                sessions.insert(id.clone(), SessionStatus::of(stats, None, &stats.server, at));
            }
        }
        let mut totals = BTreeMap::new();
        for s in sessions.values() {
            *totals.entry(s.state).or_insert(0) += 1;
        }
        let servers = streams.iter().map(|f| ServerStatus::of(f, now_ms)).collect();
        StatusDocument {
            version: STATUS_VERSION,
            timestamp: now_ms,
            live_at_ms: Some(live_at_ms),
            instance: instance.to_string(),
            stopped_at_ms: None,
            totals,
            servers,
            sessions,
        }
    }
}

mod document;

pub use document::{
    Activity, LiveSession, PatternCount, RecoveryStatus, ServerStatus, SessionState, SessionStatus, StallStatus,
    StatusDocument, StreamFacts, TodoCounts,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::SessionDetail;
    use crate::journal::Numbers;

    fn rec(at_ms: i64, action: Action, outcome: Outcome, reason: &str, numbers: Numbers) -> ActionRecord {
        ActionRecord {
            server: "local".into(),
            session: "ses_A".into(),
            action,
            outcome,
            reason: reason.into(),
            numbers,
            at_ms,
        }
    }

    fn stall(at_ms: i64, part: &str) -> ActionRecord {
        let n = Numbers { last_part: Some(part.into()), ..Numbers::default() };
        rec(at_ms, Action::StallDetected, Outcome::Done, "stalled", n)
    }

    fn cont(at_ms: i64, outcome: Outcome) -> ActionRecord {
        rec(at_ms, Action::Continue, outcome, "continue sent after the abort", Numbers::default())
    }

    #[test]
    fn recoveries_are_counted_with_their_time_to_recover() {
        let mut book = StatsBook::new(10);
        for r in [
            stall(1_000, "text"),
            cont(3_000, Outcome::Done),
            stall(10_000, "reasoning"),
            cont(11_000, Outcome::Done),
            stall(20_000, "text"),
            cont(26_000, Outcome::Done),
            stall(30_000, "tool:bash"),
            cont(31_000, Outcome::Failed),
        ] {
            book.apply(&r);
        }
        let s = book.get("ses_A").unwrap();
        assert_eq!((s.recovery.attempts, s.recovery.successes, s.recovery.failures), (4, 3, 1));
        let h = s.recover_histogram();
        assert_eq!((h.min_ms, h.median_ms, h.max_ms, h.samples), (Some(1_000), Some(2_000), Some(6_000), 3));
        assert_eq!(s.stall.detections, 4);
        assert_eq!(s.stall.last_part.as_deref(), Some("tool:bash"));
        let top = s.top_patterns();
        assert_eq!(top[0], PatternCount { part: "text".into(), count: 2 });
        assert_eq!(top.len(), 3);
    }

    #[test]
    fn only_the_top_five_patterns_are_listed() {
        let mut book = StatsBook::new(10);
        for (i, part) in ["a", "b", "c", "d", "e", "f", "a"].iter().enumerate() {
            book.apply(&stall(i as i64, part));
        }
        let top = book.get("ses_A").unwrap().top_patterns();
        assert_eq!(top.len(), TOP_PATTERNS);
        assert_eq!(top[0].part, "a");
    }

    #[test]
    fn a_recovery_that_reached_nothing_is_not_an_attempt() {
        let mut book = StatsBook::new(10);
        book.apply(&stall(1, "text"));
        book.apply(&rec(2, Action::Recover, Outcome::Declined, "not busy", Numbers::default()));
        assert_eq!(book.get("ses_A").unwrap().recovery.attempts, 0);
    }

    #[test]
    fn a_reason_recorded_for_many_sessions_is_kept_once_until_no_history_holds_it() {
        let mut book = StatsBook::new(1);
        let text = "continue sent after the abort";
        for (i, session) in ["a", "b"].iter().enumerate() {
            let mut r = rec(i as i64, Action::Continue, Outcome::Done, text, Numbers::default());
            r.session = session.to_string();
            book.apply(&r);
        }
        let held = |s: &str| Arc::clone(&book.get(s).unwrap().history[0].reason);
        assert!(Arc::ptr_eq(&held("a"), &held("b")), "one copy for both sessions");
        assert_eq!(book.reasons.len(), 1);
        // Both histories roll past it; the next pass drops the text.
        for session in ["a", "b"] {
            let mut r = rec(10, Action::Nudge, Outcome::Done, "idle with open todos", Numbers::default());
            r.session = session.to_string();
            book.apply(&r);
        }
        book.forget_quiet(&[], 20, 1_000);
        assert_eq!(book.reasons.iter().map(|r| &**r).collect::<Vec<_>>(), ["idle with open todos"]);
    }

    #[test]
    fn the_history_rolls_at_max_history() {
        let mut book = StatsBook::new(3);
        for i in 0..5 {
            book.apply(&rec(i, Action::Nudge, Outcome::Done, &format!("n{i}"), Numbers::default()));
        }
        let s = book.get("ses_A").unwrap();
        assert_eq!(s.history.iter().map(|h| &*h.reason).collect::<Vec<_>>(), vec!["n2", "n3", "n4"]);
        assert_eq!(s.nudge.done, 5);
    }

    #[test]
    fn the_document_joins_live_sessions_and_statistics() {
        let mut book = StatsBook::new(10);
        book.apply(&stall(1_000, "text"));
        book.apply(&rec(
            1_500,
            Action::Continue,
            Outcome::Done,
            "tool-call-as-text prompt sent after the abort",
            Numbers::default(),
        ));
        let live = detail("ses_B", |d| {
            d.busy = true;
            d.context_tokens = Some(1200);
            d.context_window = Some(8000);
        });
        let doc = book.document(&[LiveSession::from(&live)], 5_000, &[], 5_000, "inst");
        assert_eq!(doc.version, STATUS_VERSION);
        assert_eq!(doc.sessions["ses_B"].status, "busy");
        assert_eq!(doc.sessions["ses_B"].state, SessionState::Working);
        assert_eq!(doc.sessions["ses_B"].tokens, Some(1200));
        assert_eq!(doc.sessions["ses_B"].handoff_phase.as_deref(), Some("monitoring"));
        let a = &doc.sessions["ses_A"];
        assert_eq!(a.status, "untracked");
        assert_eq!(a.elapsed, 4_000);
        assert_eq!(a.tool_calls_as_text, 1);
        let json = serde_json::to_string(&doc).unwrap();
        assert_eq!(serde_json::from_str::<StatusDocument>(&json).unwrap(), doc, "round-trips");
    }

    /// A live session as the supervisor describes it: idle, last active at 1 s.
    fn detail(id: &str, change: impl FnOnce(&mut SessionDetail)) -> SessionDetail {
        let mut d = SessionDetail { last_activity_ms: 1_000, ..SessionDetail::new("local", id) };
        change(&mut d);
        d
    }

    #[test]
    fn a_busy_session_is_working_until_it_is_quiet_past_its_stall_timeout() {
        let busy = detail("s", |d| {
            d.busy = true;
            d.stall_timeout_ms = Some(60_000);
        });
        assert_eq!(SessionState::of(&busy, 60_999), SessionState::Working);
        assert_eq!(SessionState::of(&busy, 61_000), SessionState::Stalled);
        // A busy session whose stall timer does not run (retry) is not stalled.
        let retrying = detail("s", |d| d.busy = true);
        assert_eq!(SessionState::of(&retrying, 1_000_000), SessionState::Working);
    }

    /// The file's writer keeps the supervisor's view between refreshes (30 s by
    /// default): a busy session read then is judged as of the read, not stalled by the
    /// clock alone while the file shows the same read again.
    #[test]
    fn a_live_session_is_judged_as_of_when_it_was_read() {
        let book = StatsBook::new(10);
        let busy = detail("s", |d| {
            d.busy = true;
            d.stall_timeout_ms = Some(2_000);
        });
        // Read at 2 s (quiet 1 s), written 60 s later.
        let doc = book.document(&[LiveSession::from(&busy)], 2_000, &[], 62_000, "inst");
        let s = &doc.sessions["s"];
        assert_eq!(s.state, SessionState::Working, "as of the read it was working");
        assert_eq!(s.quiet_ms, Some(1_000));
        assert_eq!(doc.totals.get(&SessionState::Stalled), None);
        assert_eq!((doc.timestamp, doc.live_at_ms), (62_000, Some(2_000)), "the document says when it read them");
        // Read after its stall timeout: stalled.
        let doc = book.document(&[LiveSession::from(&busy)], 3_000, &[], 3_000, "inst");
        assert_eq!(doc.sessions["s"].state, SessionState::Stalled);
    }

    #[test]
    fn what_shepherd_or_the_person_is_doing_wins_over_busy_and_idle() {
        let at = |change: fn(&mut SessionDetail)| {
            SessionState::of(
                &detail("s", |d| {
                    d.busy = true;
                    d.stall_timeout_ms = Some(10);
                    change(d);
                }),
                1_000_000,
            )
        };
        assert_eq!(at(|d| d.paused = Some("user_abort".into())), SessionState::Paused);
        assert_eq!(at(|d| d.handoff.phase = "persisting".into()), SessionState::HandingOff);
        assert_eq!(at(|d| d.recovering = true), SessionState::Recovering);
        assert_eq!(at(|d| d.compacting = true), SessionState::Compacting);
        assert_eq!(at(|d| d.waiting_on_person = true), SessionState::WaitingOnPerson);
        assert_eq!(SessionState::of(&detail("s", |_| {}), 1_000_000), SessionState::Idle);
    }

    #[test]
    fn the_document_counts_states_and_reports_each_stream() {
        let book = StatsBook::new(10);
        let live = [
            detail("a", |d| d.busy = true),
            detail("b", |d| d.busy = true),
            detail("c", |d| d.title = Some("Fix the parser".into())),
        ]
        .map(|d| LiveSession::from(&d));
        let streams = [StreamFacts {
            name: "local".into(),
            connected: true,
            reconciled: true,
            connects: 3,
            frames: 40,
            malformed: 1,
            last_event_ms: Some(4_000),
            opencode_version: Some("1.18.34".into()),
            behind_ms: 1_500,
        }];
        let doc = book.document(&live, 5_000, &streams, 5_000, "inst");
        assert_eq!(doc.totals[&SessionState::Working], 2);
        assert_eq!(doc.totals[&SessionState::Idle], 1);
        assert_eq!(doc.sessions["c"].title.as_deref(), Some("Fix the parser"));
        assert_eq!(doc.sessions["c"].quiet_ms, Some(4_000));
        let s = &doc.servers[0];
        assert_eq!((s.connected, s.reconnects, s.since_last_event_ms), (true, 2, Some(1_000)));
        assert_eq!(s.opencode_version.as_deref(), Some("1.18.34"));
        assert_eq!(s.behind_ms, 1_500, "how far behind Shepherd works, as the metrics say");
    }

    #[test]
    fn completed_and_failed_hand_offs_are_counted() {
        let mut book = StatsBook::new(10);
        let phase = |p: &str| Numbers { phase: Some(p.into()), ..Numbers::default() };
        book.apply(&rec(1, Action::Handoff, Outcome::Done, "starts", phase("persisting")));
        book.apply(&rec(2, Action::Handoff, Outcome::Done, "delivered", phase("resuming")));
        book.apply(&rec(3, Action::Handoff, Outcome::Done, "continues", phase("completed")));
        book.apply(&rec(4, Action::Handoff, Outcome::Failed, "failed", phase("failed")));
        let h = &book.get("ses_A").unwrap().handoff;
        assert_eq!((h.done, h.failed, h.last_ms), (1, 1, Some(4)));
    }

    #[test]
    fn quiet_untracked_sessions_are_forgotten() {
        let mut book = StatsBook::new(10);
        book.apply(&stall(1_000, "text"));
        book.forget_quiet(&[], 2_000, 5_000);
        assert_eq!(book.len(), 1);
        book.forget_quiet(&[], 7_000, 5_000);
        assert!(book.is_empty());
    }
}
