//! The text of the prompts Shepherd sends, rendered from the configured templates.
//!
//! Pure: templates and facts in, text out. Variables are written `{name}`; an unknown
//! `{word}` is left as it is, so a template may contain braces of its own.

use crate::config::RecoveryConfig;
use crate::event::{Todo, TodoStatus};

/// At most this many open todos are listed in `{todoList}`; the issue fixes it at five
/// so the prompt stays short whatever the list length.
pub const TODO_LIST_MAX: usize = 5;

/// Counts of a todo list, as the templates name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TodoCounts {
    /// `pending` + `in_progress`.
    pub open: usize,
    pub completed: usize,
    pub total: usize,
}

impl TodoCounts {
    pub fn of(todos: &[Todo]) -> Self {
        Self {
            open: todos.iter().filter(|t| t.status.is_open()).count(),
            completed: todos.iter().filter(|t| t.status == TodoStatus::Completed).count(),
            total: todos.len(),
        }
    }
}

/// The facts a template may name besides the todos.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptFacts {
    pub attempts: u32,
    pub max_attempts: u32,
    /// A short account of the session's state (`{contextSummary}`).
    pub context_summary: String,
}

/// The continue prompt after a stall recovery: the todo template when todos are open.
pub fn render_continue(cfg: &RecoveryConfig, todos: &[Todo], attempt: u32) -> String {
    let template =
        if TodoCounts::of(todos).open > 0 { &cfg.continue_with_todos_message } else { &cfg.continue_message };
    render(
        template,
        todos,
        &PromptFacts { attempts: attempt, max_attempts: cfg.max_auto_submits, context_summary: String::new() },
    )
}

/// Renders any template with the todo variables (`{pending}`, `{total}`, `{completed}`,
/// `{todoList}`), `{attempts}`, `{maxAttempts}` and `{contextSummary}`.
pub fn render(template: &str, todos: &[Todo], facts: &PromptFacts) -> String {
    let counts = TodoCounts::of(todos);
    fill(
        template,
        &[
            ("pending", counts.open.to_string()),
            ("total", counts.total.to_string()),
            ("completed", counts.completed.to_string()),
            ("todoList", todo_list(todos)),
            ("attempts", facts.attempts.to_string()),
            ("maxAttempts", facts.max_attempts.to_string()),
            ("contextSummary", facts.context_summary.clone()),
        ],
    )
}

/// The open todos, one per line, at most [`TODO_LIST_MAX`].
pub fn todo_list(todos: &[Todo]) -> String {
    todos
        .iter()
        .filter(|t| t.status.is_open())
        .take(TODO_LIST_MAX)
        .map(|t| format!("- [{}] {}", status_word(t.status), t.content))
        .collect::<Vec<_>>()
        .join("\n")
}

fn status_word(s: TodoStatus) -> &'static str {
    match s {
        TodoStatus::Pending => "pending",
        TodoStatus::InProgress => "in progress",
        TodoStatus::Completed => "completed",
        TodoStatus::Cancelled => "cancelled",
    }
}

/// Replaces each `{name}` with its value, in one pass (values are never re-expanded).
///
/// Linear in the template's length whatever its braces: each byte is looked at once
/// (a template is configuration, and `{`-heavy text such as JSON examples must not cost
/// quadratic time). A `{` opens a candidate name that ends at the next `}`; another `{`
/// before that `}` means the first one was a literal brace, and the scan goes on from
/// the second (names never contain braces). Only a candidate that closes is looked up.
pub fn fill(template: &str, vars: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(template.len() + 64);
    fill_counted(template, vars, &mut out);
    out
}

/// [`fill`] into `out`; returns the work done — bytes scanned (each once) plus name
/// bytes compared in look-ups (a candidate's bytes once per variable at most) — so a
/// test can check it is linear without timing anything.
fn fill_counted(template: &str, vars: &[(&str, String)], out: &mut String) -> usize {
    let bytes = template.as_bytes();
    let mut examined = 0;
    // `copied..` is not yet in `out`; `open` is the `{` of the candidate being read.
    let (mut copied, mut open) = (0, None);
    for (i, &b) in bytes.iter().enumerate() {
        examined += 1;
        match (b, open) {
            (b'{', _) => open = Some(i),
            (b'}', Some(start)) => {
                // `{` and `}` are ASCII, so both ends are char boundaries.
                let name = &template[start + 1..i];
                examined += name.len() * vars.len();
                if let Some((_, value)) = vars.iter().find(|(n, _)| *n == name) {
                    out.push_str(&template[copied..start]);
                    out.push_str(value);
                    copied = i + 1;
                }
                open = None;
            }
            _ => {}
        }
    }
    out.push_str(&template[copied..]);
    examined
}

/// The template of a person's custom prompt (control API): their text, then the open
/// todos and the context summary when asked for, as placeholders [`render`] fills with
/// the fresh facts at delivery. `None` when the text is missing or blank: nothing to
/// send.
pub fn custom_template(text: Option<&str>, with_todos: bool, with_summary: bool) -> Option<String> {
    let mut template = text.filter(|t| !t.trim().is_empty())?.to_string();
    if with_todos {
        template.push_str("\n\nOpen todos ({pending} of {total}):\n{todoList}");
    }
    if with_summary {
        template.push_str("\n\n{contextSummary}");
    }
    Some(template)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_prompt_is_the_persons_text_then_what_they_asked_to_add() {
        assert_eq!(custom_template(Some("fix it"), false, false).as_deref(), Some("fix it"));
        let both = custom_template(Some("fix it"), true, true).unwrap();
        assert_eq!(both, "fix it\n\nOpen todos ({pending} of {total}):\n{todoList}\n\n{contextSummary}");
        assert_eq!(custom_template(None, true, true), None);
        assert_eq!(custom_template(Some("  \n"), true, false), None);
    }

    fn todo(content: &str, status: TodoStatus) -> Todo {
        Todo { content: content.into(), status, priority: None }
    }

    #[test]
    fn open_todos_are_rendered_into_the_todo_template() {
        let cfg = RecoveryConfig {
            continue_with_todos_message:
                "{pending}/{total} open, {completed} done, try {attempts}/{maxAttempts}:\n{todoList}".into(),
            ..RecoveryConfig::default()
        };
        let todos = [
            todo("parse", TodoStatus::Completed),
            todo("test", TodoStatus::InProgress),
            todo("docs", TodoStatus::Pending),
        ];
        assert_eq!(
            render_continue(&cfg, &todos, 2),
            "2/3 open, 1 done, try 2/3:\n- [in progress] test\n- [pending] docs"
        );
    }

    #[test]
    fn without_open_todos_the_plain_template_is_used() {
        let cfg = RecoveryConfig { continue_message: "go on ({attempts})".into(), ..RecoveryConfig::default() };
        assert_eq!(render_continue(&cfg, &[todo("x", TodoStatus::Cancelled)], 1), "go on (1)");
    }

    #[test]
    fn the_todo_list_is_capped_at_five_items() {
        let todos: Vec<_> = (0..8).map(|i| todo(&format!("t{i}"), TodoStatus::Pending)).collect();
        let cfg = RecoveryConfig { continue_with_todos_message: "{todoList}".into(), ..RecoveryConfig::default() };
        assert_eq!(render_continue(&cfg, &todos, 1).lines().count(), TODO_LIST_MAX);
    }

    #[test]
    fn unknown_braces_are_left_alone() {
        assert_eq!(fill("{a} {json: 1} {b", &[("a", "x".into())]), "x {json: 1} {b");
        assert_eq!(fill("{{a}} {x{a}", &[("a", "1".into())]), "{1} {x1");
        assert_eq!(fill("{a}{a}}{", &[("a", "é".into())]), "éé}{");
    }

    /// The complaint was quadratic time on `{`-heavy text (each `{` searched the rest of
    /// the template for its `}`): the scan now examines each byte once, counted here
    /// rather than timed.
    #[test]
    fn filling_is_linear_in_the_template_whatever_the_braces() {
        let vars = [("pending", "3".to_string()), ("total", "4".to_string())];
        for n in [1_000, 10_000, 100_000] {
            for template in [
                "{".repeat(n),
                "{x".repeat(n / 2),
                "{pending}{".repeat(n / 10),
                "}{".repeat(n / 2),
                "{a}".repeat(n / 3),
            ] {
                let mut out = String::new();
                let work = fill_counted(&template, &vars, &mut out);
                assert!(work <= template.len() * (1 + vars.len()), "{n}: {work} for {} bytes", template.len());
            }
        }
    }
}
