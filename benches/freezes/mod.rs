//! Moments a CPU of the machine stopped altogether: the host took it (a virtual CPU not
//! run for tens of ms), whatever ran on it then — Shepherd's pump, a sessions' thread,
//! the ledger's writer — stopped with it. The kernel's steal count misses some of these
//! (measured: 100-ms gaps in `perf`'s samples of a CPU running Shepherd with no steal
//! counted), so each CPU gets a thread pinned to it that wakes every [`TICK`]; a wake-up
//! [`GAP`] late means the CPU did not run. A waking thread that slept is run within a
//! few ms even on a busy CPU, so a gap this long is the CPU, not the scheduler. Where the
//! system lets it, the thread runs at real-time priority (`SCHED_FIFO`): it then takes
//! its CPU from any other thread the moment its timer fires, and a wake-up
//! [`GAP_REALTIME`] late is already the CPU (traced on the bench's host: stops of 10–20
//! ms, in which every thread of the process — the freeze watchers, the sessions' threads
//! with timers due — sat still at once, were too short for [`GAP`]). The watchers only
//! take a timestamp and sleep: a few µs per wake-up.
//!
//! The stall phase tells apart the aborts whose deadline-to-abort span a freeze (or the
//! catching up after it) fell across, and those whose last event left while one did (a
//! 100-ms stop then, traced, made a clump of ~40 stalls detected up to 90 ms "late" by
//! the simulator's clock and on time by Shepherd's, which read the event 90 ms later):
//! their latency is the host's, and the p99 of the others is Shepherd's. On the bench's host both CPUs stop together (the whole virtual
//! machine): 25–100 ms about once per stall phase, 8–25 ms a few times more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::sim::epoch_us;

/// How often each CPU's thread wakes.
const TICK: Duration = Duration::from_millis(2);
/// A wake-up this much later than [`TICK`] is a frozen CPU.
const GAP: Duration = Duration::from_millis(25);
/// The same for a watcher at real-time priority, which nothing on its CPU delays.
const GAP_REALTIME: Duration = Duration::from_millis(8);

/// One CPU not run from `from_us` to `to_us` (wall clock, µs since the epoch, as the
/// simulator stamps deadlines and aborts).
#[derive(Debug, Clone, Copy)]
pub struct Freeze {
    pub from_us: i64,
    pub to_us: i64,
}

impl Freeze {
    pub fn ms(&self) -> f64 {
        (self.to_us - self.from_us) as f64 / 1000.0
    }
}

/// The watching threads, one per CPU this process may run on.
pub struct FreezeWatch {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<Freeze>>>,
    /// CPUs whose thread could not be pinned (watched from wherever it runs).
    pub unpinned: usize,
    /// CPUs whose thread runs at real-time priority (its stops seen from [`GAP_REALTIME`]).
    realtime: usize,
}

impl FreezeWatch {
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let cpus = allowed_cpus();
        let pinned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let realtime = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let (stop, pinned, realtime) = (Arc::clone(&stop), Arc::clone(&pinned), Arc::clone(&realtime));
                std::thread::spawn(move || {
                    if pin_to(cpu) {
                        pinned.fetch_add(1, Ordering::Relaxed);
                    }
                    let gap = if to_realtime() {
                        realtime.fetch_add(1, Ordering::Relaxed);
                        GAP_REALTIME
                    } else {
                        GAP
                    };
                    let mut freezes = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let before = epoch_us();
                        std::thread::sleep(TICK);
                        let after = epoch_us();
                        if after - before > (TICK + gap).as_micros() as i64 {
                            freezes.push(Freeze { from_us: before + TICK.as_micros() as i64, to_us: after });
                        }
                    }
                    freezes
                })
            })
            .collect();
        // Pinning happens first thing on each thread; a moment later it is known.
        std::thread::sleep(Duration::from_millis(20));
        let unpinned = cpus.len().saturating_sub(pinned.load(Ordering::Relaxed));
        Self { stop, threads, unpinned, realtime: realtime.load(Ordering::Relaxed) }
    }

    /// The shortest stop every watcher sees (ms): [`GAP_REALTIME`] when all of them run
    /// at real-time priority, else [`GAP`].
    pub fn gap_ms(&self) -> u64 {
        let gap = if self.realtime == self.threads.len() { GAP_REALTIME } else { GAP };
        gap.as_millis() as u64
    }

    /// Every freeze seen, in time order; freezes that overlap — the same stop seen from
    /// each CPU when the whole machine stopped — are one.
    pub fn finish(self) -> Vec<Freeze> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all: Vec<Freeze> = self.threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect();
        all.sort_by_key(|f| f.from_us);
        let mut merged: Vec<Freeze> = Vec::with_capacity(all.len());
        for f in all {
            match merged.last_mut() {
                Some(last) if f.from_us <= last.to_us => last.to_us = last.to_us.max(f.to_us),
                _ => merged.push(f),
            }
        }
        merged
    }
}

/// Whether a freeze, or the catching up after it, fell across the span from `from_us`
/// to `to_us`. What the server sent while the CPU stood still waits in the socket when
/// it runs again, and a deadline is due only once that is read (stream time): the
/// catching up is counted as long as the freeze again, more than it takes (Shepherd
/// reads several times faster than the server writes).
pub fn across(freezes: &[Freeze], from_us: i64, to_us: i64) -> bool {
    freezes.iter().any(|f| f.from_us < to_us && f.to_us + (f.to_us - f.from_us) > from_us)
}

/// The CPUs this process may run on.
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0;
    let n = std::thread::available_parallelism().map_or(1, usize::from);
    if !ok {
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    (0..std::thread::available_parallelism().map_or(1, usize::from)).collect()
}

/// Pins the calling thread to `cpu`; `false` if it could not be.
#[cfg(target_os = "linux")]
fn pin_to(cpu: usize) -> bool {
    // SAFETY: as above; the set names one CPU.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn pin_to(_: usize) -> bool {
    false
}

/// Gives the calling thread real-time priority (`SCHED_FIFO`, the lowest level); `false`
/// where the system does not allow it (no `CAP_SYS_NICE`, no real-time budget).
#[cfg(target_os = "linux")]
fn to_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param; 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn to_realtime() -> bool {
    false
}
