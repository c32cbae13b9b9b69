//! Parsing the model's answer. It must contain `@ACTION:CONFIDENCE` — ACTION one of
//! wait / abort / continue / compact / handoff (any case), CONFIDENCE a number from 0 to
//! 1 — anywhere in the text (models like to explain first). Anything else is a parse
//! failure, and the heuristic decides instead.

use crate::advisor::{Advice, AdviceAction};

/// Why an answer was not advice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("no @ACTION:CONFIDENCE in the answer")]
    Missing,
    #[error("unknown action {0:?}")]
    UnknownAction(String),
    #[error("confidence {0:?} is not a number from 0 to 1")]
    BadConfidence(String),
}

/// The first `@ACTION:CONFIDENCE` of `text`.
pub fn parse(text: &str) -> Result<Advice, ParseError> {
    let mut first_error = None;
    for (at, _) in text.match_indices('@') {
        match parse_at(&text[at + 1..]) {
            Ok(advice) => return Ok(advice),
            Err(Some(e)) => {
                first_error.get_or_insert(e);
            }
            Err(None) => {}
        }
    }
    Err(first_error.unwrap_or(ParseError::Missing))
}

/// `Err(None)`: not an attempt at the form at all (an e-mail address, a mention).
fn parse_at(rest: &str) -> Result<Advice, Option<ParseError>> {
    let word: String = rest.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    let after = &rest[word.len()..];
    let Some(number) = after.strip_prefix(':') else { return Err(None) };
    if word.is_empty() {
        return Err(None);
    }
    let action = AdviceAction::ALL
        .into_iter()
        .find(|a| a.as_str().eq_ignore_ascii_case(&word))
        .ok_or_else(|| Some(ParseError::UnknownAction(word.clone())))?;
    let digits: String = number.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let digits = digits.trim_end_matches('.'); // a sentence's full stop
    let confidence: f64 =
        digits.parse().map_err(|_| Some(ParseError::BadConfidence(number.chars().take(8).collect())))?;
    if !(0.0..=1.0).contains(&confidence) {
        return Err(Some(ParseError::BadConfidence(digits.to_string())));
    }
    Ok(Advice { action, confidence })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_found_anywhere_in_the_answer() {
        assert_eq!(parse("@wait:0.9").unwrap(), Advice { action: AdviceAction::Wait, confidence: 0.9 });
        let a = parse("The tool is still running a build.\n@WAIT:0.80.").unwrap();
        assert_eq!((a.action, a.confidence), (AdviceAction::Wait, 0.8));
        assert_eq!(parse("mail me@x.org, then @handoff:1").unwrap().action, AdviceAction::Handoff);
        assert_eq!(parse("@compact:0").unwrap().confidence, 0.0);
    }

    #[test]
    fn anything_else_is_a_parse_failure() {
        assert_eq!(parse("I think you should wait."), Err(ParseError::Missing));
        assert_eq!(parse(""), Err(ParseError::Missing));
        assert_eq!(parse("@sleep:0.9"), Err(ParseError::UnknownAction("sleep".into())));
        assert!(matches!(parse("@wait:1.5"), Err(ParseError::BadConfidence(_))));
        assert!(matches!(parse("@wait:high"), Err(ParseError::BadConfidence(_))));
        assert!(matches!(parse("@abort"), Err(ParseError::Missing)));
    }
}
