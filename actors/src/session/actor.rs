//! The session actor: a thin shell around [`SessionCore`].
//!
//! It feeds events in, keeps one timer armed at the core's next deadline, and carries
//! out the effects (journal records, the recovery procedure). Policy lives in the core;
//! if a handler here grows an `if` about policy, move it there.

use std::sync::Arc;

use actix::prelude::*;

use crate::advisor::actor::{heuristic_answer, AdvisorSlot, Consult};
use crate::advisor::gate::AdviceRequest;
use crate::advisor::Source;
use crate::config::SessionRules;
use crate::control::{ControlError, CustomPromptReply, CustomPromptRequest};
use crate::control::{HandoffView, PauseView, SessionDetail};
use crate::event::{Event, ModelRef, SessionInfo, Todo};
use crate::guard::PromptGuard;
use crate::journal::{Journal, LastAction};
use crate::ledger::{DurableState, Intent, IntentKind, IntentStep, Ledger, LedgerError};
use crate::ports::{Clock, Engine, Workspace};
use crate::session::breaker::{Permit, ProviderBreaker};
use crate::session::core::{
    BreakerCall, CompactOrder, Effect, HoldScope, Now, Pause, RecoveryOrder, RecoveryReport, SessionCore,
};
use crate::session::delivery::{deliver, Delivery, Outbound, PromptKind, PromptOrder};
use crate::session::handover::{run_step, HandoffOrder, Tools};
use crate::session::recovery::{end_intent, may_have_arrived, recover, write_intent, InFlight};
use crate::session::unfinished::{finish, same_action, FinishOrder};

/// What every session actor of one server shares (one `Arc` for all of them).
pub struct SessionEnv {
    pub server: Arc<str>,
    pub engine: Arc<dyn Engine>,
    pub clock: Arc<dyn Clock>,
    pub journal: Journal,
    pub in_flight: InFlight,
    /// This Shepherd instance's id, written into the metadata of its prompts.
    pub instance: String,
    /// Where durable state and the journal go.
    pub ledger: Arc<dyn Ledger>,
    /// Context windows of this server's models.
    pub windows: Arc<ModelWindows>,
    /// The sessions' directories as Shepherd can see them (read-only `git`).
    pub workspace: Arc<dyn Workspace>,
    /// Sessions Shepherd made for its own questions: the supervisor leaves them alone.
    pub scratch: Scratch,
    /// The guard every prompt passes (dedupe, rate limits, leases).
    pub guard: Arc<dyn PromptGuard>,
    /// The advisor (`advisor.enabled`); without it advice comes from the heuristic.
    pub advisor: AdvisorSlot,
    /// The circuit breaker of this server's model provider.
    pub breaker: Arc<ProviderBreaker>,
    /// Up to when this server's events are handled: deadlines fall due in it.
    pub stream: Arc<crate::stream_clock::StreamClock>,
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

/// Context windows of one server's models (`provider/model` → tokens), read by the
/// supervisor and looked up by each session when its model or the table changes.
#[derive(Debug, Default)]
pub struct ModelWindows {
    table: std::sync::RwLock<std::collections::HashMap<String, u64>>,
    /// Bumped on every replacement, so sessions look up again only then.
    generation: std::sync::atomic::AtomicU64,
}

impl ModelWindows {
    pub fn replace(&self, table: std::collections::HashMap<String, u64>) {
        if let Ok(mut t) = self.table.write() {
            *t = table;
        }
        self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn get(&self, model: &ModelRef) -> Option<u64> {
        let key = format!("{}/{}", model.provider_id, model.model_id);
        self.table.read().ok()?.get(&key).copied()
    }
}

impl SessionEnv {
    pub fn now(&self) -> Now {
        Now { mono: self.clock.now(), wall_ms: self.clock.wall_ms() }
    }

    /// Where this server's prompts go, through the guard.
    pub fn outbound(&self) -> Outbound<'_> {
        Outbound {
            server: &self.server,
            engine: self.engine.as_ref(),
            guard: self.guard.as_ref(),
            instance: &self.instance,
            lease: None,
        }
    }
}

/// How long a failed state write waits before it is tried again. Not a tuning knob:
/// a ledger that fails is logged and counted; this only keeps the retry from spinning.
const SAVE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// One OpenCode session.
pub struct SessionActor {
    core: SessionCore,
    cfg: Arc<SessionRules>,
    env: Arc<SessionEnv>,
    /// The armed timer and when it fires.
    timer: Option<(SpawnHandle, tokio::time::Instant)>,
    /// A stop arrived during a recovery: stop once it has finished.
    stop_after_recovery: bool,
    /// What the latest record about this session was, and when.
    last_action: Option<LastAction>,
    /// The core's durable generation when the state was last written or loaded (to
    /// write only changes); `None` until then.
    saved_generation: Option<u64>,
    /// A record was made since the last write (its action is part of the state).
    record_unsaved: bool,
    /// The last action as the ledger had it (name, epoch ms), until this actor records
    /// one of its own. Boxed: only sessions loaded from the ledger have one.
    loaded_last_action: Option<Box<(Option<String>, Option<i64>)>>,
    /// (window table, core model) generations at the last window lookup.
    window_seen: Option<(u64, u64)>,
    /// Decisions whose procedure runs in this actor now: their intents are open in the
    /// ledger but not left behind by a crash, so a reconnect does not resume them.
    running: Vec<String>,
    /// A failed state write is retried (once armed, until a write succeeds).
    save_retry: Option<SpawnHandle>,
    /// The generation whose write is under way (not written again meanwhile).
    saving_generation: Option<u64>,
}

impl SessionActor {
    pub fn new(id: &str, cfg: Arc<SessionRules>, env: Arc<SessionEnv>) -> Self {
        let core = SessionCore::new(Arc::clone(&env.server), id, Arc::clone(&cfg), env.now());
        Self {
            core,
            cfg,
            env,
            timer: None,
            stop_after_recovery: false,
            last_action: None,
            saved_generation: None,
            record_unsaved: false,
            loaded_last_action: None,
            window_seen: None,
            running: Vec::new(),
            save_retry: None,
            saving_generation: None,
        }
    }

    fn apply(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Record(r) => {
                    // The one door of every record: the ledger, the journal's log line and
                    // its subscribers (status, history, `/v1/status`, toasts, metrics).
                    let r = r.redacted(&self.cfg.redactor);
                    self.last_action = Some(LastAction::from(&r));
                    self.record_unsaved = true;
                    let ledger = Arc::clone(&self.env.ledger);
                    let entry = r.clone();
                    ctx.spawn(
                        async move {
                            if let Err(e) = ledger.append(&entry).await {
                                tracing::warn!(server = %entry.server, session = %entry.session, error = %e, "ledger: journal write failed");
                            }
                        }
                        .into_actor(self),
                    );
                    self.env.journal.record(r);
                }
                Effect::Recover(order) => self.start_recovery(order, ctx),
                Effect::Prompt(order) => self.start_delivery(order, ctx),
                Effect::Compact(order) => self.start_compaction(order, ctx),
                Effect::HandOff(order) => self.start_handoff_step(order, ctx),
                Effect::Advise(request) => self.start_consultation(request, ctx),
                Effect::Finish(order) => self.start_finish(order, ctx),
                Effect::FindIntents => self.find_open_intents(ctx),
                Effect::Breaker(call) => self.call_breaker(call, ctx),
                Effect::Stop => ctx.stop(),
            }
        }
        self.persist(ctx);
        self.rearm(ctx);
    }

    /// Writes the durable state when it changed since the last write: the core counts
    /// its changes, so most events (deltas, part updates) cost one comparison here. The
    /// state counts as saved only once the write succeeded; a failed write is retried
    /// [`SAVE_RETRY`] later with the state as it is then, so a restart never acts again
    /// on an edge whose handling was not written.
    fn persist(&mut self, ctx: &mut Context<Self>) {
        let generation = self.core.durable_generation();
        let written_or_writing =
            self.saved_generation == Some(generation) || self.saving_generation == Some(generation);
        if written_or_writing && !self.record_unsaved {
            return;
        }
        self.record_unsaved = false;
        self.saving_generation = Some(generation);
        let state = self.durable_state();
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        ctx.spawn(async move { ledger.save(&server, &id, &state).await }.into_actor(self).map(
            move |saved, act, ctx| match saved {
                Ok(()) => {
                    act.saved_generation = Some(generation);
                    if act.saving_generation == Some(generation) {
                        act.saving_generation = None;
                    }
                }
                Err(e) => {
                    if act.saving_generation == Some(generation) {
                        act.saving_generation = None;
                    }
                    tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, retry_in_ms = SAVE_RETRY.as_millis() as u64, "ledger: state write failed; retrying");
                    act.record_unsaved = true;
                    if act.save_retry.is_none() {
                        act.save_retry = Some(ctx.run_later(SAVE_RETRY, |act, ctx| {
                            act.save_retry = None;
                            act.persist(ctx);
                        }));
                    }
                }
            },
        ));
    }

    /// The core's durable state plus the latest record.
    fn durable_state(&self) -> DurableState {
        let mut state = self.core.export(self.env.now());
        if let Some(r) = &self.last_action {
            state.last_action = Some(format!("{}:{}", r.action.as_str(), r.outcome.as_str()));
            state.last_action_ms = Some(r.at_ms);
        } else {
            (state.last_action, state.last_action_ms) = self.loaded_last_action.as_deref().cloned().unwrap_or_default();
        }
        state
    }

    /// Keeps at most one timer, never later than the core's next deadline. Activity
    /// only pushes a busy session's deadline back, so the timer is left where it is
    /// and, when it fires early, re-armed at the deadline then: one timer per stall
    /// timeout instead of a cancel and a new timer per event. A session without a
    /// deadline (idle) has no timer: it wakes nothing.
    fn rearm(&mut self, ctx: &mut Context<Self>) {
        let deadline = self.core.deadline();
        if let Some((handle, armed)) = self.timer {
            if deadline.is_some_and(|d| armed <= d) {
                return; // fires first; re-armed then
            }
            ctx.cancel_future(handle);
            self.timer = None;
        }
        let Some(deadline) = deadline else { return };
        let delay = deadline.saturating_duration_since(self.env.clock.now());
        let handle = ctx.run_later(delay, |act, ctx| act.on_timer(ctx));
        self.timer = Some((handle, deadline));
    }

    /// The timer fired. A deadline that has passed in wall time falls due only once
    /// stream time has reached it too: an event the server sent before it, still waiting
    /// to be read or handled, is not silence ([`crate::stream_clock`]). Until then the
    /// timer waits on the stream clock instead, and looks again when woken.
    fn on_timer(&mut self, ctx: &mut Context<Self>) {
        self.timer = None;
        let now = self.env.clock.now();
        let Some(deadline) = self.core.deadline().filter(|d| *d <= now) else {
            self.rearm(ctx); // the deadline moved later meanwhile
            return;
        };
        if let Some(woken) = self.env.stream.wake_when(deadline, now) {
            tracing::debug!(
                server = %self.env.server,
                session = %self.core.id(),
                behind_ms = self.env.stream.lag(now).as_millis() as u64,
                "deadline passed while events are still waiting to be handled: waiting for them"
            );
            let handle = ctx.spawn(async move { drop(woken.await) }.into_actor(self).map(|(), act, ctx| act.on_timer(ctx)));
            self.timer = Some((handle, deadline));
            return;
        }
        let effects = self.core.on_deadline(self.env.now());
        self.apply(effects, ctx);
    }

    fn start_recovery(&mut self, order: RecoveryOrder, ctx: &mut Context<Self>) {
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
}

impl SessionActor {
    fn start_delivery(&mut self, order: PromptOrder, ctx: &mut Context<Self>) {
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
    fn start_finish(&mut self, order: FinishOrder, ctx: &mut Context<Self>) {
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
    fn find_open_intents(&mut self, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let find = async move { ledger.open_intents(&server, Some(&id)).await };
        ctx.spawn(find.into_actor(self).map(|found, act, ctx| act.open_intents_found(found, ctx)));
    }

    /// Hands the open intents read from the ledger to the core — even none: the core
    /// learns the search is over (its stall clock waits for it). Those of procedures
    /// running here now are not open.
    fn open_intents_found(&mut self, found: Result<Vec<Intent>, LedgerError>, ctx: &mut Context<Self>) {
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
                self.rearm(ctx);
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
async fn deliver_with_intent(env: &SessionEnv, order: &PromptOrder) -> Delivery {
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
    fn call_breaker(&mut self, call: BreakerCall, ctx: &mut Context<Self>) {
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
    fn start_consultation(&mut self, request: AdviceRequest, ctx: &mut Context<Self>) {
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
            engine: Arc::clone(&self.env.engine),
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
    fn start_handoff_step(&mut self, order: HandoffOrder, ctx: &mut Context<Self>) {
        // Not counted in `in_flight`: shutdown need not wait for a hand-off, whose every
        // step is resumed from the ledger after a restart.
        let env = self.env.clone();
        let cfg = Arc::clone(&self.cfg);
        let work = async move {
            let tools = Tools {
                out: env.outbound(),
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

    fn start_compaction(&mut self, order: CompactOrder, ctx: &mut Context<Self>) {
        let env = self.env.clone();
        let max_wait = self.cfg.compaction.max_wait;
        let work = async move {
            let call = env.engine.summarize(&order.session_id, &order.model);
            let result = match tokio::time::timeout(max_wait, call).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("not finished after compaction.max_wait ({max_wait:?})")),
            };
            (order, result)
        };
        ctx.spawn(work.into_actor(self).map(|(order, result), act, ctx| {
            let effects = act.core.on_compaction_finished(&order, result, act.env.now());
            act.apply(effects, ctx);
        }));
    }

    /// Looks the session's model up in the server's window table, when the model or
    /// the table changed since the last look (not on every event).
    fn learn_window(&mut self) {
        let Some(model) = self.core.model() else { return };
        let seen = (self.env.windows.generation(), self.core.model_generation());
        if self.window_seen == Some(seen) {
            return;
        }
        self.window_seen = Some(seen);
        let window = self.env.windows.get(model);
        self.core.set_window(window);
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    /// Resumes from the ledger before handling any event, so an evicted or
    /// rediscovered session, or one seen again after a restart, repeats nothing.
    fn started(&mut self, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let load = async move { (ledger.load(&server, &id).await, ledger.open_intents(&server, Some(&id)).await) };
        ctx.wait(load.into_actor(self).map(|(loaded, intents), act, ctx| {
            match loaded {
                Ok(Some(state)) => {
                    act.core.restore(&state, act.env.now());
                    act.loaded_last_action = (state.last_action.is_some() || state.last_action_ms.is_some())
                        .then(|| Box::new((state.last_action.clone(), state.last_action_ms)));
                    act.saved_generation = Some(act.core.durable_generation());
                    let effects = act.core.resume_interrupted_handoff(act.env.now());
                    if !effects.is_empty() {
                        act.apply(effects, ctx);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    server = %act.env.server, session = %act.core.id(), error = %e,
                    "ledger: could not load this session's state; starting from what events show"
                ),
            }
            // Actions a crash left open: finished once the state is back.
            act.open_intents_found(intents, ctx);
        }));
    }

    /// A session is not stopped half-way through a recovery: an abort is always
    /// followed by its continue (or a record saying it was not sent).
    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        if self.core.is_recovering() {
            self.stop_after_recovery = true;
            Running::Continue
        } else {
            Running::Stop
        }
    }
}

/// One event of this session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Observe(pub Event);

impl Handler<Observe> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Observe, ctx: &mut Context<Self>) {
        let effects = self.core.observe(&msg.0, self.env.now());
        self.learn_window();
        self.apply(effects, ctx);
    }
}

/// The session's description, read by REST when the actor was created mid-flight.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Hydrate(pub SessionInfo);

impl Handler<Hydrate> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Hydrate, ctx: &mut Context<Self>) {
        self.core.hydrate(&msg.0);
        self.rearm(ctx);
    }
}

/// New session rules (hot reload): decisions from now on use them. The timer is
/// re-armed at once, so a stall timeout that got shorter fires at its new deadline
/// (immediately if that has passed), not at the old one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure(pub Arc<SessionRules>);

impl Handler<Reconfigure> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        self.cfg = Arc::clone(&msg.0);
        self.core.set_config(msg.0);
        self.rearm(ctx);
    }
}

/// What Shepherd knows about this session (status, control API, tests).
#[derive(Message)]
#[rtype(result = "SessionDetail")]
pub struct Inspect;

impl Handler<Inspect> for SessionActor {
    type Result = MessageResult<Inspect>;

    fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
        let now = self.env.now();
        let quiet_ms = i64::try_from(self.core.quiet_for(now).as_millis()).unwrap_or(i64::MAX);
        MessageResult(SessionDetail {
            server: self.env.server.to_string(),
            id: self.core.id().to_string(),
            // Raw: redacted where it leaves, on the reader's thread (`SessionDetail::redacted`):
            // the status writer reads every session at each refresh, and redacting here
            // would cost the actors' thread that much per refresh.
            title: self.core.title().map(str::to_string),
            directory: self.core.directory().map(str::to_string),
            busy: self.core.is_busy(),
            waiting_on_person: self.core.waits_on_person(),
            last_activity_ms: now.wall_ms.saturating_sub(quiet_ms),
            stall_timeout_ms: self.core.stall_clock().map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            recovering: self.core.is_recovering(),
            paused: self.core.pause().map(|p| p.as_str().to_string()),
            attempts: self.core.attempts(),
            todos: self.core.todos().to_vec(),
            context_tokens: self.core.context().0,
            context_window: self.core.context().1,
            context_percent: self.core.context_share().map(|s| (s * 1000.0).round() / 10.0),
            compacting: self.core.is_compacting(),
            last_action: self.last_action,
            handoff: HandoffView::of(self.core.handoff()),
        })
    }
}

/// Stops the actor (its timer would otherwise keep it alive).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopSession;

impl Handler<StopSession> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: StopSession, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// The session's server left the configuration (hot reload): write the durable state,
/// then stop, whatever the session is doing. A recovery under way still finishes first
/// ([`Actor::stopping`]), so an abort is never left without its continue.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retire;

impl Handler<Retire> for SessionActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Retire, _: &mut Context<Self>) -> Self::Result {
        let state = self.durable_state();
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        Box::pin(async move { ledger.save(&server, &id, &state).await }.into_actor(self).map(|saved, act, ctx| {
            if let Err(e) = saved {
                tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, "ledger: state write failed before the session was released");
            }
            ctx.stop();
        }))
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
        let base = match (&req.custom_prompt, &req.message) {
            (Some(t), _) | (None, Some(t)) if !t.trim().is_empty() => t.clone(),
            _ => {
                let err =
                    ControlError::BadRequest { field: "message".into(), reason: "required (or custom_prompt)".into() };
                return Box::pin(actix::fut::ready(Err(err)));
            }
        };
        let mut template = base;
        if req.include_todo_context {
            template.push_str("\n\nOpen todos ({pending} of {total}):\n{todoList}");
        }
        if req.include_context_summary {
            template.push_str("\n\n{contextSummary}");
        }
        let now = self.env.now();
        let order = self.core.custom_order(template, now);
        let summary = order.facts.context_summary.clone();
        let env = self.env.clone();
        let work = async move {
            let delivery = deliver_with_intent(&env, &order).await;
            (order, delivery)
        };
        Box::pin(work.into_actor(self).map(move |(order, delivery), act, ctx| {
            let effects = act.core.on_prompt_finished(&order, &delivery, act.env.now());
            act.apply(effects, ctx);
            let todos = delivery.todos().map_or_else(|| order.known_todos.clone(), <[_]>::to_vec);
            let (success, message, reason) = match delivery {
                Delivery::Sent { text, .. } => (true, text, None),
                Delivery::Skipped { reason, .. } => (false, String::new(), Some(reason.to_string())),
                Delivery::Guarded { reason, .. } => (false, String::new(), Some(reason)),
                Delivery::Failed { error } => (false, String::new(), Some(error.to_string())),
            };
            // Echoed to the caller (and whatever logs its answers): redacted like all output.
            let redactor = &act.cfg.redactor;
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

/// Re-read the todo list by REST (after a reconnect: `todo.updated` events may have
/// been missed) and feed it in as if it had arrived as an event.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RefreshTodos;

impl Handler<RefreshTodos> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: RefreshTodos, ctx: &mut Context<Self>) {
        // Only where a missed update could matter: a session that is busy or has a list.
        if !self.core.is_busy() && self.core.todos().is_empty() {
            return;
        }
        let engine = Arc::clone(&self.env.engine);
        let id = self.core.id().to_string();
        let work = async move { engine.todos(&id).await.map(|todos| (id, todos)) };
        ctx.spawn(work.into_actor(self).map(|result, act, ctx| match result {
            Ok((_, todos)) => {
                let effects = act.core.on_todos_refreshed(todos, act.env.now());
                act.apply(effects, ctx);
            }
            Err(e) => tracing::debug!(server = %act.env.server, session = %act.core.id(), error = %e, "could not re-read todos"),
        }));
    }
}

/// Idle cleanup: write the durable state, then stop. Nothing is forgotten: a later
/// event or rediscovery creates a new actor that resumes from the ledger.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Evict;

impl Handler<Evict> for SessionActor {
    type Result = ResponseActFuture<Self, bool>;

    fn handle(&mut self, _: Evict, _: &mut Context<Self>) -> Self::Result {
        // A session with a resume scheduled stays: nothing else would wake it; so does
        // one the person paused (a timed pause ends on this actor's timer).
        if self.core.is_recovering()
            || self.core.pause() == Some(Pause::Person)
            || self.core.is_busy()
            || self.core.handoff().phase().is_running()
            || self.core.resume_pending()
        {
            return Box::pin(actix::fut::ready(false));
        }
        let state = self.durable_state();
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        Box::pin(
            async move { ledger.save(&server, &id, &state).await }.into_actor(self).map(|saved, act, ctx| {
                match saved {
                    Ok(()) => {
                        ctx.stop();
                        true
                    }
                    Err(e) => {
                        tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, "ledger: not evicting, state could not be written");
                        false
                    }
                }
            }),
        )
    }
}

/// After a reconnect the status endpoint says this session is idle: if the core still
/// believed it busy, look at how its last turn ended (a server restart leaves it cut off).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckInterrupted;

impl Handler<CheckInterrupted> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: CheckInterrupted, ctx: &mut Context<Self>) {
        if !self.core.is_busy() || self.core.is_recovering() {
            return;
        }
        let engine = Arc::clone(&self.env.engine);
        let id = self.core.id().to_string();
        let poll = (self.cfg.recovery.abort_poll_interval, self.cfg.recovery.abort_poll_max);
        // `wait`: the idle status that follows must not be applied before this check.
        ctx.wait(async move { read_last_turn(&*engine, &id, poll).await }.into_actor(self).map(|turn, act, ctx| match turn {
            Ok(Some(turn)) if turn.interrupted() => {
                let effects = act.core.on_interrupted(&turn.message_id, act.env.now());
                act.apply(effects, ctx);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, "could not read the last turn after a reconnect"),
        }));
    }
}

/// The session's last turn, the read tried again every `poll.0` for up to `poll.1` after
/// the first failure (a 5xx, a timeout: a timed-out read alone can outlast `poll.1`):
/// once the idle status that follows is applied nothing looks again, so one failed read
/// would cost a cut-off turn its continue. A read is safe to repeat; the session actor
/// waits meanwhile.
async fn read_last_turn(
    engine: &dyn Engine,
    id: &str,
    (every, max): (std::time::Duration, std::time::Duration),
) -> Result<Option<crate::ports::LastTurn>, crate::ports::EngineError> {
    let mut give_up = None;
    loop {
        match engine.last_turn(id).await {
            Err(e) if !matches!(e, crate::ports::EngineError::NotFound(_)) => {
                let now = tokio::time::Instant::now();
                if now >= *give_up.get_or_insert(now + max) {
                    return Err(e);
                }
                tracing::debug!(session = %id, error = %e, "could not read the last turn after a reconnect; trying again");
                tokio::time::sleep(every).await;
            }
            done => return done,
        }
    }
}

/// After a reconnect: finish this session's actions left open (intents in the ledger
/// whose procedure is not running here).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResumeIntents;

impl Handler<ResumeIntents> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: ResumeIntents, ctx: &mut Context<Self>) {
        self.find_open_intents(ctx);
    }
}

/// The server's event stream went down: the clocks that measure this session's silence
/// stop (the core decides which), so its timer is cancelled unless something else is due.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Blind;

impl Handler<Blind> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Blind, ctx: &mut Context<Self>) {
        self.core.on_blind();
        self.rearm(ctx);
    }
}

/// The stream is back and the reconciliation has run (sent after its statuses and
/// interrupted-turn checks): silence is counted from now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Sighted;

impl Handler<Sighted> for SessionActor {
    type Result = ();

    fn handle(&mut self, _: Sighted, ctx: &mut Context<Self>) {
        self.core.on_sight(self.env.now());
        self.rearm(ctx);
    }
}

/// An event of a subagent session this session started.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ChildObserve {
    pub child: String,
    pub event: Event,
}

impl Handler<ChildObserve> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ChildObserve, ctx: &mut Context<Self>) {
        let effects = self.core.on_child_event(&msg.child, &msg.event, self.env.now());
        self.apply(effects, ctx);
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
        let now = self.env.now();
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
        let effects = self.core.request_handoff(self.env.now()).map_err(ControlError::Conflict)?;
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
        let effects = self.core.resume_snapshot(&msg.0, self.env.now()).map_err(ControlError::Conflict)?;
        self.apply(effects, ctx);
        Ok(HandoffView::of(self.core.handoff()))
    }
}
