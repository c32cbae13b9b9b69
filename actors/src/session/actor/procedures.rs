//! The procedures the core's effects order, each started here and run beside the
//! actor's mailbox; each outcome goes back into the core, which decides what follows.

use super::*;
use crate::session::recovery::summarize_within;

impl SessionActor {
    pub(super) fn start_recovery(&mut self, order: RecoveryOrder, ctx: &mut Context<Self>) {
        let env = self.env.clone();
        let cfg = Arc::clone(&self.cfg);
        let guard = env.in_flight.enter();
        let decision = order.decision.clone();
        self.running.push(decision.clone());
        let work = async move {
            let (intents, wall_ms) = (env.ledger.as_ref(), env.clock.wall_ms());
            let report =
                recover(env.outbound(), &cfg.recovery, &order, env.in_flight.stopping(), intents, wall_ms).await;
            drop(guard);
            report
        };
        // `spawn`, not `wait`: events keep flowing in while the procedure runs (our
        // own abort's events among them).
        ctx.spawn(work.into_actor(self).map(move |report: RecoveryReport, act, ctx| {
            act.running.retain(|d| *d != decision);
            let effects = act.core.on_recovery_finished(&report, act.env.now());
            act.apply(effects, ctx);
            if act.stop_after_recovery {
                ctx.stop();
            }
        }));
    }

    pub(super) fn start_delivery(&mut self, order: PromptOrder, ctx: &mut Context<Self>) {
        if self.env.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            let effects = self.core.on_prompt_finished(
                &order,
                &Delivery::Skipped { reason: "shutting down", todos: order.known_todos.clone() },
                self.env.now(),
            );
            self.apply(effects, ctx);
            return;
        }
        let env = self.env.clone();
        let guard = env.in_flight.enter();
        let decision = order.decision.clone();
        self.running.push(decision.clone());
        let work = async move {
            let delivery = deliver_with_intent(&env, &order).await;
            drop(guard);
            (order, delivery)
        };
        ctx.spawn(work.into_actor(self).map(move |(order, delivery), act, ctx| {
            act.running.retain(|d| *d != decision);
            let effects = act.core.on_prompt_finished(&order, &delivery, act.env.now());
            act.apply(effects, ctx);
        }));
    }

    /// Finishes actions a crash left open (their intents), reading the session first.
    pub(super) fn start_finish(&mut self, order: FinishOrder, ctx: &mut Context<Self>) {
        let env = self.env.clone();
        let guard = env.in_flight.enter();
        let decision = order.intent.decision.clone();
        self.running.push(decision.clone());
        tracing::info!(server = %env.server, session = %order.intent.session, decision = %decision, kind = order.intent.kind.as_str(), step = order.intent.step.as_str(), "resuming an action left unfinished");
        let work = async move {
            let report = finish(env.outbound(), env.ledger.as_ref(), &order).await;
            drop(guard);
            (order, report)
        };
        ctx.spawn(work.into_actor(self).map(move |(order, report), act, ctx| {
            act.running.retain(|d| *d != decision);
            let effects = act.core.on_unfinished_done(&order, &report, act.env.now());
            act.apply(effects, ctx);
        }));
    }

    /// Looks for intents of this session left open in the ledger (not those of
    /// procedures running here now) and hands them to the core.
    pub(super) fn find_open_intents(&mut self, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let find = async move { ledger.open_intents(&server, Some(&id)).await };
        ctx.spawn(find.into_actor(self).map(|found, act, ctx| act.open_intents_found(found, ctx)));
    }

    /// Hands the open intents read from the ledger to the core — even none: the core
    /// learns the search is over (its stall clock waits for it). Those of procedures
    /// running here now are not open.
    pub(super) fn open_intents_found(&mut self, found: Result<Vec<Intent>, LedgerError>, ctx: &mut Context<Self>) {
        match found {
            Ok(intents) => {
                // A finish running under a first id may have replaced its intent by the
                // retry's: that is the same action, running here.
                let running = |i: &Intent| self.running.iter().any(|d| same_action(d, &i.decision));
                let open: Vec<Intent> = intents.into_iter().filter(|i| !running(i)).collect();
                let effects = self.core.on_open_intents(open, self.env.now());
                self.apply(effects, ctx);
            }
            Err(e) => {
                tracing::warn!(server = %self.env.server, session = %self.core.id(), error = %e, "ledger: could not read this session's open intents");
                self.core.on_intents_unreadable(self.env.now());
                self.settle(ctx);
            }
        }
    }
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
pub(super) async fn deliver_with_intent(env: &SessionEnv, order: &PromptOrder) -> Delivery {
    let Some(kind) = intent_kind(order.kind) else { return deliver(env.outbound(), order).await };
    let intent = Intent {
        server: env.server.to_string(),
        session: order.session_id.clone(),
        decision: order.decision.clone(),
        kind,
        step: IntentStep::Sending,
        instance: env.instance.clone(),
        started_ms: env.clock.wall_ms(),
        attempt: order.facts.attempts,
    };
    write_intent(env.ledger.as_ref(), &intent).await;
    let delivery = deliver(env.outbound(), order).await;
    if !matches!(&delivery, Delivery::Failed { error } if may_have_arrived(error)) {
        end_intent(env.ledger.as_ref(), &intent).await;
    }
    delivery
}

impl SessionActor {
    /// Tells or asks the server's provider breaker. A transition is journalled; an
    /// answer goes back into the core, which decides (applied as its own step: `apply`
    /// is running). A session told to wait is woken by the breaker's next transition.
    pub(super) fn call_breaker(&mut self, call: BreakerCall, ctx: &mut Context<Self>) {
        let (now, id) = (self.env.now(), self.core.id().to_string());
        let breaker = &self.env.breaker;
        let changes = breaker.changes(); // before asking: no transition is missed
        let (permit, transition) = match call {
            BreakerCall::Failed => (None, breaker.on_failure(&id, now.mono, &self.cfg.recovery)),
            BreakerCall::Recovered => (None, breaker.on_success(&id, now.mono)),
            BreakerCall::Ask => {
                let (permit, transition) = breaker.permit(&id, now.mono, &self.cfg.recovery);
                (Some(permit), transition)
            }
        };
        let mut effects: Vec<Effect> =
            transition.map(|t| Effect::Record(t.record(&self.env.server, &id, now.wall_ms))).into_iter().collect();
        if let Some(permit) = &permit {
            effects.extend(self.core.on_breaker_permit(permit, now));
        }
        if matches!(permit, Some(Permit::Wait { .. })) {
            let mut changes = changes;
            ctx.spawn(async move { changes.changed().await.is_ok() }.into_actor(self).map(|changed, act, ctx| {
                if changed {
                    let effects = act.core.on_breaker_changed(act.env.now());
                    act.apply(effects, ctx);
                }
            }));
        }
        if !effects.is_empty() {
            ctx.spawn(actix::fut::ready(()).map(move |_, act: &mut Self, ctx| act.apply(effects, ctx)));
        }
    }

    /// Asks the advisor actor; its answer goes back into the core, which decides.
    pub(super) fn start_consultation(&mut self, request: AdviceRequest, ctx: &mut Context<Self>) {
        let Some(advisor) = self.env.advisor.get() else {
            let answer = heuristic_answer(&request.situation, &self.cfg.advisor, Source::NoModel);
            let effects = self.core.on_advice(&request, &answer, self.env.now());
            // Deferred: `apply` is running; the answer is applied as its own step.
            ctx.spawn(actix::fut::ready(()).map(move |_, act: &mut Self, ctx| act.apply(effects, ctx)));
            return;
        };
        let consult = Consult {
            server: self.env.server.to_string(),
            session: self.core.id().to_string(),
            situation: request.situation.clone(),
            reads: Arc::clone(&self.env.engine) as Arc<dyn Reads>,
            redactor: self.cfg.redactor.clone(),
        };
        ctx.spawn(advisor.send(consult).into_actor(self).map(move |answer, act, ctx| {
            let answer = answer.unwrap_or_else(|_| {
                heuristic_answer(&request.situation, &act.cfg.advisor, Source::Fallback("advisor stopped".into()))
            });
            let effects = act.core.on_advice(&request, &answer, act.env.now());
            act.apply(effects, ctx);
        }));
    }

    /// Runs one hand-off step; the core journals it, the state is persisted, and the
    /// next step (if any) follows — so a restart resumes at the step it was in.
    pub(super) fn start_handoff_step(&mut self, order: HandoffOrder, ctx: &mut Context<Self>) {
        // Not counted in `in_flight`: shutdown need not wait for a hand-off, whose every
        // step is resumed from the ledger after a restart.
        let env = self.env.clone();
        let cfg = Arc::clone(&self.cfg);
        let work = async move {
            let tools = Tools {
                out: env.outbound(),
                lifecycle: env.engine.as_ref(),
                ledger: env.ledger.as_ref(),
                workspace: env.workspace.as_ref(),
                cfg: &cfg.handoff,
                redactor: &cfg.redactor,
                scratch: &env.scratch,
                wall_ms: env.clock.wall_ms(),
                poll: (cfg.recovery.abort_poll_interval, cfg.recovery.abort_poll_max),
            };
            let report = run_step(&order, &tools).await;
            (order, report)
        };
        ctx.spawn(work.into_actor(self).map(|(order, report), act, ctx| {
            let effects = act.core.on_handoff_step(&order, &report, act.env.now());
            act.apply(effects, ctx);
        }));
    }

    pub(super) fn start_compaction(&mut self, order: CompactOrder, ctx: &mut Context<Self>) {
        let env = self.env.clone();
        let max_wait = self.cfg.compaction.max_wait;
        let work = async move {
            let result = summarize_within(env.engine.as_ref(), &order.session_id, &order.model, max_wait).await;
            (order, result)
        };
        ctx.spawn(work.into_actor(self).map(|(order, result), act, ctx| {
            let effects = act.core.on_compaction_finished(&order, result, act.env.now());
            act.apply(effects, ctx);
        }));
    }
}

