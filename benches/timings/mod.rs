//! Where a stall phase's time went, as Shepherd itself measures it: every call to the
//! OpenCode server by its template, until the answer's head
//! (`shepherd_opencode_request_duration_seconds`), and every ledger write by its
//! operation (`shepherd_ledger_write_duration_seconds`), and how long after its deadline
//! each stall was detected (`shepherd_stall_detection_delay_seconds`), read from the
//! daemon's own `/metrics` exposition before and after the phase. The abort's tail is
//! the detection's delay (the timer, the wait for stream time), then a status read, an
//! intent's write and the abort itself; these say which of them grew, without a probe
//! patched into the daemon.

use std::collections::BTreeMap;

use shepherd::metrics::exposition;

/// The histograms read, each with the label that says what was timed, or the name a
/// histogram without one is shown by.
const HISTOGRAMS: [(&str, Timed); 3] = [
    ("shepherd_opencode_request_duration_seconds", Timed::Label("call")),
    ("shepherd_ledger_write_duration_seconds", Timed::Label("operation")),
    ("shepherd_stall_detection_delay_seconds", Timed::Named("stall detected after its deadline")),
];

/// What a histogram's series time.
enum Timed {
    /// Told apart by this label (the call's template, the ledger operation).
    Label(&'static str),
    /// One series, shown by this name.
    Named(&'static str),
}

/// The bounds (seconds) a share of slow ones is told against: both are bucket bounds of
/// every histogram read, so the shares are exact.
const SLOW: [f64; 2] = [0.005, 0.010];

/// One histogram series: how many, their sum (s), and the cumulative count at each
/// bucket bound.
#[derive(Debug, Default, Clone)]
struct Series {
    count: f64,
    sum: f64,
    within: BTreeMap<u64, f64>,
}

/// Every series of the two histograms in one exposition, by what was timed (the call's
/// template or the ledger operation, with its outcome when it is not `ok`).
#[derive(Debug, Default, Clone)]
pub struct Timings(BTreeMap<String, Series>);

impl Timings {
    /// Reads them from a Prometheus text exposition (with the project's own reader).
    pub fn parse(exposition: &str) -> Timings {
        let mut all: BTreeMap<String, Series> = BTreeMap::new();
        for sample in exposition::parse(exposition) {
            for (histogram, what) in &HISTOGRAMS {
                let Some(part) = sample.name.strip_prefix(histogram) else { continue };
                let timed = match what {
                    Timed::Label(label) => match sample.label(label) {
                        Some(timed) => timed,
                        None => continue,
                    },
                    Timed::Named(name) => name,
                };
                let key = match sample.label("outcome").filter(|o| *o != "ok") {
                    Some(outcome) => format!("{timed} ({outcome})"),
                    None => timed.to_string(),
                };
                let s = all.entry(key).or_default();
                match part {
                    "_count" => s.count += sample.value,
                    "_sum" => s.sum += sample.value,
                    "_bucket" => {
                        if let Some(le) = sample.label("le").and_then(|le| le.parse::<f64>().ok()) {
                            *s.within.entry(le.to_bits()).or_default() += sample.value;
                        }
                    }
                    _ => {}
                }
            }
        }
        Timings(all)
    }

    /// What was timed between `before` and `self`, one entry per call or operation that
    /// happened: `call 909 × 1.9 ms (2.1 % over 5 ms, 0.3 % over 10 ms)`.
    pub fn since(&self, before: &Timings) -> String {
        let mut parts = Vec::new();
        for (key, after) in &self.0 {
            let was = before.0.get(key).cloned().unwrap_or_default();
            let n = after.count - was.count;
            if n < 1.0 {
                continue;
            }
            let mean_ms = (after.sum - was.sum) / n * 1e3;
            let over: Vec<String> = SLOW
                .iter()
                .map(|&bound| {
                    let within = |s: &Series| s.within.get(&bound.to_bits()).copied().unwrap_or(0.0);
                    let slow = n - (within(after) - within(&was));
                    format!("{:.1} % over {} ms", 100.0 * slow / n, bound * 1e3)
                })
                .collect();
            parts.push(format!("{key} {n:.0} × {mean_ms:.1} ms ({})", over.join(", ")));
        }
        parts.join("; ")
    }
}
