//! What the supervisor tells a session actor: its events (and its subagents'), its
//! description, new rules, the stream going blind and coming back, checks after a
//! reconnect, and when to write its state and stop.

use super::*;

/// One event of this session.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Observe(pub Event);

impl Handler<Observe> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: Observe, ctx: &mut Context<Self>) {
        if let Some(feed) = &self.status_feed {
            feed.observe(&msg.0);
        }
        let now = self.now();
        let effects = self.core.observe(&msg.0, now);
        self.learn_window();
        self.apply(effects, ctx);
    }
}

/// One event of this session from a read of the stream, with the read's mark: the mark
/// is dropped once the event is handled, so the server's stream time passes the read only
/// when every session it spoke of has taken in its part ([`crate::stream_clock`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ObserveRead(pub Event, pub crate::stream_clock::ReadToken);

impl Handler<ObserveRead> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: ObserveRead, ctx: &mut Context<Self>) {
        let ObserveRead(event, read) = msg;
        self.handle(Observe(event), ctx);
        drop(read);
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
        self.settle(ctx);
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
        self.core.set_config(msg.0);
        self.settle(ctx);
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
        let unwritten = std::mem::take(&mut self.unwritten);
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let write = async move { ledger.write(&server, &id, &unwritten, Some(&state)).await };
        Box::pin(write.into_actor(self).map(|saved, act, ctx| {
            if let Err(e) = saved {
                tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, "ledger: state write failed before the session was released");
            }
            ctx.stop();
        }))
    }
}

/// Re-read the todo list by REST after a reconnect (`todo.updated` events may have been
/// missed) and feed it in as if it had arrived as an event — where a turn may have
/// changed it ([`SessionCore::todo_reread`](crate::session::core::SessionCore::todo_reread)).
/// The session's last turn is read too: a busy session's running tools get their grace,
/// and after a turn that ended unseen, how it ended decides what follows it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RefreshTodos {
    /// The session's `time.updated` in the listing read after the reconnect (`None`:
    /// not listed).
    pub listed_updated_ms: Option<i64>,
    /// Since when nobody watched the server's stream, when the ledger knows (its
    /// `watched_until`, less a margin for clocks, at most an hour back).
    pub unwatched_since: Option<i64>,
}

impl Handler<RefreshTodos> for SessionActor {
    type Result = ();

    fn handle(&mut self, msg: RefreshTodos, ctx: &mut Context<Self>) {
        let Some(why) = self.core.todo_reread(msg.listed_updated_ms, msg.unwatched_since) else { return };
        let engine = Arc::clone(&self.env.engine);
        let id = self.core.id().to_string();
        let work = async move {
            // The turn too: a busy one's running tools, an unseen one's reply.
            let turn = match why {
                TodoReread::Busy | TodoReread::AfterUnseenTurn => engine.latest_turn(&id).await,
                TodoReread::NotListed => Ok(None),
            };
            (engine.todos(&id).await, turn)
        };
        ctx.spawn(work.into_actor(self).map(move |(todos, turn), act, ctx| {
            let turn = turn.unwrap_or_else(|e| {
                tracing::debug!(server = %act.env.server, session = %act.core.id(), error = %e, "could not read the last turn after a reconnect");
                None
            });
            match todos {
                Ok(todos) => {
                    tracing::debug!(server = %act.env.server, session = %act.core.id(), why = ?why, todos = todos.len(), "todo list re-read after a reconnect");
                    let now = act.now();
                    let effects = act.core.on_todos_refreshed(todos, why, turn, now);
                    act.apply(effects, ctx);
                }
                Err(e) => tracing::debug!(server = %act.env.server, session = %act.core.id(), error = %e, "could not re-read todos"),
            }
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
        // Records a failed write left go with the state: kept if it is, kept for the
        // retry if not.
        let unwritten = std::mem::take(&mut self.unwritten);
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let write = async move {
            let saved = ledger.write(&server, &id, &unwritten, Some(&state)).await;
            (saved, unwritten)
        };
        Box::pin(
            write.into_actor(self).map(|(saved, unwritten), act, ctx| {
                match saved {
                    Ok(()) => {
                        ctx.stop();
                        true
                    }
                    Err(e) => {
                        act.unwritten.splice(0..0, unwritten);
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
        let poll = (self.cfg().recovery.abort_poll_interval, self.cfg().recovery.abort_poll_max);
        // `wait`: the idle status that follows must not be applied before this check.
        ctx.wait(async move { read_last_turn(&*engine, &id, poll).await }.into_actor(self).map(|turn, act, ctx| match turn {
            Ok(Some(turn)) if turn.interrupted() => {
                let now = act.now();
                let effects = act.core.on_interrupted(&turn.message_id, now);
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
    reads: &dyn crate::ports::Reads,
    id: &str,
    (every, max): (std::time::Duration, std::time::Duration),
) -> Result<Option<crate::ports::LastTurn>, crate::ports::EngineError> {
    let mut give_up = None;
    loop {
        match reads.last_turn(id).await {
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
        self.settle(ctx);
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
        let now = self.now();
        self.core.on_sight(now);
        self.settle(ctx);
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
        let now = self.now();
        let effects = self.core.on_child_event(&msg.child, &msg.event, now);
        self.apply(effects, ctx);
    }
}
