//! `shepherd status`: the status file, readable. Pure: the document and the time in,
//! text out.

use shepherd_actors::stats::{Histogram, StatusDocument};


/// One block per session (most recently active first), with a header line.
pub fn render_status(doc: &StatusDocument, now_ms: i64) -> String {
    // The live states are re-read every `status.refresh_interval`: say so when older.
    let live = match doc.live_at_ms {
        Some(at) if doc.timestamp - at >= 1_000 => format!(" (states as of {} ago)", ago(now_ms - at)),
        _ => String::new(),
    };
    let mut out = match doc.stopped_at_ms {
        Some(at) => format!(
            "Shepherd {} — STOPPED {} ago; its {} session(s) as last seen\n",
            doc.instance,
            ago(now_ms - at),
            doc.sessions.len()
        ),
        None => format!(
            "Shepherd {} — status written {} ago{live}, {} session(s)\n",
            doc.instance,
            ago(now_ms - doc.timestamp),
            doc.sessions.len()
        ),
    };
    let mut sessions: Vec<_> = doc.sessions.iter().collect();
    sessions.sort_by_key(|(id, s)| (std::cmp::Reverse(s.history.last().map_or(0, |h| h.at_ms)), (*id).clone()));
    for (id, s) in sessions {
        out.push('\n');
        let handoff = match s.handoff_phase.as_deref() {
            Some(p) if p != "monitoring" => format!("  hand-off {p}"),
            _ => String::new(),
        };
        let watched = match s.elapsed {
            0 => String::new(),
            ms => format!("  first acted on {} ago", duration(ms)),
        };
        out.push_str(&format!("{id}  [{}]  {}{handoff}{watched}\n", s.server, s.status));
        let r = &s.recovery;
        out.push_str(&format!(
            "  recovery    {} attempts, {} succeeded, {} failed; time to recover {}\n",
            r.attempts,
            r.successes,
            r.failures,
            histogram(&r.histogram)
        ));
        let patterns: Vec<String> = s.stall.patterns.iter().map(|p| format!("{} ×{}", p.part, p.count)).collect();
        out.push_str(&format!(
            "  stalls      {} detected; last after {}; after: {}\n",
            s.stall.detections,
            s.stall.last_part.as_deref().unwrap_or("-"),
            if patterns.is_empty() { "-".to_string() } else { patterns.join(", ") }
        ));
        out.push_str(&format!(
            "  follow-ups  nudges {}, reviews {}, compactions {} ({} failed), hand-offs {}, escalations {}, \
             spinning tools {}, tool calls as text {}\n",
            s.nudge.done,
            s.review.done,
            s.compaction.done,
            s.compaction.failed,
            s.handoff.done,
            s.escalations,
            s.spinning_tools,
            s.tool_calls_as_text
        ));
        let context = match (s.tokens, s.window) {
            (Some(t), Some(w)) if w > 0 => format!("{t} of {w} tokens ({:.0}%)", t as f64 * 100.0 / w as f64),
            (Some(t), _) => format!("{t} tokens"),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "  todos       {} open of {} ({} done); context {context}\n",
            s.todos.open, s.todos.total, s.todos.completed
        ));
        for h in s.history.iter().rev().take(3) {
            out.push_str(&format!("  {:>4} ago   {} {}: {}\n", ago(now_ms - h.at_ms), h.action.as_str(), h.outcome.as_str(), h.reason));
        }
    }
    out
}

fn histogram(h: &Histogram) -> String {
    match (h.min_ms, h.median_ms, h.max_ms) {
        (Some(min), Some(median), Some(max)) => format!(
            "min {} / median {} / max {} ({} samples)",
            duration(min as i64),
            duration(median as i64),
            duration(max as i64),
            h.samples
        ),
        _ => "-".to_string(),
    }
}

/// `850ms`, `4.2s`, `3m10s`, `2h05m`.
fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

/// How long ago, as the status text, the table and `shepherd top` write it:
/// `42s`, `3m`, `5h`, `2d` (a time in the future, from clock skew, is `0s`).
pub fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_actors::journal::{Action, ActionRecord, Numbers, Outcome};
    use shepherd_actors::stats::StatsBook;

    #[test]
    fn a_session_is_shown_with_its_recoveries_stalls_and_latest_history() {
        let mut book = StatsBook::new(10);
        let rec = |at_ms, action, reason: &str, last_part: Option<&str>| ActionRecord {
            server: "local".into(),
            session: "ses_A".into(),
            action,
            outcome: Outcome::Done,
            reason: reason.into(),
            numbers: Numbers { last_part: last_part.map(str::to_string), ..Numbers::default() },
            at_ms,
        };
        book.apply(&rec(1_000, Action::StallDetected, "busy with no progress", Some("reasoning")));
        book.apply(&rec(5_200, Action::Continue, "continue sent after the abort", None));
        let doc = book.document(&[], 10_000, &[], 10_000, "inst1");
        let text = render_status(&doc, 12_000);
        assert!(text.starts_with("Shepherd inst1 — status written 2s ago, 1 session(s)"), "{text}");
        assert!(text.contains("ses_A  [local]  untracked  first acted on "), "{text}");
        assert!(text.contains("1 attempts, 1 succeeded, 0 failed; time to recover min 4.2s / median 4.2s"), "{text}");
        assert!(text.contains("last after reasoning; after: reasoning ×1"), "{text}");
        assert!(text.contains("continue done: continue sent after the abort"), "{text}");
        let doc = book.document(&[], 4_000, &[], 10_000, "inst1");
        let text = render_status(&doc, 12_000);
        assert!(text.starts_with("Shepherd inst1 — status written 2s ago (states as of 8s ago), 1 session(s)"), "{text}");
        let stopped = StatusDocument { stopped_at_ms: Some(10_000), ..doc };
        let text = render_status(&stopped, 70_000);
        assert!(text.starts_with("Shepherd inst1 — STOPPED 1m ago; its 1 session(s) as last seen"), "{text}");
    }

    #[test]
    fn durations_read_naturally() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(190_000), "3m10s");
        assert_eq!(duration(7_500_000), "2h05m");
    }
}
