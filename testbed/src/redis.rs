//! A private `redis-server` for tests that need instances to share state: a free
//! loopback port, no persistence, killed when dropped.
//!
//! The binary is `$SHEPHERD_REDIS_BIN`, else `redis-server` on the `PATH` (Debian's
//! `redis-server` package; `scripts/test.sh` installs it).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

/// A running `redis-server`.
pub struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    pub async fn start() -> anyhow::Result<RedisServer> {
        let bin = std::env::var("SHEPHERD_REDIS_BIN").unwrap_or_else(|_| "redis-server".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {bin} (install Debian's redis-server, or set SHEPHERD_REDIS_BIN)"))?;
        let server = RedisServer { child, port };
        let client = redis::Client::open(server.url())?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING").query_async::<String>(&mut c).await.is_ok() {
                    return Ok(server);
                }
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "redis-server on port {port} did not answer");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
