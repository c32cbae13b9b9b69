//! A parent session's subagents: which children it started, which are busy or failed,
//! and when an orphaned parent is due to be continued. Pure; part of the session core.
//!
//! Most sessions never start a subagent, so the core keeps this behind an
//! `Option<Box<Family>>` (one pointer per session instead of five hash sets inline):
//! memory per session is a scale target.
//!
//! The orphan rules (the supervisor issue):
//! - (a) background subagents: the parent is idle, a child ended with an error or
//!   abort, and no `<task id="CHILD" …>` notice reached the parent within `orphan_wait`
//!   → continue the parent (see `SessionCore::on_orphan_deadline`);
//! - (b) the parent is busy on a `task` tool while every child it started is idle
//!   ([`Family::all_idle`]) → the stall rule recovers it after `orphan_wait`.

use std::collections::{HashMap, HashSet};

use tokio::time::Instant;

/// What a child's event means for its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildNews {
    /// The child started working.
    Busy,
    /// The child went idle (finished, aborted or failed).
    Idle,
    /// The child reported an error (it may still go idle afterwards).
    Failed,
}

/// The subagents of one parent session.
#[derive(Debug, Default)]
pub struct Family {
    children: HashSet<String>,
    running: HashSet<String>,
    failed: HashSet<String>,
    /// Background children that failed while the parent was idle: when to continue it.
    orphan_due: HashMap<String, Instant>,
    orphans_handled: HashSet<String>,
}

impl Family {
    /// A child this session started (from its events or a `task` part's child id).
    pub fn adopt(&mut self, child: &str) {
        if !self.children.contains(child) {
            self.children.insert(child.to_string());
        }
    }

    /// A child's news. Returns whether it counts as the parent's activity: a child
    /// that starts, or the last moment a child stopped (the orphan wait counts from
    /// there). `orphan_at` is when an idle parent is due if this makes it an orphan.
    pub fn on_news(&mut self, child: &str, news: ChildNews, parent_idle: bool, orphan_at: Instant) -> bool {
        self.adopt(child);
        match news {
            ChildNews::Busy => {
                self.running.insert(child.to_string());
                true
            }
            ChildNews::Idle => {
                let stopped = self.running.remove(child);
                // Background orphan (rule a): the parent is idle and will not be told.
                // A busy parent is a foreground one: its task part errors and it goes on.
                if self.failed.contains(child) && parent_idle && !self.orphans_handled.contains(child) {
                    self.orphan_due.insert(child.to_string(), orphan_at);
                }
                stopped
            }
            ChildNews::Failed => {
                self.failed.insert(child.to_string());
                false
            }
        }
    }

    /// A user-role text reached the parent: OpenCode's `<task id="…">` notice that a
    /// background child ended means that child did not orphan it.
    pub fn on_parent_notice(&mut self, text: &str) {
        if !self.orphan_due.is_empty() {
            self.orphan_due.retain(|child, _| !text.contains(&format!("<task id=\"{child}\"")));
        }
    }

    /// Every child this parent started is idle (rule b's condition on the children).
    pub fn all_idle(&self) -> bool {
        !self.children.is_empty() && self.running.is_empty()
    }

    /// When the next orphan is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.orphan_due.values().min().copied()
    }

    /// The children whose orphan wait ran out by `now`, each handled once from here on.
    pub fn take_due(&mut self, now: Instant) -> Vec<String> {
        let mut due: Vec<String> =
            self.orphan_due.iter().filter(|(_, at)| **at <= now).map(|(c, _)| c.clone()).collect();
        due.sort(); // a stable order for the journal
        for child in &due {
            self.orphan_due.remove(child);
            self.orphans_handled.insert(child.clone());
        }
        due
    }

    /// The children, e.g. for a hand-off's continuation.
    pub fn children(&self) -> impl Iterator<Item = &String> {
        self.children.iter()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_failed_background_child_orphans_an_idle_parent_once_unless_notice_arrives() {
        let t = Instant::now();
        let due = t + Duration::from_secs(15);
        let mut f = Family::default();
        assert!(f.on_news("c1", ChildNews::Busy, true, due), "a child starting is the parent's activity");
        f.on_news("c1", ChildNews::Failed, true, due);
        assert!(f.on_news("c1", ChildNews::Idle, true, due), "the last child stopping restarts the wait");
        assert_eq!(f.deadline(), Some(due));
        assert!(f.take_due(due - Duration::from_secs(1)).is_empty());
        assert_eq!(f.take_due(due), vec!["c1".to_string()]);
        f.on_news("c1", ChildNews::Idle, true, due);
        assert_eq!(f.deadline(), None, "handled once");

        let mut f = Family::default();
        f.on_news("c2", ChildNews::Failed, true, due);
        f.on_news("c2", ChildNews::Idle, true, due);
        f.on_parent_notice("<task id=\"c2\" state=\"error\">…</task>");
        assert_eq!(f.deadline(), None, "OpenCode told the parent: not an orphan");
    }

    #[test]
    fn a_busy_parent_is_a_foreground_one_and_never_orphaned_by_a_failed_child() {
        let t = Instant::now();
        let mut f = Family::default();
        f.on_news("c1", ChildNews::Failed, false, t);
        f.on_news("c1", ChildNews::Idle, false, t);
        assert_eq!(f.deadline(), None);
    }

    #[test]
    fn all_idle_needs_children_and_none_running() {
        let t = Instant::now();
        let mut f = Family::default();
        assert!(!f.all_idle(), "no children");
        f.on_news("c1", ChildNews::Busy, false, t);
        assert!(!f.all_idle());
        f.on_news("c1", ChildNews::Idle, false, t);
        assert!(f.all_idle());
    }
}
