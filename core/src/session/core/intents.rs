//! Intents left open by a crash or a lost answer: verified once the request had time to
//! land, finished (the missing prompt sent) or closed, one record each.

use super::*;

impl SessionCore {
    /// A request failed in a way that may still have reached OpenCode: its intent stays
    /// open, and the session is read once the request had time to land
    /// (`recovery.abort_poll_max`), so it is neither lost nor sent twice.
    pub(super) fn verify_later(&mut self, error: &EngineError, now: Now) {
        if crate::ports::may_have_arrived(error) {
            self.verify = Verify::At(now.mono + self.cfg.recovery.abort_poll_max);
        }
    }

    /// The ledger could not say which intents are open: look again later (the stall
    /// clock keeps waiting for the verification meanwhile).
    pub fn on_intents_unreadable(&mut self, now: Now) {
        if self.verify == Verify::Finding {
            self.verify = Verify::At(now.mono + self.cfg.recovery.abort_poll_max);
        }
    }

    /// Open intents of this session found in the ledger (at start, after a reconnect):
    /// each is resumed once — the session is read and only what is missing is done.
    /// While a recovery's intent is resumed the session counts as recovering: the
    /// abort's own events are ours, and no second recovery starts.
    pub fn on_open_intents(&mut self, intents: Vec<Intent>, now: Now) -> Vec<Effect> {
        if self.verify == Verify::Finding {
            self.verify = Verify::Nothing; // what is open is handed over below
        }
        let mut out = Vec::new();
        for intent in intents {
            let resuming = self
                .rare()
                .is_some_and(|r| r.resuming.iter().any(|d| crate::session::effect::same_action(d, &intent.decision)));
            if *intent.session != *self.id || resuming {
                continue;
            }
            let prompt = self.resume_prompt(&intent, now);
            if intent.kind == IntentKind::Recover && self.recovering.is_none() {
                self.recovering = Some(Box::new(Recovering { aborted_message: None, escalation: None }));
            }
            self.rare_mut().resuming.push(intent.decision.clone());
            out.push(Effect::Finish(FinishOrder { intent, prompt, messages: self.cfg.recovery.verify_messages }));
        }
        out
    }

    /// The prompt an open intent sends if the session shows it is missing: built from
    /// what the core knows now, under the intent's decision id (so it is recognised,
    /// and a second crash is resolved the same way).
    pub(super) fn resume_prompt(&self, intent: &Intent, now: Now) -> Option<PromptOrder> {
        let mut order = match intent.kind {
            IntentKind::Recover => {
                let recovery =
                    RecoveryOrder { attempt: intent.attempt, ..self.recovery_order(intent.attempt, None, now) };
                let directory = self.directory.as_deref().map(str::to_string);
                crate::session::effect::continue_order(&self.cfg.recovery, &recovery, directory)
            }
            IntentKind::Continue => self.continue_when_idle("resume", now),
            IntentKind::Nudge | IntentKind::Review => {
                let kind = if intent.kind == IntentKind::Nudge { PromptKind::Nudge } else { PromptKind::Review };
                match self.decision_effects_ungated(Decision::Send { kind, round: intent.attempt }, now).pop() {
                    Some(Effect::Prompt(order)) => order,
                    _ => return None,
                }
            }
            IntentKind::Custom => return None,
        };
        order.decision.clone_from(&intent.decision);
        order.not_before_ms = Some(intent.started_ms);
        Some(order)
    }

    /// A resumed intent finished: one record saying what the session showed and what
    /// was done about it.
    pub fn on_unfinished_done(&mut self, order: &FinishOrder, report: &FinishReport, now: Now) -> Vec<Effect> {
        let intent = &order.intent;
        if let Some(rare) = self.rare.as_deref_mut() {
            rare.resuming.retain(|d| *d != intent.decision);
        }
        if intent.kind == IntentKind::Recover {
            self.recovering = None;
            // The abort's trailing events are still ours.
            self.recovery_ended = Some(Box::new((now.mono, None)));
            self.activity(now);
        }
        let action = match intent.kind {
            IntentKind::Recover | IntentKind::Continue => Action::Continue,
            IntentKind::Nudge => Action::Nudge,
            IntentKind::Review => Action::Review,
            IntentKind::Custom => Action::Prompt,
        };
        let what = intent.kind.as_str();
        let step = intent.step.as_str();
        let (outcome, reason) = match report {
            FinishReport::Delivered => (
                Outcome::Done,
                format!("unfinished {what} (step {step}): it is in the session already; not sent again"),
            ),
            FinishReport::Sent(delivery) => {
                let sent = matches!(delivery, Delivery::Sent { .. });
                match intent.kind {
                    IntentKind::Recover | IntentKind::Continue if sent => self.rare_mut().continues.on_continue(now.mono),
                    IntentKind::Nudge | IntentKind::Review => {
                        let kind = if intent.kind == IntentKind::Nudge { PromptKind::Nudge } else { PromptKind::Review };
                        let delivered = if sent { Delivered::Sent } else { Delivered::NotSent };
                        self.followup.on_delivered(kind, delivered);
                    }
                    _ => {}
                }
                match delivery {
                    Delivery::Sent { .. } => (
                        Outcome::Done,
                        format!("unfinished {what} (step {step}): it had not reached the session; sent it once"),
                    ),
                    Delivery::Skipped { reason, .. } => {
                        (Outcome::Declined, format!("unfinished {what} (step {step}): not sent: {reason}"))
                    }
                    Delivery::Guarded { reason, .. } => {
                        (Outcome::Declined, format!("unfinished {what} (step {step}): not sent: {reason}"))
                    }
                    Delivery::Failed { error } => {
                        (Outcome::Failed, format!("unfinished {what} (step {step}): could not be sent: {error}"))
                    }
                }
            }
            FinishReport::Moot(why) => (Outcome::Declined, format!("unfinished {what} (step {step}): moot, {why}")),
            FinishReport::Gone => (Outcome::Declined, format!("unfinished {what} (step {step}): moot, the session is gone")),
            FinishReport::NotOurs(holder) => (
                Outcome::Declined,
                format!("unfinished {what} (step {step}): left to another Shepherd instance ({holder})"),
            ),
            FinishReport::Unreadable(e) => (
                Outcome::Failed,
                format!("unfinished {what} (step {step}): could not read the session ({e}); kept for the next start or reconnect"),
            ),
        };
        let numbers =
            Numbers { attempt: Some(intent.attempt), open_todos: Some(self.open_todos()), ..Numbers::default() };
        vec![self.record(action, outcome, &reason, numbers, now)]
    }
}
