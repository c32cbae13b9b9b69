//! Shepherd's decisions: pure code with no actor framework and no I/O in its
//! dependency tree, so that purity is the compiler's to keep.
//!
//! Module map (read top-down):
//! - [`config`]: the configuration schema — the one home of every default number.
//! - [`event`]: typed OpenCode events, decoded from the JSON the server sends.
//! - [`ids`]: the shape of OpenCode's ids; a bad one is refused at the edge.
//! - [`session`]: the decisions about one session — the state machine
//!   ([`session::core`]), follow-ups, hand-off, outages, loops — and [`session::effect`],
//!   the orders it gives and the reports it gets back.
//! - [`advisor`]: advice before an abort or a nudge (heuristic, the model's reply, the
//!   request, the gate that weighs it).
//! - [`guard`]: is a prompt a repeat of what reached the session lately?
//! - [`journal`]: the record of every action Shepherd took or declined.
//! - [`ledger`]: what survives eviction and restarts, and the intents of actions under way.
//! - [`ports`]: the values that cross the ports (the traits are `shepherd-actors`').
//! - [`redact`]: the one redactor every text leaving Shepherd passes (secrets out).
//!
//! Nothing here reads a clock of its own: `now` is an argument, and actions are returned.

pub mod advisor;
pub mod config;
pub mod event;
pub mod fingerprint;
pub mod guard;
pub mod ids;
pub mod journal;
pub mod ledger;
pub mod ports;
pub mod redact;
pub mod session;
