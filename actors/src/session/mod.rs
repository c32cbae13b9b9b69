//! One actor per OpenCode session, and the decisions it makes.
//!
//! - [`core`]: the pure state machine — where a stall is decided.
//! - [`prompt`]: the text of Shepherd's prompts, from the configured templates.
//! - [`recovery`]: the abort + continue procedure against the engine port.
//! - [`actor`]: the actix shell that feeds the core and runs its effects.

pub mod actor;
pub mod core;
pub mod prompt;
pub mod recovery;

pub use actor::{Observe, SessionActor, SessionEnv};
pub use core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
