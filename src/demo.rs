//! `shepherd demo` (filled in below).
pub async fn run(_stall: std::time::Duration) -> anyhow::Result<()> {
    anyhow::bail!("demo not yet wired")
}
