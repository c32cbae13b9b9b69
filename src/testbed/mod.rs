//! The test bed: everything needed to run Shepherd against a *real* OpenCode server
//! without a real LLM. Used by integration tests and by the `shepherd demo` command; never
//! by the daemon's production paths.
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

pub mod client;
pub mod fake_model;
pub mod opencode;
pub mod planted_repo;
pub mod redis;
