//! The event stream, the supervisor's part: the events its pump sends the long way
//! ([`Registry::route`]) — learned from, routed to their session (and to a subagent's
//! parent), the actor created on first sight, each with its read's mark; the stream
//! coming up (reconcile, wake the sessions the ledger says have unfinished work) and
//! going down (its sessions are told they are blind).

use super::*;
use crate::session::actor::ObserveRead;
use crate::stream_clock::ReadToken;

impl Supervisor {
    /// Parent/child links: a child's `parentID`, or the child id in a parent's `task` part.
    fn learn_family(&mut self, server: &str, id: &str, event: &Event, info: Option<&SessionInfo>) {
        if let Some(parent) = info.and_then(|i| i.parent_id.clone()) {
            self.learn_parent((server.to_string(), id.to_string()), parent);
        }
        if let Event::PartUpdated(p) = event {
            if let crate::event::PartKind::Tool { child_session: Some(child), .. } = &p.kind {
                self.learn_parent((server.to_string(), child.clone()), id.to_string());
            }
        }
    }

    /// One child → parent link, within `supervisor.max_parents` (see [`bounds`]). The
    /// child's events go through the supervisor from now on (its parent hears of them).
    fn learn_parent(&mut self, child: SessionKey, parent: String) {
        if let Some(mut slot) = self.servers.get(&child.0).and_then(|s| s.registry.slots.get_mut(child.1.as_str())) {
            slot.child = true;
        }
        let cap = self.fleet.max_parents;
        if bounds::insert_capped_map(&mut self.parents, child, parent, cap) && !self.parents_capped {
            self.parents_capped = true;
            tracing::warn!(cap, "supervisor.max_parents reached: an arbitrary child → parent link is forgotten for each new one (logged once)");
        }
    }
}

/// One event from a server's stream that the supervisor is to handle: its pump sends
/// it the long way ([`Registry::route`]), or a test does.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ingest {
    /// Shared with the pump (one name per event would be one copy per event).
    pub server: Arc<str>,
    pub envelope: Envelope,
    /// The mark of the read it came in, if it came from a pump: it goes on with the
    /// event to the session, which drops it once the event is handled.
    pub read: Option<ReadToken>,
    /// Its number on the long way ([`Registry::route`]); 0 when not from a pump.
    pub seq: u64,
}

impl Handler<Ingest> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Ingest, ctx: &mut Context<Self>) {
        let Ingest { server, envelope, read, seq } = msg;
        let Some(srv) = self.servers.get(&*server) else { return };
        let registry = Arc::clone(&srv.registry);
        if read.is_none() {
            // Not from a pump, which counts what it reads itself.
            registry.count(&server, envelope.event.kind(), 1);
        }
        self.ingest(&server, envelope, read, ctx);
        registry.handled(seq);
    }
}

impl Supervisor {
    /// An event the session's actor alone could not take: the supervisor learns from it
    /// (directories, family links), makes the session's actor on first sight, tells a
    /// subagent's parent, and routes it.
    fn ingest(&mut self, server: &str, envelope: Envelope, read: Option<ReadToken>, ctx: &mut Context<Self>) {
        let Envelope { directory, event } = envelope;
        if matches!(event, Event::Sync) {
            return;
        }
        if let Event::Unknown { kind } = &event {
            tracing::trace!(server = %server, kind = %kind, "ignoring an event type Shepherd does not act on");
            return;
        }
        let Some(srv) = self.servers.get_mut(server) else { return };
        if let Some(dir) = &directory {
            srv.learn_directory(dir, self.fleet.max_directories, server);
        }
        let registry = Arc::clone(&srv.registry);
        let Some(id) = event.session_id() else { return };
        if self.scratch.contains(id) {
            // Shepherd's own fork: not supervised (stop an actor made before it was known).
            if let Some((_, slot)) = registry.slots.remove(id) {
                slot.addr.do_send(StopSession);
            }
            return;
        }
        // Owned: the event itself moves on below (the long way only, not every event).
        let id = id.to_string();
        if let Event::SessionDeleted(_) = event {
            self.parents.remove(key(&(server, &id)));
            if let Some((_, slot)) = registry.slots.remove(id.as_str()) {
                registry.dispatch(&id, Addr::clone(&slot.addr), Observe(event));
            }
            return;
        }
        let info = match &event {
            Event::SessionCreated(i) | Event::SessionUpdated(i) => Some(i.clone()),
            _ => None,
        };
        self.learn_family(server, &id, &event, info.as_deref());
        if let Some(parent) = self.parents.get(key(&(server, &id))).cloned() {
            if let Some(addr) = self.session(server, &parent, None, directory.as_deref(), ctx) {
                registry.dispatch(&parent, addr, ChildObserve { child: id.clone(), event: event.clone() });
            }
        }
        let now = self.clock.now();
        let routed = registry.next_routed();
        let event = match registry.slots.get_mut(id.as_str()) {
            Some(mut slot) => match slot.heard(now, routed, event) {
                Some(event) => event,
                None => return, // waits for the fresh actor
            },
            None => event,
        };
        if let Some(addr) = self.session(server, &id, info.as_deref(), directory.as_deref(), ctx) {
            if let Some(mut slot) = registry.slots.get_mut(id.as_str()) {
                slot.last_event = routed;
            }
            match read {
                Some(read) => registry.dispatch(&id, addr, ObserveRead(event, read)),
                None => registry.dispatch(&id, addr, Observe(event)),
            }
        }
    }
}

/// A server's event stream is (re)connected: reconcile.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StreamUp {
    pub server: String,
}

impl Handler<StreamUp> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: StreamUp, ctx: &mut Context<Self>) {
        if let Some(srv) = self.servers.get_mut(&msg.server) {
            srv.connected = true;
            srv.reconciled = false;
            srv.epoch += 1;
            // Model windows may change with the server's config: re-read on every
            // connect, as part of the reconciliation (retried with it).
            srv.windows_stale = true;
        }
        self.reconcile(&msg.server, true, ctx);
        self.wake_unfinished(&msg.server, ctx);
    }
}

impl Supervisor {
    /// Sessions with work the ledger says is not finished get their actor now, even if
    /// they stay quiet: a hand-off that was under way (the actor resumes it at its step),
    /// a provider-outage resume scheduled (it keeps the step's time), an action left open
    /// (an intent: a crash, or an answer lost on the way back). An actor finds all of it
    /// as it starts; a live one is asked to look for open intents again.
    fn wake_unfinished(&mut self, server: &str, ctx: &mut Context<Self>) {
        let ledger = Arc::clone(&self.ledger);
        let server = server.to_string();
        let find = async move {
            let handoffs = ledger.unfinished_handoffs(&server).await;
            let outages = ledger.scheduled_resumes(&server).await;
            let intents = ledger.open_intents(&server, None).await;
            (server, handoffs, outages, intents)
        };
        ctx.spawn(find.into_actor(self).map(|(server, handoffs, outages, intents), act, ctx| {
            let intents = intents.map(|open| {
                let mut ids: Vec<String> = open.into_iter().map(|i| i.session).collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            });
            for (found, what) in [
                (handoffs, "a hand-off was under way"),
                (outages, "a provider-outage resume is scheduled"),
                (intents, "an action was left unfinished"),
            ] {
                let ids = match found {
                    Ok(ids) => ids,
                    Err(e) => {
                        tracing::warn!(server = %server, error = %e, what, "could not look for unfinished work");
                        continue;
                    }
                };
                for id in ids {
                    let live = act
                        .servers
                        .get(&server)
                        .and_then(|s| s.registry.slots.get(id.as_str()).map(|slot| Addr::clone(&slot.addr)))
                        .filter(Addr::connected);
                    match live {
                        Some(addr) => addr.do_send(ResumeIntents),
                        None => {
                            tracing::info!(server = %server, session = %id, what, "waking the session");
                            act.session(&server, &id, None, None, ctx);
                        }
                    }
                }
            }
        }));
    }
}

/// A server's event stream broke.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StreamDown {
    pub server: String,
}

impl Handler<StreamDown> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: StreamDown, ctx: &mut Context<Self>) {
        let Some(srv) = self.servers.get_mut(&msg.server) else { return };
        srv.connected = false;
        let watched = std::mem::replace(&mut srv.reconciled, false);
        srv.epoch += 1;
        if srv.blind {
            return; // a failed reconnect: the sessions know already
        }
        // Until now every event was seen — if the connect's reconciliation had made up
        // for what came before it (else the ledger's older mark stays, and is read next).
        if watched {
            self.record_watched(&msg.server, ctx);
        }
        let Some(srv) = self.servers.get_mut(&msg.server) else { return };
        // Being blind is not the session being silent: stop the clocks that measure
        // silence. One message per session per outage; an idle one arms nothing.
        srv.blind = true;
        let mut told = 0usize;
        for slot in srv.registry.slots.iter() {
            slot.addr.do_send(Blind);
            told += 1;
        }
        tracing::info!(server = %msg.server, sessions = told, "event stream down: silence is not counted until it is back and reconciled");
    }
}
