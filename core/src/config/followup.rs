//! `nudge` and `review`: the follow-ups to an idle session (open todos; all done).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

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

/// Checks `nudge.*`.
pub(super) fn validate_nudge(c: &Config) -> Result<(), InvalidValue> {
    if c.nudge.max_without_progress == 0 {
        return Err(bad("nudge.max_without_progress", "must be at least 1"));
    }
    if c.nudge.message.trim().is_empty() {
        return Err(bad("nudge.message", "must not be empty"));
    }
    Ok(())
}

/// Checks `review.*`.
pub(super) fn validate_review(c: &Config) -> Result<(), InvalidValue> {
    if c.review.message.trim().is_empty() {
        return Err(bad("review.message", "must not be empty"));
    }
    Ok(())
}
