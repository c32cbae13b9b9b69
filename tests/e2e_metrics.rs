//! `/metrics` and `/readyz` against the real OpenCode server, driven by the fake model.
//!
//! A scripted run — one stall recovered, one nudge sent, one custom prompt deduplicated —
//! is scraped and the exposition parsed: the counts the script determines are asserted
//! exactly. Both tests run a daemon each in this one process, so they also show that each
//! daemon's `/metrics` holds its own numbers (no global recorder).

mod support;

use std::time::Duration;

use serde_json::Value;
use shepherd::metrics::exposition::{try_parse, value, Sample};
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::client::wait_until;
use support::control::Api;
use support::{Rig, PATIENCE};
use tempfile::TempDir;

/// Named by the test config, set nowhere: the daemon generates its token.
const UNSET_TOKEN_ENV: &str = "SHEPHERD_E2E_METRICS_TOKEN_NEVER_SET";

impl Api {
    async fn get(&self, path: &str, token: bool) -> anyhow::Result<(u16, String)> {
        let mut req = self.http.get(format!("{}{path}", self.url));
        if token {
            req = req.bearer_auth(&self.token);
        }
        let response = req.send().await?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    async fn json(&self, path: &str, token: bool) -> anyhow::Result<(u16, Value)> {
        let (status, text) = self.get(path, token).await?;
        Ok((status, serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{status} {text}: {e}"))?))
    }

    async fn prompt(&self, session: &str, message: &str) -> anyhow::Result<Value> {
        let body = serde_json::json!({ "message": message }).to_string();
        let response = self
            .http
            .post(format!("{}/v1/sessions/{session}/prompt", self.url))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await?;
        Ok(response.json().await?)
    }

    /// The exposition, parsed (every line must be a valid sample or comment).
    async fn scrape(&self) -> anyhow::Result<(String, Vec<Sample>)> {
        let (status, text) = self.get("/metrics", true).await?;
        anyhow::ensure!(status == 200, "/metrics answered {status}: {text}");
        let samples = try_parse(&text).map_err(anyhow::Error::msg)?;
        Ok((text, samples))
    }

    /// Scrapes until `name{labels}` reads `want` (the journal is folded in the background).
    async fn scrape_until(&self, name: &str, labels: &[(&str, &str)], want: f64) -> anyhow::Result<Vec<Sample>> {
        wait_until(&format!("{name}{labels:?} = {want}"), PATIENCE, || async {
            let (_, samples) = self.scrape().await?;
            anyhow::Ok((value(&samples, name, labels) == Some(want)).then_some(samples))
        })
        .await
    }
}

/// A rig whose daemon serves the control API (token required for reads), with nudges
/// quick and scripted to finish the todos, and reviews off (so the run's prompts are
/// exactly the ones the test makes happen).
async fn start(state: &TempDir) -> anyhow::Result<Rig> {
    support::control::start(state, UNSET_TOKEN_ENV, |c| {
        c.nudge.enabled = true;
        c.nudge.user_quiet = Duration::ZERO;
        c.nudge.idle_delay = Duration::from_millis(300);
        c.nudge.cooldown = Duration::from_secs(600);
        c.nudge.message = "[[fake:todo:done]] Keep going: {pending} of {total} open".into();
    })
    .await
}

#[actix::test]
async fn a_scripted_run_reads_back_from_metrics_with_exact_counts_and_no_secrets() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let mut rig = start(&state).await?;
    let api = Api::of(&rig);

    // A stall, recovered by abort + continue.
    let stalled = rig.client.create_session(Some("stall")).await?;
    rig.client.prompt_async(&stalled, "[[fake:stall]] start and go quiet", None, None, false).await?;
    // Idle with open todos: one nudge (which finishes them).
    let nudged = rig.client.create_session(Some("nudge")).await?;
    rig.client.prompt_async(&nudged, "[[fake:todo:create]] plan and stop", None, None, false).await?;
    // A person's prompt, then a reworded copy of it: deduplicated by the guard.
    let prompted = rig.client.create_session(Some("dedupe")).await?;
    rig.client.prompt_async(&prompted, "[[fake:ok]] hello", None, None, false).await?;
    rig.client.wait_busy(&prompted, PATIENCE).await.ok();
    rig.client.wait_idle(&prompted, PATIENCE).await?;
    let first = api.prompt(&prompted, "[[fake:ok]] Please continue working").await?;
    assert_eq!(first["success"], true, "{first}");
    let second = api.prompt(&prompted, "[[fake:ok]] Continue working on tasks").await?;
    assert_eq!(second["success"], false, "{second}");

    rig.wait_record(&stalled, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.wait_record(&nudged, Action::Nudge, Outcome::Done, PATIENCE).await?;
    for id in [&stalled, &nudged, &prompted] {
        rig.client.wait_idle(id, PATIENCE).await?;
    }

    let s = api.scrape_until("shepherd_nudges_total", &[("outcome", "done")], 1.0).await?;
    let s = if value(&s, "shepherd_prompts_total", &[("kind", "custom"), ("outcome", "deduplicated")]) == Some(1.0) {
        s
    } else {
        api.scrape_until("shepherd_prompts_total", &[("kind", "custom"), ("outcome", "deduplicated")], 1.0).await?
    };
    let prompts = |kind, outcome| value(&s, "shepherd_prompts_total", &[("kind", kind), ("outcome", outcome)]);
    assert_eq!(value(&s, "shepherd_stall_detections_total", &[]), Some(1.0));
    assert_eq!(value(&s, "shepherd_stall_detection_delay_seconds_count", &[]), Some(1.0));
    let late = value(&s, "shepherd_stall_detection_delay_seconds_sum", &[]).unwrap_or(f64::NAN);
    // Within a second on a quiet host; the bound leaves room for a loaded one.
    assert!((0.0..5.0).contains(&late), "a daemon looks at a stall within seconds of its deadline: {late} s");
    assert_eq!(value(&s, "shepherd_recoveries_total", &[("outcome", "succeeded")]), Some(1.0));
    assert_eq!(value(&s, "shepherd_recovery_duration_seconds_count", &[]), Some(1.0));
    let took = value(&s, "shepherd_recovery_duration_seconds_sum", &[]).unwrap_or(0.0);
    assert!(took > 0.0 && took < PATIENCE.as_secs_f64(), "recovery took {took} s");
    assert_eq!(
        value(&s, "shepherd_actions_total", &[("action", "abort"), ("outcome", "done"), ("reason", "none")]),
        Some(1.0)
    );
    assert_eq!(prompts("continue", "sent"), Some(1.0));
    assert_eq!(prompts("nudge", "sent"), Some(1.0));
    assert_eq!(prompts("custom", "sent"), Some(1.0));
    assert_eq!(prompts("custom", "deduplicated"), Some(1.0));
    assert_eq!(
        value(&s, "shepherd_actions_total", &[("action", "prompt"), ("outcome", "declined"), ("reason", "duplicate")]),
        Some(1.0)
    );
    assert_eq!(value(&s, "shepherd_nudges_total", &[("outcome", "done")]), Some(1.0));
    assert_eq!(value(&s, "shepherd_reviews_total", &[]), None, "reviews are off");

    // Every journal record is in `shepherd_actions_total`, and nothing else is (polled:
    // the metrics fold the journal in the background).
    let journal_matches = |rig: &mut Rig, s: &[Sample]| {
        rig.records_for(&stalled); // pulls every record seen so far
        let mut journal: std::collections::BTreeMap<(&str, &str), f64> = Default::default();
        for r in &rig.seen {
            *journal.entry((r.action.as_str(), r.outcome.as_str())).or_default() += 1.0;
        }
        let by_kind = journal.iter().all(|((action, outcome), n)| {
            value(s, "shepherd_actions_total", &[("action", action), ("outcome", outcome)]) == Some(*n)
        });
        by_kind && value(s, "shepherd_actions_total", &[]) == Some(rig.seen.len() as f64)
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !journal_matches(&mut rig, &api.scrape().await?.1) {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "/metrics never matched the journal: {:#?}", rig.seen);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Scrape-time facts: the stream, the events, the sessions.
    let local = [("server", "local")];
    assert_eq!(value(&s, "shepherd_stream_connected", &local), Some(1.0));
    assert_eq!(value(&s, "shepherd_server_ready", &local), Some(1.0));
    assert_eq!(value(&s, "shepherd_stream_reconnects_total", &local), Some(0.0));
    assert_eq!(value(&s, "shepherd_events_malformed_total", &local), Some(0.0));
    let age = value(&s, "shepherd_stream_last_event_age_seconds", &local).expect("a frame arrived");
    assert!((0.0..30.0).contains(&age), "last event {age} s ago");
    let status_events = value(&s, "shepherd_events_ingested_total", &[("server", "local"), ("type", "session.status")]);
    assert!(status_events.unwrap_or(0.0) >= 6.0, "busy + idle of three sessions at least: {status_events:?}");
    let (_, sessions) = api.json("/v1/sessions", true).await?;
    let tracked = sessions.as_array().map_or(0, Vec::len) as f64;
    assert!(tracked >= 3.0, "{sessions}");
    assert_eq!(value(&s, "shepherd_sessions", &local), Some(tracked), "every tracked session has one state");
    assert_eq!(value(&s, "shepherd_sessions", &[("server", "local"), ("state", "working")]), Some(0.0));
    // Every call to OpenCode is timed by its template: the one abort, among the rest.
    let calls = |call| {
        value(&s, "shepherd_opencode_request_duration_seconds_count", &[("server", "local"), ("call", call), ("outcome", "ok")])
    };
    assert_eq!(calls("POST /session/{id}/abort"), Some(1.0), "the stall's one abort");
    assert!(calls("GET /session/status").unwrap_or(0.0) >= 1.0, "the status read before the abort");
    let waits = calls("GET /session/status (a reader's wait, shared reads)").unwrap_or(0.0);
    assert!(waits >= 1.0, "the recovery's wait for that read, timed whole: {waits}");
    assert!(calls("POST /session/{id}/prompt_async").unwrap_or(0.0) >= 2.0, "the continue and the nudge");
    // And every ledger write: the recovery's intent written before its abort among them.
    let puts = value(&s, "shepherd_ledger_write_duration_seconds_count", &[("operation", "put_intent")]);
    assert!(puts.unwrap_or(0.0) >= 2.0, "the recovery's intent, before and after its abort: {puts:?}");

    // Exposition hygiene: types declared, units in names, nothing that identifies a
    // session or opens a door.
    let (text, _) = api.scrape().await?;
    assert!(text.contains("# TYPE shepherd_recovery_duration_seconds histogram"), "{text}");
    assert!(text.contains("# TYPE shepherd_stall_detection_delay_seconds histogram"), "{text}");
    assert!(text.contains("# TYPE shepherd_opencode_request_duration_seconds histogram"), "{text}");
    assert!(text.contains("# TYPE shepherd_prompts_total counter"), "{text}");
    assert!(text.contains("# TYPE shepherd_sessions gauge"), "{text}");
    for secret in [&api.token, &stalled, &nudged, &prompted, &rig.opencode.url()] {
        assert!(!text.contains(secret.as_str()), "/metrics must not show {secret}");
    }
    // The Grafana dashboard in contrib/ queries only metrics this scrape declares.
    let dashboard: Value = serde_json::from_str(include_str!("../contrib/grafana/shepherd.json"))?;
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .chain(dashboard["templating"]["list"].as_array().into_iter().flatten().filter_map(|v| v["query"].as_str()))
        .collect();
    let mut queried = std::collections::BTreeSet::new();
    for expr in &exprs {
        for (at, _) in expr.match_indices("shepherd_") {
            let name: String = expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // A histogram's series are declared under its base name.
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
            queried.insert(base.to_string());
        }
    }
    assert!(queried.len() >= 10, "{queried:?}");
    for name in &queried {
        assert!(text.contains(&format!("# TYPE {name} ")), "the dashboard queries {name}, which /metrics does not declare");
    }
    assert_eq!(api.get("/metrics", false).await?.0, 401, "metrics need the token");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn readyz_turns_503_naming_the_server_while_opencode_is_gone_and_200_when_it_is_back() -> anyhow::Result<()> {
    let state = TempDir::new()?;
    let mut rig = start(&state).await?;
    let api = Api::of(&rig);
    let (status, body) = api.json("/readyz", false).await?;
    assert_eq!((status, &body), (200, &serde_json::json!({ "ready": true })), "probed without a token");
    assert_eq!(api.json("/healthz", false).await?.0, 200);

    rig.opencode.stop().await;
    let body = wait_until("/readyz to answer 503", PATIENCE, || async {
        let (status, body) = api.json("/readyz", false).await?;
        anyhow::Ok((status == 503).then_some(body))
    })
    .await?;
    assert_eq!(body["ready"], false);
    assert_eq!(body["not_ready"], serde_json::json!([{ "server": "local", "reason": "stream not connected" }]));
    let text = body.to_string();
    assert!(!text.contains(&rig.opencode.port().to_string()) && !text.contains("http"), "no address: {text}");
    let (_, s) = api.scrape().await?;
    assert_eq!(value(&s, "shepherd_stream_connected", &[("server", "local")]), Some(0.0));
    assert_eq!(value(&s, "shepherd_server_ready", &[("server", "local")]), Some(0.0));
    assert_eq!(api.get("/healthz", false).await?.0, 200, "the process is still up");

    rig.opencode.respawn().await?;
    wait_until("/readyz to answer 200 again", PATIENCE, || async {
        let (status, _) = api.json("/readyz", false).await?;
        anyhow::Ok((status == 200).then_some(()))
    })
    .await?;
    let (_, s) = api.scrape().await?;
    assert_eq!(value(&s, "shepherd_stream_reconnects_total", &[("server", "local")]), Some(1.0));
    assert_eq!(value(&s, "shepherd_server_ready", &[("server", "local")]), Some(1.0));
    rig.stop().await;
    Ok(())
}
