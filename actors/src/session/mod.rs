//! One actor per OpenCode session, and the procedures it runs.
//!
//! The decisions are `shepherd_core::session`'s, re-exported here under their old
//! paths: [`core`] (the pure state machine), [`prompt`], [`followup`], [`loops`],
//! [`planning`], [`question`], [`handoff`], [`continuation`], [`textual_tool_call`],
//! [`outage`], [`breaker`], [`family`], and [`effect`] (the orders and reports).
//!
//! Here:
//! - [`delivery`]: sending one prompt (fresh facts, render, tag, send).
//! - [`recovery`]: the abort + continue procedure against the engine port.
//! - [`unfinished`]: finishing an action a crash left open (the ledger's intent, checked
//!   against the session's own messages).
//! - [`handover`]: the hand-off's steps.
//! - [`actor`]: the actix shell that feeds the core and runs its effects.
//! - [`view`]: a session's detail as the actor publishes it for readers.

pub mod actor;
pub mod delivery;
pub mod handover;
pub mod recovery;
pub mod unfinished;
pub mod view;

pub use shepherd_core::session::{
    breaker, continuation, core, effect, family, followup, handoff, loops, outage, pause, planning, prompt, question,
    textual_tool_call,
};

pub use self::core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
pub use actor::{Observe, SessionActor, SessionEnv};
