//! Procedures under way, counted so shutdown can wait for them to finish (and no new
//! abort is sent once it began).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Counts recoveries under way so shutdown can wait for them to finish.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    inner: Arc<InFlightInner>,
}

#[derive(Debug, Default)]
struct InFlightInner {
    count: std::sync::atomic::AtomicUsize,
    stopping: AtomicBool,
    changed: tokio::sync::Notify,
}

impl InFlight {
    /// Marks the start of a procedure; the guard marks its end when dropped.
    pub fn enter(&self) -> InFlightGuard {
        self.inner.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard { inner: Arc::clone(&self.inner) }
    }

    pub fn count(&self) -> usize {
        self.inner.count.load(Ordering::SeqCst)
    }

    /// From now on no new abort is sent.
    pub fn begin_shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    pub fn stopping(&self) -> &AtomicBool {
        &self.inner.stopping
    }

    /// Waits until no procedure is under way.
    pub async fn drained(&self) {
        loop {
            let notified = self.inner.changed.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Held while one procedure runs.
#[derive(Debug)]
pub struct InFlightGuard {
    inner: Arc<InFlightInner>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.inner.count.fetch_sub(1, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }
}
