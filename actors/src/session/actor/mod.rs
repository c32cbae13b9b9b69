//! The session actor: a thin shell around [`SessionCore`].
//!
//! It feeds events in, keeps one timer armed at the core's next deadline, and carries
//! out the effects (journal records, the recovery procedure). Policy lives in the core;
//! if a handler here grows an `if` about policy, move it there.
//!
//! Parts: [`env`] (what the actors of one server share: `SessionEnv`, `ModelWindows`;
//! `Scratch` is the hand-off's, re-exported here), [`effects`] (carrying out the core's
//! effects; writing the durable state), [`timer`] (the one timer at the core's
//! deadline, held back while the stream is behind), [`runner`] (the one place an
//! effect becomes a procedure — recovery, delivery, hand-off step, compaction,
//! consultation, finishing an open intent — and its report goes back to the core),
//! [`breaker`] (the provider breaker, asked and told), [`open_intents`] (what a crash
//! left open, found), [`messages`] (what the
//! supervisor tells a session) and [`requests`] (what the control API asks of one).
//! This file keeps the actor's state, its start (resuming from the ledger), its stop,
//! and the detail it publishes for readers ([`crate::session::view`]).

mod breaker;
mod effects;
mod env;
mod messages;
mod open_intents;
mod requests;
mod runner;
mod timer;

pub use crate::session::procedures::hand_over::Scratch;
pub use env::{ModelWindows, SessionEnv};
pub use messages::{
    Blind, CheckInterrupted, ChildObserve, Evict, Hydrate, Observe, ObserveRead, Reconfigure, RefreshTodos, ResumeIntents, Retire,
    Sighted, StopSession,
};
pub use requests::{DeliverCustom, Inspect, RequestHandoff, ResumeSnapshot, SetHold};

use std::num::NonZeroU64;
use std::sync::Arc;

use actix::prelude::*;

use crate::advisor::actor::{heuristic_answer, AdvisorSlot, Consult};
use crate::advisor::gate::AdviceRequest;
use crate::advisor::{Consulted, Source};
use crate::config::SessionRules;
use crate::control::{ControlError, CustomPromptReply, CustomPromptRequest};
use crate::control::{HandoffView, PauseView, SessionDetail};
use crate::event::{Event, ModelRef, SessionInfo, Todo};
use crate::guard::PromptGuard;
use crate::journal::{ActionRecord, Journal, LastAction};
use crate::ledger::{DurableState, Intent, Ledger, LedgerError};
use crate::ports::{Clock, Engine, Reads, Workspace};
use crate::session::breaker::{Permit, ProviderBreaker};
use crate::session::core::{
    BreakerCall, CompactOrder, Effect, HoldScope, Now, Pause, RecoveryOrder, RecoveryReport, SessionCore, TodoReread,
};
use crate::session::procedures::deliver::{Delivery, Outbound, PromptOrder};
use crate::session::procedures::finish::{finish, same_action, FinishOrder, FinishReport};
use crate::session::procedures::hand_over::{run_step, HandoffOrder, StepReport, Tools};
use crate::session::procedures::in_flight::InFlight;
use crate::session::procedures::recover::recover;
use crate::session::view::{self, DetailCell, PublishedDetail};
use runner::Procedure;

/// One OpenCode session.
pub struct SessionActor {
    core: SessionCore,
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
    /// The state changed while a write was under way: written once that one is done.
    save_pending: bool,
    /// Records whose write failed: they go with the next state write (the retry's).
    /// Empty (no allocation) unless the ledger failed.
    unwritten: Vec<ActionRecord>,
    /// The session's status as its events show it, while a procedure that aborts
    /// waits on it (`None` otherwise).
    status_feed: Option<crate::session::procedures::abort_and_wait::StatusFeed>,
    /// What readers see of this session without asking it (shared with its registry
    /// slot), and the fingerprint of the detail last published there.
    view: Arc<DetailCell>,
    shown: Option<NonZeroU64>,
}

impl SessionActor {
    pub fn new(id: &str, cfg: Arc<SessionRules>, env: Arc<SessionEnv>) -> Self {
        Self::with_shared_id(id.into(), cfg, env)
    }

    /// [`SessionActor::new`] with the id the registry keys the session by (one copy).
    pub fn with_shared_id(id: Arc<str>, cfg: Arc<SessionRules>, env: Arc<SessionEnv>) -> Self {
        let core = SessionCore::with_shared_id(Arc::clone(&env.server), id, cfg, env.now());
        Self {
            core,
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
            save_pending: false,
            unwritten: Vec::new(),
            status_feed: None,
            view: Arc::default(),
            shown: None,
        }
    }

    /// The session rules in force (the core's: one copy, replaced on a hot reload).
    fn cfg(&self) -> &Arc<SessionRules> {
        self.core.rules()
    }

    /// The cell this actor publishes its detail in, for the registry's slot.
    pub fn view(&self) -> Arc<DetailCell> {
        Arc::clone(&self.view)
    }

    /// The time for a decision, once the deltas the pump took past the actor are in the
    /// core ([`view::Streamed`]): every way into the core asks for it first, so no
    /// decision misses a delta that was read before it.
    pub(super) fn now(&mut self) -> Now {
        self.take_streamed();
        self.env.now()
    }

    /// Feeds the deltas the pump took past the actor into the core, and publishes: the
    /// cell no longer holds them, so readers must find them in the detail (a timer that
    /// takes them in and only re-arms would otherwise leave a working session looking
    /// silent, even stalled, until its next event).
    pub(super) fn take_streamed(&mut self) {
        if let Some(streamed) = self.view.take_streamed() {
            self.core.observe_streamed(streamed.at, streamed.message);
            self.publish();
        }
    }

    /// Publishes the session's detail ([`crate::session::view`]): where its silence is
    /// counted from on every call (an atomic store), the rest only when its fingerprint
    /// moved.
    fn publish(&mut self) {
        self.view.set_silent_since(self.core.silent_since());
        match self.view.set_run(self.core.is_busy(), self.core.is_retrying()) {
            Some(true) => self.env.not_idle.leave(self.core.id()),
            Some(false) => self.env.not_idle.enter(self.core.shared_id()),
            None => {}
        }
        let fingerprint = view::fingerprint(&self.core, self.last_action);
        if self.shown == Some(fingerprint) {
            return;
        }
        self.view.publish(Arc::new(PublishedDetail::of(&self.core, self.last_action)));
        self.shown = Some(fingerprint);
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
        // Not idle until it says so; left in `stopped`, which follows every start.
        self.env.not_idle.enter(self.core.shared_id());
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
                    let now = act.now();
                    let effects = act.core.resume_interrupted_handoff(now);
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

    /// The pump notes no more deltas for this actor (they would never be taken).
    fn stopped(&mut self, _: &mut Context<Self>) {
        self.view.stop();
        if !self.view.thinks_idle() {
            self.env.not_idle.leave(self.core.id());
        }
    }
}
