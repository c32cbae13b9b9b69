//! The continuation a hand-off gives the fresh session: built from structured state,
//! not from a chat summary.
//!
//! Pure: the hand-off procedure gathers the facts (history, todos, repository state,
//! the model's own account) through the ports and this module turns them into one
//! Markdown document — secrets redacted, sized to a budget. When the budget is tight,
//! sections go in reverse order of how much the successor needs them; the objective and
//! the resume protocol are never dropped.

use crate::event::{Todo, TodoStatus, ToolStatus};
use crate::ports::{HistoryMessage, HistoryPart, RepoState};
use crate::redact::Redactor;

/// Characters per token, for budgeting (a common rule of thumb for English and code).
const CHARS_PER_TOKEN: usize = 4;
/// How much of one user request the objective quotes.
const REQUEST_CHARS: usize = 2000;
/// How many recent tool errors are listed, and how much of each.
const TOOL_ERRORS: usize = 5;
const TOOL_ERROR_CHARS: usize = 300;

/// What the continuation is built from.
#[derive(Debug, Clone, Default)]
pub struct ContinuationFacts<'a> {
    pub session_id: &'a str,
    pub title: Option<&'a str>,
    pub directory: Option<&'a str>,
    /// Oldest first.
    pub history: &'a [HistoryMessage],
    pub todos: &'a [Todo],
    /// Subagent sessions known from events (their purpose comes from the history).
    pub known_children: Vec<String>,
    pub repo: Option<RepoState>,
    /// The model's own answer to the hand-off question, if it gave one.
    pub model_account: Option<String>,
    /// `(tokens, window)` when known.
    pub context: (Option<u64>, Option<u64>),
    pub budget_tokens: u32,
}

/// One section of the document; lower `keep` is dropped first.
struct Section {
    heading: &'static str,
    body: String,
    /// Never dropped (objective, resume protocol).
    required: bool,
    keep: u8,
}

/// Builds the continuation (Markdown), redacted and within budget.
pub fn build(facts: &ContinuationFacts<'_>, redactor: &Redactor) -> String {
    let header = header(facts);
    let mut sections = vec![
        Section { heading: "Objective", body: objective(facts.history, redactor), required: true, keep: 9 },
        Section { heading: "How to resume", body: RESUME_PROTOCOL.to_string(), required: true, keep: 9 },
        Section { heading: "Todos", body: todos(facts.todos), required: false, keep: 8 },
        Section {
            heading: "In the previous model's own words",
            body: facts.model_account.clone().unwrap_or_default(),
            required: false,
            keep: 7,
        },
        Section { heading: "Files edited", body: files_edited(facts.history), required: false, keep: 6 },
        Section {
            heading: "Repository (read by Shepherd; nothing was changed)",
            body: facts.repo.as_ref().map(repo).unwrap_or_default(),
            required: false,
            keep: 5,
        },
        Section {
            heading: "Subagent sessions",
            body: children(facts.history, &facts.known_children, redactor),
            required: false,
            keep: 4,
        },
        Section { heading: "Recent tool errors", body: tool_errors(facts.history, redactor), required: false, keep: 3 },
    ];
    sections.retain(|s| !s.body.trim().is_empty());
    // Before fitting: a secret cut in half by the budget would no longer match (the
    // texts cut while the sections were built were redacted before their cut).
    for s in &mut sections {
        redactor.redact_in_place(&mut s.body);
    }
    let header = redactor.redact_owned(header);
    fit(&header, &mut sections, facts.budget_tokens as usize * CHARS_PER_TOKEN);
    render(&header, &sections)
}

const RESUME_PROTOCOL: &str =
    "1. Read this whole continuation before acting; it replaces the previous session's history.\n\
2. Re-create the open todos above with your todo tool, in the same order and states.\n\
3. Re-read the files you will touch (they may have changed since); do not trust remembered contents.\n\
4. Carry on with the first open todo (or the next step above). Do not redo finished work.\n\
5. If something here contradicts what you find, trust what you find and say so.";

fn header(facts: &ContinuationFacts<'_>) -> String {
    let mut h = format!("# Continuation of session {}", facts.session_id);
    if let Some(t) = facts.title.filter(|t| !t.is_empty()) {
        h.push_str(&format!(" — \"{t}\""));
    }
    h.push_str("\n\nShepherd moved this work to a fresh session because the previous session's context window was ");
    match facts.context {
        (Some(t), Some(w)) if w > 0 => {
            h.push_str(&format!("{:.0}% full ({t} of {w} tokens).", t as f64 * 100.0 / w as f64))
        }
        _ => h.push_str("filling up."),
    }
    if let Some(d) = facts.directory {
        h.push_str(&format!(" Working directory: `{d}`."));
    }
    h
}

/// The first and the latest real user requests.
fn objective(history: &[HistoryMessage], r: &Redactor) -> String {
    let requests: Vec<String> = history.iter().filter(|m| m.is_from_person()).map(HistoryMessage::text).collect();
    match requests.as_slice() {
        [] => "(no request from the person is in the recent history; see the todos)".to_string(),
        [only] => format!("The request:\n\n{}", quote(only, r)),
        [first, .., latest] => {
            format!("The first request:\n\n{}\n\nThe latest request:\n\n{}", quote(first, r), quote(latest, r))
        }
    }
}

fn quote(text: &str, r: &Redactor) -> String {
    truncate(r.redact(text.trim()).as_ref(), REQUEST_CHARS)
        .lines()
        .map(|l| format!("> {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn todos(todos: &[Todo]) -> String {
    let line = |t: &Todo| {
        let mark = match t.status {
            TodoStatus::Completed => "[x]",
            TodoStatus::Cancelled => "[-]",
            TodoStatus::InProgress => "[ ] (in progress)",
            TodoStatus::Pending => "[ ]",
        };
        format!("- {mark} {}", t.content)
    };
    let open: Vec<String> = todos.iter().filter(|t| t.status.is_open()).map(line).collect();
    let done: Vec<String> = todos.iter().filter(|t| !t.status.is_open()).map(line).collect();
    let mut out = String::new();
    if !open.is_empty() {
        out.push_str(&format!("Open:\n{}", open.join("\n")));
    }
    if !done.is_empty() {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!("Done:\n{}", done.join("\n")));
    }
    out
}

/// Tools that write files, and where their input names the file.
const EDITING_TOOLS: &[&str] = &["edit", "write", "multiedit", "patch", "apply_patch"];

fn files_edited(history: &[HistoryMessage]) -> String {
    let mut files: Vec<(String, u32)> = Vec::new();
    for part in history.iter().flat_map(|m| &m.parts) {
        let HistoryPart::Tool { tool, status: ToolStatus::Completed, input, .. } = part else { continue };
        if !EDITING_TOOLS.contains(&tool.as_str()) {
            continue;
        }
        let Some(path) = input.get("filePath").or_else(|| input.get("path")).and_then(|v| v.as_str()) else {
            continue;
        };
        match files.iter_mut().find(|(p, _)| p == path) {
            Some((_, n)) => *n += 1,
            None => files.push((path.to_string(), 1)),
        }
    }
    files
        .iter()
        .map(|(p, n)| if *n > 1 { format!("- `{p}` ({n} edits)") } else { format!("- `{p}`") })
        .collect::<Vec<_>>()
        .join("\n")
}

fn repo(r: &RepoState) -> String {
    let mut lines = Vec::new();
    if let Some(b) = &r.branch {
        lines.push(format!("- branch: `{b}`"));
    }
    if let Some(h) = &r.head {
        lines.push(format!("- HEAD: `{h}`"));
    }
    let total = r.dirty.len() + r.dirty_omitted;
    if total == 0 && !r.dirty_truncated {
        lines.push("- working tree clean".to_string());
    } else {
        // Past the reader's byte bound the count is a floor.
        let at_least = if r.dirty_truncated { "at least " } else { "" };
        lines.push(format!("- uncommitted changes ({at_least}{total}):"));
        lines.extend(r.dirty.iter().take(50).map(|d| format!("  - `{d}`")));
        if total > 50 || r.dirty_truncated {
            lines.push(format!("  - … and {at_least}{} more", total.saturating_sub(50)));
        }
    }
    lines.join("\n")
}

fn children(history: &[HistoryMessage], known: &[String], r: &Redactor) -> String {
    let mut out: Vec<(String, String)> = Vec::new();
    for part in history.iter().flat_map(|m| &m.parts) {
        let HistoryPart::Tool { tool, input, child_session, status, .. } = part else { continue };
        if tool != "task" {
            continue;
        }
        let purpose = input
            .get("description")
            .and_then(|v| v.as_str())
            .or_else(|| input.get("prompt").and_then(|v| v.as_str()))
            .map(|s| truncate(&r.redact(s), 200))
            .unwrap_or_default();
        let id = child_session.clone().unwrap_or_else(|| "(not started)".to_string());
        let state = match status {
            ToolStatus::Completed => "done",
            ToolStatus::Error => "failed",
            ToolStatus::Running | ToolStatus::Pending => "running when handed over",
        };
        out.push((id, format!("{purpose} — {state}")));
    }
    for k in known {
        if !out.iter().any(|(id, _)| id == k) {
            out.push((k.clone(), "(purpose not in the recent history)".to_string()));
        }
    }
    out.iter().map(|(id, what)| format!("- `{id}`: {what}")).collect::<Vec<_>>().join("\n")
}

fn tool_errors(history: &[HistoryMessage], r: &Redactor) -> String {
    let errors: Vec<String> = history
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            HistoryPart::Tool { tool, status: ToolStatus::Error, error, .. } => Some(format!(
                "- `{tool}`: {}",
                truncate(&r.redact(error.as_deref().unwrap_or("(no message)").trim()), TOOL_ERROR_CHARS)
            )),
            _ => None,
        })
        .collect();
    let skip = errors.len().saturating_sub(TOOL_ERRORS);
    errors[skip..].join("\n")
}

/// Drops or shortens the least needed sections until the document fits `budget_chars`.
fn fit(header: &str, sections: &mut [Section], budget_chars: usize) {
    let size = |sections: &[Section]| {
        header.len() + sections.iter().map(|s| s.heading.len() + s.body.len() + 8).sum::<usize>()
    };
    let mut order: Vec<usize> = (0..sections.len()).filter(|i| !sections[*i].required).collect();
    order.sort_by_key(|i| sections[*i].keep);
    for i in order {
        let total = size(sections);
        if total <= budget_chars {
            return;
        }
        let over = total - budget_chars;
        let body = &mut sections[i].body;
        if body.len() > over + 200 {
            let keep = body.len() - over - 40;
            *body = format!("{}\n… (trimmed to fit the continuation budget)", truncate(body, keep));
        } else {
            *body = "(left out to fit the continuation budget)".to_string();
        }
    }
    // Only the required sections are left to shorten: the objective's quotes.
    let total = size(sections);
    if total > budget_chars {
        if let Some(obj) = sections.iter_mut().find(|s| s.heading == "Objective") {
            let keep = obj.body.len().saturating_sub(total - budget_chars).max(400);
            obj.body = truncate(&obj.body, keep);
        }
    }
}

fn render(header: &str, sections: &[Section]) -> String {
    let mut out = header.to_string();
    for s in sections {
        out.push_str(&format!("\n\n## {}\n\n{}", s.heading, s.body.trim_end()));
    }
    out.push('\n');
    out
}

/// At most `max` bytes of `s`, cut at a character boundary, marked when cut.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Role;
    use serde_json::json;

    fn user(text: &str) -> HistoryMessage {
        HistoryMessage {
            id: format!("msg_u{}", text.len()),
            role: Role::User,
            created_ms: None,
            agent: Some("build".into()),
            error: None,
            summary: false,
            parts: vec![HistoryPart::Text { text: text.into(), synthetic: false, ignored: false, shepherd: None }],
        }
    }

    fn assistant(parts: Vec<HistoryPart>) -> HistoryMessage {
        HistoryMessage {
            id: "msg_a".into(),
            role: Role::Assistant,
            created_ms: None,
            agent: None,
            error: None,
            summary: false,
            parts,
        }
    }

    fn tool(name: &str, status: ToolStatus, input: serde_json::Value, error: Option<&str>) -> HistoryPart {
        HistoryPart::Tool { tool: name.into(), status, input, error: error.map(str::to_string), child_session: None }
    }

    fn todo(content: &str, status: TodoStatus) -> Todo {
        Todo { content: content.into(), status, priority: None }
    }

    fn redactions() -> Redactor {
        Redactor::default()
    }

    fn facts<'a>(history: &'a [HistoryMessage], todos: &'a [Todo]) -> ContinuationFacts<'a> {
        ContinuationFacts {
            session_id: "ses_old",
            title: Some("refactor"),
            directory: Some("/repo"),
            history,
            todos,
            budget_tokens: 6000,
            context: (Some(170_000), Some(200_000)),
            ..Default::default()
        }
    }

    #[test]
    fn the_objective_quotes_the_first_and_latest_requests_of_the_person_not_shepherds_prompts() {
        let mut ours = user("[Shepherd] please continue");
        ours.parts = vec![HistoryPart::Text {
            text: "[Shepherd] please continue".into(),
            synthetic: true,
            ignored: false,
            shepherd: Some(crate::event::ShepherdTag {
                kind: "continue".into(),
                instance: "i".into(),
                decision: "d".into(),
                lease: None,
            }),
        }];
        let history = vec![user("Port the parser to Rust"), assistant(vec![]), user("Also add benchmarks"), ours];
        let text = build(&facts(&history, &[]), &redactions());
        assert!(text.contains("> Port the parser to Rust"), "{text}");
        assert!(text.contains("The latest request:\n\n> Also add benchmarks"), "{text}");
        assert!(!text.contains("please continue"), "Shepherd's own prompt is not the objective: {text}");
        assert!(text.contains("85% full (170000 of 200000 tokens)"), "{text}");
    }

    #[test]
    fn todos_files_children_and_tool_errors_come_from_structured_state() {
        let history = vec![
            user("Build it"),
            assistant(vec![
                tool("edit", ToolStatus::Completed, json!({"filePath": "/repo/src/a.rs"}), None),
                tool("edit", ToolStatus::Completed, json!({"filePath": "/repo/src/a.rs"}), None),
                tool("write", ToolStatus::Completed, json!({"filePath": "/repo/README.md"}), None),
                tool("read", ToolStatus::Completed, json!({"filePath": "/repo/src/b.rs"}), None),
                tool("bash", ToolStatus::Error, json!({"command": "cargo test"}), Some("exit 101: 2 tests failed")),
                HistoryPart::Tool {
                    tool: "task".into(),
                    status: ToolStatus::Completed,
                    input: json!({"description": "survey the callers"}),
                    error: None,
                    child_session: Some("ses_child".into()),
                },
            ]),
        ];
        let todos = vec![todo("write parser", TodoStatus::Completed), todo("add tests", TodoStatus::InProgress)];
        let mut f = facts(&history, &todos);
        f.repo = Some(RepoState {
            branch: Some("main".into()),
            head: Some("abc123".into()),
            dirty: vec![" M src/a.rs".into()],
            ..RepoState::default()
        });
        let text = build(&f, &redactions());
        assert!(text.contains("Open:\n- [ ] (in progress) add tests"), "{text}");
        assert!(text.contains("Done:\n- [x] write parser"), "{text}");
        assert!(text.contains("- `/repo/src/a.rs` (2 edits)\n- `/repo/README.md`"), "{text}");
        assert!(!text.contains("b.rs`"), "a file only read is not an edited file: {text}");
        assert!(text.contains("- `ses_child`: survey the callers — done"), "{text}");
        assert!(text.contains("- `bash`: exit 101: 2 tests failed"), "{text}");
        assert!(text.contains("- branch: `main`") && text.contains("` M src/a.rs`"), "{text}");
    }

    #[test]
    fn uncommitted_entries_past_the_readers_bound_are_counted_and_a_cut_count_is_a_floor() {
        let mut f = facts(&[], &[]);
        let kept: Vec<String> = (0..60).map(|i| format!("?? f{i}")).collect();
        f.repo = Some(RepoState { dirty: kept.clone(), dirty_omitted: 40, ..RepoState::default() });
        let text = build(&f, &redactions());
        assert!(text.contains("- uncommitted changes (100):") && text.contains("  - … and 50 more"), "{text}");
        assert!(text.contains("`?? f49`") && !text.contains("`?? f50`"), "{text}");
        f.repo = Some(RepoState { dirty: kept, dirty_omitted: 40, dirty_truncated: true, ..RepoState::default() });
        let text = build(&f, &redactions());
        assert!(text.contains("(at least 100):") && text.contains("… and at least 50 more"), "{text}");
    }

    #[test]
    fn secrets_in_tool_output_and_requests_are_redacted() {
        let history = vec![
            user("Deploy with key sk-abcdefghijklmnopqrstuvwx and password=hunter22"),
            assistant(vec![tool(
                "bash",
                ToolStatus::Error,
                json!({}),
                Some("auth failed for token ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"),
            )]),
        ];
        let text = build(&facts(&history, &[]), &redactions());
        for secret in ["sk-abcdefghijklmnopqrstuvwx", "hunter22", "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
        assert!(text.contains("[REDACTED]"));
    }

    #[test]
    fn a_secret_across_a_cut_is_redacted_before_the_cut() {
        // The token starts 10 characters before the request's 2000-character cut: what
        // is left after the cut is too short to look like a token.
        let request = format!("{} ghp_R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx and more", "x".repeat(1985));
        let error = format!("{} sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z", "y".repeat(280));
        let history = vec![user(&request), assistant(vec![tool("bash", ToolStatus::Error, json!({}), Some(&error))])];
        let text = build(&facts(&history, &[]), &redactions());
        for fragment in ["R7bXc2", "Ab3dEf6"] {
            assert!(!text.contains(fragment), "{fragment} leaked: {text}");
        }
    }

    #[test]
    fn over_budget_the_least_needed_sections_go_first_and_the_objective_and_protocol_stay() {
        let errors: Vec<HistoryPart> = (0..5)
            .map(|i| tool("bash", ToolStatus::Error, json!({}), Some(&format!("error {i} {}", "x".repeat(280)))))
            .collect();
        let history = vec![user("Keep this objective"), assistant(errors)];
        let todos: Vec<Todo> =
            (0..60).map(|i| todo(&format!("todo number {i} {}", "y".repeat(40)), TodoStatus::Pending)).collect();
        let mut f = facts(&history, &todos);
        f.budget_tokens = 600; // 2400 characters
        let text = build(&f, &redactions());
        assert!(text.len() <= 2400 + 200, "{} chars: {text}", text.len());
        assert!(text.contains("> Keep this objective"), "{text}");
        assert!(text.contains("## How to resume"), "{text}");
        assert!(text.contains("Recent tool errors\n\n(left out"), "tool errors go first: {text}");
        assert!(text.contains("todo number 0"), "todos are trimmed, not dropped, when they fit partly: {text}");
    }
}
