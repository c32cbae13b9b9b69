//! The off switch, the supervisor's part: a pause of one session is passed to its actor
//! (found or created, as for a hand-off); the fleet's pause is the supervisor's own
//! state — ledgered (it survives restarts), passed to every session actor and to each
//! one created while it lasts, and lifted at its end when it was given one. What a held
//! session does (nothing) is its core's: `core/src/session/core/hold.rs`.

use super::*;
use crate::control::{PauseTarget, PauseView, SetPause};
use crate::ledger::FleetPause;
use crate::session::actor::SetHold;
use crate::session::core::HoldScope;

impl Supervisor {
    /// At start: the fleet's pause as the ledger has it (before any session actor
    /// exists, so every one is created held).
    pub(super) fn load_fleet_pause(&mut self, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.ledger);
        ctx.wait(async move { ledger.fleet_pause().await }.into_actor(self).map(|found, act, ctx| match found {
            Ok(Some(pause)) => {
                tracing::warn!(by = %pause.by, until_ms = pause.until_ms, "the fleet is paused (from the ledger): Shepherd acts on no session until `shepherd resume --all`");
                act.fleet_pause = Some(pause);
                act.arm_fleet_pause_end(ctx);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "ledger: could not read whether the fleet is paused; it is not"),
        }));
    }

    /// A session actor just created: held if the fleet is (a fleet pause in its ledgered
    /// state is not restored: `SessionCore::restore`).
    pub(super) fn hold_if_fleet_paused(&self, addr: &Addr<SessionActor>) {
        if let Some(p) = &self.fleet_pause {
            addr.do_send(SetHold { scope: HoldScope::Fleet, hold: true, until_ms: None, by: p.by.clone() });
        }
    }

    /// The fleet's pause, if any (status, metrics).
    pub fn fleet_pause(&self) -> Option<&FleetPause> {
        self.fleet_pause.as_ref()
    }

    fn arm_fleet_pause_end(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.fleet_pause_end.take() {
            ctx.cancel_future(handle);
        }
        let Some(until_ms) = self.fleet_pause.as_ref().and_then(|p| p.until_ms) else { return };
        let left = Duration::from_millis(until_ms.saturating_sub(self.clock.wall_ms()).max(0) as u64);
        self.fleet_pause_end = Some(ctx.run_later(left, |act, ctx| {
            act.fleet_pause_end = None;
            let by = "the fleet pause's time is up".to_string();
            ctx.spawn(act.set_fleet_pause(false, None, by).map(|_, _, _| ()));
        }));
    }

    /// Pauses or resumes the fleet: ledgered first (a restart keeps what was asked), then
    /// every session actor told; answered once every one has taken it in, so a status
    /// read after it shows it (reads take what the actors published).
    fn set_fleet_pause(
        &mut self,
        pause: bool,
        until_ms: Option<i64>,
        by: String,
    ) -> impl ActorFuture<Self, Output = Result<PauseView, ControlError>> {
        let wanted = pause.then(|| FleetPause { by: by.clone(), since_ms: self.clock.wall_ms(), until_ms });
        let ledger = Arc::clone(&self.ledger);
        let stored = wanted.clone();
        async move { ledger.set_fleet_pause(stored.as_ref()).await }.into_actor(self).then(move |written, act, ctx| {
            let holds = written.map_err(|e| ControlError::Unavailable(format!("ledger: {e}"))).map(|()| {
                act.fleet_pause = wanted;
                act.arm_fleet_pause_end(ctx);
                let actors = act.actors();
                let what = if pause { "the fleet is paused" } else { "the fleet is resumed" };
                tracing::info!(target: "shepherd::action", action = if pause { "pause" } else { "resume" }, by = %by, until_ms, sessions = actors.len(), "{what}");
                let hold = |addr: &Addr<SessionActor>| {
                    addr.send(SetHold { scope: HoldScope::Fleet, hold: pause, until_ms: None, by: by.clone() })
                };
                actors.iter().map(hold).collect::<Vec<_>>()
            });
            async move {
                for held in holds? {
                    let _ = held.await;
                }
                Ok(PauseView { session: None, paused: pause.then(|| "fleet".to_string()), until_ms })
            }
            .into_actor(act)
        })
    }
}

impl Handler<SetPause> for Supervisor {
    type Result = ResponseActFuture<Self, Result<PauseView, ControlError>>;

    fn handle(&mut self, msg: SetPause, _: &mut Context<Self>) -> Self::Result {
        let SetPause { target, pause, until_ms, by } = msg;
        match target {
            PauseTarget::Fleet => Box::pin(self.set_fleet_pause(pause, until_ms, by)),
            PauseTarget::Session(session) => Box::pin(self.locate(session.clone(), None).then(move |addr, act, _| {
                async move {
                    let Some(addr) = addr else { return Err(ControlError::UnknownSession(session)) };
                    let hold = SetHold { scope: HoldScope::Session, hold: pause, until_ms, by };
                    addr.send(hold).await.map_err(|_| ControlError::ShuttingDown)
                }
                .into_actor(act)
            })),
        }
    }
}
