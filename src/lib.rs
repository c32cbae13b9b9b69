//! Shepherd: the binary's library half — configuration loading, the adapters to the
//! outside world (OpenCode HTTP/SSE, the control API), the test bed (fake model + real
//! OpenCode server) and the wiring that connects them to the actor system in
//! `shepherd-actors`.

pub mod advisor;
pub mod config;
pub mod control;
pub mod daemon;
pub mod demo;
pub mod doctor;
pub mod guard;
pub mod http_thread;
pub mod init;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod opencode;
pub mod private_state;
pub mod reload;
pub mod status;
pub mod store;
pub mod systemd;
pub mod testbed;
pub mod toast;
pub mod top;
pub mod workspace;
