//! What the ledger keeps: what Shepherd must not forget about a session — across actor
//! eviction, rediscovery and restarts — hand-off snapshots, and the intents of actions
//! under way.
//!
//! The core exports and restores a [`DurableState`]; the session actor saves it after
//! every decision and loads it when the actor is created. The `Ledger` port and its
//! adapters (SQLite in the binary's `store`, memory in `shepherd-actors::ledger`) are
//! not here: these are the records only.

use serde::{Deserialize, Serialize};

use crate::event::Todo;

/// What survives: counters, flags and the last todo snapshot. Times are wall-clock
/// epoch milliseconds (monotonic instants do not survive a restart).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DurableState {
    pub attempts: u32,
    pub auto_submits: u32,
    /// `user_abort`, `gave_up`, `person` or `fleet` (see `session::core::Pause`).
    pub paused: Option<String>,
    /// When a person's timed pause ends (epoch ms).
    pub paused_until_ms: Option<i64>,
    pub todos: Vec<Todo>,
    pub nudges_without_progress: u32,
    /// The todo snapshot (`content`, `status`) at the last nudge.
    pub nudge_snapshot: Option<Vec<(String, String)>>,
    pub last_nudge_ms: Option<i64>,
    pub review_armed: bool,
    pub review_rounds: u32,
    /// The last assistant message Shepherd already continued after a server restart
    /// interrupted it (so it is continued once).
    pub interrupted_continued: Option<String>,
    pub last_action: Option<String>,
    pub last_action_ms: Option<i64>,
    /// The hand-off of this session (phase, id, the fresh session).
    pub handoff: HandoffMemory,
    /// This session was created by a hand-off from that one.
    pub handoff_from: Option<String>,
    /// Its provider-outage back-off (consecutive failures, the step resumed, when the
    /// next is due, the model in use), so a restart neither forgets nor repeats a step.
    pub outage: OutageMemory,
}

/// What survives of a session's provider-outage back-off (see `session::outage`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct OutageMemory {
    /// Consecutive turns that ended on a provider error since the last real progress.
    pub failures: u32,
    /// The step (= failures) whose resume was sent.
    pub resumed_step: u32,
    /// When the next resume is due (epoch ms).
    pub due_ms: Option<i64>,
    /// The failed assistant message last counted (its events repeat).
    pub counted: Option<String>,
    /// 0: the session's own model; n: `recovery.fallback_models[n-1]`.
    pub model_index: u32,
    /// When that model was switched to (epoch ms).
    pub model_since_ms: Option<i64>,
    /// Resumes on that model that failed again.
    pub failures_on_model: u32,
    /// The session's own model (`provider/model`) while it runs on a fallback: the one
    /// it goes back to after `recovery.fallback_cooldown`.
    pub primary: Option<String>,
}

/// Why the ledger could not be read or written. Shepherd keeps running on errors
/// (they are logged and counted); a session then acts on what it has in memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger storage: {0}")]
    Storage(String),
    #[error("ledger data: {0}")]
    Corrupt(String),
}

/// A hand-off as the ledger remembers it: enough to resume it after a crash, and to
/// link the old session to the new one in status and history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HandoffMemory {
    /// The phase name (`monitoring`, `preparing`, `ready`, `persisting`, …).
    pub phase: String,
    /// The hand-off id (also the snapshot's id).
    pub id: Option<String>,
    pub mode: Option<String>,
    /// The fresh session the work moved to.
    pub new_session: Option<String>,
    /// Why it started, or why it failed / waits for a person.
    pub reason: Option<String>,
    /// The turn is to be aborted first (a hard-threshold drain that ran out).
    pub abort_first: bool,
    pub started_ms: Option<i64>,
}

/// The phases in which a hand-off's procedure is under way (see `session::handoff`).
pub const HANDOFF_RUNNING_PHASES: [&str; 3] = ["persisting", "handing_over", "resuming"];

/// The version of [`Snapshot`] this Shepherd writes and reads.
pub const SNAPSHOT_VERSION: u32 = 1;

/// A persisted continuation: what a fresh session needs to carry on the work. Written
/// once per hand-off; restored once (the claim).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub id: String,
    pub server: String,
    pub session: String,
    pub directory: Option<String>,
    pub title: Option<String>,
    pub created_ms: i64,
    /// Agent and model the old session's last turn used (the resume prompt repeats them).
    pub agent: Option<String>,
    pub model: Option<crate::event::ModelRef>,
    /// The continuation, in Markdown.
    pub continuation: String,
    /// SHA-256 (hex) of everything above: a torn or altered snapshot does not verify.
    pub checksum: String,
}

impl Snapshot {
    /// Builds a snapshot and seals it with its checksum.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        id: String,
        server: String,
        session: String,
        directory: Option<String>,
        title: Option<String>,
        created_ms: i64,
        turn: &crate::ports::TurnSettings,
        continuation: String,
    ) -> Snapshot {
        let mut s = Snapshot {
            version: SNAPSHOT_VERSION,
            id,
            server,
            session,
            directory,
            title,
            created_ms,
            agent: turn.agent.clone(),
            model: turn.model.clone(),
            continuation,
            checksum: String::new(),
        };
        s.checksum = s.digest();
        s
    }

    /// Is it whole and of a version this Shepherd reads?
    pub fn is_intact(&self) -> bool {
        self.version == SNAPSHOT_VERSION && self.checksum == self.digest()
    }

    fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let model = self.model.as_ref().map(|m| format!("{}/{}", m.provider_id, m.model_id));
        for field in [
            Some(self.version.to_string()),
            Some(self.id.clone()),
            Some(self.server.clone()),
            Some(self.session.clone()),
            self.directory.clone(),
            self.title.clone(),
            Some(self.created_ms.to_string()),
            self.agent.clone(),
            model,
            Some(self.continuation.clone()),
        ] {
            // Length-prefixed, so no two field lists hash alike.
            let f = field.unwrap_or_default();
            h.update((f.len() as u64).to_le_bytes());
            h.update(f.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The newest intact snapshot of a list (newest first), skipping torn or corrupt ones.
    pub fn newest_intact(stored: Vec<Result<Snapshot, LedgerError>>) -> Option<Snapshot> {
        stored.into_iter().filter_map(Result::ok).find(Snapshot::is_intact)
    }
}

/// The outcome of claiming a snapshot for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This session holds the claim (first claim, or the same session again).
    Granted,
    /// Another session restored it already.
    Taken { by: String },
}

/// An action Shepherd began on a session and has not seen through yet: written before
/// the first request that changes the session (the abort, the prompt), updated as the
/// procedure passes each step, and removed once its outcome is known. A crash leaves it
/// behind; on start, reconnect and rediscovery it is resumed by looking at the session
/// itself (OpenCode's messages carry Shepherd's tag and the decision id): what already
/// happened is not done again, what is missing is done once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub server: String,
    pub session: String,
    /// The decision id: written into the prompt's tag, so the session shows whether the
    /// prompt arrived.
    pub decision: String,
    pub kind: IntentKind,
    pub step: IntentStep,
    /// The Shepherd instance that began it.
    pub instance: String,
    /// When it began (epoch ms).
    pub started_ms: i64,
    /// The attempt (a recovery) or round (a follow-up) rendered into the prompt.
    pub attempt: u32,
}

/// What the intent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentKind {
    /// A stall recovery: abort, then continue.
    Recover,
    /// A continue to an idle session (an orphaned parent, a turn cut off by a restart).
    Continue,
    Nudge,
    Review,
    /// A person's or tool's prompt through the control API: verified, never re-sent
    /// (whoever asked was told it failed).
    Custom,
}

impl IntentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentKind::Recover => "recover",
            IntentKind::Continue => "continue",
            IntentKind::Nudge => "nudge",
            IntentKind::Review => "review",
            IntentKind::Custom => "custom",
        }
    }

    pub fn parse(s: &str) -> Option<IntentKind> {
        [IntentKind::Recover, IntentKind::Continue, IntentKind::Nudge, IntentKind::Review, IntentKind::Custom]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// How far the procedure got before the intent was last written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentStep {
    /// Decided; nothing sent yet (the abort or prompt may be on its way).
    Intended,
    /// The abort was accepted; the continue is still to come.
    Aborted,
    /// The prompt is being sent (it may have arrived).
    Sending,
}

impl IntentStep {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentStep::Intended => "intended",
            IntentStep::Aborted => "aborted",
            IntentStep::Sending => "sending",
        }
    }

    pub fn parse(s: &str) -> Option<IntentStep> {
        [IntentStep::Intended, IntentStep::Aborted, IntentStep::Sending].into_iter().find(|k| k.as_str() == s)
    }
}

/// The fleet-wide pause (`shepherd pause --all`): who asked, since and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetPause {
    pub by: String,
    pub since_ms: i64,
    /// Epoch ms; `None`: until resumed.
    pub until_ms: Option<i64>,
}
