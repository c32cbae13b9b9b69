//! `GET /question` and `GET /permission`: what a directory's sessions wait on the person
//! for. A reconnect reads them so that a session that asked while the stream was down
//! is known to wait (busy and silent by design), not taken for stalled.
//!
//! Each entry is what its `question.asked` / `permission.asked` event carried, so it is
//! read by the stream's own decoder (the same checks of ids and shapes); an entry that
//! does not decode is dropped with a warning, the others kept.

use reqwest::Method;
use serde_json::value::RawValue;
use shepherd_actors::event::{decode, DecodeError, Event};
use shepherd_actors::ports::EngineError;

use super::OpenCodeClient;

/// What a REST answer says in the shape of one of the stream's events (`kind`, with
/// these `properties`), read by the stream's own decoder: the same checks of ids and
/// shapes as any event.
pub(super) fn as_event(kind: &str, properties: &str) -> Result<Event, DecodeError> {
    let frame = format!(r#"{{"payload":{{"type":"{kind}","properties":{properties}}}}}"#);
    decode(&frame).map(|envelope| envelope.event)
}

impl OpenCodeClient {
    /// The pending questions, then permission requests, of `directory` as the events
    /// that asked them.
    pub(super) async fn asks_of(&self, directory: &str) -> Result<Vec<Event>, EngineError> {
        let mut out = Vec::new();
        for (path, kind) in [("/question", "question.asked"), ("/permission", "permission.asked")] {
            let what = format!("GET {path}");
            let rb = self.request(Method::GET, path).query(&[("directory", directory)]);
            let entries: Vec<Box<RawValue>> = self.get_json(rb, &what).await?;
            out.extend(asked(&entries, kind, &what));
        }
        Ok(out)
    }
}

/// The entries that decode as `kind` events (`question.asked`, `permission.asked`).
fn asked(entries: &[Box<RawValue>], kind: &str, what: &str) -> Vec<Event> {
    let mut events = Vec::with_capacity(entries.len());
    for entry in entries {
        match as_event(kind, entry.get()) {
            Ok(event @ (Event::QuestionAsked { .. } | Event::PermissionAsked { .. })) => events.push(event),
            Ok(_) => {}
            Err(e) => tracing::warn!(what, error = %e, "dropping a pending ask that does not read as its event"),
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(json: &str) -> Vec<Box<RawValue>> {
        serde_json::from_str(json).unwrap()
    }

    /// The shape `GET /question` answers with (OpenCode 1.18.34); a malformed entry or
    /// one with an id not of OpenCode's shape is dropped, the rest kept.
    #[test]
    fn pending_asks_read_as_their_events_and_bad_entries_are_dropped() {
        let questions = entries(
            r#"[{"id":"que_1","questions":[{"header":"Pick","options":[{"description":"a","label":"A"}],"question":"Pick one?"}],"sessionID":"ses_A","tool":{"callID":"call_1","messageID":"msg_B"}},
                {"id":"que_2"},
                {"id":"que_3","sessionID":"ses_../../etc"},
                {"id":"que_4","sessionID":"ses_C"}]"#,
        );
        let got = asked(&questions, "question.asked", "GET /question");
        assert_eq!(
            got,
            vec![
                Event::QuestionAsked { id: "que_1".into(), session_id: "ses_A".into() },
                Event::QuestionAsked { id: "que_4".into(), session_id: "ses_C".into() },
            ]
        );
        let permissions = entries(r#"[{"id":"per_1","sessionID":"ses_A","permission":"bash","patterns":["echo hi"]}]"#);
        assert_eq!(
            asked(&permissions, "permission.asked", "GET /permission"),
            vec![Event::PermissionAsked { id: "per_1".into(), session_id: "ses_A".into() }]
        );
    }
}
