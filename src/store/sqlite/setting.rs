//! Table `setting`: fleet-wide settings by key, as JSON: the fleet-wide pause, and until
//! when each server's stream was watched.

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use shepherd_actors::ledger::{FleetPause, FleetSettings, LedgerError};

use super::{storage_error, Command, SqliteLedger};

/// The `setting` key of the fleet-wide pause.
const FLEET_PAUSE_KEY: &str = "fleet_pause";

#[async_trait]
impl FleetSettings for SqliteLedger {
    async fn fleet_pause(&self) -> Result<Option<FleetPause>, LedgerError> {
        let json = self.ask(|reply| Command::GetSetting { key: FLEET_PAUSE_KEY.into(), reply }).await?;
        json.map(|j| {
            serde_json::from_str(&j).map_err(|e| LedgerError::Storage(format!("setting {FLEET_PAUSE_KEY}: {e}")))
        })
        .transpose()
    }

    async fn set_fleet_pause(&self, pause: Option<&FleetPause>) -> Result<(), LedgerError> {
        let value_json = pause
            .map(|p| {
                serde_json::to_string(p).map_err(|e| LedgerError::Storage(format!("setting {FLEET_PAUSE_KEY}: {e}")))
            })
            .transpose()?;
        self.ask(|reply| Command::PutSetting { key: FLEET_PAUSE_KEY.into(), value_json, reply }).await
    }

    async fn watched_until(&self, server: &str) -> Result<Option<i64>, LedgerError> {
        let key = watched_until_key(server);
        let json = self.ask(|reply| Command::GetSetting { key: key.clone(), reply }).await?;
        json.map(|j| j.parse::<i64>().map_err(|e| LedgerError::Storage(format!("setting {key}: {e}")))).transpose()
    }

    async fn set_watched_until(&self, server: &str, wall_ms: i64) -> Result<(), LedgerError> {
        let key = watched_until_key(server);
        self.ask(|reply| Command::PutSetting { key, value_json: Some(wall_ms.to_string()), reply }).await
    }
}

/// The `setting` key of until when `server`'s stream was watched (one per server).
fn watched_until_key(server: &str) -> String {
    format!("watched_until/{server}")
}

pub(super) fn get_setting(conn: &Connection, key: &str) -> Result<Option<String>, LedgerError> {
    conn.prepare_cached("SELECT value_json FROM setting WHERE key = ?1")
        .and_then(|mut st| st.query_row(params![key], |row| row.get::<_, String>(0)).optional())
        .map_err(|e| storage_error(&format!("reading setting {key}"), e))
}

/// `None` removes the setting.
pub(super) fn put_setting(conn: &Connection, key: &str, value_json: Option<&str>) -> Result<(), LedgerError> {
    match value_json {
        Some(json) => conn
            .prepare_cached(
                "INSERT INTO setting (key, value_json) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json",
            )
            .and_then(|mut st| st.execute(params![key, json])),
        None => conn.prepare_cached("DELETE FROM setting WHERE key = ?1").and_then(|mut st| st.execute(params![key])),
    }
    .map(drop)
    .map_err(|e| storage_error(&format!("writing setting {key}"), e))
}
