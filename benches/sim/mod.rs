//! A simulated OpenCode server for the fleet benchmark.
//!
//! It speaks the shapes Shepherd reads (see `src/opencode/client/` and `pump.rs`), as
//! OpenCode 1.18.34 sends them (`/work/shared/opencode-server-api.md`):
//! `GET /global/event` (SSE, `{"directory","project","payload":{"id","type","properties"}}`
//! frames plus the `sync` duplicates of durable changes, a heartbeat every 10 s; every
//! frame its own HTTP chunk, as OpenCode writes them),
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
//!
//! Parts: this file holds the world's state (the sessions, their history, the books)
//! and [`serve`], and the types the benches exchange with it; `control` the `/_sim/*`
//! endpoints; `world` the world's own bookkeeping (a run's plans, the schedule); `script`
//! the beats of a turn; `render` a beat into OpenCode's frames; `stream` the generator
//! thread and `GET /global/event`; `rest` OpenCode's REST routes; `soak` the soak's
//! episodes and books, its workload and the faults it injects.

mod control;
mod render;
mod rest;
mod script;
mod soak;
mod stream;
mod world;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::net::TcpListener;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::{web, App, HttpServer};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use self::control::{drop_streams, report, restart, run, set_faults, set_soak, shepherd_state, soak_report};
use self::rest::{
    abort, get_session, list_sessions, messages, prompt_async, providers, session_status, summarize, todos,
};
use self::script::Beat;
use self::soak::{drive, inject_faults};
use self::stream::{generate, global_event};

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
    /// Only the first this many sessions take part (0 = all); the others stay idle.
    #[serde(default)]
    pub sessions: usize,
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
    /// Aborted stalls so far: how long `stall_times` and `abort_latency_us` would be.
    pub stalls_recorded: u64,
    /// Per aborted stall from the `times_from`-th on (none unless asked): session id,
    /// stall deadline and abort arrival (epoch µs).
    pub stall_times: Vec<(String, i64, i64)>,
    /// Stall deadline → abort request, microseconds, one per aborted stall from the
    /// `times_from`-th on (none unless asked).
    pub abort_latency_us: Vec<i64>,
    pub requests: HashMap<String, u64>,
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
    /// `prompts` when its latest stall was planned: a continue is a prompt past it.
    prompts_at_stall: u32,
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
    /// Each directory's busy sessions, as OpenCode keeps its statuses: a status read
    /// costs what is busy, not the whole fleet (kept by `World::sync_busy`).
    busy_by_dir: Vec<std::collections::BTreeSet<usize>>,
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

/// Wall-clock µs since the epoch: how the simulator stamps deadlines and aborts (and the
/// bench's freeze watchers their freezes, to compare with them).
pub(crate) fn epoch_us() -> i64 {
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

type Data = web::Data<Shared>;

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
