//! Delivering one prompt to a session, through the [`Engine`] port.
//!
//! Every prompt Shepherd sends — the continue after an abort, a nudge, a review, a
//! person's custom prompt — goes through [`deliver`]: re-read what may have changed
//! (busy or idle, the todo list, the agent and model of the last user turn), render the
//! template with the fresh facts, and send one synthetic text part tagged as
//! Shepherd's. What to do when the fresh facts contradict the decision (the session went
//! busy again, the todos were all done meanwhile) is decided here only as far as
//! "do not send": the caller's core records why.

use crate::event::{ShepherdTag, Status, Todo};
use crate::ports::{Engine, EngineError, Prompt, TurnSettings};
use crate::session::prompt::{render, PromptFacts, TodoCounts};

/// Which kind of prompt; written into the part metadata (`shepherd.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptKind {
    Continue,
    Nudge,
    Review,
    Custom,
    /// A `noReply` note: stored for the model's next turn, no turn of its own.
    Note,
    /// The hand-off's resume prompt to the fresh session.
    Handoff,
}

impl PromptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PromptKind::Continue => "continue",
            PromptKind::Nudge => "nudge",
            PromptKind::Review => "review",
            PromptKind::Custom => "custom",
            PromptKind::Note => "note",
            PromptKind::Handoff => "handoff",
        }
    }
}

/// A prompt to deliver, as decided by a core.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptOrder {
    pub session_id: String,
    pub directory: Option<String>,
    pub kind: PromptKind,
    pub template: String,
    /// Used instead of `template` when the fresh todo list has no open items.
    pub template_without_open_todos: Option<String>,
    pub facts: PromptFacts,
    /// Todos as last seen in events (used when the fresh read fails).
    pub known_todos: Vec<Todo>,
    pub known_turn: Option<TurnSettings>,
    /// Send only if `GET /session/status` says the session is idle.
    pub require_idle: bool,
    /// Send only if the fresh todo list still has open items.
    pub require_open_todos: bool,
    /// Names this decision in the prompt's metadata and the log.
    pub decision: String,
}

/// How the delivery ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    Sent {
        text: String,
        todos: Vec<Todo>,
    },
    /// Not sent, for this reason (fresh facts contradicted the decision).
    Skipped {
        reason: &'static str,
        todos: Vec<Todo>,
    },
    Failed {
        error: EngineError,
    },
}

/// Delivers one prompt. Never panics; every outcome is a [`Delivery`].
pub async fn deliver(engine: &dyn Engine, order: &PromptOrder, instance: &str) -> Delivery {
    if order.require_idle {
        let directory = order.directory.clone().unwrap_or_default();
        match engine.statuses(&directory).await {
            Ok(map) if matches!(map.get(&order.session_id), Some(Status::Busy | Status::Retry { .. })) => {
                return Delivery::Skipped { reason: "the session is busy again", todos: order.known_todos.clone() };
            }
            Ok(_) => {}
            Err(error) => return Delivery::Failed { error },
        }
    }
    let todos = engine.todos(&order.session_id).await.unwrap_or_else(|_| order.known_todos.clone());
    if order.require_open_todos && TodoCounts::of(&todos).open == 0 {
        return Delivery::Skipped { reason: "no open todos any more", todos };
    }
    let turn = match engine.last_turn_settings(&order.session_id).await {
        Ok(t) if t.agent.is_some() || t.model.is_some() => t,
        _ => order.known_turn.clone().unwrap_or_default(),
    };
    let template = match &order.template_without_open_todos {
        Some(t) if TodoCounts::of(&todos).open == 0 => t,
        _ => &order.template,
    };
    let text = render(template, &todos, &order.facts);
    let prompt = Prompt {
        text: text.clone(),
        tag: ShepherdTag {
            kind: order.kind.as_str().to_string(),
            instance: instance.to_string(),
            decision: order.decision.clone(),
        },
        turn,
        no_reply: order.kind == PromptKind::Note,
    };
    match engine.prompt(&order.session_id, &prompt).await {
        Ok(()) => Delivery::Sent { text, todos },
        Err(error) => Delivery::Failed { error },
    }
}
