//! Shepherd: the binary's library half — configuration loading, the adapters to the
//! outside world (OpenCode HTTP/SSE, the control API) and the wiring that connects them
//! to the actor system in `shepherd-actors`.
//!
//! The test bed (fake model + real OpenCode server) is not here: it is the
//! `shepherd-testbed` crate (`testbed/`), which the tests use as a dev-dependency and the
//! binary links for `shepherd demo` (the `demo` feature), so the production library
//! carries none of it.

pub mod advisor;
pub mod config;
pub mod control;
pub mod daemon;
pub mod doctor;
pub mod guard;
pub mod http_thread;
pub mod init;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod opencode;
pub mod priority;
pub mod private_state;
pub mod reload;
pub mod status;
pub mod store;
pub mod systemd;
#[cfg(test)]
mod test_support;
pub mod toast;
pub mod top;
pub mod workspace;
