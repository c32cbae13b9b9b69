//! What the control API asks of one session: its detail, a custom prompt, the off
//! switch, a hand-off now, a snapshot resumed.

use super::runner::{Procedure, Report};
use super::*;
use crate::session::prompt::custom_template;

/// What Shepherd knows about this session (status, control API, tests).
#[derive(Message)]
#[rtype(result = "SessionDetail")]
pub struct Inspect;

impl Handler<Inspect> for SessionActor {
    type Result = MessageResult<Inspect>;

    /// Built by the same code as the published detail ([`crate::session::view`]):
    /// raw, redacted where it leaves, on the reader's thread (`SessionDetail::redacted`).
    fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let last_activity_ms = crate::session::view::last_activity_ms(now, self.core.silent_since());
        let detail = PublishedDetail::of(&self.core, self.last_action);
        MessageResult(detail.to_detail(&self.env.server, self.core.id().to_string(), last_activity_ms))
    }
}

/// A person's or tool's prompt (control API), delivered like every other prompt.
#[derive(Message)]
#[rtype(result = "Result<CustomPromptReply, ControlError>")]
pub struct DeliverCustom(pub CustomPromptRequest);

impl Handler<DeliverCustom> for SessionActor {
    type Result = ResponseActFuture<Self, Result<CustomPromptReply, ControlError>>;

    fn handle(&mut self, msg: DeliverCustom, _: &mut Context<Self>) -> Self::Result {
        let req = msg.0;
        // `custom_prompt` wins over `message` when both are given (a blank one included).
        let text = req.custom_prompt.as_deref().or(req.message.as_deref());
        let Some(template) = custom_template(text, req.include_todo_context, req.include_context_summary) else {
            let err = ControlError::BadRequest { field: "message".into(), reason: "required (or custom_prompt)".into() };
            return Box::pin(actix::fut::ready(Err(err)));
        };
        let now = self.now();
        let order = self.core.custom_order(template, now);
        let summary = order.facts.context_summary.clone();
        // Through the runner, like every prompt: its intent listed as running, shutdown
        // waiting for it, none sent once shutdown began.
        Box::pin(self.start(Procedure::Deliver(order)).map(move |report, act, ctx| {
            let Report::Delivered(order, delivery) = &report else {
                unreachable!("a delivery reports a delivery")
            };
            let todos = delivery.todos().map_or_else(|| order.known_todos.clone(), <[_]>::to_vec);
            let (success, message, reason) = match delivery {
                Delivery::Sent { text, .. } => (true, text.clone(), None),
                Delivery::Skipped { reason, .. } => (false, String::new(), Some(reason.to_string())),
                Delivery::Guarded { reason, .. } => (false, String::new(), Some(reason.clone())),
                Delivery::Failed { error } => (false, String::new(), Some(error.to_string())),
            };
            act.take_report(report, ctx);
            // Echoed to the caller (and whatever logs its answers): redacted like all output.
            let redactor = &act.cfg().redactor;
            Ok(CustomPromptReply {
                success,
                message: redactor.redact_owned(message),
                todos: req.include_todo_context.then(|| {
                    todos.into_iter().map(|t| Todo { content: redactor.redact_owned(t.content.clone()), ..t }).collect()
                }),
                context_summary: req.include_context_summary.then(|| redactor.redact_owned(summary)),
                reason: reason.map(|r| redactor.redact_owned(r)),
            })
        }))
    }
}

/// The person's off switch for this session, or the fleet's as it reaches this session
/// (see `core/hold.rs`): `hold` pauses, else resumes.
#[derive(Message)]
#[rtype(result = "PauseView")]
pub struct SetHold {
    pub scope: HoldScope,
    pub hold: bool,
    pub until_ms: Option<i64>,
    pub by: String,
}

impl Handler<SetHold> for SessionActor {
    type Result = MessageResult<SetHold>;

    fn handle(&mut self, msg: SetHold, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let effects = if msg.hold {
            self.core.on_hold(msg.scope, msg.until_ms, &msg.by, now)
        } else {
            self.core.on_release(msg.scope, &msg.by, now)
        };
        self.apply(effects, ctx);
        MessageResult(PauseView {
            session: Some(self.core.id().to_string()),
            paused: self.core.pause().map(|p| p.as_str().to_string()),
            until_ms: self.core.hold_until_ms(),
        })
    }
}

/// Hand this session over to a fresh one now (control API).
#[derive(Message)]
#[rtype(result = "Result<HandoffView, ControlError>")]
pub struct RequestHandoff;

impl Handler<RequestHandoff> for SessionActor {
    type Result = Result<HandoffView, ControlError>;

    fn handle(&mut self, _: RequestHandoff, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let effects = self.core.request_handoff(now).map_err(ControlError::Conflict)?;
        self.apply(effects, ctx);
        Ok(HandoffView::of(self.core.handoff()))
    }
}

/// Restore a stored snapshot of this session into a fresh session (control API).
#[derive(Message)]
#[rtype(result = "Result<HandoffView, ControlError>")]
pub struct ResumeSnapshot(pub String);

impl Handler<ResumeSnapshot> for SessionActor {
    type Result = Result<HandoffView, ControlError>;

    fn handle(&mut self, msg: ResumeSnapshot, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let effects = self.core.resume_snapshot(&msg.0, now).map_err(ControlError::Conflict)?;
        self.apply(effects, ctx);
        Ok(HandoffView::of(self.core.handoff()))
    }
}

/// Where a hand-off stands, as the control API shows it. (Here, with the session: the
/// control API's types know nothing of the session's.)
impl HandoffView {
    pub fn of(r: &crate::session::handoff::Rollover) -> HandoffView {
        HandoffView {
            phase: r.phase().as_str().to_string(),
            id: r.id().map(str::to_string),
            new_session: r.new_session().map(str::to_string),
            from: r.from().map(str::to_string),
            reason: r.reason().map(str::to_string),
        }
    }
}
