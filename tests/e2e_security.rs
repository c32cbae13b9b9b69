//! Shepherd as a security boundary, on the real OpenCode server driven by the fake model:
//! what an agent plants in its workspace is read, never run.

mod support;

use shepherd_actors::config::Config;
use shepherd_testbed::planted_repo::{self, PlantedRepo};
use support::{tagged, Rig, PATIENCE};

fn configure(c: &mut Config) {
    c.nudge.enabled = false;
    c.review.enabled = false;
    c.handoff.ask_model = false;
    // A new directory's first turn pays OpenCode's instance boot (seconds): not a stall.
    c.recovery.stall_timeout = PATIENCE;
    c.recovery.planning_timeout = PATIENCE;
}

#[actix::test]
async fn a_hand_off_over_a_repository_that_plants_commands_runs_none_and_reports_its_state() -> anyhow::Result<()> {
    let planted = tempfile::tempdir()?;
    let repo = PlantedRepo::create(&planted.path().join("repo"), &planted.path().join("markers"))?;
    let mut rig = Rig::start_config(configure).await?;
    let directory = repo.path.to_string_lossy().into_owned();
    let client = rig.client.clone().with_directory(directory.clone());
    let old = client.create_session(Some("planted")).await?;
    assert_eq!(client.session(&old).await?["directory"], directory.as_str(), "the session works in the repo");
    // A reply whose prompt filled 85% of the window (prepare is 80%): the hand-off follows.
    client.prompt_async(&old, "[[fake:bigusage:170000]] Keep porting", None, None, false).await?;
    let done = rig.wait_phase(&old, "completed", PATIENCE * 2).await?;
    // The repository is a project of its own: its sessions are listed under its directory.
    let all = client.get_json("/session?limit=100").await?;
    let fresh: Vec<_> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["title"].as_str().is_some_and(|t| t.contains("[hf_")))
        .cloned()
        .collect();
    assert_eq!(fresh.len(), 1, "{fresh:#?}");
    let new = fresh[0]["id"].as_str().unwrap().to_string();
    assert!(done.reason.contains(&new), "{done:?}");

    assert_eq!(repo.markers_left(), Vec::<String>::new(), "nothing the repository planted ran");
    let messages = client.messages(&new).await?;
    let continuation = tagged(&messages, "handoff_continuation");
    assert_eq!(continuation.len(), 1, "one continuation");
    let c = &continuation[0];
    assert!(c.contains(&format!("- branch: `{}`", planted_repo::BRANCH)), "{c}");
    for entry in planted_repo::DIRTY {
        assert!(c.contains(&format!("  - `{entry}`")), "{entry} in {c}");
    }
    rig.stop().await;
    assert_eq!(repo.markers_left(), Vec::<String>::new(), "nor later");
    Ok(())
}
