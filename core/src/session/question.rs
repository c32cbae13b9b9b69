//! Does the agent's last reply ask the person something? Then the session is waiting
//! for a human, and Shepherd must not talk over them with a nudge or a review.
//!
//! Pure text heuristics, deliberately conservative in one direction: a reply that ends
//! in a question, or closes by inviting an answer ("Let me know…", "Should I…"), counts.
//! A question in the middle of a long reply that then goes on does not.

/// How much of the reply's end is read: a question further back has been answered by
/// the agent itself or is rhetorical.
const TAIL_CHARS: usize = 400;

/// Phrases that, in the closing lines, hand the turn to the person.
const INVITATIONS: &[&str] = &[
    "let me know",
    "would you like",
    "do you want",
    "should i ",
    "shall i ",
    "can you confirm",
    "could you confirm",
    "please confirm",
    "which option",
    "which one would you",
    "how would you like",
    "what would you like",
    "waiting for your",
    "before i proceed",
    "before i continue",
];

/// True when the closing text of a reply asks the person a question.
pub fn asks_the_person(text: &str) -> bool {
    let trimmed = text.trim_end_matches(|c: char| c.is_whitespace() || "*_`\"')]>".contains(c));
    if trimmed.ends_with('?') {
        return true;
    }
    let tail: String = {
        let chars: Vec<char> = trimmed.chars().collect();
        let start = chars.len().saturating_sub(TAIL_CHARS);
        chars[start..].iter().collect::<String>().to_lowercase()
    };
    // The last paragraph only: an invitation earlier in the reply was followed by more work.
    let last_paragraph = tail.rsplit("\n\n").next().unwrap_or(&tail);
    if last_paragraph.lines().last().is_some_and(|l| l.trim_end().ends_with('?')) {
        return true;
    }
    INVITATIONS.iter().any(|p| last_paragraph.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_ending_in_a_question_asks_the_person() {
        assert!(asks_the_person("I found two configs. Which one should I keep?"));
        assert!(asks_the_person("Should I proceed with the migration?**\n\n"));
    }

    #[test]
    fn an_invitation_in_the_last_paragraph_asks_the_person() {
        assert!(asks_the_person("Done with step one.\n\nLet me know if you want the tests too."));
        assert!(asks_the_person("Plan:\n1. a\n2. b\n\nWould you like me to start with a."));
    }

    #[test]
    fn a_question_answered_further_on_does_not() {
        assert!(!asks_the_person("Why did it fail? The path was wrong.\n\nFixed it and reran the tests."));
        assert!(!asks_the_person(
            "Let me know... actually, I will just do it.\n\nAll three todos are in progress now."
        ));
    }

    #[test]
    fn a_plain_report_does_not() {
        assert!(!asks_the_person("Implemented the parser and added tests."));
        assert!(!asks_the_person(""));
    }
}
