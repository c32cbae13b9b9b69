//! What to do when a session has gone idle: nudge it (todos still open) or ask for a
//! review (the last todo just got done). Pure; part of the session core.
//!
//! Edges, not levels: a nudge is considered once per busy→idle edge, a review once per
//! open→all-done edge of the todo list. Each consideration either sends, or declines
//! with the reason — never talking over the person: not while a question or permission
//! waits, not when the last reply asks the person something, not after a user abort,
//! not right after the person wrote. Loop protection counts progress, not sends: after
//! `max_without_progress` nudges with the same todo snapshot, nudging stops until the
//! todos change or the person writes.

use tokio::time::Instant;

use crate::config::{NudgeConfig, ReviewConfig};
use crate::event::{Todo, TodoStatus};
use crate::session::effect::PromptKind;
use crate::session::pause::Pause;
use crate::session::prompt::TodoCounts;

/// `content:status` of every todo: equal snapshots mean no progress on the list.
pub type Snapshot = Vec<(String, TodoStatus)>;

pub fn snapshot(todos: &[Todo]) -> Snapshot {
    todos.iter().map(|t| (t.content.clone(), t.status)).collect()
}

/// The agent's latest reply, as far as a follow-up cares. Its texts are boxed (`Box<str>`:
/// 16 bytes, not `String`'s 24): they are only ever replaced whole, and every session
/// carries one (memory per session is a scale target).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LastReply {
    pub message_id: Option<Box<str>>,
    pub finish: Option<Box<str>>,
    pub error: Option<Box<str>>,
    /// The error's message text (e.g. "Session too large to compact").
    pub error_text: Option<Box<str>>,
    /// The end of its text (the last text part as closed by OpenCode) asks the
    /// person something ([`crate::session::question::asks_the_person`], decided when
    /// the part closed).
    pub text_asks: bool,
    /// It called the `question` tool.
    pub used_question_tool: bool,
}

impl LastReply {
    /// Finished normally: `finish: "stop"` and no error.
    pub fn finished_normally(&self) -> bool {
        self.finish.as_deref() == Some("stop") && self.error.is_none()
    }

    pub fn asks_the_person(&self) -> bool {
        self.used_question_tool || self.text_asks
    }
}

/// The session's state that a follow-up decision reads.
pub struct Facts<'a> {
    pub idle: bool,
    pub pause: Option<Pause>,
    /// A recovery or another prompt is under way.
    pub busy_with_other_work: bool,
    pub waiting_on_person: bool,
    pub last_reply: &'a LastReply,
    pub todos: &'a [Todo],
}

/// What the core should do.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Send { kind: PromptKind, round: u32 },
    Decline { kind: PromptKind, reason: String, round: u32 },
}

/// How the delivery of a follow-up ended, as far as the loop protection counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivered {
    Sent,
    /// Not sent (skipped, a duplicate, failed): it counts for nothing.
    NotSent,
    /// Over a rate limit after waiting its turn: it counts for nothing and is
    /// considered again at `retry_at` — deferred, never dropped.
    Deferred {
        retry_at: Instant,
    },
}

/// Nudge and review state of one session.
#[derive(Debug, Clone, Default)]
pub struct FollowUp {
    nudge_due: Option<Instant>,
    /// The loop protection's numbers: nudges without progress, the todos at the last
    /// nudge and when it was. Boxed (`None`: all zero and none): most sessions are never
    /// nudged, and every session carries this struct (memory per session is a scale
    /// target).
    nudged: Option<Box<NudgeCount>>,
    last_user_message: Option<Instant>,
    review_armed: bool,
    review_due: Option<Instant>,
    review_rounds: u32,
    in_flight: Option<PromptKind>,
    /// The loop-protection numbers before the nudge in flight was decided, so a nudge
    /// that is skipped (on advice) counts for nothing. Boxed: set only while a nudge is
    /// in flight, and every session carries this struct.
    before_nudge: Option<Box<NudgeCount>>,
    /// Bumped whenever a field of [`FollowUpMemory`] changes, so the actor writes the
    /// durable state only then (see [`FollowUp::generation`]).
    generation: u64,
}

/// What a sent nudge changes in the loop protection.
#[derive(Debug, Clone, Default)]
struct NudgeCount {
    without_progress: u32,
    snapshot: Option<Snapshot>,
    last: Option<Instant>,
}

/// A session never nudged.
static NOT_NUDGED: NudgeCount = NudgeCount { without_progress: 0, snapshot: None, last: None };

/// The part of [`FollowUp`] that must survive eviction and restarts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FollowUpMemory {
    pub nudges_without_progress: u32,
    pub nudge_snapshot: Option<Snapshot>,
    /// How long ago the last nudge was, when exported.
    pub since_last_nudge: Option<std::time::Duration>,
    pub review_armed: bool,
    pub review_rounds: u32,
}

impl FollowUp {
    pub fn export(&self, now: Instant) -> FollowUpMemory {
        let nudged = self.nudged();
        FollowUpMemory {
            nudges_without_progress: nudged.without_progress,
            nudge_snapshot: nudged.snapshot.clone(),
            since_last_nudge: nudged.last.map(|t| now.saturating_duration_since(t)),
            review_armed: self.review_armed,
            review_rounds: self.review_rounds,
        }
    }

    /// Changes whenever what [`FollowUp::export`] returns may have changed (apart from
    /// the passing of time).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn touch(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    fn nudged(&self) -> &NudgeCount {
        self.nudged.as_deref().unwrap_or(&NOT_NUDGED)
    }

    /// Sets the loop protection's numbers (nothing kept when they are all zero and none).
    fn set_nudged(&mut self, n: Box<NudgeCount>) {
        let none = n.without_progress == 0 && n.snapshot.is_none() && n.last.is_none();
        self.nudged = (!none).then_some(n);
    }

    pub fn restore(&mut self, m: FollowUpMemory, now: Instant) {
        self.touch();
        let last = m.since_last_nudge.and_then(|d| now.checked_sub(d));
        self.set_nudged(Box::new(NudgeCount {
            without_progress: m.nudges_without_progress,
            snapshot: m.nudge_snapshot,
            last,
        }));
        self.review_armed = m.review_armed;
        self.review_rounds = m.review_rounds;
    }

    /// After a restore: a review that was armed but not sent is considered again
    /// (delivery re-checks that the session is idle).
    pub fn resume_armed_review(&mut self, now: Instant, review: &ReviewConfig) {
        if self.review_armed && self.in_flight.is_none() {
            self.review_due = Some(now + review.debounce);
        }
    }

    pub fn deadline(&self) -> Option<Instant> {
        match (self.nudge_due, self.review_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn in_flight(&self) -> Option<PromptKind> {
        self.in_flight
    }

    pub fn nudges_without_progress(&self) -> u32 {
        self.nudged().without_progress
    }

    pub fn review_rounds(&self) -> u32 {
        self.review_rounds
    }

    /// busy→idle. `quiet` is true when the edge is Shepherd's own doing (its abort).
    pub fn on_idle_edge(
        &mut self,
        now: Instant,
        todos: &[Todo],
        quiet: bool,
        nudge: &NudgeConfig,
        review: &ReviewConfig,
    ) {
        if quiet {
            return;
        }
        if nudge.enabled && TodoCounts::of(todos).open > 0 {
            self.nudge_due = Some(now + nudge.idle_delay);
        }
        if self.review_armed {
            self.review_due = Some(now + review.debounce);
        }
    }

    /// The session went busy: a pending nudge is moot. Returns a decline to log.
    pub fn on_busy(&mut self) -> Option<Decision> {
        self.review_due = None;
        self.nudge_due.take().map(|_| Decision::Decline {
            kind: PromptKind::Nudge,
            reason: "the session went busy again".into(),
            round: self.nudged().without_progress,
        })
    }

    /// A new todo list. Detects the open→all-done edge (arms a review) and progress.
    pub fn on_todos(&mut self, before: &[Todo], after: &[Todo], now: Instant, idle: bool, review: &ReviewConfig) {
        let (was, is) = (TodoCounts::of(before), TodoCounts::of(after));
        if snapshot(before) != snapshot(after) && self.nudged().without_progress != 0 {
            if let Some(n) = self.nudged.take() {
                self.set_nudged(Box::new(NudgeCount { without_progress: 0, ..*n }));
            }
            self.touch();
        }
        if is.open > 0 {
            if self.review_armed {
                self.review_armed = false;
                self.touch();
            }
            self.review_due = None;
        } else if was.open > 0 && is.total > 0 && review.enabled && self.review_rounds < review.max_rounds {
            if !self.review_armed {
                self.review_armed = true;
                self.touch();
            }
            if idle {
                self.review_due = Some(now + review.debounce);
            }
        }
    }

    /// A real user message: the person is here; loop protection starts over.
    pub fn on_user_message(&mut self, now: Instant) {
        self.last_user_message = Some(now);
        let n = self.nudged();
        if n.without_progress != 0 || n.snapshot.is_some() {
            let last = n.last;
            self.set_nudged(Box::new(NudgeCount { without_progress: 0, snapshot: None, last }));
            self.touch();
        }
    }

    /// Decides whatever is due at `now`.
    pub fn on_deadline(
        &mut self,
        now: Instant,
        f: &Facts,
        nudge: &NudgeConfig,
        review: &ReviewConfig,
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        if self.nudge_due.is_some_and(|d| d <= now) {
            self.nudge_due = None;
            if let Some(d) = self.decide_nudge(now, f, nudge) {
                out.push(d);
            }
        }
        if self.review_due.is_some_and(|d| d <= now) {
            self.review_due = None;
            if let Some(d) = self.decide_review(now, f, review) {
                out.push(d);
            }
        }
        out
    }

    fn decide_nudge(&mut self, now: Instant, f: &Facts, cfg: &NudgeConfig) -> Option<Decision> {
        let open = TodoCounts::of(f.todos).open;
        let decline = |reason: String| {
            Some(Decision::Decline { kind: PromptKind::Nudge, reason, round: self.nudged().without_progress })
        };
        if open == 0 {
            return None; // all done meanwhile: the review's business
        }
        if !f.idle {
            return decline("the session went busy again".into());
        }
        if let Some(p) = f.pause {
            return decline(format!("automation is paused ({})", p.as_str()));
        }
        if f.busy_with_other_work || self.in_flight.is_some() {
            return decline("another prompt or recovery is under way".into());
        }
        if f.waiting_on_person {
            return decline("a permission or question waits for the person".into());
        }
        if !f.last_reply.finished_normally() {
            let finish = f.last_reply.finish.as_deref().unwrap_or("none");
            let error = f.last_reply.error.as_deref().unwrap_or("none");
            return decline(format!("the last reply did not finish normally (finish {finish}, error {error})"));
        }
        if f.last_reply.asks_the_person() {
            return decline("the last reply asks the person a question".into());
        }
        if let Some(last) = self.nudged().last {
            if now.duration_since(last) < cfg.cooldown {
                return decline("within nudge.cooldown of the previous nudge".into());
            }
        }
        if let Some(wrote) = self.last_user_message {
            if now.duration_since(wrote) < cfg.user_quiet {
                return decline("the person wrote within nudge.user_quiet".into());
            }
        }
        let snap = snapshot(f.todos);
        let unchanged = self.nudged().snapshot.as_ref() == Some(&snap);
        if unchanged && self.nudged().without_progress >= cfg.max_without_progress {
            return decline(format!(
                "{} nudges without progress on the todos: waiting for the todos to change or the person to write",
                self.nudged().without_progress
            ));
        }
        let before = self.nudged.take().unwrap_or_default();
        let without_progress = if unchanged { before.without_progress + 1 } else { 1 };
        self.nudged = Some(Box::new(NudgeCount { without_progress, snapshot: Some(snap), last: Some(now) }));
        self.before_nudge = Some(before);
        self.touch();
        self.in_flight = Some(PromptKind::Nudge);
        Some(Decision::Send { kind: PromptKind::Nudge, round: without_progress })
    }

    fn decide_review(&mut self, now: Instant, f: &Facts, cfg: &ReviewConfig) -> Option<Decision> {
        if !self.review_armed || !f.idle {
            return None; // re-considered at the next idle edge
        }
        let round = self.review_rounds + 1;
        let decline = |reason: String| Some(Decision::Decline { kind: PromptKind::Review, reason, round });
        if TodoCounts::of(f.todos).open > 0 {
            self.review_armed = false;
            self.touch();
            return None;
        }
        if let Some(p) = f.pause {
            return decline(format!("automation is paused ({})", p.as_str()));
        }
        if f.busy_with_other_work || self.in_flight.is_some() {
            self.review_due = Some(now + cfg.debounce);
            return None;
        }
        if f.waiting_on_person {
            return decline("a permission or question waits for the person".into());
        }
        if f.last_reply.asks_the_person() {
            return decline("the last reply asks the person a question".into());
        }
        self.review_armed = false;
        self.review_rounds = round;
        self.touch();
        self.in_flight = Some(PromptKind::Review);
        Some(Decision::Send { kind: PromptKind::Review, round })
    }

    /// The delivery of a nudge or review ended. Only a sent one counts: a nudge that
    /// was not sent leaves the loop protection and the cooldown as they were before it
    /// was decided, and a review that was not sent stays armed — for the next idle edge,
    /// or, deferred by a rate limit, for `retry_at`.
    pub fn on_delivered(&mut self, kind: PromptKind, outcome: Delivered) {
        if self.in_flight == Some(kind) {
            self.in_flight = None;
        }
        let sent = outcome == Delivered::Sent;
        if kind == PromptKind::Nudge {
            let before = self.before_nudge.take();
            if let (false, Some(before)) = (sent, before) {
                self.set_nudged(before);
                self.touch();
            }
        }
        if !sent && kind == PromptKind::Review {
            self.review_rounds = self.review_rounds.saturating_sub(1);
            self.review_armed = true;
            self.touch();
        }
        if let Delivered::Deferred { retry_at } = outcome {
            match kind {
                PromptKind::Nudge => self.nudge_due = Some(retry_at),
                PromptKind::Review => self.review_due = Some(retry_at),
                _ => {}
            }
        }
    }

    /// The nudge just decided was skipped on advice before it was sent: it counts for
    /// nothing (loop protection and cooldown are as before it), and it is considered
    /// again at `retry_at` — unless the session goes busy meanwhile.
    pub fn on_nudge_skipped(&mut self, retry_at: Instant) {
        if self.in_flight == Some(PromptKind::Nudge) {
            self.in_flight = None;
        }
        if let Some(before) = self.before_nudge.take() {
            self.set_nudged(before);
            self.touch();
        }
        self.nudge_due = Some(retry_at);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn todo(content: &str, status: TodoStatus) -> Todo {
        Todo { content: content.into(), status, priority: None }
    }

    fn finished() -> LastReply {
        LastReply { finish: Some("stop".into()), ..LastReply::default() }
    }

    fn facts<'a>(last_reply: &'a LastReply, todos: &'a [Todo]) -> Facts<'a> {
        Facts { idle: true, pause: None, busy_with_other_work: false, waiting_on_person: false, last_reply, todos }
    }

    #[test]
    fn a_nudge_deferred_by_a_rate_limit_counts_for_nothing_and_comes_back_at_its_retry_time() {
        let (nudge, review) = (NudgeConfig::default(), ReviewConfig::default());
        let t0 = Instant::now();
        let todos = [todo("write the parser", TodoStatus::Pending)];
        let reply = finished();
        let mut f = FollowUp::default();
        f.on_idle_edge(t0, &todos, false, &nudge, &review);
        let mut at = t0 + nudge.idle_delay;
        // Deferred more often than `max_without_progress`: never given up on, never
        // held back by the cooldown of a nudge that was not sent.
        for _ in 0..nudge.max_without_progress + 2 {
            let decided = f.on_deadline(at, &facts(&reply, &todos), &nudge, &review);
            assert_eq!(decided, vec![Decision::Send { kind: PromptKind::Nudge, round: 1 }]);
            let retry_at = at + Duration::from_secs(7);
            f.on_delivered(PromptKind::Nudge, Delivered::Deferred { retry_at });
            assert_eq!(f.nudges_without_progress(), 0, "a deferred nudge is not counted");
            assert_eq!(f.deadline(), Some(retry_at), "and it is considered again then");
            at = retry_at;
        }
        let decided = f.on_deadline(at, &facts(&reply, &todos), &nudge, &review);
        assert_eq!(decided, vec![Decision::Send { kind: PromptKind::Nudge, round: 1 }]);
        f.on_delivered(PromptKind::Nudge, Delivered::Sent);
        assert_eq!((f.nudges_without_progress(), f.deadline()), (1, None), "sent: counted, nothing pending");
    }

    #[test]
    fn a_nudge_that_was_not_sent_leaves_the_loop_protection_as_it_was() {
        let (nudge, review) = (NudgeConfig::default(), ReviewConfig::default());
        let t0 = Instant::now();
        let todos = [todo("write the parser", TodoStatus::Pending)];
        let reply = finished();
        let mut f = FollowUp::default();
        f.on_idle_edge(t0, &todos, false, &nudge, &review);
        let at = t0 + nudge.idle_delay;
        assert_eq!(f.on_deadline(at, &facts(&reply, &todos), &nudge, &review).len(), 1);
        f.on_delivered(PromptKind::Nudge, Delivered::NotSent);
        assert_eq!((f.nudges_without_progress(), f.deadline()), (0, None), "not counted; the next edge decides");
        // The next idle edge is not held back by the cooldown of a nudge never sent.
        let next = at + Duration::from_secs(1);
        f.on_idle_edge(next, &todos, false, &nudge, &review);
        let decided = f.on_deadline(next + nudge.idle_delay, &facts(&reply, &todos), &nudge, &review);
        assert_eq!(decided, vec![Decision::Send { kind: PromptKind::Nudge, round: 1 }]);
    }

    #[test]
    fn a_review_deferred_by_a_rate_limit_stays_armed_and_comes_back_in_the_same_round() {
        let (nudge, review) = (NudgeConfig::default(), ReviewConfig::default());
        let t0 = Instant::now();
        let open = [todo("write the parser", TodoStatus::InProgress)];
        let done = [todo("write the parser", TodoStatus::Completed)];
        let reply = finished();
        let mut f = FollowUp::default();
        f.on_todos(&open, &done, t0, true, &review);
        let at = t0 + review.debounce;
        let decided = f.on_deadline(at, &facts(&reply, &done), &nudge, &review);
        assert_eq!(decided, vec![Decision::Send { kind: PromptKind::Review, round: 1 }]);
        let retry_at = at + Duration::from_secs(30);
        f.on_delivered(PromptKind::Review, Delivered::Deferred { retry_at });
        assert_eq!((f.review_rounds(), f.deadline()), (0, Some(retry_at)));
        let decided = f.on_deadline(retry_at, &facts(&reply, &done), &nudge, &review);
        assert_eq!(decided, vec![Decision::Send { kind: PromptKind::Review, round: 1 }]);
    }
}
