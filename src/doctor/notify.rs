//! `shepherd doctor` on each `[[notify]]` target: its URL (from `url_env` too) and
//! whether its host accepts a connection. Nothing is posted: a probe must not notify
//! anyone. Only the scheme and host of a URL are shown.

use tokio::net::TcpStream;

use super::{error_chain, Finding, Level, PROBE_TIMEOUT};
use crate::notify::{display_url, resolve_url};
use shepherd_actors::config::NotifyConfig;

/// One finding per target.
pub(super) async fn examine(targets: &[NotifyConfig]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, n) in targets.iter().enumerate() {
        let subject = format!("notify[{i}] {}", n.kind.as_str());
        let url = match resolve_url(n, i, &|name| std::env::var(name).ok()) {
            Ok(url) => url,
            Err(e) => {
                let fix = format!(
                    "export {} with the target's URL, or set notify[{i}].url",
                    n.url_env.as_deref().unwrap_or("it")
                );
                out.push(Finding::problem(Level::Fail, subject, e.to_string(), fix));
                continue;
            }
        };
        let shown = display_url(&url);
        let Some(addr) = host_port(&url) else {
            out.push(Finding::problem(
                Level::Fail,
                subject,
                format!("{shown}: no host"),
                format!("correct notify[{i}].url"),
            ));
            continue;
        };
        out.push(match tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Finding::ok(subject, format!("{shown} accepts connections (nothing was sent)")),
            Ok(Err(e)) => Finding::problem(
                Level::Fail,
                subject,
                format!("{shown}: {}", error_chain(&e)),
                format!("check notify[{i}].url: its notifications would be retried, then dropped"),
            ),
            Err(_) => Finding::problem(
                Level::Fail,
                subject,
                format!("{shown}: no connection within {}s", PROBE_TIMEOUT.as_secs()),
                format!("check notify[{i}].url and the network between"),
            ),
        });
    }
    out
}

/// `host:port` of an `http(s)://` URL (the scheme's port when none is written).
fn host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = match authority.rfind(']') {
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    };
    let default = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
    Some(if has_port { authority.to_string() } else { format!("{authority}:{default}") })
}

#[cfg(test)]
mod tests {
    use shepherd_actors::config::NotifyKind;

    use super::*;

    #[test]
    fn the_address_probed_is_the_urls_host_and_port() {
        assert_eq!(host_port("https://hooks.slack.com/services/x").as_deref(), Some("hooks.slack.com:443"));
        assert_eq!(host_port("http://u:p@127.0.0.1:8080/t?x").as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(host_port("http://[::1]/t").as_deref(), Some("[::1]:80"));
        assert_eq!(host_port("http:///t"), None);
    }

    #[tokio::test]
    async fn a_listening_target_is_ok_a_closed_port_fails_and_the_path_is_never_shown() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = format!("http://{}/hook/SECRET", listener.local_addr().unwrap());
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}/hook/SECRET", l.local_addr().unwrap())
        };
        let found =
            examine(&[NotifyConfig::new(NotifyKind::Webhook, &open), NotifyConfig::new(NotifyKind::Ntfy, &closed)])
                .await;
        assert_eq!(found[0].level, Level::Ok, "{found:?}");
        assert_eq!(found[1].level, Level::Fail, "{found:?}");
        assert_eq!(found[1].subject, "notify[1] ntfy");
        assert!(!format!("{found:?}").contains("SECRET"), "{found:?}");
    }

    #[tokio::test]
    async fn an_unset_url_variable_is_a_failure_naming_it() {
        let mut n = NotifyConfig::new(NotifyKind::Slack, "");
        n.url_env = Some("SHEPHERD_TEST_SURELY_UNSET_HOOK".into());
        let found = examine(&[n]).await;
        assert_eq!(found[0].level, Level::Fail);
        assert!(found[0].detail.contains("SHEPHERD_TEST_SURELY_UNSET_HOOK is not set"), "{found:?}");
    }
}
