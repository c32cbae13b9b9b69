//! `shepherd demo` (a fake model, a real OpenCode and scripted sessions, narrated; the
//! scenes are in [`scenes`]) and `shepherd fake-model` (the fake model on its own).
//!
//! Both run the test bed, the `shepherd-testbed` crate, which the binary links only with
//! the `demo` cargo feature (on by default): the library and the daemon never use it. A
//! build without the feature (`cargo build --no-default-features`, a production build)
//! keeps both commands so that they can say why they do nothing: they exit with an error
//! naming the feature.

#[cfg(feature = "demo")]
mod scenes;

use crate::DemoArgs;

#[cfg(feature = "demo")]
pub(crate) fn demo(args: DemoArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use shepherd_actors::config::LogFormat;

    let level = "warn,shepherd=info,shepherd_actors=info";
    let _log = if args.verbose {
        shepherd::logging::init(args.log_format.map(Into::into).unwrap_or(LogFormat::Pretty), level)
    } else {
        // The narrative alone on the terminal; the decisions in detail in a file.
        let path = std::env::temp_dir().join(format!("shepherd-demo-{}.log", std::process::id()));
        let log = shepherd::logging::init_file(LogFormat::Pretty, level, &path).with_context(|| format!("creating {}", path.display()))?;
        println!("Shepherd's own log: {} (or run with --verbose)", path.display());
        log
    };
    let stall = humantime::parse_duration(&args.stall_timeout)
        .with_context(|| format!("--stall-timeout {:?}", args.stall_timeout))?;
    actix::System::new().block_on(scenes::run(stall))
}

#[cfg(feature = "demo")]
pub(crate) fn fake_model() -> anyhow::Result<()> {
    use shepherd_actors::config::LogFormat;

    let _log = shepherd::logging::init(LogFormat::Auto, "info");
    let fake = shepherd_testbed::fake_model::FakeModel::start()?;
    println!("fake model listening: {}", fake.base_url());
    tokio::runtime::Runtime::new()?.block_on(super::wait_for_signal());
    Ok(())
}

#[cfg(not(feature = "demo"))]
pub(crate) fn demo(_args: DemoArgs) -> anyhow::Result<()> {
    Err(not_in_this_build("demo"))
}

#[cfg(not(feature = "demo"))]
pub(crate) fn fake_model() -> anyhow::Result<()> {
    Err(not_in_this_build("fake-model"))
}

/// The error of a command this build left out.
#[cfg(not(feature = "demo"))]
fn not_in_this_build(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "`shepherd {command}` is not in this build: it was built without the `demo` feature (the test bed, a fake \
         model and an OpenCode launcher, is left out of production builds); build with default features to get it, \
         e.g. `cargo install --path .`"
    )
}
