//! `shepherd history SESSION`: one session's journal, read from the configured ledger,
//! oldest first.
//!
//! It reads the same configuration as `run` (`--config`, `--set`, the environment), so
//! it finds the ledger the daemon writes; it can run while the daemon does (WAL). It
//! never creates a ledger: with no file yet it says so. Rendering is a pure function of
//! the records and the current time ([`render_history`]).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use shepherd_actors::config::StoreBackend;
use shepherd_actors::journal::ActionRecord;
use shepherd_actors::ledger::Ledger as _;

use super::{ledger_path, SqliteLedger};
use crate::config::{load, ConfigSources};

/// The flags of `shepherd history`.
#[derive(Args, Clone, Debug)]
pub struct HistoryArgs {
    /// The session id (`ses_…`).
    pub session: String,
    /// Show at most this many of the newest entries.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print the records as a JSON array instead of the table.
    #[arg(long)]
    pub json: bool,
    /// TOML file (default: ./shepherd.toml if present).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Set a key, e.g. `--set store.path=/var/lib/shepherd/ledger.sqlite3` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Runs the command: prints the journal to stdout.
pub fn run(args: HistoryArgs) -> anyhow::Result<()> {
    let sources = ConfigSources { file: args.config.clone(), overrides: args.set.clone(), server_url: None };
    let cfg = load(&sources).context("invalid configuration")?;
    if cfg.store.backend == StoreBackend::Memory {
        anyhow::bail!("store.backend is \"memory\": the journal is not kept after the daemon exits, so there is no history to read");
    }
    let path = ledger_path(&cfg.store, &|name| std::env::var_os(name))?;
    let records = if path.exists() {
        let ledger = SqliteLedger::open(&path).with_context(|| format!("opening the ledger {}", path.display()))?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime
            .block_on(ledger.history(&args.session, args.limit))
            .with_context(|| format!("reading the journal in {}", path.display()))?
    } else {
        Vec::new()
    };
    // Redacted when written; again here for ledgers written before that.
    let redactor = cfg.redactor();
    let records: Vec<_> = records.into_iter().map(|r| r.redacted(&redactor)).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
    } else if records.is_empty() {
        let why = if path.exists() { "nothing recorded for it" } else { "no ledger file yet" };
        println!("no history for session {} in {} ({why})", args.session, path.display());
    } else {
        print!("{}", render_history(&records, now_ms()));
    }
    Ok(())
}

/// The journal as a table: a header, then one line per record, oldest first —
/// `time (ago)  action  outcome  reason  numbers`.
pub fn render_history(records: &[ActionRecord], now_ms: i64) -> String {
    let Some(first) = records.first() else {
        return String::new();
    };
    let mut servers: Vec<&str> = records.iter().map(|r| r.server.as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    let mut out = format!(
        "session {} on {} — {} entr{}, oldest first\n",
        first.session,
        servers.join(", "),
        records.len(),
        if records.len() == 1 { "y" } else { "ies" }
    );
    let when: Vec<String> =
        records.iter().map(|r| format!("{} ({})", utc_timestamp(r.at_ms), ago(now_ms - r.at_ms))).collect();
    let w_when = when.iter().map(|w| w.chars().count()).max().unwrap_or(0);
    let w_action = records.iter().map(|r| r.action.as_str().len()).max().unwrap_or(0);
    let w_outcome = records.iter().map(|r| r.outcome.as_str().len()).max().unwrap_or(0);
    for (r, when) in records.iter().zip(&when) {
        let mut line = format!(
            "{when:<w_when$}  {:<w_action$}  {:<w_outcome$}  {}",
            r.action.as_str(),
            r.outcome.as_str(),
            r.reason
        );
        let numbers = numbers_text(r);
        if !numbers.is_empty() {
            line.push_str("  [");
            line.push_str(&numbers);
            line.push(']');
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The record's numbers as `key=value` pairs in alphabetical order, absent ones left out
/// (read through serde, so a number added to the schema shows up without a change here).
fn numbers_text(r: &ActionRecord) -> String {
    match serde_json::to_value(&r.numbers) {
        Ok(serde_json::Value::Object(map)) => map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
        _ => String::new(),
    }
}

/// Epoch milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn utc_timestamp(epoch_ms: i64) -> String {
    let secs = epoch_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 as a proleptic Gregorian date (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// How long ago, in the two largest units: `42s ago`, `3m12s ago`, `2h05m ago`, `4d03h ago`.
pub fn ago(elapsed_ms: i64) -> String {
    if elapsed_ms < 0 {
        return "in the future".to_string();
    }
    let s = elapsed_ms / 1000;
    let text = match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    };
    format!("{text} ago")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use shepherd_actors::journal::{Action, Numbers, Outcome};

    use super::*;

    fn record(action: Action, outcome: Outcome, reason: &str, at_ms: i64, numbers: Numbers) -> ActionRecord {
        ActionRecord {
            server: "local".into(),
            session: "ses_1".into(),
            action,
            outcome,
            reason: reason.into(),
            numbers,
            at_ms,
        }
    }

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(utc_timestamp(1_767_225_599_999), "2025-12-31 23:59:59Z");
    }

    #[test]
    fn elapsed_time_reads_in_its_two_largest_units() {
        assert_eq!(ago(42_000), "42s ago");
        assert_eq!(ago(192_000), "3m12s ago");
        assert_eq!(ago(7_500_000), "2h05m ago");
        assert_eq!(ago(4 * 86_400_000 + 3 * 3_600_000), "4d03h ago");
    }

    #[test]
    fn each_record_is_one_line_with_time_action_outcome_reason_and_numbers() {
        let t0 = 1_767_225_600_000; // 2026-01-01 00:00:00Z
        let records = vec![
            record(
                Action::StallDetected,
                Outcome::Done,
                "busy without progress",
                t0,
                Numbers { idle_for_ms: Some(180_000), timeout_ms: Some(180_000), ..Numbers::default() },
            ),
            record(Action::Continue, Outcome::Done, "sent", t0 + 2_000, Numbers::default()),
        ];
        let text = render_history(&records, t0 + 62_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "session ses_1 on local — 2 entries, oldest first");
        assert_eq!(
            lines[1],
            "2026-01-01 00:00:00Z (1m02s ago)  stall_detected  done  busy without progress  \
             [idle_for_ms=180000 timeout_ms=180000]"
        );
        assert_eq!(lines[2], "2026-01-01 00:00:02Z (1m00s ago)  continue        done  sent");
    }
}
