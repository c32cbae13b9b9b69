//! Crossing to a server's sessions' threads: which thread a session's actor runs on
//! (always the same: [`Registry::thread_of`]), the pump's batches handed over there
//! ([`Registry::flush`]), the supervisor's sends behind them ([`Registry::dispatch`]),
//! and the long way's mark that lets a session's events go straight again only once it
//! has passed every sessions' thread ([`Registry::handled`]). See the registry's module
//! doc for the layout.

use std::hash::BuildHasher as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use actix::{Addr, ArbiterHandle, Handler, Message};

use super::{Registry, RouteState};
use crate::session::SessionActor;

impl Registry {
    /// Sends the events routed straight since the last flush to their sessions, in one
    /// crossing to each sessions' thread. The pump flushes at the end of a read
    /// ([`Registry::end_of_read`]) and when its connection ends; [`send`] flushes
    /// before anything goes the long way (so a session's events keep their
    /// order).
    ///
    /// [`send`]: Registry::send
    pub fn flush(&self, state: &mut RouteState) {
        state.batched_reads = 0;
        for (thread, waiting) in state.batches.iter_mut().enumerate() {
            if waiting.is_empty() {
                continue;
            }
            // The next batch is about as large: it starts with room for it.
            let batch = std::mem::replace(waiting, Vec::with_capacity(waiting.len()));
            self.on_thread(thread, move || {
                for (addr, msg) in batch {
                    addr.do_send(msg);
                }
            });
        }
    }

    /// Sends `msg` to session `id`'s actor from the session's thread: the supervisor
    /// sends what it routes this way, so it lands behind every event the pump sent the
    /// session before.
    pub(crate) fn dispatch<M>(&self, id: &str, addr: Addr<SessionActor>, msg: M)
    where
        M: Message<Result = ()> + Send + 'static,
        SessionActor: Handler<M>,
    {
        self.on_thread(self.thread_of(id), move || addr.do_send(msg));
    }

    /// The supervisor is done with the event sent the long way as `seq`: once what it
    /// dispatched for it has been sent (on the sessions' threads, each in order), the
    /// session's next events may go straight again. The mark passes every sessions'
    /// thread in turn, behind what each had queued, and is set after the last.
    pub(crate) fn handled(self: &Arc<Self>, seq: u64) {
        fn pass(registry: Arc<Registry>, seq: u64, thread: usize) {
            match registry.threads.get().and_then(|threads| threads.get(thread)).cloned() {
                Some(handle) => {
                    handle.spawn_fn(move || pass(registry, seq, thread + 1));
                }
                None => {
                    registry.long_handled.fetch_max(seq, Ordering::Release);
                }
            }
        }
        pass(Arc::clone(self), seq, 0);
    }

    /// The sessions' threads, as the server is attached (once; none: the supervisor's).
    pub(crate) fn set_threads(&self, threads: Vec<ArbiterHandle>) {
        if !threads.is_empty() {
            let _ = self.threads.set(threads.into_boxed_slice());
        }
    }

    /// Which of the sessions' threads session `id`'s actor runs on: always the same for
    /// the same id (its events are sent there, in order, by the pump and the supervisor
    /// alike). 0 with one thread or none.
    pub fn thread_of(&self, id: &str) -> usize {
        match self.threads.get().map_or(0, |threads| threads.len()) {
            0 | 1 => 0,
            n => (self.spread.hash_one(id) % n as u64) as usize,
        }
    }

    /// The thread session `id`'s actor is started on (`None`: the supervisor's own).
    pub(crate) fn thread_for(&self, id: &str) -> Option<&ArbiterHandle> {
        self.threads.get().and_then(|threads| threads.get(self.thread_of(id)))
    }

    /// Runs `f` on the `thread`-th sessions' thread, behind what was queued there before
    /// (now, when the server has no thread of its own).
    fn on_thread(&self, thread: usize, f: impl FnOnce() + Send + 'static) {
        match self.threads.get().and_then(|threads| threads.get(thread)) {
            Some(handle) => {
                handle.spawn_fn(f);
            }
            None => f(),
        }
    }
}
