//! Signals for an OpenCode process and everything it started.
//!
//! The server is spawned as the leader of a new process group, but some of its children
//! (the `bash` tool's commands) run in process groups of their own, so stopping it also
//! walks `/proc` for its descendants.

use std::collections::{HashMap, HashSet};
use std::fs;

/// Pids of every live descendant of `root` (not `root` itself), from `/proc/*/stat`.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) = parent_of(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// The parent pid from `/proc/<pid>/stat` (the field after the parenthesised name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Sends `signal` to the process group `pgid`. Errors (group already gone) are ignored.
pub fn signal_group(pgid: u32, signal: libc::c_int) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Sends `signal` to each pid. Errors (process already gone) are ignored.
pub fn signal_each(pids: &[u32], signal: libc::c_int) {
    for &pid in pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) on a pid; no memory involved.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn finds_grandchildren() {
        let mut child = Command::new("sh").args(["-c", "sleep 30 & sleep 30 & wait"]).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let found = descendants(child.id());
        assert_eq!(found.len(), 2, "{found:?}");
        signal_each(&found, libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }
}
