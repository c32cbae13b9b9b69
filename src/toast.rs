//! Toasts in an OpenCode TUI when Shepherd acts on a session (`[toasts]`, off by default).
//!
//! An edge adapter fed from the journal: it decides nothing about sessions. For each
//! record of an action a person watching the TUI would want to know about — a continue
//! after a stall, a nudge, a review, a completed hand-off — [`toast_for`] (pure) words
//! the toast, and [`Toasts`] posts it to the session's server (`POST /tui/show-toast`
//! with the session's `directory`, so the TUI of that project shows it; OpenCode
//! publishes it as a `tui.toast.show` event). Best effort: a failure is logged at debug
//! and never touches the action, which has already happened.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use shepherd_actors::config::ToastsConfig;
use shepherd_actors::journal::{Action, ActionRecord, Journal, Outcome};
use shepherd_actors::ports::Reads as _;
use tokio::sync::broadcast::error::RecvError;

pub use crate::opencode::client::Toast;
use crate::opencode::OpenCodeClient;

/// The actions a toast may be made for ([`toast_for`] words it): the poster is queued
/// only these records, so a burst of others neither wakes it nor pushes one out.
pub const ACTIONS: [Action; 4] = [Action::Continue, Action::Nudge, Action::Review, Action::Handoff];

/// The toast a record deserves, if any: actions done on the session, not decisions
/// declined or the bookkeeping around them.
pub fn toast_for(r: &ActionRecord, cfg: &ToastsConfig) -> Option<Toast> {
    if r.outcome != Outcome::Done {
        return None;
    }
    let (title, variant) = match r.action {
        Action::Continue => ("Shepherd continued a stalled session", "warning"),
        Action::Nudge => ("Shepherd nudged: open todos", "info"),
        Action::Review => ("Shepherd asked for a review: all todos done", "info"),
        Action::Handoff if r.numbers.phase.as_deref() == Some("completed") => {
            ("Shepherd handed the session over to a fresh one", "success")
        }
        _ => return None,
    };
    let message = format!("{} ({}): {}", short(&r.session), r.action.as_str(), r.reason);
    Some(Toast { title: title.to_string(), message, variant, duration: cfg.duration.as_millis() as u64 })
}

/// `ses_1234abcd…` → its first 12 characters: enough to tell sessions apart in a toast.
fn short(session: &str) -> &str {
    session.char_indices().nth(12).map_or(session, |(i, _)| &session[..i])
}

/// The toast poster: settings and per-server clients a reload replaces.
#[derive(Clone, Default)]
pub struct Toasts {
    cfg: Arc<RwLock<Setting>>,
    servers: Arc<RwLock<HashMap<String, OpenCodeClient>>>,
}

/// The settings in force, and since when toasts are on (epoch ms): a record made
/// before they were turned on makes no toast, however late the poster reads it (a
/// reload that turned them on just after a recovery toasted that recovery).
#[derive(Default)]
struct Setting {
    cfg: ToastsConfig,
    on_since_ms: i64,
}

impl Toasts {
    /// Follows the journal until it closes; posts nothing while `toasts.enabled` is off.
    pub fn start(cfg: &ToastsConfig, journal: &Journal) -> Toasts {
        let toasts = Toasts::default();
        toasts.set_config(cfg.clone());
        let mut records = journal.subscribe_to(&ACTIONS);
        let poster = toasts.clone();
        actix::spawn(async move {
            loop {
                match records.recv().await {
                    Ok(r) => poster.post(&r),
                    Err(RecvError::Lagged(n)) => {
                        tracing::debug!(missed = n, "toasts: records missed (their queue was full)");
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
        toasts
    }

    pub fn set_config(&self, cfg: ToastsConfig) {
        if let Ok(mut s) = self.cfg.write() {
            if cfg.enabled && !s.cfg.enabled {
                // The journal's clock: records are stamped with it.
                s.on_since_ms = shepherd_actors::ports::Clock::wall_ms(&shepherd_actors::ports::SystemClock);
            }
            s.cfg = cfg;
        }
    }

    /// The settings to toast `r` with: none while toasts are off, nor for a record made
    /// before they were turned on.
    fn config_for(&self, r: &ActionRecord) -> Option<ToastsConfig> {
        self.cfg.read().ok().filter(|s| s.cfg.enabled && r.at_ms >= s.on_since_ms).map(|s| s.cfg.clone())
    }

    /// The server's REST client (a server added or changed by a reload).
    pub fn attach(&self, server: &str, client: OpenCodeClient) {
        if let Ok(mut s) = self.servers.write() {
            s.insert(server.to_string(), client);
        }
    }

    pub fn detach(&self, server: &str) {
        if let Ok(mut s) = self.servers.write() {
            s.remove(server);
        }
    }

    fn post(&self, r: &ActionRecord) {
        let Some(cfg) = self.config_for(r) else { return };
        let Some(toast) = toast_for(r, &cfg) else { return };
        let Some(client) = self.servers.read().ok().and_then(|s| s.get(&r.server).cloned()) else { return };
        let (server, session) = (r.server.clone(), r.session.clone());
        actix::spawn(async move {
            // The session's directory routes the toast to the TUI of its project.
            let directory = client.session(&session).await.ok().and_then(|i| i.directory);
            match client.show_toast(directory.as_deref(), &toast).await {
                Ok(shown) => tracing::debug!(server = %server, session = %session, shown, "toast posted"),
                Err(e) => tracing::debug!(server = %server, session = %session, error = %e, "toast not posted"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::journal::Numbers;

    use super::*;

    fn record(action: Action, outcome: Outcome, phase: Option<&str>) -> ActionRecord {
        ActionRecord {
            server: "local".into(),
            session: "ses_0123456789abcdef".into(),
            action,
            outcome,
            reason: "idle 4s past stall_timeout".into(),
            numbers: Numbers { phase: phase.map(str::to_string), ..Numbers::default() },
            at_ms: 0,
        }
    }

    #[test]
    fn a_continue_after_a_stall_is_a_warning_toast_naming_the_session_and_why() {
        let cfg = ToastsConfig { enabled: true, duration: Duration::from_secs(3) };
        let t = toast_for(&record(Action::Continue, Outcome::Done, None), &cfg).unwrap();
        assert_eq!(t.variant, "warning");
        assert_eq!(t.duration, 3000);
        assert_eq!(t.message, "ses_01234567 (continue): idle 4s past stall_timeout");
    }

    /// A recovery recorded just before a reload turned toasts on is not toasted when the
    /// poster reads it after; one recorded after is.
    #[test]
    fn a_record_made_before_toasts_were_turned_on_makes_no_toast() {
        let toasts = Toasts::default();
        let before = ActionRecord { at_ms: 1, ..record(Action::Continue, Outcome::Done, None) };
        assert!(toasts.config_for(&before).is_none(), "off");
        toasts.set_config(ToastsConfig { enabled: true, duration: Duration::from_secs(3) });
        assert!(toasts.config_for(&before).is_none(), "made before they were on");
        let after = ActionRecord { at_ms: i64::MAX, ..before };
        assert!(toasts.config_for(&after).is_some());
    }

    #[test]
    fn only_actions_done_on_the_session_make_a_toast() {
        let cfg = ToastsConfig::default();
        for (action, outcome, phase, toast) in [
            (Action::Nudge, Outcome::Done, None, true),
            (Action::Review, Outcome::Done, None, true),
            (Action::Handoff, Outcome::Done, Some("completed"), true),
            (Action::Handoff, Outcome::Done, Some("persisting"), false),
            (Action::Nudge, Outcome::Declined, None, false),
            (Action::Continue, Outcome::Failed, None, false),
            (Action::StallDetected, Outcome::Done, None, false),
            (Action::Abort, Outcome::Done, None, false),
        ] {
            assert_eq!(toast_for(&record(action, outcome, phase), &cfg).is_some(), toast, "{action:?} {outcome:?}");
            assert!(!toast || ACTIONS.contains(&action), "{action:?} toasts: the poster must be queued its records");
        }
    }
}
