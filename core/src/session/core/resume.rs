//! The session core's side of provider outages: a turn that ended on the provider's
//! error (see `session::outage`) with work left is resumed after a back-off that grows
//! per consecutive failure, once per step, through the guard. Pure, like the rest of
//! the core.
//!
//! At the busy→idle edge a provider error seen for the turn is counted once and the
//! next step scheduled (`provider_error` record, `Effect::Breaker(Failed)`). When the
//! step is due the server's breaker is asked (`Effect::Breaker(Ask)` →
//! [`SessionCore::on_breaker_permit`]): closed or this session probes → the resume
//! prompt (`recover` record, a `continue` through the usual delivery, on the fallback
//! model once the primary failed `fallback_after` resumes); open with another probe →
//! wait for it. Real progress ends the outage (`Effect::Breaker(Recovered)`).
//!
//! "Work left": open todos, or — in a session that is not a subagent — the failed turn
//! itself (a request the person made went unanswered; a subagent's parent already got
//! the error from its `task` tool and carries on by itself).

use super::*;
use crate::session::breaker::Permit;
use crate::session::outage::{backoff, describe};

impl SessionCore {
    /// A provider error was seen for the current reply (`message`, when it names one).
    pub(super) fn note_provider_error(
        &mut self,
        message: Option<String>,
        e: &ErrorInfo,
        now: Now,
        out: &mut Vec<Effect>,
    ) {
        if !self.cfg.recovery.resume_after_provider_error {
            return;
        }
        let message = message.or_else(|| self.last_reply.message_id.as_deref().map(str::to_string));
        self.outage.get_or_insert_with(Box::default).note(message, describe(e));
        if self.busy == RunState::Idle && self.recovering.is_none() {
            // The message's error trailing the idle edge (or the only sign of it).
            out.extend(self.on_turn_ended(now));
        }
    }

    /// A session with a resume scheduled or under way (not to be evicted: nothing else
    /// would wake it).
    pub fn resume_pending(&self) -> bool {
        self.outage.as_ref().is_some_and(|o| o.is_scheduled())
    }

    /// Why a resume would not help or is not Shepherd's to send, if so.
    fn no_resume(&self) -> Option<String> {
        if let Some(p) = self.pause {
            return Some(format!("automation is paused ({})", p.as_str()));
        }
        if self.rollover.suspends_automation() {
            return Some("the session is being handed off".into());
        }
        if self.subagent && self.open_todos() == 0 {
            return Some("a subagent without open todos (its parent got the error and carries on)".into());
        }
        None
    }

    /// The turn ended (busy→idle, not Shepherd's abort): a provider failure seen in it
    /// is counted once and the next resume scheduled.
    pub(super) fn on_turn_ended(&mut self, now: Now) -> Vec<Effect> {
        let cfg = Arc::clone(&self.cfg);
        let Some(o) = self.outage.as_mut().filter(|o| o.has_pending()) else { return Vec::new() };
        let Some((step, wait, summary)) = o.count(now.mono, now.wall_ms, &cfg.recovery) else { return Vec::new() };
        let numbers = Numbers {
            attempt: Some(step),
            backoff_ms: Some(ms(wait)),
            open_todos: Some(self.open_todos()),
            ..Numbers::default()
        };
        let mut out = vec![Effect::Breaker(BreakerCall::Failed)];
        if let Some(why) = self.no_resume() {
            if let Some(o) = self.outage.as_mut() {
                o.drop_schedule();
            }
            // Name and status only: the provider's text ("Rate limit reached") would read
            // as Shepherd's own rate limit to whoever files declines by their reason.
            let short = summary.split(" \"").next().unwrap_or_default();
            let reason = format!("the turn ended on a provider error ({short}); not resuming: {why}");
            out.push(self.record(Action::ProviderError, Outcome::Declined, &reason, numbers, now));
        } else {
            let reason = format!(
                "the turn ended on a provider error ({summary}) with work left: resume {step} after the back-off \
                 (recovery.provider_backoff doubling per consecutive failure)"
            );
            out.push(self.record(Action::ProviderError, Outcome::Done, &reason, numbers, now));
        }
        out
    }

    /// A finished model call after provider failures: the outage is over for this
    /// session.
    pub(super) fn report_recovered(&mut self, now: Now, out: &mut Vec<Effect>) {
        let Some(failures) = self.outage.as_mut().and_then(|o| o.take_recovered()) else { return };
        if self.outage.as_ref().is_some_and(|o| o.is_quiet()) {
            self.outage = None;
        }
        let numbers = Numbers { round: Some(failures), ..Numbers::default() };
        let reason = format!("the session made progress again after {failures} provider failure(s): back-off reset");
        out.push(self.record(Action::ProviderError, Outcome::Done, &reason, numbers, now));
        out.push(Effect::Breaker(BreakerCall::Recovered));
    }

    /// The step is due: check the session, then ask the breaker.
    pub(super) fn on_resume_deadline(&mut self, now: Now) -> Vec<Effect> {
        let Some(step) = self.outage.as_ref().filter(|o| o.is_due(now.mono)).map(|o| o.failures()) else {
            return Vec::new();
        };
        let numbers = Numbers { attempt: Some(step), open_todos: Some(self.open_todos()), ..Numbers::default() };
        let why_not = if self.busy != RunState::Idle {
            Some(format!("resume {step} not needed: the session is busy again (its turn decides)"))
        } else {
            self.no_resume().map(|why| format!("resume {step} dropped: {why}"))
        };
        let other_work = self.recovering.is_some() || self.is_compacting() || self.followup.in_flight().is_some();
        let wait = self.cfg.recovery.provider_backoff;
        let Some(o) = self.outage.as_mut() else { return Vec::new() };
        if let Some(reason) = why_not {
            o.drop_schedule();
            return vec![self.record(Action::ProviderError, Outcome::Declined, &reason, numbers, now)];
        }
        if other_work {
            o.postpone(now.mono, now.wall_ms, wait);
            let reason = format!("resume {step} postponed: another prompt, recovery or compaction is under way");
            let numbers = Numbers { backoff_ms: Some(ms(wait)), ..numbers };
            return vec![self.record(Action::ProviderError, Outcome::Declined, &reason, numbers, now)];
        }
        o.asking();
        vec![Effect::Breaker(BreakerCall::Ask)]
    }

    /// The breaker changed: a session waiting on it asks again now.
    pub fn on_breaker_changed(&mut self, now: Now) -> Vec<Effect> {
        if self.outage.as_mut().is_some_and(|o| o.on_breaker_changed(now.mono)) {
            self.on_resume_deadline(now)
        } else {
            Vec::new()
        }
    }

    /// The breaker's answer: resume now (closed, or this session probes), or wait.
    pub fn on_breaker_permit(&mut self, permit: &Permit, now: Now) -> Vec<Effect> {
        let cfg = Arc::clone(&self.cfg);
        let open_todos = self.open_todos();
        let Some(o) = self.outage.as_mut() else { return Vec::new() };
        let step = o.failures();
        let probe = match permit {
            Permit::Wait { probe, retry_at } => {
                o.wait_for_breaker(*retry_at);
                let who = probe.as_deref().map_or("no probe yet".to_string(), |p| format!("{p} probes"));
                let reason = format!(
                    "resume {step} waits: the provider breaker of this server is open ({who}); it resumes when \
                     the breaker closes"
                );
                let numbers = Numbers { attempt: Some(step), open_todos: Some(open_todos), ..Numbers::default() };
                return vec![self.record(Action::Breaker, Outcome::Declined, &reason, numbers, now)];
            }
            Permit::Probe => true,
            Permit::Go => false,
        };
        let own = self.turn.as_ref().and_then(|t| t.model.clone()).or_else(|| self.model.clone());
        let Some(o) = self.outage.as_mut() else { return Vec::new() };
        let resume = o.resume(own.as_ref(), now.wall_ms, &cfg.recovery);
        let decision = format!("{}-outage{}-{}", self.id, resume.step, now.wall_ms);
        o.sending(decision.clone());
        let r = &cfg.recovery;
        let order = PromptOrder {
            kind: PromptKind::Continue,
            template: r.provider_resume_with_todos_message.clone(),
            template_without_open_todos: Some(r.provider_resume_message.clone()),
            facts: PromptFacts { attempts: resume.step, max_attempts: 0, context_summary: String::new() },
            require_open_todos: false,
            decision,
            tool_text_scan: None,
            model: resume.model.clone(),
            ..self.continue_when_idle("outage", now)
        };
        let model = resume
            .model
            .as_ref()
            .map_or_else(|| "the session's own model".to_string(), |m| format!("{}/{}", m.provider_id, m.model_id));
        let role = if probe { " as the breaker's probe" } else { "" };
        let why = if resume.why_model.is_empty() { String::new() } else { format!(" ({})", resume.why_model) };
        let reason = format!("resume {} after a provider error{role}, on {model}{why}", resume.step);
        let numbers = Numbers {
            attempt: Some(resume.step),
            backoff_ms: Some(ms(backoff(resume.step, r))),
            open_todos: Some(open_todos),
            ..Numbers::default()
        };
        vec![self.record(Action::Recover, Outcome::Done, &reason, numbers, now), Effect::Prompt(order)]
    }

    /// A follow-up about to be sent by a session on a fallback model past
    /// `fallback_cooldown`: it carries the session's own model again (one record).
    pub(super) fn back_on_own_model(&mut self, order: &mut PromptOrder, now: Now) -> Option<Effect> {
        let own = self.outage.as_mut()?.primary_due(now.wall_ms, &self.cfg.recovery)?;
        let reason = format!(
            "back on the session's own model ({}/{}) after recovery.fallback_cooldown: the {} carries it",
            own.provider_id,
            own.model_id,
            order.kind.as_str()
        );
        let numbers = Numbers { window_ms: Some(ms(self.cfg.recovery.fallback_cooldown)), ..Numbers::default() };
        order.model = Some(own);
        Some(self.record(Action::ProviderError, Outcome::Done, &reason, numbers, now))
    }

    /// A delivery ended: if it was a resume, the step is done (sent, or a similar prompt
    /// already reached the session), dropped (the session is busy again: its turn
    /// decides), or tried again after the back-off (could not be sent). Returns whether
    /// it was a resume.
    pub(super) fn on_resume_delivered(&mut self, order: &PromptOrder, delivery: &Delivery, now: Now) -> bool {
        let cfg = Arc::clone(&self.cfg);
        let Some(o) = self.outage.as_mut().filter(|o| o.is_in_flight(&order.decision)) else { return false };
        match delivery {
            Delivery::Sent { .. } | Delivery::Guarded { .. } => o.delivered(true, None),
            Delivery::Skipped { .. } => o.delivered(false, None),
            Delivery::Failed { .. } => {
                let wait = backoff(o.failures(), &cfg.recovery);
                o.delivered(false, Some((now.mono + wait, now.wall_ms + ms(wait) as i64)));
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{test_core, unadvised};
    use super::*;
    use crate::event::decode;

    const HTTP429: &str =
        include_str!("../../../../actors/tests/fixtures/captures/http429_retries_then_apierror.jsonl");

    /// The capture's frames for one session, with the session id rewritten.
    fn frames(capture: &str) -> Vec<Event> {
        capture
            .lines()
            .map(|line| {
                let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
                v.as_object_mut().unwrap().remove("_recv");
                let text = v.to_string().replace("ses_dd78f31deffevK1vA5BUXMJxaF", "ses_A");
                decode(&text).unwrap().event
            })
            .collect()
    }

    fn rules() -> SessionRules {
        let mut r = unadvised(SessionRules::default());
        r.recovery.provider_backoff = Duration::from_secs(60);
        r.recovery.provider_max_backoff = Duration::from_secs(600);
        r.recovery.fallback_models = vec!["fake/fake-model-2".into()];
        r.recovery.fallback_after = 1;
        r.nudge.enabled = false;
        r
    }

    struct Run {
        core: SessionCore,
        t0: Instant,
    }

    impl Run {
        fn new(rules: SessionRules) -> Self {
            let (core, t0) = test_core(rules);
            Run { core, t0 }
        }
        fn at(&self, secs: u64) -> Now {
            Now { mono: self.t0 + Duration::from_secs(secs), wall_ms: 2_000_000 + secs as i64 * 1000 }
        }
        fn feed(&mut self, events: &[Event], secs: u64) -> Vec<Effect> {
            let now = self.at(secs);
            events.iter().flat_map(|e| self.core.observe(e, now)).collect()
        }
        fn todos(&mut self, secs: u64) {
            let e = decode(r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"pending","priority":"high"}]}}"#).unwrap().event;
            self.feed(&[e], secs);
        }
        fn due(&mut self, secs: u64) -> Vec<Effect> {
            let now = self.at(secs);
            if self.core.deadline().is_some_and(|d| d <= now.mono) {
                self.core.on_deadline(now)
            } else {
                Vec::new()
            }
        }
    }

    fn records(effects: &[Effect]) -> Vec<(Action, Outcome, String)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Record(r) => Some((r.action, r.outcome, r.reason.clone())),
                _ => None,
            })
            .collect()
    }

    fn prompt(effects: &[Effect]) -> Option<&PromptOrder> {
        effects.iter().find_map(|e| match e {
            Effect::Prompt(o) => Some(o),
            _ => None,
        })
    }

    fn sent(order: &PromptOrder) -> Delivery {
        Delivery::Sent { text: String::new(), todos: order.known_todos.clone(), waited_ms: 0, tool_call_as_text: None }
    }

    #[test]
    fn a_captured_429_outage_is_resumed_once_after_the_back_off_through_the_breaker() {
        let mut run = Run::new(rules());
        run.todos(0);
        let out = run.feed(&frames(HTTP429), 1);
        let recs = records(&out);
        let failed = recs.iter().filter(|(a, _, _)| *a == Action::ProviderError).collect::<Vec<_>>();
        assert_eq!(failed.len(), 1, "one failed turn, one record: {recs:?}");
        assert_eq!(failed[0].1, Outcome::Done);
        assert!(failed[0].2.contains("APIError 429"), "{}", failed[0].2);
        assert_eq!(out.iter().filter(|e| **e == Effect::Breaker(BreakerCall::Failed)).count(), 1);
        // Nothing before the back-off.
        assert!(run.due(30).is_empty());
        let asked = run.due(61);
        assert_eq!(asked, vec![Effect::Breaker(BreakerCall::Ask)]);
        assert!(run.due(62).is_empty(), "asked once: no deadline while the breaker answers");
        let out = run.core.on_breaker_permit(&Permit::Go, run.at(62));
        let order = prompt(&out).expect("the resume").clone();
        assert_eq!(order.kind, PromptKind::Continue);
        assert_eq!(order.model, None, "the first resume runs on the session's own model");
        assert!(order.require_idle);
        assert!(order.template.contains("provider"), "{}", order.template);
        assert_eq!(records(&out)[0].0, Action::Recover);
        run.core.on_prompt_finished(&order, &sent(&order), run.at(62));
        assert_eq!(run.core.deadline(), None, "once per step: nothing more is due");
        assert_eq!(run.core.export(run.at(62)).outage.resumed_step, 1, "the ledger knows the step was sent");
    }

    #[test]
    fn a_resume_that_fails_again_waits_twice_as_long_and_then_uses_the_fallback_model() {
        let mut run = Run::new(rules());
        run.todos(0);
        run.feed(&frames(HTTP429), 1);
        run.due(61);
        let out = run.core.on_breaker_permit(&Permit::Go, run.at(61));
        let order = prompt(&out).unwrap().clone();
        run.core.on_prompt_finished(&order, &sent(&order), run.at(61));
        // The resumed turn fails too (a new assistant message).
        // (From its first `busy` on: the person's message is not repeated.)
        let all = frames(HTTP429);
        let first_busy =
            all.iter().position(|e| matches!(e, Event::SessionStatus { status: Status::Busy, .. })).unwrap();
        let again = all[first_busy..]
            .iter()
            .cloned()
            .map(|e| match e {
                Event::MessageUpdated(mut m) => {
                    m.id = m.id.replace("msg_", "msg_again");
                    Event::MessageUpdated(m)
                }
                e => e,
            })
            .collect::<Vec<_>>();
        let out = run.feed(&again, 70);
        let rec = records(&out).into_iter().find(|(a, _, _)| *a == Action::ProviderError).expect("counted");
        assert!(rec.2.contains("resume 2"), "{}", rec.2);
        assert!(run.due(70 + 119).is_empty(), "step 2 waits 120 s");
        assert_eq!(run.due(70 + 121), vec![Effect::Breaker(BreakerCall::Ask)]);
        let out = run.core.on_breaker_permit(&Permit::Go, run.at(191));
        let order = prompt(&out).unwrap();
        assert_eq!(order.model.as_ref().map(|m| m.model_id.as_str()), Some("fake-model-2"));
        assert!(records(&out)[0].2.contains("fake/fake-model-2"), "{:?}", records(&out));
    }

    #[test]
    fn waiting_on_the_breaker_resumes_when_it_closes_and_progress_ends_the_outage() {
        let mut run = Run::new(rules());
        run.todos(0);
        run.feed(&frames(HTTP429), 1);
        run.due(61);
        let wait = Permit::Wait { probe: Some("ses_B".into()), retry_at: None };
        let out = run.core.on_breaker_permit(&wait, run.at(61));
        assert_eq!(records(&out)[0].0, Action::Breaker);
        assert!(prompt(&out).is_none());
        assert_eq!(run.core.deadline(), None, "no timer: the breaker's change wakes it");
        assert!(run.core.resume_pending(), "not evicted while it waits");
        assert_eq!(run.core.on_breaker_changed(run.at(80)), vec![Effect::Breaker(BreakerCall::Ask)]);
        let out = run.core.on_breaker_permit(&Permit::Go, run.at(80));
        let order = prompt(&out).unwrap().clone();
        run.core.on_prompt_finished(&order, &sent(&order), run.at(80));
        // The resumed turn finishes normally.
        let ok = decode(r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_ok","sessionID":"ses_A","role":"assistant","finish":"stop","tokens":{"input":10,"output":5,"reasoning":0,"cache":{"read":0,"write":0}},"time":{"created":1,"completed":2}}}}"#).unwrap().event;
        let out = run.feed(&[ok], 85);
        assert!(out.contains(&Effect::Breaker(BreakerCall::Recovered)), "{out:?}");
        assert!(records(&out).iter().any(|(a, _, r)| *a == Action::ProviderError && r.contains("back-off reset")));
        assert!(!run.core.resume_pending());
    }

    /// A normal turn: busy, a finished reply, idle.
    fn turn_ok(run: &mut Run, message: &str, secs: u64) -> Vec<Effect> {
        let status = |s: &str| {
            decode(&format!(
                r#"{{"type":"session.status","properties":{{"sessionID":"ses_A","status":{{"type":"{s}"}}}}}}"#
            ))
            .unwrap()
            .event
        };
        let reply = decode(&format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{message}","sessionID":"ses_A","role":"assistant","finish":"stop","time":{{"created":1,"completed":2}}}}}}}}"#)).unwrap().event;
        run.feed(&[status("busy"), reply, status("idle")], secs)
    }

    #[test]
    fn after_the_fallback_cooldown_the_next_nudge_carries_the_sessions_own_model_again() {
        let mut rules = rules();
        rules.nudge.enabled = true;
        rules.recovery.fallback_cooldown = Duration::from_secs(600);
        let mut run = Run::new(rules);
        run.todos(0);
        let all = frames(HTTP429);
        run.feed(&all, 1);
        run.due(61);
        let order = prompt(&run.core.on_breaker_permit(&Permit::Go, run.at(61))).unwrap().clone();
        run.core.on_prompt_finished(&order, &sent(&order), run.at(61));
        let first_busy =
            all.iter().position(|e| matches!(e, Event::SessionStatus { status: Status::Busy, .. })).unwrap();
        let again: Vec<Event> = all[first_busy..]
            .iter()
            .cloned()
            .map(|e| match e {
                Event::MessageUpdated(mut m) => {
                    m.id = m.id.replace("msg_", "msg_again");
                    Event::MessageUpdated(m)
                }
                e => e,
            })
            .collect();
        run.feed(&again, 70);
        run.due(191);
        let order = prompt(&run.core.on_breaker_permit(&Permit::Go, run.at(191))).unwrap().clone();
        assert_eq!(order.model.as_ref().map(|m| m.model_id.as_str()), Some("fake-model-2"));
        run.core.on_prompt_finished(&order, &sent(&order), run.at(191));
        // Working on the fallback; within the cool-down a nudge keeps it.
        turn_ok(&mut run, "msg_ok1", 200);
        let out = run.due(201);
        let nudge = prompt(&out).expect("a nudge").clone();
        assert_eq!((nudge.kind, nudge.model.clone()), (PromptKind::Nudge, None));
        run.core.on_prompt_finished(&nudge, &sent(&nudge), run.at(201));
        // Past the cool-down: the next nudge names the session's own model, once.
        turn_ok(&mut run, "msg_ok2", 900);
        let out = run.due(901);
        let nudge = prompt(&out).expect("a nudge").clone();
        let own = nudge.model.clone().expect("the session's own model");
        assert_eq!((own.provider_id.as_str(), own.model_id.as_str()), ("fake", "fake-model"));
        assert!(records(&out).iter().any(|(a, _, r)| *a == Action::ProviderError && r.contains("own model")));
        run.core.on_prompt_finished(&nudge, &sent(&nudge), run.at(901));
        turn_ok(&mut run, "msg_ok3", 1000);
        let out = run.due(1001);
        assert_eq!(prompt(&out).map(|o| o.model.clone()), Some(None), "once: then the last turn's model is its own");
    }

    #[test]
    fn a_failed_turn_without_todos_is_resumed_in_a_top_level_session_but_not_in_a_subagent() {
        let mut top = Run::new(rules());
        let out = top.feed(&frames(HTTP429), 1);
        let rec = records(&out).into_iter().find(|(a, _, _)| *a == Action::ProviderError).unwrap();
        assert_eq!(rec.1, Outcome::Done, "the person's request went unanswered: {}", rec.2);
        assert!(top.core.resume_pending());

        let mut child = Run::new(rules());
        child.core.hydrate(&SessionInfo {
            id: "ses_A".into(),
            parent_id: Some("ses_parent".into()),
            directory: Some("/p".into()),
            title: None,
            time: Default::default(),
            metadata: None,
        });
        let out = child.feed(&frames(HTTP429), 1);
        let rec = records(&out).into_iter().find(|(a, _, _)| *a == Action::ProviderError).unwrap();
        assert_eq!(rec.1, Outcome::Declined);
        assert!(rec.2.contains("subagent"), "{}", rec.2);
        assert!(out.contains(&Effect::Breaker(BreakerCall::Failed)), "still evidence of an outage");
        assert!(!child.core.resume_pending());
        // With open todos a subagent has work of its own: it is resumed.
        let mut busy_child = Run::new(rules());
        busy_child.core.hydrate(&SessionInfo {
            id: "ses_A".into(),
            parent_id: Some("ses_parent".into()),
            directory: Some("/p".into()),
            title: None,
            time: Default::default(),
            metadata: None,
        });
        busy_child.todos(0);
        busy_child.feed(&frames(HTTP429), 1);
        assert!(busy_child.core.resume_pending());
    }

    #[test]
    fn a_person_writing_during_the_back_off_is_no_sign_the_provider_is_back() {
        let mut run = Run::new(rules());
        run.todos(0);
        run.feed(&frames(HTTP429), 1);
        let person = [
            r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_person","sessionID":"ses_A","role":"user","time":{"created":1}}}}"#,
            r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_p","messageID":"msg_person","sessionID":"ses_A","type":"text","text":"are you there?"}}}"#,
        ]
        .map(|f| decode(f).unwrap().event);
        let out = run.feed(&person, 10);
        assert!(!out.contains(&Effect::Breaker(BreakerCall::Recovered)), "{out:?}");
        assert!(run.core.resume_pending(), "the resume stays scheduled until a model call finishes");
    }

    #[test]
    fn an_overflow_an_abort_or_a_missing_model_schedules_no_resume() {
        for capture in [
            include_str!("../../../../actors/tests/fixtures/captures/context_overflow_autocompact_disabled.jsonl"),
            include_str!("../../../../actors/tests/fixtures/captures/prompt_with_unknown_model.jsonl"),
        ] {
            let (mut cores, t0) = (std::collections::HashMap::<String, SessionCore>::new(), Instant::now());
            for line in capture.lines() {
                let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
                v.as_object_mut().unwrap().remove("_recv");
                let e = decode(&v.to_string()).unwrap().event;
                let Some(id) = e.session_id().map(str::to_string) else { continue };
                let now = Now { mono: t0, wall_ms: 0 };
                let core =
                    cores.entry(id.clone()).or_insert_with(|| SessionCore::new("srv", &id, Arc::new(rules()), now));
                let out = core.observe(&e, now);
                assert!(!records(&out).iter().any(|(a, _, _)| *a == Action::ProviderError), "{out:?}");
            }
            assert!(cores.values().all(|c| !c.resume_pending()));
        }
    }

    #[test]
    fn a_restart_after_the_resume_was_sent_does_not_send_it_again() {
        let mut run = Run::new(rules());
        run.todos(0);
        run.feed(&frames(HTTP429), 1);
        run.due(61);
        let out = run.core.on_breaker_permit(&Permit::Go, run.at(61));
        let order = prompt(&out).unwrap().clone();
        run.core.on_prompt_finished(&order, &sent(&order), run.at(61));
        let saved = run.core.export(run.at(61));
        let (mut fresh, _) = test_core(rules());
        fresh.restore(&saved, run.at(62));
        assert_eq!(fresh.deadline(), None, "the step was sent: nothing is due after the restart");
        // Saved before the step was sent: it stays due at its wall-clock time.
        let mut run = Run::new(rules());
        run.todos(0);
        run.feed(&frames(HTTP429), 1);
        let saved = run.core.export(run.at(30));
        let (mut fresh, t) = test_core(rules());
        fresh.restore(&saved, Now { mono: t, wall_ms: run.at(31).wall_ms });
        let due = fresh.deadline().expect("still due");
        assert!(due > t + Duration::from_secs(20) && due <= t + Duration::from_secs(31), "{:?}", due - t);
    }
}
