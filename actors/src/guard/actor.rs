//! The global guard actor and the handle the decision path calls.
//!
//! The actor owns this instance's dedupe memory and its `governor` rate limiters (per
//! session, and global when no shared store is configured); one actor for the whole
//! daemon, so two sessions' prompts — or two procedures of one session — never race past
//! each other. The [`GuardHandle`] is the [`PromptGuard`] port: it asks the actor, waits
//! (bounded, outside the actor) when a prompt is over a limit, and consults the
//! [`Shared`] store (leases it renews while it waits, the fleet-wide limit — or the
//! actor's local fallback for it while the store is unreachable — and fingerprint
//! claims) when there is one. The limiters run on the [`Clock`] port's time.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use governor::clock::Clock as _;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::config::GuardConfig;
use crate::guard::dedupe::{Check, Dedupe};
use crate::guard::similarity::Shingles;
use crate::guard::{GuardRequest, Lease, PromptGuard, Shared, Verdict};
use crate::ports::Clock;
// The core's types, not the session actor's module: the session's delivery asks the
// guard, so the guard knows only the pure half.
use shepherd_core::session::core::Now;
use shepherd_core::session::effect::PromptKind;

type SessionLimiter =
    RateLimiter<(String, String), DefaultKeyedStateStore<(String, String)>, LimiterClock, NoOpMiddleware<Duration>>;
type GlobalLimiter = RateLimiter<NotKeyed, InMemoryState, LimiterClock, NoOpMiddleware<Duration>>;

/// The limiters' time: the [`Clock`] port's monotonic time since the guard started, so
/// paused tokio time drives the rate limits as it drives every other timer.
#[derive(Clone)]
struct LimiterClock {
    clock: Arc<dyn Clock>,
    origin: tokio::time::Instant,
}

impl governor::clock::Clock for LimiterClock {
    type Instant = Duration;

    fn now(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.origin)
    }
}

/// The global guard actor.
pub struct GuardActor {
    cfg: GuardConfig,
    clock: Arc<dyn Clock>,
    dedupe: Dedupe,
    limiter_clock: LimiterClock,
    per_session: SessionLimiter,
    /// `None` when the fleet-wide limit lives in the shared store.
    global: Option<GlobalLimiter>,
    /// This instance's share of the fleet-wide limit while the shared store is
    /// unreachable (`guard.fallback_per_minute`, `fallback_burst`).
    fallback: GlobalLimiter,
    pruning: Option<SpawnHandle>,
}

/// `n` per minute with bursts of `burst` (validated non-zero; 1 if not).
fn quota(n: u32, burst: u32) -> Quota {
    let nz = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
    Quota::per_minute(nz(n)).allow_burst(nz(burst))
}

fn session_limiter(cfg: &GuardConfig, clock: &LimiterClock) -> SessionLimiter {
    RateLimiter::new(quota(cfg.session_per_minute, cfg.session_burst), DefaultKeyedStateStore::default(), clock.clone())
}

fn fallback_limiter(cfg: &GuardConfig, clock: &LimiterClock) -> GlobalLimiter {
    RateLimiter::new(quota(cfg.fallback_per_minute, cfg.fallback_burst), InMemoryState::default(), clock.clone())
}

fn global_limiter(cfg: &GuardConfig, clock: &LimiterClock) -> GlobalLimiter {
    RateLimiter::new(quota(cfg.global_per_minute, cfg.global_burst), InMemoryState::default(), clock.clone())
}

impl GuardActor {
    pub fn new(cfg: GuardConfig, clock: Arc<dyn Clock>, shared_global: bool) -> GuardActor {
        let limiter_clock = LimiterClock { clock: Arc::clone(&clock), origin: clock.now() };
        GuardActor {
            pruning: None,
            dedupe: Dedupe::new(cfg.window, cfg.similarity, cfg.shingle_words),
            per_session: session_limiter(&cfg, &limiter_clock),
            global: (!shared_global).then(|| global_limiter(&cfg, &limiter_clock)),
            fallback: fallback_limiter(&cfg, &limiter_clock),
            limiter_clock,
            clock,
            cfg,
        }
    }

    fn now(&self) -> Now {
        Now { mono: self.clock.now(), wall_ms: self.clock.wall_ms() }
    }
}

impl Actor for GuardActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.arm_pruning(ctx);
    }
}

impl GuardActor {
    /// Memory stays bounded by one window's prompts.
    fn arm_pruning(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.pruning.take() {
            ctx.cancel_future(handle);
        }
        self.pruning = Some(ctx.run_interval(self.cfg.window.max(Duration::from_secs(1)), |act, _| {
            let now = act.now();
            act.dedupe.prune(now);
            act.per_session.retain_recent();
        }));
    }
}

/// New guard settings (hot reload). The dedupe memory is kept; a changed rate limit
/// starts from a full bucket (`governor` quotas are fixed per limiter). The backend
/// cannot change while running.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retune(pub GuardConfig);

impl Handler<Retune> for GuardActor {
    type Result = ();

    fn handle(&mut self, msg: Retune, ctx: &mut Context<Self>) {
        let (old, cfg) = (&self.cfg, msg.0);
        self.dedupe.retune(cfg.window, cfg.similarity, cfg.shingle_words);
        if (old.session_per_minute, old.session_burst) != (cfg.session_per_minute, cfg.session_burst) {
            self.per_session = session_limiter(&cfg, &self.limiter_clock);
        }
        if (old.global_per_minute, old.global_burst) != (cfg.global_per_minute, cfg.global_burst) {
            if let Some(global) = self.global.as_mut() {
                *global = global_limiter(&cfg, &self.limiter_clock);
            }
        }
        if (old.fallback_per_minute, old.fallback_burst) != (cfg.fallback_per_minute, cfg.fallback_burst) {
            self.fallback = fallback_limiter(&cfg, &self.limiter_clock);
        }
        let window_changed = old.window != cfg.window;
        self.cfg = cfg;
        if window_changed {
            self.arm_pruning(ctx);
        }
    }
}

/// Whole milliseconds, rounded up (at least 1): a wait never ends before the permit.
fn ceil_ms(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000) as u64).max(1)
}

/// One step of admission.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Done(Verdict),
    /// Over a limit: ask again in this long.
    Wait {
        ms: u64,
        scope: &'static str,
    },
}

/// Judge a prompt; `skip_limits` once it has waited `max_wait` (a continue is not lost).
#[derive(Message)]
#[rtype(result = "Step")]
pub struct Admit {
    pub req: GuardRequest,
    pub skip_limits: bool,
}

impl Handler<Admit> for GuardActor {
    type Result = MessageResult<Admit>;

    fn handle(&mut self, msg: Admit, _: &mut Context<Self>) -> Self::Result {
        let now = self.now();
        let req = msg.req;
        let shingles = match self.dedupe.check(&req, now) {
            Check::Duplicate { similarity, of } => {
                return MessageResult(Step::Done(Verdict::Duplicate { similarity, of }))
            }
            Check::Fresh(s) => s,
        };
        if !msg.skip_limits {
            let clock = &self.limiter_clock;
            let key = (req.server.clone(), req.session.clone());
            if let Err(not_until) = self.per_session.check_key(&key) {
                let ms = ceil_ms(not_until.wait_time_from(clock.now()));
                return MessageResult(Step::Wait { ms, scope: "session" });
            }
            if let Some(global) = &self.global {
                if let Err(not_until) = global.check() {
                    let ms = ceil_ms(not_until.wait_time_from(clock.now()));
                    return MessageResult(Step::Wait { ms, scope: "global" });
                }
            }
        }
        self.dedupe.remember(&req, shingles, now);
        MessageResult(Step::Done(Verdict::Send { waited_ms: 0, lease: None }))
    }
}

/// One permit of the local fallback for the fleet-wide limit: `None` granted,
/// `Some(ms)` denied, ask again in `ms`.
#[derive(Message)]
#[rtype(result = "Option<u64>")]
pub struct FallbackPermit;

impl Handler<FallbackPermit> for GuardActor {
    type Result = Option<u64>;

    fn handle(&mut self, _: FallbackPermit, _: &mut Context<Self>) -> Option<u64> {
        let clock = &self.limiter_clock;
        self.fallback.check().err().map(|not_until| ceil_ms(not_until.wait_time_from(clock.now())))
    }
}

/// Forget an admitted prompt that was not sent.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub server: String,
    pub session: String,
    pub text: String,
}

impl Handler<Forget> for GuardActor {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Context<Self>) {
        self.dedupe.forget(&msg.server, &msg.session, &msg.text);
    }
}

/// The fingerprint a prompt is claimed under in the shared store.
fn claim_key(text: &str, not_before_ms: Option<i64>, shingle_words: usize) -> u64 {
    let fp = Shingles::of(text, shingle_words).fingerprint();
    fp ^ (not_before_ms.unwrap_or(0) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The [`PromptGuard`] port over the guard actor (and the shared store, if any).
#[derive(Clone)]
pub struct GuardHandle {
    addr: Addr<GuardActor>,
    shared: Option<Arc<dyn Shared>>,
    /// Shared by every clone, so [`GuardHandle::retune`] reaches them all.
    cfg: Arc<std::sync::RwLock<GuardConfig>>,
}

impl GuardHandle {
    /// Starts the guard actor (on the current arbiter).
    pub fn start(cfg: GuardConfig, clock: Arc<dyn Clock>, shared: Option<Arc<dyn Shared>>) -> GuardHandle {
        let addr = GuardActor::new(cfg.clone(), clock, shared.is_some()).start();
        GuardHandle { addr, shared, cfg: Arc::new(std::sync::RwLock::new(cfg)) }
    }

    /// New settings (hot reload) for every prompt judged from now on.
    pub fn retune(&self, cfg: GuardConfig) {
        if let Ok(mut current) = self.cfg.write() {
            *current = cfg.clone();
        }
        self.addr.do_send(Retune(cfg));
    }

    /// The settings in force (a copy: never held across an `await`).
    fn cfg(&self) -> GuardConfig {
        self.cfg.read().map(|c| c.clone()).unwrap_or_default()
    }

    /// Kinds that go out after `max_wait` whatever the limiter says: the continue after
    /// an abort, a person's prompt and the hand-off's prompts must not be lost. Every
    /// other kind (nudge, review, note) waits its turn as long, and is then deferred
    /// ([`Verdict::RateLimited`] with a retry time): its decision tries again later.
    fn forced_after_max_wait(kind: PromptKind) -> bool {
        matches!(kind, PromptKind::Continue | PromptKind::Custom | PromptKind::Handoff)
    }

    async fn ask(&self, req: &GuardRequest, skip_limits: bool) -> Step {
        match self.addr.send(Admit { req: req.clone(), skip_limits }).await {
            Ok(step) => step,
            Err(e) => {
                tracing::warn!(server = %req.server, session = %req.session, error = %e, "guard unavailable: sending (fail open)");
                Step::Done(Verdict::Send { waited_ms: 0, lease: None })
            }
        }
    }
}

impl GuardHandle {
    /// Waits `pause`, in slices no longer than the lease's renewal period, renewing the
    /// lease between them: `Err(holder)` as soon as it is not ours any more.
    async fn wait_holding(&self, req: &GuardRequest, lease: Option<u64>, pause: Duration) -> Result<(), String> {
        let every = self.renew_every().filter(|_| lease.is_some());
        let started = tokio::time::Instant::now();
        loop {
            let left = pause.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok(());
            }
            tokio::time::sleep(every.map_or(left, |e| e.min(left))).await;
            if every.is_some() {
                self.fence(&req.server, &req.session, lease).await?;
            }
        }
    }

    /// The local stand-in for the fleet-wide limit while the shared store is
    /// unreachable: `None` granted, `Some(ms)` denied.
    async fn fallback_permit(&self) -> Option<u64> {
        self.addr.send(FallbackPermit).await.unwrap_or(None)
    }
}

#[async_trait]
impl PromptGuard for GuardHandle {
    async fn admit(&self, req: &GuardRequest) -> Verdict {
        let lease = match req.lease {
            Some(token) => self.fence(&req.server, &req.session, Some(token)).await.map(|()| Some(token)),
            None => self.may_act(&req.server, &req.session).await,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(holder) => return Verdict::NotOurs { holder },
        };
        let cfg = self.cfg();
        let started = tokio::time::Instant::now();
        // Only the time spent waiting for a limit counts as "held", not the round trips.
        let mut waited = Duration::ZERO;
        let forced = Self::forced_after_max_wait(req.kind);
        let mut skip_limits = false;
        loop {
            match self.ask(req, skip_limits).await {
                Step::Done(Verdict::Send { .. }) => break,
                Step::Done(other) => return other,
                Step::Wait { ms, scope } => {
                    let left = cfg.max_wait.saturating_sub(started.elapsed());
                    if left.is_zero() && forced {
                        tracing::warn!(server = %req.server, session = %req.session, scope, waited_ms = waited.as_millis() as u64, "over the rate limit after guard.max_wait: sending so the session is not stranded");
                        skip_limits = true;
                        continue;
                    }
                    if left.is_zero() {
                        return Verdict::RateLimited { scope, retry_after_ms: ms };
                    }
                    let pause = Duration::from_millis(ms).min(left);
                    if let Err(holder) = self.wait_holding(req, lease, pause).await {
                        return Verdict::NotOurs { holder };
                    }
                    waited += pause;
                }
            }
        }
        if let Some(shared) = &self.shared {
            // The fleet-wide limit, shared by every instance; while the store is
            // unreachable, this instance's own share of it (`guard.fallback_*`).
            loop {
                let (scope, ms) = match shared.global_permit(cfg.global_per_minute, cfg.global_burst).await {
                    Ok(None) => break,
                    Ok(Some(ms)) => ("global", ms),
                    Err(e) => {
                        tracing::warn!(error = %e, "guard: shared rate limit unreachable: using this instance's fallback limit");
                        match self.fallback_permit().await {
                            None => break,
                            Some(ms) => ("fallback global", ms),
                        }
                    }
                };
                let left = cfg.max_wait.saturating_sub(started.elapsed());
                if left.is_zero() && forced {
                    break;
                }
                if left.is_zero() {
                    self.forget(&req.server, &req.session, &req.text, req.not_before_ms).await;
                    return Verdict::RateLimited { scope, retry_after_ms: ms };
                }
                let pause = Duration::from_millis(ms).min(left);
                if let Err(holder) = self.wait_holding(req, lease, pause).await {
                    self.forget(&req.server, &req.session, &req.text, req.not_before_ms).await;
                    return Verdict::NotOurs { holder };
                }
                waited += pause;
            }
            // Two instances deciding the same prompt at the same moment: one claim wins.
            // Scoped by `not_before`: a continue after a new abort is a new prompt.
            let fingerprint = claim_key(&req.text, req.not_before_ms, cfg.shingle_words);
            let ttl = cfg.window.as_millis() as u64;
            match shared.claim_fingerprint(&req.server, &req.session, fingerprint, ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    self.forget(&req.server, &req.session, &req.text, req.not_before_ms).await;
                    return Verdict::Duplicate { similarity: 1.0, of: "another Shepherd instance's prompt".into() };
                }
                Err(e) => tracing::warn!(error = %e, "guard: shared fingerprints unreachable: sending (fail open)"),
            }
        }
        Verdict::Send { waited_ms: waited.as_millis() as u64, lease }
    }

    async fn forget(&self, server: &str, session: &str, text: &str, not_before_ms: Option<i64>) {
        self.addr.do_send(Forget { server: server.into(), session: session.into(), text: text.into() });
        if let Some(shared) = &self.shared {
            let fingerprint = claim_key(text, not_before_ms, self.cfg().shingle_words);
            if let Err(e) = shared.release_fingerprint(server, session, fingerprint).await {
                tracing::debug!(error = %e, "guard: could not release a fingerprint (it expires by itself)");
            }
        }
    }

    async fn may_act(&self, server: &str, session: &str) -> Result<Option<u64>, String> {
        let Some(shared) = &self.shared else { return Ok(None) };
        match shared.lease(server, session, self.cfg().lease_ttl.as_millis() as u64).await {
            Ok(Lease::Ours { token }) => Ok(Some(token)),
            Ok(Lease::Theirs { holder }) => Err(holder),
            Err(e) => {
                // Without the store no instance can coordinate; acting beats stranding.
                tracing::warn!(server, session, error = %e, "guard: session lease unreachable: acting (fail open)");
                Ok(None)
            }
        }
    }

    async fn fence(&self, server: &str, session: &str, token: Option<u64>) -> Result<(), String> {
        let (Some(shared), Some(token)) = (&self.shared, token) else { return Ok(()) };
        match shared.renew(server, session, token, self.cfg().lease_ttl.as_millis() as u64).await {
            Ok(None) => Ok(()),
            Ok(Some(holder)) => {
                tracing::warn!(server, session, token, holder = %holder, "guard: the session's lease is not ours any more: this instance stands down");
                Err(holder)
            }
            Err(e) => {
                tracing::warn!(server, session, token, error = %e, "guard: session lease unreachable: going on (fail open)");
                Ok(())
            }
        }
    }

    fn renew_every(&self) -> Option<Duration> {
        self.shared.as_ref().map(|_| self.cfg().lease_ttl / 3)
    }

    fn history_messages(&self) -> u32 {
        self.cfg().history_messages
    }
}
