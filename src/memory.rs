//! Giving freed heap back to the operating system.
//!
//! glibc's allocator keeps the pages of freed memory for reuse. After a burst of events
//! (hundreds of thousands of short-lived buffers between the long-lived state of every
//! session) most of those pages are free but pinned by a few live objects, and the
//! daemon's resident memory stays at the burst's peak for as long as it runs: on the
//! fleet bench, about 3 KiB per session more than the live data. `malloc_trim` returns
//! every whole free page. It is cheap (a walk over the free lists, no object moves), so
//! the daemon does it every `supervisor.cleanup_interval` — the same rhythm in which
//! idle sessions leave memory — when there is enough free memory to be worth a system
//! call, and the status writer after each refresh (its copy of the fleet is the largest
//! short-lived allocation).
//!
//! glibc also gives every thread that allocates its own arena (up to eight per core),
//! each with its own free pages and fragments. Shepherd's actors run on one thread and
//! its other threads (event streams, ledger, status) allocate little, so two arenas
//! serve them all: on the 1k fleet bench about 2 KiB per session less resident memory
//! after the burst, with no change in events per second. (One arena saved a little
//! more, but in the one 10k run measured with it the abort latency's p99 was 14 ms,
//! against 5–6 ms with two.)
//!
//! Other allocators and platforms: nothing to do.

use std::time::Duration;

/// Below this much free heap, trimming is not worth its system calls.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const WORTH_TRIMMING_BYTES: usize = 1 << 20;

/// How many arenas the allocator may have (see the module's comment).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: i32 = 2;

/// Makes every thread started from now on share [`ARENAS`] allocator arenas. Call it
/// before the daemon starts its threads.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is thread-safe.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Trims the heap every `interval` until the task is aborted.
pub fn spawn_trimmer(interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate: nothing to give back yet
        loop {
            tick.tick().await;
            if let Some(freed) = trim() {
                tracing::debug!(free_kib = freed / 1024, "memory: freed heap returned to the operating system");
            }
        }
    })
}

/// Returns the allocator's free pages when it holds at least `WORTH_TRIMMING_BYTES`
/// free; the free bytes it held, when it trimmed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn trim() -> Option<usize> {
    // SAFETY: mallinfo2 only reads the allocator's counters; malloc_trim only releases
    // whole free pages back to the kernel, never memory in use.
    unsafe {
        let free = libc::mallinfo2().fordblks;
        if free < WORTH_TRIMMING_BYTES {
            return None;
        }
        libc::malloc_trim(0);
        Some(free)
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> Option<usize> {
    None
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
            .unwrap_or(0)
    }

    #[test]
    fn pages_freed_between_live_objects_go_back_to_the_system() {
        // 64 MiB in small blocks; every 64th stays alive, so no free range reaches the
        // top of the heap and glibc keeps every page.
        let mut blocks: Vec<Vec<u8>> = (0..64 * 1024).map(|i| vec![i as u8; 1000]).collect();
        let mut kept = Vec::new();
        for (i, b) in blocks.drain(..).enumerate() {
            if i % 64 == 0 {
                kept.push(b);
            }
        }
        let before = rss_kib();
        let freed = trim().expect("tens of MiB are free");
        let after = rss_kib();
        assert!(freed > 32 << 20, "free heap {freed} B");
        assert!(before - after > 16 * 1024, "RSS {before} KiB -> {after} KiB");
        assert!(kept.iter().all(|b| b.len() == 1000));
    }
}
