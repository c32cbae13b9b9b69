//! Kill points: named steps of Shepherd's procedures where a test can make the process
//! die, to prove that a crash at that step loses nothing and repeats nothing.
//!
//! A procedure calls [`reached`] at each step that matters for crash consistency (after
//! the intent is written, after the abort, after the prompt was sent but before its
//! outcome is ledgered, at each hand-off step). In production nothing is installed and
//! the call is one atomic load. The binary installs a hook only when the test-only
//! variable `SHEPHERD_KILL_AT` names a step (it logs loudly that it did); the hook sends
//! the process `SIGKILL` — no destructor, no flush, as an OOM kill or a power cut.

use std::sync::OnceLock;

/// The steps, as named in `SHEPHERD_KILL_AT` and in the tests.
pub mod step {
    /// The recovery's intent is ledgered; the abort has not been sent.
    pub const RECOVER_BEFORE_ABORT: &str = "recover.before_abort";
    /// The abort was accepted; the continue has not been sent.
    pub const RECOVER_AFTER_ABORT: &str = "recover.after_abort";
    /// A prompt (continue, nudge, review, custom) was accepted by OpenCode; its outcome
    /// is not ledgered yet.
    pub const PROMPT_AFTER_SEND: &str = "prompt.after_send";
    /// A hand-off's snapshot is stored; the next phase is not ledgered yet.
    pub const HANDOFF_AFTER_PERSISTING: &str = "handoff.after_persisting";
    /// The fresh session was created; the continuation note has not been sent.
    pub const HANDOFF_AFTER_CREATE: &str = "handoff.after_create";
    /// The fresh session holds the continuation; the next phase is not ledgered yet.
    pub const HANDOFF_AFTER_HANDING_OVER: &str = "handoff.after_handing_over";
    /// The resume prompt was sent; the hand-off is not ledgered as completed yet.
    pub const HANDOFF_AFTER_RESUMING: &str = "handoff.after_resuming";
    /// Every step above.
    pub const ALL: [&str; 7] = [
        RECOVER_BEFORE_ABORT,
        RECOVER_AFTER_ABORT,
        PROMPT_AFTER_SEND,
        HANDOFF_AFTER_PERSISTING,
        HANDOFF_AFTER_CREATE,
        HANDOFF_AFTER_HANDING_OVER,
        HANDOFF_AFTER_RESUMING,
    ];
}

type Hook = Box<dyn Fn(&str) + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs the process-wide hook (once; later calls are ignored and return false).
pub fn install(hook: impl Fn(&str) + Send + Sync + 'static) -> bool {
    HOOK.set(Box::new(hook)).is_ok()
}

/// A procedure reached `step`.
pub fn reached(step: &str) {
    if let Some(hook) = HOOK.get() {
        hook(step);
    }
}
