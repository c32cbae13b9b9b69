//! The control API's orders (a custom prompt, a hand-off, resuming a snapshot), each
//! passed to the session's actor — found, or created after a lookup by REST — and the
//! graceful shutdown.

use super::*;

/// Graceful stop: no new aborts; wait up to `grace` for recoveries under way; stop
/// every session. Answers with the number of recoveries that did not finish in time.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Shutdown {
    pub grace: Duration,
}

impl Handler<Shutdown> for Supervisor {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, msg: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.in_flight.begin_shutdown();
        let in_flight = self.in_flight.clone();
        let pending = in_flight.count();
        if pending > 0 {
            tracing::info!(recoveries = pending, "shutdown: waiting for recoveries under way to send their continue");
        }
        // Servers whose every event was seen: watched until now (see `record_watched`).
        let watched = self.watched_servers();
        let (ledger, now_ms) = (Arc::clone(&self.ledger), self.clock.wall_ms());
        Box::pin(
            async move {
                for server in watched {
                    super::reconcile::mark_watched(&*ledger, &server, now_ms).await;
                }
                let _ = tokio::time::timeout(msg.grace, in_flight.drained()).await;
                in_flight.count()
            }
            .into_actor(self)
            .map(|left, act, _| {
                if left > 0 {
                    tracing::warn!(
                        recoveries = left,
                        "shutdown: recoveries still under way; their continue may not be sent"
                    );
                }
                for addr in act.actors() {
                    addr.do_send(StopSession);
                }
                for srv in act.servers.values() {
                    srv.registry.slots.clear();
                }
                left
            }),
        )
    }
}

impl Handler<SendCustomPrompt> for Supervisor {
    type Result = ResponseActFuture<Self, Result<CustomPromptReply, ControlError>>;

    fn handle(&mut self, msg: SendCustomPrompt, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        if let Some(addr) = self.find(&msg.session) {
            let ask = addr.send(DeliverCustom(msg.request));
            return Box::pin(async move { ask.await.unwrap_or(Err(ControlError::ShuttingDown)) }.into_actor(self));
        }
        // Not tracked yet: ask each server whether it knows the session.
        let engines: Vec<_> = self.servers.iter().map(|(name, s)| (name.clone(), Arc::clone(&s.env.engine))).collect();
        let id = msg.session.clone();
        let lookup = async move {
            for (server, engine) in engines {
                if let Ok(info) = engine.session(&id).await {
                    return Some((server, info));
                }
            }
            None
        };
        Box::pin(lookup.into_actor(self).then(move |found, act, ctx| {
            let addr = found.and_then(|(server, info)| {
                let dir = info.directory.clone();
                act.session(&server, &info.id, Some(&info), dir.as_deref(), ctx)
            });
            async move {
                match addr {
                    Some(addr) => {
                        addr.send(DeliverCustom(msg.request)).await.unwrap_or(Err(ControlError::ShuttingDown))
                    }
                    None => Err(ControlError::UnknownSession(msg.session)),
                }
            }
            .into_actor(act)
        }))
    }
}

impl Handler<StartHandoff> for Supervisor {
    type Result = ResponseActFuture<Self, Result<HandoffView, ControlError>>;

    fn handle(&mut self, msg: StartHandoff, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        let session = msg.0;
        Box::pin(self.locate(session.clone(), None).then(move |addr, act, _| {
            async move {
                match addr {
                    Some(addr) => addr.send(RequestHandoff).await.unwrap_or(Err(ControlError::ShuttingDown)),
                    None => Err(ControlError::UnknownSession(session)),
                }
            }
            .into_actor(act)
        }))
    }
}

impl Handler<ResumeHandoff> for Supervisor {
    type Result = ResponseActFuture<Self, Result<HandoffView, ControlError>>;

    fn handle(&mut self, msg: ResumeHandoff, _: &mut Context<Self>) -> Self::Result {
        if self.in_flight.stopping().load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(actix::fut::ready(Err(ControlError::ShuttingDown)));
        }
        let ledger = Arc::clone(&self.ledger);
        let id = msg.0;
        let id2 = id.clone();
        let find = async move { ledger.snapshot(&id2).await };
        Box::pin(find.into_actor(self).then(move |found, act, _| {
            let owner = match found {
                Ok(Some(Ok(s))) => Some((s.server, s.session)),
                _ => None,
            };
            match owner {
                Some((server, session)) => Box::pin(act.locate(session, Some(server)).then(move |addr, act, _| {
                    async move {
                        match addr {
                            Some(addr) => {
                                addr.send(ResumeSnapshot(id)).await.unwrap_or(Err(ControlError::ShuttingDown))
                            }
                            None => Err(ControlError::UnknownSession(id)),
                        }
                    }
                    .into_actor(act)
                }))
                    as ResponseActFuture<Self, Result<HandoffView, ControlError>>,
                None => Box::pin(actix::fut::ready(Err(ControlError::UnknownSnapshot(id)))),
            }
        }))
    }
}
