//! The store: adapters of the [`Ledger`] port — where Shepherd keeps what it must not
//! forget about a session across actor eviction, rediscovery and restarts, and the
//! append-only journal of its actions.
//!
//! This module chooses the adapter from the `[store]` configuration and resolves where
//! the ledger file lives; it decides nothing about sessions (the cores do) and owns no
//! number of its own (the schema in `shepherd_actors::config` does).
//!
//! Parts: [`sqlite`] (the embedded default, on disk; `checkpoint` copies its log back
//! off the writer's thread), [`history`] (the
//! `shepherd history SESSION` command that reads the journal back). The in-memory
//! adapter is `shepherd_actors::ledger::MemoryLedger`.

mod checkpoint;
pub mod history;
mod notified;
pub mod sqlite;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use shepherd_actors::config::{StoreBackend, StoreConfig};
use shepherd_actors::ledger::{Ledger, LedgerError, MemoryLedger, NotifyLedger};

pub use self::sqlite::SqliteLedger;

/// The folder under the user's state directory that holds Shepherd's files.
pub const STATE_SUBDIR: &str = "shepherd";

/// The ledger's file name in [`STATE_SUBDIR`] when `store.path` is empty.
pub const LEDGER_FILE_NAME: &str = "ledger.sqlite3";

/// The configured ledger: SQLite at [`ledger_path`] (created with its folders if
/// missing), or a fresh in-memory one. Opening the SQLite file blocks briefly (it creates
/// the file and runs migrations): call this at start-up, before actors run.
pub fn open_ledger(cfg: &StoreConfig) -> Result<Arc<dyn Ledger>, LedgerError> {
    open_ledgers(cfg).map(|(ledger, _)| ledger)
}

/// One store seen through two ports: the sessions' [`Ledger`] and the notifiers'
/// [`NotifyLedger`].
pub type Ledgers = (Arc<dyn Ledger>, Arc<dyn NotifyLedger>);

/// [`open_ledger`], with the same store as the notifiers' [`NotifyLedger`] port.
pub fn open_ledgers(cfg: &StoreConfig) -> Result<Ledgers, LedgerError> {
    fn both<L: Ledger + NotifyLedger>(l: L) -> Ledgers {
        let l = Arc::new(l);
        (Arc::clone(&l) as Arc<dyn Ledger>, l)
    }
    match cfg.backend {
        StoreBackend::Memory => {
            tracing::info!("ledger in memory: session state and the journal are forgotten at exit");
            Ok(both(MemoryLedger::default()))
        }
        StoreBackend::Sqlite => {
            let path = ledger_path(cfg, &|name| std::env::var_os(name))?;
            if let (Some(dir), Some(name)) =
                (path.parent().filter(|d| !d.as_os_str().is_empty()), path.file_name().and_then(|n| n.to_str()))
            {
                let companions = ["-wal", "-shm", "-journal"].map(|suffix| format!("{name}{suffix}"));
                let mut files = vec![name];
                files.extend(companions.iter().map(String::as_str));
                crate::private_state::warn_if_loose(dir, &files);
            }
            let ledger = SqliteLedger::open_with_cache(&path, cfg.cache_kib)?;
            tracing::info!(path = %path.display(), "ledger opened");
            Ok(both(ledger))
        }
    }
}

/// Where the SQLite ledger lives: `store.path` (a leading `~/` is the home directory), or
/// `$XDG_STATE_HOME/shepherd/ledger.sqlite3`, or `~/.local/state/shepherd/ledger.sqlite3`.
/// `lookup` reads the environment (injected so tests need not change the process's).
pub fn ledger_path(cfg: &StoreConfig, lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, LedgerError> {
    let absolute = |name: &str| lookup(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let no_home = |what: &str| {
        LedgerError::Storage(format!(
            "store.path: {what} (neither XDG_STATE_HOME nor HOME is set to an absolute path); set store.path"
        ))
    };
    let configured = cfg.path.trim();
    if !configured.is_empty() {
        return match configured.strip_prefix("~/") {
            Some(rest) => Ok(absolute("HOME").ok_or_else(|| no_home("cannot expand ~/"))?.join(rest)),
            None => Ok(PathBuf::from(configured)),
        };
    }
    let state = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))
        .ok_or_else(|| no_home("no default location"))?;
    Ok(state.join(STATE_SUBDIR).join(LEDGER_FILE_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    fn cfg(path: &str) -> StoreConfig {
        StoreConfig { path: path.to_string(), ..StoreConfig::default() }
    }

    #[test]
    fn the_default_path_is_under_xdg_state_home_else_under_home() {
        let xdg = env(&[("XDG_STATE_HOME", "/st"), ("HOME", "/h")]);
        assert_eq!(ledger_path(&cfg(""), &xdg).unwrap(), PathBuf::from("/st/shepherd/ledger.sqlite3"));
        let home = env(&[("XDG_STATE_HOME", "relative/ignored"), ("HOME", "/h")]);
        assert_eq!(ledger_path(&cfg(""), &home).unwrap(), PathBuf::from("/h/.local/state/shepherd/ledger.sqlite3"));
    }

    #[test]
    fn a_configured_path_wins_and_tilde_is_the_home_directory() {
        let e = env(&[("HOME", "/h"), ("XDG_STATE_HOME", "/st")]);
        assert_eq!(ledger_path(&cfg("/data/l.db"), &e).unwrap(), PathBuf::from("/data/l.db"));
        assert_eq!(ledger_path(&cfg("~/l.db"), &e).unwrap(), PathBuf::from("/h/l.db"));
    }

    #[test]
    fn without_any_home_the_default_path_is_an_error_naming_the_key() {
        let none = env(&[]);
        let err = ledger_path(&cfg(""), &none).unwrap_err();
        assert!(err.to_string().contains("store.path"), "{err}");
    }
}
