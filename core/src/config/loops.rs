//! `loops`: runaway loops and spinning tools.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{bad, duration_str, Config, InvalidValue};

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

/// Checks `loops.*`.
pub(super) fn validate(c: &Config) -> Result<(), InvalidValue> {
    if c.loops.runaway_count < 2 {
        return Err(bad("loops.runaway_count", "must be at least 2"));
    }
    if c.loops.spin_count < 2 {
        return Err(bad("loops.spin_count", "must be at least 2"));
    }
    if c.loops.spin_window.is_zero() {
        return Err(bad("loops.spin_window", "must be greater than zero"));
    }
    Ok(())
}
