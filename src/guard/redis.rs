//! The guard's shared store in Redis: what several Shepherd instances supervising the
//! same OpenCode servers agree on.
//!
//! - **Fingerprints**: `PREFIX:fp:SERVER:SESSION:FP` = the claiming instance, for the
//!   window — two instances deciding the same prompt at the same moment: one claim
//!   wins. An instance may claim again what it holds (its own new decision).
//! - **The fleet-wide rate limit**: GCRA in one Lua script on `PREFIX:global`, timed by
//!   the Redis server's clock (`TIME`), so instances' clocks need not agree.
//! - **Session leases**: `PREFIX:lease:SERVER:SESSION` = `INSTANCE|TOKEN`, taken or
//!   renewed (one Lua script) whenever an instance is about to act; a fresh lease gets a
//!   new fencing token from `PREFIX:lease_token`. The holder renews it while an action
//!   waits and checks it, token and all, right before every send (`renew`): a stale
//!   holder is fenced. A dead instance's leases expire after `lease_ttl` and the next
//!   instance to act takes over.
//!
//! One multiplexed connection, re-opened after an error. Every failure is an `Err` the
//! guard treats as "fail open" and logs.

use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script};
use tokio::sync::Mutex;

use async_trait::async_trait;
use shepherd_actors::guard::{Lease, Shared};

/// A fingerprint claim: free, or already this instance's (its own new decision — the
/// guard's memory judged that) → claimed for the window; another instance's → refused.
const CLAIM: &str = r"
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
";

/// Takes or renews a lease. KEYS[1] = the lease (`INSTANCE|TOKEN`), KEYS[2] = the
/// fleet's fencing counter; ARGV[1] = this instance, ARGV[2] = ttl (ms). Returns
/// `{1, token}` when ours (a fresh lease takes a new token, a renewal keeps it),
/// `{0, holder}` when another instance holds it.
const LEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v == false then
  local token = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
  return {1, tostring(token)}
end
local holder, token = string.match(v, '^(.*)|(%d+)$')
if holder == nil then holder = v end
if holder == ARGV[1] and token ~= nil then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
return {0, holder}
";

/// Renews a lease only if it is still `INSTANCE|TOKEN` (ARGV[1]) for ARGV[2] ms.
/// Returns '' when renewed, else who holds it ('' never: a lapsed lease is '-').
const RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return ''
end
if v == false then return '-' end
local holder = string.match(v, '^(.*)|%d+$')
return holder or v
";

/// GCRA: ARGV[1] = emission interval (ms), ARGV[2] = burst tolerance (ms). Returns -1
/// when granted, else the milliseconds to wait.
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local allow_at = tat - tolerance
if now < allow_at then return allow_at - now end
local new_tat = tat + interval
redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now + tolerance))
return -1
";

/// The Redis store of one instance.
pub struct RedisShared {
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    prefix: String,
    instance: String,
    claim: Script,
    lease: Script,
    renew: Script,
    gcra: Script,
}

impl RedisShared {
    pub fn new(url: &str, prefix: &str, instance: &str) -> anyhow::Result<RedisShared> {
        let client =
            redis::Client::open(url).map_err(|e| anyhow::anyhow!("guard.redis_url ({}): {e}", display_url(url)))?;
        Ok(RedisShared {
            client,
            conn: Mutex::new(None),
            prefix: prefix.to_string(),
            instance: instance.to_string(),
            claim: Script::new(CLAIM),
            lease: Script::new(LEASE),
            renew: Script::new(RENEW),
            gcra: Script::new(GCRA),
        })
    }

    async fn conn(&self) -> Result<MultiplexedConnection, String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self.client.get_multiplexed_async_connection().await.map_err(|e| format!("redis: {e}"))?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Drops the connection after an error, so the next call reconnects.
    async fn reset(&self, e: redis::RedisError) -> String {
        *self.conn.lock().await = None;
        format!("redis: {e}")
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for p in parts {
            k.push(':');
            k.push_str(p);
        }
        k
    }
}

#[async_trait]
impl Shared for RedisShared {
    async fn claim_fingerprint(
        &self,
        server: &str,
        session: &str,
        fingerprint: u64,
        ttl_ms: u64,
    ) -> Result<bool, String> {
        let mut c = self.conn().await?;
        let key = self.key(&["fp", server, session, &format!("{fingerprint:016x}")]);
        let claimed: i64 = match self.claim.key(&key).arg(&self.instance).arg(ttl_ms.max(1)).invoke_async(&mut c).await
        {
            Ok(v) => v,
            Err(e) => return Err(self.reset(e).await),
        };
        Ok(claimed == 1)
    }

    async fn release_fingerprint(&self, server: &str, session: &str, fingerprint: u64) -> Result<(), String> {
        let mut c = self.conn().await?;
        let key = self.key(&["fp", server, session, &format!("{fingerprint:016x}")]);
        match c.del::<_, ()>(&key).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.reset(e).await),
        }
    }

    async fn global_permit(&self, per_minute: u32, burst: u32) -> Result<Option<u64>, String> {
        let mut c = self.conn().await?;
        let interval = 60_000 / u64::from(per_minute.max(1));
        let tolerance = interval * u64::from(burst.max(1) - 1);
        let wait: i64 =
            match self.gcra.key(self.key(&["global"])).arg(interval).arg(tolerance).invoke_async(&mut c).await {
                Ok(v) => v,
                Err(e) => return Err(self.reset(e).await),
            };
        Ok((wait >= 0).then_some(wait as u64))
    }

    async fn lease(&self, server: &str, session: &str, ttl_ms: u64) -> Result<Lease, String> {
        let mut c = self.conn().await?;
        let (ours, value): (i64, String) = match self
            .lease
            .key(self.key(&["lease", server, session]))
            .key(self.key(&["lease_token"]))
            .arg(&self.instance)
            .arg(ttl_ms.max(1))
            .invoke_async(&mut c)
            .await
        {
            Ok(v) => v,
            Err(e) => return Err(self.reset(e).await),
        };
        if ours == 1 {
            let token = value.parse().map_err(|e| format!("redis: lease token {value:?}: {e}"))?;
            Ok(Lease::Ours { token })
        } else {
            Ok(Lease::Theirs { holder: value })
        }
    }

    async fn renew(&self, server: &str, session: &str, token: u64, ttl_ms: u64) -> Result<Option<String>, String> {
        let mut c = self.conn().await?;
        let holder: String = match self
            .renew
            .key(self.key(&["lease", server, session]))
            .arg(format!("{}|{token}", self.instance))
            .arg(ttl_ms.max(1))
            .invoke_async(&mut c)
            .await
        {
            Ok(v) => v,
            Err(e) => return Err(self.reset(e).await),
        };
        Ok(match holder.as_str() {
            "" => None,
            "-" => Some("nobody: the lease lapsed".to_string()),
            _ => Some(holder),
        })
    }
}

/// The URL with any password masked, for logs.
pub fn display_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}://{user}:***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_redis_urls_are_masked() {
        assert_eq!(display_url("redis://:s3cret@host:6379/0"), "redis://:***@host:6379/0");
        assert_eq!(display_url("rediss://me:s3cret@host/1"), "rediss://me:***@host/1");
        assert_eq!(display_url("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
    }
}
