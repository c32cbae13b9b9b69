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
    /// The user message of a `prompt_async`, with the parts as posted.
    UserPrompt(Vec<Value>),
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
        }
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
        if matches!(step, Beat::UserMessage | Beat::UserPrompt(_) | Beat::AssistantCreated) {
            self.messages += 1;
        }
        let World { sessions, dirs, project, .. } = self;
        let s = &mut sessions[idx];
        let dir = dirs[s.dir].as_str();
        let sid = s.id.clone();
        let mut f = Frames { out, dir, project, sid: &sid, evt, n: 0 };
        match step {
            Beat::UserMessage | Beat::UserPrompt(_) => {
                s.busy = true;
                s.counter += 1;
                s.user_msg = make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let info = format!(
                    r#"{{"sessionID":"{sid}","info":{{"id":"{m}","role":"user","sessionID":"{sid}","time":{{"created":{now_ms}}},"agent":"{agent}","model":{{"providerID":"fake","modelID":"fake-model"}}}}}}"#,
                    sid = s.id,
                    m = s.user_msg,
                    agent = s.agent
                );
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
                let parts: Vec<Value> = match step {
                    Beat::UserPrompt(parts) => parts.clone(),
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
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","type":"tool","tool":"todowrite","callID":"call_{c:06}","state":{{"status":"{status}","input":{{"todos":[{{"content":"Write the parser","status":"in_progress","priority":"high"}}]}}{output},"time":{{"start":{now_ms}}}}}}},"time":{now_ms}}}"#,
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
        f.n
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

fn continue_turn(parts: Vec<Value>) -> Vec<Beat> {
    let mut p = vec![Beat::UserPrompt(parts), Beat::Busy, Beat::AssistantCreated, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, CONTINUE_DELTAS as usize));
    p.extend([Beat::TextClose, Beat::StepFinish("stop"), Beat::AssistantFinished("stop"), Beat::Idle]);
    p
}

/// Frames a plan produces (the user prompt's parts counted as one).
fn plan_frames(plan: &[Beat]) -> u64 {
    plan.iter()
        .map(|s| match s {
            Beat::UserMessage | Beat::UserPrompt(_) => 4,
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
                w.sessions[idx].stalled_at = Some(now);
                w.sessions[idx].stalled_wall_us = wall;
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
                    w.sessions[idx].stalled_at = Some(now);
                    w.sessions[idx].stalled_wall_us = wall;
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

async fn messages(data: Data, path: web::Path<String>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}/message");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let s = &w.sessions[idx];
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
    let s = &mut w.sessions[idx];
    s.prompts += 1;
    if let Some(agent) = body.agent {
        s.agent = agent;
    }
    let busy = s.busy;
    s.busy = true;
    let kind = s.kind;
    let plan = continue_turn(body.parts);
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
    println!("SIM_LISTENING {addr}");
    actix_web::rt::System::new().block_on(async move {
        HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
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
