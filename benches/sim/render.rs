//! One beat of a session rendered as the frames OpenCode sends: the event in the global
//! stream's shape and, for durable changes, its `sync` duplicate; what the beat leaves in
//! the session's history; the heartbeat.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::script::Beat;
use super::{epoch_ms, make_id, HistMsg, SimSession, World, TODOS};

impl World {
    /// Renders one step of a session into `out`; returns the frames written.
    pub(super) fn render(&mut self, idx: usize, step: &Beat, out: &mut String, marks: &mut Vec<usize>) -> u64 {
        let now_ms = epoch_ms();
        let evt = self.next_evt();
        if matches!(step, Beat::UserMessage | Beat::UserPrompt(..) | Beat::AssistantCreated) {
            self.messages += 1;
        }
        // The soak's turns go on for many minutes: the same `todowrite` input every turn
        // is a spinning tool to Shepherd (`loops.spin_count`), not progress. Each call
        // gets its own input there.
        let vary_tool_input = self.books_kept();
        let World { sessions, dirs, project, .. } = self;
        let s = &mut sessions[idx];
        let dir = dirs[s.dir].as_str();
        let sid = s.id.clone();
        let mut f = Frames { out, dir, project, sid: &sid, evt, n: 0 };
        match step {
            Beat::UserMessage | Beat::UserPrompt(..) => {
                s.busy = true;
                s.counter += 1;
                s.user_msg = match step {
                    Beat::UserPrompt(id, _) => id.clone(),
                    _ => make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64),
                };
                let info = format!(
                    r#"{{"sessionID":"{sid}","info":{{"id":"{m}","role":"user","sessionID":"{sid}","time":{{"created":{now_ms}}},"agent":"{agent}","model":{{"providerID":"fake","modelID":"fake-model"}}}}}}"#,
                    sid = s.id,
                    m = s.user_msg,
                    agent = s.agent
                );
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
                let parts: Vec<Value> = match step {
                    Beat::UserPrompt(_, parts) => parts.clone(),
                    _ => vec![json!({"type": "text", "text": "Please work through the todo list."})],
                };
                for part in parts {
                    s.counter += 1;
                    let mut part = part;
                    if let Some(obj) = part.as_object_mut() {
                        obj.insert("messageID".into(), json!(s.user_msg));
                        obj.insert("sessionID".into(), json!(s.id));
                        obj.insert("id".into(), json!(make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64)));
                    }
                    let props = format!(r#"{{"sessionID":"{}","part":{},"time":{now_ms}}}"#, s.id, part);
                    s.seq += 1;
                    f.event_with_sync("message.part.updated", &props, s.seq);
                }
            }
            Beat::Busy => {
                s.busy = true;
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"busy"}}}}"#, s.id));
            }
            Beat::AssistantCreated => {
                s.counter += 1;
                s.asst_msg = make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let info = assistant_info(s, dir, now_ms, None);
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
            }
            Beat::StepStart => {
                s.counter += 1;
                let p = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","snapshot":"fe8a5305ed92502cc3c96432049de9cdc12a068e","type":"step-start"}},"time":{now_ms}}}"#,
                    sid = s.id,
                    m = s.asst_msg
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::TextOpen => {
                s.counter += 1;
                s.part = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                s.part_chars = 0;
                let props = text_part(s, "", now_ms);
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Delta => {
                s.part_chars += DELTA_TEXT.len();
                let props = format!(
                    r#"{{"sessionID":"{sid}","messageID":"{m}","partID":"{p}","field":"text","delta":"{DELTA_TEXT}"}}"#,
                    sid = s.id,
                    m = s.asst_msg,
                    p = s.part
                );
                f.event("message.part.delta", &props);
            }
            Beat::TextClose => {
                let text = DELTA_TEXT.repeat((s.part_chars / DELTA_TEXT.len()).clamp(1, 40));
                let props = text_part(s, &text, now_ms);
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Tool(status) => {
                if *status == "pending" {
                    s.counter += 1;
                    s.part = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                }
                let output = if *status == "completed" {
                    r#","output":"[{\"content\":\"Write the parser\",\"status\":\"in_progress\"}]","title":"3 todos""#
                } else {
                    ""
                };
                let pass = if vary_tool_input { format!(", pass {}", s.counter) } else { String::new() };
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","type":"tool","tool":"todowrite","callID":"call_{c:06}","state":{{"status":"{status}","input":{{"todos":[{{"content":"Write the parser{pass}","status":"in_progress","priority":"high"}}]}}{output},"time":{{"start":{now_ms}}}}}}},"time":{now_ms}}}"#,
                    sid = s.id,
                    p = s.part,
                    m = s.asst_msg,
                    c = s.counter
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::Todo => {
                s.todo_done = (s.todo_done + 1) % (TODOS.len() + 1);
                let props = format!(r#"{{"sessionID":"{}","todos":{}}}"#, s.id, todos_json(s.todo_done));
                f.event("todo.updated", &props);
            }
            Beat::StepFinish(reason) => {
                s.counter += 1;
                let p = make_id("prt_", now_ms, (idx as u64) << 20 | s.counter as u64);
                let props = format!(
                    r#"{{"sessionID":"{sid}","part":{{"id":"{p}","reason":"{reason}","snapshot":"fe8a5305ed92502cc3c96432049de9cdc12a068e","messageID":"{m}","sessionID":"{sid}","type":"step-finish","tokens":{{"total":1105,"input":1000,"output":105,"reasoning":0,"cache":{{"write":0,"read":0}}}},"cost":0}},"time":{now_ms}}}"#,
                    sid = s.id,
                    m = s.asst_msg
                );
                s.seq += 1;
                f.event_with_sync("message.part.updated", &props, s.seq);
            }
            Beat::AssistantFinished(finish) => {
                let info = assistant_info(s, dir, now_ms, Some(finish));
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
            }
            Beat::Idle => {
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"busy"}}}}"#, s.id));
                idle_frames(&mut f, s, dir, now_ms);
            }
            Beat::Stall => marks.push(idx),
            Beat::Aborted => {
                f.event(
                    "session.error",
                    &format!(
                        r#"{{"sessionID":"{}","error":{{"name":"MessageAbortedError","data":{{"message":"Aborted"}}}}}}"#,
                        s.id
                    ),
                );
                f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"idle"}}}}"#, s.id));
                f.event("session.idle", &format!(r#"{{"sessionID":"{}"}}"#, s.id));
                if !s.part.is_empty() {
                    let props = text_part(s, DELTA_TEXT, now_ms);
                    s.seq += 1;
                    f.event_with_sync("message.part.updated", &props, s.seq);
                }
                let info = assistant_info(s, dir, now_ms, Some("abort"));
                s.seq += 1;
                f.event_with_sync("message.updated", &info, s.seq);
                idle_frames(&mut f, s, dir, now_ms);
            }
        }
        let n = f.n;
        self.remember(idx, step, now_ms);
        n
    }

    /// What a step leaves in the session's history.
    fn remember(&mut self, idx: usize, step: &Beat, now_ms: i64) {
        let msg = |id: &str, user: bool, parts: Vec<Value>| HistMsg {
            id: id.to_string(),
            user,
            created_ms: now_ms,
            parts,
            completed_ms: None,
            finish: None,
            aborted: false,
        };
        match step {
            Beat::UserMessage => {
                let s = &self.sessions[idx];
                let part = json!({"type": "text", "text": "Please work through the todo list.",
                                  "id": format!("prt_u{}", s.counter)});
                let m = msg(&s.user_msg, true, vec![part]);
                self.push_history(idx, m);
            }
            Beat::AssistantCreated => {
                let m = msg(&self.sessions[idx].asst_msg, false, Vec::new());
                self.push_history(idx, m);
            }
            Beat::AssistantFinished(finish) => {
                if let Some(m) = self.sessions[idx].history.iter_mut().rev().find(|m| !m.user) {
                    m.completed_ms = Some(now_ms);
                    m.finish = Some(finish);
                }
            }
            Beat::Aborted => {
                if let Some(m) = self.sessions[idx].history.iter_mut().rev().find(|m| !m.user) {
                    if m.completed_ms.is_none() {
                        m.completed_ms = Some(now_ms);
                        m.aborted = true;
                    }
                }
            }
            _ => {}
        }
    }

    pub(super) fn heartbeat(&mut self, out: &mut String) -> u64 {
        let evt = self.next_evt();
        let _ = write!(
            out,
            "data: {{\"payload\":{{\"id\":\"{evt}\",\"type\":\"server.heartbeat\",\"properties\":{{}}}}}}\n\n"
        );
        1
    }
}

pub(super) const DELTA_TEXT: &str = "Hello, I am working on ";

fn idle_frames(f: &mut Frames<'_>, s: &mut SimSession, dir: &str, now_ms: i64) {
    s.busy = false;
    s.part.clear();
    f.event("session.status", &format!(r#"{{"sessionID":"{}","status":{{"type":"idle"}}}}"#, s.id));
    f.event("session.idle", &format!(r#"{{"sessionID":"{}"}}"#, s.id));
    let info = session_info(s, dir, now_ms);
    s.seq += 1;
    f.event_with_sync("session.updated", &format!(r#"{{"sessionID":"{}","info":{}}}"#, s.id, info), s.seq);
    f.event("session.diff", &format!(r#"{{"sessionID":"{}","diff":[]}}"#, s.id));
}

fn text_part(s: &SimSession, text: &str, now_ms: i64) -> String {
    format!(
        r#"{{"sessionID":"{sid}","part":{{"id":"{p}","messageID":"{m}","sessionID":"{sid}","type":"text","text":"{text}","time":{{"start":{now_ms}}}}},"time":{now_ms}}}"#,
        sid = s.id,
        p = s.part,
        m = s.asst_msg
    )
}

pub(super) fn assistant_info(s: &SimSession, dir: &str, now_ms: i64, finish: Option<&str>) -> String {
    let (tokens, tail) = match finish {
        None => (
            r#"{"total":0,"input":0,"output":0,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            String::new(),
        ),
        Some("abort") => (
            r#"{"total":0,"input":0,"output":0,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            format!(
                r#","completed":{now_ms}}},"error":{{"name":"MessageAbortedError","data":{{"message":"Aborted"}}}}"#
            ),
        ),
        Some(finish) => (
            r#"{"total":1105,"input":1000,"output":105,"reasoning":0,"cache":{"write":0,"read":0}}"#.to_string(),
            format!(r#","completed":{now_ms}}},"finish":"{finish}""#),
        ),
    };
    let tail = if tail.is_empty() { "}".to_string() } else { tail };
    format!(
        r#"{{"sessionID":"{sid}","info":{{"id":"{m}","parentID":"{u}","role":"assistant","mode":"build","agent":"{agent}","path":{{"cwd":"{dir}","root":"{dir}"}},"cost":0,"tokens":{tokens},"modelID":"fake-model","providerID":"fake","sessionID":"{sid}","time":{{"created":{now_ms}{tail}}}}}"#,
        sid = s.id,
        m = s.asst_msg,
        u = s.user_msg,
        agent = s.agent
    )
}

pub(super) fn session_info(s: &SimSession, dir: &str, now_ms: i64) -> String {
    format!(
        r#"{{"id":"{sid}","slug":"jolly-harbor","projectID":"34a087cc2cab9675f8102d62afcd43ca8afdd98e","directory":"{dir}","path":"","title":"Simulated session","agent":"build","model":{{"id":"fake-model","providerID":"fake","variant":"default"}},"version":"1.18.34","cost":0,"tokens":{{"input":0,"output":0,"reasoning":0,"cache":{{"read":0,"write":0}}}},"time":{{"created":{c},"updated":{now_ms}}}}}"#,
        sid = s.id,
        c = s.created_ms
    )
}

pub(super) fn todos_json(done: usize) -> String {
    let items: Vec<String> = TODOS
        .iter()
        .enumerate()
        .map(|(i, (content, prio))| {
            let status = match i.cmp(&done) {
                std::cmp::Ordering::Less => "completed",
                std::cmp::Ordering::Equal => "in_progress",
                std::cmp::Ordering::Greater => "pending",
            };
            format!(r#"{{"content":"{content}","status":"{status}","priority":"{prio}"}}"#)
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// Writes SSE frames in the global stream's shape.
struct Frames<'a> {
    out: &'a mut String,
    dir: &'a str,
    project: &'a str,
    sid: &'a str,
    evt: String,
    n: u64,
}

impl Frames<'_> {
    fn event(&mut self, kind: &str, props: &str) {
        let _ = write!(
            self.out,
            "data: {{\"directory\":\"{}\",\"project\":\"{}\",\"payload\":{{\"id\":\"{}\",\"type\":\"{kind}\",\"properties\":{props}}}}}\n\n",
            self.dir, self.project, self.evt
        );
        self.n += 1;
    }

    /// The event and its `sync` duplicate (durable changes only, as OpenCode does).
    fn event_with_sync(&mut self, kind: &str, props: &str, seq: u32) {
        self.event(kind, props);
        let _ = write!(
            self.out,
            "data: {{\"directory\":\"{}\",\"project\":\"{}\",\"payload\":{{\"type\":\"sync\",\"syncEvent\":{{\"id\":\"{evt}\",\"type\":\"{kind}.1\",\"seq\":{seq},\"aggregateID\":\"{}\",\"data\":{props}}},\"id\":\"{evt}\"}}}}\n\n",
            self.dir, self.project, self.sid, evt = self.evt
        );
        self.n += 1;
    }
}
