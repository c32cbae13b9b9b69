//! The test bed: everything needed to run Shepherd against a *real* OpenCode server
//! without a real LLM. Used by the integration tests, benches and unit tests (a
//! dev-dependency) and by the `shepherd demo` command (the binary's default-on `demo`
//! feature); never by the daemon's production paths, which is why it is a crate of its
//! own and not a module of the `shepherd` library: a build without the `demo` feature
//! carries none of it.
//!
//! - [`fake_model`] — a scriptable OpenAI-compatible model server; markers in the user
//!   message (`[[fake:stall]]`, `[[fake:todo:create]]`, …) choose what it does.
//! - [`opencode`] — installs the pinned OpenCode binary and runs `opencode serve` in an
//!   isolated temp HOME with a scratch git project, wired to a fake model.
//! - [`client`] — a thin REST helper over OpenCode for tests and the demo (create a
//!   session, prompt, abort, read status/messages/todos, wait for a condition). It is not
//!   Shepherd's production OpenCode client.
//! - [`planted_repo`] — a git repository that plants a command in every key git could run
//!   one from, and tells which of them ran.
//! - [`redis`] — a private `redis-server` for tests of instances that share state.
//!
//! It depends on no Shepherd crate: the `shepherd` package depends on it (for the demo),
//! so it cannot depend on `shepherd` back. The two small things it shares with the
//! `shepherd` library are compiled in from that library's source by path, so each stays
//! in one place: the HTTP-server thread the fake model runs on (`src/http_thread.rs`)
//! and the pinned OpenCode release (`src/opencode/pinned.rs`).

pub mod client;
pub mod fake_model;
pub mod opencode;
pub mod planted_repo;
pub mod redis;

#[path = "../../src/http_thread.rs"]
mod http_thread;
#[path = "../../src/opencode/pinned.rs"]
mod pinned;
