//! The advisor on the real OpenCode server: the fake model plays both the session's
//! model and the advisor's (requests for `advisor-model` get the scripted answers).
//! "The model advises, rules decide": a sure `wait` postpones an abort once; garbage,
//! a timeout or HTTP 500 still end in a decision, made by the heuristic, and the
//! journal says so.

mod support;

use std::time::Duration;

use shepherd_actors::config::{AdvisorConfig, Config};
use shepherd_actors::journal::{Action, Outcome};
use shepherd_testbed::fake_model::{Behaviour, FakeModel, ADVISOR_MODEL};
use support::{Rig, PATIENCE};

/// The secret the advisor's key variable holds: it must never reach a log line.
const KEY_VAR: &str = "SHEPHERD_E2E_ADVISOR_KEY";
const KEY: &str = "sk-e2e-advisor-9f8e7d6c5b4a";

fn advised(c: &mut Config, fake: &FakeModel) {
    c.advisor = AdvisorConfig {
        enabled: true,
        base_url: fake.base_url(),
        model: ADVISOR_MODEL.into(),
        api_key_env: KEY_VAR.into(),
        // Seconds of room for OpenCode's history read and the model's reply on a
        // loaded host (a hanging model still times out, a little later).
        timeout: Duration::from_secs(5),
        postpone: Duration::from_secs(3),
        // Test sessions are seconds old: "new session" would make every case obvious.
        new_session: Duration::ZERO,
        ..AdvisorConfig::default()
    };
}

async fn advised_rig() -> anyhow::Result<Rig> {
    support::logs::capture_raw(tracing::Level::DEBUG);
    std::env::set_var(KEY_VAR, KEY);
    Rig::start_with_fake(advised, |o| o, Ok).await
}

#[actix::test]
async fn a_sure_wait_postpones_the_abort_once_then_the_stall_is_recovered() -> anyhow::Result<()> {
    let mut rig = advised_rig().await?;
    rig.fake.set_advisor_answers(vec![Behaviour::Say("Still streaming, give it time. @wait:0.9".into())]);
    let id = rig.client.create_session(Some("advised stall")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;

    let advice = rig.wait_record(&id, Action::Advise, Outcome::Done, PATIENCE).await?;
    assert!(advice.reason.contains("postponed once"), "{}", advice.reason);
    assert_eq!(advice.numbers.advice.as_deref(), Some("wait:0.90"));
    assert_eq!(advice.numbers.advice_source.as_deref(), Some("model"));
    assert!(rig.client.is_busy(&id).await?, "not aborted when the advice came");

    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert!(stall.at_ms - advice.at_ms >= 3000, "postponed by advisor.postpone: {advice:?} {stall:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert_eq!(rig.count(&id, Action::Abort), 1);
    assert_eq!(rig.count(&id, Action::Advise), 1, "asked once: the postponed abort goes ahead without asking");

    // The model was asked once, with the session's context and the bearer key.
    let asked = rig.fake.advisor_requests();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let user = asked[0].body.pointer("/messages/1/content").and_then(|v| v.as_str()).unwrap_or_default();
    assert!(user.contains("about to abort") && user.contains("user: [[fake:stall]] work"), "{user}");
    assert!(user.contains("Time since progress"), "{user}");
    rig.stop().await;
    Ok(())
}

/// Runs one stall with the advisor answering `answer`; returns the advice record's source.
async fn stall_with(rig: &mut Rig, answer: Behaviour, title: &str) -> anyhow::Result<String> {
    rig.fake.set_advisor_answers(vec![answer]);
    let id = rig.client.create_session(Some(title)).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;
    let advice = rig.wait_record(&id, Action::Advise, Outcome::Done, PATIENCE).await?;
    assert!(advice.reason.contains("goes ahead"), "{}", advice.reason);
    // A decision was made all the same: the stall is recovered.
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    Ok(advice.numbers.advice_source.unwrap_or_default())
}


#[actix::test]
async fn garbage_a_timeout_and_http_500_fall_back_to_the_heuristic_and_say_why() -> anyhow::Result<()> {
    let mut rig = advised_rig().await?;
    let garbage = stall_with(&mut rig, Behaviour::Say("I would probably wait a bit.".into()), "garbage").await?;
    assert!(garbage.contains("fallback: unparsable answer"), "{garbage}");
    let timeout = stall_with(&mut rig, Behaviour::Hang(None), "timeout").await?;
    assert!(timeout.contains("fallback: timeout after 5s"), "{timeout}");
    let http = stall_with(&mut rig, Behaviour::Err500, "http 500").await?;
    assert!(http.contains("fallback: model answered HTTP 500"), "{http}");
    assert_eq!(rig.fake.advisor_requests().len(), 3, "each stall asked the model once");
    rig.stop().await;

    let text = support::logs::logged();
    assert!(text.contains("shepherd::advisor") && text.contains("fallback"), "the consultations were logged");
    assert!(!text.contains(KEY), "the API key leaked into the logs");
    Ok(())
}

#[actix::test]
async fn a_sure_wait_skips_a_nudge_which_comes_back_after_postpone_unasked() -> anyhow::Result<()> {
    let mut rig = {
        support::logs::capture_raw(tracing::Level::DEBUG);
        std::env::set_var(KEY_VAR, KEY);
        Rig::start_with_fake(
            |c, fake| {
                advised(c, fake);
                c.nudge.user_quiet = Duration::ZERO;
                c.nudge.idle_delay = Duration::from_millis(300);
                // The nudge tells the fake model to finish its todos.
                c.nudge.message = "[[fake:todo:done]] Keep going: {pending} of {total} open:\n{todoList}".into();
            },
            |o| o,
            Ok,
        )
        .await?
    };
    rig.fake.set_advisor_answers(vec![Behaviour::Say("The agent is thinking it over. @wait:0.9".into())]);
    let id = rig.client.create_session(Some("advised nudge")).await?;
    rig.client.prompt_async(&id, "[[fake:todo:create]] plan and stop", None, None, false).await?;

    let skipped = rig.wait_record(&id, Action::Nudge, Outcome::Declined, PATIENCE).await?;
    assert!(skipped.reason.contains("nudge skipped"), "{}", skipped.reason);
    assert_eq!(skipped.numbers.advice.as_deref(), Some("wait:0.90"));
    assert_eq!(skipped.numbers.advice_source.as_deref(), Some("model"));
    let todos = rig.client.todos(&id).await?;
    assert!(todos.iter().any(|t| t.status != "completed"), "nothing was sent: the todos are still open");

    // Not stranded: after advisor.postpone the nudge goes, without asking again.
    let sent = rig.wait_record(&id, Action::Nudge, Outcome::Done, PATIENCE).await?;
    assert!(sent.at_ms - skipped.at_ms >= 3000, "after advisor.postpone: {skipped:?} {sent:?}");
    rig.client.wait_idle(&id, PATIENCE).await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while rig.client.todos(&id).await?.iter().any(|t| t.status != "completed") {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the nudge never got the todos done");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rig.fake.advisor_requests().len(), 1, "the model was asked once, before the first nudge");
    assert_eq!(rig.count(&id, Action::Nudge), 1, "one nudge sent (after the skipped one)");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn without_a_model_the_heuristics_advise_a_new_session_stall_waits_once() -> anyhow::Result<()> {
    // The default configuration: advice on, no model. A session younger than
    // advisor.new_session is given advisor.postpone (2 s in the rig) before its abort.
    let mut rig = Rig::start_config(|c| c.advisor.new_session = Duration::from_secs(120)).await?;
    let id = rig.client.create_session(Some("heuristic stall")).await?;
    rig.client.prompt_async(&id, "[[fake:stall]] work", None, None, false).await?;

    let advice = rig.wait_record(&id, Action::Advise, Outcome::Done, PATIENCE).await?;
    assert!(advice.reason.contains("postponed once"), "{}", advice.reason);
    assert!(advice.reason.contains("new session"), "the rule is named: {}", advice.reason);
    assert_eq!(advice.numbers.advice.as_deref(), Some("wait:0.95"));
    assert_eq!(advice.numbers.advice_source.as_deref(), Some("heuristic (no model configured)"));
    assert!(rig.client.is_busy(&id).await?, "not aborted when the advice came");

    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert!(stall.at_ms - advice.at_ms >= 2000, "postponed by advisor.postpone: {advice:?} {stall:?}");
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    assert_eq!(rig.count(&id, Action::Abort), 1);
    assert!(rig.fake.advisor_requests().is_empty(), "no model is configured, none is called");
    rig.stop().await;
    Ok(())
}
