//! Smoke tests of the test bed itself: the fake model driving a real `opencode serve`
//! (the pinned OpenCode, `OPENCODE_VERSION`) into the situations Shepherd supervises. Each test starts its own
//! fake and its own server (a few seconds each).

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use shepherd_testbed::client::{wait_for, wait_until, OpenCodeClient, SessionStatus};
use shepherd_testbed::fake_model::{Behaviour, FakeModel, StreamEnd, TodoStage};
use shepherd_testbed::opencode::{OpenCodeOptions, OpenCodeServer, SERVER_USERNAME};

const TURN: Duration = Duration::from_secs(20);

struct Bed {
    fake: FakeModel,
    server: OpenCodeServer,
    client: OpenCodeClient,
}

async fn bed_with(opts: impl FnOnce(OpenCodeOptions) -> OpenCodeOptions) -> Bed {
    let fake = FakeModel::start().expect("fake model starts");
    let server = OpenCodeServer::start(opts(OpenCodeOptions::for_fake(&fake))).await.expect("opencode starts");
    let client = server.client();
    Bed { fake, server, client }
}

async fn bed() -> Bed {
    bed_with(|o| o).await
}

impl Bed {
    /// A titled session (no title-generation call) prompted with `text`.
    async fn prompted(&self, text: &str) -> String {
        let id = self.client.create_session(Some("smoke")).await.unwrap();
        self.client.prompt_async(&id, text, None, None, false).await.unwrap();
        id
    }
}

#[tokio::test]
async fn ok_turn_goes_busy_then_idle_with_the_fake_text() {
    let bed = bed().await;
    let id = bed.client.create_session(Some("smoke")).await.unwrap();
    let mut events = Box::pin(bed.client.events(None).await.unwrap());
    bed.client.prompt_async(&id, "hi [[fake:ok]]", None, None, false).await.unwrap();

    let mut statuses = Vec::new();
    tokio::time::timeout(TURN, async {
        while let Some(ev) = events.next().await {
            let ev = ev.unwrap();
            if ev.pointer("/properties/sessionID").and_then(Value::as_str) != Some(id.as_str()) {
                continue;
            }
            match ev["type"].as_str() {
                Some("session.status") => statuses.push(ev["properties"]["status"]["type"].clone()),
                Some("session.idle") => break,
                _ => {}
            }
        }
    })
    .await
    .expect("the turn ends");
    assert_eq!(statuses.first(), Some(&Value::from("busy")), "{statuses:?}");
    assert_eq!(statuses.last(), Some(&Value::from("idle")), "{statuses:?}");

    let last = bed.client.last_assistant(&id).await.unwrap().unwrap();
    assert_eq!(last.text(), "Hello from fake.");
    assert_eq!(last.finish(), Some("stop"));
    assert!(!bed.client.is_busy(&id).await.unwrap());
    let turns = bed.fake.turn_requests();
    assert_eq!(turns.len(), 1, "one model call: {turns:?}");
    assert_eq!(turns[0].behaviour(), Some(&Behaviour::Ok));
    assert_eq!(turns[0].model, "fake-model");
}

#[tokio::test]
async fn todo_create_then_done_updates_the_todo_list() {
    let bed = bed().await;
    let id = bed.client.create_session(Some("smoke")).await.unwrap();
    let last = bed.client.prompt_and_wait(&id, "plan it [[fake:todo:create]]", TURN).await.unwrap();
    assert_eq!(last.text(), "Done.", "the script ran out after the tool step");
    let todos = bed.client.todos(&id).await.unwrap();
    let statuses: Vec<&str> = todos.iter().map(|t| t.status.as_str()).collect();
    assert_eq!(statuses, ["in_progress", "pending", "pending"]);
    assert_eq!(todos[0].content, "Write the parser");
    let msgs = bed.client.messages(&id).await.unwrap();
    let finishes: Vec<_> = msgs.iter().filter_map(|m| m.finish()).collect();
    assert_eq!(finishes, ["tool-calls", "stop"], "tool step, then the final `Done.`");

    bed.client.prompt_and_wait(&id, "finish [[fake:todo:done]]", TURN).await.unwrap();
    let todos = bed.client.todos(&id).await.unwrap();
    assert_eq!(todos.len(), 3);
    assert!(todos.iter().all(|t| t.status == "completed"), "{todos:?}");
    let todo_calls: Vec<_> = bed.fake.turn_requests().into_iter().filter_map(|r| r.behaviour().cloned()).collect();
    assert_eq!(todo_calls, [Behaviour::Todo(TodoStage::Create), Behaviour::Todo(TodoStage::Done)]);
}

#[tokio::test]
async fn stalled_turn_stays_busy_until_aborted() {
    let bed = bed().await;
    let id = bed.prompted("work [[fake:stall]]").await;
    assert!(
        bed.fake.wait_for_requests(TURN, |log| log.iter().any(|r| r.marker() == "stall")).await,
        "the model was called"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(bed.client.status(None).await.unwrap().get(&id), Some(&SessionStatus::Busy));
    let stalled = bed.fake.turn_requests();
    assert_eq!(stalled.last().map(|r| r.ended), Some(None), "stream still open");

    assert!(bed.client.abort(&id).await.unwrap());
    bed.client.wait_idle(&id, Duration::from_secs(5)).await.unwrap();
    let last = bed.client.last_assistant(&id).await.unwrap().unwrap();
    assert_eq!(last.error_name(), Some("MessageAbortedError"));
    assert!(
        bed.fake
            .wait_for_requests(Duration::from_secs(5), |log| {
                log.iter().any(|r| r.ended == Some(StreamEnd::Disconnected))
            })
            .await,
        "OpenCode dropped the provider stream on abort"
    );
}

#[tokio::test]
async fn question_turn_shows_a_pending_question() {
    let bed = bed().await;
    let id = bed.prompted("ask me [[fake:question]]").await;
    let question = wait_until("a pending question", TURN, || async {
        let qs = bed.client.questions(None).await?;
        Ok::<_, anyhow::Error>(qs.into_iter().find(|q| q["sessionID"] == id.as_str()))
    })
    .await
    .unwrap();
    assert_eq!(question["questions"][0]["question"], "Pick one?");
    assert!(bed.client.is_busy(&id).await.unwrap(), "busy while waiting for the answer");

    let qid = question["id"].as_str().unwrap();
    bed.client.reply_question(qid, &[vec!["A".to_string()]]).await.unwrap();
    let last = bed.client.wait_turn_after(&id, 0, TURN).await.unwrap();
    assert_eq!(last.text(), "Done.");
    assert!(bed.client.questions(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn long_bash_tool_shows_a_running_tool_part() {
    let bed = bed().await;
    let id = bed.prompted("run [[fake:bash:sleep 3]]").await;
    wait_for("a running bash part", TURN, || async {
        let msgs = bed.client.messages(&id).await?;
        Ok::<_, anyhow::Error>(msgs.iter().any(|m| m.tools().contains(&("bash".to_string(), "running".to_string()))))
    })
    .await
    .unwrap();
    assert!(bed.client.is_busy(&id).await.unwrap());
    bed.client.wait_turn_after(&id, 0, TURN).await.unwrap();
    let msgs = bed.client.messages(&id).await.unwrap();
    let bash = msgs.iter().flat_map(|m| m.tool_parts()).find(|p| p["tool"] == "bash").unwrap();
    assert_eq!(bash["state"]["status"], "completed");
    assert_eq!(bash["state"]["input"]["command"], "sleep 3");
}

#[tokio::test]
async fn two_step_script_sets_todos_then_stalls() {
    let bed = bed().await;
    let id = bed.prompted("go [[fake:todo:create]][[fake:stall]]").await;
    wait_for("the stalled second step", TURN, || async {
        Ok::<_, anyhow::Error>(
            bed.fake.turn_requests().iter().any(|r| r.step == 1 && r.behaviour() == Some(&Behaviour::Stall(None))),
        )
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(bed.client.is_busy(&id).await.unwrap());
    let todos = bed.client.todos(&id).await.unwrap();
    assert_eq!(todos.len(), 3);
    assert!(todos.iter().any(|t| t.status == "in_progress"));
    bed.client.abort(&id).await.unwrap();
    bed.client.wait_idle(&id, Duration::from_secs(5)).await.unwrap();
}

#[tokio::test]
async fn password_protects_the_server_and_restart_keeps_sessions() {
    let mut bed = bed_with(|o| o.password("s3cret")).await;
    let anonymous = OpenCodeClient::new(bed.server.url());
    let err = anonymous.health().await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert_eq!(bed.server.password(), Some("s3cret"));
    let authorised = anonymous.clone().with_auth(SERVER_USERNAME, "s3cret");
    assert!(authorised.health().await.unwrap().healthy);

    let id = bed.client.create_session(Some("smoke")).await.unwrap();
    bed.client.prompt_and_wait(&id, "hi [[fake:ok]]", TURN).await.unwrap();
    let port = bed.server.port();
    bed.server.restart().await.unwrap();
    assert_eq!(bed.server.port(), port);
    let session = bed.client.session(&id).await.unwrap();
    assert_eq!(session["id"], id.as_str());
    assert_eq!(bed.client.messages(&id).await.unwrap().len(), 2);
}

/// One server, one session per behaviour: what each marker makes OpenCode show.
#[tokio::test]
async fn scripted_behaviours_reach_opencode_as_documented() {
    let bed = bed().await;
    let c = &bed.client;
    let mut ids = std::collections::BTreeMap::new();
    for marker in ["xmltool", "reasoning", "length", "badtool", "cut", "err429:1", "ctx400", "bigusage:196000"] {
        ids.insert(marker, bed.prompted(&format!("try [[fake:{marker}]]")).await);
    }

    // A retrying session shows `retry` in /session/status.
    wait_for("err429 retry status", TURN, || async {
        let st = c.status(None).await?;
        Ok::<_, anyhow::Error>(matches!(st.get(&ids["err429:1"]), Some(SessionStatus::Retry { .. })))
    })
    .await
    .unwrap();

    // A stream cut without finish reason makes OpenCode call the model again and again.
    // Five model calls: seconds on a quiet machine, much longer on a loaded one.
    wait_for("a runaway loop of finish=unknown", TURN * 3, || async {
        let msgs = c.messages(&ids["cut"]).await?;
        Ok::<_, anyhow::Error>(msgs.iter().filter(|m| m.finish() == Some("unknown")).count() >= 5)
    })
    .await
    .unwrap();
    assert!(c.is_busy(&ids["cut"]).await.unwrap());
    c.abort(&ids["cut"]).await.unwrap();

    let last = |marker: &'static str| {
        let id = ids[marker].clone();
        async move { c.wait_turn_after(&id, 0, TURN).await.unwrap() }
    };
    assert!(last("xmltool").await.text().contains("<function=bash>"));
    let reasoning = last("reasoning").await;
    assert!(reasoning.parts.iter().any(|p| p["type"] == "reasoning"));
    assert_eq!(last("length").await.finish(), Some("length"));
    let msgs = c.messages(&ids["badtool"]).await.unwrap();
    assert!(msgs.iter().any(|m| m.tools() == [("invalid".to_string(), "completed".to_string())]));

    // Context overflow and a step over the threshold both end in an auto-compaction.
    for marker in ["ctx400", "bigusage:196000"] {
        last(marker).await;
        let msgs = c.messages(&ids[marker]).await.unwrap();
        assert!(msgs.iter().any(|m| m.info["summary"] == true), "{marker}: a compaction summary");
    }
    let err429 = c.wait_turn_after(&ids["err429:1"], 0, Duration::from_secs(30)).await.unwrap();
    assert_eq!(err429.error_name(), Some("APIError"));
}

/// Pids of live processes whose command line is exactly `args`.
fn processes_running(args: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let parts: Vec<&[u8]> = raw.split(|b| *b == 0).filter(|p| !p.is_empty()).collect();
                parts.len() == args.len() && parts.iter().zip(args).all(|(a, b)| *a == b.as_bytes())
            })
        })
        .collect()
}

#[tokio::test]
async fn killing_the_server_also_kills_its_tool_processes() {
    let mut bed = bed().await;
    let id = bed.prompted("run [[fake:bash:sleep 37]]").await;
    wait_for("the bash tool's sleep", TURN, || async {
        Ok::<_, anyhow::Error>(!processes_running(&["sleep", "37"]).is_empty())
    })
    .await
    .unwrap();
    assert!(bed.client.is_busy(&id).await.unwrap());
    bed.server.kill();
    wait_for("no sleep left", Duration::from_secs(3), || async {
        Ok::<_, anyhow::Error>(processes_running(&["sleep", "37"]).is_empty())
    })
    .await
    .unwrap();

    // After a crash the session is not busy any more and its bash part stays `running`.
    bed.server.respawn().await.unwrap();
    assert!(!bed.client.is_busy(&id).await.unwrap());
    let msgs = bed.client.messages(&id).await.unwrap();
    let last = msgs.last().unwrap();
    assert_eq!(last.role(), "assistant");
    assert!(!last.is_completed());
    assert_eq!(last.tools(), [("bash".to_string(), "running".to_string())]);
}
