//! The event stream, the supervisor's part: each event counted, routed to its session
//! (and to its parent's, for a subagent's), the actor created on first sight; a read's
//! mark dropped once its events are handed on; the stream coming up (reconcile, wake
//! the sessions the ledger says have unfinished work) and going down (its sessions are
//! told they are blind).

use super::*;

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

    /// One child → parent link, within `supervisor.max_parents` (see [`bounds`]).
    fn learn_parent(&mut self, child: SessionKey, parent: String) {
        let cap = self.fleet.max_parents;
        if bounds::insert_capped_map(&mut self.parents, child, parent, cap) && !self.parents_capped {
            self.parents_capped = true;
            tracing::warn!(cap, "supervisor.max_parents reached: an arbitrary child → parent link is forgotten for each new one (logged once)");
        }
    }
}

/// One decoded event from a server's stream.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ingest {
    /// Shared with the pump (one name per event would be one copy per event).
    pub server: Arc<str>,
    pub envelope: Envelope,
}

/// Sent by a pump behind the events of one read. Reaching it, the supervisor has handed
/// every one of them to its session (the mailbox keeps order); dropping the mark moves
/// the server's stream time on ([`crate::stream_clock`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReadMark(pub crate::stream_clock::Mark);

impl Handler<ReadMark> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ReadMark, _: &mut Context<Self>) {
        drop(msg.0);
    }
}

impl Handler<Ingest> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Ingest, ctx: &mut Context<Self>) {
        let Envelope { directory, event } = msg.envelope;
        let server: &str = &msg.server;
        let Some(srv) = self.servers.get_mut(server) else { return };
        if bounds::count_event(&mut srv.events, event.kind(), self.fleet.max_event_types) && !srv.capped.events {
            srv.capped.events = true;
            tracing::warn!(
                server = %server,
                cap = self.fleet.max_event_types,
                kind = %crate::ids::excerpt(event.kind()),
                "supervisor.max_event_types reached: further new event types are counted as \"other\" (logged once)"
            );
        }
        if matches!(event, Event::Sync) {
            return;
        }
        if let Event::Unknown { kind } = &event {
            tracing::trace!(server = %server, kind = %kind, "ignoring an event type Shepherd does not act on");
            return;
        }
        if let Some(dir) = &directory {
            srv.learn_directory(dir, self.fleet.max_directories, server);
        }
        let Some(id) = event.session_id() else { return };
        if self.scratch.contains(id) {
            // Shepherd's own fork: not supervised (stop an actor made before it was known).
            if let Some(slot) = self.sessions.remove(key(&(server, id))) {
                slot.addr.do_send(StopSession);
            }
            return;
        }
        if let Event::SessionDeleted(_) = event {
            let id = id.to_string();
            self.parents.remove(key(&(server, &id)));
            if let Some(slot) = self.sessions.remove(key(&(server, &id))) {
                slot.addr.do_send(Observe(event));
            }
            return;
        }
        let info = match &event {
            Event::SessionCreated(i) | Event::SessionUpdated(i) => Some(i.clone()),
            _ => None,
        };
        self.learn_family(server, id, &event, info.as_ref());
        if let Some(parent) = self.parents.get(key(&(server, id))).cloned() {
            if let Some(addr) = self.session(server, &parent, None, directory.as_deref(), ctx) {
                addr.do_send(ChildObserve { child: id.to_string(), event: event.clone() });
            }
        }
        let now = self.clock.now();
        self.routed += 1;
        if let Some(slot) = self.sessions.get_mut(key(&(server, id))) {
            slot.last_seen = now;
            slot.last_event = self.routed;
            if let Some(waiting) = slot.evicting.as_mut() {
                waiting.push(event);
                return;
            }
        }
        if let Some(addr) = self.session(server, id, info.as_ref(), directory.as_deref(), ctx) {
            if let Some(slot) = self.sessions.get_mut(key(&(server, id))) {
                slot.last_event = self.routed;
            }
            addr.do_send(Observe(event));
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
                    let live = act.sessions.get(key(&(server.as_str(), id.as_str()))).filter(|s| s.addr.connected());
                    match live {
                        Some(slot) => slot.addr.do_send(ResumeIntents),
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

    fn handle(&mut self, msg: StreamDown, _: &mut Context<Self>) {
        let Some(srv) = self.servers.get_mut(&msg.server) else { return };
        srv.connected = false;
        srv.reconciled = false;
        srv.epoch += 1;
        if srv.blind {
            return; // a failed reconnect: the sessions know already
        }
        // Being blind is not the session being silent: stop the clocks that measure
        // silence. One message per session per outage; an idle one arms nothing.
        srv.blind = true;
        let mut told = 0usize;
        for ((server, _), slot) in &self.sessions {
            if *server == msg.server {
                slot.addr.do_send(Blind);
                told += 1;
            }
        }
        tracing::info!(server = %msg.server, sessions = told, "event stream down: silence is not counted until it is back and reconciled");
    }
}
