//! OpenCode's REST routes as Shepherd calls them: statuses, sessions, abort (the
//! stall-deadline-to-abort latency is measured here), todos, messages, `prompt_async`
//! (the books: which decision, for which episode), providers, summarize.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::render::{assistant_info, session_info, todos_json, DELTA_TEXT};
use super::script::{continue_turn, Beat};
use super::{epoch_ms, epoch_us, make_id, Data, HistMsg, Kind, SimSession, CONTINUE_STEP};

#[derive(Deserialize)]
pub(super) struct DirQuery {
    directory: Option<String>,
}

pub(super) async fn session_status(data: Data, q: web::Query<DirQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/status");
    let dir = q.directory.as_deref().and_then(|d| w.dirs.iter().position(|x| x == d)).unwrap_or(0);
    let mut body = String::from("{");
    for &idx in &w.busy_by_dir[dir] {
        if body.len() > 1 {
            body.push(',');
        }
        let _ = write!(body, r#""{}":{{"type":"busy"}}"#, w.sessions[idx].id);
    }
    body.push('}');
    HttpResponse::Ok().content_type("application/json").body(body)
}

#[derive(Deserialize)]
pub(super) struct LimitQuery {
    limit: Option<usize>,
}

pub(super) async fn list_sessions(data: Data, q: web::Query<LimitQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /experimental/session");
    let now_ms = epoch_ms();
    let limit = q.limit.unwrap_or(100);
    let items: Vec<String> =
        w.sessions.iter().rev().take(limit).map(|s| session_info(s, &w.dirs[s.dir], now_ms)).collect();
    HttpResponse::Ok().content_type("application/json").body(format!("[{}]", items.join(",")))
}

fn not_found(id: &str) -> HttpResponse {
    HttpResponse::NotFound().json(json!({"name":"NotFoundError","data":{"message":format!("Session not found: {id}")}}))
}

pub(super) async fn get_session(data: Data, path: web::Path<String>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let s = &w.sessions[idx];
    HttpResponse::Ok().content_type("application/json").body(session_info(s, &w.dirs[s.dir], epoch_ms()))
}

pub(super) async fn abort(data: Data, path: web::Path<String>) -> HttpResponse {
    let (arrived, arrived_wall) = (Instant::now(), epoch_us());
    {
        let mut w = data.lock();
        w.count("POST /session/{id}/abort");
        if let Some(idx) = w.index.get(path.as_str()).copied() {
            w.aborts += 1;
            // A stall whose last frames were queued on a stream that was then cut never
            // "left": it is a stall all the same.
            let s = &w.sessions[idx];
            if w.books_kept() && s.kind == Kind::Stalling && s.busy && s.plan.is_empty() && s.episode.is_none() {
                w.stall_began(idx, arrived, arrived_wall);
            }
            match w.sessions[idx].episode {
                Some(e) => w.episodes[e].aborts += 1,
                None if w.sessions[idx].busy => {
                    let what = format!("{} at {} ms", w.sessions[idx].id, arrived_wall / 1000);
                    w.false_aborts.push(what);
                }
                None => w.idle_aborts += 1,
            }
            let stall_timeout = w.stall_timeout;
            let s = &mut w.sessions[idx];
            let mut latency = None;
            let mut times = None;
            let mut unexpected = false;
            if s.kind == Kind::Stalling && !s.aborted {
                if let Some(at) = s.stalled_at {
                    let deadline = at + stall_timeout;
                    latency = Some(if arrived >= deadline {
                        (arrived - deadline).as_micros() as i64
                    } else {
                        -((deadline - arrived).as_micros() as i64)
                    });
                    times = Some((s.id.clone(), s.stalled_wall_us + stall_timeout.as_micros() as i64, arrived_wall));
                }
                s.aborted = true;
            } else if s.busy {
                unexpected = true;
            }
            s.busy = false;
            let kind = if s.kind == Kind::Stalling { Kind::Stalling } else { Kind::Idle };
            w.sync_busy(idx);
            w.unexpected_aborts += unexpected as u64;
            w.latencies.extend(latency);
            w.stall_times.extend(times);
            w.replan(idx, vec![Beat::Aborted], Duration::ZERO, kind, arrived);
            data.wake.notify_one();
        }
    }
    HttpResponse::Ok().content_type("application/json").body("true")
}

pub(super) async fn todos(data: Data, path: web::Path<String>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}/todo");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    HttpResponse::Ok().content_type("application/json").body(todos_json(w.sessions[idx].todo_done))
}

pub(super) async fn messages(data: Data, path: web::Path<String>, q: web::Query<LimitQuery>) -> HttpResponse {
    let mut w = data.lock();
    w.count("GET /session/{id}/message");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let s = &w.sessions[idx];
    if !s.history.is_empty() {
        let dir = &w.dirs[s.dir];
        let skip = s.history.len().saturating_sub(q.limit.unwrap_or(usize::MAX));
        let items: Vec<Value> = s.history.iter().skip(skip).map(|m| history_json(s, dir, m)).collect();
        return HttpResponse::Ok().json(items);
    }
    let now_ms = epoch_ms();
    let user = json!({
        "info": {"id": s.user_msg, "role": "user", "sessionID": s.id, "time": {"created": now_ms},
                 "agent": s.agent, "model": {"providerID": "fake", "modelID": "fake-model"}},
        "parts": [{"type": "text", "text": "Please work through the todo list.", "id": "prt_x", "messageID": s.user_msg, "sessionID": s.id}],
    });
    let asst: Value = serde_json::from_str(&assistant_info(s, &w.dirs[s.dir], now_ms, Some("stop")))
        .map(|v: Value| v["info"].clone())
        .unwrap_or(Value::Null);
    HttpResponse::Ok().json(json!([user, {"info": asst, "parts": []}]))
}

/// One remembered message in `GET /session/{id}/message`'s shape.
fn history_json(s: &SimSession, dir: &str, m: &HistMsg) -> Value {
    let model = json!({"providerID": "fake", "modelID": "fake-model"});
    if m.user {
        let parts: Vec<Value> = m
            .parts
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if let Some(o) = p.as_object_mut() {
                    o.insert("messageID".into(), json!(m.id));
                    o.insert("sessionID".into(), json!(s.id));
                }
                p
            })
            .collect();
        return json!({
            "info": {"id": m.id, "role": "user", "sessionID": s.id, "time": {"created": m.created_ms},
                     "agent": s.agent, "model": model},
            "parts": parts,
        });
    }
    let mut time = json!({"created": m.created_ms});
    if let Some(c) = m.completed_ms {
        time["completed"] = json!(c);
    }
    let mut info = json!({
        "id": m.id, "role": "assistant", "mode": "build", "agent": s.agent,
        "path": {"cwd": dir, "root": dir}, "cost": 0,
        "tokens": {"total": 1105, "input": 1000, "output": 105, "reasoning": 0, "cache": {"write": 0, "read": 0}},
        "modelID": "fake-model", "providerID": "fake", "sessionID": s.id, "time": time,
    });
    if let Some(f) = m.finish {
        info["finish"] = json!(f);
    }
    if m.aborted {
        info["error"] = json!({"name": "MessageAbortedError", "data": {"message": "Aborted"}});
    }
    let parts = if m.completed_ms.is_some() {
        vec![
            json!({"id": format!("prt_t{}", m.id), "messageID": m.id, "sessionID": s.id, "type": "text", "text": DELTA_TEXT}),
        ]
    } else {
        Vec::new()
    };
    json!({"info": info, "parts": parts})
}

#[derive(Deserialize)]
pub(super) struct PromptBody {
    #[serde(default)]
    parts: Vec<Value>,
    #[serde(default)]
    agent: Option<String>,
}

pub(super) async fn prompt_async(data: Data, path: web::Path<String>, body: web::Json<PromptBody>) -> HttpResponse {
    let mut w = data.lock();
    w.count("POST /session/{id}/prompt_async");
    let Some(idx) = w.index.get(path.as_str()).copied() else { return not_found(&path) };
    let body = body.into_inner();
    let now_ms = epoch_ms();
    // The books: which decision, for which episode.
    let tag = body.parts.iter().find_map(|p| p.pointer("/metadata/shepherd")).cloned();
    match &tag {
        Some(tag) => {
            let kind = tag["kind"].as_str().unwrap_or("?").to_string();
            *w.prompts_by_kind.entry(kind.clone()).or_default() += 1;
            if let Some(d) = tag["decision"].as_str() {
                *w.decisions.entry(d.to_string()).or_default() += 1;
                if kind == "continue" {
                    // The open episode's continue, or (none open) a second one for the last.
                    let e = w.sessions[idx].episode.take().or(w.sessions[idx].last_episode);
                    if let Some(e) = e {
                        w.episodes[e].continues.push(d.to_string());
                    }
                }
            }
        }
        None => w.untagged_prompts += 1,
    }
    // OpenCode stores the user message at once, whatever it is doing.
    let msg_id = {
        let s = &mut w.sessions[idx];
        s.counter += 1;
        make_id("msg_", now_ms, (idx as u64) << 20 | s.counter as u64)
    };
    let parts: Vec<Value> = body
        .parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = p.clone();
            if let Some(o) = p.as_object_mut() {
                o.insert("id".into(), json!(format!("prt_{msg_id}_{i}")));
            }
            p
        })
        .collect();
    w.push_history(
        idx,
        HistMsg {
            id: msg_id.clone(),
            user: true,
            created_ms: now_ms,
            parts: parts.clone(),
            completed_ms: None,
            finish: None,
            aborted: false,
        },
    );
    let s = &mut w.sessions[idx];
    s.prompts += 1;
    if let Some(agent) = body.agent {
        s.agent = agent;
    }
    let busy = s.busy;
    s.busy = true;
    let kind = s.kind;
    let plan = continue_turn(msg_id, body.parts);
    if busy && !s.plan.is_empty() {
        s.plan.extend(plan); // queued behind the turn under way, as OpenCode does
    } else {
        w.replan(idx, plan, CONTINUE_STEP, kind, Instant::now());
    }
    w.sync_busy(idx);
    data.wake.notify_one();
    HttpResponse::NoContent().finish()
}

pub(super) async fn providers(data: Data) -> HttpResponse {
    data.lock().count("GET /config/providers");
    HttpResponse::Ok().json(json!({
        "providers": [{"id": "fake", "source": "config", "name": "Fake", "options": {},
                       "models": {"fake-model": {"id": "fake-model", "name": "Fake",
                                                 "limit": {"context": 200000, "output": 8000}}}}],
        "default": {"fake": "fake-model"},
    }))
}

pub(super) async fn summarize(data: Data) -> HttpResponse {
    data.lock().count("POST /session/{id}/summarize");
    HttpResponse::Ok().content_type("application/json").body("true")
}
