//! The record of every action Shepherd takes or declines on a session.
//!
//! Each decision becomes one [`ActionRecord`]: one structured log event (`server`,
//! `session`, `action`, `outcome`, `reason` and the numbers that decided it) and one
//! message on a broadcast channel that the demo, the tests and later the status API
//! read. Records are built by the pure cores; `Journal::record` (in `shepherd-actors`)
//! is the only place that writes them out.

use serde::Serialize;

/// What Shepherd did, or considered doing, to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A busy session went quiet past its timeout.
    StallDetected,
    /// The stall was confirmed; abort + continue starts.
    Recover,
    /// `POST /abort` sent.
    Abort,
    /// The continue prompt sent after an abort.
    Continue,
    /// Recovery postponed by the back-off.
    Backoff,
    /// Automation stopped for this session until the person writes.
    Pause,
    /// Automation resumed (a real user message arrived).
    Resume,
    /// Shepherd stopped recovering this session (limits reached).
    GiveUp,
    /// A nudge: idle with open todos.
    Nudge,
    /// A review: all todos done.
    Review,
    /// A custom prompt from a person or tool (control API).
    Prompt,
    /// A compaction (`POST /summarize`).
    Compact,
    /// A note to the model that needs no reply (`noReply`), e.g. the hand-off's soft note.
    Note,
    /// A hand-off phase: the work of a filling session moves to a fresh one.
    Handoff,
    /// Repeated continues did not help: something stronger instead of another one.
    Escalate,
    /// The same tool with the same input called again and again.
    SpinningTool,
    /// The advisor was consulted before an abort or a nudge (and what it changed).
    Advise,
    /// A turn ended on a model provider's error: a resume is scheduled after the
    /// back-off (or why not); the session answering again ends the outage.
    ProviderError,
    /// The server's provider circuit breaker changed state (opened, re-opened, closed),
    /// or a session waits on it.
    Breaker,
    /// The session began waiting on the person: a question or a permission is open, or
    /// its last reply asks something (`numbers.waits_on` says which).
    WaitsOnPerson,
    /// The session no longer waits on the person (answered, rejected, or it moved on).
    WaitEnded,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::StallDetected => "stall_detected",
            Action::Recover => "recover",
            Action::Abort => "abort",
            Action::Continue => "continue",
            Action::Backoff => "backoff",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::GiveUp => "give_up",
            Action::Nudge => "nudge",
            Action::Review => "review",
            Action::Prompt => "prompt",
            Action::Compact => "compact",
            Action::Note => "note",
            Action::Handoff => "handoff",
            Action::Escalate => "escalate",
            Action::SpinningTool => "spinning_tool",
            Action::Advise => "advise",
            Action::ProviderError => "provider_error",
            Action::Breaker => "breaker",
            Action::WaitsOnPerson => "waits_on_person",
            Action::WaitEnded => "wait_ended",
        }
    }
}

/// Whether the action happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Carried out.
    Done,
    /// Decided against, with the reason.
    Declined,
    /// Tried and failed, with the reason.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Declined => "declined",
            Outcome::Failed => "failed",
        }
    }
}

/// The numbers behind a decision. Absent numbers are not logged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Numbers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_submits: Option<u32>,
    /// The session's age since its creation, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running_tools: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_todos: Option<u32>,
    /// The session's context size and window, in tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Nudges without todo progress so far, or the review round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// How long the session took to go idle after Shepherd's abort.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort_to_idle_ms: Option<u64>,
    /// The hand-off phase this record enters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The window a count was taken in (repeated continues, spinning tools).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// The type of the session's last part before a stall (`text`, `reasoning`,
    /// `tool:bash`, …): where sessions tend to get stuck.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_part: Option<String>,
    /// The advice heard before the decision (`wait:0.90`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    /// Where that advice came from: `model`, `cached`, `heuristic (obvious)`,
    /// `heuristic (no model configured)`, `heuristic (fallback: WHY)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advice_source: Option<String>,
    /// How long the server's provider breaker was open (when it closes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_ms: Option<u64>,
    /// How long the session has gone without real progress (`recovery.max_session_age`
    /// is measured by it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without_progress_ms: Option<u64>,
    /// How long OpenCode has been compacting the session (`compaction.max_wait` bounds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compacting_for_ms: Option<u64>,
    /// What the session waits on the person for: the open question's or permission's
    /// id, or the id of the reply that asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits_on: Option<String>,
    /// How long after its deadline a stall was looked at: the timer's own lateness and
    /// the wait for stream time (the events the server sent before the deadline handled
    /// first). Grows when Shepherd falls behind its stream or its threads wait for a CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<u64>,
}

/// One decision about one session.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ActionRecord {
    pub server: String,
    pub session: String,
    pub action: Action,
    pub outcome: Outcome,
    pub reason: String,
    pub numbers: Numbers,
    /// Epoch milliseconds.
    pub at_ms: i64,
}

impl ActionRecord {
    /// The record with its texts (reason, advice source) passed through `redactor`:
    /// what may be stored, logged and shown.
    pub fn redacted(mut self, redactor: &crate::redact::Redactor) -> Self {
        redactor.redact_in_place(&mut self.reason);
        if let Some(source) = self.numbers.advice_source.as_mut() {
            redactor.redact_in_place(source);
        }
        self
    }
}

/// One record without its numbers: what a session's history keeps (the numbers are in
/// the log and the ledger's journal). The reason is shared: the status book keeps one
/// copy of each text however many histories hold it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct HistoryEntry {
    pub at_ms: i64,
    pub action: Action,
    pub outcome: Outcome,
    pub reason: std::sync::Arc<str>,
}

/// A record's what and when, without its why: what a session actor keeps of its latest
/// record (the reason is in the status book's history and the ledger's journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct LastAction {
    pub at_ms: i64,
    pub action: Action,
    pub outcome: Outcome,
}

impl From<&ActionRecord> for LastAction {
    fn from(r: &ActionRecord) -> Self {
        LastAction { at_ms: r.at_ms, action: r.action, outcome: r.outcome }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redacted_record_keeps_its_facts_and_loses_its_secrets() {
        let r = ActionRecord {
            server: "local".into(),
            session: "ses_a".into(),
            action: Action::Continue,
            outcome: Outcome::Failed,
            reason: r#"prompt refused: {"error":"bad request","echo":"DATABASE_PASSWORD=hunter2-xyz"}"#.into(),
            numbers: Numbers {
                advice_source: Some("heuristic (fallback: token=abcdef123456)".into()),
                ..Numbers::default()
            },
            at_ms: 7,
        };
        let out = r.clone().redacted(&crate::redact::Redactor::default());
        assert_eq!(out.reason, r#"prompt refused: {"error":"bad request","echo":"DATABASE_PASSWORD=[REDACTED]"}"#);
        assert_eq!(out.numbers.advice_source.as_deref(), Some("heuristic (fallback: token=[REDACTED])"));
        assert_eq!((out.server, out.session, out.action, out.at_ms), (r.server, r.session, r.action, r.at_ms));
    }
}
