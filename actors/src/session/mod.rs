//! One actor per OpenCode session, and the decisions it makes.
//!
//! - [`core`]: the pure state machine — where a stall is decided.
//! - [`prompt`]: the text of Shepherd's prompts, from the configured templates.
//! - [`followup`]: nudge (idle with open todos) and review (all done) decisions.
//! - [`loops`]: repeated continues and spinning tools (bookkeeping the core consults).
//! - [`planning`]: is the session planning (agent `plan`, or a plan announced)?
//! - [`question`]: does the agent's last reply ask the person something?
//! - [`delivery`]: sending one prompt (fresh facts, render, tag, send).
//! - [`recovery`]: the abort + continue procedure against the engine port.
//! - [`unfinished`]: finishing an action a crash left open (the ledger's intent, checked
//!   against the session's own messages).
//! - [`handoff`]: when to hand a filling session over to a fresh one (phases);
//!   [`continuation`]: what the fresh session is given; [`handover`]: the steps.
//! - [`textual_tool_call`]: did the model write a tool call as text instead of calling it?
//! - [`outage`]: provider errors — what they are, and one session's resume back-off;
//!   [`breaker`]: the server's circuit breaker shared by its sessions.
//! - [`actor`]: the actix shell that feeds the core and runs its effects.

pub mod actor;
pub mod breaker;
pub mod continuation;
pub mod core;
pub mod delivery;
pub mod family;
pub mod followup;
pub mod handoff;
pub mod handover;
pub mod loops;
pub mod outage;
pub mod planning;
pub mod prompt;
pub mod question;
pub mod recovery;
pub mod unfinished;
pub mod textual_tool_call;

pub use actor::{Observe, SessionActor, SessionEnv};
pub use core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
