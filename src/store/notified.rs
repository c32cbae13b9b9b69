//! The SQLite side of the [`NotifyLedger`] port: the keys of notifications sent (table
//! `notified`, migration 5) and the journal read back for the notifier's catch-up.
//! Each call is a [`Job`] on the ledger's one writer thread, like every other command.

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{params, params_from_iter, Connection};
use shepherd_actors::journal::{Action, ActionRecord};
use shepherd_actors::ledger::{LedgerError, NotifyLedger};
use tokio::sync::oneshot;

use super::sqlite::{storage_error, Command, Finished, Job, JournalRow, SqliteLedger};

/// The journal is read newest first and the reading stops this far before `since`:
/// records of different sessions reach the journal a little out of time order.
const OUT_OF_ORDER_MS: i64 = 60_000;

struct Read<T, F> {
    reply: oneshot::Sender<Result<T, LedgerError>>,
    query: F,
}

impl<T: Send + 'static, F: FnOnce(&Connection) -> Result<T, LedgerError> + Send> Job for Read<T, F> {
    fn run(self: Box<Self>, conn: &Connection) -> Finished {
        let result = (self.query)(conn);
        let reply = self.reply;
        Finished::Read(Box::new(move || drop(reply.send(result))))
    }

    fn fail(self: Box<Self>, err: LedgerError) {
        let _ = self.reply.send(Err(err));
    }
}

struct Write<F> {
    reply: oneshot::Sender<Result<(), LedgerError>>,
    change: F,
}

impl<F: FnOnce(&Connection) -> Result<(), LedgerError> + Send> Job for Write<F> {
    fn run(self: Box<Self>, conn: &Connection) -> Finished {
        Finished::Write(self.reply, (self.change)(conn))
    }

    fn fail(self: Box<Self>, err: LedgerError) {
        let _ = self.reply.send(Err(err));
    }
}

#[async_trait]
impl NotifyLedger for SqliteLedger {
    async fn notified(&self, keys: &[String]) -> Result<HashSet<String>, LedgerError> {
        let keys = keys.to_vec();
        let query = move |conn: &Connection| {
            let mut st = conn
                .prepare_cached("SELECT 1 FROM notified WHERE key = ?1")
                .map_err(|e| storage_error("reading notified keys", e))?;
            let mut found = HashSet::new();
            for key in keys {
                if st.exists(params![key]).map_err(|e| storage_error("reading notified keys", e))? {
                    found.insert(key);
                }
            }
            Ok(found)
        };
        self.ask(|reply| Command::Job(Box::new(Read { reply, query }))).await
    }

    async fn mark_notified(&self, keys: &[String], at_ms: i64) -> Result<(), LedgerError> {
        let keys = keys.to_vec();
        let change = move |conn: &Connection| {
            let mut st = conn
                .prepare_cached("INSERT INTO notified (key, at_ms) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING")
                .map_err(|e| storage_error("writing notified keys", e))?;
            for key in keys {
                st.execute(params![key, at_ms]).map_err(|e| storage_error("writing notified keys", e))?;
            }
            Ok(())
        };
        self.ask(|reply| Command::Job(Box::new(Write { reply, change }))).await
    }

    async fn forget_notified(&self, before_ms: i64) -> Result<(), LedgerError> {
        let change = move |conn: &Connection| {
            conn.execute("DELETE FROM notified WHERE at_ms < ?1", params![before_ms])
                .map(drop)
                .map_err(|e| storage_error("forgetting old notified keys", e))
        };
        self.ask(|reply| Command::Job(Box::new(Write { reply, change }))).await
    }

    async fn journal_since(
        &self,
        since_ms: i64,
        actions: &[Action],
        limit: u32,
    ) -> Result<Vec<ActionRecord>, LedgerError> {
        let actions: Vec<&'static str> = actions.iter().map(|a| a.as_str()).collect();
        let query = move |conn: &Connection| {
            let at = |e| storage_error("reading the journal back", e);
            let marks = vec!["?"; actions.len()].join(", ");
            let sql = format!(
                "SELECT id, server, session, at_ms, action, outcome, reason, numbers_json
                 FROM journal WHERE action IN ({marks}) ORDER BY id DESC"
            );
            let mut st = conn.prepare(&sql).map_err(at)?;
            let mut rows = st.query(params_from_iter(actions.iter())).map_err(at)?;
            let mut found = Vec::new();
            while let Some(row) = rows.next().map_err(at)? {
                let row = JournalRow::read(row).map_err(at)?;
                if row.at_ms() < since_ms.saturating_sub(OUT_OF_ORDER_MS) || found.len() >= limit as usize {
                    break;
                }
                if row.at_ms() >= since_ms {
                    found.push(row);
                }
            }
            // A row that does not parse is skipped: the catch-up is best effort.
            Ok(found.into_iter().rev().filter_map(|r| r.into_record().ok()).collect())
        };
        self.ask(|reply| Command::Job(Box::new(Read { reply, query }))).await
    }
}

#[cfg(test)]
mod tests {
    use shepherd_actors::journal::{Numbers, Outcome};
    use shepherd_actors::ledger::Ledger;

    use super::*;

    fn rec(at_ms: i64, action: Action) -> ActionRecord {
        ActionRecord {
            server: "s".into(),
            session: "ses_1".into(),
            action,
            outcome: Outcome::Done,
            reason: "r".into(),
            numbers: Numbers { waits_on: Some("que_1".into()), ..Numbers::default() },
            at_ms,
        }
    }

    #[tokio::test]
    async fn notified_keys_survive_reopening_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.sqlite3");
        let keys = vec!["a".to_string(), "b".to_string()];
        {
            let l = SqliteLedger::open(&path).unwrap();
            l.mark_notified(&keys[..1], 100).await.unwrap();
            l.mark_notified(&keys[..1], 200).await.unwrap(); // twice is once
        }
        let l = SqliteLedger::open(&path).unwrap();
        assert_eq!(l.notified(&keys).await.unwrap(), HashSet::from(["a".to_string()]));
        l.forget_notified(101).await.unwrap();
        assert!(l.notified(&keys).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_journal_is_read_back_since_a_time_for_the_actions_asked_oldest_first() {
        let l = SqliteLedger::open_in_memory().unwrap();
        for (at, a) in [
            (1_000, Action::GiveUp),
            (200_000, Action::Nudge),
            (300_000, Action::WaitsOnPerson),
            (400_000, Action::GiveUp),
        ] {
            l.append(&rec(at, a)).await.unwrap();
        }
        let got = l.journal_since(250_000, &[Action::GiveUp, Action::WaitsOnPerson], 10).await.unwrap();
        assert_eq!(got.iter().map(|r| r.at_ms).collect::<Vec<_>>(), vec![300_000, 400_000]);
        assert_eq!(got[0].numbers.waits_on.as_deref(), Some("que_1"));
        let got = l.journal_since(0, &[Action::GiveUp], 1).await.unwrap();
        assert_eq!(got.iter().map(|r| r.at_ms).collect::<Vec<_>>(), vec![400_000]);
    }
}
