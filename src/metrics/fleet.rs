//! What the supervisor knows now, read at scrape time: the state of each session (for
//! `shepherd_sessions`) and whether every server is ready (for `GET /readyz`). Pure.

use serde::Serialize;
use shepherd_actors::control::SessionDetail;
use shepherd_actors::supervisor::ServerView;

/// Every state [`session_state`] names, so each is exported (as 0 when no session is in
/// it) and a state a session has left does not keep its last value.
pub const SESSION_STATES: [&str; 6] = ["working", "idle", "recovering", "compacting", "handing_off", "paused"];

/// One session's state, as one of [`SESSION_STATES`]: `paused` (automation off until the
/// person writes), `handing_off` (a hand-off step under way), `recovering` (abort +
/// continue under way), `compacting`, `working` (busy) or `idle`.
pub fn session_state(s: &SessionDetail) -> &'static str {
    const HANDING_OFF: [&str; 3] = ["persisting", "handing_over", "resuming"];
    if s.paused.is_some() {
        "paused"
    } else if HANDING_OFF.contains(&s.handoff.phase.as_str()) {
        "handing_off"
    } else if s.recovering {
        "recovering"
    } else if s.compacting {
        "compacting"
    } else if s.busy {
        "working"
    } else {
        "idle"
    }
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

    use shepherd_actors::control::HandoffView;

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
        SessionDetail {
            server: "local".into(),
            id: "ses_1".into(),
            title: None,
            directory: None,
            busy: false,
            waiting_on_person: false,
            last_activity_ms: 0,
            stall_timeout_ms: None,
            recovering: false,
            paused: None,
            attempts: 0,
            todos: vec![],
            context_tokens: None,
            context_window: None,
            context_percent: None,
            compacting: false,
            last_action: None,
            handoff: HandoffView { phase: "monitoring".into(), ..HandoffView::default() },
        }
    }

    #[test]
    fn a_session_has_one_state_the_strongest_fact_first() {
        assert_eq!(session_state(&detail()), "idle");
        assert_eq!(session_state(&SessionDetail { busy: true, ..detail() }), "working");
        assert_eq!(session_state(&SessionDetail { busy: true, recovering: true, ..detail() }), "recovering");
        assert_eq!(session_state(&SessionDetail { compacting: true, ..detail() }), "compacting");
        let handing = HandoffView { phase: "persisting".into(), ..HandoffView::default() };
        assert_eq!(session_state(&SessionDetail { busy: true, handoff: handing, ..detail() }), "handing_off");
        assert_eq!(
            session_state(&SessionDetail { paused: Some("user_abort".into()), busy: true, ..detail() }),
            "paused"
        );
        for s in ["idle", "working", "recovering", "compacting", "handing_off", "paused"] {
            assert!(SESSION_STATES.contains(&s));
        }
    }
}
