//! What the notifier has told people, so a restart does not tell them again, and the
//! journal read back for its catch-up after a restart. A port of its own beside
//! [`super::FleetSettings`]: the session actors never see it.

use std::collections::HashSet;

use async_trait::async_trait;

use super::{LedgerError, MemoryLedger};
use crate::journal::{Action, ActionRecord};

#[async_trait]
pub trait NotifyLedger: Send + Sync + 'static {
    /// Which of `keys` were notified already.
    async fn notified(&self, keys: &[String]) -> Result<HashSet<String>, LedgerError>;
    /// Remembers `keys` as notified at `at_ms` (epoch ms).
    async fn mark_notified(&self, keys: &[String], at_ms: i64) -> Result<(), LedgerError>;
    /// Forgets what was notified before `before_ms`.
    async fn forget_notified(&self, before_ms: i64) -> Result<(), LedgerError>;
    /// The journal's records of `actions` at or after `since_ms`: the newest `limit`,
    /// oldest first.
    async fn journal_since(
        &self,
        since_ms: i64,
        actions: &[Action],
        limit: u32,
    ) -> Result<Vec<ActionRecord>, LedgerError>;
}

fn poisoned(e: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(e.to_string())
}

#[async_trait]
impl NotifyLedger for MemoryLedger {
    async fn notified(&self, keys: &[String]) -> Result<HashSet<String>, LedgerError> {
        let sent = self.notified.lock().map_err(poisoned)?;
        Ok(keys.iter().filter(|k| sent.contains_key(*k)).cloned().collect())
    }

    async fn mark_notified(&self, keys: &[String], at_ms: i64) -> Result<(), LedgerError> {
        let mut sent = self.notified.lock().map_err(poisoned)?;
        sent.extend(keys.iter().map(|k| (k.clone(), at_ms)));
        Ok(())
    }

    async fn forget_notified(&self, before_ms: i64) -> Result<(), LedgerError> {
        self.notified.lock().map_err(poisoned)?.retain(|_, at| *at >= before_ms);
        Ok(())
    }

    async fn journal_since(
        &self,
        since_ms: i64,
        actions: &[Action],
        limit: u32,
    ) -> Result<Vec<ActionRecord>, LedgerError> {
        let journal = self.journal.lock().map_err(poisoned)?;
        let mut found: Vec<ActionRecord> = journal
            .iter()
            .rev()
            .filter(|r| r.at_ms >= since_ms && actions.contains(&r.action))
            .take(limit as usize)
            .cloned()
            .collect();
        found.reverse();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Numbers, Outcome};
    use crate::ledger::Ledger;

    fn rec(at_ms: i64, action: Action) -> ActionRecord {
        ActionRecord {
            server: "s".into(),
            session: "ses_1".into(),
            action,
            outcome: Outcome::Done,
            reason: String::new(),
            numbers: Numbers::default(),
            at_ms,
        }
    }

    #[tokio::test]
    async fn a_key_marked_is_notified_until_forgotten() {
        let l = MemoryLedger::default();
        let keys = vec!["a".to_string(), "b".to_string()];
        l.mark_notified(&keys[..1], 10).await.unwrap();
        assert_eq!(l.notified(&keys).await.unwrap(), HashSet::from(["a".to_string()]));
        l.forget_notified(11).await.unwrap();
        assert!(l.notified(&keys).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn journal_since_gives_the_newest_records_of_the_actions_asked_oldest_first() {
        let l = MemoryLedger::default();
        for (at, a) in [(1, Action::GiveUp), (2, Action::Nudge), (3, Action::GiveUp), (4, Action::GiveUp)] {
            l.append(&rec(at, a)).await.unwrap();
        }
        let got = l.journal_since(2, &[Action::GiveUp], 1).await.unwrap();
        assert_eq!(got.iter().map(|r| r.at_ms).collect::<Vec<_>>(), vec![4]);
        let got = l.journal_since(2, &[Action::GiveUp], 10).await.unwrap();
        assert_eq!(got.iter().map(|r| r.at_ms).collect::<Vec<_>>(), vec![3, 4]);
    }
}
