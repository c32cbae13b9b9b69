//! Marker parsing: turns the text of a user message into the fake model's script.
//!
//! Pure functions only (no I/O, no clock). The syntax is documented on
//! [`crate::fake_model`]; this module owns the grammar:
//!
//! - a marker is `[[fake:SPEC]]`; `SPEC` is `NAME` or `NAME:ARG`, split at the first `:`;
//! - brackets nest, so the `ARG` of a marker may itself contain markers
//!   (`[[fake:task:child text [[fake:todo:create]]]]`): the marker ends at the `]]`
//!   that balances its `[[`;
//! - the markers of one message, in order, form the [`Script`].

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// What the fake model does for one model call ("step").
#[derive(Debug, Clone, PartialEq)]
pub enum Behaviour {
    /// `ok`: a short text reply, `finish_reason: stop`.
    Ok,
    /// `say:TEXT`: reply with exactly `TEXT`, `finish_reason: stop`.
    Say(String),
    /// `slow:S`: a text reply trickled over `S` seconds.
    Slow(Duration),
    /// `stall[:S]`: two text chunks, then silence for `S` seconds (or forever), then finish.
    Stall(Option<Duration>),
    /// `stall-ka[:S]`: like `stall`, but the silence carries SSE comment keep-alives.
    StallKeepAlive(Option<Duration>),
    /// `hang[:S]`: no response headers for `S` seconds (or forever), then an `ok` reply.
    Hang(Option<Duration>),
    /// `todo:create|partial|done`: a `todowrite` tool call.
    Todo(TodoStage),
    /// `xmltool`: plain text that looks like a tool call written as XML.
    XmlTool,
    /// `saystall:TEXT`: text `TEXT`, then silence until the client goes away (a reply
    /// that stops mid-stream after saying something in particular).
    SayStall(String),
    /// `ctx400`: HTTP 400 "maximum context length" (`context_length_exceeded`).
    Ctx400,
    /// `err500`: HTTP 500.
    Err500,
    /// `err429[:S]`: HTTP 429 with `retry-after: S` (default 3).
    Err429(u64),
    /// `bigusage[:N]`: a text reply whose usage reports `N` prompt tokens (default 190000).
    BigUsage(u64),
    /// `task[:ARG]` / `bgtask[:ARG]`: a `task` tool call that starts a `general` subagent.
    Task {
        /// The child's prompt (see [`child_prompt`] for how `ARG` becomes this).
        prompt: String,
        /// `bgtask`: `background: true` in the tool input.
        background: bool,
    },
    /// `question`: a `question` tool call with one question and the options A and B.
    Question,
    /// `bash[:CMD]`: a `bash` tool call running `CMD` (default `echo hello`).
    Bash(String),
    /// `badtool`: a call of a tool that does not exist (`no_such_tool`).
    BadTool,
    /// `reasoning`: a reasoning part, then text.
    Reasoning,
    /// `length`: a text reply with `finish_reason: length`.
    Length,
    /// `cut`: a few text chunks, then the stream ends with no finish reason and no `[DONE]`.
    Cut,
}

/// The three stages of the scripted todo list. They describe the same three todos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TodoStage {
    /// First in progress, the two others pending.
    Create,
    /// First completed, second in progress, third pending.
    Partial,
    /// All three completed.
    Done,
}

/// Default `retry-after` of `err429`, seconds.
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 3;
/// Default prompt tokens of `bigusage`.
pub const DEFAULT_BIG_USAGE_TOKENS: u64 = 190_000;
/// Default command of `bash`.
pub const DEFAULT_BASH_COMMAND: &str = "echo hello";
/// Default behaviour of a subagent started by `task`/`bgtask` without an argument.
pub const DEFAULT_CHILD_SPEC: &str = "ok";

/// A marker that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MarkerError {
    /// The `NAME` is not a behaviour.
    #[error("unknown fake behaviour `{0}`")]
    UnknownName(String),
    /// The `ARG` does not fit the behaviour.
    #[error("bad argument `{arg}` for fake behaviour `{name}`: {reason}")]
    BadArg {
        /// Behaviour name.
        name: String,
        /// The argument as written.
        arg: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// `[[fake:` without a balancing `]]`.
    #[error("unterminated marker starting at byte {0}")]
    Unterminated(usize),
}

const OPEN: &str = "[[";
const CLOSE: &str = "]]";
const PREFIX: &str = "[[fake:";

/// The specs (`NAME[:ARG]`, the text between `[[fake:` and the balancing `]]`) of the
/// top-level markers in `text`, in order. Markers nested in an `ARG` are not listed.
pub fn marker_specs(text: &str) -> Result<Vec<&str>, MarkerError> {
    let mut specs = Vec::new();
    let mut pos = 0;
    while let Some(found) = text[pos..].find(PREFIX) {
        let start = pos + found;
        let body_start = start + PREFIX.len();
        let end = balanced_end(text, body_start).ok_or(MarkerError::Unterminated(start))?;
        specs.push(&text[body_start..end]);
        pos = end + CLOSE.len();
    }
    Ok(specs)
}

/// Byte index of the `]]` that closes a `[[` whose body starts at `from`.
fn balanced_end(text: &str, from: usize) -> Option<usize> {
    // Byte-wise: `[` and `]` never occur inside a multi-byte UTF-8 sequence, and the
    // returned index is always that of an ASCII `]`, hence a char boundary.
    let bytes = text.as_bytes();
    let mut depth = 1usize;
    let mut i = from;
    while i + 1 < bytes.len() {
        if bytes[i..].starts_with(OPEN.as_bytes()) {
            depth += 1;
            i += OPEN.len();
        } else if bytes[i..].starts_with(CLOSE.as_bytes()) {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
            i += CLOSE.len();
        } else {
            i += 1;
        }
    }
    None
}

impl Behaviour {
    /// Parses one spec `NAME[:ARG]` (the inside of a marker).
    pub fn parse(spec: &str) -> Result<Behaviour, MarkerError> {
        let spec = spec.trim();
        let (name, arg) = match spec.split_once(':') {
            Some((n, a)) => (n.trim(), Some(a)),
            None => (spec, None),
        };
        let bad = |reason: &'static str| MarkerError::BadArg {
            name: name.to_string(),
            arg: arg.unwrap_or_default().to_string(),
            reason,
        };
        let secs = |a: &str| -> Result<Duration, MarkerError> {
            a.trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| bad("expected a number of seconds"))
        };
        let opt_secs = |a: Option<&str>| a.map(secs).transpose();
        let behaviour = match name {
            "ok" => Behaviour::Ok,
            "say" => Behaviour::Say(arg.unwrap_or("Hello from fake.").to_string()),
            "slow" => Behaviour::Slow(secs(arg.ok_or_else(|| bad("slow needs seconds"))?)?),
            "stall" => Behaviour::Stall(opt_secs(arg)?),
            "stall-ka" => Behaviour::StallKeepAlive(opt_secs(arg)?),
            "hang" => Behaviour::Hang(opt_secs(arg)?),
            "todo" => Behaviour::Todo(match arg.map(str::trim) {
                Some("create") | None => TodoStage::Create,
                Some("partial") => TodoStage::Partial,
                Some("done") => TodoStage::Done,
                Some(_) => return Err(bad("expected create, partial or done")),
            }),
            "xmltool" => Behaviour::XmlTool,
            "saystall" => Behaviour::SayStall(arg.ok_or_else(|| bad("saystall needs a text"))?.to_string()),
            "ctx400" => Behaviour::Ctx400,
            "err500" => Behaviour::Err500,
            "err429" => Behaviour::Err429(match arg {
                Some(a) => a.trim().parse().map_err(|_| bad("expected whole seconds"))?,
                None => DEFAULT_RETRY_AFTER_SECS,
            }),
            "bigusage" => Behaviour::BigUsage(match arg {
                Some(a) => a.trim().parse().map_err(|_| bad("expected a token count"))?,
                None => DEFAULT_BIG_USAGE_TOKENS,
            }),
            "task" | "bgtask" => Behaviour::Task {
                prompt: child_prompt(arg.unwrap_or(DEFAULT_CHILD_SPEC)),
                background: name == "bgtask",
            },
            "question" => Behaviour::Question,
            "bash" => Behaviour::Bash(arg.filter(|a| !a.trim().is_empty()).unwrap_or(DEFAULT_BASH_COMMAND).to_string()),
            "badtool" => Behaviour::BadTool,
            "reasoning" => Behaviour::Reasoning,
            "length" => Behaviour::Length,
            "cut" => Behaviour::Cut,
            other => return Err(MarkerError::UnknownName(other.to_string())),
        };
        Ok(behaviour)
    }

    /// The spec that parses back into this behaviour (for logs and error messages).
    pub fn spec(&self) -> String {
        let secs = |d: &Duration| format_secs(*d);
        match self {
            Behaviour::Ok => "ok".into(),
            Behaviour::Say(t) => format!("say:{t}"),
            Behaviour::Slow(d) => format!("slow:{}", secs(d)),
            Behaviour::Stall(None) => "stall".into(),
            Behaviour::Stall(Some(d)) => format!("stall:{}", secs(d)),
            Behaviour::StallKeepAlive(None) => "stall-ka".into(),
            Behaviour::StallKeepAlive(Some(d)) => format!("stall-ka:{}", secs(d)),
            Behaviour::Hang(None) => "hang".into(),
            Behaviour::Hang(Some(d)) => format!("hang:{}", secs(d)),
            Behaviour::Todo(TodoStage::Create) => "todo:create".into(),
            Behaviour::Todo(TodoStage::Partial) => "todo:partial".into(),
            Behaviour::Todo(TodoStage::Done) => "todo:done".into(),
            Behaviour::XmlTool => "xmltool".into(),
            Behaviour::SayStall(t) => format!("saystall:{t}"),
            Behaviour::Ctx400 => "ctx400".into(),
            Behaviour::Err500 => "err500".into(),
            Behaviour::Err429(s) => format!("err429:{s}"),
            Behaviour::BigUsage(n) => format!("bigusage:{n}"),
            Behaviour::Task { prompt, background } => {
                let name = if *background { "bgtask" } else { "task" };
                format!("{name}:{prompt}")
            }
            Behaviour::Question => "question".into(),
            Behaviour::Bash(c) => format!("bash:{c}"),
            Behaviour::BadTool => "badtool".into(),
            Behaviour::Reasoning => "reasoning".into(),
            Behaviour::Length => "length".into(),
            Behaviour::Cut => "cut".into(),
        }
    }
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec())
    }
}

impl std::str::FromStr for Behaviour {
    type Err = MarkerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Behaviour::parse(s)
    }
}

fn format_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{}", d.as_secs())
    } else {
        format!("{s}")
    }
}

/// The prompt a `task`/`bgtask` marker gives its subagent.
///
/// - `ARG` containing `[[` is the child's prompt, verbatim
///   (`[[fake:task:Check it [[fake:todo:create]][[fake:ok]]]]`).
/// - `ARG` whose first `:`-separated word is a behaviour name is a child spec:
///   `task:slow:5` → `"Do the child work. [[fake:slow:5]]"`.
/// - any other `ARG` is the child's prompt, verbatim (the child then answers `Done.`).
pub fn child_prompt(arg: &str) -> String {
    let arg = arg.trim();
    if arg.contains(OPEN) {
        return arg.to_string();
    }
    match Behaviour::parse(arg) {
        Ok(_) => format!("Do the child work. [[fake:{arg}]]"),
        Err(_) => arg.to_string(),
    }
}

/// The markers of one user message: step `k` of the turn uses entry `k`.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// One entry per marker, in order; an entry is `Err` if its marker did not parse.
    pub steps: Vec<Result<Behaviour, MarkerError>>,
}

/// What the fake does for one request, decided from the script and the step index.
#[derive(Debug, Clone, PartialEq)]
pub enum StepChoice {
    /// Run this behaviour.
    Scripted(Behaviour),
    /// The marker at this step did not parse: reply with text explaining why.
    Invalid(MarkerError),
    /// The script is exhausted: reply with the final text `Done.`.
    Finished,
    /// The message has no markers at all.
    Unscripted,
}

impl Script {
    /// Parses every top-level marker of `text`. An unterminated marker becomes one
    /// invalid step.
    pub fn parse(text: &str) -> Script {
        match marker_specs(text) {
            Ok(specs) => Script { steps: specs.into_iter().map(Behaviour::parse).collect() },
            Err(e) => Script { steps: vec![Err(e)] },
        }
    }

    /// True if the message had no marker.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The choice for step `step` (0 = the first model call after the user message).
    ///
    /// When the markers run out the answer is [`StepChoice::Finished`], except when the
    /// last marker is `cut`: OpenCode re-calls the model after a stream without a finish
    /// reason, and a trailing `cut` keeps cutting, reproducing OpenCode's runaway loop.
    pub fn choose(&self, step: usize) -> StepChoice {
        if self.steps.is_empty() {
            return StepChoice::Unscripted;
        }
        let entry = match self.steps.get(step) {
            Some(e) => e,
            None => match self.steps.last() {
                Some(Ok(Behaviour::Cut)) => return StepChoice::Scripted(Behaviour::Cut),
                _ => return StepChoice::Finished,
            },
        };
        match entry {
            Ok(b) => StepChoice::Scripted(b.clone()),
            Err(e) => StepChoice::Invalid(e.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_in_order() {
        let specs = marker_specs("do it [[fake:todo:create]] then [[fake:stall]]").unwrap();
        assert_eq!(specs, vec!["todo:create", "stall"]);
    }

    #[test]
    fn nested_markers_stay_inside_their_parent_arg() {
        let specs = marker_specs("x [[fake:task:child [[fake:todo:create]][[fake:ok]]]] y [[fake:ok]]").unwrap();
        assert_eq!(specs, vec!["task:child [[fake:todo:create]][[fake:ok]]", "ok"]);
        let b = Behaviour::parse(specs[0]).unwrap();
        assert_eq!(b, Behaviour::Task { prompt: "child [[fake:todo:create]][[fake:ok]]".into(), background: false });
    }

    #[test]
    fn non_ascii_text_is_fine() {
        let specs = marker_specs("é [[fake:say:héllo wörld ✓]] ü [[fake:ok]]").unwrap();
        assert_eq!(specs, vec!["say:héllo wörld ✓", "ok"]);
    }

    #[test]
    fn unterminated_marker_is_an_error() {
        assert_eq!(marker_specs("a [[fake:ok"), Err(MarkerError::Unterminated(2)));
    }

    #[test]
    fn args_are_split_at_the_first_colon() {
        assert_eq!(Behaviour::parse("bash:sleep 6; echo a:b").unwrap(), Behaviour::Bash("sleep 6; echo a:b".into()));
        assert_eq!(Behaviour::parse("slow:1.5").unwrap(), Behaviour::Slow(Duration::from_millis(1500)));
        assert_eq!(Behaviour::parse("stall").unwrap(), Behaviour::Stall(None));
        assert_eq!(Behaviour::parse("err429").unwrap(), Behaviour::Err429(3));
        assert!(matches!(Behaviour::parse("slow:x"), Err(MarkerError::BadArg { .. })));
        assert!(matches!(Behaviour::parse("nope"), Err(MarkerError::UnknownName(_))));
    }

    #[test]
    fn task_arg_that_is_a_spec_becomes_a_child_marker() {
        assert_eq!(child_prompt("slow:5"), "Do the child work. [[fake:slow:5]]");
        assert_eq!(child_prompt("ok"), "Do the child work. [[fake:ok]]");
        assert_eq!(child_prompt("write a poem"), "write a poem");
        assert_eq!(
            Behaviour::parse("bgtask").unwrap(),
            Behaviour::Task { prompt: "Do the child work. [[fake:ok]]".into(), background: true }
        );
    }

    #[test]
    fn spec_round_trips() {
        for spec in [
            "ok",
            "slow:2",
            "stall",
            "stall:1.5",
            "stall-ka:20",
            "hang",
            "todo:partial",
            "err429:7",
            "bigusage:196000",
            "bash:sleep 3",
            "cut",
            "say:hi there",
        ] {
            assert_eq!(Behaviour::parse(spec).unwrap().spec(), spec);
        }
    }

    #[test]
    fn steps_follow_markers_then_finish() {
        let s = Script::parse("[[fake:todo:create]][[fake:stall]]");
        assert_eq!(s.choose(0), StepChoice::Scripted(Behaviour::Todo(TodoStage::Create)));
        assert_eq!(s.choose(1), StepChoice::Scripted(Behaviour::Stall(None)));
        assert_eq!(s.choose(2), StepChoice::Finished);
        assert_eq!(Script::parse("hello").choose(0), StepChoice::Unscripted);
    }

    #[test]
    fn trailing_cut_repeats() {
        let s = Script::parse("[[fake:cut]]");
        assert_eq!(s.choose(5), StepChoice::Scripted(Behaviour::Cut));
        let s = Script::parse("[[fake:cut]][[fake:ok]]");
        assert_eq!(s.choose(2), StepChoice::Finished);
    }
}
