//! The session core's side of the advisor (`advisor.enabled`): where a decision stops
//! to ask, and how the answer is weighed. Pure, like the rest of the core.
//!
//! Before a stall's abort the core emits [`Effect::Advise`] instead of the recovery and
//! holds the stall (no deadline) until [`SessionCore::on_advice`]; a sure `wait`
//! postpones the abort once by `advisor.postpone`, anything else lets it go ahead at
//! once (the stall is re-checked first: the session may have moved meanwhile). Before a
//! nudge the decision is held the same way; a sure `wait` or `abort` skips it. Each
//! answer is one `advise` record (or the nudge's `declined` record) naming the advice
//! and where it came from.

use super::*;
use crate::advisor::gate::{describe, verdict, Verdict};
use crate::advisor::Consulted;

impl SessionCore {
    /// What the advisor is told about this session now.
    fn situation(&self, about: About, now: Now) -> Situation {
        Situation {
            about,
            session_age: self.created_ms.map(|c| Duration::from_millis(now.wall_ms.saturating_sub(c).max(0) as u64)),
            since_activity: now.mono.duration_since(self.last_activity),
            todos: self.todos.clone(),
            context_tokens: self.context_tokens,
            context_window: self.window,
            attempts: self.attempts,
            part: self.advice.part(),
            recent_stall_parts: self.advice.stall_parts(),
            agent: self.turn.as_ref().and_then(|t| t.agent.clone()),
        }
    }

    /// Before a stall's abort: the consultation to run first, or `None` when the abort
    /// goes ahead now (advisor off, advice heard, or already postponed once).
    pub(super) fn advice_before_abort(&mut self, now: Now) -> Option<Effect> {
        if self.cfg.advisor.enabled && self.advice.ask_before_abort() {
            let situation = self.situation(About::Abort, now);
            return Some(Effect::Advise(AdviceRequest { situation, round: 0 }));
        }
        self.advice.on_abort();
        None
    }

    /// Before a nudge: the consultation to run first, or `None` for any other decision.
    pub(super) fn advice_before_nudge(&mut self, d: &Decision, now: Now) -> Option<Effect> {
        match d {
            Decision::Send { kind: PromptKind::Nudge, round } if self.cfg.advisor.enabled => {
                self.advice.ask_before_nudge();
                let situation = self.situation(About::Nudge, now);
                Some(Effect::Advise(AdviceRequest { situation, round: *round }))
            }
            _ => None,
        }
    }

    /// The advisor answered `request`: the rules decide with the advice in hand.
    pub fn on_advice(&mut self, request: &AdviceRequest, answer: &Consulted, now: Now) -> Vec<Effect> {
        self.advice.answered();
        let about = request.situation.about;
        let cfg = Arc::clone(&self.cfg);
        let v = verdict(about, &answer.advice, &cfg.advisor);
        let reason = describe(about, answer, v, &cfg.advisor);
        let numbers = Numbers {
            advice: Some(answer.advice.to_string()),
            advice_source: Some(answer.source.to_string()),
            attempt: (about == About::Abort).then_some(self.attempts + 1),
            ..Numbers::default()
        };
        match (about, v) {
            (About::Abort, Verdict::Postpone) => {
                self.advice.postpone(now.mono + cfg.advisor.postpone);
                vec![self.record(Action::Advise, Outcome::Done, &reason, numbers, now)]
            }
            (About::Abort, _) => {
                let mut out = vec![self.record(Action::Advise, Outcome::Done, &reason, numbers, now)];
                self.advice.clear_abort(true);
                out.extend(self.on_stall_deadline(now));
                self.advice.clear_abort(false);
                out
            }
            (About::Nudge, Verdict::Skip) => {
                self.followup.on_delivered(PromptKind::Nudge, false);
                let numbers = Numbers { round: Some(request.round), open_todos: Some(self.open_todos()), ..numbers };
                vec![self.record(Action::Nudge, Outcome::Declined, &reason, numbers, now)]
            }
            (About::Nudge, _) => {
                let mut out = vec![self.record(Action::Advise, Outcome::Done, &reason, numbers, now)];
                let send = Decision::Send { kind: PromptKind::Nudge, round: request.round };
                out.extend(self.decision_effects_advised(send, now));
                out
            }
        }
    }
}
