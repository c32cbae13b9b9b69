//! Stream time: up to when Shepherd has handled what a server sent.
//!
//! A session's silence is only silence if everything the server sent meanwhile has been
//! handled. A CPU-starved Shepherd (the host busy with the agents' own builds) or a burst
//! of thousands of sessions leaves events waiting — in the kernel's socket buffer, in the
//! HTTP connection, in the actors' mailboxes — and a deadline counted in wall time takes
//! that backlog for silence: a working session is aborted. So a session's deadlines fall
//! due in **stream time**: a deadline `d` is due once every event the server sent before
//! `d` has been handled ([`StreamClock::wake_when`]). When Shepherd keeps up, stream time
//! is now and nothing waits.
//!
//! The pump feeds the clock. Before it hands a read's events on it takes a [`Mark`],
//! and every event carries it ([`ReadToken`]) to its session's actor — straight, or
//! through the supervisor; the last of them handled drops it. (A delta is noted in its
//! session's cell instead, before the pump lets go of the read's mark: a deadline due
//! in stream time finds it there.) Marks are reached in
//! order (a later read handled first, on another thread, waits for the earlier ones),
//! and reaching one moves stream time to its `through` — how far the socket had proven
//! the pump's reads to reach ([`SocketBacklog`]) when the read ended ([`Mark::read_ends`]:
//! the chunks that joined the read polled the socket, and the last poll, finding it
//! empty, proves the whole read). While the pump waits with every read
//! handled, stream time is the socket's latest proof, and now if the kernel holds
//! nothing new. Marks are also the backpressure: at most [`MAX_UNHANDLED_READS`] are
//! outstanding; past that the pump stops reading, the backlog stays in the socket (where
//! it costs Shepherd no memory) and TCP slows the server down.
//!
//! The pump and the sessions run on different threads; every step of the clock is one
//! lock of its state, and the pump takes a read's mark before it hands on any of its
//! events, so no reader can see them handed on and not counted. One assumption is not
//! the compiler's to keep: an event that reached the socket while Shepherd was
//! descheduled is seen by the [`SocketGauge`] (the kernel's count of unread bytes), so a
//! deadline that fires in the same scheduler turn as the data's arrival waits for it
//! too. Without a gauge (`https://` servers, read through reqwest) a read that ended the
//! pump's wait counts from the wait's start, and that turn is the one window left.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How many reads may be handed on and not handled yet. A read is about the
/// connection's read buffer (64 KiB; past it, no more chunks join the read), so this
/// bounds the actors' backlog to a few megabytes; a bound, not a tuning knob.
pub const MAX_UNHANDLED_READS: usize = 64;

/// What the stream's socket can say about itself.
pub trait SocketGauge: Send + Sync + 'static {
    /// Reads of data from the socket so far.
    fn reads(&self) -> u64;
    /// The latest moment everything sent before it is known to be in the pump's hands
    /// ([`SocketBacklog::proven`]).
    fn proven(&self) -> Option<Instant>;
    /// Bytes the kernel holds unread, if it can be asked.
    fn unread_bytes(&self) -> Option<usize>;
    /// When the buffer was last seen empty, and how many reads since took all they had
    /// room for (for whoever looks into a lag: a proof that waits on a full socket).
    fn last_emptied(&self) -> (Option<Instant>, u64) {
        (None, 0)
    }
}

/// The socket's reads, as a byte count, against the moments its buffer was emptied.
///
/// A read that took less than it had room for emptied the kernel's buffer: the server
/// had nothing more on its way then, so all it sent before that moment ends at the byte
/// read so far. The connection reads the socket only when the pump asks for more, having
/// taken everything read before, so when it reads from beyond that byte, all of it is in
/// the pump's hands. A poll that finds nothing (and a kernel that holds nothing) proves
/// its own moment at once ([`Self::found_nothing`]): it asks from the last byte read.
/// Under steady traffic a moment is proven by the end of the pump's read.
///
/// Only an emptied buffer counts. A buffer that is never empty says nothing of what the
/// server still holds: a Shepherd reading behind fills it, the server's writes wait
/// (TCP's window, the server's own memory), and the kernel's count of unread bytes
/// would make that backlog look handled. Measured: proving moments by the unread count
/// after every read aborted 2,256 working sessions in a CPU-starved 10k run; this rule 0.
#[derive(Debug, Default)]
pub struct SocketBacklog {
    read: u64,
    /// Moments not proven yet: (the byte that ends what was sent before it, the moment),
    /// both ascending.
    pending: std::collections::VecDeque<(u64, Instant)>,
    proven: Option<Instant>,
    /// The latest moment the buffer was seen empty, and the reads since that found more.
    last_emptied: Option<Instant>,
    full_reads: u64,
}

/// Moments kept waiting for proof; past it the oldest is forgotten (a later one proves
/// more anyway).
const PENDING_MOMENTS: usize = 32;

impl SocketBacklog {
    /// The connection polls the socket (it had nothing left for the pump), then took
    /// `bytes` from it (0: none were there).
    pub fn polled(&mut self, bytes: u64) {
        while let Some(&(end, at)) = self.pending.front() {
            if end > self.read {
                break;
            }
            self.proven = Some(at);
            self.pending.pop_front();
        }
        self.read += bytes;
        self.full_reads += 1;
    }

    /// The connection asked for more from the last byte it read (it had handed the pump
    /// everything before it) and the kernel had nothing at `at`: everything sent before
    /// `at` is in the pump's hands now, no later poll needed.
    pub fn found_nothing(&mut self, at: Instant) {
        (self.last_emptied, self.full_reads) = (Some(at), 0);
        self.pending.clear();
        self.proven = self.proven.max(Some(at));
    }

    /// At `at` the kernel's buffer was empty.
    pub fn emptied(&mut self, at: Instant) {
        (self.last_emptied, self.full_reads) = (Some(at), 0);
        let end = self.read;
        match self.pending.back_mut() {
            Some((last, t)) if *last == end => *t = at,
            _ => {
                if self.pending.len() == PENDING_MOMENTS {
                    self.pending.pop_front();
                }
                self.pending.push_back((end, at));
            }
        }
    }

    /// Everything the server sent before this moment is in the pump's hands.
    pub fn proven(&self) -> Option<Instant> {
        self.proven
    }

    /// The latest moment the buffer was seen empty, and the reads since.
    pub fn last_emptied(&self) -> (Option<Instant>, u64) {
        (self.last_emptied, self.full_reads)
    }
}

/// One server's stream time, shared by its pump, the supervisor and its sessions.
pub struct StreamClock {
    state: Mutex<State>,
    reads: Arc<Semaphore>,
}

impl Default for StreamClock {
    fn default() -> Self {
        Self { state: Mutex::new(State::new(Instant::now())), reads: Arc::new(Semaphore::new(MAX_UNHANDLED_READS)) }
    }
}

impl std::fmt::Debug for StreamClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamClock").field("lag", &self.lag(Instant::now())).finish()
    }
}

struct State {
    /// The pump is connected and reading; when not, no event can be waiting (and the
    /// sessions are blind: their silence does not count).
    following: bool,
    /// The pump waits on the stream having read everything it had (`socket_reads`: the
    /// gauge's count then).
    parked: Option<u64>,
    gauge: Option<Arc<dyn SocketGauge>>,
    /// Reads handed on and not reached yet, oldest first: a mark moves stream time only
    /// once every earlier one is dropped too (reads are handled on several threads, and
    /// a later read handled first says nothing of an earlier one). Empty: every read
    /// handed on is handled.
    marks: std::collections::VecDeque<Outstanding>,
    next_mark: u64,
    /// Everything the server sent before this has been handled.
    handled_through: Instant,
    /// Deadlines waiting for stream time to reach them.
    sleepers: BinaryHeap<Reverse<Sleeper>>,
    next_sleeper: u64,
    /// How many deadlines waited for stream time (metrics).
    deferred: u64,
}

impl State {
    fn new(now: Instant) -> Self {
        State {
            following: false,
            parked: None,
            gauge: None,
            marks: std::collections::VecDeque::new(),
            next_mark: 0,
            handled_through: now,
            sleepers: BinaryHeap::new(),
            next_sleeper: 0,
            deferred: 0,
        }
    }

    /// Stream time at `now`. Caught up now, everything sent before now is handled, and
    /// stays so: the moment is kept (a deadline woken by it is still due when it looks).
    fn stream_now(&mut self, now: Instant) -> Instant {
        if !self.following || self.caught_up() {
            self.handled_through = self.handled_through.max(now);
            now
        } else {
            // Everything the pump took is handled and it holds nothing (it waits on the
            // stream): what the socket has proven is handled too, new data or not.
            if self.parked.is_some() && self.marks.is_empty() {
                if let Some(proven) = self.gauge.as_ref().and_then(|g| g.proven()) {
                    self.handled_through = self.handled_through.max(proven);
                }
            }
            self.handled_through.min(now)
        }
    }

    /// Nothing read is unhandled, the pump waits on the stream, and the socket has
    /// received nothing since the pump last found it empty.
    fn caught_up(&self) -> bool {
        let Some(reads_then) = self.parked else { return false };
        if !self.marks.is_empty() {
            return false;
        }
        match &self.gauge {
            None => true,
            Some(g) => g.reads() == reads_then && g.unread_bytes().unwrap_or(0) == 0,
        }
    }

    /// Wakes every sleeper whose deadline stream time has reached.
    fn wake_due(&mut self, now: Instant) {
        let stream_now = self.stream_now(now);
        while self.sleepers.peek().is_some_and(|Reverse(s)| s.at <= stream_now) {
            if let Some(Reverse(s)) = self.sleepers.pop() {
                let _ = s.wake.send(());
            }
        }
    }
}

/// When the pump parked ([`StreamClock::parked`]).
#[derive(Debug, Clone, Copy)]
pub struct Park {
    at: Instant,
}

struct Sleeper {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Sleeper {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Sleeper {}
impl PartialOrd for Sleeper {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Sleeper {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What holds stream time back ([`StreamClock::behind`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Behind {
    /// How far stream time is behind the wall clock.
    pub lag: std::time::Duration,
    /// The pump is connected and reading.
    pub following: bool,
    /// The pump waits on the stream, having handed on every read.
    pub parked: bool,
    /// Reads handed on whose events are not all handled.
    pub unhandled_reads: usize,
    /// How long ago the oldest of them was handed on.
    pub oldest_unhandled: Option<std::time::Duration>,
    /// Bytes the kernel holds unread, when it can be asked.
    pub unread_bytes: Option<usize>,
    /// How long ago the socket's latest proven moment was.
    pub proven_age: Option<std::time::Duration>,
    /// How long ago the socket was last seen empty.
    pub emptied_age: Option<std::time::Duration>,
    /// The reads since then that left bytes in it (took all they had room for).
    pub full_reads: u64,
}

/// A mark the clock waits for: its read's `through`, and whether it was dropped.
struct Outstanding {
    seq: u64,
    /// When the pump handed the read on.
    taken: Instant,
    through: Option<Instant>,
    dropped: bool,
}

/// A read's mark as its events carry it: the last of them handled drops it.
pub type ReadToken = Arc<Mark>;

/// One read's events, carried by each of them. Dropping it (once they are all handled)
/// moves stream time to the read's `through` — when every earlier mark is dropped too —
/// and frees one of the pump's [`MAX_UNHANDLED_READS`]; dropped unhandled (a mailbox gone
/// at shutdown) it frees it too, so the clock can never stick.
pub struct Mark {
    clock: Arc<StreamClock>,
    seq: u64,
    _read: OwnedSemaphorePermit,
}

impl Mark {
    /// The pump has handed on the read's last event: what the socket proved while the
    /// read went on (chunks that had arrived joined it, each a poll of the socket) is in
    /// this read's events or earlier ones, so the read carries it, not the next one.
    pub fn read_ends(&self) {
        let mut s = self.clock.lock();
        let Some(proven) = s.gauge.as_ref().and_then(|g| g.proven()) else { return };
        if let Some(m) = s.marks.iter_mut().find(|m| m.seq == self.seq) {
            m.through = m.through.max(Some(proven));
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut s = self.clock.lock();
        if let Some(m) = s.marks.iter_mut().find(|m| m.seq == self.seq) {
            m.dropped = true;
        }
        while s.marks.front().is_some_and(|m| m.dropped) {
            if let Some(Outstanding { through: Some(t), .. }) = s.marks.pop_front() {
                s.handled_through = s.handled_through.max(t);
            }
        }
        s.wake_due(now);
    }
}

impl StreamClock {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    // ---- the pump's side ----

    /// A connection is open; `gauge` watches its socket when it can.
    pub fn connected(&self, gauge: Option<Arc<dyn SocketGauge>>) {
        let mut s = self.lock();
        s.following = true;
        s.parked = None;
        s.gauge = gauge;
        s.handled_through = s.handled_through.max(Instant::now());
    }

    /// The connection is gone: nothing can wait unread (the sessions are blind until
    /// the reconciliation), so stream time is now.
    pub fn disconnected(&self) {
        let now = Instant::now();
        let mut s = self.lock();
        s.following = false;
        s.parked = None;
        s.gauge = None;
        s.wake_due(now);
    }

    /// The pump waits for the next chunk, having handed on everything it had. (The
    /// socket's side needs no look here: the poll that ended the read, finding the socket
    /// empty, proved its moment — [`SocketBacklog::found_nothing`].)
    pub fn parked(&self) -> Park {
        let now = Instant::now();
        let mut s = self.lock();
        s.parked = Some(s.gauge.as_ref().map_or(0, |g| g.reads()));
        s.wake_due(now);
        Park { at: now }
    }

    /// A chunk arrived: the pump reads again.
    pub fn reading(&self) {
        self.lock().parked = None;
    }

    /// Up to when the server's events are in the pump's hands now that it has a chunk
    /// (`park`: the wait the chunk ended, if it did). With a gauge, the socket's proof
    /// ([`SocketBacklog`]); without one, when the pump parked, and nothing for a chunk
    /// that was already waiting.
    pub fn read_through(&self, park: Option<Park>) -> Option<Instant> {
        match &self.lock().gauge {
            Some(g) => g.proven(),
            None => park.map(|p| p.at),
        }
    }

    /// The mark to send behind a read's events; `through` from [`Self::read_through`].
    /// Waits while [`MAX_UNHANDLED_READS`] marks are unhandled (backpressure).
    pub async fn mark(self: &Arc<Self>, through: Option<Instant>) -> Mark {
        let read = Arc::clone(&self.reads).acquire_owned().await.expect("the clock never closes its semaphore");
        let mut s = self.lock();
        let seq = s.next_mark;
        s.next_mark += 1;
        s.marks.push_back(Outstanding { seq, taken: Instant::now(), through, dropped: false });
        Mark { clock: Arc::clone(self), seq, _read: read }
    }

    // ---- the readers' side ----

    /// How far stream time is behind `now` (zero when Shepherd keeps up).
    pub fn lag(&self, now: Instant) -> std::time::Duration {
        let stream_now = self.lock().stream_now(now);
        now.saturating_duration_since(stream_now)
    }

    /// What holds stream time back at `now`, for whoever looks into a lag (the fleet
    /// bench prints it at a stall phase's worst lag). One lock, as [`Self::lag`].
    pub fn behind(&self, now: Instant) -> Behind {
        let mut s = self.lock();
        let stream_now = s.stream_now(now);
        let (emptied, full_reads) = s.gauge.as_ref().map_or((None, 0), |g| g.last_emptied());
        Behind {
            lag: now.saturating_duration_since(stream_now),
            following: s.following,
            parked: s.parked.is_some(),
            unhandled_reads: s.marks.iter().filter(|m| !m.dropped).count(),
            oldest_unhandled: s.marks.iter().find(|m| !m.dropped).map(|m| now.saturating_duration_since(m.taken)),
            unread_bytes: s.gauge.as_ref().and_then(|g| g.unread_bytes()),
            proven_age: s.gauge.as_ref().and_then(|g| g.proven()).map(|p| now.saturating_duration_since(p)),
            emptied_age: emptied.map(|e| now.saturating_duration_since(e)),
            full_reads,
        }
    }

    /// `None` when stream time has reached `deadline`; otherwise a receiver that
    /// resolves once it has (or once the clock is gone).
    pub fn wake_when(&self, deadline: Instant, now: Instant) -> Option<oneshot::Receiver<()>> {
        let mut s = self.lock();
        if s.stream_now(now) >= deadline {
            return None;
        }
        let (wake, woken) = oneshot::channel();
        let seq = s.next_sleeper;
        s.next_sleeper += 1;
        s.deferred += 1;
        s.sleepers.push(Reverse(Sleeper { at: deadline, seq, wake }));
        Some(woken)
    }

    /// How many deadlines have waited for stream time so far.
    pub fn deferred(&self) -> u64 {
        self.lock().deferred
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A socket whose kernel buffer the test fills and the connection reads.
    #[derive(Default)]
    struct FakeSocket {
        reads: AtomicU64,
        backlog: Mutex<SocketBacklog>,
        unread: AtomicUsize,
    }

    impl FakeSocket {
        /// The server sends `bytes`.
        fn arrive(&self, bytes: usize) {
            self.unread.fetch_add(bytes, Ordering::Relaxed);
        }
        /// The connection reads up to `room` bytes; taking less, it empties the buffer.
        fn read(&self, room: usize) {
            let took = self.unread.load(Ordering::Relaxed).min(room);
            self.unread.fetch_sub(took, Ordering::Relaxed);
            self.reads.fetch_add(1, Ordering::Relaxed);
            let mut b = self.backlog.lock().unwrap();
            b.polled(took as u64);
            match took {
                0 => b.found_nothing(Instant::now()),
                _ if took < room => b.emptied(Instant::now()),
                _ => {}
            }
        }
    }

    impl SocketGauge for FakeSocket {
        fn reads(&self) -> u64 {
            self.reads.load(Ordering::Relaxed)
        }
        fn proven(&self) -> Option<Instant> {
            self.backlog.lock().unwrap().proven()
        }
        fn unread_bytes(&self) -> Option<usize> {
            Some(self.unread.load(Ordering::Relaxed))
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// The pump waits on the stream, then a chunk ends the wait: its read's mark.
    async fn read_after_waiting(clock: &Arc<StreamClock>) -> Mark {
        let park = clock.parked();
        clock.reading();
        clock.mark(clock.read_through(Some(park))).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_without_a_stream_is_never_behind() {
        let clock = StreamClock::default();
        tokio::time::advance(secs(30)).await;
        let now = Instant::now();
        assert_eq!(clock.lag(now), Duration::ZERO);
        assert!(clock.wake_when(now, now).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_read_is_unhandled_stream_time_stays_where_the_pump_last_caught_up() {
        let clock = Arc::new(StreamClock::default());
        clock.connected(None);
        let t0 = Instant::now();
        let mark = read_after_waiting(&clock).await;
        tokio::time::advance(secs(4)).await;
        clock.parked();
        let now = Instant::now();
        assert_eq!(clock.lag(now), secs(4), "the read's events are not handled yet");
        let woken = clock.wake_when(t0 + secs(2), now).expect("a deadline inside the backlog waits");
        drop(mark);
        assert_eq!(clock.lag(Instant::now()), Duration::ZERO, "handled, and the pump waits on the stream");
        woken.await.expect("woken once handled");
        assert_eq!(clock.deferred(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn reads_that_found_more_already_waiting_do_not_move_stream_time() {
        let clock = Arc::new(StreamClock::default());
        clock.connected(None);
        let t0 = Instant::now();
        let first = read_after_waiting(&clock).await;
        tokio::time::advance(secs(3)).await;
        let behind = clock.mark(clock.read_through(None)).await;
        drop(first);
        drop(behind);
        let now = Instant::now();
        assert_eq!(clock.lag(now), secs(3), "still reading behind: the backlog may hold anything");
        assert!(clock.wake_when(t0 + secs(1), now).is_some());
        assert!(clock.wake_when(t0, now).is_none(), "everything before t0 was handled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_read_handled_first_moves_stream_time_only_once_the_earlier_one_is() {
        let clock = Arc::new(StreamClock::default());
        clock.connected(None);
        let t0 = Instant::now();
        let first = read_after_waiting(&clock).await;
        tokio::time::advance(secs(2)).await;
        let t2 = Instant::now();
        let second = read_after_waiting(&clock).await;
        tokio::time::advance(secs(2)).await;
        // The second read's sessions live on another thread and got through theirs first.
        drop(second);
        let now = Instant::now();
        assert_eq!(clock.lag(now), secs(4), "the first read's events still wait");
        assert!(clock.wake_when(t0 + secs(1), now).is_some());
        drop(first);
        assert_eq!(clock.lag(Instant::now()), secs(2), "both handled: through the second read's park");
        assert!(clock.wake_when(t2, Instant::now()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn behind_says_which_read_holds_stream_time_and_what_the_socket_holds() {
        let socket = Arc::new(FakeSocket::default());
        let clock = Arc::new(StreamClock::default());
        clock.connected(Some(socket.clone()));
        socket.arrive(100);
        socket.read(1000);
        let first = read_after_waiting(&clock).await;
        tokio::time::advance(secs(2)).await;
        let second = read_after_waiting(&clock).await;
        tokio::time::advance(secs(1)).await;
        drop(second);
        socket.arrive(700);
        clock.parked();
        let b = clock.behind(Instant::now());
        assert!(b.following && b.parked);
        assert_eq!(b.unhandled_reads, 1, "the second read is handled, the first is not");
        assert_eq!(b.oldest_unhandled, Some(secs(3)), "the first read was handed on 3 s ago");
        assert_eq!(b.unread_bytes, Some(700));
        assert_eq!(b.lag, clock.lag(Instant::now()));
        assert!(b.lag >= secs(3), "nothing since the first read counts as handled: {:?}", b.lag);
        drop(first);
        let b = clock.behind(Instant::now());
        assert_eq!((b.unhandled_reads, b.oldest_unhandled), (0, None));
    }

    #[tokio::test(start_paused = true)]
    async fn data_the_socket_received_after_the_pump_parked_is_not_silence() {
        let socket = Arc::new(FakeSocket::default());
        let clock = Arc::new(StreamClock::default());
        clock.connected(Some(socket.clone()));
        clock.parked();
        tokio::time::advance(secs(2)).await;
        assert_eq!(clock.lag(Instant::now()), Duration::ZERO, "parked on an empty socket: caught up");
        // The kernel holds bytes nobody has read yet.
        socket.arrive(100);
        tokio::time::advance(secs(1)).await;
        assert_eq!(clock.lag(Instant::now()), secs(1), "behind since it was last seen caught up");
        // The connection read them; the pump has not had them.
        socket.read(1000);
        tokio::time::advance(secs(1)).await;
        assert_eq!(clock.lag(Instant::now()), secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_socket_is_proof_once_the_connection_reads_past_it_a_full_one_never() {
        let socket = Arc::new(FakeSocket::default());
        let clock = Arc::new(StreamClock::default());
        clock.connected(Some(socket.clone()));
        socket.arrive(150);
        tokio::time::advance(secs(1)).await;
        socket.read(100); // full: the server may hold more
        socket.read(100); // at 1 s: took 50 of 100, the buffer is empty
        tokio::time::advance(secs(1)).await;
        // The chunk came before the connection polled again: it may still hold some.
        drop(clock.mark(clock.read_through(None)).await);
        assert_eq!(clock.lag(Instant::now()), secs(2), "nothing proven since the connect");
        socket.arrive(500);
        socket.read(100); // polls from byte 150: what was sent before 1 s is in the pump's hands
        drop(clock.mark(clock.read_through(None)).await);
        assert_eq!(clock.lag(Instant::now()), secs(1), "through 1 s");
        // Reading behind: every read full, the buffer never empty, nothing newer proven.
        for _ in 0..4 {
            tokio::time::advance(secs(1)).await;
            socket.arrive(100);
            socket.read(100);
            drop(clock.mark(clock.read_through(None)).await);
        }
        assert_eq!(clock.lag(Instant::now()), secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn with_everything_handled_new_data_waits_behind_what_the_socket_proved() {
        let socket = Arc::new(FakeSocket::default());
        let clock = Arc::new(StreamClock::default());
        clock.connected(Some(socket.clone()));
        tokio::time::advance(secs(1)).await;
        socket.arrive(50);
        socket.read(100); // at 1 s: the buffer emptied
        clock.reading();
        drop(clock.mark(clock.read_through(None)).await); // nothing proven yet at that chunk
        clock.parked();
        tokio::time::advance(secs(1)).await;
        socket.arrive(500); // the next burst, read by the connection, not yet the pump's
        socket.read(100); // polls from beyond byte 50: 1 s proven
        assert_eq!(clock.lag(Instant::now()), secs(1), "behind the new data, not behind the last burst");
        clock.reading();
        let unhandled = clock.mark(clock.read_through(None)).await;
        tokio::time::advance(secs(1)).await;
        assert_eq!(clock.lag(Instant::now()), secs(2), "a read in the pump's hands holds it back");
        drop(unhandled);
    }

    /// Measured in the fleet bench: a read's events carried the proof from the read's
    /// start (often the pump's park, before the data came), so stream time trailed each
    /// read by the wait before it — 2–5 ms of a 10-ms stall budget.
    #[tokio::test(start_paused = true)]
    async fn a_read_carries_what_the_socket_proved_while_it_went_on() {
        let socket = Arc::new(FakeSocket::default());
        let clock = Arc::new(StreamClock::default());
        clock.connected(Some(socket.clone()));
        let park = clock.parked();
        tokio::time::advance(secs(1)).await;
        socket.arrive(50);
        socket.read(100); // the wait ends at 1 s: a short read
        clock.reading();
        let read = clock.mark(clock.read_through(Some(park))).await;
        tokio::time::advance(secs(1)).await; // its events handed on
        socket.read(100); // at 2 s: nothing more, the read ends
        read.read_ends();
        socket.arrive(500); // the next burst: the pump reads on, not waiting
        socket.read(100);
        clock.reading();
        let next = clock.mark(clock.read_through(None)).await;
        tokio::time::advance(secs(1)).await;
        drop(read);
        assert_eq!(clock.lag(Instant::now()), secs(1), "handled through the end of its read at 2 s");
        drop(next);
    }

    #[test]
    fn a_poll_that_finds_nothing_proves_its_own_moment() {
        let t = Instant::now();
        let mut b = SocketBacklog::default();
        b.polled(10);
        b.emptied(t);
        b.polled(0);
        b.found_nothing(t + secs(1)); // asked from byte 10, everything before it handed on
        assert_eq!(b.proven(), Some(t + secs(1)));
        b.polled(5);
        b.emptied(t + secs(2));
        assert_eq!(b.proven(), Some(t + secs(1)), "byte 15 may still be in the connection's buffer");
    }

    #[test]
    fn a_moment_is_proven_only_by_a_poll_from_beyond_its_last_byte() {
        let t = Instant::now();
        let mut b = SocketBacklog::default();
        b.polled(10);
        b.emptied(t); // sent before t ends at byte 10
        b.polled(0); // from byte 10, found nothing
        assert_eq!(b.proven(), Some(t));
        b.polled(5);
        b.emptied(t + secs(1)); // ends at byte 15
        b.emptied(t + secs(2)); // still empty a second later: the stronger moment
        assert_eq!(b.proven(), Some(t), "byte 15 may still be in the connection's buffer");
        b.polled(7); // from byte 15
        assert_eq!(b.proven(), Some(t + secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_pump_stops_reading_while_too_many_reads_are_unhandled() {
        let clock = Arc::new(StreamClock::default());
        clock.connected(None);
        let mut marks = Vec::new();
        for _ in 0..MAX_UNHANDLED_READS {
            marks.push(clock.mark(None).await);
        }
        let next = clock.mark(None);
        tokio::pin!(next);
        assert!(futures::FutureExt::now_or_never(&mut next).is_none(), "waits for the actors");
        marks.remove(0);
        assert!(futures::FutureExt::now_or_never(&mut next).is_some(), "one handled: one more read");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_wakes_every_waiting_deadline() {
        let clock = Arc::new(StreamClock::default());
        clock.connected(None);
        let _unhandled = clock.mark(None).await;
        tokio::time::advance(secs(3)).await;
        let now = Instant::now();
        let woken = clock.wake_when(now, now).expect("behind");
        clock.disconnected();
        woken.await.expect("woken: the sessions are blind now, their clocks decide");
    }
}
