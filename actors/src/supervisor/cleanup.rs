//! Idle cleanup: quiet sessions (and the longest-quiet beyond the in-memory cap) write
//! their state to the ledger and stop; events that arrive meanwhile wait and go to a
//! fresh actor, which resumes from the ledger.

use super::*;

impl Supervisor {
    /// Idle cleanup: evicts sessions quiet for `idle_cleanup`, and the longest-quiet
    /// ones beyond `max_sessions_in_memory`. Busy or recovering sessions refuse.
    pub(super) fn clean_up(&mut self, ctx: &mut Context<Self>) {
        let now = self.clock.now();
        let mut quiet: Vec<_> =
            self.sessions.iter().filter(|(_, s)| s.evicting.is_none()).map(|(k, s)| (s.last_seen, k.clone())).collect();
        quiet.sort();
        let over = self.sessions.len().saturating_sub(self.fleet.max_sessions_in_memory);
        let chosen: Vec<_> = quiet
            .into_iter()
            .enumerate()
            .filter(|(i, (seen, _))| *i < over || now.duration_since(*seen) >= self.fleet.idle_cleanup)
            .map(|(_, (_, k))| k)
            .collect();
        for key in chosen {
            let Some(slot) = self.sessions.get_mut(&key) else { continue };
            slot.evicting = Some(Vec::new());
            let ask = slot.addr.send(Evict);
            ctx.spawn(
                ask.into_actor(self).map(move |evicted, act, ctx| act.evicted(key, evicted.unwrap_or(false), ctx)),
            );
        }
    }

    fn evicted(&mut self, key: (String, String), evicted: bool, ctx: &mut Context<Self>) {
        let Some(slot) = self.sessions.get_mut(&key) else { return };
        let waiting = slot.evicting.take().unwrap_or_default();
        if evicted {
            let slot = self.sessions.remove(&key);
            tracing::debug!(server = %key.0, session = %key.1, "evicted an idle session (state kept in the ledger)");
            if !waiting.is_empty() {
                // Events arrived meanwhile: a fresh actor resumes from the ledger.
                let dir = slot.and_then(|s| s.directory);
                if let Some(addr) = self.session(&key.0, &key.1, None, dir.as_deref(), ctx) {
                    for e in waiting {
                        addr.do_send(Observe(e));
                    }
                }
            }
        } else {
            for e in waiting {
                slot.addr.do_send(Observe(e));
            }
        }
    }
}
