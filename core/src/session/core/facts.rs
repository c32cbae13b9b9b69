//! Facts: events → state, and the edges they cross.
//!
//! [`SessionCore::observe`] folds one OpenCode event into the session's state —
//! busy/idle/retry, running tools, open questions, todos, the last reply, the model and
//! its context — and tells activity (resets the stall clock) from real progress
//! (resets the recovery counters). Where an event crosses an edge it hands over to the
//! behaviour that owns it: busy→idle to the [`arbiter`](super::arbiter), an abort the
//! person sent to the pause, a finished tool call to [`spin`](super::spin), an empty
//! finish to [`runaway`](super::runaway); waiting on the person beginning or ending to
//! [`person`](super::person). Nothing here decides an action of its own.

use super::*;

impl SessionCore {
    /// Feeds one event of this session in.
    pub fn observe(&mut self, event: &Event, now: Now) -> Vec<Effect> {
        let mut out = Vec::new();
        let waited_on = if self.waits_on_person() { self.waits_on() } else { None }; // no allocation in the usual case
        match event {
            Event::SessionCreated(info) | Event::SessionUpdated(info) => {
                self.hydrate(info);
                if !self.blind {
                    self.updated_ms = self.updated_ms.max(info.time.updated);
                }
            }
            Event::SessionDeleted(_) => out.push(Effect::Stop),
            Event::SessionStatus { status, .. } => self.on_status(status, now, &mut out),
            Event::SessionIdle { .. } => self.on_status(&Status::Idle, now, &mut out),
            Event::SessionError { error, .. } if error.is_abort() => self.on_abort_seen(None, now, &mut out),
            Event::MessageUpdated(m) => self.on_message(m, now, &mut out),
            Event::PartUpdated(p) => self.on_part(p, now, &mut out),
            Event::PartDelta { message_id, .. } => self.observe_streamed(now.mono, message_key(message_id)),
            Event::TodoUpdated { todos, .. } => {
                self.activity(now);
                if followup::snapshot(todos) != followup::snapshot(&self.todos) {
                    self.real_progress(now);
                }
                let idle = self.busy == RunState::Idle;
                self.followup.on_todos(&self.todos, todos, now.mono, idle, &self.cfg.review);
                if self.todos[..] != todos[..] {
                    self.todos = Arc::from(todos.as_slice());
                    self.touch();
                }
            }
            Event::PermissionAsked { id, .. } | Event::QuestionAsked { id, .. } => {
                if self.waiting_on_person.len() < MAX_OPEN_PER_SESSION {
                    self.waiting_on_person.insert(id.clone(), ());
                }
                self.activity(now);
            }
            Event::PermissionReplied { request_id, .. }
            | Event::QuestionReplied { request_id, .. }
            | Event::QuestionRejected { request_id, .. } => {
                self.waiting_on_person.remove(request_id);
                self.activity(now);
            }
            Event::SessionCompacted { .. } => {
                self.activity(now);
                self.compacting = None;
                self.rollover.on_compacted();
                self.context_tokens = None; // unknown until the next model call reports
            }
            Event::SessionError { error, .. } if error.name == ErrorInfo::CONTEXT_OVERFLOW => {
                // The message's own error may arrive after the idle edge; this one does
                // not. If OpenCode then compacts by itself, its next reply replaces it.
                self.learn_from_overflow(error);
                self.last_reply.error = Some(error.name.as_str().into());
                self.last_reply.error_text = error.data.as_ref().and_then(|d| d.message.as_deref()).map(Into::into);
            }
            Event::SessionError { error, .. } if classify(error) == ErrorClass::Provider => {
                self.note_provider_error(None, error, now, &mut out);
            }
            _ => {}
        }
        self.report_recovered(now, &mut out);
        self.person_edge(waited_on, now, &mut out);
        out
    }

    pub(super) fn on_status(&mut self, status: &Status, now: Now, out: &mut Vec<Effect>) {
        match status {
            Status::Busy => {
                if self.busy != RunState::Busy {
                    self.busy = RunState::Busy;
                    self.activity(now);
                    if let Some(d) = self.followup.on_busy() {
                        out.extend(self.decision_effects(d, now));
                    }
                }
            }
            Status::Retry { .. } => {
                self.busy = RunState::Retry;
                self.activity(now);
            }
            Status::Idle => {
                if self.busy != RunState::Idle {
                    self.on_idle_edge(now, out);
                }
                self.busy = RunState::Idle;
                // Emptied by replacing, not `clear()`: an idle session keeps no
                // capacity (it is most of the fleet, most of the time).
                self.running_tools = Open::default();
                self.waiting_on_person = Open::default();
                self.backoff_until = None;
            }
        }
    }

    pub(super) fn on_message(&mut self, m: &MessageInfo, now: Now, out: &mut Vec<Effect>) {
        let new_message = self.messages.role(message_key(&m.id)).is_none();
        self.remember_role(&m.id, m.role);
        match m.role {
            Role::User => {
                if new_message {
                    self.planning.on_user_turn(m.agent.as_deref());
                }
                // A user message's `message.updated` repeats after idle (diff summary):
                // not activity. Its agent/model is what our prompts must repeat.
                if m.agent.is_some() || m.model.is_some() {
                    self.turn = Some(TurnSettings { agent: m.agent.clone(), model: m.model.clone() });
                }
            }
            Role::Assistant => {
                if self.last_reply.message_id.as_deref() != Some(m.id.as_str()) {
                    self.last_reply = LastReply { message_id: Some(m.id.as_str().into()), ..LastReply::default() };
                }
                // Replaced only when it changed: a reply's updates repeat its finish.
                if self.last_reply.finish.as_deref() != m.finish.as_deref() {
                    self.last_reply.finish = m.finish.as_deref().map(Into::into);
                }
                self.last_reply.error = m.error.as_ref().map(|e| e.name.as_str().into());
                self.last_reply.error_text =
                    m.error.as_ref().and_then(|e| e.data.as_ref()).and_then(|d| d.message.as_deref()).map(Into::into);
                if m.model.is_some() && !m.summary && self.model != m.model {
                    self.model.clone_from(&m.model);
                    self.model_generation = self.model_generation.wrapping_add(1);
                }
                if let (Some(agent), false) = (&m.agent, m.summary) {
                    self.planning.on_agent(agent);
                }
                if let Some(err) = &m.error {
                    self.learn_from_overflow(err);
                    if classify(err) == ErrorClass::Provider {
                        self.note_provider_error(Some(m.id.clone()), err, now, out);
                    }
                }
                if m.finish.as_deref() == Some("unknown") && m.tokens.is_some_and(|t| t.output == 0) {
                    out.extend(self.on_empty_finish(&m.id, now));
                }
                if m.summary {
                    if m.time.completed.is_none() && m.error.is_none() {
                        self.compacting.get_or_insert(now.mono);
                    } else {
                        self.compacting = None;
                    }
                } else if m.finish.is_some() && m.error.is_none() {
                    if let Some(size) = m.tokens.map(|t| t.prompt_size()).filter(|s| *s > 0) {
                        let new_reading = self.context_tokens != Some(size);
                        self.context_tokens = Some(size);
                        if new_reading {
                            out.extend(self.on_context_reading(now));
                        }
                    }
                }
                if self.last_assistant.as_deref() != Some(m.id.as_str()) {
                    self.last_assistant = Some(m.id.as_str().into());
                }
                if let Some(err) = &m.error {
                    if err.is_abort() {
                        self.on_abort_seen(Some(&m.id), now, out);
                    }
                    return;
                }
                self.activity(now);
                if matches!(m.finish.as_deref(), Some("stop" | "length" | "tool-calls")) {
                    // The provider answered: the outage is over for this session (a
                    // person writing or a todo changing is no such evidence).
                    if let Some(o) = self.outage.as_mut() {
                        o.on_progress();
                    }
                }
                match m.finish.as_deref() {
                    Some("stop" | "length") => self.real_progress(now),
                    // A step of a spinning tool run is not progress.
                    Some("tool-calls") if !self.spin.is_spinning(self.cfg.loops.spin_count) => self.real_progress(now),
                    _ => {}
                }
            }
        }
    }

    pub(super) fn on_part(&mut self, p: &Part, now: Now, out: &mut Vec<Effect>) {
        let msg = message_key(&p.message_id);
        if self.messages.is_own(msg) {
            return;
        }
        let users = matches!(p.kind, PartKind::Text { shepherd: Some(_), .. })
            || (matches!(p.kind, PartKind::Text { .. }) && self.messages.role(msg) == Some(Role::User));
        if !users {
            self.last_part = Some(part_type(&p.kind));
            self.advice.on_part(&p.kind);
        }
        match &p.kind {
            PartKind::Text { shepherd: Some(_), .. } => {
                // Ours (this instance or another): neither activity nor the person.
                self.messages.mark_own(msg);
            }
            PartKind::Text { synthetic, ignored, text, .. } if self.messages.role(msg) == Some(Role::User) => {
                self.activity(now);
                // OpenCode's notice that a background child ended: not an orphan.
                if let Some(family) = self.family.as_mut() {
                    family.on_parent_notice(text);
                }
                if !synthetic && !ignored {
                    self.on_real_user_message(now, out);
                }
            }
            PartKind::Text { text, .. } => {
                self.activity(now);
                self.planning.on_text(text);
                if self.last_reply.message_id.as_deref() == Some(p.message_id.as_str()) && !text.is_empty() {
                    // The verdict, not the text: a session keeps no reply text.
                    self.last_reply.text_asks = crate::session::question::asks_the_person(text);
                }
            }
            PartKind::Compaction => {
                self.activity(now);
                self.compacting.get_or_insert(now.mono);
            }
            PartKind::Tool { status, tool, child_session, input } => {
                self.activity(now);
                if matches!(status, ToolStatus::Running | ToolStatus::Completed) {
                    self.planning.on_tool(tool);
                }
                let spinning = match (status, input) {
                    (ToolStatus::Completed | ToolStatus::Error, Some(input)) => {
                        self.on_tool_call_finished(tool, *input, now, out)
                    }
                    _ => false,
                };
                if let Some(child) = child_session {
                    self.family().adopt(child);
                }
                if tool == "question" && self.last_reply.message_id.as_deref() == Some(p.message_id.as_str()) {
                    self.last_reply.used_question_tool = true;
                }
                match status {
                    ToolStatus::Running
                        if self.running_tools.len() < MAX_OPEN_PER_SESSION
                            || self.running_tools.contains_key(&p.id) =>
                    {
                        self.running_tools.insert(p.id.clone(), tool.clone());
                    }
                    ToolStatus::Running => {}
                    ToolStatus::Completed => {
                        self.running_tools.remove(&p.id);
                        if !spinning {
                            self.real_progress(now);
                        }
                    }
                    ToolStatus::Error | ToolStatus::Pending => {
                        self.running_tools.remove(&p.id);
                    }
                }
            }
            _ => self.activity(now),
        }
    }

    pub(super) fn on_real_user_message(&mut self, now: Now, out: &mut Vec<Effect>) {
        self.real_progress(now);
        self.rollover.on_person_wrote();
        self.followup.on_user_message(now.mono);
        if let Some(pause) = self.pause.filter(|p| p.lifted_by_the_person_writing()) {
            self.pause = None;
            self.touch();
            let reason = match pause {
                Pause::GaveUp => "the person wrote after Shepherd gave up",
                _ => "the person wrote after aborting",
            };
            out.push(self.record(Action::Resume, Outcome::Done, reason, Numbers::default(), now));
        }
    }

    /// A `MessageAbortedError`: ours if a recovery is under way, or it names the
    /// message our abort interrupted, or it trails a recovery that just ended.
    pub(super) fn on_abort_seen(&mut self, message_id: Option<&str>, now: Now, out: &mut Vec<Effect>) {
        if self.recovering.is_some() || self.verify != Verify::Nothing {
            return; // ours: under way, or an abort whose answer was lost
        }
        if self.rollover.interrupted().is_some_and(|(_, abort_first)| abort_first) {
            return; // the hand-off under way aborted the turn itself
        }
        if let Some((ended, aborted)) = self.recovery_ended.as_deref() {
            let trailing = now.mono.duration_since(*ended) <= self.cfg.recovery.abort_poll_max;
            let same_message = message_id.is_some() && message_id == aborted.as_deref();
            if trailing || same_message {
                return;
            }
        }
        if matches!(self.pause, Some(Pause::UserAbort | Pause::Person | Pause::Fleet)) {
            // The same abort seen twice (event + message error), or Shepherd is held
            // off anyway (the person's own hold stays what it is).
            return;
        }
        self.pause = Some(Pause::UserAbort);
        self.touch();
        self.backoff_until = None;
        out.push(self.record(
            Action::Pause,
            Outcome::Done,
            "aborted by someone else than Shepherd: automation paused until the person writes",
            Numbers::default(),
            now,
        ));
    }

    /// Deltas of message `message` (its [`message_key`]) streamed, the latest at `at`:
    /// activity, unless the message is one of Shepherd's own prompts. All a delta does
    /// to a session, so the pump may take a session's deltas past its actor and hand
    /// over only the latest (`Registry::note_delta`); the actor feeds them in before anything
    /// else it does. Never moves the activity back.
    pub fn observe_streamed(&mut self, at: Instant, message: u64) {
        if !self.messages.is_own(message) && at >= self.last_activity {
            self.activity_at(at);
        }
    }

    pub(super) fn activity(&mut self, now: Now) {
        self.activity_at(now.mono);
    }

    fn activity_at(&mut self, at: Instant) {
        self.last_activity = at;
        self.backoff_until = None;
        self.advice.on_activity();
    }

    pub(super) fn real_progress(&mut self, now: Now) {
        self.progress_at = now.mono;
        if self.attempts != 0 || self.auto_submits != 0 {
            self.touch();
        }
        self.attempts = 0;
        self.auto_submits = 0;
        if let Some(rare) = self.rare.as_deref_mut() {
            rare.runaways = 0;
            rare.continues.on_progress();
        }
    }

    pub(super) fn remember_role(&mut self, message_id: &str, role: Role) {
        self.messages.set_role(message_key(message_id), role);
    }

    /// A todo list read by REST after a reconnect ([`SessionCore::todo_reread`] said
    /// why), with the session's last turn as read beside it: for a busy session, its
    /// tools still running are taken in as their events (a long tool gets its grace:
    /// what ran before the outage or a restart is not in memory); after a turn that
    /// ended unseen, its reply, as its `message.updated` would have been. Only a list
    /// that differs from what the core knows is news; an unchanged one is not
    /// activity. After a turn that ended unseen,
    /// its idle edge is taken now, on the list and the reply as they are — whatever a
    /// turn's end brings, in its precedence: a hand-off or compaction past a threshold
    /// the turn crossed, a nudge for open todos, the review of a finished list.
    /// Otherwise the session sits idle with open todos for good: no idle edge is coming.
    /// Unless one came since the stream went down (a session busy then is told idle by
    /// the reconciliation; a turn may have been seen since): one edge per turn.
    pub fn on_todos_refreshed(
        &mut self,
        todos: Vec<Todo>,
        why: TodoReread,
        last_turn: Option<LastTurn>,
        now: Now,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        if let Some(turn) = last_turn {
            match why {
                TodoReread::Busy if self.busy != RunState::Idle => {
                    let id = Arc::clone(&self.id);
                    for part in turn.running.iter().filter(|e| e.session_id() == Some(&*id)) {
                        out.extend(self.observe(part, now));
                    }
                }
                TodoReread::AfterUnseenTurn => {
                    if let Some(reply) = turn.reply {
                        out.extend(self.observe(&Event::MessageUpdated(reply), now));
                    }
                }
                _ => {}
            }
        }
        if followup::snapshot(&todos) != followup::snapshot(&self.todos) {
            let session_id = self.id.to_string();
            out.extend(self.observe(&Event::TodoUpdated { session_id, todos }, now));
        }
        let edge_due = !self.idle_edge_since_blind && self.busy == RunState::Idle && self.recovering.is_none();
        if why == TodoReread::AfterUnseenTurn && edge_due {
            self.on_idle_edge(now, &mut out);
        }
        out
    }

    /// Whether, and why, the todo list is re-read after a reconnect, given the session's
    /// `time.updated` in a listing read after the stream came back (`None`: not listed)
    /// and, when Shepherd knows it, since when nobody watched the server's stream
    /// (`unwatched_since`: a restart, or the outage's start; less a margin for clocks).
    /// A busy session's list may be changing. An idle one's changed only if it had a
    /// turn (`todowrite` is a tool of a turn, and a turn moves `time.updated`): listed as
    /// the stream showed it before the outage, it had none; listed otherwise, a turn
    /// ended unseen. A session whose time the stream never showed (an actor started at
    /// the reconnect) had one if it was updated since nobody watched. Not listed (past
    /// the listing's limit: among the oldest; or the listing failed), it is re-read if
    /// it has a list. Before, every list Shepherd knew of was re-read at every
    /// reconnect — at 100,000 sessions up to 100,000 `GET /session/{id}/todo` — and an
    /// idle session that wrote its first list while the stream was down never.
    pub fn todo_reread(&self, listed_updated_ms: Option<i64>, unwatched_since: Option<i64>) -> Option<TodoReread> {
        if self.busy != RunState::Idle {
            return Some(TodoReread::Busy);
        }
        let moved = match (listed_updated_ms, self.updated_ms) {
            (Some(listed), Some(known)) => listed != known,
            (Some(listed), None) => unwatched_since.is_some_and(|since| listed >= since),
            (None, _) => false,
        };
        if moved {
            Some(TodoReread::AfterUnseenTurn)
        } else if listed_updated_ms.is_none() && !self.todos.is_empty() {
            Some(TodoReread::NotListed)
        } else {
            None
        }
    }

    /// Learns the session's directory and creation time from its description.
    pub fn hydrate(&mut self, info: &SessionInfo) {
        if let Some(dir) = info.directory.as_deref().filter(|d| self.directory.as_deref() != Some(*d)) {
            self.directory = Some(dir.into());
        }
        if info.time.created.is_some() {
            self.created_ms = info.time.created;
        }
        if let Some(title) = info.title.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            if self.title.as_deref() != Some(title) {
                self.title = Some(title.into());
            }
        }
        if let Some(from) = info.handoff_from() {
            self.rollover.set_from(from);
        }
        if info.parent_id.is_some() {
            self.subagent = true;
        }
    }
}

/// How many message roles to remember (to tell user parts from assistant parts). A
/// message's parts follow its `message.updated` closely, so a short memory suffices; it
/// is per session, so it is most of a long-lived session's footprint (fleet bench).
pub(super) const ROLE_MEMORY: usize = 32;

/// The type of a part as the statistics name it (`tool:NAME` for tools).
pub(super) fn part_type(kind: &PartKind) -> String {
    match kind {
        PartKind::Text { .. } => "text".to_string(),
        PartKind::Reasoning => "reasoning".to_string(),
        PartKind::Tool { tool, .. } => format!("tool:{tool}"),
        PartKind::StepStart => "step-start".to_string(),
        PartKind::StepFinish => "step-finish".to_string(),
        PartKind::Compaction => "compaction".to_string(),
        PartKind::Other(other) => other.clone(),
    }
}

/// Role and "ours" flag of the last [`ROLE_MEMORY`] messages, in one ring of words:
/// each is a message's [`message_key`] with its low three bits replaced by the flags
/// (61 bits of hash: collisions among 32 ids are out of the question). 256 bytes when
/// full, less until then; searched linearly (32 words: cheaper than hashing again).
#[derive(Debug, Default)]
pub(super) struct MessageMemory {
    slots: Vec<u64>,
    /// The oldest slot, overwritten next once the ring is full.
    next: usize,
}

impl MessageMemory {
    const FLAGS: u64 = 0b111;
    const USER: u64 = 0b001;
    const ASSISTANT: u64 = 0b010;
    const OWN: u64 = 0b100;

    pub(super) fn find(&self, key: u64) -> Option<usize> {
        self.slots.iter().position(|s| s & !Self::FLAGS == key & !Self::FLAGS)
    }

    /// Sets `flags` on the message (remembering it, the oldest forgotten if full).
    pub(super) fn set(&mut self, key: u64, flags: u64, keep: u64) {
        match self.find(key) {
            Some(i) => self.slots[i] = (self.slots[i] & keep) | flags,
            None => {
                let slot = (key & !Self::FLAGS) | flags;
                if self.slots.len() < ROLE_MEMORY {
                    // Grown by doubling (4, 8, 16, then exactly the ring's 32 words):
                    // most sessions of a fleet remember a handful of messages, and a ring
                    // reserved whole at the first one cost each 256 bytes.
                    self.slots.push(slot);
                } else {
                    self.slots[self.next] = slot;
                    self.next = (self.next + 1) % ROLE_MEMORY;
                }
            }
        }
    }

    pub(super) fn set_role(&mut self, key: u64, role: Role) {
        let flag = match role {
            Role::User => Self::USER,
            Role::Assistant => Self::ASSISTANT,
        };
        self.set(key, flag, !(Self::USER | Self::ASSISTANT));
    }

    pub(super) fn mark_own(&mut self, key: u64) {
        self.set(key, Self::OWN, u64::MAX);
    }

    pub(super) fn role(&self, key: u64) -> Option<Role> {
        let slot = self.slots[self.find(key)?];
        match slot & (Self::USER | Self::ASSISTANT) {
            Self::USER => Some(Role::User),
            Self::ASSISTANT => Some(Role::Assistant),
            _ => None,
        }
    }

    pub(super) fn is_own(&self, key: u64) -> bool {
        self.find(key).is_some_and(|i| self.slots[i] & Self::OWN != 0)
    }
}

/// A message id as a 64-bit hash, as the session's memory of messages keys it: it needs
/// identity, not the text.
pub fn message_key(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::fingerprint::hasher();
    id.hash(&mut h);
    h.finish()
}

/// Why a todo list is re-read after a reconnect ([`SessionCore::todo_reread`]), handed
/// back with the list ([`SessionCore::on_todos_refreshed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TodoReread {
    /// The session is busy: its list may be changing.
    Busy,
    /// Idle, and its `time.updated` moved while the stream was down: a turn ran unseen.
    AfterUnseenTurn,
    /// Idle with a list, and the listing did not show it.
    NotListed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::core::testkit::*;

    #[test]
    fn the_message_ring_holds_its_last_32_messages_in_32_words() {
        let mut m = MessageMemory::default();
        for i in 0..40 {
            m.set_role(message_key(&format!("msg_{i}")), if i % 2 == 0 { Role::User } else { Role::Assistant });
            if i == 4 {
                // A fleet's sessions mostly remember a handful: they hold no more.
                assert!(m.slots.capacity() <= 8, "{} words for 5 messages", m.slots.capacity());
            }
        }
        assert_eq!(m.slots.capacity(), ROLE_MEMORY, "memory per session is a scale target");
        assert_eq!(m.role(message_key("msg_39")), Some(Role::Assistant));
        assert_eq!(m.role(message_key("msg_8")), Some(Role::User));
        assert_eq!(m.role(message_key("msg_7")), None, "the oldest are forgotten");
    }

    #[test]
    fn repeated_busy_events_do_not_count_as_progress() {
        let mut b = Bench::new();
        b.busy(0);
        b.busy(100);
        assert!(recovers(&b.tick(180)));
    }

    /// A server that starts tools and never ends them grows no session without bound;
    /// the session still counts as running tools (the grace holds).
    #[test]
    fn running_tools_a_server_never_ends_are_remembered_up_to_a_bound() {
        let mut b = Bench::new();
        b.busy(0);
        for n in 0..(MAX_OPEN_PER_SESSION + 500) {
            b.feed(0, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"prt_T{n}","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{{"status":"running"}}}}}}}}"#));
        }
        assert_eq!(b.core.running_tools.len(), MAX_OPEN_PER_SESSION);
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(720)), "still a running tool's grace");
        b.feed(1, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_T0","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"bash","state":{"status":"completed"}}}}"#);
        assert_eq!(b.core.running_tools.len(), MAX_OPEN_PER_SESSION - 1, "one that ends is forgotten");
    }

    #[test]
    fn the_title_follows_the_servers_description() {
        let mut b = Bench::new();
        assert_eq!(b.core.title(), None);
        b.feed(
            1,
            r#"{"type":"session.updated","properties":{"info":{"id":"ses_A","title":"Fix the parser","time":{}}}}"#,
        );
        assert_eq!(b.core.title(), Some("Fix the parser"));
        b.feed(2, r#"{"type":"session.updated","properties":{"info":{"id":"ses_A","title":"  ","time":{}}}}"#);
        assert_eq!(b.core.title(), Some("Fix the parser"), "a blank title changes nothing");
    }

    /// After an outage a todo list is re-read only where a turn may have changed it:
    /// the listing's `time.updated` against the one the stream showed before the outage,
    /// or, where the stream never showed one, against since when nobody watched.
    #[test]
    fn after_an_outage_only_a_session_that_moved_or_is_busy_re_reads_its_todos() {
        let updated = |ms: i64| {
            format!(r#"{{"type":"session.updated","properties":{{"info":{{"id":"ses_A","time":{{"created":1,"updated":{ms}}}}}}}}}"#)
        };
        let mut b = Bench::new();
        b.idle_ms(0);
        assert_eq!(b.core.todo_reread(Some(500), None), None, "never shown, watch unknown: a first start");
        assert_eq!(b.core.todo_reread(Some(500), Some(600)), None, "not updated since nobody watched");
        assert_eq!(b.core.todo_reread(Some(500), Some(400)), Some(TodoReread::AfterUnseenTurn), "updated since");
        b.feed(0, &updated(500));
        assert_eq!(b.core.todo_reread(Some(500), Some(400)), None, "listed as the stream showed it: no turn meanwhile");
        assert_eq!(b.core.todo_reread(Some(900), None), Some(TodoReread::AfterUnseenTurn), "it may have written a first list");
        assert_eq!(b.core.todo_reread(None, Some(400)), None, "not listed, no list: nothing to re-read");

        // What the stream says after it comes back, before sight is regained, does not
        // move the time compared with: the outage's turn would hide behind it. Nor does
        // a description read by REST.
        b.core.on_blind();
        b.feed(2, &updated(900));
        assert_eq!(b.core.todo_reread(Some(900), None), Some(TodoReread::AfterUnseenTurn));
        b.core.on_sight(b.at_ms(3000));
        let listed: SessionInfo = serde_json::from_str(r#"{"id":"ses_A","time":{"created":1,"updated":900}}"#).unwrap();
        b.core.hydrate(&listed);
        assert_eq!(b.core.todo_reread(Some(900), None), Some(TodoReread::AfterUnseenTurn));
        b.feed(3, &updated(900));
        assert_eq!(b.core.todo_reread(Some(900), None), None, "shown once sight is back");

        b.todos_ms(3100, &["pending"]);
        assert_eq!(b.core.todo_reread(None, None), Some(TodoReread::NotListed), "not listed, with a list");
        b.busy(4);
        assert_eq!(b.core.todo_reread(Some(900), None), Some(TodoReread::Busy), "its list may be changing");
    }

    /// A turn that ended while the stream was down left open todos: once the list and
    /// the turn's reply are read the session is nudged as after any turn — it has no
    /// idle edge to wait for — unless the reply says the turn did not end normally. The
    /// same list read for another reason (not listed) brings no nudge.
    #[test]
    fn open_todos_found_after_an_unseen_turn_are_nudged_unless_its_reply_failed() {
        let reply = |finish: &str, error: &str| {
            let json = format!(
                r#"{{"id":"msg_R","sessionID":"ses_A","role":"assistant","finish":"{finish}"{error},"time":{{"created":1,"completed":2}}}}"#
            );
            Box::new(crate::event::decode_message_info(&json).unwrap())
        };
        let open = || vec![Todo { content: "Add tests".into(), status: TodoStatus::Pending, priority: None }];
        let turn = |reply: Box<MessageInfo>| LastTurn {
            message_id: reply.id.clone(),
            completed: true,
            errored: reply.error.is_some(),
            running_task: false,
            reply: Some(reply),
            running: Vec::new(),
        };
        let after_outage = |last_reply| {
            let mut b = bench_with_rules(unadvised(rules()));
            b.turn_ms(0, "msg_B", "done for now", "stop");
            b.idle_ms(100);
            b.core.on_blind();
            b.core.on_sight(b.at_ms(1_000));
            let now = b.at_ms(1_100);
            assert!(b.core.on_todos_refreshed(open(), TodoReread::NotListed, None, now).is_empty());
            assert_eq!(b.core.deadline(), None, "no turn ended: nothing due");
            let now = b.at_ms(1_200);
            b.core.on_todos_refreshed(open(), TodoReread::AfterUnseenTurn, Some(turn(last_reply)), now);
            let due = b.core.deadline().expect("the turn's follow-up is due");
            let at = (due - b.t0).as_millis() as u64;
            b.tick_ms(at)
        };
        let nudged = |effects: &[Effect]| effects.iter().any(|e| matches!(e, Effect::Prompt(o) if o.kind == PromptKind::Nudge));
        let effects = after_outage(reply("stop", ""));
        assert!(nudged(&effects), "{effects:?}");
        let effects = after_outage(reply("unknown", r#","error":{"name":"APIError","data":{"message":"down"}}"#));
        assert!(!nudged(&effects), "the unseen turn failed: {effects:?}");
    }

    /// A session busy when the stream went down and idle after it had its turn's idle
    /// edge from the reconciliation's idle status; reading its list and reply after that
    /// does not give it a second (the nudge armed by the first is not pushed back).
    #[test]
    fn a_turn_whose_end_the_reconciliation_told_gets_no_second_idle_edge() {
        let mut b = bench_with_rules(unadvised(rules()));
        b.busy(0);
        b.todos_ms(100, &["pending"]);
        b.core.on_blind();
        b.idle_ms(1_000); // the reconciliation: idle now
        b.core.on_sight(b.at_ms(1_100));
        let first = b.core.deadline();
        let open = vec![Todo { content: "t".into(), status: TodoStatus::Pending, priority: None }];
        let now = b.at_ms(5_000);
        b.core.on_todos_refreshed(open, TodoReread::AfterUnseenTurn, None, now);
        assert!(first.is_some());
        assert_eq!(b.core.deadline(), first, "the nudge is due as the first edge armed it");
    }

    /// After a restart a busy session's actor knows nothing of the tool it runs: read
    /// with its last turn, the running tool gives it the tool's grace, not the stall
    /// timeout. Another session's part is not taken.
    #[test]
    fn a_running_tool_read_after_a_reconnect_gets_the_tools_grace() {
        let running = |session: &str| {
            let frame = format!(
                r#"{{"payload":{{"type":"message.part.updated","properties":{{"sessionID":"{session}","part":{{"id":"prt_T","messageID":"msg_B","sessionID":"{session}","type":"tool","tool":"bash","state":{{"status":"running"}}}}}}}}}}"#
            );
            crate::event::decode(&frame).unwrap().event
        };
        let turn = |running: Vec<Event>| LastTurn {
            message_id: "msg_B".into(),
            completed: false,
            errored: false,
            running_task: false,
            reply: None,
            running,
        };
        let mut b = Bench::new();
        b.busy(0);
        let stall = b.core.deadline();
        b.core.on_todos_refreshed(Vec::new(), TodoReread::Busy, Some(turn(vec![running("ses_other")])), b.at(0));
        assert_eq!(b.core.deadline(), stall, "another session's tool is not this one's");
        b.core.on_todos_refreshed(Vec::new(), TodoReread::Busy, Some(turn(vec![running("ses_A")])), b.at(0));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(720)), "the running tool's grace");
    }

    #[test]
    fn our_own_abort_is_not_taken_for_a_user_abort() {
        let mut b = Bench::new();
        b.busy(0);
        b.feed(0, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_B","sessionID":"ses_A","role":"assistant","time":{"created":1}}}}"#);
        assert!(recovers(&b.tick(180)));
        // The abort's events arrive while the procedure runs…
        let during = b.feed(180, r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError","data":{"message":"Aborted"}}}}"#);
        assert!(during.is_empty());
        b.recovered(182);
        // …and the message's own error may trail it.
        let after = b.feed(182, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_B","sessionID":"ses_A","role":"assistant","error":{"name":"MessageAbortedError"},"time":{"created":1,"completed":2}}}}"#);
        assert!(after.is_empty());
        assert_eq!(b.core.pause(), None);
    }

    #[test]
    fn a_user_abort_pauses_until_a_real_user_message() {
        let mut b = Bench::new();
        b.busy(0);
        let effects = b.feed(
            5,
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#,
        );
        assert_eq!(actions(&effects), vec![Action::Pause]);
        b.feed(6, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
        // A synthetic prompt from some tool does not un-pause…
        b.feed(7, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed(7, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p1","messageID":"msg_S","sessionID":"ses_A","type":"text","text":"x","synthetic":true}}}"#);
        b.busy(7);
        assert_eq!(b.core.deadline(), None, "paused: no stall recovery");
        // …a real one does.
        b.feed(8, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_U","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        let effects = b.feed(8, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p2","messageID":"msg_U","sessionID":"ses_A","type":"text","text":"go"}}}"#);
        assert_eq!(actions(&effects), vec![Action::Resume]);
        assert!(b.core.deadline().is_some());
    }

    #[test]
    fn shepherds_own_prompt_is_neither_user_activity_nor_progress() {
        let mut b = Bench::new();
        b.busy(0);
        assert!(recovers(&b.tick(180)));
        b.recovered(182);
        assert_eq!(b.core.attempts(), 1);
        b.feed(182, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_C","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed(182, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p3","messageID":"msg_C","sessionID":"ses_A","type":"text","text":"continue","synthetic":true,"metadata":{"shepherd":{"kind":"continue","instance":"i","decision":"d"}}}}}"#);
        b.busy(182);
        let effects = b.tick(182 + 180);
        assert!(recovers(&effects));
        assert_eq!(b.core.attempts(), 2, "our own continue did not reset the attempts");
    }

    /// The deltas the pump took past the actor, fed in as the actor takes them: activity
    /// from the latest one's read time, never backwards, and none for Shepherd's own
    /// prompt.
    #[test]
    fn deltas_taken_past_the_actor_are_activity_from_their_read_time_but_not_for_our_own_prompt() {
        let mut b = Bench::new();
        b.busy(0);
        let timeout = b.core.stall_timeout();
        b.core.observe_streamed(b.t0 + Duration::from_secs(100), message_key("msg_B"));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(100) + timeout));
        b.core.observe_streamed(b.t0 + Duration::from_secs(50), message_key("msg_B"));
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(100) + timeout), "not moved back");
        b.feed(110, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_C","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#);
        b.feed(110, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p3","messageID":"msg_C","sessionID":"ses_A","type":"text","text":"continue","synthetic":true,"metadata":{"shepherd":{"kind":"continue","instance":"i","decision":"d"}}}}}"#);
        let before = b.core.deadline();
        b.core.observe_streamed(b.t0 + Duration::from_secs(150), message_key("msg_C"));
        assert_eq!(b.core.deadline(), before, "our own prompt's deltas are not the session working");
    }

    #[test]
    fn todos_are_tracked_and_cancelled_counts_as_done() {
        let mut b = Bench::new();
        b.feed(0, r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"cancelled","priority":"high"},{"content":"b","status":"in_progress","priority":"low"}]}}"#);
        let open: Vec<_> = b.core.todos().iter().filter(|t| t.status.is_open()).collect();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].status, TodoStatus::InProgress);
    }

    #[test]
    fn an_announced_plan_is_planning_until_an_edit() {
        let mut b = bench(|_| {});
        b.user_turn(0, "msg_U", "build");
        b.busy(0);
        b.assistant(1, "msg_A");
        assert!(!b.core.is_planning());
        b.feed(2, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_t","messageID":"msg_A","sessionID":"ses_A","type":"text","text":"Here is my plan:\n1. parse\n2. test"}}}"#);
        assert!(b.core.is_planning());
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(2 + 300)));
        b.tool(3, "prt_e", "edit", "running", r#"{"path":"a"}"#);
        b.tool(4, "prt_e", "edit", "completed", r#"{"path":"a"}"#);
        assert!(!b.core.is_planning(), "execution ends planning");
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(4 + 180)));
    }
}
