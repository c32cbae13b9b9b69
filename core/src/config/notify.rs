//! `[[notify]]`: where Shepherd tells a person what needs them (a webhook, ntfy, Slack),
//! and every number the notifier uses. Several entries are allowed; each one chooses
//! its events and its own timing.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{duration_str, Config, InvalidValue};

/// One notification target.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// `webhook` (one JSON object per notification), `ntfy` (text to a topic URL) or
    /// `slack` (a Slack-compatible incoming webhook, `{"text": …}`).
    pub kind: NotifyKind,
    /// Where to POST. Often a secret itself (a Slack hook, an ntfy topic): it is never
    /// logged whole (only its scheme and host). Empty when `url_env` names it.
    #[serde(default)]
    pub url: String,
    /// The environment variable that holds the URL instead (so a config file can be
    /// shared); read at start-up.
    #[serde(default)]
    pub url_env: Option<String>,
    /// Which events go to this target; empty or absent = all.
    #[serde(default = "NotifyEvent::all")]
    pub events: Vec<NotifyEvent>,
    /// How long a question, a permission or a reply that asks must wait unanswered
    /// before `waiting_on_person` is sent.
    #[serde(default = "default_after", with = "duration_str")]
    pub after: Duration,
    /// How long a server's event stream must be down before `server_unreachable`.
    #[serde(default = "default_unreachable_after", with = "duration_str")]
    pub unreachable_after: Duration,
    /// Occurrences of one event within this window after the first go out as one
    /// message ("12 sessions gave up"); the first waits this long for company.
    #[serde(default = "default_batch_window", with = "duration_str")]
    pub batch_window: Duration,
    /// At most this many sessions are listed in one message ("… and 40 more").
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
    /// Messages waiting for the sender; beyond it the newest is dropped (logged and
    /// counted): a slow receiver never holds up supervision.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// Further attempts after a failed POST (connect error, timeout, 5xx, 429).
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The wait before the first retry; doubled each time, at most `retry_max_backoff`.
    /// A 429's `Retry-After` is honoured within that bound.
    #[serde(default = "default_retry_backoff", with = "duration_str")]
    pub retry_backoff: Duration,
    #[serde(default = "default_retry_max_backoff", with = "duration_str")]
    pub retry_max_backoff: Duration,
    /// The total time of one POST.
    #[serde(default = "default_timeout", with = "duration_str")]
    pub timeout: Duration,
    /// After a restart, what was journaled this long ago and not yet notified is sent
    /// (and the `after` clocks of open questions resume).
    #[serde(default = "default_catch_up", with = "duration_str")]
    pub catch_up: Duration,
    /// ntfy only: 1 (min) … 5 (max); absent = ntfy's default (3).
    #[serde(default)]
    pub priority: Option<u8>,
    /// ntfy only: tags (emoji short codes or words), sent as the `Tags` header.
    #[serde(default)]
    pub tags: Vec<String>,
}

fn default_after() -> Duration {
    Duration::from_secs(10 * 60)
}
fn default_unreachable_after() -> Duration {
    Duration::from_secs(2 * 60)
}
fn default_batch_window() -> Duration {
    Duration::from_secs(30)
}
fn default_batch_max() -> usize {
    20
}
fn default_queue() -> usize {
    64
}
fn default_retries() -> u32 {
    4
}
fn default_retry_backoff() -> Duration {
    Duration::from_secs(1)
}
fn default_retry_max_backoff() -> Duration {
    Duration::from_secs(30)
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_catch_up() -> Duration {
    Duration::from_secs(60 * 60)
}

/// How often the notifier looks at the servers' event streams and its clocks: a tenth of
/// the shortest of `after`, `unreachable_after` and `batch_window`, between these bounds.
pub const TICK_MIN: Duration = Duration::from_millis(50);
pub const TICK_MAX: Duration = Duration::from_secs(5);
/// At shutdown, what is batched or queued gets at most this long (and each target at
/// most its `timeout`): a dead receiver does not hold up a stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// At most this many journal records are read back at start-up (`catch_up`).
pub const CATCH_UP_MAX_RECORDS: u32 = 10_000;
/// What was notified is remembered (against a resend after a restart) this long.
pub const NOTIFIED_KEEP: Duration = Duration::from_secs(30 * 24 * 60 * 60);

impl NotifyConfig {
    /// A target of `kind` at `url` with every default.
    pub fn new(kind: NotifyKind, url: &str) -> Self {
        NotifyConfig {
            kind,
            url: url.to_string(),
            url_env: None,
            events: NotifyEvent::all(),
            after: default_after(),
            unreachable_after: default_unreachable_after(),
            batch_window: default_batch_window(),
            batch_max: default_batch_max(),
            queue: default_queue(),
            retries: default_retries(),
            retry_backoff: default_retry_backoff(),
            retry_max_backoff: default_retry_max_backoff(),
            timeout: default_timeout(),
            catch_up: default_catch_up(),
            priority: None,
            tags: Vec::new(),
        }
    }

    /// Does this target want `event`?
    pub fn wants(&self, event: NotifyEvent) -> bool {
        self.events.is_empty() || self.events.contains(&event)
    }

    /// How often the notifier looks at the servers' event streams and its clocks.
    pub fn tick(&self) -> Duration {
        (self.after.min(self.unreachable_after).min(self.batch_window) / 10).clamp(TICK_MIN, TICK_MAX)
    }

    /// Checks entry `i` (`notify[i].…` in the error).
    pub fn validate(&self, i: usize) -> Result<(), InvalidValue> {
        let bad = |key: &str, reason: &str| InvalidValue { key: format!("notify[{i}].{key}"), reason: reason.into() };
        match (self.url.trim().is_empty(), self.url_env.as_deref().map(str::trim)) {
            (true, None) => return Err(bad("url", "is required (or url_env naming a variable that holds it)")),
            (false, Some(_)) => return Err(bad("url_env", "give url or url_env, not both")),
            (true, Some("")) => return Err(bad("url_env", "must name an environment variable")),
            (false, None) => check_url(&self.url).map_err(|reason| bad("url", &reason))?,
            (true, Some(_)) => {}
        }
        if self.batch_max == 0 {
            return Err(bad("batch_max", "must be at least 1"));
        }
        if self.queue == 0 {
            return Err(bad("queue", "must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(bad("timeout", "must be greater than zero"));
        }
        if self.unreachable_after.is_zero() {
            return Err(bad("unreachable_after", "must be greater than zero"));
        }
        if self.retry_max_backoff < self.retry_backoff {
            return Err(bad("retry_max_backoff", "must be at least retry_backoff"));
        }
        if self.kind != NotifyKind::Ntfy && (self.priority.is_some() || !self.tags.is_empty()) {
            return Err(bad("priority", "priority and tags are for kind = \"ntfy\" only"));
        }
        if self.priority.is_some_and(|p| !(1..=5).contains(&p)) {
            return Err(bad("priority", "must be 1 (min) to 5 (max)"));
        }
        if let Some(t) = self.tags.iter().find(|t| t.trim().is_empty() || t.contains([',', '\n', '\r'])) {
            return Err(bad("tags", &format!("{t:?}: a tag is a non-empty word without commas")));
        }
        Ok(())
    }
}

/// Checks every `notify[i]`.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    for (i, n) in c.notify.iter().enumerate() {
        n.validate(i)?;
    }
    Ok(())
}

/// An absolute `http(s)://host…` URL (what a URL read from `url_env` must be too).
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| "must start with http:// or https://".to_string())?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err("has no host".into());
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain spaces or control characters".into());
    }
    Ok(())
}

/// The kind of target.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum NotifyKind {
    Webhook,
    Ntfy,
    Slack,
}

impl NotifyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyKind::Webhook => "webhook",
            NotifyKind::Ntfy => "ntfy",
            NotifyKind::Slack => "slack",
        }
    }
}

/// What a person is told about.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum NotifyEvent {
    /// A question, a permission or a reply that asks, unanswered for `after`.
    WaitingOnPerson,
    /// Shepherd stopped recovering a session (its limits reached).
    GaveUp,
    /// A hand-off to a fresh session failed.
    HandoffFailed,
    /// A session was paused: by the person's abort, `shepherd pause`, or the fleet's pause.
    Paused,
    /// A server's model provider failing for many sessions (the breaker opened), and
    /// its end (the breaker closed).
    ProviderOutage,
    /// A server's event stream down for `unreachable_after`, and its return.
    ServerUnreachable,
}

impl NotifyEvent {
    pub const ALL: [NotifyEvent; 6] = [
        NotifyEvent::WaitingOnPerson,
        NotifyEvent::GaveUp,
        NotifyEvent::HandoffFailed,
        NotifyEvent::Paused,
        NotifyEvent::ProviderOutage,
        NotifyEvent::ServerUnreachable,
    ];

    pub fn all() -> Vec<NotifyEvent> {
        Self::ALL.to_vec()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEvent::WaitingOnPerson => "waiting_on_person",
            NotifyEvent::GaveUp => "gave_up",
            NotifyEvent::HandoffFailed => "handoff_failed",
            NotifyEvent::Paused => "paused",
            NotifyEvent::ProviderOutage => "provider_outage",
            NotifyEvent::ServerUnreachable => "server_unreachable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(cfg: &NotifyConfig) -> Result<(), String> {
        cfg.validate(2).map_err(|e| e.to_string())
    }

    #[test]
    fn a_url_without_a_scheme_or_host_is_refused_naming_the_entry() {
        let cfg = NotifyConfig::new(NotifyKind::Webhook, "example.com/hook");
        assert_eq!(ok(&cfg).unwrap_err(), "notify[2].url: must start with http:// or https://");
        let cfg = NotifyConfig::new(NotifyKind::Webhook, "https:///hook");
        assert_eq!(ok(&cfg).unwrap_err(), "notify[2].url: has no host");
        assert!(ok(&NotifyConfig::new(NotifyKind::Webhook, "http://127.0.0.1:9/x?t=1")).is_ok());
    }

    #[test]
    fn ntfy_settings_on_another_kind_and_a_priority_out_of_range_are_refused() {
        let mut cfg = NotifyConfig::new(NotifyKind::Slack, "https://hooks.example/T/B/x");
        cfg.priority = Some(4);
        assert!(ok(&cfg).unwrap_err().contains("for kind = \"ntfy\" only"));
        let mut cfg = NotifyConfig::new(NotifyKind::Ntfy, "https://ntfy.sh/topic");
        cfg.priority = Some(9);
        assert_eq!(ok(&cfg).unwrap_err(), "notify[2].priority: must be 1 (min) to 5 (max)");
    }

    #[test]
    fn url_and_url_env_are_exclusive_and_one_is_required() {
        let mut cfg = NotifyConfig::new(NotifyKind::Webhook, "");
        assert!(ok(&cfg).unwrap_err().starts_with("notify[2].url: is required"));
        cfg.url_env = Some("HOOK_URL".into());
        assert!(ok(&cfg).is_ok());
        cfg.url = "https://x.example".into();
        assert!(ok(&cfg).unwrap_err().starts_with("notify[2].url_env:"));
    }

    #[test]
    fn no_events_listed_means_every_event() {
        let mut cfg = NotifyConfig::new(NotifyKind::Webhook, "http://x");
        cfg.events.clear();
        assert!(NotifyEvent::ALL.iter().all(|e| cfg.wants(*e)));
        cfg.events = vec![NotifyEvent::GaveUp];
        assert!(cfg.wants(NotifyEvent::GaveUp) && !cfg.wants(NotifyEvent::Paused));
    }
}
