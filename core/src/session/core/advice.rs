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
            todos: self.todos.to_vec(),
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
            Decision::Send { kind: PromptKind::Nudge, round }
                if self.cfg.advisor.enabled && self.advice.ask_before_nudge() =>
            {
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
                self.followup.on_nudge_skipped(now.mono + cfg.advisor.postpone);
                self.advice.nudge_skipped();
                let numbers = Numbers { round: Some(request.round), open_todos: Some(self.open_todos()), ..numbers };
                vec![self.record(Action::Nudge, Outcome::Declined, &reason, numbers, now)]
            }
            (About::Nudge, _) => {
                let mut out = vec![self.record(Action::Advise, Outcome::Done, &reason, numbers, now)];
                if let Some(p) = self.pause {
                    // Paused while the advisor was asked: not sent, as if skipped at delivery.
                    self.followup.on_delivered(PromptKind::Nudge, crate::session::followup::Delivered::NotSent);
                    let numbers = Numbers {
                        round: Some(request.round),
                        open_todos: Some(self.open_todos()),
                        ..Numbers::default()
                    };
                    let why = format!("automation is paused ({})", p.as_str());
                    out.push(self.record(Action::Nudge, Outcome::Declined, &why, numbers, now));
                    return out;
                }
                let send = Decision::Send { kind: PromptKind::Nudge, round: request.round };
                out.extend(self.decision_effects_advised(send, now));
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The hooks as a specification: a stall or a nudge stops to ask, the answer decides.
    use super::*;
    use crate::advisor::{Advice, AdviceAction, Source};
    use crate::event::decode;

    const CREATED_MS: i64 = 1_000_000;

    struct Bench {
        core: SessionCore,
        t0: Instant,
    }

    impl Bench {
        fn new() -> Self {
            let mut rules = SessionRules::default();
            rules.advisor.enabled = true;
            rules.advisor.new_session = Duration::ZERO;
            let (core, t0) = crate::session::core::testkit::test_core(rules);
            Self { core, t0 }
        }
        fn at(&self, secs: u64) -> Now {
            Now { mono: self.t0 + Duration::from_secs(secs), wall_ms: CREATED_MS + secs as i64 * 1000 }
        }
        fn feed(&mut self, secs: u64, json: &str) -> Vec<Effect> {
            let event = decode(json).expect("test event decodes").event;
            let now = self.at(secs);
            self.core.observe(&event, now)
        }
        fn tick(&mut self, secs: u64) -> Vec<Effect> {
            let now = self.at(secs);
            self.core.on_deadline(now)
        }
        fn answer(&mut self, secs: u64, req: &AdviceRequest, action: AdviceAction, confidence: f64) -> Vec<Effect> {
            let now = self.at(secs);
            self.core.on_advice(req, &model_says(action, confidence), now)
        }
    }

    /// The model's answer, as the advisor actor hands it over.
    pub(super) fn model_says(action: AdviceAction, confidence: f64) -> Consulted {
        Consulted { advice: Advice { action, confidence }, source: Source::Model, why: "test".into() }
    }

    fn asked(effects: &[Effect]) -> AdviceRequest {
        match effects {
            [Effect::Advise(r)] => r.clone(),
            other => panic!("expected one consultation, got {other:?}"),
        }
    }

    fn recovers(effects: &[Effect]) -> bool {
        effects.iter().any(|e| matches!(e, Effect::Recover(_)))
    }

    fn record(effects: &[Effect], action: Action) -> Option<&ActionRecord> {
        effects.iter().find_map(|e| match e {
            Effect::Record(r) if r.action == action => Some(r),
            _ => None,
        })
    }

    const BUSY: &str = r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#;

    #[test]
    fn a_sure_wait_postpones_the_abort_once_then_it_happens_without_asking_again() {
        let mut b = Bench::new();
        b.feed(0, BUSY);
        let req = asked(&b.tick(180));
        assert_eq!(req.situation.about, About::Abort);
        assert_eq!(b.core.deadline(), None, "no stall deadline while the advisor is asked");
        let out = b.answer(181, &req, AdviceAction::Wait, 0.9);
        let r = record(&out, Action::Advise).expect("the consultation is journalled");
        assert!(r.reason.contains("postponed once"), "{}", r.reason);
        assert_eq!(r.numbers.advice.as_deref(), Some("wait:0.90"));
        assert_eq!(r.numbers.advice_source.as_deref(), Some("model"));
        assert!(!recovers(&out));
        let postpone = b.core.cfg.advisor.postpone.as_secs();
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(181 + postpone)));
        assert!(b.tick(181 + postpone - 1).is_empty());
        let out = b.tick(181 + postpone);
        assert!(recovers(&out), "the second time the abort goes ahead: {out:?}");
        assert!(!out.iter().any(|e| matches!(e, Effect::Advise(_))));
    }

    #[test]
    fn an_escalation_aborts_too_and_is_asked_about_first() {
        let mut rules = SessionRules::default();
        rules.advisor.new_session = Duration::ZERO;
        rules.handoff.enabled = false;
        rules.recovery.max_recoveries = 10;
        rules.recovery.max_auto_submits = 10;
        let mut b = crate::session::core::testkit::Bench::with_rules(rules);
        b.busy(0);
        let mut t = 0;
        for _ in 0..3 {
            t += 180;
            let req = asked(&b.tick(t));
            assert!(recovers(&b.core.on_advice(&req, &model_says(AdviceAction::Continue, 0.5), b.at(t))));
            b.recovered(t);
        }
        t += 180;
        let req = asked(&b.tick(t));
        let out = b.core.on_advice(&req, &model_says(AdviceAction::Wait, 0.9), b.at(t));
        assert!(record(&out, Action::Escalate).is_none() && !recovers(&out), "postponed: {out:?}");
        let postpone = b.core.cfg.advisor.postpone.as_secs();
        let out = b.tick(t + postpone);
        assert!(record(&out, Action::Escalate).is_some(), "then the escalation goes ahead unasked: {out:?}");
    }

    #[test]
    fn any_other_advice_lets_the_abort_go_ahead_at_once() {
        let mut b = Bench::new();
        b.feed(0, BUSY);
        let req = asked(&b.tick(180));
        let out = b.answer(180, &req, AdviceAction::Wait, 0.5);
        assert!(record(&out, Action::Advise).is_some_and(|r| r.reason.contains("goes ahead")));
        assert!(recovers(&out));
    }

    #[test]
    fn activity_during_the_consultation_means_no_abort() {
        let mut b = Bench::new();
        b.feed(0, BUSY);
        let req = asked(&b.tick(180));
        b.feed(181, r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_1","field":"text","delta":"x"}}"#);
        let out = b.answer(182, &req, AdviceAction::Abort, 0.9);
        assert!(!recovers(&out), "the session moved meanwhile: {out:?}");
        assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(181 + 180)));
    }

    #[test]
    fn an_obvious_new_session_is_asked_about_like_any_other_the_actor_decides_the_source() {
        // The core always asks when the advisor is on; obviousness is the actor's
        // business (it answers from the heuristic without calling the model).
        let mut b = Bench::new();
        b.feed(0, BUSY);
        assert!(matches!(b.tick(180).as_slice(), [Effect::Advise(_)]));
    }

    #[test]
    fn with_the_advisor_off_nothing_is_asked() {
        let mut b = Bench::new();
        let mut rules = (*b.core.cfg).clone();
        rules.advisor.enabled = false;
        b.core.set_config(Arc::new(rules));
        b.feed(0, BUSY);
        assert!(recovers(&b.tick(180)));
    }
}

#[cfg(test)]
mod nudge_tests {
    //! Before a nudge: a sure wait or abort skips it (journalled as declined with the
    //! advice); anything else sends it.
    use super::*;
    use crate::advisor::AdviceAction;
    use crate::event::decode;

    fn core_with_todos() -> (SessionCore, Instant) {
        let mut rules = SessionRules::default();
        rules.advisor.enabled = true;
        let t0 = Instant::now();
        let mut core = SessionCore::new("srv", "ses_A", Arc::new(rules), Now { mono: t0, wall_ms: 1_000_000 });
        let feed = |core: &mut SessionCore, json: &str| {
            core.observe(&decode(json).expect("test event").event, Now { mono: t0, wall_ms: 1_000_000 })
        };
        feed(&mut core, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        feed(
            &mut core,
            r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"t0","status":"pending","priority":"high"}]}}"#,
        );
        feed(
            &mut core,
            r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_1","sessionID":"ses_A","role":"assistant","finish":"stop","time":{"created":1}}}}"#,
        );
        feed(&mut core, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
        (core, t0)
    }

    fn nudge_consultation(core: &mut SessionCore, t0: Instant) -> (AdviceRequest, Now) {
        let due = core.deadline().expect("a nudge is due");
        let now = Now { mono: due, wall_ms: 1_000_000 + due.duration_since(t0).as_millis() as i64 };
        let effects = core.on_deadline(now);
        match effects.as_slice() {
            [Effect::Advise(r)] if r.situation.about == About::Nudge => (r.clone(), now),
            other => panic!("expected a consultation before the nudge, got {other:?}"),
        }
    }

    use super::tests::model_says as answer;

    #[test]
    fn a_sure_wait_or_abort_skips_the_nudge_and_says_so() {
        for (action, confidence) in [(AdviceAction::Wait, 0.7), (AdviceAction::Abort, 0.6)] {
            let (mut core, t0) = core_with_todos();
            let (req, now) = nudge_consultation(&mut core, t0);
            let out = core.on_advice(&req, &answer(action, confidence), now);
            match out.as_slice() {
                [Effect::Record(r)] => {
                    assert_eq!((r.action, r.outcome), (Action::Nudge, Outcome::Declined));
                    assert!(r.reason.contains("nudge skipped"), "{}", r.reason);
                    assert!(r.numbers.advice.is_some() && r.numbers.advice_source.as_deref() == Some("model"));
                }
                other => panic!("expected one declined nudge, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_skipped_nudge_is_considered_again_after_postpone_and_then_goes_unasked() {
        let (mut core, t0) = core_with_todos();
        let (req, now) = nudge_consultation(&mut core, t0);
        core.on_advice(&req, &answer(AdviceAction::Wait, 0.9), now);
        let postpone = core.cfg.advisor.postpone;
        assert_eq!(core.deadline(), Some(now.mono + postpone), "the nudge comes back, the session is not stranded");
        let later = Now { mono: now.mono + postpone, wall_ms: now.wall_ms + postpone.as_millis() as i64 };
        let out = core.on_deadline(later);
        assert!(
            out.iter().any(|e| matches!(e, Effect::Prompt(o) if o.kind == PromptKind::Nudge)),
            "the retry is sent without asking again (and the skip did not count against the cooldown): {out:?}"
        );
        assert!(!out.iter().any(|e| matches!(e, Effect::Advise(_))), "{out:?}");
    }

    #[test]
    fn a_nudge_is_not_sent_when_the_person_aborted_while_the_advisor_was_asked() {
        let (mut core, t0) = core_with_todos();
        let (req, now) = nudge_consultation(&mut core, t0);
        let abort =
            r#"{"type":"session.error","properties":{"sessionID":"ses_A","error":{"name":"MessageAbortedError"}}}"#;
        core.observe(&decode(abort).expect("test event").event, now);
        let out = core.on_advice(&req, &answer(AdviceAction::Continue, 0.9), now);
        assert!(!out.iter().any(|e| matches!(e, Effect::Prompt(_) | Effect::Compact(_))), "{out:?}");
        let declined = out
            .iter()
            .find_map(|e| match e {
                Effect::Record(r) if r.action == Action::Nudge => Some(r),
                _ => None,
            })
            .expect("the nudge's decline is journalled");
        assert_eq!(
            (declined.outcome, declined.reason.as_str()),
            (Outcome::Declined, "automation is paused (user_abort)")
        );
    }

    #[test]
    fn a_skipped_nudge_is_moot_once_the_session_works_again() {
        let (mut core, t0) = core_with_todos();
        let (req, now) = nudge_consultation(&mut core, t0);
        core.on_advice(&req, &answer(AdviceAction::Abort, 0.9), now);
        let busy = r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#;
        core.observe(&decode(busy).expect("test event").event, now);
        let stall_only = core.deadline().expect("the busy session has a stall deadline");
        assert_eq!(stall_only, now.mono + core.cfg.recovery.stall_timeout, "no nudge pending while busy");
    }

    #[test]
    fn other_advice_sends_the_nudge() {
        let (mut core, t0) = core_with_todos();
        let (req, now) = nudge_consultation(&mut core, t0);
        let out = core.on_advice(&req, &answer(AdviceAction::Wait, 0.69), now);
        assert!(out.iter().any(|e| matches!(e, Effect::Prompt(o) if o.kind == PromptKind::Nudge)), "{out:?}");
    }
}
