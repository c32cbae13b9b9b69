//! The OpenCode version check at connect: a server outside the supported range is
//! warned about once, however often its stream reconnects; a supported one (the real
//! OpenCode the tests run, pinned or the oldest supported) is read and not warned about.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use shepherd::opencode::version::{assess, Support, SUPPORTED};
use support::faulty_proxy::FaultyProxy;
use support::{Rig, PATIENCE};


/// The captured lines about `server` (its `server` field) at `level`.
fn lines(server: &str, level: &str) -> Vec<Value> {
    let text = support::logs::logged();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["level"] == level && v["fields"]["server"] == server)
        .collect()
}

fn version_warnings(server: &str) -> Vec<Value> {
    lines(server, "WARN").into_iter().filter(|v| v["fields"]["opencode_version"].is_string()).collect()
}

/// The version the daemon's pump read for its one server, once it has read one.
async fn read_version(rig: &Rig) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = rig.daemon().pump_stats().first().and_then(|(_, s)| s.opencode_version()) {
            return Ok(v);
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the version was never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[actix::test]
async fn a_server_outside_the_supported_range_is_warned_about_once_across_reconnects() -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::INFO);
    let proxy: Arc<Mutex<Option<FaultyProxy>>> = Arc::default();
    let slot = Arc::clone(&proxy);
    let rig = Rig::start_full(
        |c| c.servers[0].name = "ancient".into(),
        |o| o,
        move |url| {
            let p = FaultyProxy::start_clean(url)?;
            *p.faults.health_version.lock().unwrap() = Some("0.9.0".into());
            let via = p.url.clone();
            *slot.lock().unwrap() = Some(p);
            Ok(via)
        },
    )
    .await?;
    assert_eq!(read_version(&rig).await?, "0.9.0");
    let faults = Arc::clone(&proxy.lock().unwrap().as_ref().expect("proxy started").faults);

    // Two more connects, each reading the version again.
    for _ in 0..2 {
        let connects = rig.daemon().pump_stats()[0].1.connects.load(std::sync::atomic::Ordering::Relaxed);
        rig.cut_the_stream(&faults).await?;
        faults.cut_events.store(false, std::sync::atomic::Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while rig.daemon().pump_stats()[0].1.connects.load(std::sync::atomic::Ordering::Relaxed) <= connects {
            if tokio::time::Instant::now() >= deadline {
                let said: Vec<_> = lines("ancient", "WARN").iter().map(|v| v["fields"].to_string()).collect();
                anyhow::bail!("the stream never reconnected; the pump's warnings: {said:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The last connect's read is logged (as already warned) before we count.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while lines("ancient", "INFO").iter().filter(|v| v["fields"]["opencode_version"] == "0.9.0").count() < 2 {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the reads after reconnects were not logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let warnings = version_warnings("ancient");
    assert_eq!(warnings.len(), 1, "one warning for three connects: {warnings:#?}");
    let message = warnings[0]["fields"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("0.9.0") && message.contains(&SUPPORTED.to_string()), "{message}");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_supported_opencode_is_read_at_connect_without_a_warning() -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::INFO);
    let rig = Rig::start_config(|c| c.servers[0].name = "current".into()).await?;
    let version = read_version(&rig).await?;
    assert!(matches!(assess(&version), Support::Supported(_)), "the OpenCode under test ({version}) is supported");
    assert!(version_warnings("current").is_empty(), "{:#?}", version_warnings("current"));
    rig.stop().await;
    Ok(())
}

/// `shepherd doctor` judges the version as the daemon does: a real OpenCode that reports
/// a release past the supported range (through a proxy that rewrites only the health
/// answer) gets a warning naming it, the range and what to run, and the report still
/// passes; the real OpenCode as it is gets none.
#[actix::test]
async fn doctor_warns_of_a_server_outside_the_supported_range_and_still_passes() -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::FakeModel;
    use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer, OPENCODE_VERSION};
    let fake = FakeModel::start()?;
    let mut opencode = OpenCodeServer::start(OpenCodeOptions::for_fake(&fake)).await?;
    let proxy = FaultyProxy::start_clean(opencode.url())?;
    let doctor = |url: &str| -> anyhow::Result<(bool, String)> {
        let dir = tempfile::tempdir()?;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["doctor", "--server", url, "--set", "control.enabled=false", "--set"])
            .arg(format!("store.path={}", dir.path().join("ledger.sqlite3").display()))
            .output()?;
        Ok((out.status.success(), String::from_utf8(out.stdout)?))
    };

    let (ok, report) = doctor(&opencode.url())?;
    assert!(ok, "{report}");
    assert!(!report.contains("version: OpenCode"), "no version warning for {OPENCODE_VERSION}: {report}");

    *proxy.faults.health_version.lock().unwrap() = Some("1.20.0".into());
    let (ok, report) = doctor(&proxy.url)?;
    assert!(ok, "a warning is no failure: {report}");
    let line = report.lines().find(|l| l.contains("version: OpenCode 1.20.0")).expect("a version line");
    assert!(line.starts_with("WARN") && line.contains(&SUPPORTED.to_string()), "{report}");
    let names_the_pinned = line.contains(&format!("Shepherd's tests run {OPENCODE_VERSION}"));
    assert!(names_the_pinned, "the fix names the pinned release: {report}");
    assert!(report.contains("event stream: connected"), "the rest is examined as before: {report}");
    opencode.stop().await;
    Ok(())
}
