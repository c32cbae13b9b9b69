//! The session's one timer: armed at the core's next deadline, and firing only once
//! stream time has reached it too (an event still unread is not silence).
//!
//! The clocks are named in the core — the stall's, the nudge's, the review's, the
//! hand-off's drain, a back-off, a person's pause — each in its behaviour's file, and
//! the arbiter (`core/arbiter.rs`) says which acts first when several are due. The
//! actor keeps one actix timer at the earliest of them, not one per kind: actix polls
//! every future an actor holds on each message, so each more timer of a busy session
//! would cost another poll per event (one timer measured ~5 % of a server's thread in
//! the fleet bench) and another boxed future and timer entry (~0.1 KB) per session.

use super::*;

impl SessionActor {
    /// After anything that may have changed the core: the session's detail is published
    /// for readers ([`crate::session::view`]) and the timer re-armed. Every handler that
    /// changes the core ends here (directly or through `apply`).
    pub(super) fn settle(&mut self, ctx: &mut Context<Self>) {
        self.publish();
        self.rearm(ctx);
    }

    /// Keeps at most one timer, never later than the core's next deadline. Activity
    /// only pushes a busy session's deadline back, so the timer is left where it is
    /// and, when it fires early, re-armed at the deadline then: one timer per stall
    /// timeout instead of a cancel and a new timer per event. A session without a
    /// deadline (idle) has no timer: it wakes nothing.
    pub(super) fn rearm(&mut self, ctx: &mut Context<Self>) {
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
        self.take_streamed(); // a delta read since moves the deadline
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
        // Stream time has passed the deadline, so every delta read before it has been
        // noted (the pump notes a read's deltas before it lets go of the read's mark):
        // take them in, and look again.
        self.take_streamed();
        if self.core.deadline().is_none_or(|d| d > now) {
            self.rearm(ctx);
            return;
        }
        let now = self.env.now();
        let effects = self.core.on_deadline(now);
        self.apply(effects, ctx);
    }
}
