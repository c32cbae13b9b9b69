//! The configuration schema: every default number Shepherd uses lives here, once.
//!
//! Nothing downstream names a number of its own; a decision that needs a duration or a
//! limit reads it from these structs. Durations carry their unit in their type
//! (`Duration`) and are written as human strings in files and the environment
//! (`"3m"`, `"500ms"`). Unknown keys are refused (`deny_unknown_fields`) so a typo fails
//! start-up instead of silently using a default. Layering (file, environment, flags)
//! happens in the binary's `config` module; [`Config::validate`] checks the relations
//! between values that serde alone cannot.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod notify;
pub use notify::{check_url, NotifyConfig, NotifyEvent, NotifyKind};
pub use notify::{CATCH_UP_MAX_RECORDS, NOTIFIED_KEEP, SHUTDOWN_GRACE as NOTIFY_SHUTDOWN_GRACE};

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

/// One OpenCode server (`opencode serve`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Short name used in logs and status (`server = "local"`).
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:4096`.
    pub url: String,
    /// Basic-auth user name; OpenCode's default is `opencode`.
    #[serde(default = "default_username")]
    pub username: String,
    /// Name of the environment variable holding the server password (never the
    /// password itself, so config files can be shared and printed).
    #[serde(default)]
    pub password_env: Option<String>,
    /// Timeout of one REST call to this server.
    #[serde(default = "default_request_timeout", with = "duration_str")]
    pub request_timeout: Duration,
    /// The event stream is considered dead when nothing (not even the 10 s heartbeat)
    /// arrives for this long.
    #[serde(default = "default_stream_read_timeout", with = "duration_str")]
    pub stream_read_timeout: Duration,
    /// First delay before reconnecting a broken event stream; doubles per failure.
    #[serde(default = "default_reconnect_initial", with = "duration_str")]
    pub reconnect_initial: Duration,
    /// Upper bound of the reconnect delay.
    #[serde(default = "default_reconnect_max", with = "duration_str")]
    pub reconnect_max: Duration,
    /// Page size used when listing sessions (OpenCode silently caps unpaged lists at 100).
    #[serde(default = "default_list_limit")]
    pub list_limit: u32,
    /// The largest REST answer read from this server, bytes; a longer one is refused
    /// (an error naming this key), never read into memory whole.
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
}

fn default_username() -> String {
    "opencode".to_string()
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_stream_read_timeout() -> Duration {
    Duration::from_secs(35)
}
fn default_reconnect_initial() -> Duration {
    Duration::from_millis(250)
}
fn default_reconnect_max() -> Duration {
    Duration::from_secs(30)
}
fn default_list_limit() -> u32 {
    1000
}
fn default_max_response_bytes() -> usize {
    32 * 1024 * 1024
}

impl ServerConfig {
    /// A server with every optional value at its default.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            username: default_username(),
            password_env: None,
            request_timeout: default_request_timeout(),
            stream_read_timeout: default_stream_read_timeout(),
            reconnect_initial: default_reconnect_initial(),
            reconnect_max: default_reconnect_max(),
            list_limit: default_list_limit(),
            max_response_bytes: default_max_response_bytes(),
        }
    }
}

/// Stall detection and recovery (abort + continue).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// A busy session with no progress for this long is stalled.
    #[serde(with = "duration_str")]
    pub stall_timeout: Duration,
    /// While a tool part is `running`, the stall timeout is multiplied by this.
    pub tool_grace_factor: f64,
    /// Pause between the session reaching idle after our abort and our continue.
    #[serde(with = "duration_str")]
    pub wait_after_abort: Duration,
    /// How often to poll `/session/status` while waiting for the abort to land.
    #[serde(with = "duration_str")]
    pub abort_poll_interval: Duration,
    /// Give up waiting for idle after an abort after this long (the continue is then
    /// still sent: OpenCode queues prompts to busy sessions).
    #[serde(with = "duration_str")]
    pub abort_poll_max: Duration,
    /// Consecutive recoveries before backing off.
    pub max_recoveries: u32,
    /// First back-off delay once `max_recoveries` is exceeded; doubles per attempt.
    #[serde(with = "duration_str")]
    pub cooldown: Duration,
    /// Upper bound of the back-off delay.
    #[serde(with = "duration_str")]
    pub max_backoff: Duration,
    /// Continues sent without real progress before Shepherd gives up on a session.
    pub max_auto_submits: u32,
    /// A stalled session with no real progress (a finished step, a completed tool, a
    /// changed todo list, a real user message) for this long is abandoned: given up, not
    /// recovered. Counted from the last progress, or from when Shepherd first saw the
    /// session (or last regained sight of it after a stream outage) if that is later —
    /// never from its creation, so an agent that works for hours and then stalls is
    /// recovered. (The name is kept for existing configurations.)
    #[serde(with = "duration_str")]
    pub max_session_age: Duration,
    /// Continue prompt for a session without open todos. Variables: `{attempts}`,
    /// `{maxAttempts}`.
    pub continue_message: String,
    /// Continue prompt for a session with open todos. Variables: `{pending}`, `{total}`,
    /// `{completed}`, `{todoList}` (at most five open items), `{attempts}`, `{maxAttempts}`.
    pub continue_with_todos_message: String,
    /// Scan the recent assistant messages for tool calls written as text before a
    /// continue or a nudge, and send `tool_call_as_text_message` when one is found.
    pub detect_tool_calls_as_text: bool,
    /// How many recent messages the scan reads.
    pub tool_call_scan_messages: u32,
    /// How many of a session's latest messages are read to see whether the prompt of
    /// an action left unfinished by a crash (an intent in the ledger) arrived.
    pub verify_messages: u32,
    /// Sent instead of the continue (or nudge) when the model wrote a tool call as
    /// text. Variables as for `continue_with_todos_message`, plus `{pattern}` (what
    /// was found).
    pub tool_call_as_text_message: String,
    /// The stall timeout of a session that is planning (agent `plan`, or its latest
    /// text announces a plan): thinking out a plan is slow and quiet.
    #[serde(with = "duration_str")]
    pub planning_timeout: Duration,
    /// Continue prompt for a planning session. Variables as for
    /// `continue_with_todos_message`.
    pub continue_with_plan_message: String,
    /// This many continues within `repeated_continue_window` without real progress:
    /// another continue will not help, escalate (compact; hand off once hand-off exists).
    pub repeated_continue_count: u32,
    #[serde(with = "duration_str")]
    pub repeated_continue_window: Duration,
    /// Resume a session whose turn ended on a provider error (5xx, 429, overloaded,
    /// timeouts, after OpenCode's own retries) and that has work left.
    pub resume_after_provider_error: bool,
    /// First wait before such a resume; doubles per consecutive failure.
    #[serde(with = "duration_str")]
    pub provider_backoff: Duration,
    /// Upper bound of that wait.
    #[serde(with = "duration_str")]
    pub provider_max_backoff: Duration,
    /// The resume prompt. Variables: `{attempts}` (the step), `{maxAttempts}`.
    pub provider_resume_message: String,
    /// The resume prompt for a session with open todos. Variables as for
    /// `continue_with_todos_message`.
    pub provider_resume_with_todos_message: String,
    /// `provider/model` pairs to resume on once the session's own model failed
    /// `fallback_after` resumes in a row (each in turn); empty: none.
    pub fallback_models: Vec<String>,
    pub fallback_after: u32,
    /// Back to the session's own model this long after switching to a fallback.
    #[serde(with = "duration_str")]
    pub fallback_cooldown: Duration,
    /// The server's circuit breaker opens when this many sessions failed on provider
    /// errors within `breaker_window`: one session probes, the others wait for it.
    pub breaker_sessions: u32,
    #[serde(with = "duration_str")]
    pub breaker_window: Duration,
    /// A probe that has not answered within this long is replaced by another session.
    #[serde(with = "duration_str")]
    pub breaker_probe_timeout: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            stall_timeout: Duration::from_secs(180),
            tool_grace_factor: 4.0,
            wait_after_abort: Duration::from_millis(1500),
            abort_poll_interval: Duration::from_millis(200),
            abort_poll_max: Duration::from_secs(5),
            max_recoveries: 3,
            cooldown: Duration::from_secs(60),
            max_backoff: Duration::from_secs(30 * 60),
            max_auto_submits: 3,
            max_session_age: Duration::from_secs(2 * 60 * 60),
            continue_message: "Your previous response stalled and was interrupted by the \
                supervisor (attempt {attempts} of {maxAttempts}). Please continue where you \
                left off."
                .to_string(),
            continue_with_todos_message: "Your previous response stalled and was interrupted \
                by the supervisor (attempt {attempts} of {maxAttempts}). You have {pending} \
                open of {total} todos ({completed} done):\n{todoList}\nPlease continue \
                working on them."
                .to_string(),
            detect_tool_calls_as_text: true,
            tool_call_scan_messages: 20,
            verify_messages: 50,
            tool_call_as_text_message: "Your previous response wrote a tool call as text ({pattern}) instead \
                of calling the tool, so nothing was executed. Make that call again through the \
                proper tool-calling mechanism (a real tool call, not text in your reply), then \
                continue with the task."
                .to_string(),
            planning_timeout: Duration::from_secs(5 * 60),
            continue_with_plan_message: "Your previous response stalled while planning and was \
                interrupted by the supervisor (attempt {attempts} of {maxAttempts}). Finish the \
                plan, then start carrying it out."
                .to_string(),
            repeated_continue_count: 3,
            repeated_continue_window: Duration::from_secs(10 * 60),
            resume_after_provider_error: true,
            provider_backoff: Duration::from_secs(60),
            provider_max_backoff: Duration::from_secs(30 * 60),
            provider_resume_message: "Your previous turn was cut short by an error of the model provider \
                (resume {attempts}). The provider answers again: please continue where you left off."
                .to_string(),
            provider_resume_with_todos_message: "Your previous turn was cut short by an error of the model \
                provider (resume {attempts}). You have {pending} open of {total} todos ({completed} \
                done):\n{todoList}\nPlease continue working on them."
                .to_string(),
            fallback_models: Vec::new(),
            fallback_after: 2,
            fallback_cooldown: Duration::from_secs(30 * 60),
            breaker_sessions: 3,
            breaker_window: Duration::from_secs(2 * 60),
            breaker_probe_timeout: Duration::from_secs(5 * 60),
        }
    }
}

/// Nudges: a session that went idle with open todos is asked to go on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NudgeConfig {
    pub enabled: bool,
    /// Wait this long after the busy→idle edge before nudging (the session may go on
    /// by itself, or the person may write).
    #[serde(with = "duration_str")]
    pub idle_delay: Duration,
    /// At least this long between two nudges of one session.
    #[serde(with = "duration_str")]
    pub cooldown: Duration,
    /// No nudge while a real user message is more recent than this.
    #[serde(with = "duration_str")]
    pub user_quiet: Duration,
    /// Nudges with an unchanged todo snapshot before nudging stops (until the todos
    /// change or the person writes).
    pub max_without_progress: u32,
    /// Variables as for `recovery.continue_with_todos_message`.
    pub message: String,
}

impl Default for NudgeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            idle_delay: Duration::from_millis(500),
            cooldown: Duration::from_secs(60),
            user_quiet: Duration::from_secs(10),
            max_without_progress: 3,
            message: "You stopped with {pending} of {total} todos still open ({completed} done):\n\
                {todoList}\nPlease continue working on them, or update the todo list if they are \
                done or no longer needed."
                .to_string(),
        }
    }
}

/// Review: when the last todo is done, ask the agent to verify its work once.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewConfig {
    pub enabled: bool,
    /// The all-done edge must hold this long (todo lists are rewritten in bursts).
    #[serde(with = "duration_str")]
    pub debounce: Duration,
    /// Reviews per session, counting re-reviews after new todos appeared.
    pub max_rounds: u32,
    /// Variables as for `recovery.continue_with_todos_message`.
    pub message: String,
}

impl Default for ReviewConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            debounce: Duration::from_millis(500),
            max_rounds: 3,
            message: "All {total} todos are marked done. Before you finish: run the project's \
                tests and check that everything you claimed to have done really works. If \
                something fails, add todos for the fixes and do them."
                .to_string(),
        }
    }
}

/// The fleet supervisor: discovery, idle cleanup, memory limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConfig {
    /// How often every server's sessions are listed to find busy ones the stream missed.
    #[serde(with = "duration_str")]
    pub discovery_interval: Duration,
    /// How often idle session actors are looked for.
    #[serde(with = "duration_str")]
    pub cleanup_interval: Duration,
    /// A session with no event for this long leaves memory (its state stays in the ledger).
    #[serde(with = "duration_str")]
    pub idle_cleanup: Duration,
    /// Above this many session actors, the longest-quiet idle ones leave memory first.
    pub max_sessions_in_memory: usize,
    /// How long a parent may wait, idle after a background child failed or busy while
    /// all its children are idle, before Shepherd treats it as orphaned.
    #[serde(with = "duration_str")]
    pub orphan_wait: Duration,
    /// Caps on what a server's data can make Shepherd remember (each a count): event
    /// types counted per server (past it, new types are counted under one `other`
    /// entry), child → parent links (past it, the oldest link is forgotten), and
    /// directories per server (past it, an arbitrary one is forgotten; discovery
    /// re-learns it from the session list). A cap reached is logged once.
    pub max_event_types: usize,
    pub max_parents: usize,
    pub max_directories: usize,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            discovery_interval: Duration::from_secs(60),
            cleanup_interval: Duration::from_secs(30),
            idle_cleanup: Duration::from_secs(10 * 60),
            max_sessions_in_memory: 20_000,
            orphan_wait: Duration::from_secs(15),
            max_event_types: 256,
            max_parents: 100_000,
            max_directories: 10_000,
        }
    }
}

/// Reading a session's context size.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ContextConfig {
    /// Regular expressions over context-length error texts, with named groups `limit`
    /// (the window) and `used` (the size that overflowed), for exact counts.
    pub error_patterns: Vec<String>,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            error_patterns: vec![
                r"maximum context length is (?P<limit>\d+) tokens.*?resulted in (?P<used>\d+) tokens".to_string(),
                r"prompt is too long: (?P<used>\d+) tokens > (?P<limit>\d+) maximum".to_string(),
            ],
        }
    }
}

/// Compaction through `POST /session/{id}/summarize`. Thresholds are shares of the
/// model's context window and must rise strictly: `opportunistic < proactive <
/// handoff.soft < handoff.prepare < handoff.hard`, all below OpenCode's own
/// auto-compaction point (window − output limit).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    pub enabled: bool,
    /// Before a nudge or review to an idle session past this share (outside the
    /// cooldown), compact first; the prompt follows whatever the compaction gives.
    pub opportunistic: f64,
    /// Compact when the session goes idle past this share of its window.
    pub proactive: f64,
    /// At least this long between two compactions of one session.
    #[serde(with = "duration_str")]
    pub cooldown: Duration,
    /// A compaction not finished after this long is given up (and logged): Shepherd's
    /// own `POST /summarize`, and OpenCode's own compaction, counted from when it was
    /// first seen (summary text streaming meanwhile does not extend it), which is then
    /// treated as a stall: abort, continue.
    #[serde(with = "duration_str")]
    pub max_wait: Duration,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            opportunistic: 0.5,
            proactive: 0.7,
            cooldown: Duration::from_secs(5 * 60),
            max_wait: Duration::from_secs(3 * 60),
        }
    }
}

/// The hand-off ("rollover"): before a session's window fills, its work moves to a
/// fresh session that receives a continuation built from structured state. Thresholds
/// are shares of the window (see [`CompactionConfig`] for their order).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HandoffConfig {
    /// Off: the thresholds still order compaction, and `hard` still gates prompts.
    pub enabled: bool,
    pub mode: HandoffMode,
    /// Past this share: one short note asks the model to keep its todos current.
    pub soft: f64,
    /// Past this share: hand off at the end of the current turn.
    pub prepare: f64,
    /// Past this share mid-turn: hand off after at most `drain`, aborting the turn if it
    /// has not ended. Follow-up prompts past it wait behind a compaction or hand-off.
    pub hard: f64,
    /// How long a turn past `hard` may go on before the hand-off aborts it.
    #[serde(with = "duration_str")]
    pub drain: Duration,
    /// The continuation's budget (≈ 4 characters a token); sections are trimmed by
    /// priority, never the objective or the resume protocol.
    pub max_continuation_tokens: u32,
    /// How many of the session's latest messages the continuation is built from.
    pub history_messages: u32,
    /// Ask the model itself (in a fork of the session) for objective, status,
    /// decisions and next steps.
    pub ask_model: bool,
    /// How long that question may take.
    #[serde(with = "duration_str")]
    pub question_timeout: Duration,
    /// The `noReply` note sent once past `soft`.
    pub soft_message: String,
    /// The question asked in the fork.
    pub question_message: String,
    /// The prompt that starts the fresh session's work after the continuation.
    pub resume_message: String,
    /// Regular expressions whose matches are replaced by `[REDACTED]` in every text
    /// Shepherd lets out (continuations, hand-off files, the advisor's prompt, journal
    /// reasons, status and API output, logs), *in addition to* the built-in secret
    /// shapes ([`crate::redact`]). A group named `secret` limits the replacement to it
    /// (`pin (?P<secret>\d{4})` keeps `pin `).
    pub redact_patterns: Vec<String>,
    /// `redact_patterns` replace the built-in shapes instead of adding to them (and an
    /// empty list then turns redaction off).
    pub redact_patterns_replace: bool,
}

/// What a hand-off does with the continuation.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HandoffMode {
    /// A new session in the same directory receives it; the old one is left untouched.
    Fresh,
    /// The same session is compacted and receives it.
    Compact,
    /// Persisted and reported; a person resumes it (`shepherd handoff --resume ID`).
    Manual,
}

impl HandoffMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HandoffMode::Fresh => "fresh",
            HandoffMode::Compact => "compact",
            HandoffMode::Manual => "manual",
        }
    }
}

impl Default for HandoffConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: HandoffMode::Fresh,
            soft: 0.75,
            prepare: 0.8,
            hard: 0.88,
            drain: Duration::from_secs(2 * 60),
            max_continuation_tokens: 6000,
            history_messages: 200,
            ask_model: true,
            question_timeout: Duration::from_secs(90),
            soft_message: "[Shepherd] Your context window is filling up ({percent}% used). Keep your todo list \
                           current and finish the step you are on cleanly: your work may soon continue in a \
                           fresh session that starts from your todos and a summary."
                .to_string(),
            question_message: "[Shepherd] Your work is about to move to a fresh session. In at most 300 words, \
                               for your successor: 1. OBJECTIVE - what the user wants. 2. STATUS - what is done \
                               and verified. 3. DECISIONS - choices made and why. 4. NEXT STEPS - what to do \
                               next, in order. Do not call tools."
                .to_string(),
            resume_message: "[Shepherd] You are continuing work handed over from session {previousSession}, \
                             whose context window was full. The message above is the continuation: the \
                             objective, todos, files and state. Re-read the files you need, re-create the \
                             open todos with your todo tool, and carry on with the next step. Do not redo \
                             finished work."
                .to_string(),
            redact_patterns: Vec::new(),
            redact_patterns_replace: false,
        }
    }
}

/// The guard every prompt passes: one prompt per decision (dedupe by similarity) and
/// rate limits, shared across Shepherd instances with the `redis` backend.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    pub enabled: bool,
    /// A prompt similar to one that reached the session within this long is dropped.
    #[serde(with = "duration_str")]
    pub window: Duration,
    /// Word-shingle Jaccard similarity at or above which two prompts are "the same".
    pub similarity: f64,
    /// Words per shingle (1 = single words).
    pub shingle_words: usize,
    /// How many of the session's latest messages are compared too (other instances',
    /// other tools' and the person's prompts).
    pub history_messages: u32,
    /// Prompts per minute to one session, and to all sessions of this instance (or of
    /// every instance sharing the `redis` backend).
    pub session_per_minute: u32,
    pub global_per_minute: u32,
    /// How many prompts may go out at once before the per-minute pace applies.
    pub session_burst: u32,
    pub global_burst: u32,
    /// How long a prompt over the limit waits for its turn. A continue, a person's
    /// prompt or a hand-off prompt is sent then whatever the limiter says, so a session
    /// is never stranded; a nudge or review still over the limit is deferred (its
    /// decision comes back when the limiter has room), never dropped.
    #[serde(with = "duration_str")]
    pub max_wait: Duration,
    pub backend: GuardBackend,
    /// `redis://host:port/db`; a password in it is masked in `config check`.
    pub redis_url: String,
    /// Keys are `PREFIX:…`, so instances of one fleet share them and others do not.
    pub key_prefix: String,
    /// One instance acts for a session at a time; another takes over within this long
    /// when the holder dies. An action that waits renews it every third of this; with
    /// `max_wait` as long or longer it must be at least 3 s.
    #[serde(with = "duration_str")]
    pub lease_ttl: Duration,
    /// With the `redis` backend and Redis unreachable, this instance's own limit in
    /// place of the fleet-wide one (its share of `global_per_minute`, `global_burst`).
    pub fallback_per_minute: u32,
    pub fallback_burst: u32,
}

/// Where the guard keeps what instances share.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GuardBackend {
    /// This instance only.
    Memory,
    /// Fingerprints, the global rate limit and session leases in Redis.
    Redis,
}

/// The shortest `guard.lease_ttl` a waiting prompt can keep by renewing it (every third
/// of it: one renewal a second at least).
pub const MIN_RENEWED_LEASE_TTL: Duration = Duration::from_secs(3);

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_secs(30),
            similarity: 0.6,
            shingle_words: 1,
            history_messages: 10,
            session_per_minute: 6,
            global_per_minute: 120,
            session_burst: 3,
            global_burst: 20,
            max_wait: Duration::from_secs(120),
            backend: GuardBackend::Memory,
            redis_url: "redis://127.0.0.1:6379/0".to_string(),
            key_prefix: "shepherd".to_string(),
            lease_ttl: Duration::from_secs(30),
            fallback_per_minute: 60,
            fallback_burst: 10,
        }
    }
}

/// Runaway loops: OpenCode calls the model again and again when a stream ends without a
/// finish reason (`finish: "unknown"`, zero tokens, several calls a second, forever).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoopsConfig {
    /// This many such assistant messages within `runaway_window` is a runaway loop.
    pub runaway_count: usize,
    #[serde(with = "duration_str")]
    pub runaway_window: Duration,
    /// The same tool with the same input called this many times in a row, within
    /// `spin_window`, is a spinning tool: reported, and not counted as progress.
    pub spin_count: usize,
    #[serde(with = "duration_str")]
    pub spin_window: Duration,
}

impl Default for LoopsConfig {
    fn default() -> Self {
        Self {
            runaway_count: 5,
            runaway_window: Duration::from_secs(10),
            spin_count: 4,
            spin_window: Duration::from_secs(5 * 60),
        }
    }
}

/// The status file for external monitoring: per-session statistics and a rolling
/// history, written atomically (temp file, fsync, rename).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    pub enabled: bool,
    /// The file (a leading `~/` is the home directory); empty = the default
    /// `$XDG_STATE_HOME/shepherd/status.json` (`~/.local/state/shepherd/status.json`).
    pub path: String,
    /// At most one write per this interval (changes in between are batched).
    #[serde(with = "duration_str")]
    pub min_interval: Duration,
    /// Archives kept at start-up (`status.json.1` newest … `status.json.N`); 0 = none.
    pub rotate: u32,
    /// Entries of each session's rolling history in the file (the whole journal is in
    /// the ledger: `shepherd history`). Each costs about 150 bytes of memory per session
    /// that has that many records, and a line of the file on every write.
    pub max_history: usize,
    /// Written at least this often (the live state — busy, todos, tokens — changes
    /// without records).
    #[serde(with = "duration_str")]
    pub refresh_interval: Duration,
    /// A session neither in memory nor acted on for this long leaves the file.
    #[serde(with = "duration_str")]
    pub forget_after: Duration,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: String::new(),
            min_interval: Duration::from_secs(2),
            rotate: 3,
            max_history: 10,
            refresh_interval: Duration::from_secs(30),
            forget_after: Duration::from_secs(60 * 60),
        }
    }
}

/// `shepherd top`, the live terminal view of the fleet (a client of the control API).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TopConfig {
    /// How often the view polls `GET /v1/status` (and redraws the times).
    #[serde(with = "duration_str")]
    pub refresh_interval: Duration,
    /// Journal records shown in the detail pane.
    pub journal_entries: u32,
    /// Show the fleet's counts in the terminal's title (`--title` turns it on too).
    pub terminal_title: bool,
    /// Show the most-stalled session's way towards recovery as the terminal's progress
    /// (OSC 9;4; `--progress` turns it on too).
    pub progress: bool,
}

impl Default for TopConfig {
    fn default() -> Self {
        Self { refresh_interval: Duration::from_secs(2), journal_entries: 20, terminal_title: false, progress: false }
    }
}

/// The advisor: a model that advises before an abort or a nudge ("the model advises,
/// rules decide"), with a heuristic fallback that is always there. On by default with
/// heuristics only; a model is asked only once `base_url` and `model` are set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdvisorConfig {
    /// Seek advice before a stall recovery's abort and before a nudge. On by default:
    /// without a model (`base_url` empty) the heuristic rules advise, in place. Off:
    /// neither decision is ever held back (no advice, not even the heuristics').
    pub enabled: bool,
    /// OpenAI-compatible API root (`POST {base_url}/chat/completions`), e.g.
    /// `https://api.openai.com/v1`. Empty (the default): the model advisor is disabled
    /// and the heuristics advise; no model is ever called.
    pub base_url: String,
    /// The model id sent in the request.
    pub model: String,
    /// NAME of the environment variable holding the API key (never the key itself, so
    /// config files can be shared and printed). Empty: no `Authorization` header.
    pub api_key_env: String,
    /// One model call, start to answer; past it the heuristic decides. A consultation
    /// also waits at most this long for a free slot (`max_concurrent`), so advice takes
    /// at most twice this.
    #[serde(with = "duration_str")]
    pub timeout: Duration,
    pub max_tokens: u32,
    pub temperature: f64,
    /// Advice `wait` at least this confident postpones an abort once, and skips a nudge.
    pub wait_confidence: f64,
    /// Advice `abort` at least this confident skips a nudge.
    pub abort_confidence: f64,
    /// How long a postponed abort waits (once per stall), and how long after a skipped
    /// nudge the nudge is considered again (once per idle spell, then without asking).
    #[serde(with = "duration_str")]
    pub postpone: Duration,
    /// Model calls under way at once, across all sessions; further consultations queue.
    pub max_concurrent: usize,
    /// How long an answer is reused for the same session in the same state.
    #[serde(with = "duration_str")]
    pub cache_ttl: Duration,
    /// A heuristic at least this confident is an obvious case: the model is not called.
    pub obvious_confidence: f64,
    /// Heuristic: a session younger than this is new (advice `wait`).
    #[serde(with = "duration_str")]
    pub new_session: Duration,
    /// Heuristic: planning (reasoning, or the `plan` agent) quiet for longer → `abort`.
    #[serde(with = "duration_str")]
    pub planning_limit: Duration,
    /// Heuristic: past this share of the window, `continue` (open todos) or `compact`.
    pub context_share: f64,
    /// How many of the session's latest messages the model is shown.
    pub history_messages: u32,
    /// The largest answer read from the model, bytes; a longer one is refused (the
    /// heuristic decides instead).
    pub max_response_bytes: usize,
}

impl Default for AdvisorConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            timeout: Duration::from_secs(5),
            max_tokens: 500,
            temperature: 0.1,
            wait_confidence: 0.7,
            abort_confidence: 0.6,
            postpone: Duration::from_secs(60),
            max_concurrent: 4,
            cache_ttl: Duration::from_secs(300),
            obvious_confidence: 0.9,
            new_session: Duration::from_secs(30),
            planning_limit: Duration::from_secs(60),
            context_share: 0.8,
            history_messages: 3,
            max_response_bytes: 1024 * 1024,
        }
    }
}

/// Toasts in an OpenCode TUI attached to the session's server (`POST /tui/show-toast`)
/// when Shepherd acts on a session: a continue after an abort, a nudge, a review, a
/// hand-off. Off by default; best effort (a failed toast never affects the action).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ToastsConfig {
    pub enabled: bool,
    /// How long the TUI shows a toast.
    #[serde(with = "duration_str")]
    pub duration: Duration,
}

impl Default for ToastsConfig {
    fn default() -> Self {
        Self { enabled: false, duration: Duration::from_secs(5) }
    }
}

/// The HTTP control API (status, custom prompts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    pub enabled: bool,
    /// Address to bind; loopback by default. Binding elsewhere needs `allow_remote`.
    pub bind: String,
    /// Name of the environment variable holding the bearer token. When it is unset, a
    /// random token is generated at start-up and written to `token_file`.
    pub token_env: String,
    /// Where the daemon writes (and the CLI reads) the token; empty = the default under
    /// the user's state directory.
    pub token_file: String,
    /// Serve read-only endpoints (`GET`) without a token.
    pub allow_unauthenticated_reads: bool,
    /// Allow a `bind` address that is not loopback. Off: such a bind refuses to start.
    /// On: it starts, and logs that the token travels in clear text unless a TLS proxy
    /// is in front.
    pub allow_remote: bool,
    /// `Host` values answered besides `localhost`, `127.0.0.1`, `[::1]` and the bound
    /// address (each with the bound port), e.g. `["shepherd.internal:7433"]` for a
    /// remote bind reached by name. Anything else is refused with 421 (DNS rebinding).
    pub allowed_hosts: Vec<String>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1:7433".to_string(),
            token_env: "SHEPHERD_CONTROL_TOKEN".to_string(),
            token_file: String::new(),
            allow_unauthenticated_reads: false,
            allow_remote: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The durable ledger: per-session state that survives eviction and restarts, and the
/// journal of every action (`shepherd history`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite` (on disk, the default) or `memory` (forgotten at exit: for tests and
    /// throw-away runs).
    pub backend: StoreBackend,
    /// The SQLite file (a leading `~/` is the home directory); empty = the default
    /// `$XDG_STATE_HOME/shepherd/ledger.sqlite3` (`~/.local/state/shepherd/ledger.sqlite3`).
    pub path: String,
    /// SQLite's page cache, KiB. The ledger mostly appends and reads one session's row
    /// when its actor starts; the operating system caches the file too. SQLite's own
    /// default (2 MiB) would be a fixed cost of 2 KiB per session in a fleet of 1,000;
    /// 256 KiB (64 pages) holds the upper levels of the ledger's trees.
    pub cache_kib: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { backend: StoreBackend::Sqlite, path: String::new(), cache_kib: 256 }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    Sqlite,
    Memory,
}

/// Log output.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `json`, `pretty`, or `auto` (json when stdout is not a terminal).
    pub format: LogFormat,
    /// A `tracing` filter directive, e.g. `info` or `shepherd=debug`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Auto, level: "info".to_string() }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Json,
    Pretty,
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

impl Config {
    /// Checks what serde cannot: ranges and relations between values.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        let bad = |key: &str, reason: &str| InvalidValue { key: key.into(), reason: reason.into() };
        let r = &self.recovery;
        if r.stall_timeout.is_zero() {
            return Err(bad("recovery.stall_timeout", "must be greater than zero"));
        }
        if !(r.tool_grace_factor.is_finite() && r.tool_grace_factor >= 1.0) {
            return Err(bad("recovery.tool_grace_factor", "must be a number >= 1"));
        }
        if r.abort_poll_interval.is_zero() {
            return Err(bad("recovery.abort_poll_interval", "must be greater than zero"));
        }
        if r.abort_poll_max < r.abort_poll_interval {
            return Err(bad("recovery.abort_poll_max", "must be at least abort_poll_interval"));
        }
        if r.max_backoff < r.cooldown {
            return Err(bad("recovery.max_backoff", "must be at least recovery.cooldown"));
        }
        if r.max_auto_submits == 0 {
            return Err(bad("recovery.max_auto_submits", "must be at least 1"));
        }
        if r.continue_message.trim().is_empty() {
            return Err(bad("recovery.continue_message", "must not be empty"));
        }
        if r.continue_with_todos_message.trim().is_empty() {
            return Err(bad("recovery.continue_with_todos_message", "must not be empty"));
        }
        if r.detect_tool_calls_as_text && r.tool_call_as_text_message.trim().is_empty() {
            return Err(bad("recovery.tool_call_as_text_message", "must not be empty"));
        }
        if r.tool_call_scan_messages == 0 {
            return Err(bad("recovery.tool_call_scan_messages", "must be at least 1"));
        }
        if r.verify_messages == 0 {
            return Err(bad("recovery.verify_messages", "must be at least 1"));
        }
        if r.planning_timeout.is_zero() {
            return Err(bad("recovery.planning_timeout", "must be greater than zero"));
        }
        if r.continue_with_plan_message.trim().is_empty() {
            return Err(bad("recovery.continue_with_plan_message", "must not be empty"));
        }
        if r.repeated_continue_count < 2 {
            return Err(bad("recovery.repeated_continue_count", "must be at least 2"));
        }
        if r.repeated_continue_window.is_zero() {
            return Err(bad("recovery.repeated_continue_window", "must be greater than zero"));
        }
        if r.provider_backoff.is_zero() {
            return Err(bad("recovery.provider_backoff", "must be greater than zero"));
        }
        if r.provider_max_backoff < r.provider_backoff {
            return Err(bad("recovery.provider_max_backoff", "must be at least recovery.provider_backoff"));
        }
        for (key, text) in [
            ("recovery.provider_resume_message", &r.provider_resume_message),
            ("recovery.provider_resume_with_todos_message", &r.provider_resume_with_todos_message),
        ] {
            if r.resume_after_provider_error && text.trim().is_empty() {
                return Err(bad(key, "must not be empty"));
            }
        }
        for (i, m) in r.fallback_models.iter().enumerate() {
            if crate::session::outage::parse_model(m).is_none() {
                return Err(bad(
                    &format!("recovery.fallback_models[{i}]"),
                    "must be provider/model, e.g. \"anthropic/claude-sonnet-4\"",
                ));
            }
        }
        if r.fallback_after == 0 {
            return Err(bad("recovery.fallback_after", "must be at least 1"));
        }
        if r.breaker_sessions == 0 {
            return Err(bad("recovery.breaker_sessions", "must be at least 1"));
        }
        if r.breaker_window.is_zero() {
            return Err(bad("recovery.breaker_window", "must be greater than zero"));
        }
        if r.breaker_probe_timeout.is_zero() {
            return Err(bad("recovery.breaker_probe_timeout", "must be greater than zero"));
        }
        if r.max_session_age < r.stall_timeout {
            return Err(bad("recovery.max_session_age", "must be at least recovery.stall_timeout"));
        }
        if self.compaction.max_wait.is_zero() {
            return Err(bad("compaction.max_wait", "must be greater than zero (it bounds every compaction)"));
        }
        let shares = [
            ("compaction.opportunistic", self.compaction.opportunistic),
            ("compaction.proactive", self.compaction.proactive),
            ("handoff.soft", self.handoff.soft),
            ("handoff.prepare", self.handoff.prepare),
            ("handoff.hard", self.handoff.hard),
        ];
        for (i, (key, v)) in shares.iter().enumerate() {
            if !(v.is_finite() && *v > 0.0 && *v < 1.0) {
                return Err(bad(key, "must be a share of the window between 0 and 1"));
            }
            if i > 0 && *v <= shares[i - 1].1 {
                return Err(bad(key, &format!("must be above {} ({})", shares[i - 1].0, shares[i - 1].1)));
            }
        }
        let h = &self.handoff;
        if h.max_continuation_tokens < 500 {
            return Err(bad("handoff.max_continuation_tokens", "must be at least 500"));
        }
        if h.history_messages == 0 {
            return Err(bad("handoff.history_messages", "must be at least 1"));
        }
        if h.question_timeout.is_zero() {
            return Err(bad("handoff.question_timeout", "must be greater than zero"));
        }
        for (key, text) in [
            ("handoff.soft_message", &h.soft_message),
            ("handoff.question_message", &h.question_message),
            ("handoff.resume_message", &h.resume_message),
        ] {
            if text.trim().is_empty() {
                return Err(bad(key, "must not be empty"));
            }
        }
        if let Err(e) = crate::redact::Redactor::new(&h.redact_patterns, h.redact_patterns_replace) {
            let key = format!("handoff.redact_patterns[{}]", e.index);
            return Err(bad(&key, &format!("not a regular expression: {}", e.reason)));
        }
        for (i, p) in self.context.error_patterns.iter().enumerate() {
            if let Err(e) = regex::Regex::new(p) {
                return Err(bad(&format!("context.error_patterns[{i}]"), &format!("not a regular expression: {e}")));
            }
        }
        let g = &self.guard;
        if !(g.similarity.is_finite() && g.similarity > 0.0 && g.similarity <= 1.0) {
            return Err(bad("guard.similarity", "must be a number in (0, 1]"));
        }
        if g.shingle_words == 0 || g.shingle_words > 5 {
            return Err(bad("guard.shingle_words", "must be between 1 and 5"));
        }
        if g.session_per_minute == 0 {
            return Err(bad("guard.session_per_minute", "must be at least 1"));
        }
        if g.global_per_minute == 0 {
            return Err(bad("guard.global_per_minute", "must be at least 1"));
        }
        if g.session_burst == 0 {
            return Err(bad("guard.session_burst", "must be at least 1"));
        }
        if g.global_burst == 0 {
            return Err(bad("guard.global_burst", "must be at least 1"));
        }
        if g.backend == GuardBackend::Redis {
            if !(g.redis_url.starts_with("redis://") || g.redis_url.starts_with("rediss://")) {
                return Err(bad("guard.redis_url", "must start with redis:// or rediss://"));
            }
            if g.lease_ttl < Duration::from_secs(1) {
                return Err(bad("guard.lease_ttl", "must be at least 1s"));
            }
            if g.key_prefix.trim().is_empty() {
                return Err(bad("guard.key_prefix", "must not be empty"));
            }
            // A prompt that waits longer than the lease lives keeps it by renewing it
            // every third of `lease_ttl`: each renewal is a Redis round trip that must
            // land before the lease lapses, so the lease must leave room for it.
            if g.max_wait >= g.lease_ttl && g.lease_ttl < MIN_RENEWED_LEASE_TTL {
                return Err(bad(
                    "guard.lease_ttl",
                    &format!(
                        "must be at least {}s when guard.max_wait ({}s) is as long or longer: a waiting prompt renews the session's lease every third of lease_ttl",
                        MIN_RENEWED_LEASE_TTL.as_secs(),
                        g.max_wait.as_secs_f64()
                    ),
                ));
            }
            if g.fallback_per_minute == 0 {
                return Err(bad("guard.fallback_per_minute", "must be at least 1"));
            }
            if g.fallback_burst == 0 {
                return Err(bad("guard.fallback_burst", "must be at least 1"));
            }
        }
        let a = &self.advisor;
        for (key, v) in [
            ("advisor.temperature", a.temperature),
            ("advisor.wait_confidence", a.wait_confidence),
            ("advisor.abort_confidence", a.abort_confidence),
            ("advisor.obvious_confidence", a.obvious_confidence),
            ("advisor.context_share", a.context_share),
        ] {
            let max = if key == "advisor.temperature" { 2.0 } else { 1.0 };
            if !(v.is_finite() && (0.0..=max).contains(&v)) {
                return Err(bad(key, &format!("must be a number between 0 and {max}")));
            }
        }
        if a.timeout.is_zero() {
            return Err(bad("advisor.timeout", "must be greater than zero"));
        }
        if a.max_tokens == 0 {
            return Err(bad("advisor.max_tokens", "must be at least 1"));
        }
        if a.max_response_bytes < 4096 {
            return Err(bad("advisor.max_response_bytes", "must be at least 4096"));
        }
        if a.max_concurrent == 0 {
            return Err(bad("advisor.max_concurrent", "must be at least 1"));
        }
        if a.postpone.is_zero() || a.postpone > Duration::from_secs(3600) {
            return Err(bad("advisor.postpone", "must be between 1ms and 1h (a postponed abort is bounded)"));
        }
        if a.history_messages == 0 || a.history_messages > 50 {
            return Err(bad("advisor.history_messages", "must be between 1 and 50"));
        }
        if !a.base_url.is_empty() {
            if !(a.base_url.starts_with("http://") || a.base_url.starts_with("https://")) {
                return Err(bad(
                    "advisor.base_url",
                    "must start with http:// or https:// (or be empty: heuristics only)",
                ));
            }
            if a.model.trim().is_empty() {
                return Err(bad("advisor.model", "must name a model when advisor.base_url is set"));
            }
        }
        if self.loops.runaway_count < 2 {
            return Err(bad("loops.runaway_count", "must be at least 2"));
        }
        if self.loops.spin_count < 2 {
            return Err(bad("loops.spin_count", "must be at least 2"));
        }
        if self.loops.spin_window.is_zero() {
            return Err(bad("loops.spin_window", "must be greater than zero"));
        }
        if self.status.enabled {
            if self.status.refresh_interval < self.status.min_interval {
                return Err(bad("status.refresh_interval", "must be at least status.min_interval"));
            }
            if self.status.max_history == 0 {
                return Err(bad("status.max_history", "must be at least 1"));
            }
            let path = self.status.path.as_str();
            if path.trim() != path || path.ends_with('/') || path == "~" {
                return Err(bad("status.path", "must name a file, e.g. /var/lib/shepherd/status.json"));
            }
        }
        if self.top.refresh_interval < Duration::from_millis(100) {
            return Err(bad("top.refresh_interval", "must be at least 100ms"));
        }
        if self.top.journal_entries == 0 {
            return Err(bad("top.journal_entries", "must be at least 1"));
        }
        if self.supervisor.discovery_interval.is_zero() {
            return Err(bad("supervisor.discovery_interval", "must be greater than zero"));
        }
        if self.supervisor.cleanup_interval.is_zero() {
            return Err(bad("supervisor.cleanup_interval", "must be greater than zero"));
        }
        if self.supervisor.max_sessions_in_memory == 0 {
            return Err(bad("supervisor.max_sessions_in_memory", "must be at least 1"));
        }
        if self.supervisor.max_event_types < 16 {
            return Err(bad("supervisor.max_event_types", "must be at least 16 (OpenCode sends about 30 types)"));
        }
        if self.supervisor.max_parents == 0 {
            return Err(bad("supervisor.max_parents", "must be at least 1"));
        }
        if self.supervisor.max_directories == 0 {
            return Err(bad("supervisor.max_directories", "must be at least 1"));
        }
        if self.nudge.max_without_progress == 0 {
            return Err(bad("nudge.max_without_progress", "must be at least 1"));
        }
        if self.nudge.message.trim().is_empty() {
            return Err(bad("nudge.message", "must not be empty"));
        }
        if self.review.message.trim().is_empty() {
            return Err(bad("review.message", "must not be empty"));
        }
        if self.toasts.enabled && self.toasts.duration.is_zero() {
            return Err(bad("toasts.duration", "must be greater than zero"));
        }
        if self.control.enabled {
            match self.control.bind.parse::<std::net::SocketAddr>() {
                Err(_) => return Err(bad("control.bind", "must be an address like 127.0.0.1:7433")),
                Ok(addr) if !addr.ip().is_loopback() && !self.control.allow_remote => {
                    return Err(bad(
                        "control.bind",
                        "is not a loopback address: the control API (and its bearer token, in clear text) would be \
                         reachable from other hosts; bind 127.0.0.1 or [::1], or set control.allow_remote = true \
                         behind a TLS proxy",
                    ))
                }
                Ok(_) => {}
            }
        }
        if self.store.backend == StoreBackend::Sqlite {
            let path = self.store.path.as_str();
            if path.trim() != path {
                return Err(bad("store.path", "must not start or end with white space"));
            }
            if path.ends_with('/') || path == "~" {
                return Err(bad("store.path", "names a directory; give a file, e.g. /var/lib/shepherd/ledger.sqlite3"));
            }
            if self.store.cache_kib < 64 {
                return Err(bad("store.cache_kib", "must be at least 64"));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            if s.name.trim().is_empty() {
                return Err(bad(&format!("servers[{i}].name"), "must not be empty"));
            }
            if !names.insert(s.name.as_str()) {
                return Err(bad(&format!("servers[{i}].name"), "is used by two servers"));
            }
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                return Err(bad(&format!("servers[{i}].url"), "must start with http:// or https://"));
            }
            if s.list_limit == 0 {
                return Err(bad(&format!("servers[{i}].list_limit"), "must be at least 1"));
            }
            if s.max_response_bytes < 64 * 1024 {
                return Err(bad(&format!("servers[{i}].max_response_bytes"), "must be at least 65536 (64 KiB)"));
            }
        }
        for (i, n) in self.notify.iter().enumerate() {
            n.validate(i)?;
        }
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
        c.validate().unwrap();
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
