//! The chat request the model is asked: the session's situation and its latest
//! messages, and the one form its answer must take. Pure.

use crate::advisor::Situation;
use crate::config::AdvisorConfig;
use crate::ports::ChatRequest;
use crate::redact::Redactor;

/// Marks an advisor request (test doubles tell it apart from a session's own turns).
pub const SYSTEM_MARKER: &str = "You advise Shepherd";

const SYSTEM: &str = "You advise Shepherd, a supervisor of AI coding-agent sessions. \
Given one session's state, recommend ONE action: wait (leave it alone, it is working), \
abort (stop the stuck turn), continue (prompt it to go on), compact (summarise its context), \
handoff (move the work to a fresh session). Explain briefly if you like, then end your answer \
with exactly @ACTION:CONFIDENCE, e.g. @wait:0.8 (confidence from 0 to 1).";

/// How much of one message the model is shown.
const MESSAGE_CHARS: usize = 800;

/// The request for `s`, with the session's latest messages (`role: text`, oldest first),
/// every text passed through `redactor`: this leaves for an external model.
pub fn build(s: &super::Situation, messages: &[String], cfg: &AdvisorConfig, redactor: &Redactor) -> ChatRequest {
    // Each message before it is cut (a secret cut in half would no longer match), then
    // the whole (todos, agent name).
    let messages: Vec<String> = messages.iter().map(|m| redactor.redact(m).into_owned()).collect();
    ChatRequest {
        model: cfg.model.clone(),
        system: SYSTEM.to_string(),
        user: redactor.redact_owned(describe(s, &messages)),
        max_tokens: cfg.max_tokens,
        temperature: cfg.temperature,
    }
}

fn describe(s: &Situation, messages: &[String]) -> String {
    let question = match s.about {
        super::About::Abort => "The session is busy but silent: Shepherd is about to abort and continue it.",
        super::About::Nudge => "The session is idle with open todos: Shepherd is about to nudge it to go on.",
    };
    let mut out = format!("{question}\n");
    let age = s.session_age.map_or("unknown".to_string(), |a| format!("{}s", a.as_secs()));
    out.push_str(&format!("Session age: {age}\n"));
    out.push_str(&format!("Time since progress: {}s\n", s.since_activity.as_secs()));
    out.push_str(&format!("Recovery attempts since progress: {}\n", s.attempts));
    match (s.context_tokens, s.context_window) {
        (Some(t), Some(w)) => out.push_str(&format!("Context: {t} of {w} tokens\n")),
        (Some(t), None) => out.push_str(&format!("Context: {t} tokens (window unknown)\n")),
        _ => out.push_str("Context: unknown\n"),
    }
    if let Some(agent) = &s.agent {
        out.push_str(&format!("Agent: {agent}\n"));
    }
    out.push_str(&format!("Working on (last part type): {}\n", s.part.as_deref().unwrap_or("unknown")));
    if !s.recent_stall_parts.is_empty() {
        out.push_str(&format!("Earlier stalls were on: {}\n", s.recent_stall_parts.join(", ")));
    }
    out.push_str(&format!("Todos ({} open of {}):\n", s.open_todos(), s.todos.len()));
    for t in &s.todos {
        let mark = if t.status.is_open() { "[ ]" } else { "[x]" };
        out.push_str(&format!("- {mark} {}\n", t.content));
    }
    if !messages.is_empty() {
        out.push_str("Latest messages:\n");
        for m in messages {
            let cut: String = m.chars().take(MESSAGE_CHARS).collect();
            out.push_str(&format!("- {cut}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::advisor::About;
    use crate::event::{Todo, TodoStatus};

    #[test]
    fn the_prompt_carries_the_sessions_context_and_the_answer_form() {
        let s = Situation {
            about: About::Abort,
            session_age: Some(Duration::from_secs(400)),
            since_activity: Duration::from_secs(190),
            todos: vec![Todo { content: "write tests".into(), status: TodoStatus::Pending, priority: None }],
            context_tokens: Some(5000),
            context_window: Some(200_000),
            attempts: 1,
            part: Some("tool:bash".into()),
            recent_stall_parts: vec!["text".into()],
            agent: Some("build".into()),
        };
        let cfg = AdvisorConfig { model: "m".into(), ..AdvisorConfig::default() };
        let r = build(&s, &["user: fix it".into(), "assistant: on it".into()], &cfg, &Redactor::default());
        assert!(r.system.starts_with(SYSTEM_MARKER) && r.system.contains("@ACTION:CONFIDENCE"));
        for needle in [
            "190s",
            "5000 of 200000",
            "tool:bash",
            "Earlier stalls were on: text",
            "[ ] write tests",
            "assistant: on it",
            "attempts since progress: 1",
        ] {
            assert!(r.user.contains(needle), "{needle} missing in:\n{}", r.user);
        }
        assert_eq!((r.model.as_str(), r.max_tokens, r.temperature), ("m", 500, 0.1));
    }

    #[test]
    fn secrets_in_messages_and_todos_do_not_reach_the_model() {
        let s = Situation {
            about: About::Nudge,
            session_age: None,
            since_activity: Duration::from_secs(5),
            todos: vec![Todo {
                content: "rotate GITHUB_TOKEN=ghp_R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx".into(),
                status: TodoStatus::Pending,
                priority: None,
            }],
            context_tokens: None,
            context_window: None,
            attempts: 0,
            part: None,
            recent_stall_parts: vec![],
            agent: None,
        };
        // A token across the 800-character cut: what is left of it after the cut is too
        // short to look like a token, so it must go before the cut.
        let long = format!("user: {} ghp_R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx", "x".repeat(780));
        let messages = [long, "user: psql postgres://app:s3cr3t-pg-pass@db/shop".into()];
        let r = build(&s, &messages, &AdvisorConfig::default(), &Redactor::default());
        for secret in ["R7bXc2VqL", "s3cr3t-pg-pass", "R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx"] {
            assert!(!r.user.contains(secret), "{secret} reached the model:\n{}", r.user);
        }
        assert!(r.user.contains("postgres://app:[REDACTED]@db/shop"), "{}", r.user);
    }
}
