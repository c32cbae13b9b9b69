//! An actix-web server on a thread of its own, with its own actix `System`.
//!
//! Used by the control API (so it answers while the supervisor's thread is busy) and by
//! the test bed's fake model (so it works from any runtime a test uses). The test bed
//! (`shepherd-testbed`) compiles this file in by path (it cannot depend on this crate), so
//! it names no `crate::` item, no intra-doc link, and only crates both have (actix-web,
//! anyhow, tracing). The server is
//! built *inside* the new thread — actix-web servers are not `Send` — from a closure that
//! the caller gives; the caller gets the handle to stop it and the thread to join.

use std::thread::JoinHandle;

use actix_web::dev::{Server, ServerHandle};
use anyhow::Context as _;

/// Starts the server `build` makes on a new thread named `name`; returns once it runs.
pub fn spawn_server<F>(name: String, build: F) -> anyhow::Result<(ServerHandle, JoinHandle<()>)>
where
    F: FnOnce() -> std::io::Result<Server> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<ServerHandle>>();
    let label = name.clone();
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let system = actix_web::rt::System::new();
            system.block_on(async move {
                match build() {
                    Ok(server) => {
                        let _ = tx.send(Ok(server.handle()));
                        if let Err(e) = server.await {
                            tracing::warn!(server = %label, error = %e, "HTTP server ended with an error");
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })
        .context("spawning the HTTP server thread")?;
    let handle =
        rx.recv().context("the HTTP server thread died before it started")?.context("starting the HTTP server")?;
    Ok((handle, thread))
}
