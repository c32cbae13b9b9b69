//! The session actor: a thin shell around [`SessionCore`].
//!
//! It feeds events in, keeps one timer armed at the core's next deadline, and carries
//! out the effects (journal records, the recovery procedure). Policy lives in the core;
//! if a handler here grows an `if` about policy, move it there.

use std::sync::Arc;

use actix::prelude::*;

use crate::config::RecoveryConfig;
use crate::event::{Event, SessionInfo};
use crate::control::SessionDetail;
use crate::journal::{ActionRecord, Journal};
use crate::ports::{Clock, Engine};
use crate::session::core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
use crate::session::recovery::{recover, InFlight};

/// What every session actor of one server shares.
#[derive(Clone)]
pub struct SessionEnv {
    pub server: String,
    pub engine: Arc<dyn Engine>,
    pub clock: Arc<dyn Clock>,
    pub journal: Journal,
    pub in_flight: InFlight,
    /// This Shepherd instance's id, written into the metadata of its prompts.
    pub instance: String,
}

impl SessionEnv {
    pub fn now(&self) -> Now {
        Now { mono: self.clock.now(), wall_ms: self.clock.wall_ms() }
    }
}

/// One OpenCode session.
pub struct SessionActor {
    core: SessionCore,
    cfg: Arc<RecoveryConfig>,
    env: SessionEnv,
    timer: Option<SpawnHandle>,
    /// A stop arrived during a recovery: stop once it has finished.
    stop_after_recovery: bool,
    /// The latest record about this session.
    last_action: Option<ActionRecord>,
}

impl SessionActor {
    pub fn new(id: &str, cfg: Arc<RecoveryConfig>, env: SessionEnv) -> Self {
        let core = SessionCore::new(env.server.clone(), id, Arc::clone(&cfg), env.now());
        Self { core, cfg, env, timer: None, stop_after_recovery: false, last_action: None }
    }

    fn apply(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Record(r) => {
                    self.last_action = Some(r.clone());
                    self.env.journal.record(r);
                }
                Effect::Recover(order) => self.start_recovery(order, ctx),
                Effect::Stop => ctx.stop(),
            }
        }
        self.rearm(ctx);
    }

    /// Keeps exactly one timer, at the core's next deadline.
    fn rearm(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(deadline) = self.core.deadline() {
            let delay = deadline.saturating_duration_since(self.env.clock.now());
            self.timer = Some(ctx.run_later(delay, |act, ctx| {
                act.timer = None;
                let effects = act.core.on_deadline(act.env.now());
                act.apply(effects, ctx);
            }));
        }
    }

    fn start_recovery(&mut self, order: RecoveryOrder, ctx: &mut Context<Self>) {
        let env = self.env.clone();
        let cfg = Arc::clone(&self.cfg);
        let guard = env.in_flight.enter();
        let work = async move {
            let report = recover(env.engine.as_ref(), &cfg, &order, &env.instance, env.in_flight.stopping()).await;
            drop(guard);
            report
        };
        // `spawn`, not `wait`: events keep flowing in while the procedure runs (our
        // own abort's events among them).
        ctx.spawn(work.into_actor(self).map(|report: RecoveryReport, act, ctx| {
            let effects = act.core.on_recovery_finished(&report, act.env.now());
            act.apply(effects, ctx);
            if act.stop_after_recovery {
                ctx.stop();
            }
        }));
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

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

/// New recovery settings (hot reload).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure(pub Arc<RecoveryConfig>);

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
        MessageResult(SessionDetail {
            server: self.env.server.clone(),
            id: self.core.id().to_string(),
            directory: self.core.directory().map(str::to_string),
            busy: self.core.is_busy(),
            recovering: self.core.is_recovering(),
            paused: self.core.pause().map(|p| p.as_str().to_string()),
            attempts: self.core.attempts(),
            todos: self.core.todos().to_vec(),
            last_action: self.last_action.clone(),
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
