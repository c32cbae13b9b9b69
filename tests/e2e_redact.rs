//! Redaction on the real OpenCode server: secrets a person pasted into a request, or a
//! model wrote into its reply, reach none of the texts Shepherd lets out — the fresh
//! session after a hand-off, the hand-off file, the journal and its ledger, the status
//! API, the advisor's model, the log.

mod support;

use std::time::Duration;

use shepherd_actors::config::{AdvisorConfig, Config, StoreBackend};
use shepherd_actors::journal::{Action, Outcome};
use shepherd_actors::ledger::Ledger as _;
use shepherd_testbed::fake_model::{Behaviour, ADVISOR_MODEL};
use support::{fresh_sessions, Rig, PATIENCE};
use tempfile::TempDir;

/// The secret values (realistic shapes, fake values): none may appear anywhere.
const SECRETS: [&str; 5] = [
    "hunter2-Xq8-env-secret",
    "pg-S3cret-in-url",
    "R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx",
    "json-Pa55-w0rd",
    "title-S3cret-9",
];

/// A person's request holding the first four.
fn request() -> String {
    format!(
        "Deploy it. DATABASE_PASSWORD={} and psql postgres://app:{}@db.internal:5432/shop \
         with the token ghp_{}; the config is {{\"user\": \"ada\", \"password\": \"{}\"}}.",
        SECRETS[0], SECRETS[1], SECRETS[2], SECRETS[3]
    )
}

/// The session's title holds the fifth.
fn title() -> String {
    format!("deploy with API_KEY={}", SECRETS[4])
}

fn assert_clean(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{s} leaked into {what}:\n{text}");
    }
}


fn logged() -> String {
    support::logs::logged()
}

/// A real SQLite ledger (and the hand-off files) in `state`.
fn persistent(c: &mut Config, state: &TempDir) {
    c.store.backend = StoreBackend::Sqlite;
    c.store.path = state.path().join("ledger.sqlite3").to_string_lossy().into_owned();
}

#[actix::test]
async fn secrets_in_a_request_reach_neither_the_fresh_session_nor_the_hand_off_file_nor_the_status_nor_the_logs(
) -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::DEBUG);
    let state = tempfile::tempdir()?;
    let mut rig = support::control::start(&state, "SHEPHERD_E2E_REDACT_TOKEN", |c| persistent(c, &state)).await?;
    let old = rig.client.create_session(Some(&title())).await?;
    let prompt = format!("[[fake:todo:create]] [[fake:bigusage:170000]] {}", request());
    rig.client.prompt_async(&old, &prompt, None, None, false).await?;
    rig.wait_phase(&old, "completed", PATIENCE * 2).await?;
    let fresh = fresh_sessions(&rig).await?;
    assert_eq!(fresh.len(), 1, "one fresh session: {fresh:#?}");
    let new = fresh[0]["id"].as_str().unwrap().to_string();
    rig.client.wait_idle(&new, PATIENCE).await?;

    // The fresh session: its title and every part of every message, read back over REST.
    let messages = rig.client.messages(&new).await?;
    let all: Vec<_> = messages.iter().map(|m| serde_json::json!({"info": m.info, "parts": m.parts})).collect();
    let text = serde_json::to_string(&all)?;
    assert!(text.contains("DATABASE_PASSWORD=[REDACTED]"), "the continuation keeps the key names: {text}");
    assert!(text.contains("postgres://app:[REDACTED]@db.internal"), "{text}");
    assert_clean("the fresh session's messages", &text);
    assert_clean("the fresh session's title", &rig.client.session(&new).await?.to_string());

    // The hand-off file(s).
    let mut files = 0;
    for entry in std::fs::read_dir(state.path().join("handoffs"))? {
        let path = entry?.path();
        assert_clean(&path.display().to_string(), &String::from_utf8_lossy(&std::fs::read(&path)?));
        files += 1;
    }
    assert!(files >= 1, "a hand-off file was written");

    // The status API (titles, histories) and the session list.
    let api = support::control::Api::of(&rig);
    for path in ["/v1/status", "/v1/sessions", &format!("/v1/sessions/{old}")] {
        let body = api.http.get(format!("{}{path}", api.url)).bearer_auth(&api.token).send().await?.text().await?;
        assert!(body.contains(&old), "{path} answered about the session: {body}");
        assert_clean(path, &body);
    }
    rig.stop().await;

    // The journal as `shepherd history` reads it.
    let ledger = shepherd::store::SqliteLedger::open(&state.path().join("ledger.sqlite3"))?;
    let history = ledger.history(&old, 1000).await?;
    assert!(history.iter().any(|r| r.action == Action::Handoff), "{history:?}");
    assert_clean("the ledger's journal", &serde_json::to_string(&history)?);

    let logs = logged();
    assert!(logs.contains(&old), "the hand-off was logged");
    assert_clean("the log", &logs);
    Ok(())
}

#[actix::test]
async fn a_secret_the_model_wrote_reaches_neither_the_journal_nor_the_ledger_nor_the_logs() -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::DEBUG);
    let state = tempfile::tempdir()?;
    let mut rig = Rig::start_config(|c| {
        persistent(c, &state);
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.recovery.tool_call_as_text_message = "[[fake:ok]] TOOL-AS-TEXT {pattern}: call it properly.".into();
    })
    .await?;
    let id = rig.client.create_session(Some("tool call as text")).await?;
    // The model writes a tool call as text, with a secret in it, and stalls: the continue's
    // record quotes an excerpt of that text.
    let reply = format!("<function=bash><parameter=command>DATABASE_PASSWORD={} ./deploy", SECRETS[0]);
    rig.client.prompt_async(&id, &format!("[[fake:saystall:{reply}]] set it up"), None, None, false).await?;
    let cont = rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    assert!(cont.reason.contains("<function=") && cont.reason.contains("DATABASE_PASSWORD=[REDACTED]"), "{cont:?}");
    assert_clean("the journal", &serde_json::to_string(&rig.seen_so_far())?);
    rig.client.wait_idle(&id, PATIENCE).await?;
    rig.stop().await;

    let ledger = shepherd::store::SqliteLedger::open(&state.path().join("ledger.sqlite3"))?;
    let history = ledger.history(&id, 1000).await?;
    assert!(history.iter().any(|r| r.action == Action::Continue), "{history:?}");
    assert_clean("the ledger's journal", &serde_json::to_string(&history)?);
    let logs = logged();
    assert!(logs.contains("TOOL-AS-TEXT") || logs.contains("tool-call-as-text"), "the continue was logged");
    assert_clean("the log", &logs);
    Ok(())
}

#[actix::test]
async fn the_advisors_model_is_never_sent_a_secret() -> anyhow::Result<()> {
    support::logs::capture(tracing::Level::DEBUG);
    let mut rig = Rig::start_with_fake(
        |c, fake| {
            c.nudge.enabled = false;
            c.review.enabled = false;
            c.advisor = AdvisorConfig {
                enabled: true,
                base_url: fake.base_url(),
                model: ADVISOR_MODEL.into(),
                timeout: Duration::from_secs(5), // room for a loaded host
                postpone: Duration::from_secs(3),
                // Test sessions are seconds old: "new session" would make every case obvious.
                new_session: Duration::ZERO,
                ..AdvisorConfig::default()
            };
        },
        |o| o,
        Ok,
    )
    .await?;
    rig.fake.set_advisor_answers(vec![Behaviour::Say("Stuck. @abort:0.9".into())]);
    let id = rig.client.create_session(Some(&title())).await?;
    rig.client.prompt_async(&id, &format!("[[fake:stall]] {}", request()), None, None, false).await?;
    rig.wait_record(&id, Action::Advise, Outcome::Done, PATIENCE).await?;

    let asked = rig.fake.advisor_requests();
    assert!(!asked.is_empty(), "the model was asked");
    let body = serde_json::to_string(&asked.iter().map(|r| &r.body).collect::<Vec<_>>())?;
    assert!(body.contains("DATABASE_PASSWORD=[REDACTED]"), "the messages were sent, redacted: {body}");
    assert_clean("the advisor's request", &body);
    rig.stop().await;
    Ok(())
}
