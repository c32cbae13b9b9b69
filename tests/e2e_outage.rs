//! Provider outages against the real OpenCode server: the fake model fails every turn
//! for a while (HTTP 429 with `retry-after: 1`, so OpenCode gives up after ~6 s of its
//! own retries), then answers again. Shepherd resumes each affected session once after
//! the outage, probes with one session while the server's breaker is open, and resumes
//! on the fallback model once the session's own model failed a resume.
//!
//! Timings are scaled down together: the provider back-off to 2 s (doubling, at most
//! 8 s), the guard's duplicate window to 1 s (below the back-off, as 30 s is below the
//! production 1 m: each step's resume is a new prompt, not a repeat of the last).

mod support;

use std::time::{Duration, SystemTime};

use shepherd_actors::config::Config;
use shepherd_actors::journal::{Action, ActionRecord, Outcome};
use shepherd_testbed::fake_model::{Behaviour, FakeRequest};
use support::{Rig, PATIENCE};

fn outage_rules(c: &mut Config) {
    let r = &mut c.recovery;
    r.provider_backoff = Duration::from_secs(2);
    r.provider_max_backoff = Duration::from_secs(8);
    r.fallback_models = vec!["fake/fake-model-2".into()];
    r.fallback_after = 1;
    r.fallback_cooldown = Duration::from_secs(10 * 60);
    r.breaker_sessions = 3;
    r.breaker_window = Duration::from_secs(60);
    r.breaker_probe_timeout = Duration::from_secs(30);
    c.guard.window = Duration::from_secs(1);
}

/// The model turns (not helper calls) of the session whose first prompt carried `tag`.
fn turns_of<'a>(requests: &'a [FakeRequest], tag: &'a str) -> impl Iterator<Item = &'a FakeRequest> + 'a {
    requests.iter().filter(move |r| !r.is_helper() && !r.is_advisor() && r.body.to_string().contains(tag))
}

fn resumes(seen: &[ActionRecord], session: &str) -> Vec<ActionRecord> {
    seen.iter()
        .filter(|r| {
            r.session == session
                && r.action == Action::Recover
                && r.outcome == Outcome::Done
                && r.reason.contains("after a provider error")
        })
        .cloned()
        .collect()
}

#[actix::test]
async fn every_session_hit_by_an_outage_resumes_once_after_it_one_probing_first_on_the_fallback() -> anyhow::Result<()>
{
    let mut rig = Rig::start_config(outage_rules).await?;
    rig.fake.set_outage(Some(Behaviour::Err429(1)));
    let tags = ["outage-alpha", "outage-bravo", "outage-charlie"];
    let mut ids = Vec::new();
    for tag in tags {
        let id = rig.client.create_session(Some(tag)).await?;
        rig.client.prompt_async(&id, &format!("work on {tag} [[fake:ok]]"), None, None, false).await?;
        ids.push(id);
    }
    // Each turn fails after OpenCode's retries; each failure is one provider_error record.
    for id in &ids {
        let r = rig.wait_record(id, Action::ProviderError, Outcome::Done, PATIENCE).await?;
        assert!(r.reason.contains("APIError 429"), "{}", r.reason);
        assert_eq!(r.numbers.backoff_ms, Some(2000), "step 1 waits provider_backoff");
    }
    // Three sessions within the window: the breaker opens, one session probes.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let probe = loop {
        let seen = rig.seen_so_far();
        if let Some(p) = ids.iter().find(|id| !resumes(&seen, id).is_empty()) {
            break p.clone();
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "nobody probed: {:#?}", seen);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seen = rig.seen_so_far();
    assert!(
        seen.iter().any(|r| r.action == Action::Breaker && r.reason.contains("breaker opened")),
        "the breaker opened: {seen:#?}"
    );
    // The probe's resume fails too (the outage goes on): a second failure, step 2.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let seen = rig.seen_so_far();
        let failures = seen
            .iter()
            .filter(|r| r.session == probe && r.action == Action::ProviderError && r.reason.contains("resume 2"))
            .count();
        if failures > 0 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the probe never failed again: {:#?}", seen);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // While the breaker was open only the probe resumed.
    let seen = rig.seen_so_far();
    for id in ids.iter().filter(|id| **id != probe) {
        assert!(resumes(&seen, id).is_empty(), "{id} waited for the probe: {:#?}", rig.records_for(id));
    }
    // The provider recovers.
    rig.fake.set_outage(None);
    let recovered_at = SystemTime::now();
    let recovered_ms = recovered_at.duration_since(SystemTime::UNIX_EPOCH)?.as_millis() as i64;
    for id in &ids {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let seen = rig.seen_so_far();
            if seen.iter().any(|r| r.session == *id && r.reason.contains("made progress again")) {
                break;
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "{id} never resumed: {:#?}", rig.records_for(id));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Longer than the largest back-off: nothing more is sent.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let seen = rig.seen_so_far();
    assert!(seen.iter().any(|r| r.action == Action::Breaker && r.reason.contains("breaker closed")), "{seen:#?}");
    let requests = rig.fake.requests();
    for (id, tag) in ids.iter().zip(tags) {
        let after: Vec<_> = resumes(&seen, id).into_iter().filter(|r| r.at_ms >= recovered_ms).collect();
        assert_eq!(after.len(), 1, "{id}: one resume after the outage: {:#?}", rig.records_for(id));
        let turns: Vec<_> = turns_of(&requests, tag).filter(|r| r.at >= recovered_at).collect();
        assert_eq!(turns.len(), 1, "{id}: one model call after the outage: {turns:#?}");
        assert_eq!(turns[0].behaviour(), Some(&Behaviour::Ok), "{id}: it was answered");
        // The probe's own model failed its resume: it came back on the fallback; the
        // others never resumed during the outage and come back on their own model.
        let model = if *id == probe { "fake-model-2" } else { "fake-model" };
        assert_eq!(turns[0].model, model, "{id}: {}", after[0].reason);
    }
    let probe_resume = &resumes(&seen, &probe).into_iter().filter(|r| r.at_ms >= recovered_ms).collect::<Vec<_>>()[0];
    assert!(
        probe_resume.reason.contains("fake/fake-model-2"),
        "the probe's own model failed its resume: the fallback is used: {}",
        probe_resume.reason
    );
    rig.stop().await;
    Ok(())
}
