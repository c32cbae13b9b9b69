//! Session ids of OpenCode's shape only: one that is not (from a hostile server, or
//! anything between) is never put in a request's path, and a session carrying one is
//! dropped from an answer.

use shepherd_actors::event::SessionInfo;
use shepherd_actors::ids::{self, IdKind};
use shepherd_actors::ports::EngineError;

/// `/session/ID` + `rest`, for a session id of OpenCode's shape only: an id that is not
/// (from a hostile server, or anything between) is refused before any request is made.
pub(super) fn session_path(id: &str, rest: &str) -> Result<String, EngineError> {
    if let Err(bad) = ids::check(IdKind::Session, id) {
        tracing::warn!(error = %bad, "refusing to call OpenCode about a session whose id is not of OpenCode's shape");
        return Err(EngineError::NotFound(format!("{bad}: not sent to the server")));
    }
    Ok(format!("/session/{}{}", urlencode(id), rest))
}

/// Percent-encodes one path segment: everything but `[A-Za-z0-9_-]`, the dot included,
/// so that no `.` or `..` segment can be normalised away by the URL parser.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Keeps the sessions of an answer whose ids (and parents) are of OpenCode's shape; the
/// others are dropped with a warning.
pub(super) fn valid_sessions(sessions: Vec<SessionInfo>, what: &str) -> Vec<SessionInfo> {
    sessions.into_iter().filter(|s| check_session(s, what).is_ok()).collect()
}

/// One session of an answer: its id and parent must be of OpenCode's shape.
pub(super) fn check_session(s: &SessionInfo, what: &str) -> Result<(), EngineError> {
    let checked = ids::check(IdKind::Session, &s.id)
        .and_then(|()| s.parent_id.as_deref().map_or(Ok(()), |p| ids::check(IdKind::Session, p)));
    checked.map_err(|bad| {
        tracing::warn!(what, error = %bad, "dropping a session whose id is not of OpenCode's shape from a server's answer");
        EngineError::Decode(format!("{what}: {bad}"))
    })
}

#[cfg(test)]
mod tests {
    use shepherd_actors::config::ServerConfig;
    use shepherd_actors::ports::{Control, Discovery, Lifecycle, Reads};

    use super::super::tests::{prompt, recording_server};
    use super::super::OpenCodeClient;
    use super::*;

    #[test]
    fn odd_session_ids_are_escaped_in_paths() {
        assert!(session_path("ses_1/../x", "/abort").is_err());
        assert_eq!(urlencode(".."), "%2E%2E");
        assert_eq!(urlencode("a/../b"), "a%2F%2E%2E%2Fb");
    }

    fn hostile_ids() -> Vec<String> {
        let mut ids: Vec<String> =
            ["../../etc/x", "a/b", "..", "%2e%2e", "ses_..", "ses_a/../b", "ses_%2e%2e", "ses_a\0b"]
                .map(String::from)
                .into();
        ids.push(format!("ses_{}", "A".repeat(10 * 1024)));
        ids
    }

    #[tokio::test]
    async fn hostile_session_ids_are_never_sent_as_a_path() {
        let (url, seen) = recording_server(b"{}".to_vec(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        for id in hostile_ids() {
            assert!(matches!(client.abort(&id).await, Err(EngineError::NotFound(_))), "{id:?}");
            assert!(client.session(&id).await.is_err(), "{id:?}");
            assert!(client.prompt(&id, &prompt()).await.is_err(), "{id:?}");
            assert!(client.history(&id, 5).await.is_err(), "{id:?}");
            assert!(client.delete_session(&id).await.is_err(), "{id:?}");
        }
        assert_eq!(*seen.lock().unwrap(), Vec::<String>::new(), "no request may reach the server");
        // A good id still goes through, to the path it names.
        client.abort("ses_A").await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["POST /session/ses_A/abort HTTP/1.1"]);
    }

    #[tokio::test]
    async fn sessions_with_hostile_ids_in_an_answer_are_dropped_and_the_rest_kept() {
        let mut listed = vec![serde_json::json!({"id": "ses_good", "time": {}})];
        for id in hostile_ids() {
            listed.push(serde_json::json!({"id": id, "time": {}}));
        }
        listed.push(serde_json::json!({"id": "ses_child", "parentID": "../ses_x", "time": {}}));
        let (url, _) = recording_server(serde_json::to_vec(&listed).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let found = client.list_sessions(100).await.unwrap();
        assert_eq!(found.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["ses_good"]);
        let found = client.find_sessions(None, "x").await.unwrap();
        assert_eq!(found.len(), 1);

        let statuses: serde_json::Map<String, serde_json::Value> = hostile_ids()
            .into_iter()
            .chain(["ses_busy".to_string()])
            .map(|id| (id, serde_json::json!({"type": "busy"})))
            .collect();
        let (url, _) = recording_server(serde_json::to_vec(&statuses).unwrap(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        let map = client.statuses("/p").await.unwrap();
        assert_eq!(map.keys().collect::<Vec<_>>(), ["ses_busy"]);

        // One session whose own id is hostile: an error, not a session.
        let (url, _) = recording_server(br#"{"id":"../../etc","time":{}}"#.to_vec(), false).await;
        let client = OpenCodeClient::new(&ServerConfig::new("a", &url), None).unwrap();
        assert!(matches!(client.session("ses_A").await, Err(EngineError::Decode(_))));
    }
}
