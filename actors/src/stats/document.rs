//! The status document: the statistics of [`super::StatsBook`] joined with what the
//! supervisor knows now (status, todos, tokens, each server's stream), and the state
//! each session is in ([`SessionState::of`]). Pure, like the rest of `stats`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::*;
use crate::control::SessionDetail;

/// What the status document needs of a live session: its [`SessionDetail`] without the
/// todo list, directory, last record and hand-off particulars. A fraction of its size,
/// so the status writer can keep the whole fleet's between refreshes; its texts are
/// boxed to size and the server's name shared ([`LiveSession::of`]), since memory per
/// session is a scale target.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSession {
    pub id: Box<str>,
    pub server: Arc<str>,
    pub title: Option<Box<str>>,
    /// `user_abort` or `gave_up` when automation is off.
    pub paused: Option<Box<str>>,
    pub activity: Activity,
    pub todos: TodoCounts,
    pub context_tokens: Option<u64>,
    pub context_window: Option<u64>,
}

impl LiveSession {
    /// `d`, with `server` its server's name as every session of that server shares it.
    pub fn of(d: &SessionDetail, server: Arc<str>) -> Self {
        LiveSession::of_facts(
            Facts {
                id: &d.id,
                title: d.title.as_deref(),
                paused: d.paused.as_deref(),
                todos: &d.todos,
                activity: Activity::of(d),
                context: (d.context_tokens, d.context_window),
            },
            server,
        )
    }

    /// [`LiveSession::of`] straight from what the session's actor published
    /// ([`DetailCell::read`]): counts of its todo list, not a copy of it (at 100,000
    /// sessions the full details were a status refresh's largest cost on the
    /// supervisor's thread). Equals `LiveSession::of` of the same detail.
    ///
    /// [`DetailCell::read`]: crate::session::view::DetailCell::read
    pub fn of_published(
        p: &crate::session::view::PublishedDetail,
        server: Arc<str>,
        id: &str,
        last_activity_ms: i64,
    ) -> Self {
        let activity = Activity {
            busy: p.busy,
            waiting_on_person: p.waiting_on_person,
            recovering: p.recovering,
            compacting: p.compacting,
            paused: p.paused.is_some(),
            handoff: p.phase,
            last_activity_ms,
            stall_timeout_ms: p.stall_timeout_ms(),
        };
        let paused = p.paused.map(|x| x.as_str());
        let context = (p.context_tokens, p.context_window);
        let facts = Facts { id, title: p.title.as_deref(), paused, todos: &p.todos, activity, context };
        LiveSession::of_facts(facts, server)
    }

    /// The one builder both sources go through.
    fn of_facts(f: Facts<'_>, server: Arc<str>) -> Self {
        let c = crate::session::prompt::TodoCounts::of(f.todos);
        LiveSession {
            id: f.id.into(),
            server,
            title: f.title.map(Into::into),
            paused: f.paused.map(Into::into),
            activity: f.activity,
            todos: TodoCounts { open: c.open, completed: c.completed, total: c.total },
            context_tokens: f.context.0,
            context_window: f.context.1,
        }
    }
}

/// What a [`SessionDetail`] and a published detail both give of a live session, borrowed.
struct Facts<'a> {
    id: &'a str,
    title: Option<&'a str>,
    paused: Option<&'a str>,
    todos: &'a [crate::event::Todo],
    activity: Activity,
    /// Tokens and window.
    context: (Option<u64>, Option<u64>),
}

impl From<&SessionDetail> for LiveSession {
    fn from(d: &SessionDetail) -> Self {
        LiveSession::of(d, d.server.as_str().into())
    }
}

/// What a live session is doing: everything [`SessionState`] is decided from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Activity {
    pub busy: bool,
    pub waiting_on_person: bool,
    pub recovering: bool,
    pub compacting: bool,
    pub paused: bool,
    pub handoff: crate::session::handoff::Phase,
    /// Epoch ms of the session's last activity (what the stall timer counts from).
    pub last_activity_ms: i64,
    /// The stall timeout in force while the stall timer runs, ms.
    pub stall_timeout_ms: Option<u64>,
}

impl Activity {
    pub fn of(d: &SessionDetail) -> Activity {
        Activity {
            busy: d.busy,
            waiting_on_person: d.waiting_on_person,
            recovering: d.recovering,
            compacting: d.compacting,
            paused: d.paused.is_some(),
            handoff: crate::session::handoff::Phase::parse(&d.handoff.phase),
            last_activity_ms: d.last_activity_ms,
            stall_timeout_ms: d.stall_timeout_ms,
        }
    }
}

/// What the edge knows about one server's event stream (the pump's counters and the
/// supervisor's view), the input of [`ServerStatus`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamFacts {
    pub name: String,
    pub connected: bool,
    /// Sessions and statuses were read by REST after the latest connect.
    pub reconciled: bool,
    /// Successful connects since start (the first one is not a reconnect).
    pub connects: u64,
    pub frames: u64,
    pub malformed: u64,
    /// Epoch ms of the latest frame (heartbeats included).
    pub last_event_ms: Option<i64>,
    /// The OpenCode version the server reported at the latest connect.
    pub opencode_version: Option<String>,
    /// How far behind the server Shepherd works: the time since everything it sent was
    /// handled ([`crate::stream_clock`]); 0 while it keeps up.
    pub behind_ms: u64,
}

/// One server's event stream in the status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub name: String,
    pub connected: bool,
    pub reconciled: bool,
    pub reconnects: u64,
    pub events: u64,
    pub malformed: u64,
    pub last_event_ms: Option<i64>,
    /// Since the latest frame, at the document's `timestamp` (OpenCode sends a
    /// heartbeat every 10 s, so more than that on a connected stream is suspect).
    pub since_last_event_ms: Option<i64>,
    /// The OpenCode version the server reported at the latest connect (absent until
    /// read; outside the supported range it was warned about in the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opencode_version: Option<String>,
    /// How far behind the server Shepherd works (0 while it keeps up): deadlines wait
    /// this long for the events in front of them.
    #[serde(default)]
    pub behind_ms: u64,
}

impl ServerStatus {
    pub fn of(f: &StreamFacts, now_ms: i64) -> Self {
        ServerStatus {
            name: f.name.clone(),
            connected: f.connected,
            reconciled: f.reconciled,
            reconnects: f.connects.saturating_sub(1),
            events: f.frames,
            malformed: f.malformed,
            last_event_ms: f.last_event_ms,
            since_last_event_ms: f.last_event_ms.map(|t| (now_ms - t).max(0)),
            opencode_version: f.opencode_version.clone(),
            behind_ms: f.behind_ms,
        }
    }
}

/// What a session is doing, in the words a person watching the fleet uses. Ordered by
/// how much it asks for attention (stalled first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Busy and quiet past its stall timeout, and no recovery under way yet (back-off,
    /// advice awaited or postponing, out of continues).
    Stalled,
    /// Shepherd's abort + continue is under way.
    Recovering,
    /// The work is being moved to a fresh session.
    HandingOff,
    /// OpenCode or Shepherd is compacting the context.
    Compacting,
    /// A question or permission is open, or the last reply asks the person.
    WaitingOnPerson,
    /// Automation is off (the person pressed Esc, or Shepherd gave up).
    Paused,
    Working,
    Idle,
    /// No longer in memory (statistics only).
    Untracked,
}

impl SessionState {
    /// Every state a live session can be in (all but `Untracked`), most urgent first.
    pub const LIVE: [SessionState; 8] = [
        SessionState::Stalled,
        SessionState::Recovering,
        SessionState::HandingOff,
        SessionState::Compacting,
        SessionState::WaitingOnPerson,
        SessionState::Paused,
        SessionState::Working,
        SessionState::Idle,
    ];

    /// The state of a live session at `now_ms`.
    pub fn of(d: &SessionDetail, now_ms: i64) -> SessionState {
        Self::of_activity(&Activity::of(d), now_ms)
    }

    /// The state of a live session doing `d` at `now_ms`.
    pub fn of_activity(d: &Activity, now_ms: i64) -> SessionState {
        let quiet_ms = (now_ms - d.last_activity_ms).max(0) as u64;
        if d.paused {
            SessionState::Paused
        } else if d.handoff.is_running() {
            SessionState::HandingOff
        } else if d.recovering {
            SessionState::Recovering
        } else if d.compacting {
            SessionState::Compacting
        } else if d.waiting_on_person {
            SessionState::WaitingOnPerson
        } else if d.stall_timeout_ms.is_some_and(|t| quiet_ms >= t) {
            SessionState::Stalled
        } else if d.busy {
            SessionState::Working
        } else {
            SessionState::Idle
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            SessionState::Stalled => "stalled",
            SessionState::Recovering => "recovering",
            SessionState::HandingOff => "handing_off",
            SessionState::Compacting => "compacting",
            SessionState::WaitingOnPerson => "waiting_on_person",
            SessionState::Paused => "paused",
            SessionState::Working => "working",
            SessionState::Idle => "idle",
            SessionState::Untracked => "untracked",
        }
    }
}

/// The status file's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusDocument {
    pub version: u32,
    /// Epoch ms of this write.
    pub timestamp: i64,
    /// Epoch ms the live sessions (status, state, quiet time, todos, tokens) were read.
    /// The file's writer reads them every `status.refresh_interval`, so they can be older
    /// than `timestamp`; the statistics and history are as of `timestamp`.
    #[serde(default)]
    pub live_at_ms: Option<i64>,
    /// The Shepherd instance that wrote it.
    pub instance: String,
    /// Epoch ms the instance stopped: set by its last write, at shutdown, whose sessions
    /// are as they were last seen live. Absent while it runs (a file left by a process
    /// that died without stopping has none either: its `timestamp` ages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<i64>,
    /// Sessions per state.
    #[serde(default)]
    pub totals: BTreeMap<SessionState, usize>,
    /// Each server's event stream.
    #[serde(default)]
    pub servers: Vec<ServerStatus>,
    pub sessions: BTreeMap<String, SessionStatus>,
}

/// One session in the status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub server: String,
    #[serde(default)]
    pub title: Option<String>,
    /// Since Shepherd first acted on the session, ms (0 when it has not yet).
    pub elapsed: i64,
    /// `busy`, `idle`, `recovering`, `compacting`, `paused:<why>`, or `untracked`
    /// (no longer in memory).
    pub status: String,
    /// What the session is doing ([`SessionState`]).
    #[serde(default = "untracked")]
    pub state: SessionState,
    /// Since the session's last activity, ms (what the stall timer counts), as of the
    /// document's `live_at_ms`.
    #[serde(default)]
    pub quiet_ms: Option<i64>,
    /// The stall timeout in force, ms, while the stall timer runs.
    #[serde(default)]
    pub stall_timeout_ms: Option<u64>,
    /// The latest thing Shepherd did to the session.
    #[serde(default)]
    pub last_action: Option<HistoryEntry>,
    pub recovery: RecoveryStatus,
    pub stall: StallStatus,
    pub compaction: Counts,
    pub nudge: Counts,
    pub review: Counts,
    pub handoff: Counts,
    /// The hand-off phase now (`monitoring`, `persisting`, …), when the session is tracked.
    pub handoff_phase: Option<String>,
    pub escalations: u32,
    pub spinning_tools: u32,
    pub tool_calls_as_text: u32,
    pub todos: TodoCounts,
    pub tokens: Option<u64>,
    pub window: Option<u64>,
    pub history: Vec<HistoryEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryStatus {
    pub attempts: u32,
    pub successes: u32,
    pub failures: u32,
    pub last_attempt_ms: Option<i64>,
    pub histogram: Histogram,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallStatus {
    pub detections: u32,
    pub last_part: Option<String>,
    /// The part types stalls happened after, most first (at most [`TOP_PATTERNS`]).
    pub patterns: Vec<PatternCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatternCount {
    pub part: String,
    pub count: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoCounts {
    pub open: usize,
    pub completed: usize,
    pub total: usize,
}

fn untracked() -> SessionState {
    SessionState::Untracked
}

/// When a document is written, and when the live sessions in it were read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moments {
    pub now_ms: i64,
    pub live_at_ms: i64,
}

impl SessionStatus {
    pub(super) fn of(s: &SessionStats, live: Option<&LiveSession>, server: &str, at: Moments) -> Self {
        let Moments { now_ms, live_at_ms } = at;
        let status = match live {
            None => "untracked".to_string(),
            Some(d) => match (&d.paused, d.activity.recovering, d.activity.compacting, d.activity.busy) {
                (Some(p), ..) => format!("paused:{p}"),
                (None, true, ..) => "recovering".to_string(),
                (None, false, true, _) => "compacting".to_string(),
                (None, false, false, true) => "busy".to_string(),
                (None, false, false, false) => "idle".to_string(),
            },
        };
        let todos = live.map_or_else(TodoCounts::default, |d| d.todos);
        SessionStatus {
            server: server.to_string(),
            title: live.and_then(|d| d.title.as_deref().map(str::to_string)),
            elapsed: if s.first_seen_ms > 0 { (now_ms - s.first_seen_ms).max(0) } else { 0 },
            status,
            state: live.map_or(SessionState::Untracked, |d| SessionState::of_activity(&d.activity, live_at_ms)),
            quiet_ms: live.map(|d| (live_at_ms - d.activity.last_activity_ms).max(0)),
            stall_timeout_ms: live.and_then(|d| d.activity.stall_timeout_ms),
            // Every record passes the book: its newest is the session's last action.
            last_action: s.history.back().cloned(),
            recovery: RecoveryStatus {
                attempts: s.recovery.attempts,
                successes: s.recovery.successes,
                failures: s.recovery.failures,
                last_attempt_ms: s.recovery.last_attempt_ms,
                histogram: s.recover_histogram(),
            },
            stall: StallStatus {
                detections: s.stall.detections,
                last_part: s.stall.last_part.clone(),
                patterns: s.top_patterns(),
            },
            compaction: s.compaction.clone(),
            nudge: s.nudge.clone(),
            review: s.review.clone(),
            handoff: s.handoff.clone(),
            handoff_phase: live.map(|d| d.activity.handoff.as_str().to_string()),
            escalations: s.escalations,
            spinning_tools: s.spinning_tools,
            tool_calls_as_text: s.tool_calls_as_text,
            todos,
            tokens: live.and_then(|d| d.context_tokens).or(s.tokens),
            window: live.and_then(|d| d.context_window).or(s.window),
            history: s.history.iter().cloned().collect(),
        }
    }
}
