//! Binding the control API's address, apart from serving it (`server.rs`).

use std::net::{SocketAddr, TcpListener};

use anyhow::Context as _;
use shepherd_actors::config::ControlConfig;

use super::host::check_bind;

/// `control.bind`, bound: the daemon binds it before anything else starts, so a port
/// already taken (a second Shepherd) fails start-up with nothing started and nothing
/// written — and before the token file is written, so a second daemon on the same port
/// never replaces the first one's token.
#[derive(Debug)]
pub struct ControlListener {
    pub(super) listener: TcpListener,
    pub(super) local: SocketAddr,
}

impl ControlListener {
    /// Binds `control.bind` (port 0: any free port).
    pub fn bind(cfg: &ControlConfig) -> anyhow::Result<Self> {
        let bind: SocketAddr = cfg
            .bind
            .parse()
            .with_context(|| format!("control.bind {:?}: not an address like 127.0.0.1:7433", cfg.bind))?;
        check_bind(bind, cfg.allow_remote)?;
        let listener = TcpListener::bind(bind).with_context(|| {
            format!("control.bind {bind}: cannot listen (another Shepherd running? change control.bind or set control.enabled = false)")
        })?;
        let local = listener.local_addr().context("control API: reading the bound address")?;
        Ok(Self { listener, local })
    }
}
