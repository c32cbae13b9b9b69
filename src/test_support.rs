//! What the library's unit tests share.

use std::sync::Arc;

use actix::{Actor as _, Addr};
use shepherd_actors::config::{SessionRules, SupervisorConfig};
use shepherd_actors::journal::Journal;
use shepherd_actors::ledger::MemoryLedger;
use shepherd_actors::supervisor::Supervisor;

/// A supervisor with the default rules and configuration, an in-memory ledger and the
/// system clock, started on the current actix system.
pub(crate) fn supervisor() -> Addr<Supervisor> {
    Supervisor::new(
        Arc::new(SessionRules::default()),
        SupervisorConfig::default(),
        Arc::new(MemoryLedger::default()),
        Arc::new(shepherd_actors::ports::SystemClock),
        Journal::new(),
        "test".into(),
    )
    .start()
}
