//! The `shepherd sessions` table: one line per session, columns aligned. Pure: the time
//! is an argument.

use shepherd_actors::event::TodoStatus;

use super::client::SessionView;
use crate::status::render::ago;

const HEADER: [&str; 6] = ["SERVER", "SESSION", "STATE", "PAUSED", "TODOS", "LAST ACTION"];

/// What `sessions` and `top` say of an empty fleet. An idle session already on the server
/// when Shepherd started is not tracked until it does something (idle sessions cost
/// nothing): a person looking for it is told why it is not listed.
pub const NONE_TRACKED: &str =
    "no sessions tracked yet (a session is listed from its first activity; idle ones are left alone)";

/// The table, or a one-line note when there is nothing to show.
pub fn render_sessions(sessions: &[SessionView], now_ms: i64) -> String {
    if sessions.is_empty() {
        return format!("{NONE_TRACKED}\n");
    }
    let rows: Vec<[String; 6]> = sessions.iter().map(|s| row(s, now_ms)).collect();
    let mut widths = HEADER.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for cells in std::iter::once(HEADER.map(str::to_string)).chain(rows) {
        let line: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn row(s: &SessionView, now_ms: i64) -> [String; 6] {
    let state = if s.recovering {
        "recovering"
    } else if s.busy {
        "busy"
    } else {
        "idle"
    };
    let open = s.todos.iter().filter(|t| matches!(t.status, TodoStatus::Pending | TodoStatus::InProgress)).count();
    let last = match &s.last_action {
        Some(a) => format!("{} ({}) {} ago", a.action, a.outcome, ago(now_ms - a.at_ms)),
        None => "-".to_string(),
    };
    [
        s.server.clone(),
        s.id.clone(),
        state.to_string(),
        s.paused.clone().unwrap_or_else(|| "-".to_string()),
        format!("{open}/{}", s.todos.len()),
        last,
    ]
}

#[cfg(test)]
mod tests {
    use shepherd_actors::event::Todo;

    use super::*;
    use crate::control::client::ActionView;

    fn todo(status: TodoStatus) -> Todo {
        Todo { content: "x".into(), status, priority: None }
    }

    #[test]
    fn each_session_is_one_aligned_line_with_open_todos_and_the_last_action() {
        let sessions = vec![
            SessionView {
                server: "local".into(),
                id: "ses_a".into(),
                busy: true,
                recovering: false,
                paused: None,
                todos: vec![todo(TodoStatus::InProgress), todo(TodoStatus::Pending), todo(TodoStatus::Completed)],
                last_action: Some(ActionView {
                    action: "continue".into(),
                    outcome: "done".into(),
                    reason: String::new(),
                    at_ms: 1_000_000 - 125_000,
                }),
            },
            SessionView {
                server: "remote-box".into(),
                id: "ses_bb".into(),
                busy: false,
                recovering: false,
                paused: Some("user_abort".into()),
                todos: vec![],
                last_action: None,
            },
        ];
        let table = render_sessions(&sessions, 1_000_000);
        let expected = "\
SERVER      SESSION  STATE  PAUSED      TODOS  LAST ACTION
local       ses_a    busy   -           2/3    continue (done) 2m ago
remote-box  ses_bb   idle   user_abort  0/0    -
";
        assert_eq!(table, expected);
    }

    #[test]
    fn an_empty_fleet_says_so() {
        assert_eq!(render_sessions(&[], 0), format!("{NONE_TRACKED}\n"));
    }

    #[test]
    fn ages_are_short_and_never_negative() {
        assert_eq!(ago(-5000), "0s");
        assert_eq!(ago(59_999), "59s");
        assert_eq!(ago(60_000), "1m");
        assert_eq!(ago(3_600_000), "1h");
        assert_eq!(ago(3 * 86_400_000), "3d");
    }
}
