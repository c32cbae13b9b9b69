//! Facts the journal does not hold, counted where they happen: decorators around two
//! ports, wired in by the daemon, so neither the core nor the adapters they wrap know
//! about metrics.
//!
//! - [`CountingLedger`]: every ledger write (`save`, `append`, `put_intent`,
//!   `save_snapshot`, `claim`, …) → `shepherd_ledger_write_duration_seconds{operation}`
//!   (a recovery waits for its intent's write before it aborts: a slow disk shows here),
//!   and every failed one → `shepherd_ledger_write_errors_total{operation}`.
//! - [`TimedModel`]: every advisor model call → `shepherd_advisor_calls_total{outcome}`
//!   and `shepherd_advisor_call_duration_seconds{outcome}`, outcome `ok`, `error`, or
//!   `timeout` (the advisor actor dropped the call at `advisor.timeout`).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::ledger::{
    Claim, DurableState, FleetPause, FleetSettings, Intent, IntentLog, Ledger, LedgerError, Snapshot, SnapshotStore,
};
use shepherd_actors::ports::{ChatRequest, ModelError, ModelPort};

use super::Metrics;

/// A [`Ledger`] that counts its failed writes.
pub struct CountingLedger {
    inner: Arc<dyn Ledger>,
    metrics: Arc<Metrics>,
}

impl CountingLedger {
    pub fn wrap(inner: Arc<dyn Ledger>, metrics: Arc<Metrics>) -> Arc<dyn Ledger> {
        Arc::new(Self { inner, metrics })
    }

    /// Times the write and counts it if it failed.
    async fn timed<T>(
        &self,
        operation: &'static str,
        write: impl std::future::Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let started = Instant::now();
        let result = write.await;
        self.metrics.ledger_write(operation, started.elapsed().as_secs_f64());
        if result.is_err() {
            self.metrics.ledger_write_error(operation);
        }
        result
    }
}

#[async_trait]
impl SnapshotStore for CountingLedger {
    async fn save_snapshot(&self, snapshot: &Snapshot) -> Result<Option<String>, LedgerError> {
        self.timed("save_snapshot", self.inner.save_snapshot(snapshot)).await
    }

    async fn snapshots(&self, server: &str, session: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
        self.inner.snapshots(server, session).await
    }

    async fn snapshot(&self, id: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
        self.inner.snapshot(id).await
    }

    async fn claim(&self, id: &str, session: &str) -> Result<Claim, LedgerError> {
        self.timed("claim", self.inner.claim(id, session)).await
    }
}

#[async_trait]
impl FleetSettings for CountingLedger {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
        self.inner.fleet_pause().await
    }

    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError> {
        self.timed("set_fleet_pause", self.inner.set_fleet_pause(pause)).await
    }

    async fn watched_until(&self, server: &str) -> Result<Option<i64>, LedgerError> {
        self.inner.watched_until(server).await
    }

    async fn set_watched_until(&self, server: &str, wall_ms: i64) -> Result<(), LedgerError> {
        self.timed("set_watched_until", self.inner.set_watched_until(server, wall_ms)).await
    }
}

#[async_trait]
impl IntentLog for CountingLedger {
    async fn put_intent(&self, intent: &Intent) -> Result<(), LedgerError> {
        self.timed("put_intent", self.inner.put_intent(intent)).await
    }

    async fn end_intent(&self, server: &str, decision: &str) -> Result<(), LedgerError> {
        self.timed("end_intent", self.inner.end_intent(server, decision)).await
    }

    async fn open_intents(&self, server: &str, session: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
        self.inner.open_intents(server, session).await
    }
}

#[async_trait]
impl Ledger for CountingLedger {
    async fn load(&self, server: &str, session: &str) -> Result<Option<DurableState>, LedgerError> {
        self.inner.load(server, session).await
    }

    async fn save(&self, server: &str, session: &str, state: &DurableState) -> Result<(), LedgerError> {
        self.timed("save", self.inner.save(server, session, state)).await
    }

    async fn append(&self, record: &ActionRecord) -> Result<(), LedgerError> {
        self.timed("append", self.inner.append(record)).await
    }

    /// Timed as `save`, `append` or `append_and_save`: what the write held.
    async fn write(
        &self,
        server: &str,
        session: &str,
        records: &[ActionRecord],
        state: Option<&DurableState>,
    ) -> Result<(), LedgerError> {
        let operation = match (records.is_empty(), state.is_some()) {
            (true, _) => "save",
            (false, false) => "append",
            (false, true) => "append_and_save",
        };
        self.timed(operation, self.inner.write(server, session, records, state)).await
    }

    async fn history(&self, session: &str, limit: u32) -> Result<Vec<ActionRecord>, LedgerError> {
        self.inner.history(session, limit).await
    }

    async fn unfinished_handoffs(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        self.inner.unfinished_handoffs(server).await
    }

    async fn scheduled_resumes(&self, server: &str) -> Result<Vec<String>, LedgerError> {
        self.inner.scheduled_resumes(server).await
    }
}

/// A [`ModelPort`] that times its calls.
pub struct TimedModel {
    inner: Arc<dyn ModelPort>,
    metrics: Arc<Metrics>,
}

impl TimedModel {
    pub fn wrap(inner: Arc<dyn ModelPort>, metrics: Arc<Metrics>) -> Arc<dyn ModelPort> {
        Arc::new(Self { inner, metrics })
    }
}

/// Reports the call when it ends; a call dropped before it ended (the advisor actor's
/// timeout) reports `timeout`.
struct CallTimer<'a> {
    metrics: &'a Metrics,
    started: Instant,
    outcome: &'static str,
}

impl Drop for CallTimer<'_> {
    fn drop(&mut self) {
        self.metrics.advisor_call(self.outcome, self.started.elapsed().as_secs_f64());
    }
}

#[async_trait]
impl ModelPort for TimedModel {
    async fn complete(&self, request: &ChatRequest) -> Result<String, ModelError> {
        let mut timer = CallTimer { metrics: &self.metrics, started: Instant::now(), outcome: "timeout" };
        let result = self.inner.complete(request).await;
        timer.outcome = if result.is_ok() { "ok" } else { "error" };
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use shepherd_actors::ledger::MemoryLedger;

    use super::super::exposition::{parse, value};
    use super::*;

    struct Broken;

    #[async_trait]
    impl SnapshotStore for Broken {
        async fn save_snapshot(&self, _: &Snapshot) -> Result<Option<String>, LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn snapshots(&self, _: &str, _: &str) -> Result<Vec<Result<Snapshot, LedgerError>>, LedgerError> {
            Ok(vec![])
        }
        async fn snapshot(&self, _: &str) -> Result<Option<Result<Snapshot, LedgerError>>, LedgerError> {
            Ok(None)
        }
        async fn claim(&self, _: &str, _: &str) -> Result<Claim, LedgerError> {
            Ok(Claim::Granted)
        }
    }

    #[async_trait]
    impl IntentLog for Broken {
        async fn put_intent(&self, _: &Intent) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn end_intent(&self, _: &str, _: &str) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn open_intents(&self, _: &str, _: Option<&str>) -> Result<Vec<Intent>, LedgerError> {
            Ok(vec![])
        }
    }

    #[async_trait]
    impl FleetSettings for Broken {
        async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
            Ok(None)
        }
        async fn set_fleet_pause(&self, _: Option<&FleetPause>) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn watched_until(&self, _: &str) -> Result<Option<i64>, LedgerError> {
            Ok(None)
        }
        async fn set_watched_until(&self, _: &str, _: i64) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
    }

    #[async_trait]
    impl Ledger for Broken {
        async fn load(&self, _: &str, _: &str) -> Result<Option<DurableState>, LedgerError> {
            Err(LedgerError::Storage("disk gone".into()))
        }
        async fn save(&self, _: &str, _: &str, _: &DurableState) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn append(&self, _: &ActionRecord) -> Result<(), LedgerError> {
            Err(LedgerError::Storage("disk full".into()))
        }
        async fn history(&self, _: &str, _: u32) -> Result<Vec<ActionRecord>, LedgerError> {
            Ok(vec![])
        }
        async fn unfinished_handoffs(&self, _: &str) -> Result<Vec<String>, LedgerError> {
            Ok(vec![])
        }
    }

    #[tokio::test]
    async fn writes_are_timed_and_failed_ones_counted_by_operation_and_reads_are_not() {
        let metrics = Metrics::new();
        let ledger = CountingLedger::wrap(Arc::new(Broken), Arc::clone(&metrics));
        let _ = ledger.load("local", "s").await;
        let _ = ledger.save("local", "s", &DurableState::default()).await;
        let _ = ledger.save("local", "s", &DurableState::default()).await;
        let fine = CountingLedger::wrap(Arc::new(MemoryLedger::default()), Arc::clone(&metrics));
        fine.save("local", "s", &DurableState::default()).await.unwrap();
        let text = metrics.render_now();
        let samples = parse(&text);
        assert_eq!(value(&samples, "shepherd_ledger_write_errors_total", &[("operation", "save")]), Some(2.0));
        assert_eq!(value(&samples, "shepherd_ledger_write_errors_total", &[("operation", "load")]), None);
        // Every write is timed, the failed ones too; a read is not.
        let writes = |operation| value(&samples, "shepherd_ledger_write_duration_seconds_count", &[("operation", operation)]);
        assert_eq!(writes("save"), Some(3.0));
        assert_eq!(writes("load"), None);
    }

    struct Model(Result<&'static str, ()>, Duration);

    #[async_trait]
    impl ModelPort for Model {
        async fn complete(&self, _: &ChatRequest) -> Result<String, ModelError> {
            tokio::time::sleep(self.1).await;
            self.0.map(str::to_string).map_err(|()| ModelError::Http { status: 500 })
        }
    }

    #[tokio::test]
    async fn model_calls_are_counted_by_outcome_with_their_latency_and_a_dropped_call_is_a_timeout() {
        let metrics = Metrics::new();
        let request = ChatRequest {
            model: "m".into(),
            system: String::new(),
            user: String::new(),
            max_tokens: 10,
            temperature: 0.0,
        };
        let ok = TimedModel::wrap(Arc::new(Model(Ok("@WAIT:0.9"), Duration::ZERO)), Arc::clone(&metrics));
        ok.complete(&request).await.unwrap();
        let failing = TimedModel::wrap(Arc::new(Model(Err(()), Duration::ZERO)), Arc::clone(&metrics));
        failing.complete(&request).await.unwrap_err();
        let slow = TimedModel::wrap(Arc::new(Model(Ok("late"), Duration::from_secs(5))), Arc::clone(&metrics));
        assert!(tokio::time::timeout(Duration::from_millis(20), slow.complete(&request)).await.is_err());
        let samples = parse(&metrics.render_now());
        for outcome in ["ok", "error", "timeout"] {
            assert_eq!(
                value(&samples, "shepherd_advisor_calls_total", &[("outcome", outcome)]),
                Some(1.0),
                "{outcome}"
            );
            assert_eq!(
                value(&samples, "shepherd_advisor_call_duration_seconds_count", &[("outcome", outcome)]),
                Some(1.0)
            );
        }
    }
}
