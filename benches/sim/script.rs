//! The beats of a turn: a session's script, as OpenCode paces a real one (a working
//! turn, a stall, the reply to a continue prompt), and the frames it will produce.

use serde_json::Value;

use super::CONTINUE_DELTAS;

/// One beat of a session's script: the frames OpenCode sends at one moment of a turn
/// (an event and, for durable changes, its `sync` duplicate). Beats of one session are
/// `step_interval_us` apart.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Beat {
    UserMessage,
    /// The user message of a `prompt_async` (its id, already in the history), with the
    /// parts as posted.
    UserPrompt(String, Vec<Value>),
    Busy,
    AssistantCreated,
    StepStart,
    TextOpen,
    Delta,
    TextClose,
    Tool(&'static str),
    Todo,
    StepFinish(&'static str),
    AssistantFinished(&'static str),
    Idle,
    /// The stalling session falls silent here (stamped when the previous frames leave).
    Stall,
    Aborted,
}

pub(super) fn work_turn(deltas: u32, tool: bool) -> Vec<Beat> {
    let mut p =
        vec![Beat::UserMessage, Beat::Busy, Beat::AssistantCreated, Beat::Busy, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
    p.push(Beat::TextClose);
    if tool {
        p.extend([
            Beat::Tool("pending"),
            Beat::Tool("running"),
            Beat::Todo,
            Beat::Tool("completed"),
            Beat::StepFinish("tool-calls"),
            Beat::AssistantFinished("tool-calls"),
            Beat::AssistantCreated,
            Beat::Busy,
            Beat::StepStart,
            Beat::TextOpen,
        ]);
        p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
        p.push(Beat::TextClose);
    }
    p.extend([Beat::StepFinish("stop"), Beat::AssistantFinished("stop"), Beat::Idle]);
    p
}

pub(super) fn stall_plan(deltas: u32) -> Vec<Beat> {
    let mut p =
        vec![Beat::UserMessage, Beat::Busy, Beat::AssistantCreated, Beat::Busy, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, deltas as usize));
    p.push(Beat::Stall);
    p
}

pub(super) fn continue_turn(id: String, parts: Vec<Value>) -> Vec<Beat> {
    let mut p = vec![Beat::UserPrompt(id, parts), Beat::Busy, Beat::AssistantCreated, Beat::StepStart, Beat::TextOpen];
    p.extend(std::iter::repeat_n(Beat::Delta, CONTINUE_DELTAS as usize));
    p.extend([Beat::TextClose, Beat::StepFinish("stop"), Beat::AssistantFinished("stop"), Beat::Idle]);
    p
}

/// Frames a plan produces (the user prompt's parts counted as one).
pub(super) fn plan_frames(plan: &[Beat]) -> u64 {
    plan.iter()
        .map(|s| match s {
            Beat::UserMessage | Beat::UserPrompt(..) => 4,
            Beat::Busy | Beat::Delta | Beat::Todo => 1,
            Beat::Idle => 6,
            Beat::Stall => 0,
            Beat::Aborted => 12,
            _ => 2,
        })
        .sum()
}
