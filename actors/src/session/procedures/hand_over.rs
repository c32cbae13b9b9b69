//! The hand-off procedure, one idempotent step at a time, through the ports.
//!
//! The core ([`super::handoff`]) decides *when*; this carries out *one step* of a
//! hand-off and reports. The actor journals and persists the phase between steps, so
//! a Shepherd killed at any point resumes the same hand-off at the step it was in, and
//! every step is safe to run again:
//!
//! - **persisting**: (abort the turn if asked and wait for idle), gather structured
//!   state — history, todos, the session's description, the repository (read-only),
//!   and the model's own account asked in a *fork* of the session — build the
//!   continuation and store it as a sealed snapshot. An intact snapshot with this id
//!   already stored is reused, not rebuilt.
//! - **handing over** (`fresh`): find the fresh session by the hand-off id in its
//!   title, or create it (same directory, marked with `metadata.shepherd`), then deliver
//!   the continuation as a `noReply` note — unless the fresh session already holds a
//!   part tagged with this hand-off's continuation. (`compact`: summarize the same
//!   session instead, then deliver the note to it.)
//! - **resuming**: claim the snapshot for the target session (a snapshot is restored
//!   once), then send the resume prompt with the old session's agent and model —
//!   unless it is already there.

use std::sync::Arc;

use crate::config::{HandoffConfig, HandoffMode};
use crate::event::{ShepherdSessionMark, ShepherdTag};
use crate::ledger::{Claim, Ledger, Snapshot};
use crate::ports::{HistoryPart, Lifecycle, Prompt, Reads, TurnSettings, Workspace};
use crate::session::continuation::{self, ContinuationFacts};
use crate::session::handoff::Phase;

use super::abort_and_wait::{abort_and_wait, IdleWait};
use super::deliver::{send_admitted, Outbound, PromptKind};

pub use shepherd_core::session::effect::{HandoffOrder, StepReport};

/// What a step may use.
pub struct Tools<'a> {
    /// The server (read, acted on) and the guard every prompt passes.
    pub out: Outbound<'a>,
    /// Where the fresh session is created or found again, and the fork to ask the
    /// model in made and removed.
    pub lifecycle: &'a dyn Lifecycle,
    pub ledger: &'a dyn Ledger,
    pub workspace: &'a dyn Workspace,
    pub cfg: &'a HandoffConfig,
    /// Every text this procedure stores or sends on passes it.
    pub redactor: &'a crate::redact::Redactor,
    /// Sessions Shepherd creates for its own questions (forks): not to be supervised.
    pub scratch: &'a Scratch,
    pub wall_ms: i64,
    /// How to wait for idle after an abort: the session's events, a poll meanwhile,
    /// for how long at most.
    pub idle: IdleWait,
}

/// Session ids Shepherd created for its own use (a fork to ask the model in): they are
/// not supervised, or a fork of a filling session would be handed off in turn.
#[derive(Debug, Clone, Default)]
pub struct Scratch(Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl Scratch {
    pub fn insert(&self, id: &str) {
        if let Ok(mut set) = self.0.lock() {
            set.insert(id.to_string());
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.0.lock().map(|set| set.contains(id)).unwrap_or(false)
    }
}

/// The marker in a fresh session's title that finds it again after a crash.
pub fn title_marker(id: &str) -> String {
    format!("[{id}]")
}

/// Runs one step.
pub async fn run_step(order: &HandoffOrder, tools: &Tools<'_>) -> StepReport {
    let result = match order.step {
        Phase::Persisting => persist(order, tools).await,
        Phase::HandingOver => hand_over(order, tools).await,
        Phase::Resuming => resume(order, tools).await,
        other => Err(format!("not a step of the procedure: {}", other.as_str())),
    };
    if result.is_ok() {
        use crate::killpoint::{reached, step};
        match order.step {
            Phase::Persisting => reached(step::HANDOFF_AFTER_PERSISTING),
            Phase::HandingOver => reached(step::HANDOFF_AFTER_HANDING_OVER),
            Phase::Resuming => reached(step::HANDOFF_AFTER_RESUMING),
            _ => {}
        }
    }
    result.unwrap_or_else(|error| StepReport::Failed { step: order.step, error })
}

async fn persist(order: &HandoffOrder, t: &Tools<'_>) -> Result<StepReport, String> {
    let stored = t.ledger.snapshot(&order.id).await.map_err(|e| format!("reading the snapshot store: {e}"))?;
    if let Some(Ok(s)) = stored {
        if s.is_intact() {
            return Ok(StepReport::Persisted {
                reused: true,
                readable: None,
                chars: s.continuation.len(),
                model_account: false,
            });
        }
    }
    let reads = t.out.reads;
    if order.abort_first {
        // Not idle in time: go on anyway, the snapshot is read-only.
        abort_and_wait(reads, t.out.control, &order.session_id, order.directory.as_deref().unwrap_or_default(), t.idle.clone())
            .await
            .map_err(|e| format!("aborting the turn: {e}"))?;
    }
    let info = reads.session(&order.session_id).await.map_err(|e| format!("reading the session: {e}"))?;
    // One read for the history and the last turn's agent and model.
    let recent =
        reads.recent(&order.session_id, t.cfg.history_messages).await.map_err(|e| format!("reading history: {e}"))?;
    let turn = recent.turn.or_known(order.known_turn.as_ref());
    let history = recent.messages;
    let todos = reads.todos(&order.session_id).await.unwrap_or_else(|_| order.known_todos.clone());
    let directory = info.directory.clone().or_else(|| order.directory.clone());
    let repo = match &directory {
        Some(d) => t.workspace.repo_state(d).await,
        None => None,
    };
    let model_account = if t.cfg.ask_model { ask_in_fork(order, t, &turn).await } else { None };
    let facts = ContinuationFacts {
        session_id: &order.session_id,
        title: info.title.as_deref(),
        directory: directory.as_deref(),
        history: &history,
        todos: &todos,
        known_children: order.children.clone(),
        repo,
        model_account: model_account.clone(),
        context: order.context,
        budget_tokens: t.cfg.max_continuation_tokens,
    };
    let text = continuation::build(&facts, t.redactor);
    // The title names the fresh session and heads the hand-off file.
    let title = info.title.as_deref().map(|title| t.redactor.redact(title).into_owned());
    let snapshot = Snapshot::seal(
        order.id.clone(),
        order.server.clone(),
        order.session_id.clone(),
        directory,
        title,
        t.wall_ms,
        &turn,
        text,
    );
    let readable = t.ledger.save_snapshot(&snapshot).await.map_err(|e| format!("storing the snapshot: {e}"))?;
    Ok(StepReport::Persisted {
        reused: false,
        readable,
        chars: snapshot.continuation.len(),
        model_account: model_account.is_some(),
    })
}

/// Asks the model for its own account in a fork (so the old session is left as it
/// was), bounded by `question_timeout`; the fork is deleted afterwards. `None` when
/// anything fails: the continuation is complete without it.
async fn ask_in_fork(order: &HandoffOrder, t: &Tools<'_>, turn: &TurnSettings) -> Option<String> {
    let fork = match t.lifecycle.fork(&order.session_id).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(session = %order.session_id, error = %e, "hand-off: could not fork the session to ask the model");
            return None;
        }
    };
    t.scratch.insert(&fork.id);
    let prompt = Prompt {
        text: t.cfg.question_message.clone(),
        tag: tag("handoff_question", t.out.instance, &format!("{}:question", order.id)),
        turn: turn.clone(),
        no_reply: false,
    };
    let answer = match tokio::time::timeout(t.cfg.question_timeout, t.out.control.ask(&fork.id, &prompt)).await {
        Ok(Ok(text)) if !text.trim().is_empty() => Some(text),
        Ok(Ok(_)) => None,
        Ok(Err(e)) => {
            tracing::warn!(session = %order.session_id, error = %e, "hand-off: the model's account could not be read");
            None
        }
        Err(_) => {
            tracing::warn!(session = %order.session_id, timeout = ?t.cfg.question_timeout, "hand-off: the model did not answer within handoff.question_timeout");
            let _ = t.out.control.abort(&fork.id).await;
            None
        }
    };
    if let Err(e) = t.lifecycle.delete_session(&fork.id).await {
        tracing::warn!(session = %order.session_id, fork = %fork.id, error = %e, "hand-off: could not delete the fork");
    }
    answer
}

async fn hand_over(order: &HandoffOrder, t: &Tools<'_>) -> Result<StepReport, String> {
    let snapshot = intact_snapshot(order, t).await?;
    let (target, created) = match order.mode {
        HandoffMode::Compact => {
            let model = snapshot.model.clone().ok_or("the session's model is not known: cannot compact")?;
            t.out.control.summarize(&order.session_id, &model).await.map_err(|e| format!("compacting: {e}"))?;
            (order.session_id.clone(), false)
        }
        HandoffMode::Fresh | HandoffMode::Manual => {
            let marker = title_marker(&order.id);
            let found = t
                .lifecycle
                .find_sessions(snapshot.directory.as_deref(), &marker)
                .await
                .map_err(|e| format!("looking for an earlier fresh session: {e}"))?;
            match found.into_iter().find(|s| s.title.as_deref().is_some_and(|t| t.contains(&marker))) {
                Some(s) => (s.id, false),
                None => {
                    let base = snapshot.title.as_deref().filter(|t| !t.is_empty()).unwrap_or(&order.session_id);
                    let title = format!("{base} (continued) {marker}");
                    let mark = ShepherdSessionMark {
                        handoff_from: Some(order.session_id.clone()),
                        handoff: Some(order.id.clone()),
                    };
                    let s = t
                        .lifecycle
                        .create_session(snapshot.directory.as_deref(), &title, &mark)
                        .await
                        .map_err(|e| format!("creating the fresh session: {e}"))?;
                    crate::killpoint::reached(crate::killpoint::step::HANDOFF_AFTER_CREATE);
                    (s.id, true)
                }
            }
        }
    };
    let decision = format!("{}:continuation", order.id);
    if !holds(t.out.reads, &target, &decision).await? {
        let note = Prompt {
            text: snapshot.continuation.clone(),
            tag: tag("handoff_continuation", t.out.instance, &decision),
            turn: turn_of(&snapshot),
            no_reply: true,
        };
        send(t, &target, &note).await.map_err(|e| format!("delivering the continuation: {e}"))?;
    }
    Ok(StepReport::HandedOver { target, created })
}

async fn resume(order: &HandoffOrder, t: &Tools<'_>) -> Result<StepReport, String> {
    let snapshot = intact_snapshot(order, t).await?;
    let target = order.target.clone().ok_or("no target session to resume in")?;
    match t.ledger.claim(&order.id, &target).await.map_err(|e| format!("claiming the snapshot: {e}"))? {
        Claim::Granted => {}
        Claim::Taken { by } => return Err(format!("the snapshot was already restored into {by}")),
    }
    let decision = format!("{}:resume", order.id);
    if !holds(t.out.reads, &target, &decision).await? {
        let text = t.cfg.resume_message.replace("{previousSession}", &order.session_id);
        let prompt =
            Prompt { text, tag: tag("handoff", t.out.instance, &decision), turn: turn_of(&snapshot), no_reply: false };
        send(t, &target, &prompt).await.map_err(|e| format!("sending the resume prompt: {e}"))?;
    }
    Ok(StepReport::Resumed { target })
}

/// The stored snapshot of this hand-off. A torn or corrupt one falls back to the
/// session's newest intact snapshot (an earlier hand-off's), logged; none is an error.
async fn intact_snapshot(order: &HandoffOrder, t: &Tools<'_>) -> Result<Snapshot, String> {
    let stored = t.ledger.snapshot(&order.id).await.map_err(|e| format!("reading the snapshot store: {e}"))?;
    let (server, session) = match stored {
        Some(Ok(s)) if s.is_intact() => return Ok(s),
        Some(Ok(s)) => (s.server, s.session),
        Some(Err(_)) | None => (order.server.clone(), order.session_id.clone()),
    };
    let all = t.ledger.snapshots(&server, &session).await.map_err(|e| format!("reading the snapshot store: {e}"))?;
    match Snapshot::newest_intact(all) {
        Some(s) => {
            tracing::warn!(session = %session, handoff = %order.id, fallback = %s.id, "hand-off: snapshot torn or corrupt; using the newest intact one");
            Ok(s)
        }
        None => Err(format!("snapshot {} is missing or corrupt and no earlier intact one exists", order.id)),
    }
}

/// Sends one of the hand-off's prompts through the guard.
async fn send(t: &Tools<'_>, session: &str, prompt: &Prompt) -> Result<(), String> {
    let verdict = t.out.admit(session, PromptKind::Handoff, &prompt.text, &prompt.tag.decision, None).await;
    if let Some(reason) = verdict.reason() {
        return Err(reason);
    }
    let prompt = Prompt { tag: ShepherdTag { lease: verdict.lease(), ..prompt.tag.clone() }, ..prompt.clone() };
    send_admitted(t.out, session, &prompt, None).await.map_err(|e| e.to_string())
}

/// Does the session already hold a part tagged with this decision?
async fn holds(reads: &dyn Reads, session: &str, decision: &str) -> Result<bool, String> {
    let history = reads.history(session, 50).await.map_err(|e| format!("reading {session}: {e}"))?;
    Ok(history
        .iter()
        .flat_map(|m| &m.parts)
        .any(|p| matches!(p, HistoryPart::Text { shepherd: Some(tag), .. } if tag.decision == decision)))
}

fn turn_of(s: &Snapshot) -> TurnSettings {
    TurnSettings { agent: s.agent.clone(), model: s.model.clone() }
}

fn tag(kind: &str, instance: &str, decision: &str) -> ShepherdTag {
    ShepherdTag { kind: kind.to_string(), instance: instance.to_string(), decision: decision.to_string(), lease: None }
}
