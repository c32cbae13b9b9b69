//! The view model of `shepherd top`: the status document turned into rows, sorted and
//! filtered, with the fills its bars draw. Pure: no terminal, no clock (the document's
//! own `timestamp` is "now"), no I/O.

use shepherd_actors::stats::{ServerStatus, SessionState, SessionStatus, StatusDocument};

/// One session, as a row shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub server: String,
    pub id: String,
    pub title: Option<String>,
    pub state: SessionState,
    /// Since the session's last activity, ms.
    pub quiet_ms: Option<i64>,
    /// The stall timeout in force while the stall timer runs, ms.
    pub stall_timeout_ms: Option<u64>,
    pub todos_done: usize,
    pub todos_total: usize,
    pub tokens: Option<u64>,
    pub window: Option<u64>,
    /// The latest action: its name and epoch ms.
    pub last_action: Option<(String, i64)>,
}

impl Row {
    pub fn of(id: &str, s: &SessionStatus) -> Row {
        Row {
            server: s.server.clone(),
            id: id.to_string(),
            title: s.title.clone(),
            state: s.state,
            quiet_ms: s.quiet_ms,
            stall_timeout_ms: s.stall_timeout_ms,
            todos_done: s.todos.completed,
            todos_total: s.todos.total,
            tokens: s.tokens,
            window: s.window,
            last_action: s.last_action.as_ref().map(|a| (a.action.as_str().to_string(), a.at_ms)),
        }
    }

    /// The title, or the id when the session has none.
    pub fn name(&self) -> &str {
        self.title.as_deref().unwrap_or(&self.id)
    }

    /// How far the session is on its way to a stall recovery: quiet time over the stall
    /// timeout, 0..=1; `None` when the stall timer does not run (idle, paused, …).
    pub fn stall_fill(&self) -> Option<f64> {
        let timeout = self.stall_timeout_ms.filter(|&t| t > 0)? as f64;
        Some((self.quiet_ms.unwrap_or(0).max(0) as f64 / timeout).clamp(0.0, 1.0))
    }

    /// The context window's share in use, 0..=1, when both numbers are known.
    pub fn context_fill(&self) -> Option<f64> {
        match (self.tokens, self.window) {
            (Some(t), Some(w)) if w > 0 => Some((t as f64 / w as f64).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// Needs a person's eye: stalled, recovering, handing off, waiting on the person or
    /// paused.
    pub fn needs_attention(&self) -> bool {
        matches!(
            self.state,
            SessionState::Stalled
                | SessionState::Recovering
                | SessionState::HandingOff
                | SessionState::WaitingOnPerson
                | SessionState::Paused
        )
    }
}

/// The whole fleet, as the view shows it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fleet {
    /// Epoch ms the daemon built the document at (the view's "now").
    pub now_ms: i64,
    pub instance: String,
    pub totals: Vec<(SessionState, usize)>,
    pub servers: Vec<ServerStatus>,
    /// Every session, in the document's order (by id).
    pub rows: Vec<Row>,
}

impl Fleet {
    pub fn of(doc: &StatusDocument) -> Fleet {
        Fleet {
            now_ms: doc.timestamp,
            instance: doc.instance.clone(),
            totals: doc.totals.iter().map(|(s, n)| (*s, *n)).collect(),
            servers: doc.servers.clone(),
            rows: doc.sessions.iter().map(|(id, s)| Row::of(id, s)).collect(),
        }
    }

    pub fn count(&self, state: SessionState) -> usize {
        self.totals.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n)
    }

    pub fn total(&self) -> usize {
        self.totals.iter().map(|(_, n)| n).sum()
    }

    /// The most-stalled session's way towards recovery, in percent: 100 while a
    /// recovery is under way, else the largest stall fill, capped at 99 (a stalled
    /// session that has not been recovered yet stays at 99). `None`: no stall timer runs.
    pub fn recovery_progress(&self) -> Option<u8> {
        if self.rows.iter().any(|r| r.state == SessionState::Recovering) {
            return Some(100);
        }
        let fill = self
            .rows
            .iter()
            .filter_map(Row::stall_fill)
            .fold(None, |m: Option<f64>, f| Some(m.map_or(f, |m| m.max(f))))?;
        Some(((fill * 100.0).floor() as u8).min(99))
    }
}

/// The orders rows can be sorted in (`s` cycles through them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Most attention first (stalled, recovering, …), then nearest to a stall.
    #[default]
    State,
    /// Quiet longest first.
    Quiet,
    /// Fullest context first.
    Context,
    /// By server, then title.
    Server,
    /// By title (or id).
    Name,
}

impl SortKey {
    pub fn next(self) -> SortKey {
        match self {
            SortKey::State => SortKey::Quiet,
            SortKey::Quiet => SortKey::Context,
            SortKey::Context => SortKey::Server,
            SortKey::Server => SortKey::Name,
            SortKey::Name => SortKey::State,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::State => "state",
            SortKey::Quiet => "quiet",
            SortKey::Context => "context",
            SortKey::Server => "server",
            SortKey::Name => "name",
        }
    }
}

/// Which rows are shown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filter {
    /// Case-insensitive text found in the server, id, title or state.
    pub text: String,
    /// Only sessions that need attention ([`Row::needs_attention`]).
    pub attention_only: bool,
}

impl Filter {
    pub fn matches(&self, row: &Row) -> bool {
        if self.attention_only && !row.needs_attention() {
            return false;
        }
        let needle = self.text.trim().to_lowercase();
        if needle.is_empty() {
            return true;
        }
        [row.server.as_str(), row.id.as_str(), row.title.as_deref().unwrap_or(""), state_label(row.state)]
            .iter()
            .any(|h| h.to_lowercase().contains(&needle))
    }

    pub fn is_active(&self) -> bool {
        self.attention_only || !self.text.trim().is_empty()
    }
}

/// The rows `filter` lets through, in `sort` order (ties by server and id, so the order
/// is stable between polls).
pub fn visible<'a>(rows: &'a [Row], sort: SortKey, filter: &Filter) -> Vec<&'a Row> {
    let mut out: Vec<&Row> = rows.iter().filter(|r| filter.matches(r)).collect();
    let fill = |r: &Row, f: fn(&Row) -> Option<f64>| f(r).unwrap_or(-1.0);
    out.sort_by(|a, b| {
        let primary = match sort {
            SortKey::State => a.state.cmp(&b.state).then_with(|| {
                fill(b, Row::stall_fill).partial_cmp(&fill(a, Row::stall_fill)).unwrap_or(std::cmp::Ordering::Equal)
            }),
            SortKey::Quiet => b.quiet_ms.unwrap_or(-1).cmp(&a.quiet_ms.unwrap_or(-1)),
            SortKey::Context => {
                fill(b, Row::context_fill).partial_cmp(&fill(a, Row::context_fill)).unwrap_or(std::cmp::Ordering::Equal)
            }
            SortKey::Server => a.server.cmp(&b.server).then_with(|| a.name().cmp(b.name())),
            SortKey::Name => a.name().to_lowercase().cmp(&b.name().to_lowercase()),
        };
        primary.then_with(|| (&a.server, &a.id).cmp(&(&b.server, &b.id)))
    });
    out
}

/// A bar `width` cells wide, `fill` (0..=1) of it solid: `███░░`.
pub fn bar(fill: f64, width: usize) -> String {
    let solid = ((fill.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(solid), "░".repeat(width - solid))
}

/// The short word a row shows for a state (at most 10 characters).
pub fn state_label(state: SessionState) -> &'static str {
    match state {
        SessionState::Stalled => "stalled",
        SessionState::Recovering => "recovering",
        SessionState::HandingOff => "handoff",
        SessionState::Compacting => "compacting",
        SessionState::WaitingOnPerson => "waiting",
        SessionState::Paused => "paused",
        SessionState::Working => "working",
        SessionState::Idle => "idle",
        SessionState::Untracked => "gone",
    }
}

/// `42s`, `3m`, `5h`, `2d`.
pub fn ago(ms: i64) -> String {
    crate::status::render::ago(ms)
}

/// A duration to the second below an hour, to the minute above: `45s`, `3m20s`, `2h05m`.
pub fn duration_text(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 if s % 60 == 0 => format!("{}m", s / 60),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The short name a row shows for an action (the journal's names, two shortened).
pub fn action_label(action: &str) -> &str {
    match action {
        "stall_detected" => "stall",
        "spinning_tool" => "spinning",
        other => other,
    }
}

/// `128,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, state: SessionState, change: impl FnOnce(&mut Row)) -> Row {
        let mut r = Row {
            server: "local".into(),
            id: id.into(),
            title: None,
            state,
            quiet_ms: Some(0),
            stall_timeout_ms: None,
            todos_done: 0,
            todos_total: 0,
            tokens: None,
            window: None,
            last_action: None,
        };
        change(&mut r);
        r
    }

    fn ids(rows: &[&Row]) -> Vec<String> {
        rows.iter().map(|r| r.id.clone()).collect()
    }

    #[test]
    fn durations_and_counts_read_easily() {
        assert_eq!(duration_text(45_000), "45s");
        assert_eq!(duration_text(180_000), "3m");
        assert_eq!(duration_text(200_000), "3m20s");
        assert_eq!(duration_text(7_500_000), "2h05m");
        assert_eq!(thousands(128_000), "128,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn bars_round_to_whole_cells_and_never_overflow() {
        assert_eq!(bar(0.0, 5), "░░░░░");
        assert_eq!(bar(0.5, 4), "██░░");
        assert_eq!(bar(0.29, 5), "█░░░░");
        assert_eq!(bar(0.31, 5), "██░░░");
        assert_eq!(bar(1.0, 3), "███");
        assert_eq!(bar(7.5, 3), "███");
        assert_eq!(bar(-1.0, 3), "░░░");
    }

    #[test]
    fn the_stall_fill_is_quiet_time_over_the_timeout_and_only_while_the_timer_runs() {
        let r = row("a", SessionState::Working, |r| {
            r.quiet_ms = Some(45_000);
            r.stall_timeout_ms = Some(180_000);
        });
        assert_eq!(r.stall_fill(), Some(0.25));
        let past = row("a", SessionState::Stalled, |r| {
            r.quiet_ms = Some(400_000);
            r.stall_timeout_ms = Some(180_000);
        });
        assert_eq!(past.stall_fill(), Some(1.0));
        assert_eq!(row("a", SessionState::Idle, |r| r.quiet_ms = Some(9_000_000)).stall_fill(), None);
    }

    #[test]
    fn the_context_fill_needs_both_numbers() {
        let r = row("a", SessionState::Idle, |r| {
            r.tokens = Some(30_000);
            r.window = Some(120_000);
        });
        assert_eq!(r.context_fill(), Some(0.25));
        assert_eq!(row("a", SessionState::Idle, |r| r.tokens = Some(5)).context_fill(), None);
    }

    #[test]
    fn sorting_by_state_puts_attention_first_and_the_nearest_stall_before_others() {
        let rows = vec![
            row("idle", SessionState::Idle, |_| {}),
            row("calm", SessionState::Working, |r| {
                r.quiet_ms = Some(1_000);
                r.stall_timeout_ms = Some(100_000);
            }),
            row("near", SessionState::Working, |r| {
                r.quiet_ms = Some(90_000);
                r.stall_timeout_ms = Some(100_000);
            }),
            row("stalled", SessionState::Stalled, |_| {}),
            row("asks", SessionState::WaitingOnPerson, |_| {}),
        ];
        let v = visible(&rows, SortKey::State, &Filter::default());
        assert_eq!(ids(&v), ["stalled", "asks", "near", "calm", "idle"]);
    }

    #[test]
    fn other_sort_keys_order_by_quiet_time_context_and_name() {
        let rows = vec![
            row("a", SessionState::Working, |r| {
                r.quiet_ms = Some(5);
                r.tokens = Some(90);
                r.window = Some(100);
                r.title = Some("zeta".into());
            }),
            row("b", SessionState::Idle, |r| {
                r.quiet_ms = Some(50);
                r.tokens = Some(10);
                r.window = Some(100);
                r.title = Some("Alpha".into());
            }),
            row("c", SessionState::Idle, |r| r.quiet_ms = Some(20)),
        ];
        let none = Filter::default();
        assert_eq!(ids(&visible(&rows, SortKey::Quiet, &none)), ["b", "c", "a"]);
        assert_eq!(ids(&visible(&rows, SortKey::Context, &none)), ["a", "b", "c"]);
        assert_eq!(ids(&visible(&rows, SortKey::Name, &none)), ["b", "c", "a"]);
    }

    #[test]
    fn the_filter_matches_text_anywhere_and_can_keep_only_what_needs_attention() {
        let rows = vec![
            row("ses_1", SessionState::Working, |r| r.title = Some("Fix the Parser".into())),
            row("ses_2", SessionState::Paused, |r| r.server = "remote".into()),
            row("ses_3", SessionState::Stalled, |_| {}),
        ];
        let text = |t: &str| Filter { text: t.into(), attention_only: false };
        assert_eq!(ids(&visible(&rows, SortKey::Name, &text("parser"))), ["ses_1"]);
        assert_eq!(ids(&visible(&rows, SortKey::Name, &text("REMOTE"))), ["ses_2"]);
        assert_eq!(ids(&visible(&rows, SortKey::Name, &text("stalled"))), ["ses_3"]);
        let attention = Filter { text: String::new(), attention_only: true };
        assert_eq!(ids(&visible(&rows, SortKey::State, &attention)), ["ses_3", "ses_2"]);
    }

    #[test]
    fn recovery_progress_is_capped_at_99_until_a_recovery_runs() {
        let working = |quiet: i64| {
            row("a", SessionState::Working, |r| {
                r.quiet_ms = Some(quiet);
                r.stall_timeout_ms = Some(1_000);
            })
        };
        let fleet = |rows: Vec<Row>| Fleet { rows, ..Fleet::default() };
        assert_eq!(fleet(vec![row("i", SessionState::Idle, |_| {})]).recovery_progress(), None);
        assert_eq!(fleet(vec![working(250), working(600)]).recovery_progress(), Some(60));
        assert_eq!(fleet(vec![working(5_000)]).recovery_progress(), Some(99));
        let recovering = row("r", SessionState::Recovering, |_| {});
        assert_eq!(fleet(vec![working(600), recovering]).recovery_progress(), Some(100));
    }
}
