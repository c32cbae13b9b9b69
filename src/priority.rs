//! Background threads give way to the ones that act: a thread whose work can wait (the
//! status file's writer, the ledger's checkpointer) lowers its own priority, so on a
//! machine with no core to spare it takes the time the pumps, the sessions and the
//! ledger's writer leave, rather than delaying a stall's abort.

/// Gives the calling thread (only it: Linux's nice value is per thread) the nice value
/// `nice`, unless it already runs at a lower priority (a daemon started with `nice 19`
/// stays there). Raising one's own nice value needs no privilege; where it fails the
/// thread keeps its priority, which is only slower for the sessions: logged and left.
pub fn lower_this_thread(nice: libc::c_int) {
    // SAFETY: `gettid`, `getpriority` and `setpriority` take and return plain integers.
    let tid = unsafe { libc::gettid() } as libc::id_t;
    if unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) } >= nice {
        return;
    }
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    if rc != 0 {
        let name = std::thread::current().name().unwrap_or("unnamed").to_string();
        tracing::debug!(error = %std::io::Error::last_os_error(), nice, thread = name, "could not lower a background thread's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's nice value is its own: the daemon's other threads (the pumps, the
    /// sessions) keep theirs.
    #[test]
    fn lowering_a_threads_priority_leaves_the_other_threads_alone() {
        const NICE: libc::c_int = 10;
        // SAFETY: plain integers in and out.
        let nice_of = |tid: libc::pid_t| unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
        let here = unsafe { libc::gettid() };
        let before = nice_of(here);
        let (tid, nice) = std::thread::spawn(move || {
            lower_this_thread(NICE);
            let tid = unsafe { libc::gettid() };
            (tid, nice_of(tid))
        })
        .join()
        .unwrap();
        assert_ne!(tid, here);
        assert_eq!(nice, NICE.max(before), "the thread runs at the nice value it asked for");
        assert_eq!(nice_of(here), before, "the calling thread keeps its own");
    }
}
