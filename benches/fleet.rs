//! Many servers, many sessions: Shepherd against a simulated OpenCode server hosting
//! 1,000 and 10,000 sessions. Run with `cargo bench --bench fleet`; numbers are
//! printed (a markdown table on stdout, progress on stderr), never asserted.
//!
//! Three processes, so that nothing is counted twice:
//! - this one (the *orchestrator*) starts one *scale run* per fleet size and prints
//!   the table;
//! - a scale run (`--fleet-scale N`) is a real Shepherd (`Daemon::start` inside an actix
//!   `System`) plus a thin harness; its RSS and CPU are Shepherd's;
//! - the simulated OpenCode server (`--fleet-sim N`, `sim/mod.rs`) is a child of the
//!   scale run; its memory and CPU are not in Shepherd's numbers.
//!
//! A scale run measures, in order:
//! 1. *simulator capacity*: a bare reader (no Shepherd; raw socket reads, frames counted
//!    in the bytes) drains a burst, so the events/s below can be told apart from what
//!    the simulator can produce;
//! 2. *RSS per session*: VmRSS once Shepherd is connected and tracks nothing, then
//!    after every session has had one turn (each is tracked: one session actor), both
//!    as the kernel reports it and after the allocator returned its unused pages
//!    (`shepherd::memory::trim`: what is live, not what the allocator keeps from the
//!    burst), with the heap in use (jemalloc's `stats.allocated`) beside;
//! 3. *events/s ingested*: a burst of realistic turns from every session; the clock
//!    stops when Shepherd's pump has counted every frame *and* the supervisor and every
//!    session actor have handled them (a question to every actor, queued behind them,
//!    is answered: `Daemon::ask_sessions`);
//! 4. *abort latency*: every 10th session stalls (busy, a few events, silence) at
//!    times spread over 2 s while the others keep streaming; the simulator records
//!    `abort request arrival − (instant its last event left + stall_timeout)`; past
//!    10,000 sessions (where that is ten times the 10,000 phase's load) a second run
//!    with the 10,000 phase's load: 1,000 stalls among 10,000 sessions, the rest idle;
//! 5. *idle CPU*: every session idle, CPU time (`getrusage`) and context switches of
//!    all threads over 30 s — the supervisor's cleanup interval, so exactly one of its
//!    passes over the fleet falls in the window — plus three heartbeats.
//!
//! Environment: `FLEET_SIZES` (default `1000,10000,100000`), `FLEET_IDLE_SECS` (default 30),
//! `FLEET_DISCOVERY_SECS` (the supervisor's discovery interval, default 60),
//! `FLEET_BURST_TURNS` (default 12 at 1k, 1 at 10k), `FLEET_BURST_STEP_US` (default 0:
//! as fast as Shepherd reads), `FLEET_BACKGROUND_STEP_MS` (default 250; 0 = no
//! background traffic during the stalls), `FLEET_SERVER_THREADS` and `FLEET_PUMP_APART`
//! (`supervisor.server_threads`, `supervisor.pump_apart`), `FLEET_IN_FLIGHT`
//! (`servers[].max_requests_in_flight`), `FLEET_NO_STATUS` (no status
//! file: what its writes cost the others), `FLEET_EXIT_AT_END` (exit right after the
//! last measurement, without shutting down: under `heaptrack`, whatever Shepherd still
//! holds is then reported as leaked — run the child directly, e.g.
//! `heaptrack target/release/deps/fleet-… --fleet-scale 1000`).

mod freezes;
mod sim;
mod timings;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shepherd::daemon::Daemon;
use shepherd::opencode::PumpStats;
use shepherd_actors::config::{Config, ServerConfig};
use shepherd_actors::journal::Action;
use shepherd_actors::stream_clock::Behind;
use sim::{RunPlanned, RunSpec, SimConfig, SimReport};

/// Project directories the simulated sessions are spread over.
const DIRECTORIES: usize = 10;
/// Shepherd's stall timeout in the benchmark.
const STALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Every k-th session stalls in the latency phase.
const STALL_EVERY: u32 = 10;
/// Stalls start spread over this window.
const STALL_SPREAD_MS: u64 = 2000;
/// Pace of the sessions that keep working while others stall (≈ 5 frames/s each,
/// what a streaming OpenCode session sends on `/global/event`).
const BACKGROUND_STEP: Duration = Duration::from_millis(250);
/// Past this many sessions a second stall phase runs with the load of this many.
const SAME_LOAD_SESSIONS: usize = 10_000;
/// Give up waiting for a phase after this long (the numbers then say so).
const PHASE_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Serialize, Deserialize)]
struct ScaleResult {
    sessions: usize,
    tracked: usize,
    rss_connected_kib: u64,
    rss_connected_live_kib: u64,
    rss_tracked_kib: u64,
    rss_tracked_live_kib: u64,
    rss_end_kib: u64,
    rss_end_live_kib: u64,
    rss_peak_kib: u64,
    sim_capacity_fps: f64,
    burst_frames: u64,
    burst_pump_secs: f64,
    burst_done_secs: f64,
    idle_secs: f64,
    idle_cpu_ms: f64,
    idle_ctx_switches: u64,
    idle_frames: u64,
    warnings: u64,
    /// Messages (user + assistant) the simulator created over the whole run.
    messages: u64,
    messages_tracked: u64,
    /// Messages created before Shepherd connected (the simulator's own calibration).
    messages_connected: u64,
    messages_burst: u64,
    rss_burst_kib: u64,
    heap_connected_kib: u64,
    heap_tracked_kib: u64,
    heap_burst_kib: u64,
    heap_end_kib: u64,
    /// File-backed resident pages (the binary's code as later phases first run it,
    /// the ledger's shared-memory index): a fixed cost, not the sessions'.
    rss_file_connected_kib: u64,
    rss_file_end_kib: u64,
    rss_burst_live_kib: u64,
    burst_cpu_pct: f64,
    burst_sim_cpu_pct: f64,
    /// The share of the machine's CPU time its hypervisor took (steal) during the burst.
    #[serde(deserialize_with = "nan_if_null")]
    burst_steal_pct: f64,
    /// CPU time of Shepherd's busiest thread in the burst (a server's thread: its pump
    /// and sessions), µs per event: the per-event cost, less swayed by the machine's
    /// noise than events/s (10-ms clock ticks: ±1 % over a burst of a second).
    burst_thread_us_per_event: f64,
    burst_thread: String,
    /// Every thread that worked in the burst, with its CPU µs per event: which of them
    /// (the pump's, the sessions') is the one to make cheaper.
    burst_threads: String,
    requests_tracking: String,
    requests_burst: String,
    requests_idle: String,
    idle_window: String,
    /// CPU per thread over the idle window (10-ms ticks).
    idle_threads: String,
    load_before: String,
    load_after: String,
    /// The stall phase (every 10th session stalls while the others stream).
    #[serde(flatten)]
    stall: StallPhase,
    /// Past 10,000 sessions: a second stall phase with the 10,000-session phase's load
    /// (1,000 stalls, 9,000 streaming), the other sessions tracked and idle.
    stall_same_load: Option<StallPhase>,
    notes: Vec<String>,
}

/// What one stall phase measured.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StallPhase {
    stalls: u64,
    stalls_aborted: u64,
    stalls_continued: u64,
    unexpected_aborts: u64,
    #[serde(deserialize_with = "nan_if_null")]
    abort_p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    abort_p99_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    abort_max_ms: f64,
    background_fps: f64,
    stall_cpu_pct: f64,
    stall_sim_cpu_pct: f64,
    /// Stall deadline → Shepherd's `stall_detected` record (ms, ±1 ms: records carry ms).
    #[serde(deserialize_with = "nan_if_null")]
    detect_p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    detect_p99_ms: f64,
    /// `stall_detected` record → abort request at the simulator.
    #[serde(deserialize_with = "nan_if_null")]
    detect_to_abort_p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    detect_to_abort_p99_ms: f64,
    stall_runtime_late_p99_ms: f64,
    stall_runtime_late_max_ms: f64,
    /// When Shepherd's thread woke from its worst lateness, seconds into the phase.
    #[serde(default, deserialize_with = "nan_if_null")]
    stall_runtime_late_max_at_s: f64,
    /// The same on each server thread (the pump's, the sessions'), in words.
    #[serde(default)]
    stall_servers_late: String,
    stall_thread_late_p99_ms: f64,
    /// The most the stream's time was behind the wall clock (a read's events not all
    /// handled yet, so no deadline past it was due), ms, and when, seconds into the phase.
    #[serde(default, deserialize_with = "nan_if_null")]
    stall_stream_lag_max_ms: f64,
    #[serde(default, deserialize_with = "nan_if_null")]
    stall_stream_lag_max_at_s: f64,
    /// Freezes of a CPU (not run for ≥ `stall_freeze_gap_ms`: [`freezes`]) during the
    /// phase, the longest (ms), how many stalls' deadline-to-abort span one fell across,
    /// and the abort latency p99 of the other stalls.
    #[serde(default)]
    stall_cpu_freezes: u64,
    #[serde(default, deserialize_with = "nan_if_null")]
    stall_freeze_longest_ms: f64,
    /// The shortest stop the watchers see (ms): 8 at real-time priority, else 25.
    #[serde(default)]
    stall_freeze_gap_ms: u64,
    #[serde(default)]
    stalls_across_freeze: u64,
    #[serde(default, deserialize_with = "nan_if_null")]
    abort_p99_clear_ms: f64,
    /// Each freeze: from, to (wall µs since the epoch, as the stall CSV's times).
    #[serde(default)]
    stall_freezes: Vec<(i64, i64)>,
    /// What held it back then ([`describe_behind`]).
    #[serde(default)]
    stall_stream_behind: String,
    /// The share of the machine's CPU time its hypervisor took (steal) from the first
    /// stall deadline to the last abort: on a shared host the latencies' tail follows it.
    #[serde(deserialize_with = "nan_if_null")]
    stall_steal_pct: f64,
    requests_stall: String,
    /// Shepherd's own timings of its calls to OpenCode and its ledger writes meanwhile
    /// ([`timings`]).
    #[serde(default)]
    timings_stall: String,
    /// Every thread that worked meanwhile, with its CPU time and µs per frame the pump read: at a
    /// steady pace reads are small, and what each costs (waits, wake-ups) shows here.
    #[serde(default)]
    stall_threads: String,
    /// The frames the pump read meanwhile, per read.
    #[serde(default)]
    stall_frames_per_read: f64,
    /// Said once, in the run's notes.
    #[serde(skip)]
    notes: Vec<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--fleet-sim") {
        let n = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        // Exit with the parent: its stdin pipe closes when it goes away.
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            std::process::exit(0);
        });
        if let Err(e) = sim::serve(SimConfig { sessions: n, directories: DIRECTORIES }) {
            eprintln!("simulator: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--fleet-scale") {
        let n = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        match scale_run(n) {
            Ok(r) => println!("FLEET_RESULT {}", serde_json::to_string(&r).unwrap_or_default()),
            Err(e) => {
                eprintln!("fleet bench, {n} sessions: {e:#}");
                std::process::exit(1);
            }
        }
        return;
    }
    orchestrate();
}

fn orchestrate() {
    let sizes: Vec<usize> = std::env::var("FLEET_SIZES")
        .unwrap_or_else(|_| "1000,10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let exe = std::env::current_exe().expect("own executable path");
    let started = Instant::now();
    let mut results = Vec::new();
    for n in sizes {
        eprintln!("== fleet bench: {n} sessions");
        let out = Command::new(&exe)
            .args(["--fleet-scale", &n.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .expect("start a scale run");
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().find_map(|l| l.strip_prefix("FLEET_RESULT ")) {
            Some(json) => match serde_json::from_str::<ScaleResult>(json) {
                Ok(r) => results.push(r),
                Err(e) => eprintln!("unreadable result for {n}: {e}"),
            },
            None => eprintln!("scale run for {n} sessions failed ({})", out.status),
        }
    }
    print_table(&results);
    eprintln!("(fleet bench took {:.0} s)", started.elapsed().as_secs_f64());
}

/// The abort p99 of the stalls no stop of the host touched, with how many it left out.
fn clear_p99(s: &StallPhase) -> String {
    match s.stalls_across_freeze {
        0 => format!("{:.1} ms (no stop)", s.abort_p99_clear_ms),
        n => format!("{:.1} ms ({n} of {} left out)", s.abort_p99_clear_ms, s.stalls),
    }
}

/// The abort latency column: past 10,000 sessions, first the phase with the 10,000
/// phase's stalls and streams among all the sessions tracked (what the fleet's size does
/// to the stall path), then the one with every session but the stalling tenth streaming
/// (ten times the load: what a storm of 10,000 stalls in 2 s does, bounded by the
/// server's answers).
fn abort_latency(r: &ScaleResult) -> String {
    let phase = |s: &StallPhase| format!("{:.1} / {:.1} ms ({:.1} ms)", s.abort_p50_ms, s.abort_p99_ms, s.abort_max_ms);
    match &r.stall_same_load {
        None => phase(&r.stall),
        Some(same) => format!(
            "{} with the {} phase's load; all streaming (10× the load) {}",
            phase(same),
            fmt_n(SAME_LOAD_SESSIONS),
            phase(&r.stall)
        ),
    }
}

fn print_table(results: &[ScaleResult]) {
    let per = |a: u64, b: u64, n: usize| (a as f64 - b as f64) / n.max(1) as f64;
    println!();
    println!("| sessions | RSS/session, 1 turn each (live) | RSS/session, after all phases (live) | events/s ingested (% of the simulator alone) | abort latency p50 / p99 (max) | p99 of the stalls no host stop touched | idle, per 30 s: CPU / context switches |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let per_idle = 30.0 / r.idle_secs.max(0.001);
        println!(
            "| {} | {:.1} KiB ({:.1} KiB) | {:.1} KiB ({:.1} KiB) | {} ({:.0} %) | {} | {} | {:.1} ms / {:.0} |",
            fmt_n(r.sessions),
            per(r.rss_tracked_kib, r.rss_connected_kib, r.sessions),
            per(r.rss_tracked_live_kib, r.rss_connected_live_kib, r.sessions),
            per(r.rss_end_kib, r.rss_connected_kib, r.sessions),
            per(r.rss_end_live_kib, r.rss_connected_live_kib, r.sessions),
            fmt_n((r.burst_frames as f64 / r.burst_done_secs.max(1e-9)) as usize),
            100.0 * r.burst_frames as f64 / r.burst_done_secs.max(1e-9) / r.sim_capacity_fps.max(1.0),
            abort_latency(r),
            clear_p99(r.stall_same_load.as_ref().unwrap_or(&r.stall)),
            r.idle_cpu_ms * per_idle,
            r.idle_ctx_switches as f64 * per_idle,
        );
    }
    println!("| target | ≤ 5 KiB | ≤ 5 KiB | ≥ 50 % | p99 ≤ 10 ms | | no wake-ups for idle sessions |");
    println!();
    println!("Details:");
    for r in results {
        println!(
            "- {} sessions (load average {} before, {} after): {} tracked. RSS: connected {} KiB (live {}), one turn each {} KiB (live {}), \
             after all phases {} KiB (live {}; Shepherd saw {:.1} messages per session), peak {} KiB. Burst: {} frames, read by the pump in {:.2} s, \
             all handled after {:.2} s; Shepherd used {:.0}% of a core ({} {:.2} µs per event), the simulator {:.0}% (it alone produces {} frames/s), the host {:.0}% (steal). \
             Stalls: {} planned, {} aborted, {} continued, {} aborts of sessions that were not stalled; background load {} frames/s; \
             stall deadline → Shepherd's stall_detected record p50 {:.1} / p99 {:.1} ms, record → abort request p50 {:.1} / p99 {:.1} ms; \
             Shepherd used {:.0}% of a core, the simulator {:.0}%; a 5-ms sleep was late by {:.1} ms (p99; max {:.1} ms) on Shepherd's main thread, \
             {:.1} ms on a bare thread; the host took {:.0}% of the CPUs (steal) while the stalls were aborted. Idle window {:.1} s: {:.1} ms CPU, {} context switches (all threads), \
             {} frames (heartbeats). {} warnings logged.",
            fmt_n(r.sessions),
            r.load_before,
            r.load_after,
            r.tracked,
            r.rss_connected_kib,
            r.rss_connected_live_kib,
            r.rss_tracked_kib,
            r.rss_tracked_live_kib,
            r.rss_end_kib,
            r.rss_end_live_kib,
            (r.messages - r.messages_connected) as f64 / r.sessions.max(1) as f64,
            r.rss_peak_kib,
            r.burst_frames,
            r.burst_pump_secs,
            r.burst_done_secs,
            r.burst_cpu_pct,
            r.burst_thread,
            r.burst_thread_us_per_event,
            r.burst_sim_cpu_pct,
            fmt_n(r.sim_capacity_fps as usize),
            r.burst_steal_pct,
            r.stall.stalls,
            r.stall.stalls_aborted,
            r.stall.stalls_continued,
            r.stall.unexpected_aborts,
            fmt_n(r.stall.background_fps as usize),
            r.stall.detect_p50_ms,
            r.stall.detect_p99_ms,
            r.stall.detect_to_abort_p50_ms,
            r.stall.detect_to_abort_p99_ms,
            r.stall.stall_cpu_pct,
            r.stall.stall_sim_cpu_pct,
            r.stall.stall_runtime_late_p99_ms,
            r.stall.stall_runtime_late_max_ms,
            r.stall.stall_thread_late_p99_ms,
            r.stall.stall_steal_pct,
            r.idle_secs,
            r.idle_cpu_ms,
            r.idle_ctx_switches,
            r.idle_frames,
            r.warnings,
        );
        let per_msg = (r.rss_burst_live_kib as f64 - r.rss_tracked_live_kib as f64) * 1024.0
            / (r.messages_burst as f64 - r.messages_tracked as f64).max(1.0);
        println!(
            "  - memory per remembered message: the burst added {} messages ({:.1} per session) and {} KiB live RSS = {:.0} bytes per message",
            r.messages_burst - r.messages_tracked,
            (r.messages_burst - r.messages_tracked) as f64 / r.sessions.max(1) as f64,
            r.rss_burst_live_kib as i64 - r.rss_tracked_live_kib as i64,
            per_msg
        );
        let heap = |k: u64| (k as f64 - r.heap_connected_kib as f64) / r.sessions.max(1) as f64;
        println!(
            "  - heap in use (jemalloc's stats.allocated) per session: {:.2} KiB after one turn, {:.2} KiB after the burst, {:.2} KiB at the end; \
             the burst's {:.0} bytes per message",
            heap(r.heap_tracked_kib),
            heap(r.heap_burst_kib),
            heap(r.heap_end_kib),
            (r.heap_burst_kib as f64 - r.heap_tracked_kib as f64) * 1024.0
                / (r.messages_burst as f64 - r.messages_tracked as f64).max(1.0)
        );
        println!(
            "  - file-backed RSS (code first run by later phases, the ledger's index): {} KiB connected, {} KiB at the end, \
             {:.2} KiB per session of the growth",
            r.rss_file_connected_kib,
            r.rss_file_end_kib,
            (r.rss_file_end_kib as f64 - r.rss_file_connected_kib as f64) / r.sessions.max(1) as f64
        );
        println!("  - requests while tracking: {}", r.requests_tracking);
        println!("  - requests during the burst: {}", r.requests_burst);
        println!("  - requests during the stall phase: {}", r.stall.requests_stall);
        println!("  - Shepherd's timings during the stall phase (its calls, its ledger writes): {}", r.stall.timings_stall);
        println!(
            "  - during the stall phase: {:.1} frames per pump read; CPU by thread: {}",
            r.stall.stall_frames_per_read, r.stall.stall_threads
        );
        if let Some(s) = &r.stall_same_load {
            println!(
                "  - stalls with the {} phase's load ({} planned, {} aborted, {} continued, {} aborts of sessions that were not stalled; \
                 background load {} frames/s): abort latency p50 {:.1} / p99 {:.1} ms (max {:.1}); stall deadline → stall_detected \
                 p50 {:.1} / p99 {:.1} ms, → abort request p50 {:.1} / p99 {:.1} ms; Shepherd used {:.0}% of a core, the simulator {:.0}%, \
                 the host {:.0}% of the CPUs (steal); requests: {}",
                fmt_n(SAME_LOAD_SESSIONS),
                s.stalls,
                s.stalls_aborted,
                s.stalls_continued,
                s.unexpected_aborts,
                fmt_n(s.background_fps as usize),
                s.abort_p50_ms,
                s.abort_p99_ms,
                s.abort_max_ms,
                s.detect_p50_ms,
                s.detect_p99_ms,
                s.detect_to_abort_p50_ms,
                s.detect_to_abort_p99_ms,
                s.stall_cpu_pct,
                s.stall_sim_cpu_pct,
                s.stall_steal_pct,
                s.requests_stall
            );
            println!("  - Shepherd's timings with the {} phase's load: {}", fmt_n(SAME_LOAD_SESSIONS), s.timings_stall);
        }
        println!("  - idle window {}: requests {}; CPU by thread: {}", r.idle_window, r.requests_idle, r.idle_threads);
        for note in &r.notes {
            println!("  - note: {note}");
        }
    }
}

fn fmt_n(n: usize) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits.as_bytes().rchunks(3).rev().map(|g| std::str::from_utf8(g).unwrap_or("?")).collect();
    groups.join(",")
}

// ---- one scale run (this process = Shepherd) ----

struct SimProcess {
    child: Child,
    url: String,
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sim(n: usize) -> anyhow::Result<SimProcess> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--fleet-sim", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no simulator stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("SIM_LISTENING ")
        .ok_or_else(|| anyhow::anyhow!("simulator did not start: {line:?}"))?
        .to_string();
    Ok(SimProcess { child, url: format!("http://{addr}") })
}

fn scale_run(n: usize) -> anyhow::Result<ScaleResult> {
    // Shepherd's action log, as in production (JSON lines written by the log's own
    // thread), to a scratch file. Written by the thread that logs, as it once was, a
    // line that waits on the disk held up that thread's sessions (28 ms seen).
    let log_path = std::env::temp_dir().join(format!("shepherd-fleet-bench-{n}.log"));
    let _ = std::fs::remove_file(&log_path);
    let log_guard = shepherd::logging::init_file(shepherd_actors::config::LogFormat::Json, "info", &log_path)?;
    let sim = start_sim(n)?;
    let sim_pid = sim.child.id();
    let mut result = actix::System::new().block_on(scale(n, sim.url.clone(), sim_pid))?;
    drop(sim);
    drop(log_guard);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    result.warnings = log.lines().filter(|l| l.contains(r#""level":"WARN""#)).count() as u64;
    if result.warnings > 0 {
        result.notes.push(format!("warnings are in {}", log_path.display()));
    }
    Ok(result)
}

struct Harness {
    http: reqwest::Client,
    sim: String,
}

impl Harness {
    async fn run(&self, spec: &RunSpec) -> anyhow::Result<RunPlanned> {
        Ok(self.http.post(format!("{}/_sim/run", self.sim)).json(spec).send().await?.json().await?)
    }

    /// The simulator's counters, without the stalls' times (see `report_from`).
    async fn report(&self) -> anyhow::Result<SimReport> {
        Ok(self.http.get(format!("{}/_sim/report", self.sim)).send().await?.json().await?)
    }

    /// The counters and the times of the stalls aborted from the `from`-th on: asked once
    /// a phase is over, never while it is measured.
    async fn report_from(&self, from: u64) -> anyhow::Result<SimReport> {
        let url = format!("{}/_sim/report?times_from={from}", self.sim);
        Ok(self.http.get(url).send().await?.json().await?)
    }
}

async fn scale(n: usize, sim_url: String, sim_pid: u32) -> anyhow::Result<ScaleResult> {
    let mut r = ScaleResult { sessions: n, load_before: load_average(), ..ScaleResult::default() };
    let h = Harness { http: reqwest::Client::new(), sim: sim_url.clone() };

    // Bursts: 1k sessions × 12 turns (36 messages each: past the session core's memory of
    // message roles), or 10k × 1 turn; 64 frames a turn.
    let burst = RunSpec {
        turns: env_or("FLEET_BURST_TURNS", (12_000 / n.max(1)).clamp(1, 50) as u64) as u32,
        deltas: 10,
        tool: true,
        ..RunSpec::default()
    };

    // 1. What the simulator can produce with a bare reader (Shepherd not started).
    r.sim_capacity_fps = sim_capacity(&h, &burst).await?;
    eprintln!("   simulator alone: {:.0} frames/s", r.sim_capacity_fps);

    // 2. Shepherd, connected, tracking nothing yet.
    let mut cfg = Config { servers: vec![ServerConfig::new("sim", sim_url.clone())], ..Config::default() };
    cfg.control.enabled = false;
    cfg.nudge.enabled = false;
    cfg.review.enabled = false;
    cfg.recovery.stall_timeout = STALL_TIMEOUT;
    cfg.recovery.wait_after_abort = Duration::from_millis(100);
    // Simulated sessions stall seconds after they are created: the heuristic "new
    // session → wait" would postpone every measured abort. The advice is still sought.
    cfg.advisor.new_session = Duration::ZERO;
    // The guard's fleet-wide limit (120 prompts/min by default) would hold most of the
    // stall phase's continues for minutes (at 10k: 876 of 1000), their recoveries and
    // orders kept in memory meanwhile. This bench measures the stall path, not the limit.
    cfg.guard.global_per_minute = 100_000;
    cfg.guard.global_burst = 10_000;
    // Every session stays in memory (100k is past the default cap of 20k): the RSS per
    // session is of tracked sessions, not of evicted ones.
    cfg.supervisor.max_sessions_in_memory = cfg.supervisor.max_sessions_in_memory.max(n);
    // `FLEET_SERVER_THREADS` overrides `supervisor.server_threads` (default: one per core).
    if let Some(n) = std::env::var("FLEET_SERVER_THREADS").ok().and_then(|v| v.parse().ok()) {
        cfg.supervisor.server_threads = n;
    }
    // `FLEET_DISCOVERY_SECS` overrides `supervisor.discovery_interval` (default 60 s): a
    // short one puts discoveries inside every phase, to see what they cost.
    if let Some(secs) = std::env::var("FLEET_DISCOVERY_SECS").ok().and_then(|v| v.parse().ok()) {
        cfg.supervisor.discovery_interval = Duration::from_secs(secs);
    }
    // `FLEET_IN_FLIGHT` overrides `servers[].max_requests_in_flight` (default 32): whose
    // limit a stall storm's calls wait on, Shepherd's or the server's.
    if let Some(n) = std::env::var("FLEET_IN_FLIGHT").ok().and_then(|v| v.parse().ok()) {
        cfg.servers[0].max_requests_in_flight = n;
    }
    // `FLEET_PUMP_APART=0|1` overrides `supervisor.pump_apart` (default: on).
    if let Ok(v) = std::env::var("FLEET_PUMP_APART") {
        cfg.supervisor.pump_apart = v != "0";
    }
    r.notes.push(format!(
        "server_threads {} (0: one per core), pump_apart {}",
        cfg.supervisor.server_threads, cfg.supervisor.pump_apart
    ));
    // The daemon's default backend (SQLite on disk), in a scratch file.
    let ledger = std::env::temp_dir().join(format!("shepherd-fleet-bench-{n}.sqlite3"));
    remove_ledger(&ledger);
    cfg.store.path = ledger.display().to_string();
    cfg.status.path = std::env::temp_dir().join(format!("shepherd-fleet-bench-{n}.status.json")).display().to_string();
    if std::env::var_os("FLEET_NO_STATUS").is_some() {
        cfg.status.enabled = false;
    }
    cfg.validate().map_err(|e| anyhow::anyhow!("bench config: {e}"))?;
    let daemon_started = Instant::now();
    let daemon = Daemon::start(&cfg)?;
    let stats = Arc::clone(&daemon.pump_stats()[0].1);
    wait_for("stream connected and reconciled", || {
        let (stats, daemon) = (&stats, &daemon);
        async move {
            stats.connects.load(Ordering::Relaxed) >= 1
                && daemon.fleet().await.servers.first().is_some_and(|s| s.reconciled)
        }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    (r.rss_connected_kib, r.rss_connected_live_kib) = rss_raw_and_live();
    r.heap_connected_kib = heap_in_use_kib();
    r.rss_file_connected_kib = proc_status_kib("RssFile:") + proc_status_kib("RssShmem:");

    // 3. Every session has one turn, paced: now each is tracked.
    let track = RunSpec {
        turns: 1,
        deltas: 2,
        tool: false,
        step_interval_us: 20_000,
        start_spread_ms: 2_000 + n as u64 / 5,
        ..RunSpec::default()
    };
    let rep0 = h.report().await?;
    let t = Instant::now();
    h.run(&track).await?;
    settle(&h, &stats).await?;
    // Not kept: a fleet view held here would be counted in Shepherd's RSS below.
    r.tracked = daemon.fleet().await.sessions.len();
    for _ in 0..3 {
        time_fleet_read(&daemon).await;
    }
    let rep1 = h.report().await?;
    r.requests_tracking = requests_between(&rep0, &rep1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    (r.rss_tracked_kib, r.rss_tracked_live_kib) = rss_raw_and_live();
    r.heap_tracked_kib = heap_in_use_kib();
    eprintln!(
        "   tracking: {} sessions tracked in {:.1} s; RSS {} → {} KiB (live {} → {} KiB)",
        r.tracked,
        t.elapsed().as_secs_f64(),
        r.rss_connected_kib,
        r.rss_tracked_kib,
        r.rss_connected_live_kib,
        r.rss_tracked_live_kib
    );

    // 4. Throughput: a burst as fast as Shepherd reads it.
    let before = stats.frames.load(Ordering::Relaxed);
    let (cpu0, sim0, host0) = (cpu_time(), child_cpu_time(sim_pid), HostTicks::now());
    let threads0 = thread_cpu();
    let t = Instant::now();
    // FLEET_BURST_STEP_US paces the burst instead (an experiment on memory: same events,
    // no backlog); events/s is then the pace, not Shepherd's capacity.
    let step = env_or("FLEET_BURST_STEP_US", 0);
    let planned = h.run(&RunSpec { step_interval_us: step, ..burst.clone() }).await?;
    r.burst_frames = planned.frames;
    let deadline = t + PHASE_LIMIT;
    while stats.frames.load(Ordering::Relaxed) < before + planned.frames && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    r.burst_pump_secs = t.elapsed().as_secs_f64();
    // Queued behind every Ingest and every Observe: returns once all are handled. (The
    // fleet view reads what the actors published, without waiting for them.)
    let _ = daemon.ask_sessions().await;
    r.burst_done_secs = t.elapsed().as_secs_f64();
    r.burst_cpu_pct = (cpu_time() - cpu0).as_secs_f64() * 100.0 / r.burst_done_secs;
    r.burst_sim_cpu_pct = (child_cpu_time(sim_pid) - sim0).as_secs_f64() * 100.0 / r.burst_done_secs;
    r.burst_steal_pct = host0.steal_pct_until(&HostTicks::now());
    let threads1 = thread_cpu();
    r.burst_threads = threads_per_event(&threads0, &threads1, planned.frames);
    if let Some((name, busy)) = busiest_thread(&threads0, &threads1) {
        r.burst_thread_us_per_event = busy.as_secs_f64() * 1e6 / planned.frames.max(1) as f64;
        r.burst_thread = name;
    }
    if Instant::now() >= deadline {
        r.notes.push("burst did not finish within the phase limit".into());
    }
    eprintln!(
        "   burst: {} frames, pump {:.2} s, handled {:.2} s = {:.0} events/s; busiest thread ({}) {:.2} µs CPU per event ({}); \
         the host took {:.0}% of the CPUs (steal)",
        planned.frames,
        r.burst_pump_secs,
        r.burst_done_secs,
        planned.frames as f64 / r.burst_done_secs,
        r.burst_thread,
        r.burst_thread_us_per_event,
        r.burst_threads,
        r.burst_steal_pct
    );
    settle(&h, &stats).await?;
    let rep2 = h.report().await?;
    r.requests_burst = requests_between(&rep1, &rep2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    (r.rss_burst_kib, r.rss_burst_live_kib) = rss_raw_and_live();
    r.heap_burst_kib = heap_in_use_kib();
    r.messages_tracked = rep1.messages;
    r.messages_connected = rep0.messages;
    r.messages_burst = rep2.messages;

    // 5. Stalls under background load.
    let background_step = std::env::var("FLEET_BACKGROUND_STEP_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(BACKGROUND_STEP, Duration::from_millis);
    let stall = RunSpec {
        turns: if background_step.is_zero() { 0 } else { 1 },
        deltas: 12,
        tool: false,
        step_interval_us: background_step.as_micros() as u64,
        // Turns start spread over 2 s so that sessions are at different steps at any time.
        start_spread_ms: STALL_SPREAD_MS,
        stall_every: STALL_EVERY,
        stall_deltas: 2,
        stall_spread_ms: STALL_SPREAD_MS,
        stall_timeout_ms: STALL_TIMEOUT.as_millis() as u64,
        sessions: 0,
    };
    let mut phase = stall_phase(&h, &daemon, &stall, sim_pid, "", &format!("shepherd-fleet-bench-{n}-stalls.csv")).await?;
    r.notes.append(&mut phase.notes);
    r.stall = phase;
    settle(&h, &stats).await?;
    // Past 10,000 sessions the phase above is ten times the load of the 10,000 one (every
    // session but the stalling tenth streams); this one has that phase's load — 1,000
    // stalls among 10,000 sessions, the rest tracked and idle — so what the fleet's
    // size alone does to the stall path shows apart from what the load does.
    if n > SAME_LOAD_SESSIONS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let same = RunSpec { sessions: SAME_LOAD_SESSIONS, ..stall.clone() };
        let label = format!(" (the {} phase's load)", fmt_n(SAME_LOAD_SESSIONS));
        let mut phase =
            stall_phase(&h, &daemon, &same, sim_pid, &label, &format!("shepherd-fleet-bench-{n}-stalls-same-load.csv"))
                .await?;
        r.notes.append(&mut phase.notes);
        r.stall_same_load = Some(phase);
        settle(&h, &stats).await?;
    }

    // 6. Idle: every session idle, nothing to do but the 10-s heartbeat.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = Duration::from_secs(std::env::var("FLEET_IDLE_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30));
    let rep_idle0 = h.report().await?;
    let (cpu0, ctx0, frames0) = (cpu_time(), context_switches(), stats.frames.load(Ordering::Relaxed));
    let threads0 = thread_cpu();
    let t = Instant::now();
    tokio::time::sleep(idle).await;
    let (cpu1, ctx1, frames1) = (cpu_time(), context_switches(), stats.frames.load(Ordering::Relaxed));
    let threads1 = thread_cpu();
    r.idle_secs = t.elapsed().as_secs_f64();
    let rep_idle1 = h.report().await?;
    r.requests_idle = requests_between(&rep_idle0, &rep_idle1);
    r.idle_threads = threads1
        .iter()
        .filter_map(|(tid, (name, t1))| {
            let t0 = threads0.get(tid).map_or(Duration::ZERO, |(_, t)| *t);
            (*t1 > t0).then(|| format!("{name} {} ms", (*t1 - t0).as_millis()))
        })
        .collect::<Vec<_>>()
        .join(", ");
    // The supervisor's periodic jobs (cleanup every 30 s, discovery every 60 s) count
    // from its start: say where the window lies.
    let from = t.duration_since(daemon_started).as_secs_f64();
    r.idle_window = format!("{:.0}–{:.0} s after Shepherd started", from, from + r.idle_secs);
    r.idle_cpu_ms = (cpu1 - cpu0).as_secs_f64() * 1000.0;
    r.idle_ctx_switches = ctx1.saturating_sub(ctx0);
    r.idle_frames = frames1 - frames0;
    eprintln!(
        "   idle {:.1} s: {:.1} ms CPU, {} context switches, {} frames",
        r.idle_secs, r.idle_cpu_ms, r.idle_ctx_switches, r.idle_frames
    );

    (r.rss_end_kib, r.rss_end_live_kib) = rss_raw_and_live();
    r.heap_end_kib = heap_in_use_kib();
    r.rss_file_end_kib = proc_status_kib("RssFile:") + proc_status_kib("RssShmem:");
    r.rss_peak_kib = proc_status_kib("VmHWM:");
    r.messages = h.report().await?.messages;
    if std::env::var_os("FLEET_EXIT_AT_END").is_some() {
        // For a heap profiler: what is allocated now is reported as leaked.
        println!("FLEET_RESULT {}", serde_json::to_string(&r).unwrap_or_default());
        std::process::exit(0);
    }
    r.load_after = load_average();
    daemon.shutdown().await;
    remove_ledger(&ledger);
    Ok(r)
}

/// One stall phase: `spec`'s stalls under its background load, measured from the
/// simulator's report and Shepherd's own `stall_detected` records; each stall's times go
/// to `csv` (in the temp folder).
async fn stall_phase(
    h: &Harness,
    daemon: &Daemon,
    spec: &RunSpec,
    sim_pid: u32,
    label: &str,
    csv: &str,
) -> anyhow::Result<StallPhase> {
    let mut r = StallPhase::default();
    let before_report = h.report().await?;
    let (cpu0, sim0) = (cpu_time(), child_cpu_time(sim_pid));
    let pump = Arc::clone(&daemon.pump_stats()[0].1);
    let (threads0, frames0, reads0) = (thread_cpu(), pump.frames.load(Ordering::Relaxed), pump.reads.load(Ordering::Relaxed));
    let probe = LatenessProbe::start(Arc::clone(&pump), daemon.threads());
    let freeze_watch = freezes::FreezeWatch::start();
    let timings = timings::Timings::parse(&daemon.metrics().render_now());
    // Shepherd's own `stall_detected` records (wall ms), to split each latency in two.
    let mut journal = daemon.journal().subscribe_to(&[Action::StallDetected]);
    let (stop_detections, mut stopped) = tokio::sync::watch::channel(false);
    let detections = actix::spawn(async move {
        let mut seen = std::collections::HashMap::new();
        loop {
            tokio::select! {
                rec = journal.recv() => match rec {
                    Ok(rec) if rec.action == Action::StallDetected => {
                        seen.entry(rec.session).or_insert(rec.at_ms);
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => break,
                },
                _ = stopped.changed() => break,
            }
        }
        seen
    });
    let t = Instant::now();
    let mut host = vec![HostTicks::now()];
    let planned = h.run(spec).await?;
    r.stalls = planned.stalling;
    let deadline = t + PHASE_LIMIT;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        host.push(HostTicks::now());
        let rep = h.report().await?;
        let done = rep.stalling_pending == 0 && rep.stalled_continued >= planned.stalling && rep.busy == 0;
        if done || Instant::now() > deadline {
            if !done {
                r.notes.push(format!(
                    "stall phase{} cut at {} s: {} stalls not aborted, {} busy",
                    label,
                    PHASE_LIMIT.as_secs(),
                    rep.stalling_pending,
                    rep.busy
                ));
            }
            break;
        }
    }
    let phase_secs = t.elapsed().as_secs_f64();
    let report = h.report_from(before_report.stalls_recorded).await?;
    let late = probe.finish().await;
    let (unpinned, gap_ms) = (freeze_watch.unpinned, freeze_watch.gap_ms());
    let frozen = freeze_watch.finish();
    (r.stall_runtime_late_p99_ms, r.stall_thread_late_p99_ms, r.stall_runtime_late_max_ms, r.stall_runtime_late_max_at_s) =
        (late.runtime_p99_ms, late.thread_p99_ms, late.runtime_max_ms, late.runtime_max_at_s);
    r.stall_servers_late = late.servers.clone();
    if let Some((behind, at)) = late.stream_behind {
        (r.stall_stream_lag_max_ms, r.stall_stream_lag_max_at_s) = (behind.lag.as_secs_f64() * 1000.0, at);
        r.stall_stream_behind = describe_behind(&behind);
    }
    let _ = stop_detections.send(true);
    let detected = detections.await.unwrap_or_default();
    let (mut fire, mut rest) = (Vec::new(), Vec::new());
    // The simulator's lists run over the whole run: this phase's are the ones added since.
    let (stall_times, latencies) = (&report.stall_times, &report.abort_latency_us);
    for (id, deadline_us, abort_us) in stall_times {
        if let Some(&at_ms) = detected.get(id) {
            fire.push((at_ms * 1000 - deadline_us) as f64 / 1000.0);
            rest.push((abort_us - at_ms * 1000) as f64 / 1000.0);
        }
    }
    write_stall_times(csv, stall_times, &detected);
    r.stall_steal_pct = HostTicks::steal_pct_over(&host, stall_times);
    fire.sort_by(f64::total_cmp);
    rest.sort_by(f64::total_cmp);
    r.detect_p50_ms = percentile(&fire, 50.0);
    r.detect_p99_ms = percentile(&fire, 99.0);
    r.detect_to_abort_p50_ms = percentile(&rest, 50.0);
    r.detect_to_abort_p99_ms = percentile(&rest, 99.0);
    r.requests_stall = requests_between(&before_report, &report);
    r.timings_stall = timings::Timings::parse(&daemon.metrics().render_now()).since(&timings);
    r.stall_cpu_pct = (cpu_time() - cpu0).as_secs_f64() * 100.0 / phase_secs;
    r.stall_sim_cpu_pct = (child_cpu_time(sim_pid) - sim0).as_secs_f64() * 100.0 / phase_secs;
    let frames = pump.frames.load(Ordering::Relaxed) - frames0;
    r.stall_threads = threads_listed(&threads0, &thread_cpu(), |d| {
        format!("{:.0} ms ({:.2} µs/frame)", d.as_secs_f64() * 1e3, d.as_secs_f64() * 1e6 / frames.max(1) as f64)
    });
    r.stall_frames_per_read = frames as f64 / (pump.reads.load(Ordering::Relaxed) - reads0).max(1) as f64;
    r.background_fps = (report.frames_sent - before_report.frames_sent) as f64 / phase_secs;
    r.stalls_aborted = report.stalls_aborted;
    r.stalls_continued = report.stalled_continued;
    r.unexpected_aborts = report.unexpected_aborts - before_report.unexpected_aborts;
    let mut lat: Vec<f64> = latencies.iter().map(|&us| us as f64 / 1000.0).collect();
    lat.sort_by(f64::total_cmp);
    r.abort_p50_ms = percentile(&lat, 50.0);
    r.abort_p99_ms = percentile(&lat, 99.0);
    r.abort_max_ms = lat.last().copied().unwrap_or(f64::NAN);
    // The aborts whose deadline-to-abort span a frozen CPU (or the catching up after it)
    // fell across, or whose last event left while one did — Shepherd read it that much
    // later, so its deadline came that much after the simulator's — and the rest's.
    let timeout_us = STALL_TIMEOUT.as_micros() as i64;
    let mut clear: Vec<f64> = stall_times
        .iter()
        .filter(|(_, deadline_us, abort_us)| {
            let last_left = deadline_us - timeout_us;
            !freezes::across(&frozen, *deadline_us, *abort_us) && !freezes::across(&frozen, last_left, last_left)
        })
        .map(|(_, deadline_us, abort_us)| (abort_us - deadline_us) as f64 / 1000.0)
        .collect();
    clear.sort_by(f64::total_cmp);
    r.stall_cpu_freezes = frozen.len() as u64;
    r.stall_freezes = frozen.iter().map(|f| (f.from_us, f.to_us)).collect();
    r.stall_freeze_longest_ms = frozen.iter().map(freezes::Freeze::ms).fold(0.0, f64::max);
    r.stall_freeze_gap_ms = gap_ms;
    r.stalls_across_freeze = (stall_times.len() - clear.len()) as u64;
    r.abort_p99_clear_ms = percentile(&clear, 99.0);
    if unpinned > 0 {
        r.notes.push(format!("{unpinned} CPUs' freeze watchers could not be pinned: their freezes may be missed"));
    }
    if lat.first().is_some_and(|&l| l < 0.0) {
        r.notes.push(format!("{} aborts arrived before the stall deadline", lat.iter().filter(|&&l| l < 0.0).count()));
    }
    eprintln!(
        "   stalls{}: {} planned, {} aborted, {} continued in {:.1} s; abort latency p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms \
         (deadline → stall_detected p50 {:.1} / p99 {:.1} ms, → abort request p50 {:.1} / p99 {:.1} ms); {} unexpected aborts; \
         the host took {:.0}% of the CPUs (steal) meanwhile",
        label,
        r.stalls,
        r.stalls_aborted,
        r.stalls_continued,
        phase_secs,
        r.abort_p50_ms,
        r.abort_p99_ms,
        r.abort_max_ms,
        r.detect_p50_ms,
        r.detect_p99_ms,
        r.detect_to_abort_p50_ms,
        r.detect_to_abort_p99_ms,
        r.unexpected_aborts,
        r.stall_steal_pct
    );
    eprintln!("   Shepherd's timings meanwhile: {}", r.timings_stall);
    eprintln!(
        "   Shepherd's main thread: a 5-ms sleep late by {:.1} ms at p99, worst {:.1} ms ({:.2} s into the phase); \
         its servers' and io threads: {}; a bare thread {:.1} ms at p99",
        r.stall_runtime_late_p99_ms,
        r.stall_runtime_late_max_ms,
        r.stall_runtime_late_max_at_s,
        r.stall_servers_late,
        r.stall_thread_late_p99_ms
    );
    eprintln!(
        "   the host stopped a CPU {} times (not run for ≥ {} ms; the longest {:.0} ms): {} stalls' deadline-to-abort spans crossed one; \
         abort latency p99 of the other {}: {:.2} ms",
        r.stall_cpu_freezes,
        r.stall_freeze_gap_ms,
        r.stall_freeze_longest_ms,
        r.stalls_across_freeze,
        r.stalls.saturating_sub(r.stalls_across_freeze),
        r.abort_p99_clear_ms
    );
    eprintln!(
        "   stream time behind by at most {:.1} ms ({:.2} s into the phase): {}",
        r.stall_stream_lag_max_ms, r.stall_stream_lag_max_at_s, r.stall_stream_behind
    );
    eprintln!(
        "   meanwhile {:.1} frames per pump read; CPU by thread: {}",
        r.stall_frames_per_read, r.stall_threads
    );
    Ok(r)
}

/// One line per aborted stall (epoch µs): deadline, Shepherd's record, abort arrival.
fn write_stall_times(name: &str, times: &[(String, i64, i64)], detected: &std::collections::HashMap<String, i64>) {
    let path = std::env::temp_dir().join(name);
    let mut csv = String::from("session,deadline_us,stall_detected_us,abort_us\n");
    for (id, deadline, abort) in times {
        let at = detected.get(id).map_or(String::new(), |ms| (ms * 1000).to_string());
        csv.push_str(&format!("{id},{deadline},{at},{abort}\n"));
    }
    let _ = std::fs::write(path, csv);
}

fn remove_ledger(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The requests the simulator saw between two reports.
fn requests_between(a: &SimReport, b: &SimReport) -> String {
    let mut keys: Vec<&String> = b.requests.keys().collect();
    keys.sort();
    let mut parts: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            let d = b.requests[*k] - a.requests.get(*k).copied().unwrap_or(0);
            (d > 0).then(|| format!("{k} ×{d}"))
        })
        .collect();
    parts.push(format!("{} new TCP connections", b.connections - a.connections));
    parts.join(", ")
}

/// Lateness of a 5-ms sleep, sampled until `stop` is set: on Shepherd's main runtime
/// thread (the supervisor's), on each of its servers' threads (the pump's, the
/// sessions') and io threads (the sessions' calls), and on a bare OS thread of this
/// process. The first two say how long each
/// thread was busy or descheduled; the last is the machine's scheduling noise alone.
struct LatenessProbe {
    stop: Arc<std::sync::atomic::AtomicBool>,
    started: Instant,
    /// Each wake-up's lateness (ms) on the main thread, when it woke, and how the
    /// thread spent the while.
    runtime: tokio::task::JoinHandle<Vec<Sample>>,
    /// The same on each server thread.
    servers: Vec<(String, tokio::sync::oneshot::Receiver<Vec<Sample>>)>,
    /// The bare thread's lateness (ms), and the stream clock when it was furthest
    /// behind, with when: read off Shepherd's threads, it is seen even while they are
    /// held up.
    thread: std::thread::JoinHandle<(Vec<f64>, Option<Worst>)>,
}

/// The stream clock at its worst lag, and when.
type Worst = (Behind, Instant);

/// One wake-up of a probe: how late (ms), when, and what the thread did meanwhile.
type Sample = (f64, Instant, (f64, f64));

/// A thread's scheduler accounting (`/proc/thread-self/schedstat`, Linux): time run on
/// a CPU and time waited for one, in ms. Across a late wake-up it tells a thread that was
/// busy (it ran) from one the machine kept from running (it waited) and from one blocked
/// in a call (neither).
#[derive(Debug, Clone, Copy, Default)]
struct Schedstat {
    run_ms: f64,
    wait_ms: f64,
}

impl Schedstat {
    fn of_this_thread() -> Self {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
        let mut ns = text.split_whitespace().map(|n| n.parse::<f64>().unwrap_or(0.0) / 1e6);
        Self { run_ms: ns.next().unwrap_or(0.0), wait_ms: ns.next().unwrap_or(0.0) }
    }

    /// (ran, waited) since `before`, in ms.
    fn since(self, before: Self) -> (f64, f64) {
        (self.run_ms - before.run_ms, self.wait_ms - before.wait_ms)
    }
}

/// What [`LatenessProbe::finish`] found, in ms and seconds into the phase.
#[derive(Debug, Default, Clone)]
struct Lateness {
    runtime_p99_ms: f64,
    thread_p99_ms: f64,
    runtime_max_ms: f64,
    runtime_max_at_s: f64,
    /// Each server and io thread's: `shepherd-srv-N p99 … / worst … ms (… s)`.
    servers: String,
    /// The stream clock when it was furthest behind, and when (seconds into the phase).
    stream_behind: Option<(Behind, f64)>,
}

impl LatenessProbe {
    const PERIOD: Duration = Duration::from_millis(5);

    /// `threads`: Shepherd's threads to probe besides the main one, named.
    fn start(pump: Arc<PumpStats>, threads: Vec<(String, actix::ArbiterHandle)>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampled = |s: Arc<std::sync::atomic::AtomicBool>| async move {
            let mut late = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let (t, before) = (Instant::now(), Schedstat::of_this_thread());
                tokio::time::sleep(Self::PERIOD).await;
                let spent = Schedstat::of_this_thread().since(before);
                late.push(((t.elapsed().saturating_sub(Self::PERIOD)).as_secs_f64() * 1000.0, Instant::now(), spent));
            }
            late
        };
        let runtime = actix::spawn(sampled(Arc::clone(&stop)));
        let servers = threads
            .into_iter()
            .map(|(name, thread)| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let probe = sampled(Arc::clone(&stop));
                thread.spawn(async move {
                    let _ = tx.send(probe.await);
                });
                (name, rx)
            })
            .collect();
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut late, mut worst): (_, Option<Worst>) = (Vec::new(), None);
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Self::PERIOD);
                late.push((t.elapsed().saturating_sub(Self::PERIOD)).as_secs_f64() * 1000.0);
                let behind = pump.clock.behind(tokio::time::Instant::now());
                if worst.as_ref().is_none_or(|(w, _)| behind.lag > w.lag) {
                    worst = Some((behind, Instant::now()));
                }
            }
            (late, worst)
        });
        Self { stop, started: Instant::now(), runtime, servers, thread }
    }

    /// p99 lateness in ms: (Shepherd's main thread, a bare thread), the worst on the
    /// main thread and each server thread, and when it woke from it (seconds after the
    /// probe started: a pause that comes back at the same offset points at a periodic
    /// task).
    async fn finish(self) -> Lateness {
        self.stop.store(true, Ordering::Relaxed);
        let since = |at: Instant| at.duration_since(self.started).as_secs_f64();
        // p99, worst and when, and what the thread did across the worst, of one thread's
        // samples.
        let summary = |mut samples: Vec<Sample>| {
            let worst = samples.iter().max_by(|a, b| a.0.total_cmp(&b.0)).copied();
            samples.sort_by(|a, b| a.0.total_cmp(&b.0));
            let late: Vec<f64> = samples.into_iter().map(|(late, ..)| late).collect();
            let (at, spent) = worst.map_or((f64::NAN, (f64::NAN, f64::NAN)), |w| (since(w.1), w.2));
            (percentile(&late, 99.0), worst.map_or(f64::NAN, |w| w.0), at, spent)
        };
        let (runtime_p99_ms, runtime_max_ms, runtime_max_at_s, _) = summary(self.runtime.await.unwrap_or_default());
        let mut servers = Vec::new();
        for (name, rx) in self.servers {
            let (p99, worst, at, (ran, waited)) = summary(rx.await.unwrap_or_default());
            servers.push(format!(
                "{name} p99 {p99:.1} / worst {worst:.1} ms ({at:.2} s; meanwhile it ran {ran:.1} ms \
                 and waited {waited:.1} ms for a CPU)"
            ));
        }
        let (mut th, worst) = self.thread.join().unwrap_or_default();
        th.sort_by(f64::total_cmp);
        Lateness {
            runtime_p99_ms,
            thread_p99_ms: percentile(&th, 99.0),
            runtime_max_ms,
            runtime_max_at_s,
            servers: servers.join(", "),
            stream_behind: worst.map(|(behind, at)| (behind, since(at))),
        }
    }
}

/// The stream clock's state at its worst lag, in words: whether the pump was reading or
/// waiting, the reads it had handed on and not seen handled, and what the kernel held
/// unread. A backlog in the socket with the pump waiting means its thread did not run;
/// a read handed on long ago means an actor did not take its event.
fn describe_behind(b: &Behind) -> String {
    let pump = match (b.following, b.parked) {
        (false, _) => "the pump not connected",
        (true, true) => "the pump waiting on the socket",
        (true, false) => "the pump reading",
    };
    let reads = match b.oldest_unhandled {
        Some(age) => format!("{} reads handed on and not handled (the oldest {:.1} ms ago)", b.unhandled_reads, age.as_secs_f64() * 1e3),
        None => "every read handled".to_string(),
    };
    let unread = b.unread_bytes.map_or_else(|| "unread bytes unknown".to_string(), |n| format!("{} KiB unread in the socket", n / 1024));
    let ms = |d: Option<Duration>| d.map_or_else(|| "never".to_string(), |d| format!("{:.1} ms ago", d.as_secs_f64() * 1e3));
    let proof = format!(
        "the socket's latest proven moment {}, last seen empty {} ({} full reads since)",
        ms(b.proven_age),
        ms(b.emptied_age),
        b.full_reads
    );
    format!("{pump}, {reads}, {unread}, {proof}")
}

/// How many SSE frames end in `bytes` (a blank line: `\n\n`), `last` the byte before
/// them (and after them, once counted).
fn frame_ends(bytes: &[u8], last: &mut u8) -> u64 {
    let mut ends = 0;
    for &b in bytes {
        if b == b'\n' && *last == b'\n' {
            ends += 1;
        }
        *last = b;
    }
    ends
}

/// Frames per second a bare SSE reader gets from the simulator for this burst.
async fn sim_capacity(h: &Harness, burst: &RunSpec) -> anyhow::Result<f64> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // The bare reader reads the socket itself and counts the frames' ends in the raw
    // bytes (HTTP's chunk framing is `\r\n`-separated and never holds `\n\n`): the
    // simulator sends every event as its own chunk, as OpenCode does, and an HTTP
    // client's hand-over per chunk would make the reader, not the simulator, the
    // ceiling.
    let address = h.sim.trim_start_matches("http://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&address).await?;
    tcp.write_all(format!("GET /global/event HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n").as_bytes())
        .await?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut frames, mut last) = (0u64, 0u8);
    // The first frame is `server.connected`.
    while frames == 0 {
        let n = tcp.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "the simulator closed the stream");
        frames += frame_ends(&buf[..n], &mut last);
    }
    let t = Instant::now();
    let planned = h.run(burst).await?;
    let connected = frames;
    while frames - connected < planned.frames {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        frames += frame_ends(&buf[..n], &mut last);
    }
    let rate = (frames - connected) as f64 / t.elapsed().as_secs_f64();
    drop(tcp);
    // Let every session finish that turn before Shepherd starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + PHASE_LIMIT;
    while h.report().await?.busy > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(rate)
}

/// One read of every session's detail (what the status file, `/v1/status` and the
/// metrics do at each refresh): printed with its wall time and the busiest thread's CPU.
async fn time_fleet_read(daemon: &Daemon) {
    let (t, threads0) = (Instant::now(), thread_cpu());
    let read = daemon.fleet().await.sessions.len();
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let (name, busy) = busiest_thread(&threads0, &thread_cpu()).unwrap_or_default();
    eprintln!("   fleet read: {read} sessions in {wall_ms:.1} ms; busiest thread {name} {:.0} ms CPU", busy.as_secs_f64() * 1e3);
}

/// Waits until the simulator has nothing busy and Shepherd has read and handled every
/// frame it was sent.
async fn settle(h: &Harness, stats: &PumpStats) -> anyhow::Result<()> {
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut last = (u64::MAX, u64::MAX);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rep = h.report().await?;
        let now = (rep.frames_sent, stats.frames.load(Ordering::Relaxed));
        if rep.busy == 0 && now == last {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the fleet did not settle within {} s", PHASE_LIMIT.as_secs());
        }
        last = now;
    }
}

async fn wait_for<F, Fut>(what: &str, mut cond: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond().await {
        if Instant::now() > deadline {
            anyhow::bail!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A number from the environment, or the default.
fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// An `f64` written as `null`: what JSON makes of a NaN (a phase with nothing to
/// measure), read back as NaN rather than failing the whole run's result.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

// ---- process measurements ----

fn proc_status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Bytes the allocator has handed out and not got back, in KiB (jemalloc's
/// `stats.allocated`, the daemon's allocator: `shepherd::memory`): live heap data,
/// without fragmentation or cached free pages.
fn heap_in_use_kib() -> u64 {
    (shepherd::memory::allocated().unwrap_or(0) / 1024) as u64
}

/// VmRSS as the kernel reports it, then after the allocator returned its unused pages
/// (what the daemon does every `supervisor.cleanup_interval`).
fn rss_raw_and_live() -> (u64, u64) {
    let raw = proc_status_kib("VmRSS:");
    shepherd::memory::trim();
    (raw, proc_status_kib("VmRSS:"))
}

/// The 1-, 5- and 15-minute load averages (the machine is shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// CPU time (user + system) of another process, from `/proc/PID/stat`.
fn child_cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return Duration::ZERO };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let total = ticks(11) + ticks(12);
    Duration::from_millis(total * 1000 / hz)
}

/// The machine's CPU time as `/proc/stat` counts it (every CPU, in ticks) at one moment
/// (epoch µs): what its hypervisor took (steal), of all. On a shared host a stolen
/// share of a few percent is enough to stretch a latency's tail many times over, so
/// the phases say how much was taken while they ran.
struct HostTicks {
    at_us: i64,
    steal: u64,
    total: u64,
}

impl HostTicks {
    fn now() -> Self {
        let at_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; the
        // guest times are already counted in user and nice.
        let ticks: Vec<u64> = stat.lines().next().unwrap_or_default().split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
        Self { at_us, steal: ticks.get(7).copied().unwrap_or(0), total: ticks.iter().take(8).sum() }
    }

    /// The stolen share (%) from this reading to `later`; NaN when no tick passed.
    fn steal_pct_until(&self, later: &Self) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return f64::NAN;
        }
        later.steal.saturating_sub(self.steal) as f64 * 100.0 / total as f64
    }

    /// The stolen share (%) over the readings that span the stalls' window: from the
    /// last reading before the first deadline to the first after the last abort.
    fn steal_pct_over(readings: &[Self], stall_times: &[(String, i64, i64)]) -> f64 {
        let first = stall_times.iter().map(|(_, deadline_us, _)| *deadline_us).min();
        let last = stall_times.iter().map(|(_, _, abort_us)| *abort_us).max();
        let (Some(first), Some(last)) = (first, last) else { return f64::NAN };
        let from = readings.iter().rev().find(|h| h.at_us <= first).or(readings.first());
        let to = readings.iter().find(|h| h.at_us >= last).or(readings.last());
        match (from, to) {
            (Some(from), Some(to)) => from.steal_pct_until(to),
            _ => f64::NAN,
        }
    }
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe {
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
    }
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// What each thread of this process used between two [`thread_cpu`] readings, busiest
/// first.
fn thread_use(before: &ThreadCpu, after: &ThreadCpu) -> Vec<(Duration, String)> {
    let mut used: Vec<(Duration, String)> = after
        .iter()
        .map(|(tid, (name, t1))| (t1.saturating_sub(before.get(tid).map_or(Duration::ZERO, |(_, t0)| *t0)), name.clone()))
        .collect();
    used.sort_by(|a, b| b.cmp(a));
    used
}

/// The thread that used the most CPU between two [`thread_cpu`] readings: its name and
/// how much.
fn busiest_thread(before: &ThreadCpu, after: &ThreadCpu) -> Option<(String, Duration)> {
    thread_use(before, after).into_iter().next().map(|(used, name)| (name, used))
}

/// The threads that used at least 1 % of the busiest one's CPU between two
/// [`thread_cpu`] readings, busiest first, as `name µs-per-event`.
fn threads_per_event(before: &ThreadCpu, after: &ThreadCpu, events: u64) -> String {
    threads_listed(before, after, |d| format!("{:.2}", d.as_secs_f64() * 1e6 / events.max(1) as f64))
}

/// Every thread that worked between two readings (a hundredth of the busiest's time at
/// least), each with `show` of its CPU time.
fn threads_listed(before: &ThreadCpu, after: &ThreadCpu, show: impl Fn(Duration) -> String) -> String {
    let used = thread_use(before, after);
    let floor = used.first().map_or(Duration::ZERO, |(most, _)| *most / 100).max(Duration::from_nanos(1));
    used.iter()
        .filter(|(d, _)| *d >= floor)
        .map(|(d, name)| format!("{name} {}", show(*d)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU time (user + system, 10-ms ticks) of every thread of this process: name and
/// time by thread id.
type ThreadCpu = std::collections::HashMap<String, (String, Duration)>;

fn thread_cpu() -> ThreadCpu {
    let mut out = std::collections::HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return out };
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().to_string();
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        // SAFETY: sysconf only reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        out.insert(tid, (name, Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz)));
    }
    out
}

/// Voluntary + involuntary context switches of every thread of this process.
fn context_switches() -> u64 {
    let mut total = 0;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        for line in status.lines() {
            if line.starts_with("voluntary_ctxt_switches:") || line.starts_with("nonvoluntary_ctxt_switches:") {
                total += line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}
