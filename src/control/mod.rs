//! The control API: an HTTP edge through which people and tools ask the running daemon
//! what it knows about its sessions and send their own prompts, and the client the CLI
//! (`shepherd sessions`, `shepherd prompt`) uses to talk to it.
//!
//! This module authenticates, parses and maps answers to status codes; it decides
//! nothing about sessions. Every question becomes one of the supervisor's control
//! messages ([`shepherd_actors::control`]), so a custom prompt goes the same way as every
//! prompt Shepherd sends.
//!
//! Parts:
//! - [`server`]: the actix-web server on a thread (and actix `System`) of its own, so it
//!   answers while the supervisor is busy; routes, request log, error bodies.
//! - [`auth`]: the bearer-token check (pure; constant-time comparison).
//! - [`host`]: the `Host` values answered (DNS rebinding protection: anything else is
//!   421) and the loopback-only bind unless `control.allow_remote` (pure).
//! - [`token`]: where the token comes from (the variable `control.token_env` names, or a
//!   generated one written to `control.token_file` with mode 0600) and where the CLI
//!   finds it. A token never appears in a log line, an error or `Debug` output.
//! - [`request`]: the prompt body, parsed so that a 400 names the offending field.
//! - [`client`]: the CLI's side: which URL, which token, clear errors.
//! - [`table`]: the `shepherd sessions` table (pure).
//!
//! Endpoints (JSON but `/metrics`; errors are `{"error": "...", "field"?: "..."}`):
//! - `GET /healthz` → `{"ok": true}`, no token needed;
//! - `GET /readyz` → 200 `{"ready": true}` when every server's stream is connected and
//!   reconciled, else 503 naming the servers that are not and a fixed reason; no token
//!   needed (server names only: no URL, no error text, no session);
//! - `GET /metrics` → the Prometheus text exposition ([`crate::metrics`]); a read;
//! - `GET /v1/sessions` → every tracked session (`SessionDetail`);
//! - `GET /v1/status[?history=N]` → the fleet (`StatusDocument`: totals, each server's
//!   stream, each session's state and statistics) — the status file's content, built by
//!   the same code ([`crate::status::StatusBoard`]), live;
//! - `GET /v1/sessions/{id}` → one session, 404 when unknown;
//! - `GET /v1/sessions/{id}/history[?limit=N]` → its journal from the ledger, oldest
//!   first (what `shepherd history` prints);
//! - `POST /v1/sessions/{id}/prompt` with a `CustomPromptRequest` → `CustomPromptReply`;
//!   404 when the session is unknown, 400 naming the field when the body is wrong;
//! - `POST /v1/config/reload` → re-read the configuration (as `SIGHUP` does): what
//!   changed (`ConfigDiff`), or 400 with the error and the key as `field`.
//!
//! Every request whose `Host` is not `localhost`, `127.0.0.1`, `[::1]` or the bound
//! address (with the bound port) is refused with 421 before anything else.
//! Every request but `/healthz` and `/readyz` needs `Authorization: Bearer <token>`
//! (reads, `/metrics` among them, may go without when
//! `control.allow_unauthenticated_reads`); otherwise 401.

pub mod auth;
pub mod client;
pub mod host;
mod listener;
pub mod request;
pub mod server;
pub mod table;
pub mod token;

pub use self::client::{ClientError, ControlClient};
pub use self::listener::ControlListener;
pub use self::server::ControlServer;
pub use self::token::ControlToken;
