//! Is the session planning? A planning model thinks long and quietly, so it gets
//! `recovery.planning_timeout` instead of the stall timeout, and a continue that asks it
//! to finish the plan (`recovery.continue_with_plan_message`).
//!
//! Planning: the turn runs a planning agent (`agent`/`mode` = `plan`), or the latest
//! assistant text announces a plan. Execution — a tool call that edits — ends planning
//! until the next turn. Pure: the core feeds what it sees, and asks [`Planning::active`].

/// Agents that plan rather than execute.
const PLANNING_AGENTS: &[&str] = &["plan"];

/// Tools that change files: calling one is execution.
const EDITING_TOOLS: &[&str] = &["edit", "write", "patch", "multiedit", "apply_patch"];

/// Openings of a text that announces a plan (lower case, at the start of a line).
const PLAN_OPENINGS: &[&str] = &[
    "here's my plan",
    "here is my plan",
    "here's the plan",
    "here is the plan",
    "here's a plan",
    "here is a plan",
    "my plan:",
    "the plan:",
    "plan:",
    "# plan",
    "## plan",
    "### plan",
    "**plan",
    "implementation plan",
    "let me plan",
    "let me make a plan",
    "let me create a plan",
    "i'll start by making a plan",
    "i will start by making a plan",
];

/// What the core has seen about planning in this session.
#[derive(Debug, Default, Clone)]
pub struct Planning {
    agent_plans: bool,
    announced: bool,
    executed: bool,
}

impl Planning {
    /// The session is planning now.
    pub fn active(&self) -> bool {
        !self.executed && (self.agent_plans || self.announced)
    }

    /// A new user turn: its agent decides afresh, and earlier execution is history.
    pub fn on_user_turn(&mut self, agent: Option<&str>) {
        self.executed = false;
        self.announced = false;
        if let Some(agent) = agent {
            self.agent_plans = is_planning_agent(agent);
        }
    }

    /// The agent an assistant message runs with.
    pub fn on_agent(&mut self, agent: &str) {
        self.agent_plans = is_planning_agent(agent);
    }

    /// A finished assistant text part.
    pub fn on_text(&mut self, text: &str) {
        if announces_plan(text) {
            self.announced = true;
            self.executed = false;
        }
    }

    /// A tool call started or finished.
    pub fn on_tool(&mut self, tool: &str) {
        if EDITING_TOOLS.contains(&tool) {
            self.executed = true;
            self.announced = false;
        }
    }
}

pub fn is_planning_agent(agent: &str) -> bool {
    PLANNING_AGENTS.contains(&agent.trim().to_ascii_lowercase().as_str())
}

/// Does this text announce a plan? Only the opening of a line counts, so a text that
/// mentions "the plan" in passing does not.
pub fn announces_plan(text: &str) -> bool {
    text.lines().map(|l| l.trim_start().to_lowercase()).any(|l| PLAN_OPENINGS.iter().any(|o| l.starts_with(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_agent_is_planning_until_it_edits() {
        let mut p = Planning::default();
        p.on_user_turn(Some("plan"));
        assert!(p.active());
        p.on_tool("read");
        assert!(p.active(), "reading is not execution");
        p.on_tool("edit");
        assert!(!p.active());
        p.on_user_turn(Some("plan"));
        assert!(p.active(), "a new turn plans again");
        p.on_user_turn(Some("build"));
        assert!(!p.active());
    }

    #[test]
    fn a_text_announcing_a_plan_is_planning() {
        let mut p = Planning::default();
        p.on_user_turn(Some("build"));
        p.on_text("Sure.\n## Plan\n1. Parse\n2. Test");
        assert!(p.active());
        p.on_tool("write");
        assert!(!p.active());
    }

    #[test]
    fn mentioning_a_plan_in_passing_is_not_planning() {
        assert!(!announces_plan("I followed the plan you gave and the tests pass."));
        assert!(announces_plan("Here's my plan for the refactor:"));
        assert!(announces_plan("  Plan: first the parser"));
    }
}
