//! The procedures the core's orders run, one per file, each through the narrow ports
//! it needs and nothing else (no actor, no clock of its own beyond tokio's sleeps). The
//! session actor's runner (`super::actor::runner`) starts them and hands their report
//! back to the core.
//!
//! - [`recover`]: the abort + continue of a stalled session.
//! - [`deliver`]: one prompt (fresh facts, the guard's word, render, tag, send), with its
//!   intent ledgered around it.
//! - [`compact`]: a bounded compaction.
//! - [`hand_over`]: one step of a hand-off to a fresh session.
//! - [`finish`]: an action a crash left open, checked against the session's own
//!   messages before anything is sent again.
//! - [`abort_and_wait`]: the one abort-and-wait-until-idle, and where a session's status
//!   is read.
//! - [`intents`]: writing and ending the ledger's intents.
//! - [`in_flight`]: procedures under way, which shutdown waits for.

pub mod abort_and_wait;
pub mod compact;
pub mod deliver;
pub mod finish;
pub mod hand_over;
pub mod in_flight;
pub mod intents;
pub mod recover;
