//! What the fleet looks like: the servers, every session's detail (as each actor
//! published it: [`crate::session::view`]), one session, its journal.

use super::registry::PublishedCell;
use super::*;
use crate::session::Now;

/// How many session actors [`ask`] asks at a time, of those that have published no
/// detail yet (about half a millisecond of work on the actors' thread). Every session's
/// detail is read from the registries without a message to the actors: asking each of
/// 100,000 actors cost their thread over a second and held back their stall timers. A
/// session whose actor is still loading its state has published nothing yet: its actor
/// is asked, and answers once loaded, this many at a time (all at once, every actor
/// would be ready to run together, and a stall timer firing then would wait behind all
/// of them).
const INSPECT_SLICE: usize = 256;

impl Supervisor {
    /// The actor of the tracked session with this id, on whichever server.
    pub(super) fn find(&self, id: &str) -> Option<Addr<SessionActor>> {
        self.servers.values().find_map(|s| s.registry.slots.get(id).map(|slot| Addr::clone(&slot.addr)))
    }
}

/// Asks each of `actors` for its detail, [`INSPECT_SLICE`] at a time, into `out`; then
/// sorts `out` by server and session.
async fn ask(actors: Vec<Addr<SessionActor>>, mut out: Vec<SessionDetail>) -> Vec<SessionDetail> {
    for slice in actors.chunks(INSPECT_SLICE) {
        let asks: Vec<_> = slice.iter().map(|addr| addr.send(Inspect)).collect();
        for ask in asks {
            if let Ok(detail) = ask.await {
                out.push(detail);
            }
        }
    }
    out.sort_by(|a, b| (&a.server, &a.id).cmp(&(&b.server, &b.id)));
    out
}

/// Every tracked session's detail asked of its actor, a message each (what the status
/// reads cost before they read the published details): it returns once every session
/// actor has handled what was sent to it before, so the fleet bench waits on it for a
/// burst to be handled. The answers equal what [`ListSessions`] reads.
#[derive(Message)]
#[rtype(result = "Vec<SessionDetail>")]
pub struct AskSessions;

impl Handler<AskSessions> for Supervisor {
    type Result = ResponseFuture<Vec<SessionDetail>>;

    fn handle(&mut self, _: AskSessions, _: &mut Context<Self>) -> Self::Result {
        let actors = self.actors();
        Box::pin(ask(actors, Vec::new()))
    }
}

/// The fleet as the supervisor sees it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FleetView {
    pub servers: Vec<ServerView>,
    pub sessions: Vec<SessionDetail>,
    /// `shepherd pause --all`, while it lasts.
    pub fleet_pause: Option<crate::ledger::FleetPause>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerView {
    pub name: String,
    pub connected: bool,
    pub reconciled: bool,
    pub events: BTreeMap<String, u64>,
}

#[derive(Message)]
#[rtype(result = "FleetView")]
pub struct InspectFleet;

impl Handler<InspectFleet> for Supervisor {
    type Result = ResponseFuture<FleetView>;

    fn handle(&mut self, _: InspectFleet, _: &mut Context<Self>) -> Self::Result {
        let sources = self.live_sources();
        let fleet_pause = self.fleet_pause.clone();
        Box::pin(async move {
            let servers = sources.servers.clone();
            FleetView { servers, sessions: sources.details().await, fleet_pause }
        })
    }
}

/// What [`LiveSources::read`] answers: the fleet as the status file shows it, the
/// servers and each session's [`LiveSession`](crate::stats::LiveSession), read from the
/// published details without copying them whole (at 100,000 sessions the full details
/// of [`InspectFleet`] cost over half a second a refresh). Unsorted.
#[derive(Debug, Default)]
pub struct LiveView {
    pub servers: Vec<ServerView>,
    pub sessions: Vec<crate::stats::LiveSession>,
    /// The whole fleet is paused (`shepherd pause --all`).
    pub fleet_paused: bool,
}

/// The fleet as the status file shows it ([`LiveView`]), read on the supervisor's thread
/// in slices ([`LiveSources::read`]). The status file's writer asks this: its own
/// thread runs niced, and a reader preempted while it holds a registry shard's lock
/// holds up the pump waiting on it.
#[derive(Message)]
#[rtype(result = "LiveView")]
pub struct InspectLive;

impl Handler<InspectLive> for Supervisor {
    type Result = ResponseFuture<LiveView>;

    fn handle(&mut self, _: InspectLive, _: &mut Context<Self>) -> Self::Result {
        Box::pin(self.live_sources().read())
    }
}

/// How many sessions [`LiveSources::read`] reads between two yields (about 5 ms of
/// work at 100,000 sessions; the guard, on the supervisor's thread, waits that long at
/// most).
const LIVE_SLICE: usize = 4096;

/// Where the fleet's [`LiveView`] is read from, handed to the asker to read on its own
/// thread ([`LiveSources::read`]): at 100,000 sessions reading every published detail
/// takes 120 ms, which the supervisor's thread — the guard's (a recovery's "may I
/// act?") — is spared. The metrics' scrape, on the control API's thread, asks this.
#[derive(Message)]
#[rtype(result = "LiveSources")]
pub struct InspectLiveSources;

/// The servers as they are now, and each server's registry of sessions to read.
pub struct LiveSources {
    servers: Vec<ServerView>,
    registries: Vec<(Arc<SessionEnv>, Arc<Registry>)>,
    fleet_paused: bool,
}

impl LiveSources {
    /// Every tracked session's [`LiveSession`](crate::stats::LiveSession), read from the
    /// registries now, on the caller's thread ([`LiveSources::sliced`]). Unsorted.
    pub async fn read(self) -> LiveView {
        let (mut sessions, unpublished) = self.sliced(Registry::live_of).await;
        for detail in ask(unpublished, Vec::new()).await {
            sessions.push(crate::stats::LiveSession::from(&detail));
        }
        LiveView { servers: self.servers, sessions, fleet_paused: self.fleet_paused }
    }

    /// Every tracked session's full detail (todo lists and all), read like
    /// [`LiveSources::read`] and sorted by server and session: `GET /v1/sessions`.
    pub async fn details(self) -> Vec<SessionDetail> {
        let (details, unpublished) = self.sliced(Registry::details_of).await;
        ask(unpublished, details).await
    }

    /// What `read` makes of every session's published detail, on the caller's thread;
    /// the actors of sessions that have published nothing yet (still loading their
    /// state), to be asked.
    ///
    /// Read in slices of [`LIVE_SLICE`] sessions, yielding between them: on the
    /// supervisor's thread ([`InspectLive`]) the guard waits for one slice at most, not
    /// for the whole fleet (at 100,000 sessions, 120 ms).
    async fn sliced<T>(
        &self,
        read: impl Fn(&Arc<str>, Now, &[PublishedCell], &mut Vec<T>, &mut Vec<Addr<SessionActor>>),
    ) -> (Vec<T>, Vec<Addr<SessionActor>>) {
        let mut out = Vec::with_capacity(self.registries.iter().map(|(_, registry)| registry.slots.len()).sum());
        let mut unpublished = Vec::new();
        for (env, registry) in &self.registries {
            for slice in registry.published_cells().chunks(LIVE_SLICE) {
                read(&env.server, env.now(), slice, &mut out, &mut unpublished);
                tokio::task::yield_now().await;
            }
        }
        (out, unpublished)
    }
}

impl Handler<InspectLiveSources> for Supervisor {
    type Result = MessageResult<InspectLiveSources>;

    fn handle(&mut self, _: InspectLiveSources, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.live_sources())
    }
}

impl Supervisor {
    fn live_sources(&self) -> LiveSources {
        let registries =
            self.servers.values().map(|srv| (Arc::clone(&srv.env), Arc::clone(&srv.registry))).collect();
        LiveSources { servers: self.server_views(), registries, fleet_paused: self.fleet_pause.is_some() }
    }
}

/// The servers only (cheap: no session actor is asked), e.g. for a readiness probe.
#[derive(Message)]
#[rtype(result = "Vec<ServerView>")]
pub struct InspectServers;

impl Handler<InspectServers> for Supervisor {
    type Result = MessageResult<InspectServers>;

    fn handle(&mut self, _: InspectServers, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.server_views())
    }
}

impl Supervisor {
    fn server_views(&self) -> Vec<ServerView> {
        self.servers
            .iter()
            .map(|(name, s)| ServerView {
                name: name.clone(),
                connected: s.connected,
                reconciled: s.reconciled,
                events: s.registry.kind_counts(),
            })
            .collect()
    }
}

impl Handler<ListSessions> for Supervisor {
    type Result = ResponseFuture<Vec<SessionDetail>>;

    fn handle(&mut self, _: ListSessions, _: &mut Context<Self>) -> Self::Result {
        Box::pin(self.live_sources().details())
    }
}

impl Handler<SessionJournal> for Supervisor {
    type Result = ResponseFuture<Result<Vec<crate::journal::ActionRecord>, ControlError>>;

    fn handle(&mut self, msg: SessionJournal, _: &mut Context<Self>) -> Self::Result {
        let ledger = Arc::clone(&self.ledger);
        // Records are redacted when written; again on the way out for ledgers written
        // before that, or under other patterns.
        let redactor = self.cfg.redactor.clone();
        Box::pin(async move {
            ledger
                .history(&msg.session, msg.limit)
                .await
                .map(|records| records.into_iter().map(|r| r.redacted(&redactor)).collect())
                .map_err(|e| ControlError::Unavailable(format!("reading the journal: {e}")))
        })
    }
}

impl Handler<GetSession> for Supervisor {
    type Result = ResponseFuture<Result<SessionDetail, ControlError>>;

    fn handle(&mut self, msg: GetSession, _: &mut Context<Self>) -> Self::Result {
        let found = self.servers.values().find_map(|srv| srv.registry.detail(&srv.env.server, &msg.0, srv.env.now()));
        let ask = match found {
            Some(Ok(detail)) => return Box::pin(async move { Ok(detail) }),
            Some(Err(unpublished)) => Some(unpublished.send(Inspect)),
            None => None,
        };
        Box::pin(async move {
            match ask {
                Some(ask) => ask.await.map_err(|_| ControlError::UnknownSession(msg.0)),
                None => Err(ControlError::UnknownSession(msg.0)),
            }
        })
    }
}
