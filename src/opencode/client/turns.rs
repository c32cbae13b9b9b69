//! The calls under way to one server, bounded (`servers[].max_requests_in_flight`), and
//! the order in which the calls waiting for a turn get one.
//!
//! A turn set free goes first to a call a stalled session's abort waits on — the status
//! read that confirms the session is still busy, the abort itself ([`Lane::First`]) —
//! then to the other calls in the order they asked ([`Lane::InTurn`]). Under a storm of
//! stalls (a provider that hangs every stream at once) the server answers a few thousand
//! calls a second on its one thread (measured: the simulated server's time per call grew
//! with the calls in flight, ~0.15 ms each), and a recovery's continue is three more
//! calls after its abort: first come, first served, every abort waited behind the
//! continues of the recoveries before it, and a stalled turn ran on meanwhile. A continue
//! loses nothing by waiting: it follows an abort already made.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Which calls a free turn goes to first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A call a stalled session's abort waits on.
    First,
    /// Every other call, in the order they asked.
    InTurn,
}

/// At most `n` calls under way; the waiting ones served [`Lane::First`] first.
#[derive(Debug)]
pub struct Turns {
    state: Mutex<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    /// Turns nobody holds. Only while both queues are empty: a turn set free while a
    /// call waits goes to it.
    free: usize,
    first: VecDeque<oneshot::Sender<Turn>>,
    in_turn: VecDeque<oneshot::Sender<Turn>>,
}

/// One call's turn: set free (to the next call waiting, or to the pool) when dropped.
#[derive(Debug)]
pub struct Turn {
    /// `None` once the turn has gone on to another holder.
    turns: Option<Arc<Turns>>,
}

impl Turns {
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Turns { state: Mutex::new(Waiting { free: n, first: VecDeque::new(), in_turn: VecDeque::new() }) })
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a turn. A caller that stops waiting (a timeout) leaves its place; a turn
    /// handed to it just then goes on to the next.
    pub async fn take(self: &Arc<Self>, lane: Lane) -> Turn {
        let handed = {
            let mut waiting = self.lock();
            if waiting.free > 0 {
                waiting.free -= 1;
                return Turn { turns: Some(Arc::clone(self)) };
            }
            let (tx, rx) = oneshot::channel();
            match lane {
                Lane::First => waiting.first.push_back(tx),
                Lane::InTurn => waiting.in_turn.push_back(tx),
            }
            rx
        };
        match handed.await {
            Ok(turn) => turn,
            // Unreachable while `self` is held (the queues live in it); were it gone, no
            // call could be bounded by it any more.
            Err(_) => Turn { turns: None },
        }
    }

    /// A turn set free: to the first waiting call still there, or to the pool.
    fn set_free(self: Arc<Self>) {
        let mut waiting = self.lock();
        let mut turn = Turn { turns: Some(Arc::clone(&self)) };
        while let Some(next) = waiting.first.pop_front().or_else(|| waiting.in_turn.pop_front()) {
            match next.send(turn) {
                Ok(()) => return,
                // That caller stopped waiting: the next one.
                Err(back) => turn = back,
            }
        }
        turn.turns = None;
        waiting.free += 1;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(turns) = self.turns.take() {
            turns.set_free();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The order in which waiting calls got their turn, each holding it until told.
    async fn order_of(waiters: &[(&'static str, Lane)]) -> Vec<&'static str> {
        let turns = Turns::new(1);
        let held = turns.take(Lane::InTurn).await;
        let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        for &(name, lane) in waiters {
            let (turns, done_tx) = (Arc::clone(&turns), done_tx.clone());
            tokio::spawn(async move {
                let turn = turns.take(lane).await;
                done_tx.send(name).unwrap();
                drop(turn);
            });
            // Each asks after the one before it.
            tokio::task::yield_now().await;
        }
        drop(held);
        let mut order = Vec::new();
        for _ in waiters {
            order.push(done.recv().await.unwrap());
        }
        order
    }

    #[tokio::test]
    async fn a_freed_turn_goes_to_a_waiting_abort_before_calls_that_asked_earlier() {
        use Lane::*;
        let order = order_of(&[("todos", InTurn), ("messages", InTurn), ("abort", First), ("prompt", InTurn)]).await;
        assert_eq!(order, ["abort", "todos", "messages", "prompt"]);
        let order = order_of(&[("status", First), ("todos", InTurn), ("abort", First)]).await;
        assert_eq!(order, ["status", "abort", "todos"], "the first lane in the order it asked");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_stopped_waiting_keeps_no_turn() {
        let turns = Turns::new(2);
        let (a, b) = (turns.take(Lane::InTurn).await, turns.take(Lane::InTurn).await);
        // Both gave up waiting: one before any turn was set free, one as it was.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), turns.take(Lane::First)).await;
        assert!(gave_up.is_err());
        let mut late = Box::pin(turns.take(Lane::InTurn));
        assert!(futures::poll!(late.as_mut()).is_pending());
        drop(a);
        drop(late);
        drop(b);
        // Both turns are free again, not stuck with the callers that left.
        let both = tokio::time::timeout(Duration::from_millis(10), async {
            (turns.take(Lane::InTurn).await, turns.take(Lane::InTurn).await)
        });
        let held = both.await;
        assert!(held.is_ok(), "two turns to take");
        let third = tokio::time::timeout(Duration::from_millis(10), turns.take(Lane::InTurn)).await;
        assert!(third.is_err(), "and never more than two");
        drop(held);
    }
}
