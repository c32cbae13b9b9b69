//! One actor per OpenCode session, and the procedures it runs.
//!
//! The decisions are `shepherd_core::session`'s, re-exported here under their old
//! paths: [`core`] (the pure state machine), [`prompt`], [`followup`], [`loops`],
//! [`planning`], [`question`], [`handoff`], [`continuation`], [`textual_tool_call`],
//! [`outage`], [`breaker`], [`family`], and [`effect`] (the orders and reports).
//!
//! Here:
//! - [`procedures`]: what the core's orders run, one per file (recover, deliver,
//!   compact, hand over, finish an open action, abort and wait).
//! - [`actor`]: the actix shell that feeds the core, and its runner, which starts each
//!   procedure an effect orders and hands the report back to the core.
//! - [`view`]: a session's detail as the actor publishes it for readers.

pub mod actor;
pub mod procedures;
pub mod view;

pub use shepherd_core::session::{
    breaker, continuation, core, effect, family, followup, handoff, loops, outage, pause, planning, prompt, question,
    textual_tool_call,
};

pub use self::core::{Effect, Now, RecoveryOrder, RecoveryReport, SessionCore};
pub use actor::{Observe, SessionActor, SessionEnv};
