//! Delivering one prompt to a session: read through the [`Reads`] port, sent through
//! the [`Control`] port.
//!
//! Every prompt Shepherd sends — the continue after an abort, a nudge, a review, a
//! person's custom prompt — goes through [`deliver`]: re-read what may have changed
//! (busy or idle, the todo list, the agent and model of the last user turn), render the
//! template with the fresh facts, and send one synthetic text part tagged as
//! Shepherd's. What to do when the fresh facts contradict the decision (the session went
//! busy again, the todos were all done meanwhile) is decided here only as far as
//! "do not send": the caller's core records why.

use shepherd_core::ports::may_have_arrived;

use crate::event::{Role, ShepherdTag, Status};
use crate::guard::{GuardRequest, PromptGuard, Verdict};
use crate::ledger::{Intent, IntentKind, IntentLog, IntentStep};
use crate::ports::{Control, EngineError, HistoryMessage, HistoryPart, Prompt, Reads};
use crate::session::prompt::{fill, render, TodoCounts};
use crate::session::textual_tool_call::{detect, AssistantText};

use super::intents::{end_intent, write_intent};

pub use shepherd_core::session::effect::{Delivery, PromptKind, PromptOrder, ToolTextScan};

/// Where a prompt goes and who watches it: the server (read before a prompt, told to
/// act by it), the guard, and this instance's id (written into every prompt's
/// metadata).
#[derive(Clone, Copy)]
pub struct Outbound<'a> {
    pub server: &'a str,
    /// The session's state, re-read before a prompt is rendered and sent.
    pub reads: &'a dyn Reads,
    /// Where the prompt (and a recovery's abort and compaction) goes.
    pub control: &'a dyn Control,
    pub guard: &'a dyn PromptGuard,
    pub instance: &'a str,
    /// The session's lease this action already holds (a recovery takes it before its
    /// abort; its continue is sent under it). `None`: the guard takes it.
    pub lease: Option<u64>,
}

impl Outbound<'_> {
    /// Asks the guard about one prompt to `session`, comparing with the session's recent
    /// user messages (a failed read is logged and the guard judges without them). This
    /// instance's own earlier decisions in that history are left out when the prompt is
    /// a new decision of its own: the guard's memory knows them by decision, and a new
    /// edge or round is no repeat of the previous one.
    pub async fn admit(
        &self,
        session: &str,
        kind: PromptKind,
        text: &str,
        decision: &str,
        not_before_ms: Option<i64>,
    ) -> Verdict {
        let n = self.guard.history_messages();
        let history = if n == 0 { Ok(Vec::new()) } else { self.reads.history(session, n).await };
        self.admit_after_reading(session, kind, text, decision, not_before_ms, history.as_deref()).await
    }

    /// [`Outbound::admit`] over the session's recent messages already read (the
    /// guard looks at the newest [`PromptGuard::history_messages`] of them).
    pub async fn admit_after_reading(
        &self,
        session: &str,
        kind: PromptKind,
        text: &str,
        decision: &str,
        not_before_ms: Option<i64>,
        history: Result<&[HistoryMessage], &EngineError>,
    ) -> Verdict {
        let n = self.guard.history_messages() as usize;
        let recent = if n == 0 {
            Some(Vec::new())
        } else {
            match history {
                Ok(h) => Some(
                    h[h.len().saturating_sub(n)..]
                        .iter()
                        .filter(|m| m.role == Role::User)
                        .filter(|m| !(kind.is_automatic() && self.own_other_decision(m, decision)))
                        .filter_map(|m| {
                            let text: Vec<&str> = m
                                .parts
                                .iter()
                                .filter_map(|p| match p {
                                    HistoryPart::Text { text, .. } => Some(text.as_str()),
                                    _ => None,
                                })
                                .collect();
                            Some((m.created_ms?, text.join("\n")))
                        })
                        .collect(),
                ),
                Err(e) => {
                    tracing::warn!(server = %self.server, session, error = %e, "guard: could not read the session's recent messages; judging without them (fail open)");
                    None
                }
            }
        };
        let req = GuardRequest {
            server: self.server.to_string(),
            session: session.to_string(),
            kind,
            text: text.to_string(),
            decision: decision.to_string(),
            lease: self.lease,
            recent,
            not_before_ms,
        };
        self.guard.admit(&req).await
    }

    /// A message this instance sent for another automatic decision of its own.
    fn own_other_decision(&self, m: &HistoryMessage, decision: &str) -> bool {
        m.parts.iter().any(|p| {
            matches!(p, HistoryPart::Text { shepherd: Some(tag), .. }
                if tag.instance == self.instance && tag.kind != PromptKind::Custom.as_str() && tag.decision != decision)
        })
    }
}

/// The assistant messages of a history (oldest first), newest first, as the scan reads
/// them: text and reasoning parts, and whether they called tools.
fn assistant_texts(history: &[HistoryMessage]) -> Vec<AssistantText> {
    history
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| AssistantText {
            texts: m
                .parts
                .iter()
                .filter_map(|p| match p {
                    HistoryPart::Text { text, .. } | HistoryPart::Reasoning { text } => Some(text.clone()),
                    HistoryPart::Tool { .. } => None,
                })
                .collect(),
            called_tools: m.parts.iter().any(|p| matches!(p, HistoryPart::Tool { .. })),
        })
        .collect()
}

/// Delivers one prompt. Never panics; every outcome is a [`Delivery`].
pub async fn deliver(out: Outbound<'_>, order: &PromptOrder) -> Delivery {
    let reads = out.reads;
    if order.require_idle {
        let directory = order.directory.clone().unwrap_or_default();
        match reads.status(&directory, &order.session_id).await {
            Ok(Some(Status::Busy | Status::Retry { .. })) => {
                return Delivery::Skipped { reason: "the session is busy again", todos: order.known_todos.clone() };
            }
            Ok(_) => {}
            Err(error) => return Delivery::Failed { error },
        }
    }
    let todos = reads.todos(&order.session_id).await.unwrap_or_else(|_| order.known_todos.clone());
    if order.require_open_todos && TodoCounts::of(&todos).open == 0 {
        return Delivery::Skipped { reason: "no open todos any more", todos };
    }
    // One read for the turn's settings, the tool-call scan and the guard's comparison.
    let scan_messages = order.tool_text_scan.as_ref().map_or(0, |scan| scan.messages);
    let recent = reads.recent(&order.session_id, scan_messages.max(out.guard.history_messages())).await;
    let read = recent.as_ref().map(|r| r.turn.clone()).unwrap_or_default();
    let mut turn = read.or_known(order.known_turn.as_ref());
    if let Some(model) = &order.model {
        turn.model = Some(model.clone());
    }
    // A failed read is no reason not to send: the plain prompt goes out.
    let found = match (&order.tool_text_scan, &recent) {
        (Some(scan), Ok(r)) => detect(&assistant_texts(r.last(scan.messages))).map(|f| (f, scan)),
        _ => None,
    };
    let text = match &found {
        Some((f, scan)) => render(&fill(&scan.template, &[("pattern", f.pattern.to_string())]), &todos, &order.facts),
        None => {
            let template = match &order.template_without_open_todos {
                Some(t) if TodoCounts::of(&todos).open == 0 => t,
                _ => &order.template,
            };
            render(template, &todos, &order.facts)
        }
    };
    let history = recent.as_ref().map(|r| r.messages.as_slice());
    let verdict =
        out.admit_after_reading(&order.session_id, order.kind, &text, &order.decision, order.not_before_ms, history).await;
    let (waited_ms, lease) = match verdict {
        Verdict::Send { waited_ms, lease } => (waited_ms, lease),
        other => {
            let retry_after_ms = match other {
                Verdict::RateLimited { retry_after_ms, .. } => Some(retry_after_ms),
                _ => None,
            };
            return Delivery::Guarded { reason: other.reason().unwrap_or_default(), todos, retry_after_ms };
        }
    };
    // It waited its turn: the session may have moved on meanwhile.
    if waited_ms > 0 && order.require_idle {
        let directory = order.directory.clone().unwrap_or_default();
        if let Ok(Some(Status::Busy | Status::Retry { .. })) = reads.status(&directory, &order.session_id).await {
            out.guard.forget(out.server, &order.session_id, &text, order.not_before_ms).await;
            return Delivery::Skipped { reason: "the session went busy while the prompt waited its turn", todos };
        }
    }
    let prompt = Prompt {
        text: text.clone(),
        tag: ShepherdTag {
            kind: order.kind.as_str().to_string(),
            instance: out.instance.to_string(),
            decision: order.decision.clone(),
            lease,
        },
        turn,
        no_reply: order.kind == PromptKind::Note,
    };
    match send_admitted(out, &order.session_id, &prompt, order.not_before_ms).await {
        Ok(()) => Delivery::Sent { text, todos, waited_ms, tool_call_as_text: found.map(|(f, _)| f) },
        Err(Unsent::Fenced { holder }) => Delivery::Guarded {
            reason: Verdict::NotOurs { holder }.reason().unwrap_or_default(),
            todos,
            retry_after_ms: None,
        },
        Err(Unsent::Failed(error)) => Delivery::Failed { error },
    }
}

/// Why an admitted prompt was not (surely) sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unsent {
    /// The session's lease was not ours any more right before the send (another
    /// instance holds it, or it lapsed): not sent.
    #[error("another Shepherd instance ({holder}) acts for this session: the lease was lost before the send")]
    Fenced { holder: String },
    #[error("{0}")]
    Failed(EngineError),
}

/// Runs `work` (an action's waiting: the abort's poll, a compaction) while renewing
/// the session's lease `token` every [`PromptGuard::renew_every`]: `Err(holder)` —
/// and `work` dropped — as soon as the lease is not ours any more.
pub async fn holding_lease<F: std::future::Future>(
    out: Outbound<'_>,
    session: &str,
    token: Option<u64>,
    work: F,
) -> Result<F::Output, String> {
    let Some(every) = out.guard.renew_every().filter(|_| token.is_some()) else { return Ok(work.await) };
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Ok(done),
            () = tokio::time::sleep(every) => out.guard.fence(out.server, session, token).await?,
        }
    }
}

/// How many of the session's latest messages are searched for a prompt whose send was
/// not confirmed (it is the newest user message when it arrived; the margin covers a
/// turn's messages after it).
const UNCONFIRMED_LOOKBACK: u32 = 20;

/// Sends a prompt the guard admitted. When the send's answer was lost
/// ([`EngineError::Unconfirmed`]: a timeout, a connection broken after sending) the
/// session's messages decide: a message tagged with this instance and decision means
/// it arrived (`Ok`). Otherwise the error stands, and the guard keeps the prompt while
/// it may still arrive — only a prompt that surely did not arrive is forgotten, so a
/// retry within `guard.window` cannot prompt twice.
///
/// Right before the send, the lease the prompt was admitted under must still be ours
/// ([`PromptGuard::fence`]); a stale holder's prompt is not sent ([`Unsent::Fenced`]).
pub async fn send_admitted(
    out: Outbound<'_>,
    session: &str,
    prompt: &Prompt,
    not_before_ms: Option<i64>,
) -> Result<(), Unsent> {
    if let Err(holder) = out.guard.fence(out.server, session, prompt.tag.lease).await {
        out.guard.forget(out.server, session, &prompt.text, not_before_ms).await;
        return Err(Unsent::Fenced { holder });
    }
    let error = match out.control.prompt(session, prompt).await {
        Ok(()) => {
            crate::killpoint::reached(crate::killpoint::step::PROMPT_AFTER_SEND);
            return Ok(());
        }
        Err(error) => error,
    };
    if !matches!(error, EngineError::Unconfirmed(_)) {
        out.guard.forget(out.server, session, &prompt.text, not_before_ms).await;
        return Err(Unsent::Failed(error));
    }
    match out.reads.history(session, UNCONFIRMED_LOOKBACK).await {
        Ok(messages) if carries(&messages, &prompt.tag) => {
            tracing::info!(server = %out.server, session, decision = %prompt.tag.decision, error = %error, "prompt unconfirmed by its send, found in the session's messages: delivered");
            Ok(())
        }
        Ok(_) => {
            tracing::warn!(server = %out.server, session, decision = %prompt.tag.decision, error = %error, lookback = UNCONFIRMED_LOOKBACK, "prompt unconfirmed and not (yet) in the session's messages: kept by the guard, not retried");
            Err(Unsent::Failed(error))
        }
        Err(read) => {
            tracing::warn!(server = %out.server, session, decision = %prompt.tag.decision, error = %error, read_error = %read, "prompt unconfirmed and the session's messages unreadable: kept by the guard, not retried");
            Err(Unsent::Failed(error))
        }
    }
}

/// Does one of the messages carry a part tagged with this instance and decision?
fn carries(messages: &[HistoryMessage], tag: &ShepherdTag) -> bool {
    messages.iter().flat_map(|m| &m.parts).any(|p| {
        matches!(p, HistoryPart::Text { shepherd: Some(t), .. } if t.instance == tag.instance && t.decision == tag.decision)
    })
}

/// The intent a prompt of this kind ledgers before it is sent (hand-off notes and
/// prompts have their own resumption, by phase).
fn intent_kind(kind: PromptKind) -> Option<IntentKind> {
    match kind {
        PromptKind::Continue => Some(IntentKind::Continue),
        PromptKind::Nudge => Some(IntentKind::Nudge),
        PromptKind::Review => Some(IntentKind::Review),
        PromptKind::Custom => Some(IntentKind::Custom),
        PromptKind::Note | PromptKind::Handoff => None,
    }
}

/// Delivers a prompt with its intent ledgered around it: written before, closed once
/// the outcome is known — kept when the send failed in a way that may still have
/// reached OpenCode, so the session is read before anything is sent again.
pub async fn deliver_with_intent(out: Outbound<'_>, intents: &dyn IntentLog, order: &PromptOrder, wall_ms: i64) -> Delivery {
    let Some(kind) = intent_kind(order.kind) else { return deliver(out, order).await };
    let intent = Intent {
        server: out.server.to_string(),
        session: order.session_id.clone(),
        decision: order.decision.clone(),
        kind,
        step: IntentStep::Sending,
        instance: out.instance.to_string(),
        started_ms: wall_ms,
        attempt: order.facts.attempts,
    };
    write_intent(intents, &intent).await;
    let delivery = deliver(out, order).await;
    if !matches!(&delivery, Delivery::Failed { error } if may_have_arrived(error)) {
        end_intent(intents, &intent).await;
    }
    delivery
}
