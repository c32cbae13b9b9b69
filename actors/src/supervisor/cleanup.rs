//! Idle cleanup: quiet sessions (and the longest-quiet beyond the in-memory cap) write
//! their state to the ledger and stop; events that arrive meanwhile wait and go to a
//! fresh actor, which resumes from the ledger.

use super::*;

impl Supervisor {
    /// Idle cleanup: evicts sessions quiet for `idle_cleanup`, and the longest-quiet
    /// ones beyond `max_sessions_in_memory`. Busy or recovering sessions refuse.
    pub(super) fn clean_up(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        let over = self.tracked().saturating_sub(self.fleet.max_sessions_in_memory);
        let quiet_enough = |seen: tokio::time::Instant| now.duration_since(seen) >= self.fleet.idle_cleanup;
        // Every cleanup interval over the whole fleet, with the registry's shards held
        // (the pump waits on them): under the cap only the sessions quiet long enough
        // are taken, and nothing is allocated for the others.
        let mut quiet: Vec<(tokio::time::Instant, &str, Arc<str>)> = Vec::new();
        for (server, srv) in &self.servers {
            let slots = srv.registry.slots.iter().filter(|s| s.evicting.is_none() && (over > 0 || quiet_enough(s.last_seen)));
            quiet.extend(slots.map(|s| (s.last_seen, server.as_str(), Arc::clone(s.key()))));
        }
        quiet.sort();
        let chosen: Vec<SessionKey> = quiet
            .into_iter()
            .enumerate()
            .filter(|(i, (seen, ..))| *i < over || quiet_enough(*seen))
            .map(|(_, (_, server, id))| (server.to_string(), id.to_string()))
            .collect();
        for key in chosen {
            let Some(registry) = self.registry(&key.0) else { continue };
            let Some(mut slot) = registry.slots.get_mut(key.1.as_str()) else { continue };
            slot.evicting = Some(Box::default());
            let ask = slot.addr.send(Evict);
            drop(slot);
            ctx.spawn(
                ask.into_actor(self).map(move |evicted, act, ctx| act.evicted(key, evicted.unwrap_or(false), ctx)),
            );
        }
    }

    fn evicted(&mut self, key: (String, String), evicted: bool, ctx: &mut Context<Self>) {
        let Some(registry) = self.registry(&key.0) else { return };
        let Some(mut slot) = registry.slots.get_mut(key.1.as_str()) else { return };
        let waiting = slot.evicting.take().map(|w| *w).unwrap_or_default();
        let addr = Addr::clone(&slot.addr);
        drop(slot);
        if evicted {
            let slot = registry.slots.remove(key.1.as_str()).map(|(_, slot)| slot);
            tracing::debug!(server = %key.0, session = %key.1, "evicted an idle session (state kept in the ledger)");
            if !waiting.is_empty() {
                // Events arrived meanwhile: a fresh actor resumes from the ledger.
                let dir = slot.and_then(|s| s.directory);
                if let Some(addr) = self.session(&key.0, &key.1, None, dir.as_deref(), ctx) {
                    for e in waiting {
                        registry.dispatch(&key.1, addr.clone(), Observe(e));
                    }
                }
            }
        } else {
            for e in waiting {
                registry.dispatch(&key.1, addr.clone(), Observe(e));
            }
        }
    }
}
