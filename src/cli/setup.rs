//! Setting Shepherd up and checking it: `init` (a first configuration), `config check`
//! (the effective configuration and where each value comes from), `doctor` (everything
//! `run` depends on) and `notify test` (one message to each target).

use anyhow::Context as _;
use shepherd::config::{load_with_origins, render_with_origins};

use super::client_runtime;
use crate::{ConfigArgs, InitArgs};

pub(crate) fn config_check(args: &ConfigArgs) -> anyhow::Result<()> {
    let (cfg, origins) = load_with_origins(&args.sources()).context("invalid configuration")?;
    print!("{}", render_with_origins(&cfg, &origins));
    super::run::runnable(&cfg).context("`shepherd run` would refuse this configuration")
}

pub(crate) fn init(args: InitArgs) -> anyhow::Result<()> {
    let path = match args.path {
        Some(p) => p,
        None => shepherd::config::user_config_path(&|name| std::env::var_os(name))
            .context("neither XDG_CONFIG_HOME nor HOME is set to an absolute path: pass --path")?,
    };
    let found = client_runtime()?.block_on(shepherd::init::write(&path, &args.server, args.force))?;
    println!("wrote {} ({}: {found})", path.display(), args.server);
    println!("next: `shepherd doctor` checks it, `shepherd run` uses it");
    Ok(())
}

pub(crate) fn doctor(args: &ConfigArgs) -> anyhow::Result<()> {
    let cfg = args.load()?;
    let findings = client_runtime()?.block_on(shepherd::doctor::examine(&cfg));
    print!("{}", shepherd::doctor::render(&findings));
    if shepherd::doctor::failed(&findings) {
        std::process::exit(1);
    }
    Ok(())
}

pub(crate) fn notify_test(args: &ConfigArgs) -> anyhow::Result<()> {
    let cfg = args.load()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    match client_runtime()?.block_on(shepherd::notify::probe::send_tests(&cfg.notify, now)) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(lines) => {
            lines.iter().for_each(|l| println!("{l}"));
            std::process::exit(1);
        }
    }
    Ok(())
}
