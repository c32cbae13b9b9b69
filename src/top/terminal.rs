//! The terminal's own features `shepherd top` may use, as escape sequences (pure
//! strings; the event loop writes them): the window title with the fleet's counts, and
//! the OSC 9;4 progress indicator (ConEmu, Windows Terminal, WezTerm, Ghostty, …) with
//! the most-stalled session's way towards recovery. Both are opt-in and only written to
//! a terminal.

use shepherd_actors::stats::SessionState;

use super::model::{state_label, Fleet};

/// Saves the current title on the terminal's title stack (restored by [`POP_TITLE`]).
pub const PUSH_TITLE: &str = "\x1b[22;0t";
pub const POP_TITLE: &str = "\x1b[23;0t";
/// Removes the progress indicator.
pub const CLEAR_PROGRESS: &str = "\x1b]9;4;0;0\x07";

/// `shepherd: 6 sessions, 1 stalled, 1 waiting` — the states that ask for attention,
/// when there are any.
pub fn title_text(fleet: &Fleet) -> String {
    let mut parts = vec![format!("{} sessions", fleet.total())];
    for state in [
        SessionState::Stalled,
        SessionState::Recovering,
        SessionState::HandingOff,
        SessionState::WaitingOnPerson,
        SessionState::Paused,
    ] {
        let n = fleet.count(state);
        if n > 0 {
            parts.push(format!("{n} {}", state_label(state)));
        }
    }
    format!("shepherd: {}", parts.join(", "))
}

/// OSC 2: set the window title (control characters removed).
pub fn set_title(text: &str) -> String {
    let clean: String = text.chars().filter(|c| !c.is_control()).collect();
    format!("\x1b]2;{clean}\x07")
}

/// OSC 9;4 for [`Fleet::recovery_progress`]: normal progress up to 99, "warning" (4)
/// once a session is stalled past its timeout, and 100 while a recovery runs; removed
/// when no stall timer runs.
pub fn progress(fleet: &Fleet) -> String {
    match fleet.recovery_progress() {
        None => CLEAR_PROGRESS.to_string(),
        Some(value) => {
            let state = if fleet.count(SessionState::Stalled) > 0 && value < 100 { 4 } else { 1 };
            format!("\x1b]9;4;{state};{value}\x07")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::fixtures::fleet_doc;

    #[test]
    fn the_title_counts_the_fleet_and_what_needs_attention() {
        let fleet = Fleet::of(&fleet_doc());
        assert_eq!(title_text(&fleet), "shepherd: 6 sessions, 1 stalled, 1 recovering, 1 waiting, 1 paused");
        assert_eq!(set_title("a\x1bb"), "\x1b]2;ab\x07");
    }

    #[test]
    fn progress_is_full_while_a_recovery_runs_and_otherwise_at_most_99() {
        let mut fleet = Fleet::of(&fleet_doc());
        assert_eq!(progress(&fleet), "\x1b]9;4;1;100\x07", "a recovery is under way");
        fleet.rows.retain(|r| r.state != SessionState::Recovering);
        fleet.totals.retain(|(s, _)| *s != SessionState::Recovering);
        assert_eq!(progress(&fleet), "\x1b]9;4;4;99\x07", "stalled past its timeout: warning, capped");
        fleet.rows.retain(|r| r.state != SessionState::Stalled);
        fleet.totals.retain(|(s, _)| *s != SessionState::Stalled);
        assert_eq!(progress(&fleet), "\x1b]9;4;1;25\x07", "45 s of a 3 min timeout");
        fleet.rows.clear();
        assert_eq!(progress(&fleet), CLEAR_PROGRESS);
    }
}
