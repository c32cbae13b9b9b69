//! The pinned OpenCode release: the newest Shepherd is tested with, the one the test bed
//! (`shepherd-testbed`) installs and runs, and the one the daemon recommends when a
//! server runs a release outside the supported range (`version.rs`).
//!
//! A file of its own, one line, because two crates read it: this library, and the test
//! bed, which compiles this file in by path (`testbed/src/lib.rs`) since it cannot
//! depend on this crate (the `shepherd` binary depends on the test bed for `shepherd
//! demo`, and cargo forbids the cycle). `scripts/install-opencode.sh` reads the line too.
//! No intra-doc links here: they would not resolve in the test bed's copy.

/// The OpenCode release the test bed runs (`opencode --version`).
pub const OPENCODE_VERSION: &str = "1.19.5";
