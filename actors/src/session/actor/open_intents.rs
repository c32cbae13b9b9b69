//! Actions a crash left open: the ledger's intents of this session, read when the
//! actor starts and after every reconnect, handed to the core (which orders them
//! finished, through the runner).

use super::*;

impl SessionActor {
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
                let now = self.now();
                let effects = self.core.on_open_intents(open, now);
                self.apply(effects, ctx);
            }
            Err(e) => {
                tracing::warn!(server = %self.env.server, session = %self.core.id(), error = %e, "ledger: could not read this session's open intents");
                let now = self.now();
                self.core.on_intents_unreadable(now);
                self.settle(ctx);
            }
        }
    }
}
