//! What the supervisor knows now, read at scrape time: the state of each session (for
//! `shepherd_sessions`) and whether every server is ready (for `GET /readyz`). Pure.

use serde::Serialize;
use shepherd_actors::stats::{LiveSession, SessionState};
use shepherd_actors::supervisor::ServerView;

/// Every state [`session_state`] names, so each is exported (as 0 when no session is in
/// it) and a state a session has left does not keep its last value.
pub const SESSION_STATES: [&str; 8] = {
    let live = SessionState::LIVE;
    let mut names = [""; 8];
    let mut i = 0;
    while i < live.len() {
        names[i] = live[i].as_str();
        i += 1;
    }
    names
};

/// One session's state at `now_ms`, as one of [`SESSION_STATES`]: decided by
/// [`SessionState::of_activity`], the same rule the status file, `GET /v1/status` and
/// `shepherd top` show.
pub fn session_state(s: &LiveSession, now_ms: i64) -> &'static str {
    SessionState::of_activity(&s.activity, now_ms).as_str()
}

/// A server that is not ready, and why (for the 503 body of `/readyz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NotReady {
    pub server: String,
    /// `stream not connected` or `reconciling after connect`.
    pub reason: &'static str,
}

/// Ready when at least one server is attached and every attached server's stream is
/// connected and its first reconciliation after that connect is done. Otherwise the
/// servers that are not, by name (sorted); with no server attached yet (the first
/// instants after start-up), a pseudo-entry `*` says so.
pub fn readiness(servers: &[ServerView]) -> Result<(), Vec<NotReady>> {
    if servers.is_empty() {
        return Err(vec![NotReady { server: "*".into(), reason: "no server attached yet" }]);
    }
    let mut not_ready: Vec<NotReady> = servers
        .iter()
        .filter_map(|s| {
            let reason = if !s.connected {
                "stream not connected"
            } else if !s.reconciled {
                "reconciling after connect"
            } else {
                return None;
            };
            Some(NotReady { server: s.name.clone(), reason })
        })
        .collect();
    not_ready.sort_by(|a, b| a.server.cmp(&b.server));
    if not_ready.is_empty() {
        Ok(())
    } else {
        Err(not_ready)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use shepherd_actors::control::{HandoffView, SessionDetail};

    use super::*;

    fn server(name: &str, connected: bool, reconciled: bool) -> ServerView {
        ServerView { name: name.into(), connected, reconciled, events: BTreeMap::new() }
    }

    #[test]
    fn ready_only_when_every_server_is_connected_and_reconciled() {
        assert_eq!(readiness(&[server("a", true, true), server("b", true, true)]), Ok(()));
        let not = readiness(&[server("b", true, false), server("a", false, false), server("c", true, true)]);
        assert_eq!(
            not,
            Err(vec![
                NotReady { server: "a".into(), reason: "stream not connected" },
                NotReady { server: "b".into(), reason: "reconciling after connect" },
            ])
        );
        assert!(readiness(&[]).is_err(), "nothing attached yet is not ready");
    }

    fn detail() -> SessionDetail {
        SessionDetail::new("local", "ses_1")
    }

    #[test]
    fn a_session_has_one_state_the_strongest_fact_first() {
        let state = |d: SessionDetail, now_ms| session_state(&LiveSession::from(&d), now_ms);
        assert_eq!(state(detail(), 0), "idle");
        assert_eq!(state(SessionDetail { busy: true, ..detail() }, 0), "working");
        assert_eq!(state(SessionDetail { busy: true, recovering: true, ..detail() }, 0), "recovering");
        assert_eq!(state(SessionDetail { compacting: true, ..detail() }, 0), "compacting");
        let handing = HandoffView { phase: "persisting".into(), ..HandoffView::default() };
        assert_eq!(state(SessionDetail { busy: true, handoff: handing, ..detail() }, 0), "handing_off");
        assert_eq!(state(SessionDetail { paused: Some("user_abort".into()), busy: true, ..detail() }, 0), "paused");
        let quiet = SessionDetail { busy: true, stall_timeout_ms: Some(1_000), ..detail() };
        assert_eq!(state(quiet.clone(), 999), "working");
        assert_eq!(state(quiet, 1_000), "stalled");
        assert_eq!(state(SessionDetail { waiting_on_person: true, ..detail() }, 0), "waiting_on_person");
        for s in
            ["idle", "working", "recovering", "compacting", "handing_off", "paused", "stalled", "waiting_on_person"]
        {
            assert!(SESSION_STATES.contains(&s));
        }
    }
}
