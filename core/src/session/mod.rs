//! The decisions about one OpenCode session.
//!
//! - [`core`]: the pure state machine — where a stall is decided.
//! - [`effect`]: the orders the core gives the procedures, and their reports.
//! - [`prompt`]: the text of Shepherd's prompts, from the configured templates.
//! - [`followup`]: nudge (idle with open todos) and review (all done) decisions.
//! - [`loops`]: repeated continues and spinning tools (bookkeeping the core consults).
//! - [`planning`]: is the session planning (agent `plan`, or a plan announced)?
//! - [`question`]: does the agent's last reply ask the person something?
//! - [`handoff`]: when to hand a filling session over to a fresh one (phases);
//!   [`continuation`]: what the fresh session is given.
//! - [`textual_tool_call`]: did the model write a tool call as text instead of calling it?
//! - [`outage`]: provider errors — what they are, and one session's resume back-off;
//!   [`breaker`]: the server's circuit breaker shared by its sessions.
//! - [`family`]: a parent's subagents (children busy or failed, orphan waits).
//! - [`pause`]: why automation is off for a session.

pub mod breaker;
pub mod continuation;
pub mod core;
pub mod effect;
pub mod family;
pub mod followup;
pub mod handoff;
pub mod loops;
pub mod outage;
pub mod pause;
pub mod planning;
pub mod prompt;
pub mod question;
pub mod textual_tool_call;

pub use self::core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
