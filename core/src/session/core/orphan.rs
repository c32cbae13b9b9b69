//! Orphans: a parent whose subagents all went idle while it waits on a `task` is
//! recovered after `orphan_wait`; an idle parent whose background child failed unnoticed
//! is continued once (the bookkeeping is `session::family`).

use super::*;

impl SessionCore {
    /// A parent whose `task` tool runs while every child it started is idle: the
    /// children are done and the parent should have moved on (orphan rule b).
    pub(super) fn waits_on_idle_children(&self) -> bool {
        self.family.as_ref().is_some_and(|f| f.all_idle()) && self.running_tools.values().any(|t| t == "task")
    }

    pub(super) fn family(&mut self) -> &mut Family {
        self.family.get_or_insert_with(Box::default)
    }

    /// An event of a child session (a subagent this session started).
    pub fn on_child_event(&mut self, child: &str, event: &Event, now: Now) -> Vec<Effect> {
        let news = match event {
            Event::SessionStatus { status: Status::Busy | Status::Retry { .. }, .. } => Some(ChildNews::Busy),
            Event::SessionStatus { status: Status::Idle, .. } | Event::SessionIdle { .. } => Some(ChildNews::Idle),
            Event::SessionError { .. } => Some(ChildNews::Failed),
            Event::MessageUpdated(m) if m.error.is_some() => Some(ChildNews::Failed),
            Event::SessionCreated(_) | Event::SessionUpdated(_) | Event::SessionDiff { .. } => None,
            _ => {
                self.family().adopt(child);
                self.activity(now); // the child works, so the parent is not stalled
                return Vec::new();
            }
        };
        let (parent_idle, orphan_at) = (self.busy == RunState::Idle, now.mono + self.cfg.orphan_wait);
        let family = self.family();
        match news {
            Some(news) if family.on_news(child, news, parent_idle, orphan_at) => self.activity(now),
            Some(_) => {}
            None => family.adopt(child),
        }
        Vec::new()
    }

    pub(super) fn on_orphan_deadline(&mut self, now: Now) -> Vec<Effect> {
        let due = self.family.as_mut().map(|f| f.take_due(now.mono)).unwrap_or_default();
        let mut out = Vec::new();
        let mut continues = false;
        for child in due {
            if self.busy != RunState::Idle {
                continue; // the parent moved on by itself
            }
            if let Some(p) = self.pause {
                let reason = format!("background subagent {child} failed, but automation is paused ({})", p.as_str());
                out.push(self.record(Action::Recover, Outcome::Declined, &reason, Numbers::default(), now));
                continue;
            }
            let reason = format!(
                "background subagent {child} ended with an error and no notice reached this parent within orphan_wait: continuing the parent"
            );
            out.push(self.record(Action::Recover, Outcome::Done, &reason, Numbers::default(), now));
            continues = true;
        }
        if continues {
            // One continue however many children it lost at once: one decision, one prompt.
            out.push(Effect::Prompt(self.continue_when_idle("orphan", now)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::session::core::testkit::*;

    #[test]
    fn an_idle_parent_whose_background_child_failed_unnoticed_is_continued_once() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started a background task.", "stop");
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_millis(17_000)));
        assert!(prompts(&b.tick_ms(16_999)).is_empty());
        let effects = b.tick_ms(17_000);
        assert_eq!(prompts(&effects), vec![PromptKind::Continue]);
        assert!(actions(&effects).contains(&Action::Recover));
        child_event(&mut b, 18_000, "ses_C", CHILD_IDLE);
        assert!(prompts(&b.tick_ms(40_000)).is_empty(), "once per child");
    }

    #[test]
    fn a_parent_that_lost_two_background_children_at_once_is_continued_once() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started two background tasks.", "stop");
        for child in ["ses_C", "ses_D"] {
            child_event(&mut b, 100, child, CHILD_BUSY);
            child_event(&mut b, 2000, child, CHILD_ABORTED);
            child_event(&mut b, 2000, child, CHILD_IDLE);
        }
        let effects = b.tick_ms(17_000);
        assert_eq!(prompts(&effects), vec![PromptKind::Continue], "{effects:?}");
        assert_eq!(actions(&effects), vec![Action::Recover, Action::Recover], "each child is journalled");
    }

    #[test]
    fn a_task_notice_reaching_the_parent_means_it_is_not_orphaned() {
        let mut b = bench_with_rules(rules());
        b.turn_ms(0, "msg_1", "Started.", "stop");
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        b.feed_ms(2100, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_N","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed_ms(2100, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pn","messageID":"msg_N","sessionID":"ses_A","type":"text","synthetic":true,"text":"<task id=\"ses_C\" state=\"error\">"}}}"#);
        assert!(prompts(&b.tick_ms(30_000)).is_empty());
    }

    #[test]
    fn a_foreground_child_aborted_while_the_parent_is_busy_is_not_an_orphan() {
        let mut b = bench_with_rules(rules());
        b.feed_ms(0, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        child_event(&mut b, 2000, "ses_C", CHILD_ABORTED);
        child_event(&mut b, 2000, "ses_C", CHILD_IDLE);
        b.turn_ms(2500, "msg_1", "Carried on.", "stop");
        assert!(prompts(&b.tick_ms(30_000)).is_empty());
    }

    #[test]
    fn a_busy_parent_whose_children_are_all_idle_is_recovered_after_orphan_wait() {
        let mut b = bench_with_rules(rules());
        b.feed_ms(0, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        b.feed_ms(0, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pt","messageID":"msg_1","sessionID":"ses_A","type":"tool","tool":"task","state":{"status":"running","metadata":{"sessionId":"ses_C"}}}}}"#);
        child_event(&mut b, 100, "ses_C", CHILD_BUSY);
        // While the child works, its events keep the parent alive past any timeout.
        for s in 1..=20u64 {
            child_event(
                &mut b,
                s * 60_000,
                "ses_C",
                r#"{"type":"message.part.delta","properties":{"sessionID":"ses_C","messageID":"msg_m","partID":"prt_p","field":"text","delta":"x"}}"#,
            );
        }
        assert!(!recovers(&b.tick_ms(20 * 60_000 + 1000)), "a working child is not a stalled parent");
        child_event(&mut b, 20 * 60_000 + 2000, "ses_C", CHILD_IDLE);
        let due = b.core.deadline().unwrap();
        assert_eq!(due, b.t0 + Duration::from_millis(20 * 60_000 + 2000 + 15_000), "orphan_wait, not the tool grace");
        assert!(recovers(&b.tick_ms(20 * 60_000 + 17_000)));
    }
}
