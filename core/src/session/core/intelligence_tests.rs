//! The core's recovery intelligence as a specification: repeated continues escalate,
//! spinning tools are reported and are not progress, planning sessions get the
//! planning timeout and continue, nudges and continues carry the tool-call-as-text scan.

use super::tests::Bench;
use super::*;

/// A bench whose rules start from the defaults, adjusted by `configure`.
fn bench(configure: impl FnOnce(&mut SessionRules)) -> Bench {
    let mut rules = super::tests::unadvised(SessionRules::default());
    configure(&mut rules);
    Bench::with_rules(rules)
}

impl Bench {
    fn user_turn(&mut self, secs: u64, msg: &str, agent: &str) {
        self.feed(secs, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"user","agent":"{agent}","model":{{"providerID":"fake","modelID":"m"}},"time":{{"created":1}}}}}}}}"#));
    }
    fn assistant(&mut self, secs: u64, msg: &str) {
        self.feed(secs, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"m","time":{{"created":1}}}}}}}}"#));
    }
    fn tool(&mut self, secs: u64, part: &str, tool: &str, status: &str, input: &str) -> Vec<Effect> {
        self.feed(secs, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"{part}","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"{tool}","state":{{"status":"{status}","input":{input}}}}}}}}}"#))
    }
}

fn records(effects: &[Effect]) -> Vec<(Action, Outcome)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) => Some((r.action, r.outcome)),
            _ => None,
        })
        .collect()
}

fn record(effects: &[Effect], action: Action) -> ActionRecord {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::Record(r) if r.action == action => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {action:?} record in {effects:?}"))
}

fn order(effects: &[Effect]) -> Option<RecoveryOrder> {
    effects.iter().find_map(|e| match e {
        Effect::Recover(o) => Some(o.clone()),
        _ => None,
    })
}

#[test]
fn three_continues_in_the_window_escalate_to_a_compaction_instead_of_a_fourth() {
    let mut b = bench(|r| {
        r.handoff.enabled = false;
        r.recovery.max_recoveries = 10;
        r.recovery.max_auto_submits = 10;
    });
    b.user_turn(0, "msg_U", "build");
    b.busy(0);
    b.assistant(0, "msg_A");
    let mut t = 0;
    for _ in 0..3 {
        t += 180;
        let o = order(&b.tick(t)).expect("a plain recovery");
        assert_eq!(o.escalation, None);
        assert_eq!(o.compact_first, None);
        b.recovered(t);
    }
    t += 180;
    let effects = b.tick(t);
    let o = order(&effects).expect("an escalation");
    assert_eq!(o.escalation, Some(Escalation::Compact));
    let (model, _) = o.compact_first.expect("compacts between the abort and the continue");
    assert_eq!(model.model_id, "m");
    let esc = record(&effects, Action::Escalate);
    assert_eq!(esc.outcome, Outcome::Done);
    assert_eq!(esc.numbers.round, Some(3), "the continues that did not help");
    assert_eq!(esc.numbers.window_ms, Some(600_000));

    // The escalation's own continue reports its compaction as the escalation's.
    let now = b.at(t);
    let after = b.core.on_recovery_finished(
        &RecoveryReport::Continued {
            idle_after_ms: Some(20),
            open_todos: 0,
            compacted: Some(Ok(())),
            tool_call_as_text: None,
            waited_ms: 0,
        },
        now,
    );
    assert!(record(&after, Action::Compact).reason.contains("escalation of repeated continues"));
    // Once per progress period: the next stall is a plain recovery again.
    let o = order(&b.tick(t + 180)).expect("plain");
    assert_eq!(o.escalation, None);
}

#[test]
fn with_hand_off_enabled_three_continues_escalate_to_a_hand_off() {
    let mut b = bench(|r| {
        r.handoff.enabled = true;
        r.recovery.max_recoveries = 10;
        r.recovery.max_auto_submits = 10;
    });
    b.user_turn(0, "msg_U", "build");
    b.busy(0);
    b.assistant(0, "msg_A");
    let mut t = 0;
    for _ in 0..3 {
        t += 180;
        order(&b.tick(t)).expect("a plain recovery");
        b.recovered(t);
    }
    let effects = b.tick(t + 180);
    assert!(order(&effects).is_none(), "no fourth continue");
    assert!(record(&effects, Action::Escalate).reason.contains("hand_off"));
    let handoff = effects
        .iter()
        .find_map(|e| match e {
            Effect::HandOff(o) => Some(o.clone()),
            _ => None,
        })
        .expect("the hand-off starts");
    assert!(handoff.abort_first, "the stalled turn is aborted first");
    assert_eq!(b.core.deadline(), None, "no stall recovery while the hand-off runs");
}

#[test]
fn continues_spread_beyond_the_window_do_not_escalate() {
    let mut b = bench(|r| {
        r.recovery.max_recoveries = 10;
        r.recovery.max_auto_submits = 10;
        r.recovery.stall_timeout = Duration::from_secs(400);
    });
    b.user_turn(0, "msg_U", "build");
    b.busy(0);
    b.assistant(0, "msg_A");
    let mut t = 0;
    for _ in 0..4 {
        t += 400;
        let o = order(&b.tick(t)).expect("recovery");
        assert_eq!(o.escalation, None, "at {t}s only two continues lie within 10 minutes");
        b.recovered(t);
    }
}

#[test]
fn real_progress_clears_the_continue_count() {
    let mut b = bench(|r| r.recovery.max_recoveries = 10);
    b.user_turn(0, "msg_U", "build");
    b.busy(0);
    b.assistant(0, "msg_A");
    for t in [180, 360] {
        order(&b.tick(t)).unwrap();
        b.recovered(t);
    }
    b.tool(400, "prt_1", "edit", "completed", r#"{"path":"a"}"#);
    for t in [580, 760] {
        let o = order(&b.tick(t)).unwrap();
        assert_eq!(o.escalation, None);
        b.recovered(t);
    }
}

#[test]
fn without_a_known_model_the_escalation_is_declined_and_the_stall_recovered_as_usual() {
    let mut b = bench(|r| {
        r.handoff.enabled = false;
        r.recovery.max_recoveries = 10;
        r.recovery.max_auto_submits = 10;
    });
    b.busy(0);
    let mut t = 0;
    for _ in 0..3 {
        t += 180;
        order(&b.tick(t)).unwrap();
        b.recovered(t);
    }
    t += 180;
    let effects = b.tick(t);
    assert_eq!(records(&effects), vec![(Action::Escalate, Outcome::Declined)]);
    assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(t)), "due again at once");
    let o = order(&b.tick(t)).expect("the usual recovery");
    assert_eq!(o.escalation, None);
}

#[test]
fn the_same_tool_call_repeated_is_reported_once_and_is_not_progress() {
    let mut b = bench(|r| {
        r.loops.spin_count = 3;
        r.recovery.max_recoveries = 10;
    });
    b.busy(0);
    order(&b.tick(180)).unwrap();
    b.recovered(180);
    assert_eq!(b.core.attempts(), 1);
    let mut reported = Vec::new();
    for i in 0..5 {
        reported.extend(b.tool(200 + i, &format!("prt_{i}"), "bash", "completed", r#"{"command":"ls"}"#));
    }
    let spins: Vec<_> = records(&reported).into_iter().filter(|(a, _)| *a == Action::SpinningTool).collect();
    assert_eq!(spins.len(), 1, "reported once per run");
    assert!(record(&reported, Action::SpinningTool).reason.contains("bash"));
    // The first two calls were progress; the spinning ones after them are not.
    order(&b.tick(204 + 180)).unwrap();
    assert_eq!(b.core.attempts(), 1, "no progress since the run started spinning");
}

#[test]
fn a_different_call_in_between_is_not_spinning() {
    let mut b = bench(|r| r.loops.spin_count = 3);
    b.busy(0);
    let mut all = Vec::new();
    for i in 0..6 {
        let input = if i % 2 == 0 { r#"{"command":"cargo test"}"# } else { r#"{"path":"src/lib.rs"}"# };
        let tool = if i % 2 == 0 { "bash" } else { "edit" };
        all.extend(b.tool(i, &format!("prt_{i}"), tool, "completed", input));
    }
    assert!(records(&all).is_empty());
}

#[test]
fn a_planning_session_gets_the_planning_timeout_and_the_plan_continue() {
    let mut b = bench(|r| {
        r.recovery.stall_timeout = Duration::from_secs(180);
        r.recovery.planning_timeout = Duration::from_secs(300);
    });
    b.user_turn(0, "msg_U", "plan");
    b.busy(0);
    assert!(b.core.is_planning());
    assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(300)));
    assert!(order(&b.tick(180)).is_none(), "the stall timeout does not apply");
    let effects = b.tick(300);
    let o = order(&effects).expect("recovered at the planning timeout");
    assert!(o.planning, "the continue asks to finish the plan");
    assert!(record(&effects, Action::StallDetected).reason.contains("planning"));
}

#[test]
fn an_announced_plan_is_planning_until_an_edit() {
    let mut b = bench(|_| {});
    b.user_turn(0, "msg_U", "build");
    b.busy(0);
    b.assistant(1, "msg_A");
    assert!(!b.core.is_planning());
    b.feed(2, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_t","messageID":"msg_A","sessionID":"ses_A","type":"text","text":"Here is my plan:\n1. parse\n2. test"}}}"#);
    assert!(b.core.is_planning());
    assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(2 + 300)));
    b.tool(3, "prt_e", "edit", "running", r#"{"path":"a"}"#);
    b.tool(4, "prt_e", "edit", "completed", r#"{"path":"a"}"#);
    assert!(!b.core.is_planning(), "execution ends planning");
    assert_eq!(b.core.deadline(), Some(b.t0 + Duration::from_secs(4 + 180)));
}

#[test]
fn stalls_record_the_last_part_type() {
    let mut b = bench(|_| {});
    b.busy(0);
    b.feed(1, r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_r","messageID":"msg_A","sessionID":"ses_A","type":"reasoning","text":"hmm"}}}"#);
    let effects = b.tick(181);
    assert_eq!(record(&effects, Action::StallDetected).numbers.last_part.as_deref(), Some("reasoning"));
}

#[test]
fn continues_and_nudges_carry_the_tool_call_as_text_scan_and_reviews_do_not() {
    let mut b = bench(|r| r.nudge.user_quiet = Duration::from_secs(1));
    b.busy(0);
    b.feed(
        0,
        r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"pending"}]}}"#,
    );
    b.feed(1, r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_A","sessionID":"ses_A","role":"assistant","finish":"stop","time":{"created":1,"completed":2}}}}"#);
    b.feed(1, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
    let effects = b.tick(10);
    let nudge = effects
        .iter()
        .find_map(|e| match e {
            Effect::Prompt(o) if o.kind == PromptKind::Nudge => Some(o.clone()),
            _ => None,
        })
        .expect("a nudge");
    let scan = nudge.tool_text_scan.clone().expect("nudges look for tool calls written as text");
    assert_eq!(scan.messages, 20);
    // A sent nudge that found one says so in its record.
    let now = b.at(11);
    let found = TextualToolCall { pattern: "<function=", excerpt: "<function=bash>".into() };
    let done = b.core.on_prompt_finished(
        &nudge,
        &Delivery::Sent { text: "x".into(), todos: vec![], tool_call_as_text: Some(found), waited_ms: 0 },
        now,
    );
    assert!(record(&done, Action::Nudge).reason.contains("<function="));
    let review = b.core.custom_order("x".into(), b.at(12));
    assert_eq!(review.tool_text_scan, None);
}
