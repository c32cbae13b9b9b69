//! `shepherd notify test`: one test message to every `[[notify]]` target, through the
//! same sender (retries included) as real notifications, so a person sees it arrive and
//! how each target answered. Nothing is ledgered.

use serde_json::json;
use shepherd_actors::config::{NotifyConfig, NotifyKind};

use super::body::Request;
use super::send::Target;
use super::{display_url, resolve_url};

const TITLE: &str = "Shepherd: test notification";
const TEXT: &str = "This is a test from `shepherd notify test`: this target is configured and reachable.";

/// The test message as target `cfg` receives it (the webhook's `event` is `test`).
pub fn test_request(cfg: &NotifyConfig, at_ms: i64) -> Request {
    match cfg.kind {
        NotifyKind::Webhook => {
            let time = humantime::format_rfc3339_millis(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms.max(0) as u64),
            );
            let body = json!({
                "event": "test", "phase": null, "server": null, "session": null, "title": null,
                "directory": null, "reason": TEXT, "time": time.to_string(), "at_ms": at_ms,
                "text": format!("{TITLE}\n{TEXT}"),
            });
            Request { content_type: "application/json", headers: Vec::new(), body: body.to_string() }
        }
        NotifyKind::Ntfy => {
            let mut headers = vec![("Title", TITLE.to_string())];
            if let Some(p) = cfg.priority {
                headers.push(("Priority", p.to_string()));
            }
            if !cfg.tags.is_empty() {
                headers.push(("Tags", cfg.tags.join(",")));
            }
            Request { content_type: "text/plain; charset=utf-8", headers, body: TEXT.to_string() }
        }
        NotifyKind::Slack => {
            let body = json!({ "text": format!("*{TITLE}*\n{TEXT}") }).to_string();
            Request { content_type: "application/json", headers: Vec::new(), body }
        }
    }
}

/// One line per target: `notify[0] webhook https://host/…: delivered (1 attempt)` or why
/// not; `Err` when any target failed.
pub async fn send_tests(cfgs: &[NotifyConfig], at_ms: i64) -> Result<Vec<String>, Vec<String>> {
    let mut lines = Vec::new();
    let mut failed = false;
    for (i, cfg) in cfgs.iter().enumerate() {
        let subject = format!("notify[{i}] {}", cfg.kind.as_str());
        let outcome = match resolve_url(cfg, i, &|name| std::env::var(name).ok()) {
            Err(e) => Err(e.to_string()),
            Ok(url) => {
                let shown = display_url(&url);
                match Target::new(cfg, url) {
                    Err(e) => Err(format!("{shown}: {e}")),
                    Ok(target) => match target.post(&test_request(cfg, at_ms)).await {
                        Ok(n) => Ok(format!("{shown}: delivered ({n} attempt{})", if n == 1 { "" } else { "s" })),
                        Err((n, e)) => Err(format!("{shown}: {e} after {n} attempt{}", if n == 1 { "" } else { "s" })),
                    },
                }
            }
        };
        failed |= outcome.is_err();
        lines.push(match outcome {
            Ok(ok) => format!("ok    {subject} {ok}"),
            Err(e) => format!("FAIL  {subject} {e}"),
        });
    }
    if cfgs.is_empty() {
        lines.push("no [[notify]] target is configured".to_string());
    }
    if failed {
        Err(lines)
    } else {
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_message_is_marked_as_a_test_for_each_kind() {
        let webhook = test_request(&NotifyConfig::new(NotifyKind::Webhook, "http://x"), 0);
        let v: serde_json::Value = serde_json::from_str(&webhook.body).unwrap();
        assert_eq!((v["event"].as_str(), v["time"].as_str()), (Some("test"), Some("1970-01-01T00:00:00.000Z")));
        let mut ntfy = NotifyConfig::new(NotifyKind::Ntfy, "http://x/t");
        ntfy.priority = Some(2);
        assert!(test_request(&ntfy, 0).headers.contains(&("Priority", "2".to_string())));
        let slack = test_request(&NotifyConfig::new(NotifyKind::Slack, "http://x"), 0);
        assert!(slack.body.starts_with("{\"text\":\"*Shepherd: test notification*"), "{}", slack.body);
    }
}
