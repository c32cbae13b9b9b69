//! What each kind of target receives for a [`Message`]: pure. Every text that leaves
//! (reason, session title, directory) has passed the [`Redactor`] in [`Item::redacted`].
//!
//! - **webhook**: `Content-Type: application/json`. One occurrence is one object:
//!   `{"event", "phase", "server", "session", "title", "directory", "reason", "time",
//!   "at_ms", "text"}` (`phase` is `began`/`ended` for `provider_outage` and
//!   `server_unreachable`, else `null`; `session`, `title`, `directory` are `null` when
//!   unknown or when the server as a whole is concerned; `time` is RFC 3339, UTC).
//!   Several occurrences of one event in one batch window are one object
//!   `{"event", "phase", "count", "more", "text", "notifications": [objects as above]}`
//!   (`more` of the `count` are not listed).
//! - **ntfy**: the text as the body; headers `Title`, `Priority` (when set) and `Tags`.
//! - **slack**: `{"text": "*headline*\n…"}` (Slack's `&`, `<`, `>` escaped).

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};
use shepherd_actors::config::{NotifyConfig, NotifyEvent, NotifyKind};
use shepherd_actors::redact::Redactor;

use super::batch::Message;
use super::decide::Occurrence;

/// An occurrence with what the supervisor knows of its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub occurrence: Occurrence,
    pub title: Option<String>,
    pub directory: Option<String>,
}

impl Item {
    /// The item with every free text passed through `r`.
    pub fn redacted(mut self, r: &Redactor) -> Self {
        r.redact_in_place(&mut self.occurrence.reason);
        for text in [self.title.as_mut(), self.directory.as_mut()].into_iter().flatten() {
            r.redact_in_place(text);
        }
        self
    }
}

/// A POST to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// The headline: "Shepherd: session ses_… gave up", "Shepherd: 12 sessions gave up".
pub fn headline(m: &Message, items: &[Item]) -> String {
    let n = m.count();
    let server = items.first().map_or("?", |i| i.occurrence.server.as_str());
    let whole = |one: &str, many: &str| {
        if n == 1 {
            format!("{one} on server {server}")
        } else {
            format!("{many} ({n} servers)")
        }
    };
    let sessions = |one: &str, many: &str| match (n, items.first().and_then(|i| i.occurrence.session.as_deref())) {
        (1, Some(s)) => format!("session {s} {one}"),
        _ => format!("{n} sessions {many}"),
    };
    let what = match (m.event, m.phase) {
        (NotifyEvent::WaitingOnPerson, _) => sessions("waits for you", "wait for you"),
        (NotifyEvent::GaveUp, _) => sessions("was given up", "were given up"),
        (NotifyEvent::HandoffFailed, _) => sessions("could not be handed off", "could not be handed off"),
        (NotifyEvent::Paused, _) => sessions("was paused", "were paused"),
        (NotifyEvent::ProviderOutage, Some("ended")) => whole("provider outage over", "provider outages over"),
        (NotifyEvent::ProviderOutage, _) => whole("provider outage", "provider outages"),
        (NotifyEvent::ServerUnreachable, Some("ended")) => whole("event stream back", "event streams back"),
        (NotifyEvent::ServerUnreachable, _) => whole("event stream down", "event streams down"),
    };
    format!("Shepherd: {what}")
}

/// One line per item, then "… and N more".
pub fn lines(m: &Message, items: &[Item]) -> Vec<String> {
    let mut out: Vec<String> = items
        .iter()
        .map(|i| {
            let o = &i.occurrence;
            let mut line = match &o.session {
                Some(s) => format!("{}/{s}", o.server),
                None => o.server.clone(),
            };
            if let Some(t) = i.title.as_deref().filter(|t| !t.is_empty()) {
                line.push_str(&format!(" \"{t}\""));
            }
            if let Some(d) = i.directory.as_deref().filter(|d| !d.is_empty()) {
                line.push_str(&format!(" in {d}"));
            }
            line.push_str(&format!(": {}", o.reason));
            line
        })
        .collect();
    if m.more > 0 {
        out.push(format!("… and {} more", m.more));
    }
    out
}

fn time(at_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(at_ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

fn object(i: &Item, text: Option<String>) -> Value {
    let o = &i.occurrence;
    let mut v = json!({
        "event": o.event.as_str(),
        "phase": o.phase,
        "server": o.server,
        "session": o.session,
        "title": i.title,
        "directory": i.directory,
        "reason": o.reason,
        "time": time(o.at_ms),
        "at_ms": o.at_ms,
    });
    if let Some(text) = text {
        v["text"] = Value::String(text);
    }
    v
}

/// The request for target `cfg`; `items` are the message's items, enriched and redacted.
pub fn request(cfg: &NotifyConfig, m: &Message, items: &[Item]) -> Request {
    let head = headline(m, items);
    let lines = lines(m, items);
    match cfg.kind {
        NotifyKind::Webhook => {
            let text = format!("{head}\n{}", lines.join("\n"));
            let body = match items {
                [one] if m.more == 0 => object(one, Some(text)),
                _ => json!({
                    "event": m.event.as_str(),
                    "phase": m.phase,
                    "count": m.count(),
                    "more": m.more,
                    "text": text,
                    "notifications": items.iter().map(|i| object(i, None)).collect::<Vec<_>>(),
                }),
            };
            Request { content_type: "application/json", headers: Vec::new(), body: body.to_string() }
        }
        NotifyKind::Ntfy => {
            let mut headers = vec![("Title", header_text(&head))];
            if let Some(p) = cfg.priority {
                headers.push(("Priority", p.to_string()));
            }
            if !cfg.tags.is_empty() {
                headers.push(("Tags", header_text(&cfg.tags.join(","))));
            }
            Request { content_type: "text/plain; charset=utf-8", headers, body: lines.join("\n") }
        }
        NotifyKind::Slack => {
            let text = format!("*{}*\n{}", slack_escape(&head), slack_escape(&lines.join("\n")));
            Request { content_type: "application/json", headers: Vec::new(), body: json!({ "text": text }).to_string() }
        }
    }
}

/// A header value: printable ASCII only (anything else becomes `?`), at most 200 bytes.
fn header_text(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).take(200).collect()
}

fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(session: &str, reason: &str) -> Item {
        Item {
            occurrence: Occurrence {
                event: NotifyEvent::GaveUp,
                phase: None,
                server: "local".into(),
                session: Some(session.into()),
                reason: reason.into(),
                at_ms: 1_700_000_000_000,
                key: format!("gave_up|local|{session}|1"),
            },
            title: Some("fix the <build>".into()),
            directory: Some("/work/repo".into()),
        }
    }

    fn message(items: &[Item], more: usize) -> Message {
        Message {
            event: NotifyEvent::GaveUp,
            phase: None,
            items: items.iter().map(|i| i.occurrence.clone()).collect(),
            more,
            keys: Vec::new(),
        }
    }

    #[test]
    fn a_webhook_gets_one_object_with_every_field_for_one_occurrence() {
        let items = [item("ses_a", "stalled again")];
        let cfg = NotifyConfig::new(NotifyKind::Webhook, "http://x");
        let r = request(&cfg, &message(&items, 0), &items);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["event"], "gave_up");
        assert_eq!(v["server"], "local");
        assert_eq!(v["session"], "ses_a");
        assert_eq!(v["title"], "fix the <build>");
        assert_eq!(v["directory"], "/work/repo");
        assert_eq!(v["reason"], "stalled again");
        assert_eq!(v["time"], "2023-11-14T22:13:20.000Z");
        assert!(v["text"].as_str().unwrap().starts_with("Shepherd: session ses_a was given up"));
    }

    #[test]
    fn a_webhook_batch_is_an_object_with_the_count_and_the_listed_notifications() {
        let items = [item("ses_a", "r"), item("ses_b", "r")];
        let cfg = NotifyConfig::new(NotifyKind::Webhook, "http://x");
        let v: Value = serde_json::from_str(&request(&cfg, &message(&items, 10), &items).body).unwrap();
        assert_eq!((v["count"].as_u64(), v["more"].as_u64()), (Some(12), Some(10)));
        assert_eq!(v["notifications"].as_array().unwrap().len(), 2);
        assert!(v["text"].as_str().unwrap().starts_with("Shepherd: 12 sessions were given up"));
        assert!(v["text"].as_str().unwrap().ends_with("… and 10 more"));
    }

    #[test]
    fn ntfy_gets_the_text_with_title_priority_and_tags_headers() {
        let items = [item("ses_a", "r")];
        let mut cfg = NotifyConfig::new(NotifyKind::Ntfy, "https://ntfy.example/topic");
        cfg.priority = Some(4);
        cfg.tags = vec!["warning".into(), "robot".into()];
        let r = request(&cfg, &message(&items, 0), &items);
        assert_eq!(
            r.headers,
            vec![
                ("Title", "Shepherd: session ses_a was given up".to_string()),
                ("Priority", "4".to_string()),
                ("Tags", "warning,robot".to_string())
            ]
        );
        assert_eq!(r.body, "local/ses_a \"fix the <build>\" in /work/repo: r");
    }

    #[test]
    fn slack_gets_escaped_text() {
        let items = [item("ses_a", "a & b")];
        let cfg = NotifyConfig::new(NotifyKind::Slack, "https://hooks.example/x");
        let v: Value = serde_json::from_str(&request(&cfg, &message(&items, 0), &items).body).unwrap();
        assert_eq!(
            v["text"],
            "*Shepherd: session ses_a was given up*\nlocal/ses_a \"fix the &lt;build&gt;\" in /work/repo: a &amp; b"
        );
    }

    #[test]
    fn secrets_in_the_reason_and_the_title_are_redacted() {
        let secret = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789ABCD";
        let mut i = item("ses_a", &format!("the key {secret} failed"));
        i.title = Some(format!("use {secret}"));
        let r = Redactor::default();
        let i = i.redacted(&r);
        assert!(!i.occurrence.reason.contains(secret), "{}", i.occurrence.reason);
        assert!(!i.title.as_deref().unwrap().contains(secret));
    }
}
