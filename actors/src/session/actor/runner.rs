//! The runner: the one place an effect becomes a procedure and the procedure's report
//! goes back into the core.
//!
//! [`Procedure`] names what the core ordered; [`carry_out`] runs it through the
//! procedures in `session::procedures` (each given only the ports it needs) as a task
//! of its own beside the actor ([`OwnTask`]), so events keep flowing in meanwhile (our
//! own abort's among them) and its steps do not wait behind them;
//! [`Report`] is how it ended, and [`Report::into_core`] hands it to the core, which
//! decides what follows. A person's custom prompt (`requests.rs`), whose caller waits
//! for the outcome, goes through the same door ([`SessionActor::start`]) and reads the
//! report before handing it to the core the same way ([`SessionActor::take_report`]).
//!
//! Two kinds of bookkeeping are the runner's, not the procedures': a procedure that holds
//! an intent open in the ledger is listed in `running` while it runs (so a reconnect
//! does not take its intent for one a crash left behind), and one that must not be cut
//! off is counted in `in_flight` (shutdown waits for it). While Shepherd shuts down no
//! new prompt goes out.

use std::pin::Pin;

use super::*;
use crate::session::procedures::abort_and_wait::{IdleSeen, IdleWait, StatusFeed};
use crate::session::procedures::compact::summarize_within;
use crate::session::procedures::deliver::deliver_with_intent;

/// What the core ordered, to be carried out.
pub(super) enum Procedure {
    Recover(RecoveryOrder),
    Deliver(PromptOrder),
    Compact(CompactOrder),
    HandOff(HandoffOrder),
    Finish(FinishOrder),
    /// The advisor's word on a decision about this session.
    Consult { request: AdviceRequest, session: String },
}

/// How a procedure ended, with the order it ran.
pub(super) enum Report {
    Recovered(RecoveryReport),
    Delivered(PromptOrder, Delivery),
    Compacted(CompactOrder, Result<(), String>),
    SteppedHandOff(HandoffOrder, StepReport),
    Finished(FinishOrder, FinishReport),
    Advised(AdviceRequest, Consulted),
}

impl Procedure {
    /// The decision whose intent this procedure holds open in the ledger while it runs.
    fn holds_intent(&self) -> Option<String> {
        match self {
            Procedure::Recover(o) => Some(o.decision.clone()),
            Procedure::Deliver(o) => Some(o.decision.clone()),
            Procedure::Finish(o) => Some(o.intent.decision.clone()),
            Procedure::Compact(_) | Procedure::HandOff(_) | Procedure::Consult { .. } => None,
        }
    }

    /// It aborts a turn and waits for the session's idle: the actor feeds it the
    /// session's status events meanwhile.
    fn aborts(&self) -> bool {
        matches!(self, Procedure::Recover(_) | Procedure::HandOff(_))
    }

    /// Shutdown waits for it. A hand-off step is not waited for (every step is resumed
    /// from the ledger after a restart), nor a compaction or a consultation (nothing is
    /// half-sent when they are cut off).
    fn awaited_at_shutdown(&self) -> bool {
        matches!(self, Procedure::Recover(_) | Procedure::Deliver(_) | Procedure::Finish(_))
    }
}

impl Report {
    /// Hands the report to the core: what follows is the core's to decide.
    fn into_core(self, core: &mut SessionCore, now: Now) -> Vec<Effect> {
        match self {
            Report::Recovered(report) => core.on_recovery_finished(&report, now),
            Report::Delivered(order, delivery) => core.on_prompt_finished(&order, &delivery, now),
            Report::Compacted(order, result) => core.on_compaction_finished(&order, result, now),
            Report::SteppedHandOff(order, report) => core.on_handoff_step(&order, &report, now),
            Report::Finished(order, report) => core.on_unfinished_done(&order, &report, now),
            Report::Advised(request, answer) => core.on_advice(&request, &answer, now),
        }
    }
}

/// A procedure under way, as the actor awaits it: its report, once the runner's
/// bookkeeping is undone.
pub(super) type Underway = Pin<Box<dyn ActorFuture<SessionActor, Output = Report>>>;

impl SessionActor {
    /// Starts what the core ordered; its report goes back into the core when it ends.
    pub(super) fn run(&mut self, procedure: Procedure, ctx: &mut Context<Self>) {
        let work = self.start(procedure);
        ctx.spawn(work.map(|report, act, ctx| act.take_report(report, ctx)));
    }

    /// Starts `procedure` with the runner's bookkeeping (module doc); resolves to its
    /// report, which the caller hands to [`SessionActor::take_report`].
    pub(super) fn start(&mut self, procedure: Procedure) -> Underway {
        let stopping = self.env.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst);
        let procedure = match procedure {
            // Shutting down: no new prompt goes out; the core records why.
            Procedure::Deliver(order) if stopping => {
                let skipped = Delivery::Skipped { reason: "shutting down", todos: order.known_todos.clone() };
                return Box::pin(actix::fut::ready(Report::Delivered(order, skipped)));
            }
            other => other,
        };
        if let Procedure::Finish(order) = &procedure {
            let i = &order.intent;
            tracing::info!(server = %self.env.server, session = %i.session, decision = %i.decision, kind = i.kind.as_str(), step = i.step.as_str(), "resuming an action left unfinished");
        }
        let holds = procedure.holds_intent();
        if let Some(decision) = &holds {
            self.running.push(decision.clone());
        }
        let in_flight = procedure.awaited_at_shutdown().then(|| self.env.in_flight.enter());
        let seen = procedure.aborts().then(|| self.feed_status());
        let work = OwnTask::spawn(carry_out(procedure, Arc::clone(&self.env), Arc::clone(self.cfg()), seen));
        Box::pin(work.into_actor(self).map(move |report, act, _| {
            // Shutdown waits until here: the report (a person's reply among what follows
            // from it) is taken in this same turn of the actor.
            drop(in_flight);
            if let Some(decision) = holds {
                act.running.retain(|d| *d != decision);
            }
            if act.status_feed.as_ref().is_some_and(|feed| !feed.is_read()) {
                act.status_feed = None;
            }
            report
        }))
    }

    /// A reader of the session's status as its events show it, fed while a procedure
    /// reads it (the feed is made for the first reader, dropped after the last).
    fn feed_status(&mut self) -> IdleSeen {
        match &self.status_feed {
            Some(feed) => feed.subscribe(),
            None => {
                let (feed, seen) = StatusFeed::new();
                self.status_feed = Some(feed);
                seen
            }
        }
    }

    /// Hands a finished procedure's report to the core and carries out what follows.
    pub(super) fn take_report(&mut self, report: Report, ctx: &mut Context<Self>) {
        let recovered = matches!(report, Report::Recovered(_));
        let now = self.now();
        let effects = report.into_core(&mut self.core, now);
        self.apply(effects, ctx);
        if recovered && self.stop_after_recovery {
            ctx.stop();
        }
    }
}

/// A procedure run as a task of its own on the actor's thread, so that each of its
/// steps (a status read's answer, the ledger's, the guard's, the abort's) resumes it
/// from the runtime's short queue of tasks instead of waking the actor: an actor's wake
/// waits behind every session actor the stream woke before it, and a recovery took
/// four or five such waits between its stall deadline and its abort (at 100,000
/// streaming sessions, seconds). Only the report goes back through the actor.
///
/// Dropped with the actor (stopped, evicted, retired), it aborts the task at its next
/// step, as the actor's own future was dropped before: the ledger's intents cover a
/// procedure cut off, as they cover a crash.
struct OwnTask<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> OwnTask<T> {
    fn spawn(work: impl std::future::Future<Output = T> + Send + 'static) -> Self {
        OwnTask(tokio::spawn(work))
    }
}

impl<T> std::future::Future for OwnTask<T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        match std::task::ready!(Pin::new(&mut self.0).poll(cx)) {
            Ok(report) => std::task::Poll::Ready(report),
            // A procedure that panicked panics its actor, as it did in the actor's task.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled by the runtime's shutdown (this `Drop` cancels only what nobody
            // polls): the actor goes with it, and no report is made up.
            Err(_) => std::task::Poll::Pending,
        }
    }
}

impl<T> Drop for OwnTask<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one procedure to its report, through the ports it needs.
async fn carry_out(procedure: Procedure, env: Arc<SessionEnv>, cfg: Arc<SessionRules>, seen: Option<IdleSeen>) -> Report {
    match procedure {
        Procedure::Recover(order) => {
            let (intents, wall_ms) = (env.ledger.as_ref(), env.clock.wall_ms());
            Report::Recovered(
                recover(env.outbound(), &cfg.recovery, &order, env.in_flight.stopping(), intents, wall_ms, seen).await,
            )
        }
        Procedure::Deliver(order) => {
            let delivery = deliver_with_intent(env.outbound(), env.ledger.as_ref(), &order, env.clock.wall_ms()).await;
            Report::Delivered(order, delivery)
        }
        Procedure::Compact(order) => {
            let max_wait = cfg.compaction.max_wait;
            let result = summarize_within(env.engine.as_ref(), &order.session_id, &order.model, max_wait).await;
            Report::Compacted(order, result)
        }
        Procedure::HandOff(order) => {
            let tools = Tools {
                out: env.outbound(),
                lifecycle: env.engine.as_ref(),
                ledger: env.ledger.as_ref(),
                workspace: env.workspace.as_ref(),
                cfg: &cfg.handoff,
                redactor: &cfg.redactor,
                scratch: &env.scratch,
                wall_ms: env.clock.wall_ms(),
                idle: IdleWait::new(&cfg.recovery, seen),
            };
            let report = run_step(&order, &tools).await;
            Report::SteppedHandOff(order, report)
        }
        Procedure::Finish(order) => {
            let report = finish(env.outbound(), env.ledger.as_ref(), &order).await;
            Report::Finished(order, report)
        }
        Procedure::Consult { request, session } => {
            let answer = match env.advisor.get() {
                None => heuristic_answer(&request.situation, &cfg.advisor, Source::NoModel),
                Some(advisor) => {
                    let consult = Consult {
                        server: env.server.to_string(),
                        session,
                        situation: request.situation.clone(),
                        reads: Arc::clone(&env.engine) as Arc<dyn Reads>,
                        redactor: cfg.redactor.clone(),
                    };
                    advisor.send(consult).await.unwrap_or_else(|_| {
                        heuristic_answer(&request.situation, &cfg.advisor, Source::Fallback("advisor stopped".into()))
                    })
                }
            };
            Report::Advised(request, answer)
        }
    }
}
