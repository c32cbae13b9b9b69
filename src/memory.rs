//! The allocator, and giving freed memory back to the operating system.
//!
//! Shepherd's memory is mostly many small, long-lived objects — every session's actor,
//! core and published detail — with hundreds of thousands of short-lived buffers between
//! them during a burst of events. glibc's malloc left about a fifth of the resident
//! memory in fragments pinned between live objects even after `malloc_trim`; jemalloc
//! (size classes in slabs per size) keeps them closer together: on the fleet bench at
//! 10,000 sessions, after all phases, 4.1–4.3 KiB of resident memory per session against
//! 4.9–5.2 with glibc (docs/scale-journal.md, twelfth session). Every program linking
//! this library — the daemon, its tests and the fleet bench — allocates with it.
//!
//! jemalloc returns freed pages to the system as they age (`dirty_decay_ms`), but only
//! while the program allocates; a fleet gone quiet would keep the burst's pages. So the
//! daemon purges every `supervisor.cleanup_interval` — the same rhythm in which idle
//! sessions leave memory — when enough is unused to be worth it, and the status writer
//! after each refresh (its copy of the fleet is the largest short-lived allocation).
//!
//! Where jemalloc is not used (MSVC targets), nothing is purged.

use std::time::Duration;

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Below this much resident but unused memory, purging is not worth its system calls.
#[cfg(not(target_env = "msvc"))]
const WORTH_PURGING_BYTES: usize = 1 << 20;

/// Purges every `interval` until the task is aborted.
pub fn spawn_trimmer(interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate: nothing to give back yet
        loop {
            tick.tick().await;
            if let Some(freed) = trim() {
                tracing::debug!(unused_kib = freed / 1024, "memory: unused pages returned to the operating system");
            }
        }
    })
}

/// Bytes the allocator's live objects take (jemalloc's `stats.allocated`); `None`
/// where it cannot say.
pub fn allocated() -> Option<usize> {
    #[cfg(not(target_env = "msvc"))]
    {
        tikv_jemalloc_ctl::epoch::advance().ok()?;
        tikv_jemalloc_ctl::stats::allocated::read().ok()
    }
    #[cfg(target_env = "msvc")]
    None
}

/// Returns the allocator's unused pages to the system when it holds at least
/// `WORTH_PURGING_BYTES` of them; how many bytes it held, when it purged.
pub fn trim() -> Option<usize> {
    #[cfg(not(target_env = "msvc"))]
    {
        use tikv_jemalloc_ctl::{epoch, stats};
        epoch::advance().ok()?;
        // Resident pages not backing a live object: dirty pages waiting to decay, and
        // the allocator's own metadata (a small, steady part).
        let unused = stats::resident::read().ok()?.saturating_sub(stats::allocated::read().ok()?);
        if unused < WORTH_PURGING_BYTES {
            return None;
        }
        // `arena.<MALLCTL_ARENAS_ALL>.purge`: every arena's unused dirty pages.
        const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
        // SAFETY: a mallctl that neither reads nor writes a value (null pointers, zero
        // length, as jemalloc requires for `purge`); it only releases unused pages.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                PURGE_ALL.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(unused)
    }
    #[cfg(target_env = "msvc")]
    None
}

#[cfg(all(test, target_os = "linux", not(target_env = "msvc")))]
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
        // 64 MiB in small blocks; every 64th stays alive, so no whole slab of them is
        // free and nothing is returned until the unused pages are purged.
        let mut blocks: Vec<Vec<u8>> = (0..64 * 1024).map(|i| vec![i as u8; 1000]).collect();
        let mut kept = Vec::new();
        for (i, b) in blocks.drain(..).enumerate() {
            if i % 64 == 0 {
                kept.push(b);
            }
        }
        let before = rss_kib();
        let freed = trim().expect("tens of MiB are unused");
        let after = rss_kib();
        assert!(freed > 32 << 20, "unused {freed} B");
        assert!(before - after > 16 * 1024, "RSS {before} KiB -> {after} KiB");
        assert!(kept.iter().all(|b| b.len() == 1000));
        let live = allocated().expect("jemalloc counts");
        assert!(live >= kept.len() * 1000, "allocated {live} B");
    }
}
