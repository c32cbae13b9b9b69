//! A simulated OpenCode server for the fleet benchmark.
//!
//! It speaks the shapes Shepherd reads (see `src/opencode/client.rs` and `pump.rs`), as
//! OpenCode 1.18.34 sends them (`/work/shared/opencode-server-api.md`):
//! `GET /global/event` (SSE, `{"directory","project","payload":{"id","type","properties"}}`
//! frames plus the `sync` duplicates of durable changes, a heartbeat every 10 s),
//! `GET /session/status?directory=`, `GET /experimental/session?limit=`,
//! `GET /session/{id}`, `POST /session/{id}/abort`, `GET /session/{id}/todo`,
//! `GET /session/{id}/message?limit=`, `POST /session/{id}/prompt_async`, and
//! `GET /config/providers` (one fake model, 200k context) with `POST /summarize`.
//!
//! It hosts N sessions spread over a few project directories. A *run* (control
//! endpoint `POST /_sim/run`) gives every session a plan: turns of realistic events
//! (user message, busy, assistant message, step and text parts, deltas, a `todowrite`
//! tool with its `todo.updated`, finish, idle) paced at a per-session interval (0 = as
//! fast as the reader takes them), and makes every k-th session *stall*: busy, a few
//! events, then silence. For each stalled session the simulator stamps the instant its
//! last event is handed to the stream, and when `POST /abort` arrives it records
//! `abort arrival − (last event + stall_timeout)`: the stall-deadline-to-abort latency.
//! An abort makes the session idle and emits the abort sequence (`session.error
//! MessageAbortedError`, status idle, `session.idle`, the closed partial part, the
//! assistant message with its error, idle again); `prompt_async` answers 204, echoes the
//! user message and its parts (with Shepherd's metadata) and completes a short turn.
//!
//! One generator thread renders events; the HTTP side runs on one actix-web worker.
//! The simulator is meant to run in a child process of its own, so that its memory and
//! CPU are not counted as Shepherd's.
//!
//! For the soak (`benches/soak.rs`) it also keeps each session's recent messages
//! (`GET /session/{id}/message` answers them, Shepherd's tag in the prompt's parts
//! included, so a restarted Shepherd can see what it had sent), injects faults
//! (`POST /_sim/faults`: a share of REST answers 5xx before anything is done, a share
//! answered late after the work is done, some later than Shepherd's `request_timeout`;
//! `POST /_sim/drop`: every event stream cut; `POST /_sim/restart`: a server restart,
//! below), runs a workload of its own (`POST /_sim/soak`: idle sessions start turns at
//! random, a share of them stall) and keeps the books (`GET /_sim/soak`): every *episode*
//! (a stall, or a turn a restart cut off) and the continues Shepherd sent for it.
//!
//! A server restart, as OpenCode 1.18.34 behaves (`opencode-server-api.md`, "Server
//! restart while busy"): every stream ends, nothing answers (503) while it is down,
//! and afterwards no session is busy; a turn under way is cut off without a terminal
//! event, its assistant message left without `time.completed`, `finish` or `error`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// OpenCode sends a heartbeat on every stream this often.
const HEARTBEAT: Duration = Duration::from_secs(10);
/// The generator hands the stream batches of at most this many bytes.
const BATCH_BYTES: usize = 64 * 1024;
/// Batches waiting for a slow reader before the generator blocks (back-pressure).
const STREAM_QUEUE: usize = 16;
/// Steps of Shepherd's continue turn are this far apart.
const CONTINUE_STEP: Duration = Duration::from_millis(30);
/// Deltas in the reply to a continue prompt.
const CONTINUE_DELTAS: u32 = 3;
/// The todo list every session works through.
const TODOS: [(&str, &str); 3] = [("Write the parser", "high"), ("Add tests", "medium"), ("Update docs", "medium")];

/// TCP connections accepted so far (Shepherd's REST client opens more under load).
static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How the simulator is started.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimConfig {
    pub sessions: usize,
    pub directories: usize,
}

/// One run: what every session does next. Posted to `/_sim/run`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunSpec {
    /// Turns each non-stalling session works through.
    pub turns: u32,
    /// Text deltas per text part.
    pub deltas: u32,
    /// A `todowrite` tool step (tool parts, `todo.updated`, a second assistant message).
    pub tool: bool,
    /// Pause between two steps of one session; 0 = as fast as the reader takes them.
    pub step_interval_us: u64,
    /// Sessions start at an offset spread evenly over this window.
    pub start_spread_ms: u64,
    /// Every k-th session stalls instead (0 = none).
    pub stall_every: u32,
    /// Deltas a stalling session sends before falling silent.
    pub stall_deltas: u32,
    /// Stalling sessions start spread over this window.
    pub stall_spread_ms: u64,
    /// The stall timeout Shepherd runs with (to compute stall deadlines).
    pub stall_timeout_ms: u64,
}

/// What `/_sim/run` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunPlanned {
    pub frames: u64,
    pub stalling: u64,
}

/// What `/_sim/report` answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SimReport {
    pub frames_sent: u64,
    pub frames_dropped: u64,
    pub busy: u64,
    pub stalling_pending: u64,
    pub stalls_aborted: u64,
    pub unexpected_aborts: u64,
    pub prompts: u64,
    pub stalled_continued: u64,
    /// Messages (user + assistant) created so far.
    pub messages: u64,
    /// TCP connections accepted so far.
    pub connections: u64,
    /// Per aborted stall: session id, stall deadline and abort arrival (epoch µs).
    pub stall_times: Vec<(String, i64, i64)>,
    /// Stall deadline → abort request, microseconds, one per aborted stall.
    pub abort_latency_us: Vec<i64>,
    pub requests: HashMap<String, u64>,
}

/// One beat of a session's script: the frames OpenCode sends at one moment of a turn
/// (an event and, for durable changes, its `sync` duplicate). Beats of one session are
/// `step_interval_us` apart.
#[derive(Debug, Clone, PartialEq)]
enum Beat {
    UserMessage,
    /// The user message of a `prompt_async` (its id, already in the history), with the
    /// parts as posted.
    UserPrompt(String, Vec<Value>),
    Busy,
    AssistantCreated,
    StepStart,
    TextOpen,
    Delta,
    TextClose,
    Tool(&'static str),
    Todo,
    StepFinish(&'static str),
    AssistantFinished(&'static str),
    Idle,
    /// The stalling session falls silent here (stamped when the previous frames leave).
    Stall,
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Idle,
    Working,
    Stalling,
}

struct SimSession {
    id: String,
    dir: usize,
    created_ms: i64,
    busy: bool,
    todo_done: usize,
    plan: VecDeque<Beat>,
    interval: Duration,
    epoch: u32,
    kind: Kind,
    user_msg: String,
    asst_msg: String,
    part: String,
    part_chars: usize,
    counter: u32,
    seq: u32,
    agent: String,
    stalled_at: Option<Instant>,
    /// The same instant on the wall clock (epoch µs), to compare with Shepherd's records.
    stalled_wall_us: i64,
    aborted: bool,
    prompts: u32,
    /// The latest messages, oldest first (`GET /session/{id}/message`).
    history: VecDeque<HistMsg>,
    /// The soak's open episode (a stall, or a turn a restart cut off) and the last one.
    episode: Option<usize>,
    last_episode: Option<usize>,
    /// The soak's next turn starts then (set when the session is found free).
    soak_next: Option<Instant>,
    last_was_stall: bool,
}

/// Messages of a session the simulator remembers.
const HISTORY: usize = 12;

/// One message of a session's history.
#[derive(Debug, Clone)]
struct HistMsg {
    id: String,
    user: bool,
    created_ms: i64,
    /// The parts as posted (user prompts), with their ids.
    parts: Vec<Value>,
    completed_ms: Option<i64>,
    finish: Option<&'static str>,
    aborted: bool,
}

/// Faults the simulator injects, in thousandths of REST requests (`/_sim/*` excepted).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Faults {
    /// Answered 500/502/503 before anything is done.
    pub error_permille: u32,
    /// Answered `slow_ms` late, after the work is done.
    pub slow_permille: u32,
    pub slow_ms: u64,
    /// Answered `very_slow_ms` late (beyond Shepherd's `request_timeout`), after the work.
    pub very_slow_permille: u32,
    pub very_slow_ms: u64,
}

/// Faults injected so far.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FaultCounts {
    pub errors: u64,
    pub slow: u64,
    pub very_slow: u64,
    pub stream_drops: u64,
    pub streams_cut: u64,
    pub restarts: u64,
    /// Requests refused (503) while the server was down.
    pub refused_down: u64,
    /// Turns a restart cut off.
    pub turns_cut: u64,
    /// Of those, turns whose reply had finished (only the idle status was to come).
    pub cut_after_finish: u64,
}

/// The soak's workload. Posted to `/_sim/soak`; `running: false` stops new turns.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SoakSpec {
    pub running: bool,
    /// A free session starts its next turn after a pause uniform in 0..2× this.
    pub gap_ms: u64,
    /// Thousandths of turns that stall (never two in a row for one session).
    pub stall_permille: u32,
    /// Pause between two steps of a turn.
    pub step_ms: u64,
    pub deltas: u32,
}

/// Why a session needed Shepherd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EpisodeKind {
    /// Busy, then silence.
    Stall,
    /// A turn a server restart cut off mid-reply (the session was not already stalled):
    /// its last assistant message has no `time.completed`, `finish` or `error`.
    Interrupted,
    /// A turn a restart cut off between two steps: the prompt stored but no reply
    /// begun, or a step finished with `tool-calls` and the next not begun. Nothing in
    /// the session's last assistant message says so; booked apart.
    CutBetweenSteps,
}

#[derive(Debug, Clone)]
struct Episode {
    session: usize,
    kind: EpisodeKind,
    began: Instant,
    began_wall_ms: i64,
    aborts: u32,
    /// Decision ids of the continues received, in order.
    continues: Vec<String>,
    /// Shepherd was down (between a kill and the next start) when it began.
    shepherd_down: bool,
}

/// An episode as `/_sim/soak` reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EpisodeReport {
    pub session: String,
    pub kind: String,
    pub began_wall_ms: i64,
    pub aborts: u32,
    pub continues: Vec<String>,
    pub busy_now: bool,
    pub messages: Vec<String>,
    pub shepherd_down: bool,
}

/// What `GET /_sim/soak?grace_ms=` answers: the books.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SoakReport {
    pub turns: u64,
    pub stall_episodes: u64,
    pub interrupted_episodes: u64,
    pub between_steps_episodes: u64,
    pub between_steps_continued: u64,
    /// Episodes begun within the grace period (not judged).
    pub in_grace: u64,
    pub continued: u64,
    /// Continues received (Shepherd-tagged prompts of kind `continue`).
    pub continues: u64,
    pub lost: u64,
    pub lost_interrupted: u64,
    pub duplicated: u64,
    /// Decision ids delivered more than once.
    pub duplicate_decisions: u64,
    /// Aborts of a busy session that was not stalled.
    pub false_aborts: u64,
    /// Aborts of an idle session without an open episode (harmless, counted).
    pub idle_aborts: u64,
    pub aborts: u64,
    pub prompts_by_kind: HashMap<String, u64>,
    pub untagged_prompts: u64,
    pub faults: FaultCounts,
    pub frames_sent: u64,
    pub frames_dropped: u64,
    /// Up to 20 of each, for the investigation.
    pub lost_detail: Vec<EpisodeReport>,
    pub duplicated_detail: Vec<EpisodeReport>,
    pub duplicate_decision_ids: Vec<String>,
    pub false_abort_detail: Vec<String>,
}

struct World {
    sessions: Vec<SimSession>,
    index: HashMap<String, usize>,
    by_dir: Vec<Vec<usize>>,
    dirs: Vec<String>,
    project: String,
    heap: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    subscribers: Vec<mpsc::Sender<Batch>>,
    evt: u64,
    base_ms: i64,
    stall_timeout: Duration,
    frames_sent: u64,
    frames_dropped: u64,
    unexpected_aborts: u64,
    latencies: Vec<i64>,
    stall_times: Vec<(String, i64, i64)>,
    messages: u64,
    requests: HashMap<String, u64>,
    next_heartbeat: Instant,
    faults: Faults,
    counts: FaultCounts,
    /// A restarted server answers nothing until then.
    down_until: Option<Instant>,
    soak: SoakSpec,
    soak_turns: u64,
    /// Shepherd is down (the soak says so), for the books.
    shepherd_down: bool,
    episodes: Vec<Episode>,
    decisions: HashMap<String, u32>,
    false_aborts: Vec<String>,
    idle_aborts: u64,
    aborts: u64,
    prompts_by_kind: HashMap<String, u64>,
    untagged_prompts: u64,
    rng: u64,
}

/// A chunk of SSE bytes and the stalling sessions whose last frame it carries.
#[derive(Clone)]
struct Batch {
    bytes: Bytes,
    frames: u64,
    stall_marks: Vec<usize>,
}

struct Shared {
    world: Mutex<World>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn epoch_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

fn epoch_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// An OpenCode-like id: prefix + 12 hex of (ms·4096 + counter) + 14 base62 characters.
fn make_id(prefix: &str, ms: i64, counter: u64) -> String {
    const B62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut s = String::with_capacity(prefix.len() + 26);
    s.push_str(prefix);
    let _ = write!(s, "{:012x}", ((ms as u64).wrapping_mul(4096).wrapping_add(counter)) & 0xffff_ffff_ffff);
    let mut x = counter.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (ms as u64);
    for _ in 0..14 {
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        s.push(B62[(x % 62) as usize] as char);
    }
    s
}

impl World {
    fn new(cfg: &SimConfig) -> Self {
        let base_ms = epoch_ms();
        let dirs: Vec<String> = (0..cfg.directories.max(1)).map(|d| format!("/sim/project-{d:02}")).collect();
        let mut sessions = Vec::with_capacity(cfg.sessions);
        let mut index = HashMap::with_capacity(cfg.sessions);
        let mut by_dir = vec![Vec::new(); dirs.len()];
        for i in 0..cfg.sessions {
            let id = make_id("ses_", base_ms, i as u64);
            let dir = i % dirs.len();
            index.insert(id.clone(), i);
            by_dir[dir].push(i);
            sessions.push(SimSession {
                id,
                dir,
                created_ms: base_ms - 60_000,
                busy: false,
                todo_done: 0,
                plan: VecDeque::new(),
                interval: Duration::ZERO,
                epoch: 0,
                kind: Kind::Idle,
                user_msg: String::new(),
                asst_msg: String::new(),
                part: String::new(),
                part_chars: 0,
                counter: 0,
                seq: 0,
                agent: "build".into(),
                stalled_at: None,
                stalled_wall_us: 0,
                aborted: false,
                prompts: 0,
                history: VecDeque::new(),
                episode: None,
                last_episode: None,
                soak_next: None,
                last_was_stall: false,
            });
        }
        World {
            sessions,
            index,
            by_dir,
            dirs,
            project: "34a087cc2cab9675f8102d62afcd43ca8afdd98e".into(),
            heap: BinaryHeap::new(),
            subscribers: Vec::new(),
            evt: 0,
            base_ms,
            stall_timeout: Duration::from_secs(2),
            frames_sent: 0,
            frames_dropped: 0,
            unexpected_aborts: 0,
            latencies: Vec::new(),
            stall_times: Vec::new(),
            messages: 0,
            requests: HashMap::new(),
            next_heartbeat: Instant::now() + HEARTBEAT,
            faults: Faults::default(),
            counts: FaultCounts::default(),
            down_until: None,
            soak: SoakSpec::default(),
            soak_turns: 0,
            shepherd_down: false,
            episodes: Vec::new(),
            decisions: HashMap::new(),
            false_aborts: Vec::new(),
            idle_aborts: 0,
            aborts: 0,
            prompts_by_kind: HashMap::new(),
            untagged_prompts: 0,
            rng: 0x2545_F491_4F6C_DD1D ^ base_ms as u64,
        }
    }

    /// A uniform number in 0..n (xorshift; no dependency for a bench).
    fn random(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    /// A soak was started: episodes are booked (until the end, after its workload stops).
    fn books_kept(&self) -> bool {
        self.soak.gap_ms > 0
    }

    fn is_down(&self) -> bool {
        self.down_until.is_some_and(|t| Instant::now() < t)
    }

    /// A stalling session's last frame has left: its silence (and the episode) begins.
    fn stall_began(&mut self, idx: usize, now: Instant, wall_us: i64) {
        self.sessions[idx].stalled_at = Some(now);
        self.sessions[idx].stalled_wall_us = wall_us;
        if self.books_kept() {
            self.open_episode(idx, EpisodeKind::Stall, now);
        }
    }

    fn open_episode(&mut self, idx: usize, kind: EpisodeKind, now: Instant) {
        if self.sessions[idx].episode.is_some() {
            return;
        }
        let e = self.episodes.len();
        self.episodes.push(Episode {
            session: idx,
            kind,
            began: now,
            began_wall_ms: epoch_ms(),
            aborts: 0,
            continues: Vec::new(),
            shepherd_down: self.shepherd_down,
        });
        self.sessions[idx].episode = Some(e);
        self.sessions[idx].last_episode = Some(e);
    }

    /// Every stream ends (the generator drops them with their senders).
    fn cut_streams(&mut self) {
        self.counts.streams_cut += self.subscribers.len() as u64;
        self.subscribers.clear();
    }

    /// A server restart: streams cut, down for `down`, every busy turn cut off.
    fn restart(&mut self, down: Duration) {
        let now = Instant::now();
        self.counts.restarts += 1;
        self.cut_streams();
        self.down_until = Some(now + down);
        for idx in 0..self.sessions.len() {
            let s = &mut self.sessions[idx];
            if !s.busy && s.plan.is_empty() {
                continue;
            }
            let was_busy = s.busy;
            s.busy = false;
            s.plan.clear();
            s.epoch = s.epoch.wrapping_add(1);
            s.part.clear();
            if s.kind == Kind::Working {
                s.kind = Kind::Idle;
            }
            if was_busy {
                self.counts.turns_cut += 1;
                let last = self.sessions[idx].history.back();
                let kind = match last {
                    Some(m) if !m.user && m.completed_ms.is_none() => Some(EpisodeKind::Interrupted),
                    Some(m) if m.user || m.finish == Some("tool-calls") => Some(EpisodeKind::CutBetweenSteps),
                    // The reply had finished (`stop`), only the idle status was to come.
                    _ => None,
                };
                if let (Some(kind), true) = (kind, self.books_kept()) {
                    self.open_episode(idx, kind, now);
                } else if kind.is_none() {
                    self.counts.cut_after_finish += 1;
                }
            }
        }
    }

    fn push_history(&mut self, idx: usize, msg: HistMsg) {
        let h = &mut self.sessions[idx].history;
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(msg);
    }

    /// The workload: free sessions start their next turn when due.
    fn soak_tick(&mut self, now: Instant) -> bool {
        if !self.soak.running || self.is_down() {
            return false;
        }
        let mut started = false;
        for idx in 0..self.sessions.len() {
            let s = &self.sessions[idx];
            if s.busy || !s.plan.is_empty() || s.episode.is_some() {
                continue;
            }
            let Some(at) = s.soak_next else {
                let gap = Duration::from_millis(self.random(2 * self.soak.gap_ms.max(1)));
                self.sessions[idx].soak_next = Some(now + gap);
                continue;
            };
            if at > now {
                continue;
            }
            let stall = !self.sessions[idx].last_was_stall && self.random(1000) < self.soak.stall_permille as u64;
            let step = Duration::from_millis(self.soak.step_ms);
            self.soak_turns += 1;
            let s = &mut self.sessions[idx];
            s.soak_next = None;
            s.last_was_stall = stall;
            if stall {
                s.stalled_at = None;
                s.aborted = false;
                self.replan(idx, stall_plan(self.soak.deltas.min(3)), step, Kind::Stalling, now);
            } else {
                self.replan(idx, work_turn(self.soak.deltas, true), step, Kind::Working, now);
            }
            started = true;
        }
        started
    }

    fn episode_report(&self, e: &Episode) -> EpisodeReport {
        let s = &self.sessions[e.session];
        EpisodeReport {
            session: s.id.clone(),
            kind: format!("{:?}", e.kind),
            began_wall_ms: e.began_wall_ms,
            aborts: e.aborts,
            continues: e.continues.clone(),
            busy_now: s.busy,
            messages: s
                .history
                .iter()
                .map(|m| {
                    format!(
                        "{} {} {}{}{}",
                        if m.user { "user" } else { "assistant" },
                        m.created_ms,
                        m.finish.unwrap_or(if m.completed_ms.is_some() { "completed" } else { "open" }),
                        if m.aborted { " aborted" } else { "" },
                        m.parts
                            .iter()
                            .filter_map(|p| p.pointer("/metadata/shepherd/decision").and_then(|d| d.as_str()))
                            .map(|d| format!(" tag={d}"))
                            .collect::<String>()
                    )
                })
                .collect(),
            shepherd_down: e.shepherd_down,
        }
    }

    fn soak_report(&self, grace: Duration) -> SoakReport {
        let now = Instant::now();
        let mut r = SoakReport {
            turns: self.soak_turns,
            false_aborts: self.false_aborts.len() as u64,
            false_abort_detail: self.false_aborts.iter().take(20).cloned().collect(),
            idle_aborts: self.idle_aborts,
            aborts: self.aborts,
            prompts_by_kind: self.prompts_by_kind.clone(),
            untagged_prompts: self.untagged_prompts,
            faults: self.counts.clone(),
            frames_sent: self.frames_sent,
            frames_dropped: self.frames_dropped,
            ..SoakReport::default()
        };
        for e in &self.episodes {
            match e.kind {
                EpisodeKind::Stall => r.stall_episodes += 1,
                EpisodeKind::Interrupted => r.interrupted_episodes += 1,
                EpisodeKind::CutBetweenSteps => {
                    r.between_steps_episodes += 1;
                    r.between_steps_continued += !e.continues.is_empty() as u64;
                }
            }
            r.continues += e.continues.len() as u64;
            if !e.continues.is_empty() {
                r.continued += 1;
            }
            if e.continues.len() > 1 {
                r.duplicated += 1;
                if r.duplicated_detail.len() < 20 {
                    r.duplicated_detail.push(self.episode_report(e));
                }
            }
            if e.continues.is_empty() && e.kind != EpisodeKind::CutBetweenSteps {
                if now.duration_since(e.began) < grace {
                    r.in_grace += 1;
                } else if e.kind == EpisodeKind::Stall {
                    r.lost += 1;
                    if r.lost_detail.len() < 20 {
                        r.lost_detail.push(self.episode_report(e));
                    }
                } else {
                    r.lost_interrupted += 1;
                    if r.lost_detail.len() < 20 {
                        r.lost_detail.push(self.episode_report(e));
                    }
                }
            }
        }
        for (d, n) in &self.decisions {
            if *n > 1 {
                r.duplicate_decisions += 1;
                if r.duplicate_decision_ids.len() < 20 {
                    r.duplicate_decision_ids.push(format!("{d} ×{n}"));
                }
            }
        }
        r
    }

    fn count(&mut self, what: &str) {
        *self.requests.entry(what.to_string()).or_default() += 1;
    }

    fn schedule(&mut self, idx: usize, at: Instant) {
        let epoch = self.sessions[idx].epoch;
        self.heap.push(Reverse((at, idx, epoch)));
    }

    /// Replaces a session's plan (stale heap entries are skipped by epoch).
    fn replan(&mut self, idx: usize, plan: Vec<Beat>, interval: Duration, kind: Kind, start: Instant) {
        let s = &mut self.sessions[idx];
        s.plan = plan.into();
        s.interval = interval;
        s.kind = kind;
        s.epoch = s.epoch.wrapping_add(1);
        self.schedule(idx, start);
    }

    fn run(&mut self, spec: &RunSpec) -> RunPlanned {
        let now = Instant::now();
        self.stall_timeout = Duration::from_millis(spec.stall_timeout_ms);
        let interval = Duration::from_micros(spec.step_interval_us);
        let n = self.sessions.len();
        let mut planned = RunPlanned::default();
        for idx in 0..n {
            let stalls = spec.stall_every > 0 && idx % spec.stall_every as usize == 0;
            if stalls {
                let plan = stall_plan(spec.stall_deltas);
                planned.frames += plan_frames(&plan);
                planned.stalling += 1;
                let k = idx / spec.stall_every as usize;
                let per = n.div_ceil(spec.stall_every as usize).max(1);
                let offset = Duration::from_micros(spec.stall_spread_ms * 1000 * k as u64 / per as u64);
                self.sessions[idx].stalled_at = None;
                self.sessions[idx].aborted = false;
                self.replan(idx, plan, interval.max(Duration::from_millis(5)), Kind::Stalling, now + offset);
            } else if spec.turns > 0 {
                let mut plan = Vec::new();
                for _ in 0..spec.turns {
                    plan.extend(work_turn(spec.deltas, spec.tool));
                }
                planned.frames += plan_frames(&plan);
                let offset = Duration::from_micros(spec.start_spread_ms * 1000 * idx as u64 / n.max(1) as u64);
                self.replan(idx, plan, interval, Kind::Working, now + offset);
            }
        }
        planned
    }

    fn next_evt(&mut self) -> String {
        self.evt += 1;
        make_id("evt_", self.base_ms, self.evt)
    }

    /// Renders one step of a session into `out`; returns the frames written.
    fn render(&mut self, idx: usize, step: &Beat, out: &mut String, marks: &mut Vec<usize>) -> u64 {
        let now_ms = epoch_ms();
        let evt = self.next_evt();
        if matches!(step, Beat::UserMessage | Beat::UserPrompt(..) | Beat::AssistantCreated) {
            self.messages += 1;
        }
        // The soak's turns go on for many minutes: the same `todowrite` input every turn
        // is a spinning tool to Shepherd (`loops.spin_count`), not progress. Each call
        // gets its own input there.
        let vary_tool_input = self.books_kept();
        let World { sessions, dirs, project, .. } = self;
        let s = &mut sessions[idx];
        let dir = dirs[s.dir].as_str();
        let sid = s.id.clone();
        let mut f = Frames { out, dir, project, sid: &sid, evt, n: 0 };
        match step {
            Beat::UserMessage | Beat::UserPrompt(..) => {
                s.busy = true;
                s.counter += 1;
                s.user_msg = match step {
                    Beat::UserPrompt(id, _) => id.clone(),
                    _ => make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64),
                };
                let info = format!(
                    r#"{{"sessionID":"{sid}","info":{{"id":"{m}","role":"user","sessionID":"{sid}","time":{{"created":{now_ms}}},"agent":"{agent}","model":{{"providerID":"fake","modelID":"fake-model"}}}}}}"#,
                    sid = s.id,
                    m = s.user_msg,
                    agent = s.agent
                );
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
                let parts: Vec<Value> = match step {
                    Beat::UserPrompt(_, parts) => parts.clone(),
                    _ => vec![json!({"type": "text", "text": "Please work through the todo list."})],
                };
                for part in parts {
                    s.counter += 1;
                    let mut part = part;
                    if let Some(obj) = part.as_object_mut() {
                        obj.insert("messageID".into(), json!(s.user_msg));
                        obj.insert("sessionID".into(), json!(s.id));
                        obj.insert("id".into(), json!(make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64)));
                    }
                    let props = format!(r#"{{"sessionID":"{}","part":{},"time":{now_ms}}}"#, s.id, part);
                    s.seq += 1;
                    f.event_with_sync("message.part.updated", &props, s.seq);
                }
            }
            Beat::Busy => {
                s.busy = true;
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"busy"}}}}"#, s.id));
            }
            Beat::AssistantCreated => {
                s.counter += 1;
                s.asst_msg = make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let info = assistant_info(s, dir, now_ms, None);
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
            }
            Beat::StepStart => {
                s.counter += 1;
                let p = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","snapshot":"fe8a5305ed92502cc3c96432049de9cdc12a068e","type":"step-start"}},"time":{now_ms}}}"#,
                    sid = s.id,
                    m = s.asst_msg
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::TextOpen => {
                s.counter += 1;
                s.part = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                s.part_chars = 0;
                let props = text_part(s, "", now_ms);
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Delta => {
                s.part_chars += DELTA_TEXT.len();
                let props = format!(
                    r#"{{"sessionID":"{sid}","messageID":"{m}","partID":"{p}","field":"text","delta":"{DELTA_TEXT}"}}"#,
                    sid = s.id,
                    m = s.asst_msg,
                    p = s.part
                );
                f.event("message.part.delta", &props);
            }
            Beat::TextClose => {
                let text = DELTA_TEXT.repeat((s.part_chars / DELTA_TEXT.len()).clamp(1, 40));
                let props = text_part(s, &text, now_ms);
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Tool(status) => {
                if *status == "pending" {
                    s.counter += 1;
                    s.part = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                }
                let output = if *status == "completed" {
                    r#","output":"[{\"content\":\"Write the parser\",\"status\":\"in_progress\"}]","title":"3 todos""#
                } else {
                    ""
                };
                let pass = if vary_tool_input { format!(", pass {}", s.counter) } else { String::new() };
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","type":"tool","tool":"todowrite","callID":"call_{c:06}","state":{{"status":"{status}","input":{{"todos":[{{"content":"Write the parser{pass}","status":"in_progress","priority":"high"}}]}}{output},"time":{{"start":{now_ms}}}}}}},"time":{now_ms}}}"#,
                    sid = s.id,
                    p = s.part,
                    m = s.asst_msg,
                    c = s.counter
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Todo => {
                s.todo_done = (s.todo_done + 1) % (TODOS.len() + 1);
                let props = format!(r#"{{"sessionID":"{}","todos":{}}}"#, s.id, todos_json(s.todo_done));
                f.event("todo.updated", &props);
            }
            Beat::StepFinish(reason) => {
                s.counter += 1;
                let p = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","reason":"{reason}","snapshot":"fe8a5305ed92502cc3c96432049de9cdc12a068e","messageID":"{m}","sessionID":"{sid}","type":"step-finish","tokens":{{"total":1105,"input":1000,"output":105,"reasoning":0,"cache":{{"write":0,"read":0}}}},"cost":0}},"time":{now_ms}}}"#,
                    sid = s.id,
                    m = s.asst_msg
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::AssistantFinished(finish) => {
                let info = assistant_info(s, dir, now_ms, Some(finish));
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
            }
            Beat::Idle => {
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"busy"}}}}"#, s.id));
                idle_frames(&mut f, s, dir, now_ms);
            }
            Beat::Stall => marks.push(idx),
            Beat::Aborted => {
                f.event(
                    "session.error",
                    &format!(
                        r#"{{"sessionID":"{}","error":{{"name":"MessageAbortedError","data":{{"message":"Aborted"}}}}}}"#,
                        s.id
                    ),
                );
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"idle"}}}}"#, s.id));
                f.event("session.idle", &format!(r#"{{"sessionID":"{}"}}"#, s.id));
                if !s.part.is_empty() {
                    let props = text_part(s, DELTA_TEXT, now_ms);
                    s.seq += 1;
                    f.event_with_sync("message.part.updated", &props, s.seq);
                }
                let info = assistant_info(s, dir, now_ms, Some("abort"));
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
                idle_frames(&mut f, s, dir, now_ms);
            }
        }
        let n = f.n;
        self.remember(idx, step, now_ms);
        n
    }

    /// What a step leaves in the session's history.
    fn remember(&mut self, idx: usize, step: &Beat, now_ms: i64) {
        let msg = |id: &str, user: bool, parts: Vec<Value>| HistMsg {
            id: id.to_string(),
            user,
            created_ms: now_ms,
            parts,
            completed_ms: None,
            finish: None,
            aborted: false,
        };
        match step {
            Beat::UserMessage => {
                let s = &self.sessions[idx];
                let part = json!({"type": "text", "text": "Please work through the todo list.",
                                  "id": format!("prt_u{}", s.counter)});
                let m = msg(&s.user_msg, true, vec![part]);
                self.push_history(idx, m);
            }
            Beat::AssistantCreated => {
                let m = msg(&self.sessions[idx].asst_msg, false, Vec::new());
                self.push_history(idx, m);
            }
            Beat::AssistantFinished(finish) => {
                if let Some(m) = self.sessions[idx].history.iter_mut().rev().find(|m| !m.user) {
                    m.completed_ms = Some(now_ms);
                    m.finish = Some(finish);
                }
            }
            Beat::Aborted => {
                if let Some(m) = self.sessions[idx].history.iter_mut().rev().find(|m| !m.user) {
                    if m.completed_ms.is_none() {
                        m.completed_ms = Some(now_ms);
                        m.aborted = true;
                    }
                }
            }
            _ => {}
        }
    }

    fn heartbeat(&mut self, out: &mut String) -> u64 {
        let evt = self.next_evt();
        let _ = write!(
            out,
            "data: {{\"payload\":{{\"id\":\"{evt}\",\"type\":\"server.heartbeat\",\"properties\":{{}}}}}}\n\n"
        );
        1
    }
}

const DELTA_TEXT: &str = "Hello, I am working on ";

fn idle_frames(f: &mut Frames<'_>, s: &mut SimSession, dir: &str, now_ms: i64) {
    s.busy = false;
    s.part.clear();
    f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"idle"}}}}"#, s.id));
    f.event("session.idle", &format!(r#"{{"sessionID":"{}"}}"#, s.id));
    let info = session_info(s, dir, now_ms);
    s.seq += 1;
    f.event_with_sync("session.updated", &format!(r#"{{"sessionID":"{}","info":{}}}"#, s.id, info), s.seq);
    f.event("session.diff", &format!(r#"{{"sessionID":"{}","diff":[]}}"#, s.id));
}

fn text_part(s: &SimSession, text: &str, now_ms: i64) -> String {
    format!(
        r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","type":"text","text":"{text}","time":{{"start":{now_ms}}}}},"time":{now_ms}}}"#,
        sid = s.id,
        p = s.part,
        m = s.asst_msg
    )
}

fn assistant_info(s: &SimSession, dir: &str, now_ms: i64, finish: Option<&str>) -> String {
    let (tokens, tail) = match finish {
        None => (
            r#"{"total":0,"input":0,"output":0,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            String::new(),
        ),
        Some("abort") => (
            r#"{"total":0,"input":0,"output":0,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            format!(
                r#","completed":{now_ms}}},"error":{{"name":"MessageAbortedError","data":{{"message":"Aborted"}}}}"#
            ),
        ),
        Some(finish) => (
            r#"{"total":1105,"input":1000,"output":105,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            format!(r#","completed":{now_ms}}},"finish":"{finish}""#),
        ),
    };
    let tail = if tail.is_empty() { "}".to_string() } else { tail };
    format!(
        r#"{{"sessionID":"{sid}","info":{{"id":"{m}","parentID":"{u}","role":"assistant","mode":"build","agent":"{agent}","path":{{"cwd":"{dir}","root":"{dir}"}},"cost":0,"tokens":{tokens},"modelID":"fake-model","providerID":"fake","sessionID":"{sid}","time":{{"created":{now_ms}{tail}}}}}"#,
        sid = s.id,
        m = s.asst_msg,
        u = s.user_msg,
        agent = s.agent
    )
}

fn session_info(s: &SimSession, dir: &str, now_ms: i64) -> String {
    format!(
        r#"{{"id":"{sid}","slug":"jolly-harbor","projectID":"34a087cc2cab9675f8102d62afcd43ca8afdd98e","directory":"{dir}","path":"","title":"Simulated session","agent":"build","model":{{"id":"fake-model","providerID":"fake","variant":"default"}},"version":"1.18.34","cost":0,"tokens":{{"input":0,"output":0,"reasoning":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":{c},"updated":{now_ms}}}}}"#,
        sid = s.id,
        c = s.created_ms
    )
}

fn todos_json(done: usize) -> String {
    let items: Vec<String> = TODOS
        .iter()
        .enumerate()
        .map(|(i, (content, prio))| {
            let status = match i.cmp(&done) {
                std::cmp::Ordering::Less => "completed",
                std::cmp::Ordering::Equal => "in_progress",
                std::cmp::Ordering::Greater => "pending",
            };
            format!(r#"{{"content":"{content}","status":"{status}","priority":"{prio}"}}"#)
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// Writes SSE frames in the global stream's shape.
struct Frames<'a> {
    out: &'a mut String,
    dir: &'a str,
    project: &'a str,
    sid: &'a str,
    evt: String,
    n: u64,
}

impl Frames<'_> {
    fn event(&mut self, kind: &str, props: &str) {
        let _ = write!(
            self.out,
            "data: {{\"directory\":\"{}\",\"project\":\"{}\",\"payload\":{{\"id\":\"{}\",\"type\":\"{kind}\",\"properties\":{props}}}}}\n\n",
            self.dir, self.project, self.evt
        );
        self.n += 1;
    }

    /// The event and its `sync` duplicate (durable changes only, as OpenCode does).
    fn event_with_sync(&mut self, kind: &str, props: &str, seq: u32) {
        self.event(kind, props);
        let _ = write!(
            self.out,
            "data: {{\"directory\":\"{}\",\"project\":\"{}\",\"payload\":{{\"type\":\"sync\",\"syncEvent\":{{\"id\":\"{evt}\",\"type\":\"{kind}.1\",\"seq\":{seq},\"aggregateID\":\"{}\",\"data\":{props}}},\"id\":\"{evt}\"}}}}\n\n",
            self.dir, self.project, self.sid, evt = self.evt
        );
        self.n += 1;
    }
}

fn work_turn(deltas: u32, tool: bool) -> Vec<Beat> {
    let mut p =
        vec![Beat::UserMessage, Beat::Busy, Beat::AssistantCreated, Beat::Busy, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
    p.push(Beat::TextClose);
    if tool {
        p.extend([
            Beat::Tool("pending"),
            Beat::Tool("running"),
            Beat::Todo,
            Beat::Tool("completed"),
            Beat::StepFinish("tool-calls"),
            Beat::AssistantFinished("tool-calls"),
            Beat::AssistantCreated,
            Beat::Busy,
            Beat::StepStart,
            Beat::TextOpen,
        ]);
        p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
        p.push(Beat::TextClose);
    }
    p.extend([Beat::StepFinish("stop"), Beat::AssistantFinished("stop"), Beat::Idle]);
    p
}

fn stall_plan(deltas: u32) -> Vec<Beat> {
    let mut p =
        vec![Beat::UserMessage, Beat::Busy, Beat::AssistantCreated, Beat::Busy, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
    p.push(Beat::Stall);
    p
}

fn continue_turn(id: String, parts: Vec<Value>) -> Vec<Beat> {
    let mut p = vec![Beat::UserPrompt(id, parts), Beat::Busy, Beat::AssistantCreated, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, CONTINUE_DELTAS as usize));
    p.extend([Beat::TextClose, Beat::StepFinish("stop"), Beat::AssistantFinished("stop"), Beat::Idle]);
    p
}

/// Frames a plan produces (the user prompt's parts counted as one).
fn plan_frames(plan: &[Beat]) -> u64 {
    plan.iter()
        .map(|s| match s {
            Beat::UserMessage | Beat::UserPrompt(..) => 4,
            Beat::Busy | Beat::Delta | Beat::Todo => 1,
            Beat::Idle => 6,
            Beat::Stall => 0,
            Beat::Aborted => 12,
            _ => 2,
        })
        .sum()
}

/// The generator: renders due steps into batches and hands them to every stream.
fn generate(shared: Arc<Shared>) {
    let mut buf = String::with_capacity(BATCH_BYTES + 8192);
    loop {
        buf.clear();
        let mut frames = 0u64;
        let mut marks = Vec::new();
        let subscribers;
        {
            let mut w = shared.lock();
            let now = Instant::now();
            if now >= w.next_heartbeat {
                frames += w.heartbeat(&mut buf);
                w.next_heartbeat = now + HEARTBEAT;
            }
            while buf.len() < BATCH_BYTES {
                let Some(&Reverse((due, idx, epoch))) = w.heap.peek() else { break };
                if due > now {
                    break;
                }
                w.heap.pop();
                if w.sessions[idx].epoch != epoch {
                    continue;
                }
                let Some(step) = w.sessions[idx].plan.pop_front() else {
                    w.sessions[idx].kind = Kind::Idle;
                    continue;
                };
                frames += w.render(idx, &step, &mut buf, &mut marks);
                // A stall begins when this step's frames leave: mark it on this batch.
                if w.sessions[idx].plan.front() == Some(&Beat::Stall) {
                    w.sessions[idx].plan.pop_front();
                    marks.push(idx);
                }
                if w.sessions[idx].plan.is_empty() {
                    if w.sessions[idx].kind == Kind::Working {
                        w.sessions[idx].kind = Kind::Idle;
                    }
                } else {
                    let next = if w.sessions[idx].interval.is_zero() { now } else { due + w.sessions[idx].interval };
                    w.schedule(idx, next.max(now));
                }
            }
            if frames == 0 && marks.is_empty() {
                let wait = w
                    .heap
                    .peek()
                    .map(|Reverse((due, _, _))| *due)
                    .unwrap_or(w.next_heartbeat)
                    .min(w.next_heartbeat)
                    .saturating_duration_since(now);
                let _ = shared.wake.wait_timeout(w, wait).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            w.subscribers.retain(|s| !s.is_closed());
            subscribers = w.subscribers.clone();
            if subscribers.is_empty() {
                w.frames_dropped += frames;
            }
        }
        let batch = Batch { bytes: Bytes::copy_from_slice(buf.as_bytes()), frames, stall_marks: marks };
        for sub in &subscribers {
            let _ = sub.blocking_send(batch.clone());
        }
        if subscribers.is_empty() && !batch.stall_marks.is_empty() {
            // Nobody listens: the stall still starts now.
            let mut w = shared.lock();
            let (now, wall) = (Instant::now(), epoch_us());
            for idx in batch.stall_marks {
                w.stall_began(idx, now, wall);
            }
        }
    }
}

// ---- HTTP ----

type Data = web::Data<Shared>;

async fn global_event(data: Data) -> HttpResponse {
    let (tx, rx) = mpsc::channel::<Batch>(STREAM_QUEUE);
    let connected = {
        let mut w = data.lock();
        w.count("GET /global/event");
        let evt = w.next_evt();
        w.subscribers.push(tx);
        format!("data: {{\"payload\":{{\"id\":\"{evt}\",\"type\":\"server.connected\",\"properties\":{{}}}}}}\n\n")
    };
    let shared = data.into_inner();
    let first = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(Bytes::from(connected)) });
    let rest = futures::stream::unfold((rx, shared), |(mut rx, shared)| async move {
        let batch = rx.recv().await?;
        {
            let mut w = shared.lock();
            w.frames_sent += batch.frames;
            if !batch.stall_marks.is_empty() {
                let (now, wall) = (Instant::now(), epoch_us());
                for &idx in &batch.stall_marks {
                    // Several streams carry the same batch: the first one stamps it.
                    if w.sessions[idx].stalled_at.is_none() {
                        w.stall_began(idx, now, wall);
                    }
                }
            }
        }
        Some((Ok(batch.bytes), (rx, shared)))
    });
    use futures::StreamExt as _;
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(first.chain(rest))
}

#[derive(Deserialize)]
struct DirQuery {
    directory: Option<String>,
}

async fn session_status(data: Data, q: web::Query<DirQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/status");
    let dir = q.directory.as_deref().and_then(|d| w.dirs.iter().position(|x| x == d)).unwrap_or(0);
    let mut body = String::from("{");
    for &idx in &w.by_dir[dir] {
        let s = &w.sessions[idx];
        if s.busy {
            if body.len() > 1 {
                body.push(',');
            }
            let _ = write!(body, r#""{}":{{"type":"busy"}}"#, s.id);
        }
    }
    body.push('}');
    HttpResponse::Ok().content_type("application/json").body(body)
}

#[derive(Deserialize)]
struct LimitQuery {
    limit: Option<usize>,
}

async fn list_sessions(data: Data, q: web::Query<LimitQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /experimental/session");
    let now_ms = epoch_ms();
    let limit = q.limit.unwrap_or(100);
    let items: Vec<String> =
        w.sessions.iter().rev().take(limit).map(|s| session_info(s, &w.dirs[s.dir], now_ms)).collect();
    HttpResponse::Ok().content_type("application/json").body(format!("[{}]", items.join(",")))
}

fn not_found(id: &str) -> HttpResponse {
    HttpResponse::NotFound().json(json!({"name":"NotFoundError","data":{"message":format!("Session not found: {id}")}}))
}

async fn get_session(data: Data, path: web::Path<String>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let s = &w.sessions[idx];
    HttpResponse::Ok().content_type("application/json").body(session_info(s, &w.dirs[s.dir], epoch_ms()))
}

async fn abort(data: Data, path: web::Path<String>) -> HttpResponse {
    let (arrived, arrived_wall) = (Instant::now(), epoch_us());
    {
        let mut w = data.lock();
        w.count("POST /session/{id}/abort");
        if let Some(idx) = w.index.get(path.as_str()).copied() {
            w.aborts += 1;
            // A stall whose last frames were queued on a stream that was then cut never
            // "left": it is a stall all the same.
            let s = &w.sessions[idx];
            if w.books_kept() && s.kind == Kind::Stalling && s.busy && s.plan.is_empty() && s.episode.is_none() {
                w.stall_began(idx, arrived, arrived_wall);
            }
            match w.sessions[idx].episode {
                Some(e) => w.episodes[e].aborts += 1,
                None if w.sessions[idx].busy => {
                    let what = format!("{} at {} ms", w.sessions[idx].id, arrived_wall / 1000);
                    w.false_aborts.push(what);
                }
                None => w.idle_aborts += 1,
            }
            let stall_timeout = w.stall_timeout;
            let s = &mut w.sessions[idx];
            let mut latency = None;
            let mut times = None;
            let mut unexpected = false;
            if s.kind == Kind::Stalling && !s.aborted {
                if let Some(at) = s.stalled_at {
                    let deadline = at + stall_timeout;
                    latency = Some(if arrived >= deadline {
                        (arrived - deadline).as_micros() as i64
                    } else {
                        -((deadline - arrived).as_micros() as i64)
                    });
                    times = Some((s.id.clone(), s.stalled_wall_us + stall_timeout.as_micros() as i64, arrived_wall));
                }
                s.aborted = true;
            } else if s.busy {
                unexpected = true;
            }
            s.busy = false;
            let kind = if s.kind == Kind::Stalling { Kind::Stalling } else { Kind::Idle };
            w.unexpected_aborts += unexpected as u64;
            w.latencies.extend(latency);
            w.stall_times.extend(times);
            w.replan(idx, vec![Beat::Aborted], Duration::ZERO, kind, arrived);
            data.wake.notify_one();
        }
    }
    HttpResponse::Ok().content_type("application/json").body("true")
}

async fn todos(data: Data, path: web::Path<String>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}/todo");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    HttpResponse::Ok().content_type("application/json").body(todos_json(w.sessions[idx].todo_done))
}

async fn messages(data: Data, path: web::Path<String>, q: web::Query<LimitQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}/message");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let s = &w.sessions[idx];
    if !s.history.is_empty() {
        let dir = &w.dirs[s.dir];
        let skip = s.history.len().saturating_sub(q.limit.unwrap_or(usize::MAX));
        let items: Vec<Value> = s.history.iter().skip(skip).map(|m| history_json(s, dir, m)).collect();
        return HttpResponse::Ok().json(items);
    }
    let now_ms = epoch_ms();
    let user = json!({
        "info": {"id": s.user_msg, "role": "user", "sessionID": s.id, "time": {"created": now_ms},
                 "agent": s.agent, "model": {"providerID": "fake", "modelID": "fake-model"}},
        "parts": [{"type": "text", "text": "Please work through the todo list.", "id": "prt_x", "messageID": s.user_msg, "sessionID": s.id}],
    });
    let asst: Value = serde_json::from_str(&assistant_info(s, &w.dirs[s.dir], now_ms, Some("stop")))
        .map(|v: Value| v["info"].clone())
        .unwrap_or(Value::Null);
    HttpResponse::Ok().json(json!([user, {"info": asst, "parts": []}]))
}

/// One remembered message in `GET /session/{id}/message`'s shape.
fn history_json(s: &SimSession, dir: &str, m: &HistMsg) -> Value {
    let model = json!({"providerID": "fake", "modelID": "fake-model"});
    if m.user {
        let parts: Vec<Value> = m
            .parts
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if let Some(o) = p.as_object_mut() {
                    o.insert("messageID".into(), json!(m.id));
                    o.insert("sessionID".into(), json!(s.id));
                }
                p
            })
            .collect();
        return json!({
            "info": {"id": m.id, "role": "user", "sessionID": s.id, "time": {"created": m.created_ms},
                     "agent": s.agent, "model": model},
            "parts": parts,
        });
    }
    let mut time = json!({"created": m.created_ms});
    if let Some(c) = m.completed_ms {
        time["completed"] = json!(c);
    }
    let mut info = json!({
        "id": m.id, "role": "assistant", "mode": "build", "agent": s.agent,
        "path": {"cwd": dir, "root": dir}, "cost": 0,
        "tokens": {"total": 1105, "input": 1000, "output": 105, "reasoning": 0, "cache": {"write": 0, "read": 0}},
        "modelID": "fake-model", "providerID": "fake", "sessionID": s.id, "time": time,
    });
    if let Some(f) = m.finish {
        info["finish"] = json!(f);
    }
    if m.aborted {
        info["error"] = json!({"name": "MessageAbortedError", "data": {"message": "Aborted"}});
    }
    let parts = if m.completed_ms.is_some() {
        vec![
            json!({"id": format!("prt_t{}", m.id), "messageID": m.id, "sessionID": s.id, "type": "text", "text": DELTA_TEXT}),
        ]
    } else {
        Vec::new()
    };
    json!({"info": info, "parts": parts})
}

#[derive(Deserialize)]
struct PromptBody {
    #[serde(default)]
    parts: Vec<Value>,
    #[serde(default)]
    agent: Option<String>,
}

async fn prompt_async(data: Data, path: web::Path<String>, body: web::Json<PromptBody>) -> HttpResponse {
    let mut w = data.lock();
    w.count("POST /session/{id}/prompt_async");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let body = body.into_inner();
    let now_ms = epoch_ms();
    // The books: which decision, for which episode.
    let tag = body.parts.iter().find_map(|p| p.pointer("/metadata/shepherd")).cloned();
    match &tag {
        Some(tag) => {
            let kind = tag["kind"].as_str().unwrap_or("?").to_string();
            *w.prompts_by_kind.entry(kind.clone()).or_default() += 1;
            if let Some(d) = tag["decision"].as_str() {
                *w.decisions.entry(d.to_string()).or_default() += 1;
                if kind == "continue" {
                    // The open episode's continue, or (none open) a second one for the last.
                    let e = w.sessions[idx].episode.take().or(w.sessions[idx].last_episode);
                    if let Some(e) = e {
                        w.episodes[e].continues.push(d.to_string());
                    }
                }
            }
        }
        None => w.untagged_prompts += 1,
    }
    // OpenCode stores the user message at once, whatever it is doing.
    let msg_id = {
        let s = &mut w.sessions[idx];
        s.counter += 1;
        make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64)
    };
    let parts: Vec<Value> = body
        .parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = p.clone();
            if let Some(o) = p.as_object_mut() {
                o.insert("id".into(), json!(format!("prt_{msg_id}_{i}")));
            }
            p
        })
        .collect();
    w.push_history(
        idx,
        HistMsg {
            id: msg_id.clone(),
            user: true,
            created_ms: now_ms,
            parts: parts.clone(),
            completed_ms: None,
            finish: None,
            aborted: false,
        },
    );
    let s = &mut w.sessions[idx];
    s.prompts += 1;
    if let Some(agent) = body.agent {
        s.agent = agent;
    }
    let busy = s.busy;
    s.busy = true;
    let kind = s.kind;
    let plan = continue_turn(msg_id, body.parts);
    if busy && !s.plan.is_empty() {
        s.plan.extend(plan); // queued behind the turn under way, as OpenCode does
    } else {
        w.replan(idx, plan, CONTINUE_STEP, kind, Instant::now());
    }
    data.wake.notify_one();
    HttpResponse::NoContent().finish()
}

async fn providers(data: Data) -> HttpResponse {
    data.lock().count("GET /config/providers");
    HttpResponse::Ok().json(json!({
        "providers": [{"id": "fake", "source": "config", "name": "Fake", "options": {},
                       "models": {"fake-model": {"id": "fake-model", "name": "Fake",
                                                 "limit": {"context": 200000, "output": 8000}}}}],
        "default": {"fake": "fake-model"},
    }))
}

async fn summarize(data: Data) -> HttpResponse {
    data.lock().count("POST /session/{id}/summarize");
    HttpResponse::Ok().content_type("application/json").body("true")
}

/// Decides a REST request's fault (the server down, a 5xx, a late answer), answers the
/// refusals itself and delays the late answers after the work is done.
async fn inject_faults(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    let path = req.path();
    if path.starts_with("/_sim") {
        return next.call(req).await.map(|r| r.map_into_boxed_body());
    }
    let stream = path == "/global/event";
    let (refuse, delay) = match req.app_data::<Data>() {
        None => (None, Duration::ZERO),
        Some(data) => {
            let mut w = data.lock();
            if w.is_down() {
                w.counts.refused_down += 1;
                (Some(503), Duration::ZERO)
            } else {
                let f = w.faults.clone();
                let roll = w.random(1000) as u32;
                if roll < f.error_permille {
                    w.counts.errors += 1;
                    (Some([500, 502, 503][w.random(3) as usize]), Duration::ZERO)
                } else if stream {
                    (None, Duration::ZERO)
                } else if roll < f.error_permille + f.slow_permille {
                    w.counts.slow += 1;
                    (None, Duration::from_millis(f.slow_ms))
                } else if roll < f.error_permille + f.slow_permille + f.very_slow_permille {
                    w.counts.very_slow += 1;
                    (None, Duration::from_millis(f.very_slow_ms))
                } else {
                    (None, Duration::ZERO)
                }
            }
        }
    };
    if let Some(code) = refuse {
        let status =
            actix_web::http::StatusCode::from_u16(code).unwrap_or(actix_web::http::StatusCode::SERVICE_UNAVAILABLE);
        let resp =
            HttpResponse::build(status).json(json!({"name": "UnknownError", "data": {"message": "injected fault"}}));
        return Ok(req.into_response(resp).map_into_boxed_body());
    }
    let res = next.call(req).await?;
    if !delay.is_zero() {
        actix_web::rt::time::sleep(delay).await;
    }
    Ok(res.map_into_boxed_body())
}

async fn set_faults(data: Data, faults: web::Json<Faults>) -> HttpResponse {
    data.lock().faults = faults.into_inner();
    HttpResponse::NoContent().finish()
}

async fn drop_streams(data: Data) -> HttpResponse {
    let mut w = data.lock();
    w.counts.stream_drops += 1;
    w.cut_streams();
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
struct RestartBody {
    down_ms: u64,
}

async fn restart(data: Data, body: web::Json<RestartBody>) -> HttpResponse {
    data.lock().restart(Duration::from_millis(body.down_ms));
    HttpResponse::NoContent().finish()
}

async fn set_soak(data: Data, spec: web::Json<SoakSpec>) -> HttpResponse {
    data.lock().soak = spec.into_inner();
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
struct ShepherdBody {
    down: bool,
}

async fn shepherd_state(data: Data, body: web::Json<ShepherdBody>) -> HttpResponse {
    data.lock().shepherd_down = body.down;
    HttpResponse::NoContent().finish()
}

#[derive(Deserialize)]
struct GraceQuery {
    grace_ms: Option<u64>,
}

async fn soak_report(data: Data, q: web::Query<GraceQuery>) -> HttpResponse {
    let r = data.lock().soak_report(Duration::from_millis(q.grace_ms.unwrap_or(0)));
    HttpResponse::Ok().json(r)
}

/// The soak's workload clock: free sessions start turns when due.
fn drive(shared: Arc<Shared>) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let started = shared.lock().soak_tick(Instant::now());
        if started {
            shared.wake.notify_one();
        }
    }
}

async fn run(data: Data, spec: web::Json<RunSpec>) -> HttpResponse {
    let planned = data.lock().run(&spec);
    data.wake.notify_one();
    HttpResponse::Ok().json(planned)
}

async fn report(data: Data, _req: HttpRequest) -> HttpResponse {
    let w = data.lock();
    let mut r = SimReport {
        frames_sent: w.frames_sent,
        frames_dropped: w.frames_dropped,
        unexpected_aborts: w.unexpected_aborts,
        abort_latency_us: w.latencies.clone(),
        messages: w.messages,
        stall_times: w.stall_times.clone(),
        connections: CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed),
        requests: w.requests.clone(),
        ..SimReport::default()
    };
    for s in &w.sessions {
        r.busy += s.busy as u64;
        r.prompts += s.prompts as u64;
        if s.kind == Kind::Stalling {
            if s.aborted {
                r.stalls_aborted += 1;
                r.stalled_continued += (s.prompts > 0) as u64;
            } else {
                r.stalling_pending += 1;
            }
        }
    }
    HttpResponse::Ok().json(r)
}

/// Serves until the process ends. Prints `SIM_LISTENING <addr>` on stdout once bound.
pub fn serve(cfg: SimConfig) -> std::io::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let shared = web::Data::new(Shared { world: Mutex::new(World::new(&cfg)), wake: Condvar::new() });
    let gen = shared.clone().into_inner();
    std::thread::Builder::new().name("sim-generator".into()).spawn(move || generate(gen))?;
    let driver = shared.clone().into_inner();
    std::thread::Builder::new().name("sim-workload".into()).spawn(move || drive(driver))?;
    println!("SIM_LISTENING {addr}");
    actix_web::rt::System::new().block_on(async move {
        HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .wrap(actix_web::middleware::from_fn(inject_faults))
                .route("/global/event", web::get().to(global_event))
                .route("/session/status", web::get().to(session_status))
                .route("/experimental/session", web::get().to(list_sessions))
                .route("/session/{id}", web::get().to(get_session))
                .route("/session/{id}/abort", web::post().to(abort))
                .route("/session/{id}/todo", web::get().to(todos))
                .route("/session/{id}/message", web::get().to(messages))
                .route("/session/{id}/prompt_async", web::post().to(prompt_async))
                .route("/config/providers", web::get().to(providers))
                .route("/session/{id}/summarize", web::post().to(summarize))
                .route("/_sim/run", web::post().to(run))
                .route("/_sim/report", web::get().to(report))
                .route("/_sim/faults", web::post().to(set_faults))
                .route("/_sim/drop", web::post().to(drop_streams))
                .route("/_sim/restart", web::post().to(restart))
                .route("/_sim/soak", web::post().to(set_soak))
                .route("/_sim/soak", web::get().to(soak_report))
                .route("/_sim/shepherd", web::post().to(shepherd_state))
        })
        .on_connect(|conn, _| {
            CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Small frames go out at once (no Nagle delay), as a streaming server's should.
            if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
                let _ = tcp.set_nodelay(true);
            }
        })
        .workers(1)
        // Keep idle REST connections open like a long-lived server, so new connections
        // are the client's doing.
        .keep_alive(Duration::from_secs(120))
        .backlog(4096)
        .max_connections(50_000)
        .disable_signals()
        .shutdown_timeout(0)
        .listen(listener)?
        .run()
        .await
    })
}
