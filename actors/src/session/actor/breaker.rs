//! The server's provider breaker, told of each failure and success and asked before
//! a prompt: a shared, synchronous call, not a procedure. Its answer goes back into the
//! core like any report.

use super::*;

impl SessionActor {
    /// Tells or asks the server's provider breaker. A transition is journalled; an
    /// answer goes back into the core, which decides (applied as its own step: `apply`
    /// is running). A session told to wait is woken by the breaker's next transition.
    pub(super) fn call_breaker(&mut self, call: BreakerCall, ctx: &mut Context<Self>) {
        let now = self.now();
        let id = self.core.id().to_string();
        let breaker = &self.env.breaker;
        let changes = breaker.changes(); // before asking: no transition is missed
        let (permit, transition) = match call {
            BreakerCall::Failed => (None, breaker.on_failure(&id, now.mono, &self.cfg().recovery)),
            BreakerCall::Recovered => (None, breaker.on_success(&id, now.mono)),
            BreakerCall::Ask => {
                let (permit, transition) = breaker.permit(&id, now.mono, &self.cfg().recovery);
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
                    let now = act.now();
                    let effects = act.core.on_breaker_changed(now);
                    act.apply(effects, ctx);
                }
            }));
        }
        if !effects.is_empty() {
            ctx.spawn(actix::fut::ready(()).map(move |_, act: &mut Self, ctx| act.apply(effects, ctx)));
        }
    }
}
