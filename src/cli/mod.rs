//! The handlers of `shepherd`'s subcommands (their arguments are parsed in `main.rs`):
//! `run` (the daemon), `control` (the running daemon's clients: `sessions`, `prompt`,
//! `handoff`, `pause`/`resume`, `top`, `config reload`), `status` (the status file),
//! `demo` (`demo`, `fake-model`), `setup` (`init`, `config check`, `doctor`,
//! `notify test`).

pub(crate) mod control;
pub(crate) mod demo;
pub(crate) mod run;
pub(crate) mod setup;
pub(crate) mod status;

pub(crate) fn client_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops Shepherd");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
