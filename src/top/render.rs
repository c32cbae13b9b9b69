//! Drawing `shepherd top`: the live screen ([`draw`], ratatui) and the plain table for
//! a pipe or `--once` ([`plain`]). Pure functions of the [`App`] (or [`Fleet`]) and the
//! [`Palette`]: the time shown is the document's own timestamp, so the same input draws
//! the same screen (the snapshot tests rely on it).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row as TableRow, Table};
use ratatui::Frame;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::stats::{ServerStatus, SessionState};

use super::app::{App, Mode};
use super::model::{action_label, ago, bar, duration_text, state_label, thousands, Fleet, Row};

/// Colours, or none (`NO_COLOR`, or not a terminal). Bold and reverse video are not
/// colours: the selection stays visible without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Palette {
    pub color: bool,
}

impl Palette {
    /// Colours unless `NO_COLOR` is set to anything non-empty (no-color.org).
    pub fn from_env(no_color: Option<&std::ffi::OsStr>) -> Palette {
        Palette { color: !matches!(no_color, Some(v) if !v.is_empty()) }
    }

    fn fg(self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    fn state(self, state: SessionState) -> Style {
        self.fg(match state {
            SessionState::Stalled => Color::Red,
            SessionState::Recovering => Color::Yellow,
            SessionState::HandingOff | SessionState::Compacting => Color::Magenta,
            SessionState::WaitingOnPerson => Color::Cyan,
            SessionState::Paused | SessionState::Untracked => Color::DarkGray,
            SessionState::Working => Color::Green,
            SessionState::Idle => Color::Reset,
        })
    }

    /// Green below half, yellow below 80 %, red beyond.
    fn fill(self, fill: f64) -> Style {
        self.fg(if fill < 0.5 {
            Color::Green
        } else if fill < 0.8 {
            Color::Yellow
        } else {
            Color::Red
        })
    }
}

/// Widths of the fixed columns; the session's title takes what is left.
const MARK_W: u16 = 1;
const SERVER_W: u16 = 8;
const STATE_W: u16 = 10;
const QUIET_W: u16 = 9;
const TODOS_W: u16 = 5;
const CONTEXT_W: u16 = 9;
const LAST_W: u16 = 14;
const SESSION_MIN_W: u16 = 10;
const STALL_BAR: usize = 5;
const CONTEXT_BAR: usize = 4;

/// The live screen.
pub fn draw(frame: &mut Frame, app: &App, palette: Palette) {
    let area = frame.area();
    let detail_h = if app.detail { (area.height / 2).clamp(4, 14) } else { 0 };
    let header_text = header_text(app, palette, area.width);
    let [header, table, detail, footer] = Layout::vertical([
        Constraint::Length(header_text.len() as u16),
        Constraint::Min(2),
        Constraint::Length(detail_h),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(header_text), header);
    draw_table(frame, table, app, palette);
    if app.detail {
        draw_detail(frame, detail, app, palette);
    }
    frame.render_widget(Paragraph::new(footer_text(app, palette)), footer);
}

/// The header: the fleet's totals, each server's stream (as many lines as they need at
/// this width), a failed poll, and how the list is sorted and filtered.
fn header_text(app: &App, palette: Palette, width: u16) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    match &app.fleet {
        Some(fleet) => {
            lines.push(Line::from(Span::styled(totals(fleet), Style::new().add_modifier(Modifier::BOLD))));
            lines.extend(stream_lines(fleet, palette, width as usize));
        }
        None => lines.push(Line::raw("waiting for the daemon's first answer…")),
    }
    if let Some(e) = &app.error {
        lines.push(Line::from(Span::styled(format!("! {e}"), palette.fg(Color::Red))));
    }
    let shown = app.visible().len();
    let total = app.fleet.as_ref().map_or(0, |f| f.rows.len());
    let mut view = format!("shepherd top · sort: {}", app.sort.as_str());
    if !app.filter.text.trim().is_empty() {
        view.push_str(&format!(" · filter: \"{}\"", app.filter.text.trim()));
    }
    if app.filter.attention_only {
        view.push_str(" · needing attention");
    }
    view.push_str(&format!(" · {shown} of {total} shown"));
    lines.push(Line::from(Span::styled(view, palette.fg(Color::DarkGray))));
    lines
}

/// `streams: local up 2s ago (1 reconnect) · remote DOWN 5m ago (4 reconnects)`,
/// continued on further lines when the servers do not fit in `width`.
fn stream_lines(fleet: &Fleet, palette: Palette, width: usize) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let mut spans = vec![Span::raw("streams:")];
    let mut used = "streams:".len();
    if fleet.servers.is_empty() {
        spans.push(Span::raw(" none"));
    }
    let mut first_on_line = true;
    for s in &fleet.servers {
        let (word, style) =
            if s.connected { ("up", palette.fg(Color::Green)) } else { ("DOWN", palette.fg(Color::Red)) };
        let rest = format!(" {}", stream_facts(s));
        let len = 1 + s.name.chars().count() + 1 + word.len() + rest.chars().count();
        if !first_on_line && used + 2 + len > width {
            lines.push(Line::from(std::mem::take(&mut spans)));
            spans.push(Span::raw("        "));
            used = 8;
            first_on_line = true;
        }
        if !first_on_line {
            spans.push(Span::raw(" ·"));
            used += 2;
        }
        spans.push(Span::raw(format!(" {} ", s.name)));
        spans.push(Span::styled(word, style));
        spans.push(Span::raw(rest));
        used += len;
        first_on_line = false;
    }
    lines.push(Line::from(spans));
    lines
}

/// `6 sessions: 1 stalled, 2 working, 3 idle`.
fn totals(fleet: &Fleet) -> String {
    let parts: Vec<String> =
        fleet.totals.iter().filter(|(_, n)| *n > 0).map(|(s, n)| format!("{n} {}", state_label(*s))).collect();
    let total = fleet.total();
    let noun = if total == 1 { "session" } else { "sessions" };
    if parts.is_empty() {
        format!("{total} {noun}")
    } else {
        format!("{total} {noun}: {}", parts.join(", "))
    }
}

/// `(last event 2s ago, 1 reconnect)`, and `, 3s behind` while Shepherd works a second
/// or more behind the server.
fn stream_facts(s: &ServerStatus) -> String {
    let last =
        s.since_last_event_ms.map_or_else(|| "no event yet".to_string(), |ms| format!("last event {} ago", ago(ms)));
    let plural = if s.reconnects == 1 { "" } else { "s" };
    let behind = if s.behind_ms >= 1000 { format!(", {} behind", ago(s.behind_ms as i64)) } else { String::new() };
    format!("({last}, {} reconnect{plural}{behind})", s.reconnects)
}

/// The cells of one row, as text: `[server, session, state, quiet, todos, context, last]`.
/// With `bars`, the quiet time and the context are drawn as bars; without, as numbers.
fn cells(row: &Row, now_ms: i64, bars: bool) -> [String; 7] {
    let quiet = row.quiet_ms.map_or_else(|| "-".to_string(), ago);
    let quiet = match (row.stall_fill(), bars) {
        (Some(fill), true) => format!("{} {quiet:>3}", bar(fill, STALL_BAR)),
        (Some(_), false) => format!(
            "{}/{}",
            duration_text(row.quiet_ms.unwrap_or(0)),
            duration_text(row.stall_timeout_ms.unwrap_or(0) as i64)
        ),
        (None, _) => quiet,
    };
    let todos = if row.todos_total == 0 { "-".to_string() } else { format!("{}/{}", row.todos_done, row.todos_total) };
    let context = match row.context_fill() {
        Some(fill) => {
            let pct = format!("{:.0}%", fill * 100.0);
            if bars {
                format!("{} {pct:>3}", bar(fill, CONTEXT_BAR))
            } else {
                pct
            }
        }
        None => "-".to_string(),
    };
    let last = row
        .last_action
        .as_ref()
        .map_or_else(|| "-".to_string(), |(a, at)| format!("{} {}", action_label(a), ago(now_ms - at)));
    [row.server.clone(), row.name().to_string(), state_label(row.state).to_string(), quiet, todos, context, last]
}

/// `text` cut to `width` characters, with `…` when cut.
fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn draw_table(frame: &mut Frame, area: Rect, app: &App, palette: Palette) {
    let fixed = MARK_W + SERVER_W + STATE_W + QUIET_W + TODOS_W + CONTEXT_W + LAST_W + 7;
    let session_w = area.width.saturating_sub(fixed).max(SESSION_MIN_W);
    let widths = [MARK_W, SERVER_W, session_w, STATE_W, QUIET_W, TODOS_W, CONTEXT_W, LAST_W].map(Constraint::Length);
    let header = TableRow::new(["", "SERVER", "SESSION", "STATE", "QUIET", "TODOS", "CONTEXT", "LAST ACTION"])
        .style(Style::new().add_modifier(Modifier::BOLD));
    let now_ms = app.fleet.as_ref().map_or(0, |f| f.now_ms);
    let selected = app.selected_row().map(|r| r.id.clone());
    let visible = app.visible();
    // Keep the selection on screen: scroll so it is the last row when it is below.
    let room = area.height.saturating_sub(1) as usize;
    let at = visible.iter().position(|r| Some(&r.id) == selected.as_ref()).unwrap_or(0);
    let skip = (at + 1).saturating_sub(room);
    let rows: Vec<TableRow> = visible
        .iter()
        .skip(skip)
        .map(|row| {
            let [server, session, state, quiet, todos, context, last] = cells(row, now_ms, true);
            let is_selected = Some(&row.id) == selected.as_ref();
            let mark = if is_selected { "›" } else { " " };
            let quiet_style = row.stall_fill().map_or(Style::new(), |f| palette.fill(f));
            let context_style = row.context_fill().map_or(Style::new(), |f| palette.fill(f));
            let line = TableRow::new(vec![
                Cell::from(mark),
                Cell::from(clip(&server, SERVER_W as usize)),
                Cell::from(clip(&session, session_w as usize)),
                Cell::from(state).style(palette.state(row.state)),
                Cell::from(quiet).style(quiet_style),
                Cell::from(todos),
                Cell::from(context).style(context_style),
                Cell::from(clip(&last, LAST_W as usize)),
            ]);
            if is_selected {
                line.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                line
            }
        })
        .collect();
    let empty = rows.is_empty();
    frame.render_widget(Table::new(rows, widths).header(header).column_spacing(1), area);
    if empty && area.height > 1 {
        let note = match &app.fleet {
            Some(f) if !f.rows.is_empty() => "no session matches the filter (esc clears it)",
            Some(_) => crate::control::table::NONE_TRACKED,
            None => "",
        };
        let below = Rect { y: area.y + 1, height: 1, ..area };
        frame.render_widget(Paragraph::new(note), below);
    }
}

fn draw_detail(frame: &mut Frame, area: Rect, app: &App, palette: Palette) {
    let Some(row) = app.selected_row() else { return };
    let now_ms = app.fleet.as_ref().map_or(0, |f| f.now_ms);
    let title = match &row.title {
        Some(t) => format!(" {} — {} ", row.id, t),
        None => format!(" {} ", row.id),
    };
    let block = Block::new().borders(Borders::TOP).title(clip(&title, area.width as usize));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let quiet = row.quiet_ms.map_or_else(|| "-".to_string(), duration_text);
    let clock = match row.stall_timeout_ms {
        Some(t) => format!("quiet {quiet} of a {} stall timeout", duration_text(t as i64)),
        None => format!("quiet {quiet} (no stall timer runs)"),
    };
    let context = match (row.tokens, row.window, row.context_fill()) {
        (Some(t), Some(w), Some(f)) => {
            format!("context {} of {} tokens ({:.0}%)", thousands(t), thousands(w), f * 100.0)
        }
        (Some(t), _, _) => format!("context {} tokens", thousands(t)),
        _ => "context unknown".to_string(),
    };
    let mut lines = vec![
        Line::from(vec![
            Span::raw(format!("{} · ", row.server)),
            Span::styled(state_label(row.state), palette.state(row.state)),
            Span::raw(format!(" · {clock}")),
        ]),
        Line::raw(format!("todos {}/{} done · {context}", row.todos_done, row.todos_total)),
        Line::raw(match &row.last_action {
            Some((a, at)) => format!("last action {a}, {} ago · journal, oldest first:", duration_text(now_ms - at)),
            None => "no action yet · journal, oldest first:".to_string(),
        }),
    ];
    let room = (inner.height as usize).saturating_sub(lines.len());
    match &app.journal {
        Some((id, Ok(records))) if *id == row.id => {
            if records.is_empty() {
                lines.push(Line::raw("journal: nothing recorded for this session"));
            }
            let start = records.len().saturating_sub(room);
            lines.extend(records[start..].iter().map(|r| journal_line(r, now_ms, palette)));
        }
        Some((id, Err(e))) if *id == row.id => {
            lines.push(Line::from(Span::styled(format!("journal: {e}"), palette.fg(Color::Red))))
        }
        _ => lines.push(Line::raw("journal: reading…")),
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `  5m ago  continue (done)  continue sent after the abort`.
fn journal_line(r: &ActionRecord, now_ms: i64, palette: Palette) -> Line<'static> {
    let outcome_style = match r.outcome {
        shepherd_actors::journal::Outcome::Done => palette.fg(Color::Green),
        shepherd_actors::journal::Outcome::Declined => palette.fg(Color::DarkGray),
        shepherd_actors::journal::Outcome::Failed => palette.fg(Color::Red),
    };
    Line::from(vec![
        Span::raw(format!("{:>4} ago  {} ", ago(now_ms - r.at_ms), r.action.as_str())),
        Span::styled(format!("({})", r.outcome.as_str()), outcome_style),
        Span::raw(format!("  {}", r.reason)),
    ])
}

fn footer_text(app: &App, palette: Palette) -> Line<'static> {
    let hint = palette.fg(Color::DarkGray);
    match &app.mode {
        Mode::Filter { .. } => Line::from(vec![
            Span::raw(format!("filter: {}▏", app.filter.text)),
            Span::styled("  ⏎ keep · esc cancel", hint),
        ]),
        Mode::Prompt { session, text } => Line::from(vec![
            Span::raw(format!("prompt to {session}: {text}▏")),
            Span::styled("  ⏎ send · esc cancel", hint),
        ]),
        Mode::ConfirmHandoff { session } => Line::raw(format!("hand {session} off to a fresh session now? y/n")),
        Mode::Browse => match &app.message {
            Some(m) => Line::raw(m.clone()),
            None => Line::from(Span::styled(
                "q quit ↑↓ select ⏎ detail s sort / filter a attention p prompt h handoff z pause",
                hint,
            )),
        },
    }
}

/// The fleet as plain text — for a pipe, a file or `--once`: the header, then one
/// aligned line per session (times and shares as numbers, no bars).
pub fn plain(fleet: &Fleet, rows: &[&Row]) -> String {
    let mut out = format!("{}\n", totals(fleet));
    for s in &fleet.servers {
        let word = if s.connected { "up" } else { "DOWN" };
        out.push_str(&format!("stream {}: {word} {}\n", s.name, stream_facts(s)));
    }
    if rows.is_empty() {
        out.push_str(crate::control::table::NONE_TRACKED);
        out.push('\n');
        return out;
    }
    const HEADER: [&str; 8] = ["SERVER", "SESSION", "ID", "STATE", "QUIET/TIMEOUT", "TODOS", "CONTEXT", "LAST ACTION"];
    let table: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let [server, _, state, quiet, todos, context, last] = cells(r, fleet.now_ms, false);
            let title = r.title.clone().unwrap_or_else(|| "-".to_string());
            [server, clip(&title, 40), r.id.clone(), state, quiet, todos, context, last]
        })
        .collect();
    let mut widths = HEADER.map(str::len);
    for r in &table {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for cells in std::iter::once(HEADER.map(str::to_string)).chain(table) {
        let line: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::buffer::Buffer;
    use ratatui::Terminal;

    use super::*;
    use crate::top::app::Key;
    use crate::top::fixtures::{fleet_doc, journal};
    use crate::top::model::{visible, Filter, SortKey};

    #[test]
    fn a_stream_shepherd_reads_a_second_or_more_behind_says_so() {
        let mut s = fleet_doc().servers[0].clone();
        s.behind_ms = 400;
        assert!(!stream_facts(&s).contains("behind"), "{}", stream_facts(&s));
        s.behind_ms = 3_200;
        assert!(stream_facts(&s).ends_with(", 3s behind)"), "{}", stream_facts(&s));
    }

    /// The screen as text, one line per row, trailing blanks cut.
    fn screen(app: &App, palette: Palette, width: u16, height: u16) -> (String, Buffer) {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| draw(f, app, palette)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            let line: String = (0..buffer.area.width).map(|x| buffer[(x, y)].symbol()).collect();
            text.push_str(line.trim_end());
            text.push('\n');
        }
        (text, buffer)
    }

    /// Compares with a checked-in snapshot; `UPDATE_SNAPSHOTS=1` rewrites it instead.
    fn assert_snapshot(name: &str, actual: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots").join(name);
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(&path, actual).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(actual, expected, "snapshot {} differs (UPDATE_SNAPSHOTS=1 to accept)", path.display());
    }

    fn app() -> App {
        let mut app = App::default();
        app.on_status(Ok(fleet_doc()));
        app
    }

    const NO_COLOR: Palette = Palette { color: false };

    #[test]
    fn the_fleet_at_80_columns() {
        let (text, _) = screen(&app(), NO_COLOR, 80, 14);
        assert_snapshot("top_fleet_80.txt", &text);
    }

    #[test]
    fn the_detail_pane_shows_the_selected_sessions_journal() {
        let mut app = app();
        let id = app.selected_row().unwrap().id.clone();
        assert_eq!(id, "ses_stuck", "the stalled session is first");
        app.on_key(Key::Enter);
        app.on_journal(id, Ok(journal()));
        let (text, _) = screen(&app, NO_COLOR, 80, 22);
        assert_snapshot("top_detail_80.txt", &text);
    }

    #[test]
    fn filtering_typing_a_prompt_and_a_failed_poll() {
        let mut app = app();
        for c in "/o".chars() {
            app.on_key(Key::Char(c));
        }
        app.on_key(Key::Enter);
        app.on_key(Key::Char('a'));
        app.on_key(Key::Char('p'));
        for c in "run the tests".chars() {
            app.on_key(Key::Char(c));
        }
        app.on_status(Err("cannot reach the Shepherd daemon at http://127.0.0.1:7433".into()));
        let (text, _) = screen(&app, NO_COLOR, 80, 10);
        assert_snapshot("top_filter_prompt_80.txt", &text);
    }

    #[test]
    fn before_the_first_answer_and_with_no_sessions() {
        let (waiting, _) = screen(&App::default(), NO_COLOR, 80, 6);
        assert_snapshot("top_waiting_80.txt", &waiting);
        let mut empty = App::default();
        let mut doc = fleet_doc();
        doc.sessions.clear();
        doc.totals.clear();
        empty.on_status(Ok(doc));
        let (text, _) = screen(&empty, NO_COLOR, 80, 6);
        assert!(text.contains("no sessions tracked yet"), "{text}");
        assert!(text.contains("0 sessions"), "{text}");
    }

    #[test]
    fn no_color_draws_no_colour_and_colour_marks_the_states() {
        let (_, plain) = screen(&app(), NO_COLOR, 80, 14);
        assert!(plain.content.iter().all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
        let (_, coloured) = screen(&app(), Palette { color: true }, 80, 14);
        let stalled = coloured.content.iter().any(|c| c.symbol() == "s" && c.fg == Color::Red);
        assert!(stalled, "the stalled state is red");
        assert_eq!(Palette::from_env(Some("1".as_ref())), NO_COLOR);
        assert_eq!(Palette::from_env(Some("".as_ref())), Palette { color: true });
        assert_eq!(Palette::from_env(None), Palette { color: true });
    }

    #[test]
    fn the_plain_table_for_a_pipe() {
        let fleet = Fleet::of(&fleet_doc());
        let rows = visible(&fleet.rows, SortKey::State, &Filter::default());
        assert_snapshot("top_plain.txt", &plain(&fleet, &rows));
    }

    #[test]
    fn long_titles_are_cut_with_an_ellipsis() {
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abcd", 4), "abcd");
    }
}
