//! A real OpenCode server for tests and the demo: [`ensure_installed`] finds or installs
//! the pinned binary ([`OPENCODE_VERSION`]); [`OpenCodeServer::start`] runs
//! `opencode serve` on `127.0.0.1:<free port>` inside a temp dir with an isolated HOME
//! and a scratch git project, configured with the fake model as its only provider
//! (`fake/fake-model` and `fake/fake-model-2`, context 200000 / output 8000).
//!
//! It must never touch the real user's OpenCode state: HOME, the XDG dirs and TMPDIR all
//! point into the temp dir, and the environment is cleared apart from `PATH`.

mod install;
mod process;
mod server;

pub use install::{
    binary_in, binary_version, cache_dir, ensure_installed, install_into, platform_package, ENV_BIN, ENV_CACHE,
    OPENCODE_VERSION,
};
pub use server::{
    OpenCodeOptions, OpenCodeServer, ENV_KEEP, FAKE_CONTEXT_LIMIT, FAKE_MODEL, FAKE_MODEL_2, FAKE_OUTPUT_LIMIT,
    FAKE_PROVIDER, SERVER_USERNAME,
};
