//! Carrying out the core's effects: each record goes to the ledger and the journal,
//! each order to the runner; then the durable state is written if it changed, the
//! session's detail published and the timer re-armed (`settle`).

use super::*;

/// How long a failed state write waits before it is tried again. Not a tuning knob:
/// a ledger that fails is logged and counted; this only keeps the retry from spinning.
const SAVE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

impl SessionActor {
    pub(super) fn apply(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        // The detail is published before the records go out, with the last of them: who
        // hears of a record and then reads the session's detail finds the session as the
        // record left it (asking the actor, it would have waited for this handler).
        let last_record = effects.iter().rev().find_map(|e| match e {
            Effect::Record(r) => Some(LastAction::from(r)),
            _ => None,
        });
        if let Some(last) = last_record {
            self.last_action = Some(last);
            self.publish();
        }
        let mut records = Vec::new();
        for effect in effects {
            match effect {
                Effect::Record(r) => {
                    // The one door of every record: the ledger (with the state, below),
                    // the journal's log line and its subscribers (status, history,
                    // `/v1/status`, toasts, metrics).
                    let r = r.redacted(&self.cfg().redactor);
                    self.last_action = Some(LastAction::from(&r));
                    self.record_unsaved = true;
                    records.push(r.clone());
                    self.env.journal.record(r);
                }
                Effect::Recover(order) => self.run(Procedure::Recover(order), ctx),
                Effect::Prompt(order) => self.run(Procedure::Deliver(order), ctx),
                Effect::Compact(order) => self.run(Procedure::Compact(order), ctx),
                Effect::HandOff(order) => self.run(Procedure::HandOff(order), ctx),
                Effect::Advise(request) => {
                    let session = self.core.id().to_string();
                    self.run(Procedure::Consult { request, session }, ctx)
                }
                Effect::Finish(order) => self.run(Procedure::Finish(order), ctx),
                Effect::FindIntents => self.find_open_intents(ctx),
                Effect::Breaker(call) => self.call_breaker(call, ctx),
                Effect::Stop => ctx.stop(),
            }
        }
        self.persist(records, ctx);
        self.settle(ctx);
    }

    /// Writes `records` and the durable state when it changed since the last write,
    /// as one ledger write: the core counts its changes, so most events (deltas, part
    /// updates) cost one comparison here. The state counts as saved only once the write
    /// succeeded; a failed write is retried [`SAVE_RETRY`] later with the state as it is
    /// then, so a restart never acts again on an edge whose handling was not written.
    ///
    /// One state write at a time: what changes while one is under way goes into the
    /// next, sent as soon as that one is done (the state is whole, so the later write
    /// holds every change); records made meanwhile go at once, on their own. A turn's
    /// edges come within milliseconds of each other; each written on its own cost the
    /// server's thread an encoding and a wake-up of the ledger's.
    /// Eviction and retirement write the state themselves before the actor stops.
    fn persist(&mut self, records: Vec<ActionRecord>, ctx: &mut Context<Self>) {
        let generation = self.core.durable_generation();
        let written_or_writing =
            self.saved_generation == Some(generation) || self.saving_generation == Some(generation);
        if written_or_writing && !self.record_unsaved {
            return;
        }
        if self.saving_generation.is_some() {
            self.save_pending = true;
            self.write_records(records, ctx);
            return;
        }
        self.record_unsaved = false;
        self.saving_generation = Some(generation);
        let records = if self.unwritten.is_empty() {
            records
        } else {
            let mut earlier = std::mem::take(&mut self.unwritten);
            earlier.extend(records);
            earlier
        };
        let state = self.durable_state();
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let write = async move {
            let written = ledger.write(&server, &id, &records, Some(&state)).await;
            (written, records)
        };
        ctx.spawn(write.into_actor(self).map(move |(written, records), act, ctx| match written {
            Ok(()) => {
                act.saved_generation = Some(generation);
                if act.saving_generation == Some(generation) {
                    act.saving_generation = None;
                }
                if std::mem::take(&mut act.save_pending) {
                    act.persist(Vec::new(), ctx);
                }
            }
            Err(e) => {
                if act.saving_generation == Some(generation) {
                    act.saving_generation = None;
                }
                // The retry below writes whatever changed meanwhile too, and the records
                // this write held.
                act.save_pending = false;
                tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, records = records.len(), retry_in_ms = SAVE_RETRY.as_millis() as u64, "ledger: state write failed; retrying");
                act.retry_with(records, ctx);
            }
        }));
    }

    /// After a failed write: `records` go with the next state write, which is tried
    /// [`SAVE_RETRY`] from now unless one is already due.
    fn retry_with(&mut self, records: Vec<ActionRecord>, ctx: &mut Context<Self>) {
        self.unwritten.extend(records);
        self.record_unsaved = true;
        if self.save_retry.is_none() {
            self.save_retry = Some(ctx.run_later(SAVE_RETRY, |act, ctx| {
                act.save_retry = None;
                act.persist(Vec::new(), ctx);
            }));
        }
    }

    /// Records made while a state write is under way: written at once, without the
    /// state (the next state write follows that one); if that fails, with the retry.
    fn write_records(&mut self, records: Vec<ActionRecord>, ctx: &mut Context<Self>) {
        if records.is_empty() {
            return;
        }
        let ledger = Arc::clone(&self.env.ledger);
        let (server, id) = (self.env.server.clone(), self.core.id().to_string());
        let write = async move { (ledger.write(&server, &id, &records, None).await, records) };
        ctx.spawn(write.into_actor(self).map(|(written, records), act, ctx| {
            if let Err(e) = written {
                tracing::warn!(server = %act.env.server, session = %act.core.id(), error = %e, records = records.len(), retry_in_ms = SAVE_RETRY.as_millis() as u64, "ledger: journal write failed; retrying with the state");
                act.retry_with(records, ctx);
            }
        }));
    }

    /// The core's durable state plus the latest record.
    pub(super) fn durable_state(&self) -> DurableState {
        let mut state = self.core.export(self.env.now());
        if let Some(r) = &self.last_action {
            state.last_action = Some(format!("{}:{}", r.action.as_str(), r.outcome.as_str()));
            state.last_action_ms = Some(r.at_ms);
        } else {
            (state.last_action, state.last_action_ms) = self.loaded_last_action.as_deref().cloned().unwrap_or_default();
        }
        state
    }
}
