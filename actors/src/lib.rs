//! Shepherd's actor system: the actors, the procedures they run and the ports they run
//! them through. The decisions are the `shepherd-core` crate's; its modules are
//! re-exported here under the paths they had (`config`, `event`, `ids`, `redact`
//! whole; `advisor`, `guard`, `journal`, `ledger`, `ports` and `session` each add
//! their I/O half to the pure one).
//!
//! Module map (read top-down):
//! - [`advisor`]: advice before an abort or a nudge (model + heuristic fallback).
//! - [`config`]: the configuration schema — the one home of every default number.
//! - [`event`]: typed OpenCode events, decoded from the JSON the server sends.
//! - [`ids`]: the shape of OpenCode's ids; a bad one is refused at the edge.
//! - [`ports`]: the narrow traits the cores need from the world (an OpenCode server as
//!   [`ports::Reads`], [`ports::Control`], [`ports::Lifecycle`] and [`ports::Discovery`],
//!   all four [`ports::Engine`]; [`ports::Clock`] for time), implemented at the edges and
//!   faked in tests.
//! - [`session`]: one actor per OpenCode session. `session::core` decides (pure),
//!   `session::actor` carries out (thin; its runner starts every procedure),
//!   `session::procedures` run what the core orders (recover, deliver, compact, hand
//!   over, finish, abort and wait) through the engine's ports, one per file.
//! - [`supervisor`]: the fleet actor: creates session actors on first sight, routes
//!   events to them and reconciles state after every stream (re)connect.
//! - [`control`]: the questions the control API may ask the supervisor.
//! - [`ledger`]: the durable-state port (what survives eviction and restarts), and the
//!   intents of actions under way (what a crash must not lose or repeat).
//! - [`killpoint`]: named steps where a test can make the process die.
//! - [`journal`]: the record of every action Shepherd took or declined.
//! - [`redact`]: the one redactor every text leaving Shepherd passes (secrets out).
//! - [`stats`]: per-session statistics folded from the journal, and the status document.
//!
//! Decision modules have no I/O, no clock of their own and no actix: they take `now`
//! as an argument and return actions.

pub mod advisor;
pub mod control;
pub mod guard;
pub mod journal;
pub mod killpoint;
pub mod ledger;
pub mod ports;
pub mod session;
pub mod stats;
pub mod stream_clock;
pub mod supervisor;

pub use shepherd_core::{config, event, ids, redact};
