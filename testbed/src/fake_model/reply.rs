//! What the fake model answers: reads an OpenAI chat request ([`RequestView`]) and plans
//! the reply ([`Reply`]) as a list of SSE frames and pauses.
//!
//! Pure: no sockets and no clock (the `created` timestamp and the ids are passed in by
//! the server). The server in `server.rs` turns a [`Reply`] into HTTP.

use std::time::Duration;

use serde_json::{json, Value};

use super::marker::{Behaviour, TodoStage};

/// The parts of an OpenAI `POST /v1/chat/completions` body that decide the reply.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestView {
    /// `model`.
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage: true`.
    pub include_usage: bool,
    /// Names of the functions in `tools` (empty: a helper call such as title generation).
    pub tool_names: Vec<String>,
    /// The text of the last `role: "user"` message (text parts joined by newlines).
    pub last_user_text: String,
    /// How many `role: "assistant"` messages follow the last user message: the step index.
    pub step: usize,
    /// The text of all system messages, joined.
    pub system_text: String,
}

impl RequestView {
    /// Reads a request body. Missing or odd fields give defaults: the fake never refuses
    /// a request for its shape.
    pub fn from_body(body: &Value) -> RequestView {
        let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let role = |m: &Value| m.get("role").and_then(Value::as_str).unwrap_or("").to_string();
        let last_user = messages.iter().rposition(|m| role(m) == "user");
        let (last_user_text, step) = match last_user {
            Some(i) => {
                (content_text(&messages[i]), messages[i + 1..].iter().filter(|m| role(m) == "assistant").count())
            }
            None => (String::new(), 0),
        };
        let system_text =
            messages.iter().filter(|m| role(m) == "system").map(content_text).collect::<Vec<_>>().join("\n");
        let tool_names = body
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        RequestView {
            model: body.get("model").and_then(Value::as_str).unwrap_or("").to_string(),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
            tool_names,
            last_user_text,
            step,
            system_text,
        }
    }

    /// A request without tools: one of OpenCode's helper calls (title, summary), never
    /// scripted.
    pub fn is_helper(&self) -> bool {
        self.tool_names.is_empty()
    }
}

/// The text of a message whose `content` is a string or an array of parts.
fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

/// A wait with or without an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// This long.
    For(Duration),
    /// Until the client goes away.
    Forever,
}

impl From<Option<Duration>> for Wait {
    fn from(d: Option<Duration>) -> Wait {
        d.map_or(Wait::Forever, Wait::For)
    }
}

/// One element of a streamed reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `data: <json>\n\n`.
    Chunk(Value),
    /// Send nothing for a while (or forever).
    Pause(Wait),
    /// `: keep-alive\n\n` comments every `every`, for `total` (or forever).
    KeepAlive {
        /// How long the keep-alive phase lasts.
        total: Wait,
        /// Interval between comments.
        every: Duration,
    },
    /// `data: [DONE]\n\n`.
    Done,
}

/// The planned answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An HTTP error with an OpenAI-style JSON body.
    Error {
        /// HTTP status.
        status: u16,
        /// JSON body.
        body: Value,
        /// `retry-after` header, seconds.
        retry_after: Option<u64>,
    },
    /// A `200` reply (SSE when the request streams, otherwise collapsed into one JSON).
    Ok {
        /// Delay before the response headers (the `hang` behaviour).
        before_headers: Option<Wait>,
        /// The SSE frames.
        frames: Vec<Frame>,
    },
}

/// Interval of the SSE comments of `stall-ka`.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);

/// The same three todos at every stage, so a `create` → `partial` → `done` script
/// describes one list.
pub const TODO_CONTENTS: [(&str, &str); 3] =
    [("Write the parser", "high"), ("Add tests", "medium"), ("Update docs", "medium")];

/// Text of the final answer once the script is exhausted.
pub const FINISHED_TEXT: &str = "Done.";
/// Text of the `ok` behaviour.
pub const OK_TEXT: &str = "Hello from fake.";
/// Title returned to OpenCode's title-generation helper call.
pub const TITLE_TEXT: &str = "Fake title";
/// Summary returned to other helper calls (compaction summaries).
pub const SUMMARY_TEXT: &str = "Summary: the user and the fake model exchanged greetings.";

/// Per-request facts the planner needs but must not invent (ids, clock).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyContext {
    /// `id` of the completion (`chatcmpl-…`).
    pub completion_id: String,
    /// `id` of a tool call, if one is made (`call_…`).
    pub call_id: String,
    /// `created`, epoch seconds.
    pub created: u64,
    /// Model name echoed back.
    pub model: String,
}

/// Builds OpenAI `chat.completion.chunk` objects.
struct Chunks<'a>(&'a ReplyContext);

impl Chunks<'_> {
    fn chunk(&self, delta: Value, finish: Option<&str>, usage: Option<Value>) -> Frame {
        let mut c = json!({
            "id": self.0.completion_id,
            "object": "chat.completion.chunk",
            "created": self.0.created,
            "model": self.0.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some(u) = usage {
            c["usage"] = u;
        }
        Frame::Chunk(c)
    }
    fn text(&self, t: &str) -> Frame {
        self.chunk(json!({"role": "assistant", "content": t}), None, None)
    }
    fn reasoning(&self, t: &str) -> Frame {
        self.chunk(json!({"role": "assistant", "content": null, "reasoning_content": t}), None, None)
    }
    fn tool_call(&self, name: &str, args: &Value) -> Frame {
        self.chunk(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "index": 0,
                "id": self.0.call_id,
                "type": "function",
                "function": {"name": name, "arguments": args.to_string()},
            }]}),
            None,
            None,
        )
    }
    fn finish(&self, reason: &str, prompt_tokens: u64, completion_tokens: u64) -> Frame {
        self.chunk(json!({}), Some(reason), Some(usage(prompt_tokens, completion_tokens)))
    }
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Usage reported by ordinary replies (matches the study: input 100, output 5).
const PROMPT_TOKENS: u64 = 100;
const COMPLETION_TOKENS: u64 = 5;

/// Splits text into word chunks that keep their trailing space.
fn words(text: &str) -> Vec<&str> {
    text.split_inclusive(' ').collect()
}

fn text_reply(c: &Chunks<'_>, text: &str, finish: &str) -> Vec<Frame> {
    let mut f: Vec<Frame> = words(text).into_iter().map(|w| c.text(w)).collect();
    f.push(c.finish(finish, PROMPT_TOKENS, COMPLETION_TOKENS));
    f.push(Frame::Done);
    f
}

fn tool_reply(c: &Chunks<'_>, name: &str, args: Value) -> Vec<Frame> {
    vec![c.tool_call(name, &args), c.finish("tool_calls", PROMPT_TOKENS, COMPLETION_TOKENS), Frame::Done]
}

fn ok(frames: Vec<Frame>) -> Reply {
    Reply::Ok { before_headers: None, frames }
}

/// An OpenAI-style error body.
fn error_body(message: &str, kind: &str, code: Option<&str>) -> Value {
    let mut e = json!({"message": message, "type": kind});
    if let Some(code) = code {
        e["param"] = json!("messages");
        e["code"] = json!(code);
    }
    json!({ "error": e })
}

/// The `todowrite` input of a todo stage.
pub fn todo_input(stage: TodoStage) -> Value {
    let statuses = match stage {
        TodoStage::Create => ["in_progress", "pending", "pending"],
        TodoStage::Partial => ["completed", "in_progress", "pending"],
        TodoStage::Done => ["completed", "completed", "completed"],
    };
    let todos: Vec<Value> = TODO_CONTENTS
        .iter()
        .zip(statuses)
        .map(|((content, priority), status)| json!({"content": content, "status": status, "priority": priority}))
        .collect();
    json!({ "todos": todos })
}

/// Plans the reply for one scripted behaviour.
pub fn plan(behaviour: &Behaviour, ctx: &ReplyContext) -> Reply {
    let c = Chunks(ctx);
    match behaviour {
        Behaviour::Ok => ok(text_reply(&c, OK_TEXT, "stop")),
        Behaviour::Say(t) => ok(text_reply(&c, t, "stop")),
        Behaviour::Slow(total) => {
            let n = ((total.as_secs_f64() * 2.0).ceil() as usize).clamp(2, 200);
            let gap = *total / n as u32;
            let mut f = Vec::with_capacity(2 * n + 2);
            for i in 0..n {
                f.push(c.text(&format!("w{i} ")));
                f.push(Frame::Pause(Wait::For(gap)));
            }
            f.push(c.finish("stop", PROMPT_TOKENS, COMPLETION_TOKENS));
            f.push(Frame::Done);
            ok(f)
        }
        Behaviour::Stall(d) | Behaviour::StallKeepAlive(d) => {
            let silence = match behaviour {
                Behaviour::StallKeepAlive(_) => Frame::KeepAlive { total: (*d).into(), every: KEEPALIVE_EVERY },
                _ => Frame::Pause((*d).into()),
            };
            let mut f = vec![c.text("Starting "), c.text("work..."), silence];
            f.extend(text_reply(&c, " resumed.", "stop"));
            ok(f)
        }
        Behaviour::Hang(d) => Reply::Ok { before_headers: Some((*d).into()), frames: text_reply(&c, OK_TEXT, "stop") },
        Behaviour::Todo(stage) => ok(tool_reply(&c, "todowrite", todo_input(*stage))),
        Behaviour::XmlTool => ok(text_reply(
            &c,
            "I will list the files.\n<function=bash><parameter=command>ls</parameter></function>",
            "stop",
        )),
        Behaviour::SayStall(t) => ok(vec![c.text(t), Frame::Pause(Wait::Forever)]),
        Behaviour::Ctx400 => Reply::Error {
            status: 400,
            body: error_body(
                "This model's maximum context length is 200000 tokens. However, your messages \
                 resulted in 250123 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                Some("context_length_exceeded"),
            ),
            retry_after: None,
        },
        Behaviour::Err500 => Reply::Error {
            status: 500,
            body: error_body("Internal server error (fake)", "server_error", None),
            retry_after: None,
        },
        Behaviour::Err429(secs) => Reply::Error {
            status: 429,
            body: error_body("Rate limit reached (fake)", "rate_limit_error", None),
            retry_after: Some(*secs),
        },
        Behaviour::BigUsage(n) => {
            let mut f: Vec<Frame> = words("Big usage reply.").into_iter().map(|w| c.text(w)).collect();
            f.push(c.finish("stop", *n, 50));
            f.push(Frame::Done);
            ok(f)
        }
        Behaviour::Task { prompt, background } => {
            let mut args = json!({
                "description": if *background { "Fake background subtask" } else { "Fake subtask" },
                "prompt": prompt,
                "subagent_type": "general",
            });
            if *background {
                args["background"] = json!(true);
            }
            ok(tool_reply(&c, "task", args))
        }
        Behaviour::Question => ok(tool_reply(
            &c,
            "question",
            json!({"questions": [{
                "question": "Pick one?",
                "header": "Pick",
                "options": [
                    {"label": "A", "description": "a"},
                    {"label": "B", "description": "b"},
                ],
            }]}),
        )),
        Behaviour::Bash(cmd) => ok(tool_reply(&c, "bash", json!({"command": cmd, "description": "Run a command"}))),
        Behaviour::BadTool => ok(tool_reply(&c, "no_such_tool", json!({}))),
        Behaviour::Reasoning => {
            let mut f = vec![c.reasoning("Let me think. "), c.reasoning("Thinking done.")];
            f.extend(text_reply(&c, "Answer after reasoning.", "stop"));
            ok(f)
        }
        Behaviour::Length => ok(text_reply(&c, "Truncated output", "length")),
        Behaviour::Cut => ok(vec![c.text("Partial "), c.text("output")]),
    }
}

/// The final answer once the markers are used up.
pub fn plan_finished(ctx: &ReplyContext) -> Reply {
    ok(text_reply(&Chunks(ctx), FINISHED_TEXT, "stop"))
}

/// The answer to a helper call (no tools): a title for title generation, else a summary.
pub fn plan_helper(view: &RequestView, ctx: &ReplyContext) -> Reply {
    let text = if view.system_text.to_lowercase().contains("title") { TITLE_TEXT } else { SUMMARY_TEXT };
    ok(text_reply(&Chunks(ctx), text, "stop"))
}

/// A plain text answer (used to explain a marker that did not parse).
pub fn plan_text(text: &str, ctx: &ReplyContext) -> Reply {
    ok(text_reply(&Chunks(ctx), text, "stop"))
}

/// The non-streaming form of a `200` reply: one `chat.completion` object built from the
/// frames, and the total finite pause they contained (`None`: the reply never ends).
pub fn collapse(frames: &[Frame], ctx: &ReplyContext) -> (Value, Option<Duration>) {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    let mut finish: Option<String> = None;
    let mut usage_v: Option<Value> = None;
    let mut delay = Some(Duration::ZERO);
    for frame in frames {
        match frame {
            Frame::Chunk(c) => {
                if let Some(u) = c.get("usage") {
                    usage_v = Some(u.clone());
                }
                let Some(choice) = c.pointer("/choices/0") else {
                    continue;
                };
                if let Some(t) = choice.pointer("/delta/content").and_then(Value::as_str) {
                    content.push_str(t);
                }
                if let Some(t) = choice.pointer("/delta/reasoning_content").and_then(Value::as_str) {
                    reasoning.push_str(t);
                }
                if let Some(calls) = choice.pointer("/delta/tool_calls").and_then(Value::as_array) {
                    for call in calls {
                        let mut call = call.clone();
                        if let Some(o) = call.as_object_mut() {
                            o.remove("index");
                        }
                        tool_calls.push(call);
                    }
                }
                if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                    finish = Some(f.to_string());
                }
            }
            Frame::Pause(Wait::For(d)) | Frame::KeepAlive { total: Wait::For(d), .. } => delay = delay.map(|t| t + *d),
            Frame::Pause(Wait::Forever) | Frame::KeepAlive { total: Wait::Forever, .. } => delay = None,
            Frame::Done => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": content});
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !tool_calls.is_empty() {
        message["tool_calls"] = json!(tool_calls);
    }
    let body = json!({
        "id": ctx.completion_id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage_v.unwrap_or_else(|| usage(PROMPT_TOKENS, COMPLETION_TOKENS)),
    });
    (body, delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ReplyContext {
        ReplyContext {
            completion_id: "chatcmpl-1".into(),
            call_id: "call_1".into(),
            created: 1,
            model: "fake-model".into(),
        }
    }

    #[test]
    fn step_counts_assistant_messages_after_the_last_user_message() {
        let body = json!({
            "model": "fake-model", "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "bash"}}],
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "old [[fake:ok]]"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": [{"type": "text", "text": "new [[fake:todo:create]][[fake:stall]]"}]},
                {"role": "assistant", "content": null, "tool_calls": []},
                {"role": "tool", "content": "ok"},
            ]
        });
        let v = RequestView::from_body(&body);
        assert_eq!(v.step, 1);
        assert_eq!(v.last_user_text, "new [[fake:todo:create]][[fake:stall]]");
        assert!(v.stream && v.include_usage && !v.is_helper());
        assert_eq!(v.tool_names, vec!["bash"]);
    }

    #[test]
    fn tool_call_stream_ends_with_tool_calls_finish() {
        let Reply::Ok { frames, .. } = plan(&Behaviour::Todo(TodoStage::Partial), &ctx()) else {
            panic!("expected ok reply");
        };
        let Frame::Chunk(call) = &frames[0] else { panic!() };
        assert_eq!(call.pointer("/choices/0/delta/tool_calls/0/function/name"), Some(&json!("todowrite")));
        let args: Value = serde_json::from_str(
            call.pointer("/choices/0/delta/tool_calls/0/function/arguments").and_then(Value::as_str).unwrap(),
        )
        .unwrap();
        assert_eq!(args.pointer("/todos/0/status"), Some(&json!("completed")));
        assert_eq!(args.pointer("/todos/1/content"), Some(&json!("Add tests")));
        let Frame::Chunk(fin) = &frames[1] else { panic!() };
        assert_eq!(fin.pointer("/choices/0/finish_reason"), Some(&json!("tool_calls")));
        assert_eq!(frames.last(), Some(&Frame::Done));
    }

    #[test]
    fn cut_has_no_finish_and_no_done() {
        let Reply::Ok { frames, .. } = plan(&Behaviour::Cut, &ctx()) else { panic!() };
        assert!(!frames.contains(&Frame::Done));
        assert!(frames.iter().all(|f| match f {
            Frame::Chunk(c) => c.pointer("/choices/0/finish_reason") == Some(&Value::Null),
            _ => true,
        }));
    }

    #[test]
    fn collapse_joins_text_and_sums_pauses() {
        let Reply::Ok { frames, .. } = plan(&Behaviour::Stall(Some(Duration::from_secs(2))), &ctx()) else { panic!() };
        let (body, delay) = collapse(&frames, &ctx());
        assert_eq!(body.pointer("/choices/0/message/content"), Some(&json!("Starting work... resumed.")));
        assert_eq!(body.pointer("/choices/0/finish_reason"), Some(&json!("stop")));
        assert_eq!(delay, Some(Duration::from_secs(2)));
        let Reply::Ok { frames, .. } = plan(&Behaviour::Stall(None), &ctx()) else { panic!() };
        assert_eq!(collapse(&frames, &ctx()).1, None);
    }

    #[test]
    fn ctx400_is_an_openai_context_length_error() {
        let Reply::Error { status, body, .. } = plan(&Behaviour::Ctx400, &ctx()) else { panic!() };
        assert_eq!(status, 400);
        assert_eq!(body.pointer("/error/code"), Some(&json!("context_length_exceeded")));
        assert!(body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap()
            .contains("maximum context length is 200000 tokens"));
    }
}
