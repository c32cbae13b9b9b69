//! What `shepherd top` shows and what a key does: the selection, sort, filter, detail
//! pane and the prompt / hand-off dialogs. Pure: keys and answers in, [`Command`]s out;
//! the event loop ([`super::run`]) carries them out against the control API.

use shepherd_actors::journal::ActionRecord;
use shepherd_actors::stats::{SessionState, StatusDocument};

use super::model::{visible, Filter, Fleet, Row, SortKey};

/// A key, as the view understands it (the event loop maps the terminal's keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Esc,
    Backspace,
    Up,
    Down,
    Home,
    End,
    /// Ctrl-C: quits from anywhere.
    Interrupt,
}

/// What the event loop must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Quit,
    /// Poll `/v1/status` now.
    Refresh,
    /// Read this session's journal (`/v1/sessions/{id}/history`).
    Journal(String),
    /// `POST /v1/sessions/{id}/prompt`.
    Prompt {
        session: String,
        text: String,
    },
    /// `POST /v1/sessions/{id}/handoff`.
    Handoff(String),
    /// `POST /v1/sessions/{id}/pause` (`pause`) or `…/resume`.
    SetPause { session: String, pause: bool },
}

/// What the keyboard is doing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Browse,
    /// Typing the filter text (the previous text is restored on Esc).
    Filter { before: String },
    /// Typing a prompt for a session.
    Prompt { session: String, text: String },
    /// Asking whether to hand a session off.
    ConfirmHandoff { session: String },
}

/// The view's state.
#[derive(Debug, Clone, Default)]
pub struct App {
    pub fleet: Option<Fleet>,
    /// The latest poll failed: why (the last fleet stays on screen).
    pub error: Option<String>,
    pub sort: SortKey,
    pub filter: Filter,
    /// The selected session's id (kept across polls, whatever its position).
    pub selected: Option<String>,
    pub detail: bool,
    /// The journal of the session in the detail pane, or why it could not be read.
    pub journal: Option<(String, Result<Vec<ActionRecord>, String>)>,
    pub mode: Mode,
    /// The outcome of the latest prompt or hand-off, shown in the footer.
    pub message: Option<String>,
}

impl App {
    /// The rows on screen, in order.
    pub fn visible(&self) -> Vec<&Row> {
        self.fleet.as_ref().map_or_else(Vec::new, |f| visible(&f.rows, self.sort, &self.filter))
    }

    /// The selected row (the first one when the selection is gone).
    pub fn selected_row(&self) -> Option<&Row> {
        let rows = self.visible();
        let at = self.selected.as_deref().and_then(|id| rows.iter().position(|r| r.id == id)).unwrap_or(0);
        rows.get(at).copied()
    }

    /// The session the detail pane shows, when it is open.
    pub fn detail_session(&self) -> Option<String> {
        self.detail.then(|| self.selected_row().map(|r| r.id.clone())).flatten()
    }

    /// A poll's answer.
    pub fn on_status(&mut self, answer: Result<StatusDocument, String>) {
        match answer {
            Ok(doc) => {
                self.fleet = Some(Fleet::of(&doc));
                self.error = None;
                self.selected = self.selected_row().map(|r| r.id.clone());
            }
            Err(e) => self.error = Some(e),
        }
    }

    pub fn on_journal(&mut self, session: String, answer: Result<Vec<ActionRecord>, String>) {
        self.journal = Some((session, answer));
    }

    /// A prompt or hand-off finished (or failed): say so.
    pub fn on_done(&mut self, message: String) {
        self.message = Some(message);
    }

    pub fn on_key(&mut self, key: Key) -> Option<Command> {
        if key == Key::Interrupt {
            return Some(Command::Quit);
        }
        match std::mem::take(&mut self.mode) {
            Mode::Browse => self.browse(key),
            Mode::Filter { before } => {
                match key {
                    Key::Enter => {}
                    Key::Esc => self.filter.text = before,
                    Key::Backspace => {
                        self.filter.text.pop();
                        self.mode = Mode::Filter { before };
                    }
                    Key::Char(c) => {
                        self.filter.text.push(c);
                        self.mode = Mode::Filter { before };
                    }
                    _ => self.mode = Mode::Filter { before },
                }
                None
            }
            Mode::Prompt { session, mut text } => match key {
                Key::Enter if !text.trim().is_empty() => {
                    self.message = Some(format!("sending the prompt to {session}…"));
                    Some(Command::Prompt { session, text })
                }
                Key::Esc => None,
                Key::Backspace => {
                    text.pop();
                    self.mode = Mode::Prompt { session, text };
                    None
                }
                Key::Char(c) => {
                    text.push(c);
                    self.mode = Mode::Prompt { session, text };
                    None
                }
                _ => {
                    self.mode = Mode::Prompt { session, text };
                    None
                }
            },
            Mode::ConfirmHandoff { session } => match key {
                Key::Char('y' | 'Y') => {
                    self.message = Some(format!("starting a hand-off of {session}…"));
                    Some(Command::Handoff(session))
                }
                _ => {
                    self.message = Some("hand-off cancelled".to_string());
                    None
                }
            },
        }
    }

    fn browse(&mut self, key: Key) -> Option<Command> {
        match key {
            Key::Char('q') => return Some(Command::Quit),
            Key::Esc if self.detail => self.detail = false,
            Key::Esc => {
                self.filter = Filter::default();
                self.message = None;
            }
            Key::Up | Key::Char('k') => self.step(-1),
            Key::Down | Key::Char('j') => self.step(1),
            Key::Home | Key::Char('g') => self.step(isize::MIN),
            Key::End | Key::Char('G') => self.step(isize::MAX),
            Key::Char('s') => self.sort = self.sort.next(),
            Key::Char('a') => self.filter.attention_only = !self.filter.attention_only,
            Key::Char('/') => self.mode = Mode::Filter { before: self.filter.text.clone() },
            Key::Char('r') => return Some(Command::Refresh),
            Key::Enter | Key::Char('d') => {
                self.detail = !self.detail;
                return self.detail_session().map(Command::Journal);
            }
            Key::Char('p') => {
                if let Some(row) = self.selected_row() {
                    self.mode = Mode::Prompt { session: row.id.clone(), text: String::new() };
                }
            }
            Key::Char('h') => {
                if let Some(row) = self.selected_row() {
                    self.mode = Mode::ConfirmHandoff { session: row.id.clone() };
                }
            }
            // The off switch: a paused session is resumed, any other paused.
            Key::Char('z') => {
                let row = self.selected_row()?;
                let pause = row.state != SessionState::Paused;
                return Some(Command::SetPause { session: row.id.clone(), pause });
            }
            _ => {}
        }
        None
    }

    /// Moves the selection by `by` rows (clamped to the list).
    fn step(&mut self, by: isize) {
        let rows = self.visible();
        if rows.is_empty() {
            return;
        }
        let at = self.selected.as_deref().and_then(|id| rows.iter().position(|r| r.id == id)).unwrap_or(0);
        let to = (at as isize).saturating_add(by).clamp(0, rows.len() as isize - 1) as usize;
        let id = rows[to].id.clone();
        self.selected = Some(id);
        if self.detail {
            self.journal = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::fixtures::fleet_doc;

    fn app() -> App {
        let mut app = App::default();
        app.on_status(Ok(fleet_doc()));
        app
    }

    fn keys(app: &mut App, text: &str) -> Vec<Command> {
        text.chars().filter_map(|c| app.on_key(Key::Char(c))).collect()
    }

    #[test]
    fn q_and_ctrl_c_quit_but_q_is_text_while_typing() {
        let mut a = app();
        assert_eq!(a.on_key(Key::Char('q')), Some(Command::Quit));
        a.on_key(Key::Char('/'));
        assert_eq!(a.on_key(Key::Char('q')), None);
        assert_eq!(a.filter.text, "q");
        assert_eq!(a.on_key(Key::Interrupt), Some(Command::Quit));
    }

    #[test]
    fn a_filter_is_typed_after_slash_and_esc_restores_the_previous_one() {
        let mut a = app();
        keys(&mut a, "/pars");
        a.on_key(Key::Enter);
        assert_eq!(a.visible().len(), 1);
        keys(&mut a, "/xyz");
        a.on_key(Key::Esc);
        assert_eq!(a.filter.text, "pars");
        a.on_key(Key::Esc);
        assert!(!a.filter.is_active());
    }

    #[test]
    fn the_selection_follows_its_session_and_stays_in_the_list() {
        let mut a = app();
        let first = a.selected_row().unwrap().id.clone();
        a.on_key(Key::Down);
        let second = a.selected_row().unwrap().id.clone();
        assert_ne!(first, second);
        a.on_key(Key::End);
        a.on_key(Key::Down);
        assert_eq!(a.selected_row().unwrap().id, a.visible().last().unwrap().id);
        let chosen = a.selected.clone();
        a.on_status(Ok(fleet_doc()));
        assert_eq!(a.selected, chosen, "a new poll keeps the selection");
    }

    #[test]
    fn a_prompt_is_typed_for_the_selected_session_and_sent_on_enter() {
        let mut a = app();
        let id = a.selected_row().unwrap().id.clone();
        keys(&mut a, "p");
        keys(&mut a, "run the tests");
        assert_eq!(a.on_key(Key::Enter), Some(Command::Prompt { session: id, text: "run the tests".into() }));
        assert_eq!(a.mode, Mode::Browse);
        keys(&mut a, "p");
        assert_eq!(a.on_key(Key::Enter), None, "an empty prompt is not sent");
        a.on_key(Key::Esc);
        assert_eq!(a.mode, Mode::Browse);
    }

    #[test]
    fn a_hand_off_is_asked_for_and_only_y_confirms_it() {
        let mut a = app();
        let id = a.selected_row().unwrap().id.clone();
        keys(&mut a, "h");
        assert_eq!(keys(&mut a, "n"), vec![]);
        assert_eq!(a.message.as_deref(), Some("hand-off cancelled"));
        assert_eq!(keys(&mut a, "hy"), vec![Command::Handoff(id)]);
    }

    #[test]
    fn z_pauses_the_selected_session_and_resumes_a_paused_one() {
        let mut a = app();
        let row = a.selected_row().unwrap().clone();
        let pause = row.state != SessionState::Paused;
        assert_eq!(keys(&mut a, "z"), vec![Command::SetPause { session: row.id.clone(), pause }]);
        let paused = a.visible().into_iter().find(|r| r.state == SessionState::Paused).map(|r| r.id.clone());
        let paused = paused.expect("the fixture fleet has a paused session");
        a.selected = Some(paused.clone());
        assert_eq!(keys(&mut a, "z"), vec![Command::SetPause { session: paused, pause: false }]);
    }

    #[test]
    fn opening_the_detail_pane_asks_for_the_journal() {
        let mut a = app();
        let id = a.selected_row().unwrap().id.clone();
        assert_eq!(a.on_key(Key::Enter), Some(Command::Journal(id)));
        assert!(a.detail);
        a.on_key(Key::Esc);
        assert!(!a.detail);
    }

    #[test]
    fn a_failed_poll_keeps_the_last_fleet_and_says_why() {
        let mut a = app();
        a.on_status(Err("cannot reach the daemon".into()));
        assert!(a.fleet.is_some());
        assert_eq!(a.error.as_deref(), Some("cannot reach the daemon"));
    }
}
