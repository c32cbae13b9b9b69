//! The soak: a real Shepherd supervising 1,000 simulated sessions for 20 minutes while
//! faults are injected, and the simulator's books on what it sent. Run with
//! `cargo bench --bench soak`; numbers are printed (a markdown table on stdout,
//! progress on stderr), never asserted, but the process exits non-zero if an action
//! was lost or duplicated, so that a person notices.
//!
//! Three kinds of process:
//! - this one (the *orchestrator*) drives the faults, kills and restarts Shepherd, samples
//!   its memory and prints the table;
//! - the simulated OpenCode server (`--soak-sim N`, `sim/mod.rs`) runs the workload and
//!   keeps the books: every *episode* (a session gone silent while busy, or a turn a
//!   server restart cut off) and every continue Shepherd sent for it;
//! - Shepherd (`--soak-shepherd URL LEDGER LOG`): `Daemon::start` on a SQLite ledger
//!   file that survives its restarts, killed with SIGKILL every `SOAK_KILL_SECS` during
//!   the first half of the run (the second half is one incarnation, for the memory series)
//!   and started again after `SOAK_KILL_PAUSE_MS`.
//!
//! Faults: every event stream cut every `SOAK_DROP_SECS`; a server restart every
//! `SOAK_RESTART_SECS` (down `SOAK_RESTART_DOWN_MS`, 503 meanwhile, every busy turn cut
//! off, as OpenCode does); `SOAK_ERROR_PERMILLE` of REST calls answered 5xx before
//! anything is done; `SOAK_SLOW_PERMILLE` answered 600 ms late and
//! `SOAK_VERY_SLOW_PERMILLE` answered later than Shepherd's `request_timeout` (2 s), both
//! after the work is done.
//!
//! Workload: a free session starts a turn after a pause uniform in 0..2×`SOAK_GAP_MS`; a
//! turn is a realistic one (text, a `todowrite` tool, a second step) paced at 150 ms a
//! step, and `SOAK_STALL_PERMILLE` of turns stall instead (busy, a few events, silence).
//! Clocks are fast: the stall timeout is 3 s, and every default measured against it is
//! scaled by the same 1/60 (see [`shepherd_config`]). Nudges and reviews are off: this
//! counts the stall path (abort + one continue) and the interrupted-turn path.
//!
//! The books, at the end (after the workload stops and faults end, `SOAK_GRACE_SECS` to
//! finish): **lost** = a stall with no continue; **duplicated** = an episode with more
//! than one continue (continues received after it began, until the session's next
//! episode), or one decision id delivered twice; **false aborts** = aborts of a busy
//! session that had not stalled. Turns cut off by a server restart are counted apart
//! (`lost_interrupted`), with whether Shepherd was down when it happened.
//!
//! Other knobs: `SOAK_MINUTES` (default 20), `SOAK_SESSIONS` (default 1000).

mod sim;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shepherd::daemon::Daemon;
use shepherd_actors::config::{Config, ServerConfig};
use sim::{Faults, SimConfig, SoakReport, SoakSpec};

/// Project directories the sessions are spread over.
const DIRECTORIES: usize = 10;
/// Shepherd's stall timeout: 180 s in production, so every related default is /60.
const STALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Shepherd's `request_timeout` for the simulated server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A slow answer below the timeout, and one beyond it.
const SLOW: Duration = Duration::from_millis(600);
const VERY_SLOW: Duration = Duration::from_millis(2_500);
/// Shepherd connects and reads 1,000 sessions before the workload starts.
const WARM_UP: Duration = Duration::from_secs(10);
/// RSS samples are this far apart.
const RSS_EVERY: Duration = Duration::from_secs(60);
/// A restarted Shepherd tracks the sessions as they next show up (one turn each, a
/// few minutes at the soak's pace): its memory is judged from then on.
const RSS_WARM_UP: Duration = Duration::from_secs(170);
/// A server restart is put off while Shepherd started less than this long ago (and a
/// kill while the server restarted less than this long ago): the two at once leave turns
/// no one could know were cut off, which is not what is measured here.
const APART: Duration = Duration::from_secs(20);

struct Knobs {
    minutes: f64,
    sessions: usize,
    drop_every: Duration,
    restart_every: Duration,
    restart_down: Duration,
    kill_every: Duration,
    kill_pause: Duration,
    error_permille: u32,
    slow_permille: u32,
    very_slow_permille: u32,
    stall_permille: u32,
    gap_ms: u64,
    grace: Duration,
}

impl Knobs {
    fn from_env() -> Self {
        let n = |k: &str, d: u64| std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
        Knobs {
            minutes: std::env::var("SOAK_MINUTES").ok().and_then(|s| s.parse().ok()).unwrap_or(20.0),
            sessions: n("SOAK_SESSIONS", 1000) as usize,
            drop_every: Duration::from_secs(n("SOAK_DROP_SECS", 90)),
            restart_every: Duration::from_secs(n("SOAK_RESTART_SECS", 240)),
            restart_down: Duration::from_millis(n("SOAK_RESTART_DOWN_MS", 3_000)),
            kill_every: Duration::from_secs(n("SOAK_KILL_SECS", 150)),
            kill_pause: Duration::from_millis(n("SOAK_KILL_PAUSE_MS", 1_000)),
            error_permille: n("SOAK_ERROR_PERMILLE", 20) as u32,
            slow_permille: n("SOAK_SLOW_PERMILLE", 30) as u32,
            very_slow_permille: n("SOAK_VERY_SLOW_PERMILLE", 5) as u32,
            stall_permille: n("SOAK_STALL_PERMILLE", 80) as u32,
            gap_ms: n("SOAK_GAP_MS", 20_000),
            grace: Duration::from_secs(n("SOAK_GRACE_SECS", 45)),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--soak-sim") {
        let n = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(1000);
        exit_with_parent();
        if let Err(e) = sim::serve(SimConfig { sessions: n, directories: DIRECTORIES }) {
            eprintln!("simulator: {e}");
            std::process::exit(1);
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--soak-shepherd") {
        let arg = |k: usize| args.get(i + k).cloned().unwrap_or_default();
        exit_with_parent();
        if let Err(e) = run_shepherd(&arg(1), &arg(2), &arg(3)) {
            eprintln!("shepherd: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let knobs = Knobs::from_env();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    match rt.block_on(orchestrate(&knobs)) {
        Ok(clean) => std::process::exit(if clean { 0 } else { 2 }),
        Err(e) => {
            eprintln!("soak: {e:#}");
            std::process::exit(1);
        }
    }
}

/// A child exits when the orchestrator goes away (its stdin pipe closes).
fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
}

// ---- Shepherd (a child process) ----

/// The daemon's configuration: production defaults, every clock measured against the
/// stall timeout scaled with it (180 s → 3 s, so 1/60), the way `tests/support`'s
/// `fast_recovery`/`fast_advice` and the fleet bench do.
fn shepherd_config(url: &str, ledger: &str, status: &str) -> anyhow::Result<Config> {
    let mut server = ServerConfig::new("sim", url);
    server.request_timeout = REQUEST_TIMEOUT; // 10 s
    server.reconnect_max = Duration::from_secs(2); // 30 s
    let mut cfg = Config { servers: vec![server], ..Config::default() };
    cfg.control.enabled = false;
    cfg.nudge.enabled = false;
    cfg.review.enabled = false;
    let r = &mut cfg.recovery;
    r.stall_timeout = STALL_TIMEOUT; // 180 s
    r.planning_timeout = Duration::from_secs(5); // 5 min
    r.wait_after_abort = Duration::from_millis(300); // 1.5 s
    r.abort_poll_interval = Duration::from_millis(100); // 200 ms

    // 5 s. Below the stall timeout, as in production (5 s against 180 s): a request that
    // may have arrived is verified (after this long) before the next stall could be
    // detected. At 3 s = the stall timeout the two coincide, and a recovery verified late
    // can send its continue beside the next recovery's (seen in a smoke run, reported).
    r.abort_poll_max = Duration::from_secs(1);
    r.cooldown = Duration::from_secs(1); // 60 s
    r.max_backoff = Duration::from_secs(30); // 30 min
    r.max_session_age = Duration::from_secs(120); // 2 h
    cfg.advisor.new_session = Duration::from_millis(500); // 30 s
    cfg.advisor.postpone = Duration::from_secs(1); // 60 s
    cfg.guard.window = Duration::from_millis(500); // 30 s
    cfg.guard.max_wait = Duration::from_secs(2); // 120 s
    cfg.guard.lease_ttl = Duration::from_secs(3); // 30 s (3 s is the floor)
                                                  // Per-minute limits are not clocks; the fleet-wide one (120/min) would hold the
                                                  // soak's continues (about 100 a minute, in bursts after a restart) for a while. That
                                                  // is its job, not what is counted here (as in the fleet bench).
    cfg.guard.global_per_minute = 100_000;
    cfg.guard.global_burst = 10_000;
    cfg.supervisor.discovery_interval = Duration::from_secs(10); // 60 s
    cfg.supervisor.orphan_wait = Duration::from_secs(1); // 15 s
    cfg.supervisor.idle_cleanup = Duration::from_secs(60); // 10 min (not /60: evicting every 10 s is churn, not a soak)
    cfg.store.path = ledger.to_string();
    cfg.status.path = status.to_string();
    cfg.validate().map_err(|e| anyhow::anyhow!("soak config: {e}"))?;
    Ok(cfg)
}

fn run_shepherd(url: &str, ledger: &str, log: &str) -> anyhow::Result<()> {
    let log_file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::sync::Mutex::new(log_file))
        .init();
    let status = std::env::temp_dir().join("shepherd-soak.status.json").display().to_string();
    let cfg = shepherd_config(url, ledger, &status)?;
    actix::System::new().block_on(async move {
        let _daemon = Daemon::start(&cfg)?;
        // Until killed.
        futures::future::pending::<()>().await;
        Ok(())
    })
}

// ---- the orchestrator ----

struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(args: &[&str]) -> anyhow::Result<Proc> {
    let child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(Proc { child })
}

fn start_sim(n: usize) -> anyhow::Result<(Proc, String)> {
    let mut p = spawn(&["--soak-sim", &n.to_string()])?;
    let stdout = p.child.stdout.take().ok_or_else(|| anyhow::anyhow!("no simulator stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("SIM_LISTENING ")
        .ok_or_else(|| anyhow::anyhow!("simulator did not start: {line:?}"))?
        .to_string();
    Ok((p, format!("http://{addr}")))
}

struct Sim {
    http: reqwest::Client,
    url: String,
}

impl Sim {
    async fn post<T: serde::Serialize>(&self, path: &str, body: &T) -> anyhow::Result<()> {
        let resp = self.http.post(format!("{}{path}", self.url)).json(body).send().await?;
        anyhow::ensure!(resp.status().is_success(), "POST {path}: {}", resp.status());
        Ok(())
    }

    async fn books(&self, grace: Duration) -> anyhow::Result<SoakReport> {
        let url = format!("{}/_sim/soak?grace_ms={}", self.url, grace.as_millis());
        Ok(self.http.get(url).send().await?.json().await?)
    }
}

struct RssSample {
    at: Duration,
    incarnation: u32,
    kib: u64,
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs the soak; `Ok(true)` when nothing was lost or duplicated.
async fn orchestrate(k: &Knobs) -> anyhow::Result<bool> {
    let tmp = std::env::temp_dir();
    let ledger = tmp.join("shepherd-soak.sqlite3");
    let log = tmp.join("shepherd-soak.log");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", ledger.display()));
    }
    let _ = std::fs::remove_file(&log);
    let (ledger, log) = (ledger.display().to_string(), log.display().to_string());
    let load_before = load_average();

    let (_sim_proc, url) = start_sim(k.sessions)?;
    let sim = Sim { http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?, url: url.clone() };
    let start_shepherd = || spawn(&["--soak-shepherd", &url, &ledger, &log]);
    eprintln!("== soak: {} sessions, {} min, simulator at {url}", k.sessions, k.minutes);
    let mut shepherd = start_shepherd()?;
    let mut incarnation = 1u32;
    tokio::time::sleep(WARM_UP).await;

    let faults = Faults {
        error_permille: k.error_permille,
        slow_permille: k.slow_permille,
        slow_ms: SLOW.as_millis() as u64,
        very_slow_permille: k.very_slow_permille,
        very_slow_ms: VERY_SLOW.as_millis() as u64,
    };
    let spec = SoakSpec { running: true, gap_ms: k.gap_ms, stall_permille: k.stall_permille, step_ms: 150, deltas: 6 };
    sim.post("/_sim/faults", &faults).await?;
    sim.post("/_sim/soak", &spec).await?;

    let run_for = Duration::from_secs_f64(k.minutes * 60.0);
    let kill_until = run_for / 2;
    let t0 = Instant::now();
    let mut next_drop = k.drop_every;
    let mut next_restart = k.restart_every / 2 + Duration::from_secs(10);
    let mut next_kill = k.kill_every;
    let mut next_rss = Duration::ZERO;
    let (mut last_start, mut last_restart) = (Duration::ZERO, Duration::ZERO);
    let (mut kills, mut restarts, mut drops) = (0u32, 0u32, 0u32);
    let mut rss = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = t0.elapsed();
        if t >= run_for {
            break;
        }
        if t >= next_drop {
            sim.post("/_sim/drop", &()).await?;
            drops += 1;
            next_drop += k.drop_every;
        }
        if t >= next_restart {
            if t.saturating_sub(last_start) < APART {
                next_restart = last_start + APART;
            } else {
                sim.post("/_sim/restart", &serde_json::json!({"down_ms": k.restart_down.as_millis() as u64})).await?;
                restarts += 1;
                last_restart = t;
                eprintln!("   {:>5.0} s: server restart #{restarts}", t.as_secs_f64());
                next_restart += k.restart_every;
            }
        }
        if t >= next_kill && t < kill_until {
            if t.saturating_sub(last_restart) < APART {
                next_kill = last_restart + APART;
            } else {
                let pid = shepherd.child.id();
                let before = vm_rss_kib(pid);
                // `Child::kill` is SIGKILL: no shutdown, no flush, the ledger as it stands.
                drop(shepherd);
                sim.post("/_sim/shepherd", &serde_json::json!({"down": true})).await?;
                kills += 1;
                tokio::time::sleep(k.kill_pause).await;
                shepherd = start_shepherd()?;
                sim.post("/_sim/shepherd", &serde_json::json!({"down": false})).await?;
                incarnation += 1;
                last_start = t0.elapsed();
                eprintln!(
                    "   {:>5.0} s: Shepherd killed (SIGKILL, RSS {before} KiB) and started again (#{incarnation})",
                    t.as_secs_f64()
                );
                next_kill += k.kill_every;
            }
        }
        if t >= next_rss {
            let kib = vm_rss_kib(shepherd.child.id());
            rss.push(RssSample { at: t, incarnation, kib });
            let b = sim.books(Duration::from_secs(60)).await?;
            eprintln!(
                "   {:>5.0} s: RSS {kib} KiB (Shepherd #{incarnation}); {} turns, {} stalls + {} cut off, {} continued; \
                 older than 60 s and not continued: {} + {}; duplicated {}",
                t.as_secs_f64(),
                b.turns,
                b.stall_episodes,
                b.interrupted_episodes,
                b.continued,
                b.lost,
                b.lost_interrupted,
                b.duplicated
            );
            next_rss += RSS_EVERY;
        }
    }
    let ran = t0.elapsed();
    // The workload stops and the faults end; what is open gets the grace period.
    sim.post("/_sim/soak", &SoakSpec { running: false, ..spec }).await?;
    sim.post("/_sim/faults", &Faults::default()).await?;
    eprintln!("   workload stopped after {:.0} s; {} s of grace", ran.as_secs_f64(), k.grace.as_secs());
    tokio::time::sleep(k.grace).await;
    rss.push(RssSample { at: t0.elapsed(), incarnation, kib: vm_rss_kib(shepherd.child.id()) });
    // Nothing began in the grace period, so none is excused by it; an episode still open
    // began before the workload stopped and had the whole grace to be continued.
    let books = sim.books(Duration::ZERO).await?;
    drop(shepherd);

    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let warnings = logged.lines().filter(|l| l.contains(r#""level":"WARN""#)).count();
    let errors = logged.lines().filter(|l| l.contains(r#""level":"ERROR""#)).count();
    print_results(k, ran, &books, &rss, kills, restarts, drops, &load_before, warnings, errors, &log);
    Ok(books.lost == 0 && books.duplicated == 0 && books.duplicate_decisions == 0)
}

#[allow(clippy::too_many_arguments)] // one printer for one run's numbers
fn print_results(
    k: &Knobs,
    ran: Duration,
    b: &SoakReport,
    rss: &[RssSample],
    kills: u32,
    restarts: u32,
    drops: u32,
    load_before: &str,
    warnings: usize,
    errors: usize,
    log: &str,
) {
    // Memory: the last incarnation, after its warm-up (`RSS_WARM_UP`).
    let last = rss.last().map_or(0, |s| s.incarnation);
    let steady: Vec<&RssSample> =
        rss.iter().filter(|s| s.incarnation == last).skip_while(|s| s.at < rss_start(rss, last)).collect();
    let (first, end) = (steady.first().map_or(0, |s| s.kib), steady.last().map_or(0, |s| s.kib));
    let max = steady.iter().map(|s| s.kib).max().unwrap_or(0);
    let span = match (steady.first(), steady.last()) {
        (Some(a), Some(z)) => format!("{:.0}–{:.0} min", a.at.as_secs_f64() / 60.0, z.at.as_secs_f64() / 60.0),
        _ => "–".into(),
    };
    let f = &b.faults;
    println!();
    println!(
        "| duration | sessions | turns | stall episodes | turns cut off mid-reply by a restart | continues | lost | duplicated | false aborts | Shepherd RSS start / end / max ({span}) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {:.1} min | {} | {} | {} | {} ({} not continued) | {} | {} | {} ({} decision ids twice) | {} | {} / {} / {} KiB |",
        ran.as_secs_f64() / 60.0,
        fmt_n(k.sessions as u64),
        fmt_n(b.turns),
        fmt_n(b.stall_episodes),
        fmt_n(b.interrupted_episodes),
        b.lost_interrupted,
        fmt_n(b.continues),
        b.lost,
        b.duplicated,
        b.duplicate_decisions,
        b.false_aborts,
        fmt_n(first),
        fmt_n(end),
        fmt_n(max),
    );
    println!();
    println!("| fault | injected |");
    println!("|---|---:|");
    println!("| event streams cut (every {} s) | {drops} ({} streams) |", k.drop_every.as_secs(), f.streams_cut);
    println!(
        "| server restarts (down {:.1} s: 503, statuses forgotten, busy turns cut off) | {restarts} ({} refused requests; {} turns cut: {} mid-reply, {} between steps ({} continued), {} after their reply finished) |",
        k.restart_down.as_secs_f64(),
        fmt_n(f.refused_down),
        fmt_n(f.turns_cut),
        fmt_n(b.interrupted_episodes),
        fmt_n(b.between_steps_episodes),
        b.between_steps_continued,
        fmt_n(f.cut_after_finish)
    );
    println!("| Shepherd killed (SIGKILL) and restarted on its ledger | {kills} |");
    println!("| REST answers 5xx ({}‰) | {} |", k.error_permille, fmt_n(f.errors));
    println!("| REST answers {} ms late ({}‰) | {} |", SLOW.as_millis(), k.slow_permille, fmt_n(f.slow));
    println!(
        "| REST answers {} ms late, beyond `request_timeout` {} s ({}‰) | {} |",
        VERY_SLOW.as_millis(),
        REQUEST_TIMEOUT.as_secs(),
        k.very_slow_permille,
        fmt_n(f.very_slow)
    );
    println!();
    println!("Details:");
    println!(
        "- load average before: {load_before}, after: {}; stall timeout {} s; {} episodes continued, {} aborts ({} of idle sessions without an episode); \
         prompts by kind: {:?}; untagged prompts: {}; frames sent {}, lost while no stream was connected {}; Shepherd logged {warnings} warnings, {errors} errors ({log})",
        load_average(),
        STALL_TIMEOUT.as_secs(),
        fmt_n(b.continued),
        fmt_n(b.aborts),
        b.idle_aborts,
        b.prompts_by_kind,
        b.untagged_prompts,
        fmt_n(b.frames_sent),
        fmt_n(b.frames_dropped),
    );
    let series: Vec<String> =
        rss.iter().map(|s| format!("{:.1} min #{}: {} KiB", s.at.as_secs_f64() / 60.0, s.incarnation, s.kib)).collect();
    println!("- Shepherd RSS (minute, incarnation): {}", series.join(", "));
    for e in &b.lost_detail {
        println!("- not continued: {e:?}");
    }
    for e in &b.duplicated_detail {
        println!("- duplicated: {e:?}");
    }
    for d in &b.duplicate_decision_ids {
        println!("- decision delivered twice: {d}");
    }
    for a in &b.false_abort_detail {
        println!("- false abort: {a}");
    }
}

/// Where the last incarnation's steady state starts: `RSS_WARM_UP` after its first sample.
fn rss_start(rss: &[RssSample], incarnation: u32) -> Duration {
    rss.iter().find(|s| s.incarnation == incarnation).map_or(Duration::ZERO, |s| s.at + RSS_WARM_UP)
}

fn fmt_n(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits.as_bytes().rchunks(3).rev().map(|g| std::str::from_utf8(g).unwrap_or("?")).collect();
    groups.join(",")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
