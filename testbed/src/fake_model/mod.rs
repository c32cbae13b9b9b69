//! A scriptable, OpenAI-compatible fake model that OpenCode talks to in tests and in the
//! demo. It serves `POST /v1/chat/completions` (SSE streaming, or one JSON reply when the
//! request does not stream) and `GET /v1/models` on `127.0.0.1:<random port>`, on a
//! thread of its own (its own actix `System`), so it works from `#[tokio::test]`,
//! `#[actix::test]` and a plain `main` alike. It decides nothing about Shepherd; it only
//! makes OpenCode show the situations Shepherd must handle.
//!
//! # Scripting with markers
//!
//! The fake reads the **last user message** of each request and looks for markers
//! `[[fake:NAME]]` or `[[fake:NAME:ARG]]` (the spec is split at the first `:`, so ARG may
//! contain colons and spaces: `[[fake:bash:sleep 6; echo a:b]]`).
//!
//! Several markers form a per-turn script. The *step* of a request is the number of
//! `assistant` messages that follow the last user message in the request (0 for the first
//! model call of a turn, 1 after one tool round trip, …); step `k` runs the `k`-th
//! marker. When the markers run out the fake answers `Done.` (`finish_reason: stop`), so
//! a turn always ends — except a trailing `cut`, which repeats (see below).
//!
//! A request **without tools** is one of OpenCode's helper calls (title generation,
//! compaction summary): it is answered at once with `Fake title` (when the system prompt
//! mentions a title) or a one-line summary, never with a scripted behaviour (unless a test
//! sets [`FakeModel::set_helper_behaviour`], e.g. to make compaction overflow). A tool-bearing
//! request whose last user message has no marker gets the default behaviour
//! ([`FakeModel::set_default`], initially `ok`).
//!
//! | marker | what the model does |
//! |---|---|
//! | `ok` | text `Hello from fake.`, finish `stop` |
//! | `say:TEXT` | text `TEXT`, finish `stop` |
//! | `slow:S` | text `w0 w1 …` trickled over `S` seconds |
//! | `stall[:S]` | two chunks `Starting work...`, then silence for `S` s (default: until the client disconnects), then ` resumed.` |
//! | `stall-ka[:S]` | like `stall`, the silence filled with `: keep-alive` SSE comments every second |
//! | `hang[:S]` | no response headers for `S` s (default: forever), then like `ok` |
//! | `todo:create` / `todo:partial` / `todo:done` | a `todowrite` call over the same three todos: first in progress + 2 pending / first completed, second in progress / all completed |
//! | `xmltool` | text containing `<function=bash><parameter=command>ls</parameter></function>` |
//! | `saystall:TEXT` | text `TEXT`, then silence until the client goes away |
//! | `ctx400` | HTTP 400 `This model's maximum context length is 200000 tokens. However, your messages resulted in 250123 tokens…`, code `context_length_exceeded` |
//! | `err500` | HTTP 500 `Internal server error (fake)` |
//! | `err429[:S]` | HTTP 429 `Rate limit reached (fake)`, `retry-after: S` (default 3) |
//! | `bigusage[:N]` | text, usage with `N` prompt tokens (default 190000) |
//! | `task[:ARG]` / `bgtask[:ARG]` | a `task` call starting a `general` subagent (`bgtask`: `background: true`) |
//! | `question` | a `question` call: "Pick one?" with options `A` and `B` |
//! | `bash[:CMD]` | a `bash` call running `CMD` (default `echo hello`), e.g. `bash:sleep 6` |
//! | `badtool` | a call of the unknown tool `no_such_tool` |
//! | `reasoning` | a reasoning part, then text |
//! | `length` | text, finish `length` |
//! | `cut` | two chunks, then the stream ends with no finish reason and no `[DONE]`; a trailing `cut` repeats at every later step (OpenCode's runaway loop); `[[fake:cut]][[fake:ok]]` cuts once |
//!
//! The ARG of `task`/`bgtask` becomes the child session's prompt (its last user message,
//! so the child follows markers of its own):
//! - no ARG: `Do the child work. [[fake:ok]]`;
//! - ARG that is a spec: `task:slow:5` → `Do the child work. [[fake:slow:5]]`;
//! - ARG containing markers is used verbatim; brackets nest, so
//!   `[[fake:task:check [[fake:todo:create]][[fake:ok]]]]` gives the child a two-step script;
//! - any other ARG is used verbatim as plain text.
//!
//! A marker that does not parse is answered with a text naming the problem.
//!
//! OpenCode 1.18.34 gives a `general` subagent only `bash, edit, glob, grep, read, skill,
//! webfetch, write`: in a child, `todo:*`, `question` and `task` call tools it does not
//! have, and OpenCode turns them into its `invalid` tool (the child carries on).
//!
//! Tool inputs follow the schemas OpenCode sends in `tools`: `todowrite {todos: [{content,
//! status, priority}]}`, `task {description, prompt, subagent_type[, background]}`
//! (`background` is offered only with `OPENCODE_EXPERIMENTAL_BACKGROUND_SUBAGENTS=true`),
//! `question {questions: [{question, header, options: [{label, description}]}]}`,
//! `bash {command[, timeout, workdir]}` (the fake also sends `description: "Run a
//! command"`, as in the study's captures; OpenCode keeps it in the part's input).
//!
//! A request for the model `advisor-model` ([`ADVISOR_MODEL`]) is Shepherd's advisor asking,
//! never a session's turn: it is answered from [`FakeModel::set_advisor_answers`] (a good
//! answer, garbage, `hang`, `err500`), so tests script the advisor without touching turns.
//!
//! Every chat request is logged ([`FakeModel::requests`]): what the model saw, the step,
//! the behaviour chosen, and whether the client read the stream to the end or went away.

pub mod marker;
pub mod reply;
mod server;

pub use marker::{Behaviour, MarkerError, Script, StepChoice, TodoStage};
pub use server::{FakeModel, FakeRequest, RequestKind, StreamEnd, ADVISOR_MODEL};
