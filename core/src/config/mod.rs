//! The configuration schema: every default number Shepherd uses lives here, once.
//!
//! Nothing downstream names a number of its own; a decision that needs a duration or a
//! limit reads it from these structs. Durations carry their unit in their type
//! (`Duration`) and are written as human strings in files and the environment
//! (`"3m"`, `"500ms"`). Unknown keys are refused (`deny_unknown_fields`) so a typo fails
//! start-up instead of silently using a default. Layering (file, environment, flags)
//! happens in the binary's `config` module; [`Config::validate`] checks the relations
//! between values that serde alone cannot.
//!
//! One file per section, each with its schema, its defaults and its validation:
//! `server` (`servers[i]`), `recovery`, `followup` (`nudge`, `review`), `window`
//! (`context`, `compaction`, `handoff`), `guard`, `advisor`, `loops`, `daemon`
//! (`supervisor`, `status`, `top`, `toasts`, `control`, `store`, `log`), `notify`
//! (`notify[i]`). Here: the whole
//! [`Config`], the [`SessionRules`] a session core decides by, and the order in which
//! [`Config::validate`] checks the sections (the first error is the one reported).

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod advisor;
mod daemon;
mod followup;
mod guard;
mod loops;
mod notify;
mod recovery;
mod server;
mod window;

pub use advisor::AdvisorConfig;
pub use daemon::{
    ControlConfig, LogConfig, LogFormat, StatusConfig, StoreBackend, StoreConfig, SupervisorConfig, ToastsConfig,
    TopConfig, MIN_WRITE_SHARE,
};
pub use followup::{NudgeConfig, ReviewConfig};
pub use guard::{GuardBackend, GuardConfig, MIN_RENEWED_LEASE_TTL};
pub use loops::LoopsConfig;
pub use notify::{check_url, NotifyConfig, NotifyEvent, NotifyKind};
pub use notify::{CATCH_UP_MAX_RECORDS, NOTIFIED_KEEP, SHUTDOWN_GRACE as NOTIFY_SHUTDOWN_GRACE};
pub use recovery::{parse_model, RecoveryConfig};
pub use server::ServerConfig;
pub use window::{CompactionConfig, ContextConfig, HandoffConfig, HandoffMode};

/// The whole effective configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The OpenCode servers this instance supervises.
    pub servers: Vec<ServerConfig>,
    pub recovery: RecoveryConfig,
    pub nudge: NudgeConfig,
    pub review: ReviewConfig,
    pub control: ControlConfig,
    pub store: StoreConfig,
    pub supervisor: SupervisorConfig,
    pub context: ContextConfig,
    pub compaction: CompactionConfig,
    pub handoff: HandoffConfig,
    pub loops: LoopsConfig,
    pub guard: GuardConfig,
    pub status: StatusConfig,
    pub advisor: AdvisorConfig,
    pub toasts: ToastsConfig,
    pub top: TopConfig,
    pub log: LogConfig,
    /// `[[notify]]`: where a person is told what needs them (several allowed).
    pub notify: Vec<NotifyConfig>,
}

/// The rules every session core decides by: the parts of the config about sessions.
#[derive(Debug, Clone)]
pub struct SessionRules {
    pub recovery: RecoveryConfig,
    pub nudge: NudgeConfig,
    pub review: ReviewConfig,
    /// `supervisor.orphan_wait`.
    pub orphan_wait: Duration,
    pub compaction: CompactionConfig,
    pub handoff: HandoffConfig,
    /// `context.error_patterns`, compiled (validated at start-up).
    pub error_patterns: Vec<regex::Regex>,
    /// The built-in secret shapes and `handoff.redact_patterns`, compiled (validated at
    /// start-up): what every text leaving Shepherd passes.
    pub redactor: crate::redact::Redactor,
    pub loops: LoopsConfig,
    pub advisor: AdvisorConfig,
}

impl Config {
    pub fn session_rules(&self) -> SessionRules {
        SessionRules {
            recovery: self.recovery.clone(),
            nudge: self.nudge.clone(),
            review: self.review.clone(),
            orphan_wait: self.supervisor.orphan_wait,
            compaction: self.compaction.clone(),
            handoff: self.handoff.clone(),
            error_patterns: self.context.error_patterns.iter().filter_map(|p| regex::Regex::new(p).ok()).collect(),
            redactor: self.redactor(),
            loops: self.loops.clone(),
            advisor: self.advisor.clone(),
        }
    }
}

impl Config {
    /// The redactor `handoff.redact_patterns` and `handoff.redact_patterns_replace`
    /// describe (the built-in shapes alone if a pattern is invalid: `validate` refuses
    /// such a config first).
    pub fn redactor(&self) -> crate::redact::Redactor {
        let h = &self.handoff;
        crate::redact::Redactor::new(&h.redact_patterns, h.redact_patterns_replace).unwrap_or_default()
    }
}

impl Default for SessionRules {
    fn default() -> Self {
        Config::default().session_rules()
    }
}

impl From<RecoveryConfig> for SessionRules {
    fn from(recovery: RecoveryConfig) -> Self {
        SessionRules { recovery, ..SessionRules::default() }
    }
}

/// A value that is well-typed but wrong, with the key path that holds it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct InvalidValue {
    pub key: String,
    pub reason: String,
}

/// The error for `key`: a section's validation reports the first it finds.
fn bad(key: &str, reason: &str) -> InvalidValue {
    InvalidValue { key: key.into(), reason: reason.into() }
}

impl Config {
    /// Checks what serde cannot: ranges and relations between values.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        recovery::validate(self)?;
        window::validate(self)?;
        guard::validate(self)?;
        advisor::validate(self)?;
        loops::validate(self)?;
        daemon::validate_status(self)?;
        daemon::validate_top(self)?;
        daemon::validate_log(self)?;
        daemon::validate_supervisor(self)?;
        followup::validate_nudge(self)?;
        followup::validate_review(self)?;
        daemon::validate_toasts(self)?;
        daemon::validate_control(self)?;
        daemon::validate_store(self)?;
        server::validate(self)?;
        notify::validate(self)?;
        Ok(())
    }
}

/// Serde adapter: `Duration` as a human string (`"3m"`, `"1.5s"` is not accepted,
/// write `"1500ms"`).
pub mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(text.trim()).map_err(|e| {
            serde::de::Error::custom(format!("invalid duration {text:?} ({e}); write e.g. \"3m\", \"500ms\", \"2h\""))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_documented_numbers() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.recovery.stall_timeout, Duration::from_secs(180));
        assert_eq!(c.recovery.wait_after_abort, Duration::from_millis(1500));
        assert_eq!(c.recovery.max_backoff, Duration::from_secs(1800));
    }

    #[test]
    fn compaction_and_handoff_thresholds_must_rise_strictly() {
        let mut c = Config::default();
        c.handoff.soft = 0.7; // equal to compaction.proactive
        let err = c.validate().unwrap_err();
        assert_eq!(err.key, "handoff.soft");
        assert!(err.reason.contains("compaction.proactive"), "{err}");
        let mut c = Config::default();
        c.handoff.hard = 1.2;
        assert_eq!(c.validate().unwrap_err().key, "handoff.hard");
    }

    #[test]
    fn configured_redact_patterns_add_to_the_built_in_shapes_unless_they_replace_them() {
        // A config written before `redact_patterns_replace` existed still loads.
        let old: Config =
            serde_json::from_value(serde_json::json!({"handoff": {"redact_patterns": [r"ACME-\d{6}"]}})).unwrap();
        old.validate().unwrap();
        let text = "ACME-123456 DATABASE_PASSWORD=hunter2";
        assert_eq!(old.session_rules().redactor.redact(text), "[REDACTED] DATABASE_PASSWORD=[REDACTED]");
        let mut replaced = old.clone();
        replaced.handoff.redact_patterns_replace = true;
        assert_eq!(replaced.session_rules().redactor.redact(text), "[REDACTED] DATABASE_PASSWORD=hunter2");
        let mut bad = old;
        bad.handoff.redact_patterns.push("(unclosed".into());
        let err = bad.validate().unwrap_err();
        assert_eq!(err.key, "handoff.redact_patterns[1]", "{err}");
        assert!(err.reason.contains("not a regular expression"), "{err}");
    }

    #[test]
    fn a_bad_error_pattern_is_rejected_with_its_index() {
        let mut c = Config::default();
        c.context.error_patterns.push("(unclosed".into());
        assert_eq!(c.validate().unwrap_err().key, "context.error_patterns[2]");
    }

    #[test]
    fn provider_outage_values_are_checked_with_their_key() {
        let c = Config::default();
        assert_eq!(c.recovery.provider_backoff, Duration::from_secs(60));
        assert_eq!(c.recovery.provider_max_backoff, Duration::from_secs(1800));
        let mut c = Config::default();
        c.recovery.fallback_models = vec!["fake/fake-model-2".into(), "no-slash".into()];
        assert_eq!(c.validate().unwrap_err().key, "recovery.fallback_models[1]");
        let mut c = Config::default();
        c.recovery.provider_max_backoff = Duration::from_secs(1);
        assert_eq!(c.validate().unwrap_err().key, "recovery.provider_max_backoff");
        let mut c = Config::default();
        c.recovery.breaker_sessions = 0;
        assert_eq!(c.validate().unwrap_err().key, "recovery.breaker_sessions");
    }

    #[test]
    fn a_zero_compaction_bound_or_an_abandonment_age_below_the_stall_timeout_is_rejected_with_its_key() {
        let mut c = Config::default();
        c.compaction.max_wait = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err().key, "compaction.max_wait");
        let mut c = Config::default();
        c.recovery.max_session_age = Duration::from_secs(60);
        assert_eq!(c.validate().unwrap_err().key, "recovery.max_session_age");
    }

    #[test]
    fn a_backoff_below_the_cooldown_is_rejected_with_its_key() {
        let mut c = Config::default();
        c.recovery.max_backoff = Duration::from_secs(1);
        assert_eq!(c.validate().unwrap_err().key, "recovery.max_backoff");
    }

    #[test]
    fn by_default_the_heuristics_advise_and_no_model_is_asked() {
        let a = Config::default().advisor;
        assert!(a.enabled, "the heuristic fallback is used when the model advisor is disabled");
        assert!(a.base_url.is_empty() && a.model.is_empty(), "no model unless configured");
        assert_eq!(a.timeout, Duration::from_secs(5));
        assert_eq!((a.max_tokens, a.temperature), (500, 0.1));
        assert_eq!((a.wait_confidence, a.abort_confidence), (0.7, 0.6));
    }

    #[test]
    fn advisor_values_out_of_range_are_rejected_with_their_key() {
        let mut c = Config::default();
        c.advisor.wait_confidence = 1.5;
        assert_eq!(c.validate().unwrap_err().key, "advisor.wait_confidence");
        let mut c = Config::default();
        c.advisor.max_concurrent = 0;
        assert_eq!(c.validate().unwrap_err().key, "advisor.max_concurrent");
        let mut c = Config::default();
        c.advisor.base_url = "http://model".into();
        assert_eq!(c.validate().unwrap_err().key, "advisor.model", "a URL without a model");
    }

    #[test]
    fn the_ledger_defaults_to_sqlite_in_the_state_directory() {
        let c = Config::default();
        assert_eq!(c.store.backend, StoreBackend::Sqlite);
        assert_eq!(c.store.path, "", "empty = the default path under the user's state directory");
    }

    #[test]
    fn a_ledger_cache_too_small_to_hold_the_tree_is_rejected_with_its_key() {
        let mut c = Config::default();
        c.store.cache_kib = 16;
        assert_eq!(c.validate().unwrap_err().key, "store.cache_kib");
        c.store.cache_kib = 64;
        c.validate().unwrap();
    }

    #[test]
    fn a_status_write_share_outside_its_range_is_rejected_with_its_key() {
        let mut c = Config::default();
        for bad in [0.0, 0.0005, 1.5, f64::NAN] {
            c.status.max_write_share = bad;
            assert_eq!(c.validate().unwrap_err().key, "status.max_write_share", "{bad}");
        }
        for good in [MIN_WRITE_SHARE, 0.05, 1.0] {
            c.status.max_write_share = good;
            c.validate().unwrap();
        }
    }

    #[test]
    fn a_non_loopback_control_bind_is_rejected_unless_allow_remote() {
        let mut c = Config::default();
        c.control.bind = "0.0.0.0:7433".into();
        let err = c.validate().unwrap_err();
        assert_eq!(err.key, "control.bind");
        assert!(err.reason.contains("control.allow_remote = true"), "{}", err.reason);
        c.control.allow_remote = true;
        c.validate().unwrap();
        c.control.bind = "[::1]:7433".into();
        c.control.allow_remote = false;
        c.validate().unwrap();
    }

    #[test]
    fn caps_on_remote_data_are_validated_with_their_keys() {
        let mut c = Config::default();
        c.supervisor.max_event_types = 8;
        assert_eq!(c.validate().unwrap_err().key, "supervisor.max_event_types");
        c.supervisor.max_event_types = 16;
        c.supervisor.max_parents = 0;
        assert_eq!(c.validate().unwrap_err().key, "supervisor.max_parents");
        c.supervisor.max_parents = 1;
        c.supervisor.max_directories = 0;
        assert_eq!(c.validate().unwrap_err().key, "supervisor.max_directories");
        c.supervisor.max_directories = 1;
        c.servers.push(ServerConfig::new("a", "http://127.0.0.1:4096"));
        c.servers[0].max_response_bytes = 1024;
        assert_eq!(c.validate().unwrap_err().key, "servers[0].max_response_bytes");
        c.servers[0].max_response_bytes = 64 * 1024;
        c.servers[0].max_requests_in_flight = 0;
        assert_eq!(c.validate().unwrap_err().key, "servers[0].max_requests_in_flight");
        c.servers[0].max_requests_in_flight = 8;
        c.validate().unwrap();
    }

    /// A log level that is no level (a bare word is a target to `tracing`: it would log
    /// nothing else) is refused; levels and target=level directives pass.
    #[test]
    fn a_log_level_that_is_no_level_is_refused() {
        let mut c = Config::default();
        for wrong in ["verbose", "bogus=x", "info,loud", "=debug"] {
            c.log.level = wrong.into();
            let e = c.validate().unwrap_err();
            assert_eq!(e.key, "log.level", "{wrong}");
        }
        let rights = ["info", "DEBUG", "warn,shepherd=debug", "shepherd::action=trace, info", "off", "info,"];
        for right in rights.into_iter().chain(["h[s{a=1}]=debug"]) {
            c.log.level = right.into();
            c.validate().unwrap_or_else(|e| panic!("{right}: {e}"));
        }
    }

    /// A password belongs in the variable `password_env` names, never in the URL (which
    /// `run` would not read, and which lands in files and process lists); an `@` past the
    /// host is no user-info.
    #[test]
    fn a_server_url_with_a_user_or_password_is_refused_naming_password_env() {
        let mut c = Config::default();
        for url in ["http://opencode:hunter2@127.0.0.1:4096", "https://user@host/", "http://:pw@h"] {
            c.servers = vec![ServerConfig::new("a", url)];
            let e = c.validate().unwrap_err();
            assert_eq!(e.key, "servers[0].url", "{url}");
            assert!(e.reason.contains("servers[0].password_env") && !e.reason.contains("hunter2"), "{e}");
        }
        for url in ["http://127.0.0.1:4096", "http://h/p@q", "http://h?x=a@b", "http://h:1#a@b"] {
            c.servers = vec![ServerConfig::new("a", url)];
            c.validate().unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn a_store_path_naming_a_directory_is_rejected_with_its_key() {
        let mut c = Config::default();
        c.store.path = "/var/lib/shepherd/".into();
        assert_eq!(c.validate().unwrap_err().key, "store.path");
        c.store.backend = StoreBackend::Memory;
        c.validate().unwrap();
    }
    #[test]
    fn a_lease_too_short_to_be_renewed_while_a_prompt_waits_is_rejected_with_its_key() {
        let mut c = Config::default();
        c.guard.backend = GuardBackend::Redis;
        c.validate().unwrap();
        c.guard.lease_ttl = Duration::from_secs(2); // guard.max_wait is 2 min
        let err = c.validate().unwrap_err();
        assert_eq!(err.key, "guard.lease_ttl");
        assert!(err.reason.contains("guard.max_wait"), "{}", err.reason);
        c.guard.max_wait = Duration::from_secs(1); // a wait shorter than the lease: no renewal needed
        c.validate().unwrap();
        c.guard.max_wait = Duration::from_secs(120);
        c.guard.lease_ttl = MIN_RENEWED_LEASE_TTL;
        c.validate().unwrap();
        c.guard.fallback_per_minute = 0;
        assert_eq!(c.validate().unwrap_err().key, "guard.fallback_per_minute");
    }
}
