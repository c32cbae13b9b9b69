//! The heuristic advisor: rules that always answer, each with a confidence.
//!
//! Used when no model is configured, when the model times out, errors or answers
//! garbage — and first of all, to recognise the obvious cases that never reach the
//! model (a rule at least `advisor.obvious_confidence` sure). The rules, first match wins:
//!
//! | situation | advice |
//! |---|---|
//! | the session is new (younger than `new_session`, 30 s) | wait 0.95 |
//! | stalled on the same part type as its last stall | abort 0.85 |
//! | its stalls were on mixed part types | wait 0.75 |
//! | planning (a reasoning part, or the `plan` agent) quiet past `planning_limit` (60 s) | abort 0.75 |
//! | context past `context_share` (80 %) with open todos | continue 0.8 |
//! | context past `context_share` and every todo done | compact 0.8 |
//! | stalled (or idle) with open todos | continue 0.7 |
//! | nothing applies | continue 0.5 |
//!
//! The part-type rules are about stalls: they apply before an abort, not a nudge.
//! The confidences rank the rules against the thresholds in config (`wait_confidence`,
//! `abort_confidence`, `obvious_confidence`); they are part of each rule's definition.

use crate::advisor::{About, Advice, AdviceAction, Situation};
use crate::config::AdvisorConfig;

/// The heuristic's answer and the rule that gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ruled {
    pub advice: Advice,
    pub rule: &'static str,
}

fn ruled(action: AdviceAction, confidence: f64, rule: &'static str) -> Ruled {
    Ruled { advice: Advice { action, confidence }, rule }
}

/// The heuristic's advice for `s`.
pub fn advise(s: &Situation, cfg: &AdvisorConfig) -> Ruled {
    use AdviceAction::*;
    if s.session_age.is_some_and(|age| age < cfg.new_session) {
        return ruled(Wait, 0.95, "new session");
    }
    if s.about == About::Abort {
        if let (Some(part), Some(last)) = (&s.part, s.recent_stall_parts.last()) {
            if part == last {
                return ruled(Abort, 0.85, "stalled on the same part type as the last stall");
            }
        }
        let mut kinds: Vec<&String> = s.recent_stall_parts.iter().chain(s.part.as_ref()).collect();
        kinds.sort();
        kinds.dedup();
        if kinds.len() > 1 {
            return ruled(Wait, 0.75, "stalls on mixed part types");
        }
    }
    let planning = s.part.as_deref() == Some("reasoning") || s.agent.as_deref() == Some("plan");
    if planning && s.since_activity > cfg.planning_limit {
        return ruled(Abort, 0.75, "planning past planning_limit");
    }
    let open = s.open_todos();
    if s.context_share().is_some_and(|share| share > cfg.context_share) {
        return if open > 0 {
            ruled(Continue, 0.8, "context past context_share with open todos")
        } else {
            ruled(Compact, 0.8, "context past context_share, all todos done")
        };
    }
    if open > 0 {
        return ruled(Continue, 0.7, "open todos");
    }
    ruled(Continue, 0.5, "no rule applies")
}

/// An obvious case: the heuristic is sure enough that the model is not asked.
pub fn obvious(r: &Ruled, cfg: &AdvisorConfig) -> bool {
    r.advice.confidence >= cfg.obvious_confidence
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::event::{Todo, TodoStatus};

    fn todo(status: TodoStatus) -> Todo {
        Todo { content: "x".into(), status, priority: None }
    }

    fn stall() -> Situation {
        Situation {
            about: About::Abort,
            session_age: Some(Duration::from_secs(600)),
            since_activity: Duration::from_secs(200),
            todos: vec![],
            context_tokens: None,
            context_window: None,
            attempts: 0,
            part: Some("text".into()),
            recent_stall_parts: vec![],
            agent: Some("build".into()),
        }
    }

    fn advice(s: &Situation) -> (AdviceAction, f64) {
        let r = advise(s, &AdvisorConfig::default());
        (r.advice.action, r.advice.confidence)
    }

    #[test]
    fn a_new_session_is_given_time() {
        let s = Situation { session_age: Some(Duration::from_secs(10)), ..stall() };
        assert_eq!(advice(&s), (AdviceAction::Wait, 0.95));
        assert!(obvious(&advise(&s, &AdvisorConfig::default()), &AdvisorConfig::default()));
    }

    #[test]
    fn a_stall_on_the_same_part_type_as_the_last_one_is_aborted() {
        let s = Situation { recent_stall_parts: vec!["tool:bash".into()], part: Some("tool:bash".into()), ..stall() };
        assert_eq!(advice(&s).0, AdviceAction::Abort);
    }

    #[test]
    fn stalls_on_mixed_part_types_wait() {
        let s = Situation { recent_stall_parts: vec!["text".into()], part: Some("reasoning".into()), ..stall() };
        assert_eq!(advice(&s), (AdviceAction::Wait, 0.75));
    }

    #[test]
    fn planning_quiet_past_the_limit_is_aborted() {
        let s = Situation { part: Some("reasoning".into()), ..stall() };
        assert_eq!(advice(&s).0, AdviceAction::Abort);
        let s = Situation { part: Some("reasoning".into()), since_activity: Duration::from_secs(30), ..stall() };
        assert_ne!(advice(&s).0, AdviceAction::Abort, "not past planning_limit yet");
    }

    #[test]
    fn a_full_context_continues_with_open_todos_and_compacts_when_all_are_done() {
        let full = Situation { context_tokens: Some(90), context_window: Some(100), ..stall() };
        let open = Situation { todos: vec![todo(TodoStatus::Pending), todo(TodoStatus::Completed)], ..full.clone() };
        assert_eq!(advice(&open).0, AdviceAction::Continue);
        let done = Situation { todos: vec![todo(TodoStatus::Completed)], ..full };
        assert_eq!(advice(&done).0, AdviceAction::Compact);
    }

    #[test]
    fn a_stall_with_open_todos_continues() {
        let s = Situation { todos: vec![todo(TodoStatus::InProgress)], ..stall() };
        assert_eq!(advice(&s), (AdviceAction::Continue, 0.7));
    }

    #[test]
    fn part_type_rules_are_about_stalls_not_nudges() {
        let s = Situation {
            about: About::Nudge,
            recent_stall_parts: vec!["text".into()],
            part: Some("text".into()),
            todos: vec![todo(TodoStatus::Pending)],
            ..stall()
        };
        assert_eq!(advice(&s).0, AdviceAction::Continue);
    }

    #[test]
    fn only_a_sure_rule_is_obvious() {
        let cfg = AdvisorConfig::default();
        assert!(!obvious(&advise(&stall(), &cfg), &cfg), "no rule applies: the model is asked");
        let s = Situation { todos: vec![todo(TodoStatus::Pending)], ..stall() };
        assert!(!obvious(&advise(&s, &cfg), &cfg));
    }
}
