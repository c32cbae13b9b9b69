//! Reconciliation: the stream replays nothing, so after every (re)connect, and at each
//! discovery interval, a server's sessions and statuses are read by REST and the actors
//! brought in line. A reading older than the stream's last change, or than what the
//! stream said since about a session, is not applied.

use super::*;

impl Supervisor {
    /// Lists sessions and statuses by REST and brings the actors in line. After a
    /// (re)connect (`after_connect`) todo lists are re-read too, since their events may
    /// have been missed; periodic discovery skips that.
    pub(super) fn reconcile(&mut self, server: &str, after_connect: bool, ctx: &mut Context<Self>) {
        let Some(srv) = self.servers.get_mut(server) else { return };
        if !after_connect {
            srv.surveying = true;
        }
        let engine = Arc::clone(&srv.env.engine);
        let limit = srv.list_limit;
        let directories = srv.directories.clone();
        let read_windows = srv.windows_stale;
        let (epoch, routed) = (srv.epoch, srv.registry.routed());
        let server = server.to_string();
        let (ledger, now_ms) = (Arc::clone(&self.ledger), self.clock.wall_ms());
        let work = async move {
            // Read before the listing, so that nothing the listing shows is older.
            let unwatched_since = match after_connect {
                true => unwatched_since(&*ledger, &server, now_ms).await,
                false => None,
            };
            let survey = survey(&*engine, &*engine, limit, directories, read_windows, after_connect).await;
            Reconciled { server, survey, after_connect, epoch, routed, unwatched_since }
        };
        ctx.spawn(work.into_actor(self).map(|r, act, ctx| act.apply_reconciliation(r, ctx)));
    }

    fn apply_reconciliation(&mut self, r: Reconciled, ctx: &mut Context<Self>) {
        let Some(srv) = self.servers.get_mut(&r.server) else { return };
        if !r.after_connect {
            srv.surveying = false;
        }
        if r.epoch != srv.epoch || (srv.blind && !r.after_connect) {
            // The stream went down or came back while this was read: the server it
            // describes is gone, and the reconnect reconciles afresh. A periodic read
            // while blind would mark idle, without checking for a cut-off turn, sessions
            // that the reconnect's own reconciliation checks.
            tracing::debug!(server = %r.server, after_connect = r.after_connect, "reconcile: dropped a reading from before the stream's last change");
            return;
        }
        let mut failed = r.survey.listed.is_err();
        match (r.survey.windows, self.servers.get_mut(&r.server)) {
            (Some(Ok(windows)), Some(srv)) => {
                srv.env.windows.replace(windows);
                srv.windows_stale = false;
            }
            (Some(Err(e)), _) => {
                // A booting OpenCode may answer its stream before its config: retried below.
                tracing::warn!(server = %r.server, error = %e, "could not read the models' context windows");
                failed = true;
            }
            _ => {}
        }
        let infos: HashMap<String, SessionInfo> = match r.survey.listed {
            Ok(list) => list.into_iter().map(|i| (i.id.clone(), i)).collect(),
            Err(e) => {
                tracing::warn!(server = %r.server, error = %e, "reconcile: could not list sessions");
                HashMap::new()
            }
        };
        let registry = self.registry(&r.server);
        // One look at a listed session's slot, all a reading needs of it at once.
        let slot_now = |id: &str| registry.as_ref().and_then(|reg| reg.slots.get(id).map(|slot| SlotNow::of(&slot, r.routed)));
        let mut busy_ids = HashSet::new();
        let mut checked_dirs = HashSet::new();
        let statuses_read = r.survey.statuses.iter().all(|(_, result)| result.is_ok());
        for (dir, result) in r.survey.statuses {
            let map = match result {
                Ok(map) => map,
                Err(e) => {
                    tracing::warn!(server = %r.server, directory = %dir, error = %e, "reconcile: could not read statuses");
                    failed = true;
                    continue;
                }
            };
            if let Some(srv) = self.servers.get_mut(&r.server) {
                srv.learn_directory(&dir, self.fleet.max_directories, &r.server);
            }
            checked_dirs.insert(dir.clone());
            for (id, status) in map {
                busy_ids.insert(id.clone());
                // One look at the session's slot (at 10,000 busy sessions three cost
                // the supervisor's thread 15–20 ms).
                let slot = slot_now(&id);
                if slot.as_ref().is_some_and(|s| s.heard_since) {
                    continue; // the stream spoke of it after the statuses were asked for
                }
                // A periodic reading tells a session that knows it is busy nothing: at
                // 10,000 busy sessions the messages kept the sessions' thread (and
                // stream time) ~50 ms behind.
                let knows = !r.after_connect && status == Status::Busy && slot.as_ref().is_some_and(|s| s.thinks_busy);
                let addr = match slot.and_then(|s| s.ready) {
                    Some(addr) => Some(addr),
                    None => self.session(&r.server, &id, infos.get(&id), Some(&dir), ctx),
                };
                if let (Some(addr), false) = (addr, knows) {
                    addr.do_send(Observe(Event::SessionStatus { session_id: id, status }));
                }
            }
        }
        // Questions and permission requests asked while the stream was down: their
        // sessions wait on the person (busy and silent by design) and must not be taken
        // for stalled. A session the stream spoke of since the reading began keeps the
        // stream's word (the ask may have been answered meanwhile).
        for (dir, result) in r.survey.asks {
            let asks = match result {
                Ok(asks) => asks,
                Err(e) => {
                    tracing::warn!(server = %r.server, directory = %dir, error = %e, "reconcile: could not read what sessions wait on the person for");
                    failed = true;
                    continue;
                }
            };
            for ask in asks {
                let Some(id) = ask.session_id().filter(|id| busy_ids.contains(*id)) else { continue };
                let slot = slot_now(id);
                if let Some(addr) = slot.filter(|s| !s.heard_since).and_then(|s| s.ready) {
                    tracing::info!(server = %r.server, session = %id, kind = ask.kind(), "reconcile: waits on the person (asked while the stream was down)");
                    addr.do_send(Observe(ask));
                }
            }
        }
        // Tracked sessions of a checked directory that the status endpoint left out
        // are idle now (their idle event may have been lost while disconnected). The
        // registry's shards are only read here (the pump waits on them); the actors
        // are told after. After a connect every tracked session is looked at; a
        // periodic reading looks only at those whose actor does not think them idle
        // (`NotIdle`): an idle session — most of the fleet — costs nothing here.
        let mut told = Vec::new();
        let mut consider = |slot: &SessionSlot, id: &str| {
            // What the slot says alone decides first, as if its directory were checked
            // (a session outside them is never told).
            let known = LeftOut {
                heard_since: slot.last_event > r.routed,
                in_checked_directory: true,
                after_connect: r.after_connect,
                thinks_idle: slot.view.thinks_idle(),
            };
            if !known.is_told_idle() || busy_ids.contains(id) {
                return;
            }
            let in_checked_directory = slot
                .directory
                .as_deref()
                .or_else(|| infos.get(id).and_then(|i| i.directory.as_deref()))
                .is_some_and(|d| checked_dirs.contains(d));
            if (LeftOut { in_checked_directory, ..known }).is_told_idle() {
                told.push((Addr::clone(&slot.addr), id.to_string()));
            }
        };
        if let Some(reg) = &registry {
            if r.after_connect {
                for slot in reg.slots.iter() {
                    consider(&slot, slot.key());
                }
            } else {
                for id in reg.not_idle.ids() {
                    if let Some(slot) = reg.slots.get(&*id) {
                        consider(&slot, &id);
                    }
                }
            }
        }
        for (addr, id) in told {
            // The pass took a while: a session the stream spoke of meanwhile keeps its
            // word (checked again right before it is told, as in the pass).
            if registry.as_ref().is_some_and(|reg| reg.slots.get(id.as_str()).is_some_and(|s| s.last_event > r.routed)) {
                continue;
            }
            if r.after_connect {
                addr.do_send(CheckInterrupted);
            }
            addr.do_send(Observe(Event::SessionStatus { session_id: id, status: Status::Idle }));
        }
        // Sessions without an actor that were updated while nobody watched (Shepherd was
        // down, or the stream): a turn ended unseen, which left them idle — with open
        // todos, say, and no idle edge to come. Each gets its actor, which catches up below.
        let mut caught_up = 0usize;
        if let (true, Some(since)) = (r.after_connect, r.unwatched_since) {
            for info in infos.values() {
                let moved = info.parent_id.is_none() && info.time.updated.is_some_and(|u| u >= since);
                let tracked = registry.as_ref().is_some_and(|reg| reg.slots.get(info.id.as_str()).is_some_and(|s| s.addr.connected()));
                if !moved || tracked || busy_ids.contains(&info.id) {
                    continue;
                }
                tracing::info!(server = %r.server, session = %info.id, updated_ms = info.time.updated, unwatched_since_ms = since, "updated while nobody watched: tracking it to catch up");
                self.session(&r.server, &info.id, Some(info), info.directory.as_deref(), ctx);
                caught_up += 1;
            }
        }
        // Todo events may have been missed while disconnected: each session re-reads its
        // list if its listing says a turn may have changed it.
        if r.after_connect {
            for slot in registry.iter().flat_map(|reg| reg.slots.iter()) {
                let listed_updated_ms = infos.get(slot.key().as_ref()).and_then(|i| i.time.updated);
                slot.addr.do_send(RefreshTodos { listed_updated_ms, unwatched_since: r.unwatched_since });
            }
        }
        // Every status is known again and every interrupted turn checked (the messages
        // above are ahead of this one in each actor's mailbox): silence counts from now.
        if r.after_connect && statuses_read {
            self.regain_sight(&r.server);
        }
        if let Some(srv) = self.servers.get_mut(&r.server) {
            if failed {
                // Try again soon (what was read is applied; the rest is not lost).
                let delay = srv.retry_next;
                srv.retry_next = (srv.retry_next * 2).min(srv.retry_max);
                let (server, after_connect, epoch) = (r.server.clone(), r.after_connect, r.epoch);
                tracing::info!(server = %server, retry_in_ms = delay.as_millis() as u64, "reconcile incomplete; retrying");
                ctx.run_later(delay, move |act, ctx| {
                    // A reconnect meanwhile started its own reconciliation; a discovery
                    // meanwhile, a reading that answers for this one.
                    let Some(srv) = act.servers.get(&server) else { return };
                    if srv.epoch != epoch {
                        return;
                    }
                    if !after_connect && srv.surveying {
                        tracing::debug!(server = %server, "reconcile retry: a later reading is under way; skipped");
                        return;
                    }
                    act.reconcile(&server, after_connect, ctx);
                });
                return;
            }
            srv.retry_next = srv.retry_initial;
            srv.reconciled = true;
        }
        // After a connect, every event of the server up to now was seen or made up for
        // (later, the mark's own interval records it).
        if r.after_connect {
            self.record_watched(&r.server, ctx);
        }
        tracing::info!(server = %r.server, directories = checked_dirs.len(), busy = busy_ids.len(), caught_up, "reconciled after stream connect");
    }
}

impl Supervisor {
    /// Records in the ledger that `server`'s stream was watched until now: after a
    /// restart, or when it next comes back, what its sessions did since is looked for
    /// ([`unwatched_since`]). Written once a connect's reading is complete, every
    /// [`WATCH_MARK_INTERVAL`], when the stream goes down, and at shutdown.
    pub(super) fn record_watched(&self, server: &str, ctx: &mut Context<Self>) {
        let (ledger, server, now_ms) = (Arc::clone(&self.ledger), server.to_string(), self.clock.wall_ms());
        ctx.spawn(async move { mark_watched(&*ledger, &server, now_ms).await }.into_actor(self));
    }

    /// The servers whose every event was seen: connected and reconciled, not blind.
    pub(super) fn watched_servers(&self) -> Vec<String> {
        self.servers.iter().filter(|(_, s)| s.reconciled && !s.blind).map(|(name, _)| name.clone()).collect()
    }

    /// After an outage: the server's sessions count silence from now.
    fn regain_sight(&mut self, server: &str) {
        let Some(srv) = self.servers.get_mut(server) else { return };
        if !srv.blind {
            return;
        }
        srv.blind = false;
        for slot in srv.registry.slots.iter() {
            slot.addr.do_send(Sighted);
        }
    }
}

/// How often a watched server's "watched until" is recorded while all is well: after a
/// crash, a restart catches up with sessions updated since — the last few seconds
/// Shepherd did see included (their follow-ups are decided again from the ledger's
/// state; a nudge only armed in memory when it crashed is not lost).
pub(super) const WATCH_MARK_INTERVAL: Duration = Duration::from_secs(10);

/// How much earlier than the ledger's "watched until" a session's `time.updated` still
/// counts as unseen: OpenCode stamps it with its own clock, Shepherd the other with its.
const CLOCK_MARGIN_MS: i64 = 5_000;

/// How far back a restart catches up with sessions no actor tracks: a turn that ended
/// longer ago than this while nobody watched is left to the person (after a long
/// shutdown, a nudge for it would be news to no one, and there may be many).
const CATCH_UP_LOOKBACK_MS: i64 = 60 * 60 * 1000;

/// Records that `server`'s stream was watched until `now_ms` (a failure is logged: the
/// older mark stays, and a restart catches up a little more than it needs to).
pub(super) async fn mark_watched(ledger: &dyn Ledger, server: &str, now_ms: i64) {
    if let Err(e) = ledger.set_watched_until(server, now_ms).await {
        tracing::warn!(server = %server, error = %e, "ledger: could not record until when the stream was watched");
    }
}

/// Since when nobody watched `server`'s stream, as far as the ledger knows, less
/// [`CLOCK_MARGIN_MS`] and at most [`CATCH_UP_LOOKBACK_MS`] before `now_ms`; `None` on a
/// first start (or when the ledger cannot say: nothing is caught up then).
async fn unwatched_since(ledger: &dyn Ledger, server: &str, now_ms: i64) -> Option<i64> {
    match ledger.watched_until(server).await {
        Ok(until) => until.map(|until| (until - CLOCK_MARGIN_MS).max(now_ms - CATCH_UP_LOOKBACK_MS)),
        Err(e) => {
            tracing::warn!(server = %server, error = %e, "ledger: could not read until when the stream was watched; sessions updated meanwhile are not caught up");
            None
        }
    }
}

/// What a reading of the statuses needs of a listed session's slot, read at once.
struct SlotNow {
    /// The stream spoke of it after the statuses were asked for: its word is newer.
    heard_since: bool,
    /// Its actor knows it busy (`DetailCell::thinks_busy`).
    thinks_busy: bool,
    /// Its actor, when it runs and its directory is known (otherwise
    /// `Supervisor::session` starts one or notes the directory).
    ready: Option<Addr<SessionActor>>,
}

impl SlotNow {
    fn of(slot: &SessionSlot, routed: u64) -> Self {
        SlotNow {
            heard_since: slot.last_event > routed,
            thinks_busy: slot.view.thinks_busy(),
            ready: (slot.addr.connected() && slot.directory.is_some()).then(|| Addr::clone(&slot.addr)),
        }
    }
}

/// A tracked session that a reading of its directory's statuses left out (not busy).
#[derive(Debug, Clone, Copy)]
struct LeftOut {
    /// The stream spoke of it after the statuses were asked for: its word is newer.
    heard_since: bool,
    /// Its directory is one whose statuses were read.
    in_checked_directory: bool,
    /// The reading follows a (re)connect: events may have been lost meanwhile.
    after_connect: bool,
    /// Its actor knows it idle (`DetailCell::thinks_idle`).
    thinks_idle: bool,
}

impl LeftOut {
    /// Whether the session is told it is idle. After a reconnect every such session is
    /// (its idle event may have been lost, and its cut-off turn is checked). A periodic
    /// reading tells only those that think they are busy: an idle one already knows,
    /// and telling it anyway woke every idle session of the fleet each discovery
    /// interval — at 100,000 sessions ninety thousand messages at once, the sessions'
    /// thread then a tenth of a second behind the stream.
    fn is_told_idle(self) -> bool {
        !self.heard_since && self.in_checked_directory && (self.after_connect || !self.thinks_idle)
    }
}

/// What a reconciliation reads of one server: what it holds (its sessions; its models'
/// windows when `read_windows`) and the statuses of every directory known — those in
/// `directories` and those of the sessions listed.
async fn survey(
    discovery: &dyn Discovery,
    reads: &dyn Reads,
    limit: u32,
    mut directories: HashSet<String>,
    read_windows: bool,
    after_connect: bool,
) -> Survey {
    let windows = if read_windows { Some(discovery.model_windows().await) } else { None };
    let listed = discovery.list_sessions(limit).await;
    if let Ok(infos) = &listed {
        directories.extend(infos.iter().filter_map(|i| i.directory.clone()));
    }
    let mut statuses = Vec::new();
    let mut asks = Vec::new();
    for dir in directories {
        let result = reads.statuses(&dir).await;
        // After a connect, where a session is busy: what it may wait on the person for,
        // asked while the stream was down (read after the statuses: an ask listed here
        // belongs to a session that was busy when they were read).
        if after_connect && result.as_ref().is_ok_and(|busy| !busy.is_empty()) {
            asks.push((dir.clone(), discovery.pending_asks(&dir).await));
        }
        statuses.push((dir, result));
    }
    Survey { windows, listed, statuses, asks }
}

/// One server as [`survey`] read it.
struct Survey {
    /// `None` when the windows were not due for a read.
    windows: Option<Result<HashMap<String, u64>, EngineError>>,
    listed: Result<Vec<SessionInfo>, EngineError>,
    statuses: Vec<DirectoryStatuses>,
    /// After a connect, per directory with a busy session: its pending asks, as events.
    asks: Vec<(String, Result<Vec<Event>, EngineError>)>,
}

/// The statuses of one directory, or why they could not be read.
type DirectoryStatuses = (String, Result<HashMap<String, Status>, EngineError>);

/// A survey of one server, with what the supervisor needs to apply it.
struct Reconciled {
    server: String,
    after_connect: bool,
    survey: Survey,
    /// The server's [`Server::epoch`] when the reading started.
    epoch: u64,
    /// [`Supervisor::routed`] when the reading started.
    routed: u64,
    /// After a connect: since when nobody watched the stream, if known ([`unwatched_since`]).
    unwatched_since: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::LeftOut;

    /// Periodic discovery leaves idle sessions alone (no message, no wake-up); a session
    /// that thinks it is busy is told, and after a reconnect every session left out is.
    #[test]
    fn a_periodic_reading_tells_only_the_sessions_that_think_they_are_busy() {
        let left_out = |after_connect, thinks_idle| LeftOut {
            heard_since: false,
            in_checked_directory: true,
            after_connect,
            thinks_idle,
        };
        assert!(!left_out(false, true).is_told_idle(), "periodic, idle already: left alone");
        assert!(left_out(false, false).is_told_idle(), "periodic, thinks busy: told");
        assert!(left_out(true, true).is_told_idle(), "after a reconnect: told, idle or not");
        assert!(left_out(true, false).is_told_idle());
        let newer = LeftOut { heard_since: true, ..left_out(true, false) };
        assert!(!newer.is_told_idle(), "the stream's word is newer than the reading");
        let elsewhere = LeftOut { in_checked_directory: false, ..left_out(true, false) };
        assert!(!elsewhere.is_told_idle(), "its directory was not read");
    }
}
