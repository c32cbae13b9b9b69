//! Context tracking and compaction on the real OpenCode server.

mod support;

use std::time::Duration;

use shepherd_actors::journal::{Action, Outcome};
use support::{Rig, PATIENCE};

#[actix::test]
async fn an_idle_session_past_the_proactive_threshold_is_compacted_by_opencode() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.nudge.enabled = false;
        c.review.enabled = false;
    })
    .await?;
    let id = rig.client.create_session(Some("big")).await?;
    // 150k of a 200k window = 75%, past proactive (70%), below OpenCode's own 96%.
    rig.client.prompt_async(&id, "[[fake:bigusage:150000]] read everything", None, None, false).await?;
    let rec = rig.wait_record(&id, Action::Compact, Outcome::Done, PATIENCE).await?;
    assert_eq!(rec.numbers.context_tokens, Some(150_000), "{rec:?}");
    assert_eq!(rec.numbers.context_window, Some(200_000), "the window came from /config/providers");
    let messages = rig.client.messages(&id).await?;
    assert!(
        messages.iter().any(|m| m.role() == "assistant" && m.info["summary"] == true),
        "OpenCode wrote a compaction summary"
    );
    let detail = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == id).unwrap();
    assert!(!detail.compacting);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_session_below_the_threshold_is_left_alone_but_its_fill_is_shown() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| c.review.enabled = false).await?;
    let id = rig.client.create_session(Some("small")).await?;
    rig.client.prompt_async(&id, "[[fake:bigusage:60000]] read a bit", None, None, false).await?;
    rig.client.wait_busy(&id, PATIENCE).await.ok();
    rig.client.wait_idle(&id, PATIENCE).await?;
    let detail = shepherd_testbed::client::wait_until("the fill to be known", PATIENCE, || async {
        let s = rig.daemon().fleet().await.sessions.into_iter().find(|s| s.id == id);
        Ok::<_, std::convert::Infallible>(s.filter(|s| s.context_percent.is_some()))
    })
    .await?;
    assert_eq!(detail.context_tokens, Some(60_000));
    assert_eq!(detail.context_percent, Some(30.0));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rig.count(&id, Action::Compact), 0);
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn an_overflow_left_idle_with_autocompaction_off_gets_one_emergency_compaction() -> anyhow::Result<()> {
    let mut rig = Rig::start_full(
        |c| c.review.enabled = false,
        |o| o.config("compaction", serde_json::json!({"auto": false})),
        Ok,
    )
    .await?;
    let id = rig.client.create_session(Some("overflow")).await?;
    rig.client.prompt_async(&id, "[[fake:ctx400]] too much", None, None, false).await?;
    let rec = rig.wait_record(&id, Action::Compact, Outcome::Done, PATIENCE).await?;
    assert!(rec.reason.contains("emergency"), "{rec:?}");
    assert_eq!(rec.numbers.context_window, Some(200_000));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.count(&id, Action::Compact), 1, "once");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn a_nudge_to_a_session_past_the_opportunistic_threshold_follows_a_compaction() -> anyhow::Result<()> {
    let mut rig = Rig::start_config(|c| {
        c.review.enabled = false;
        c.nudge.user_quiet = Duration::ZERO;
    })
    .await?;
    let id = rig.client.create_session(Some("half full")).await?;
    // 110k of 200k = 55%: past opportunistic (50%), below proactive (70%); todos left open.
    rig.client.prompt_async(&id, "[[fake:todo:create]] [[fake:bigusage:110000]] start", None, None, false).await?;
    let compact = rig.wait_record(&id, Action::Compact, Outcome::Done, PATIENCE).await?;
    assert!(compact.reason.contains("opportunistic") && compact.reason.contains("before the nudge"), "{compact:?}");
    let nudge = rig.wait_record(&id, Action::Nudge, Outcome::Done, PATIENCE).await?;
    assert!(nudge.at_ms >= compact.at_ms, "the nudge follows the compaction");
    let messages = rig.client.messages(&id).await?;
    assert!(messages.iter().any(|m| m.role() == "assistant" && m.info["summary"] == true), "OpenCode summarised");
    rig.stop().await;
    Ok(())
}

#[actix::test]
async fn opencodes_own_compaction_that_never_finishes_is_aborted_after_max_wait_and_the_session_continued(
) -> anyhow::Result<()> {
    use shepherd_testbed::fake_model::Behaviour;
    let mut rig = Rig::start_config(|c| {
        // Shepherd's own compaction and hand-off stay out of it: OpenCode compacts by itself.
        c.compaction.enabled = false;
        c.handoff.enabled = false;
        c.compaction.max_wait = Duration::from_secs(5);
        c.nudge.enabled = false;
        c.review.enabled = false;
        c.recovery.continue_message = "[[fake:ok]] Please continue.".into();
    })
    .await?;
    let id = rig.client.create_session(Some("endless compaction")).await?;
    // The summary call sends two chunks, then nothing, ever.
    rig.fake.set_helper_behaviour(Some(Behaviour::Stall(None)));
    // 195k of 200k: past OpenCode's own threshold (window − output limit): it compacts mid-turn.
    rig.client.prompt_async(&id, "[[fake:bigusage:195000]] read everything", None, None, false).await?;
    let asked = rig.fake.wait_for_requests(PATIENCE, |log| log.iter().any(|r| r.marker() == "helper:stall")).await;
    assert!(
        asked,
        "OpenCode asked for a summary: {:?}",
        rig.fake.requests().iter().map(|r| r.marker()).collect::<Vec<_>>()
    );
    rig.fake.set_helper_behaviour(None); // the hanging call keeps hanging; later summaries answer at once

    let stall = rig.wait_record(&id, Action::StallDetected, Outcome::Done, PATIENCE).await?;
    assert!(stall.reason.contains("compaction ran past compaction.max_wait"), "{stall:?}");
    assert!(stall.numbers.compacting_for_ms.unwrap() >= 5000, "{stall:?}");
    assert_eq!(stall.numbers.timeout_ms, Some(5000));
    rig.wait_record(&id, Action::Abort, Outcome::Done, PATIENCE).await?;
    rig.wait_record(&id, Action::Continue, Outcome::Done, PATIENCE).await?;
    rig.client.wait_idle(&id, PATIENCE).await?;
    let messages = rig.client.messages(&id).await?;
    assert!(
        messages.iter().any(|m| m.info["summary"] == true && m.error_name() == Some("MessageAbortedError")),
        "the hanging summary was aborted"
    );
    assert_eq!(rig.count(&id, Action::StallDetected), 1, "{:?}", rig.records_for(&id));
    rig.stop().await;
    Ok(())
}
