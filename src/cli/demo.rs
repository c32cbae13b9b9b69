//! `shepherd demo` (a fake model, a real OpenCode and scripted sessions, narrated) and
//! `shepherd fake-model` (the fake model on its own).

use anyhow::Context as _;
use shepherd_actors::config::LogFormat;

use super::wait_for_signal;
use crate::DemoArgs;

pub(crate) fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let level = "warn,shepherd=info,shepherd_actors=info";
    if args.verbose {
        shepherd::logging::init(args.log_format.map(Into::into).unwrap_or(LogFormat::Pretty), level);
    } else {
        // The narrative alone on the terminal; the decisions in detail in a file.
        let path = std::env::temp_dir().join(format!("shepherd-demo-{}.log", std::process::id()));
        shepherd::logging::init_file(level, &path).with_context(|| format!("creating {}", path.display()))?;
        println!("Shepherd's own log: {} (or run with --verbose)", path.display());
    }
    let stall = humantime::parse_duration(&args.stall_timeout)
        .with_context(|| format!("--stall-timeout {:?}", args.stall_timeout))?;
    actix::System::new().block_on(shepherd::demo::run(stall))
}

pub(crate) fn fake_model() -> anyhow::Result<()> {
    shepherd::logging::init(LogFormat::Auto, "info");
    let fake = shepherd::testbed::fake_model::FakeModel::start()?;
    println!("fake model listening: {}", fake.base_url());
    tokio::runtime::Runtime::new()?.block_on(wait_for_signal());
    Ok(())
}
