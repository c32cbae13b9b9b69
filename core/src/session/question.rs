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
    // The last `TAIL_CHARS` characters, found from the end: this runs at every update of
    // a reply's text part, and a reply may be many kilobytes long.
    let start = trimmed.char_indices().rev().nth(TAIL_CHARS - 1).map_or(0, |(i, _)| i);
    let tail = trimmed[start..].to_lowercase();
    // The last paragraph only: an invitation earlier in the reply was followed by more work.
    let last_paragraph = tail.rsplit("\n\n").next().unwrap_or(&tail);
    if last_paragraph.lines().last().is_some_and(|l| l.trim_end().ends_with('?')) {
        return true;
    }
    invitation().is_match(last_paragraph)
}

/// Any of [`INVITATIONS`], found in one pass over the text rather than one search per
/// phrase.
fn invitation() -> &'static regex::Regex {
    static INVITATION: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        let any: Vec<String> = INVITATIONS.iter().map(|p| regex::escape(p)).collect();
        regex::Regex::new(&any.join("|")).expect("escaped literals form a pattern")
    });
    &INVITATION
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

    /// The reading as it was first written (every character of the reply collected,
    /// then the tail taken): the tail found from the end reads every text the same.
    fn asks_the_person_as_first_written(text: &str) -> bool {
        let trimmed = text.trim_end_matches(|c: char| c.is_whitespace() || "*_`\"')]>".contains(c));
        if trimmed.ends_with('?') {
            return true;
        }
        let chars: Vec<char> = trimmed.chars().collect();
        let tail = chars[chars.len().saturating_sub(TAIL_CHARS)..].iter().collect::<String>().to_lowercase();
        let last_paragraph = tail.rsplit("\n\n").next().unwrap_or(&tail);
        if last_paragraph.lines().last().is_some_and(|l| l.trim_end().ends_with('?')) {
            return true;
        }
        INVITATIONS.iter().any(|p| last_paragraph.contains(p))
    }

    proptest::proptest! {
        #[test]
        fn the_tail_is_read_as_when_every_character_was_collected(
            head in "(?s).{0,600}",
            close in proptest::sample::select(vec!["", "Let me know.", "SHALL I go on", "Done?", "é?\n\nok", "İ Would You Like"]),
            pad in r#"[ \n*_`"')\]>]{0,4}"#,
        ) {
            let text = format!("{head}{close}{pad}");
            proptest::prop_assert_eq!(asks_the_person(&text), asks_the_person_as_first_written(&text), "{:?}", text);
        }
    }

    #[test]
    fn an_invitation_just_inside_the_tail_counts_and_one_just_outside_does_not() {
        let inside = format!("Let me know {}", "x".repeat(TAIL_CHARS - "Let me know ".len()));
        assert!(asks_the_person(&inside));
        let outside = format!("Let me know{}", "é".repeat(TAIL_CHARS - "et me know".len()));
        assert!(!asks_the_person(&outside), "the invitation's first letter is the 401st character from the end");
    }

    #[test]
    fn a_plain_report_does_not() {
        assert!(!asks_the_person("Implemented the parser and added tests."));
        assert!(!asks_the_person(""));
    }
}
