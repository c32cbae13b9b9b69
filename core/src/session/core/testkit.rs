//! The benches every test of the core shares: a core under test and its clock, events
//! to feed it, and readers of the effects it returns.

pub(super) use super::*;
pub(super) use crate::config::{CompactionConfig, NudgeConfig, RecoveryConfig};
pub(super) use crate::event::{decode, TodoStatus};
pub(super) use crate::journal::Action;

/// A core under test and its time origin; the intelligence tests use it too.
pub(super) struct Bench {
    pub(super) core: SessionCore,
    pub(super) t0: Instant,
}

pub(super) const CREATED_MS: i64 = 1_000_000;

/// `rules` without the advice hooks (on by default): these benches specify the
/// rules beneath them; the hooks themselves are specified in `core/advice.rs`.
pub(super) fn unadvised(mut rules: SessionRules) -> SessionRules {
    rules.advisor.enabled = false;
    rules
}

/// A core for session `ses_A` in `/p`, created at `CREATED_MS`, and its time origin:
/// the one set-up every core test bench starts from.
pub(super) fn test_core(rules: SessionRules) -> (SessionCore, Instant) {
    let t0 = Instant::now();
    let mut core = SessionCore::new("srv", "ses_A", Arc::new(rules), Now { mono: t0, wall_ms: CREATED_MS });
    core.hydrate(&SessionInfo {
        id: "ses_A".into(),
        parent_id: None,
        directory: Some("/p".into()),
        title: None,
        time: crate::event::Times { created: Some(CREATED_MS), ..Default::default() },
        metadata: None,
    });
    (core, t0)
}

impl Bench {
    pub(super) fn new() -> Self {
        Self::with(RecoveryConfig::default())
    }
    pub(super) fn with(cfg: RecoveryConfig) -> Self {
        Self::with_rules(unadvised(cfg.into()))
    }
    pub(super) fn with_rules(rules: SessionRules) -> Self {
        let (core, t0) = test_core(rules);
        Self { core, t0 }
    }
    pub(super) fn at(&self, secs: u64) -> Now {
        Now { mono: self.t0 + Duration::from_secs(secs), wall_ms: CREATED_MS + secs as i64 * 1000 }
    }
    pub(super) fn feed(&mut self, secs: u64, json: &str) -> Vec<Effect> {
        let event = decode(json).expect("test event decodes").event;
        let now = self.at(secs);
        self.core.observe(&event, now)
    }
    pub(super) fn busy(&mut self, secs: u64) {
        self.feed(secs, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
    }
    pub(super) fn tick(&mut self, secs: u64) -> Vec<Effect> {
        let now = self.at(secs);
        self.core.on_deadline(now)
    }
    /// The recovery procedure reports: aborted, then continued.
    pub(super) fn recovered(&mut self, secs: u64) -> Vec<Effect> {
        let now = self.at(secs);
        self.core.on_recovery_finished(
            &RecoveryReport::Continued {
                idle_after_ms: Some(20),
                open_todos: 0,
                compacted: None,
                tool_call_as_text: None,
                waited_ms: 0,
            },
            now,
        )
    }
}

pub(super) fn actions(effects: &[Effect]) -> Vec<Action> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) => Some(r.action),
            _ => None,
        })
        .collect()
}

pub(super) fn recovers(effects: &[Effect]) -> bool {
    effects.iter().any(|e| matches!(e, Effect::Recover(_)))
}

pub(super) const DELTA: &str = r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_B","partID":"prt_1","field":"text","delta":"x"}}"#;

pub(super) const TODO_PROGRESS: &str = r#"{"type":"todo.updated","properties":{"sessionID":"ses_A","todos":[{"content":"a","status":"completed","priority":"high"}]}}"#;

pub(super) fn record_of(effects: &[Effect], action: Action) -> ActionRecord {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::Record(r) if r.action == action => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {action:?} record in {effects:?}"))
}

pub(super) fn rules() -> SessionRules {
    let mut r = unadvised(SessionRules::default());
    r.nudge.user_quiet = Duration::from_secs(5);
    r
}

pub(super) fn bench_with_rules(rules: SessionRules) -> Bench {
    let t0 = Instant::now();
    let core = SessionCore::new("srv", "ses_A", Arc::new(rules), Now { mono: t0, wall_ms: CREATED_MS });
    Bench { core, t0 }
}

impl Bench {
    pub(super) fn at_ms(&self, ms: u64) -> Now {
        Now { mono: self.t0 + Duration::from_millis(ms), wall_ms: CREATED_MS + ms as i64 }
    }
    pub(super) fn feed_ms(&mut self, ms: u64, json: &str) -> Vec<Effect> {
        let event = decode(json).expect("test event decodes").event;
        let now = self.at_ms(ms);
        self.core.observe(&event, now)
    }
    pub(super) fn tick_ms(&mut self, ms: u64) -> Vec<Effect> {
        let now = self.at_ms(ms);
        self.core.on_deadline(now)
    }
    pub(super) fn todos_ms(&mut self, ms: u64, statuses: &[&str]) -> Vec<Effect> {
        let items: Vec<String> = statuses
            .iter()
            .enumerate()
            .map(|(i, st)| format!(r#"{{"content":"t{i}","status":"{st}","priority":"high"}}"#))
            .collect();
        self.feed_ms(
            ms,
            &format!(r#"{{"type":"todo.updated","properties":{{"sessionID":"ses_A","todos":[{}]}}}}"#, items.join(",")),
        )
    }
    /// One turn: busy, an assistant reply with `text` finishing `finish`, idle.
    pub(super) fn turn_ms(&mut self, ms: u64, msg: &str, text: &str, finish: &str) -> Vec<Effect> {
        let mut out = self
            .feed_ms(ms, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"busy"}}}"#);
        out.extend(self.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"assistant","finish":"{finish}","time":{{"created":1}}}}}}}}"#)));
        let text = serde_json::to_string(text).unwrap();
        out.extend(self.feed_ms(ms, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"prt_{msg}","messageID":"{msg}","sessionID":"ses_A","type":"text","text":{text}}}}}}}"#)));
        out.extend(self.idle_ms(ms));
        out
    }
    pub(super) fn idle_ms(&mut self, ms: u64) -> Vec<Effect> {
        let mut out = self
            .feed_ms(ms, r#"{"type":"session.status","properties":{"sessionID":"ses_A","status":{"type":"idle"}}}"#);
        out.extend(self.feed_ms(ms, r#"{"type":"session.idle","properties":{"sessionID":"ses_A"}}"#));
        out
    }
    pub(super) fn deliver(&mut self, ms: u64, effects: &[Effect]) {
        for e in effects {
            if let Effect::Prompt(order) = e {
                let now = self.at_ms(ms);
                self.core.on_prompt_finished(
                    order,
                    &Delivery::Sent { text: String::new(), todos: vec![], tool_call_as_text: None, waited_ms: 0 },
                    now,
                );
            }
        }
    }
}

pub(super) fn prompts(effects: &[Effect]) -> Vec<PromptKind> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Prompt(o) => Some(o.kind),
            _ => None,
        })
        .collect()
}

pub(super) fn declined(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) if r.outcome == Outcome::Declined => Some(r.reason.clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn child_event(b: &mut Bench, ms: u64, child: &str, json: &str) -> Vec<Effect> {
    let event = decode(json).expect("decodes").event;
    let now = b.at_ms(ms);
    b.core.on_child_event(child, &event, now)
}

pub(super) const CHILD_BUSY: &str =
    r#"{"type":"session.status","properties":{"sessionID":"ses_C","status":{"type":"busy"}}}"#;

pub(super) const CHILD_IDLE: &str =
    r#"{"type":"session.status","properties":{"sessionID":"ses_C","status":{"type":"idle"}}}"#;

pub(super) const CHILD_ABORTED: &str =
    r#"{"type":"session.error","properties":{"sessionID":"ses_C","error":{"name":"MessageAbortedError"}}}"#;

pub(super) fn assistant_with_tokens(b: &mut Bench, ms: u64, id: &str, input: u64, cache_read: u64) {
    b.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","tokens":{{"input":{input},"output":5,"cache":{{"read":{cache_read},"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#));
}

pub(super) fn compactions(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Compact(o) => Some(o.reason.clone()),
            _ => None,
        })
        .collect()
}

/// Compaction alone (the hand-off would take over past `handoff.prepare`).
pub(super) fn compaction_rules() -> SessionRules {
    let mut r = rules();
    r.handoff.enabled = false;
    r
}

pub(super) const OVERFLOW: &str = r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_O","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"error","error":{"name":"ContextOverflowError","data":{"message":"This model's maximum context length is 200000 tokens. However, your messages resulted in 250123 tokens. Please reduce the length of the messages."}},"time":{"created":1,"completed":2}}}}"#;

pub(super) const COMPACTION_PART: &str = r#"{"type":"message.part.updated","properties":{"sessionID":"ses_A","part":{"id":"prt_pc","messageID":"msg_C","sessionID":"ses_A","type":"compaction","auto":true,"overflow":false}}}"#;

pub(super) const SUMMARY_STREAMING: &str = r#"{"type":"message.updated","properties":{"sessionID":"ses_A","info":{"id":"msg_S","sessionID":"ses_A","role":"assistant","summary":true,"providerID":"fake","modelID":"fake-model","time":{"created":1}}}}"#;

pub(super) const SUMMARY_DELTA: &str = r#"{"type":"message.part.delta","properties":{"sessionID":"ses_A","messageID":"msg_S","partID":"prt_s","field":"text","delta":"x"}}"#;

pub(super) fn empty_finish(b: &mut Bench, ms: u64, id: &str) -> Vec<Effect> {
    b.feed_ms(ms, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","finish":"unknown","tokens":{{"input":0,"output":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#))
}

pub(super) fn handoffs(effects: &[Effect]) -> Vec<HandoffOrder> {
    effects.iter().filter_map(|e| if let Effect::HandOff(o) = e { Some(o.clone()) } else { None }).collect()
}

pub(super) fn phases(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) if r.action == Action::Handoff => r.numbers.phase.clone(),
            _ => None,
        })
        .collect()
}

pub(super) fn tokens_json(id: &str, input: u64) -> String {
    format!(
        r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{id}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"fake-model","finish":"stop","tokens":{{"input":{input},"output":10,"reasoning":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":1,"completed":2}}}}}}}}"#
    )
}

/// A bench whose rules start from the defaults, adjusted by `configure`.
pub(super) fn bench(configure: impl FnOnce(&mut SessionRules)) -> Bench {
    let mut rules = unadvised(SessionRules::default());
    configure(&mut rules);
    Bench::with_rules(rules)
}

impl Bench {
    pub(super) fn user_turn(&mut self, secs: u64, msg: &str, agent: &str) {
        self.feed(secs, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"user","agent":"{agent}","model":{{"providerID":"fake","modelID":"m"}},"time":{{"created":1}}}}}}}}"#));
    }
    pub(super) fn assistant(&mut self, secs: u64, msg: &str) {
        self.feed(secs, &format!(r#"{{"type":"message.updated","properties":{{"sessionID":"ses_A","info":{{"id":"{msg}","sessionID":"ses_A","role":"assistant","providerID":"fake","modelID":"m","time":{{"created":1}}}}}}}}"#));
    }
    pub(super) fn tool(&mut self, secs: u64, part: &str, tool: &str, status: &str, input: &str) -> Vec<Effect> {
        self.feed(secs, &format!(r#"{{"type":"message.part.updated","properties":{{"sessionID":"ses_A","part":{{"id":"{part}","messageID":"msg_B","sessionID":"ses_A","type":"tool","tool":"{tool}","state":{{"status":"{status}","input":{input}}}}}}}}}"#))
    }
}

pub(super) fn records(effects: &[Effect]) -> Vec<(Action, Outcome)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Record(r) => Some((r.action, r.outcome)),
            _ => None,
        })
        .collect()
}

pub(super) fn record(effects: &[Effect], action: Action) -> ActionRecord {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::Record(r) if r.action == action => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {action:?} record in {effects:?}"))
}

pub(super) fn order(effects: &[Effect]) -> Option<RecoveryOrder> {
    effects.iter().find_map(|e| match e {
        Effect::Recover(o) => Some(o.clone()),
        _ => None,
    })
}
