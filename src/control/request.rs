//! The body of `POST /v1/sessions/{id}/prompt`, parsed so that a refusal names the
//! field at fault (`include_todo_context: invalid type: string "yes", expected a
//! boolean`), not only a line and column.
//!
//! The schema is [`CustomPromptRequest`] itself: each member of the JSON object is tried
//! alone against it (every field has a default), so the first member that does not fit
//! is the one named, and a field added to the schema is accepted here without a change.

use serde_json::{Map, Value};
use shepherd_actors::control::CustomPromptRequest;

/// A body that cannot be a prompt request, and the field to blame (`body` when it is
/// the body as a whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct BadBody {
    pub field: String,
    pub reason: String,
}

fn bad(field: &str, reason: impl ToString) -> BadBody {
    BadBody { field: field.to_string(), reason: reason.to_string() }
}

/// Parses and checks a prompt request: a JSON object of known fields with the right
/// types, and a text to send (`message` or `custom_prompt`, not blank).
pub fn parse_prompt_request(body: &[u8]) -> Result<CustomPromptRequest, BadBody> {
    let value: Value = serde_json::from_slice(body).map_err(|e| bad("body", format!("not valid JSON ({e})")))?;
    let Value::Object(members) = value else {
        return Err(bad("body", "must be a JSON object"));
    };
    for (name, member) in &members {
        let alone = Value::Object(Map::from_iter([(name.clone(), member.clone())]));
        if let Err(e) = serde_json::from_value::<CustomPromptRequest>(alone) {
            let reason = e.to_string();
            return Err(match reason.strip_prefix("unknown field ") {
                Some(rest) => bad(name, format!("unknown field; {}", rest.split_once(", ").map_or(rest, |(_, r)| r))),
                None => bad(name, reason),
            });
        }
    }
    let request: CustomPromptRequest = serde_json::from_value(Value::Object(members)).map_err(|e| bad("body", e))?;
    let blank = |t: &Option<String>| t.as_deref().unwrap_or("").trim().is_empty();
    if blank(&request.message) && blank(&request.custom_prompt) {
        return Err(bad("message", "required (or custom_prompt), and not blank"));
    }
    Ok(request)
}

/// The longest pause a request may ask for (a longer one is a mistake; without `for`
/// a pause lasts until resumed).
const LONGEST_PAUSE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// `POST /v1/…/pause|resume` body: `{"for": "2h", "by": "cli"}`, both optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    by: Option<String>,
}

/// A pause or resume request, checked: how long (`None`: until resumed) and who asked
/// (journaled, so bounded and plain: letters, digits, space and `._@-`, ≤ 40
/// characters; `control API` when not said).
pub fn parse_pause_request(body: &[u8]) -> Result<(Option<std::time::Duration>, String), BadBody> {
    let body: PauseBody = if body.iter().all(u8::is_ascii_whitespace) {
        PauseBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| bad("body", e))?
    };
    let span = match body.for_.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(text) => {
            let d = humantime::parse_duration(text).map_err(|e| bad("for", format!("{text:?}: {e}")))?;
            if d.is_zero() || d > LONGEST_PAUSE {
                return Err(bad("for", "must be more than 0 and at most 30 days"));
            }
            Some(d)
        }
    };
    let by = body.by.unwrap_or_else(|| "control API".into());
    let plain = |c: char| c.is_ascii_alphanumeric() || " ._@-".contains(c);
    if by.trim().is_empty() || by.chars().count() > 40 || !by.chars().all(plain) {
        return Err(bad("by", "1 to 40 letters, digits, spaces or ._@-"));
    }
    Ok((span, by))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_request_is_checked_and_bounded() {
        assert_eq!(parse_pause_request(b"").unwrap(), (None, "control API".to_string()));
        let (span, by) = parse_pause_request(br#"{"for":"2h","by":"cli"}"#).unwrap();
        assert_eq!((span, by.as_str()), (Some(std::time::Duration::from_secs(7200)), "cli"));
        assert_eq!(parse_pause_request(br#"{"for":"soon"}"#).unwrap_err().field, "for");
        assert_eq!(parse_pause_request(br#"{"for":"90d"}"#).unwrap_err().field, "for");
        assert_eq!(parse_pause_request(br#"{"by":"x\u001b[31m"}"#).unwrap_err().field, "by");
        assert_eq!(parse_pause_request(br#"{"until":"2h"}"#).unwrap_err().field, "body");
    }

    fn field_of(body: &str) -> String {
        parse_prompt_request(body.as_bytes()).unwrap_err().field
    }

    #[test]
    fn a_full_request_is_parsed() {
        let r =
            parse_prompt_request(br#"{"message":"go on","include_todo_context":true,"include_context_summary":false}"#)
                .unwrap();
        assert_eq!(r.message.as_deref(), Some("go on"));
        assert!(r.include_todo_context && !r.include_context_summary && r.custom_prompt.is_none());
        let r = parse_prompt_request(br#"{"custom_prompt":"{pending} left"}"#).unwrap();
        assert_eq!(r.custom_prompt.as_deref(), Some("{pending} left"));
    }

    #[test]
    fn an_unknown_field_is_named_with_the_known_ones() {
        let e = parse_prompt_request(br#"{"message":"x","with_todos":true}"#).unwrap_err();
        assert_eq!(e.field, "with_todos");
        assert!(e.reason.starts_with("unknown field; expected one of"), "{e}");
        assert!(e.reason.contains("include_todo_context"), "{e}");
    }

    #[test]
    fn a_wrong_type_is_named() {
        let e = parse_prompt_request(br#"{"message":"x","include_todo_context":"yes"}"#).unwrap_err();
        assert_eq!(e.field, "include_todo_context");
        assert!(e.reason.contains("expected a boolean"), "{e}");
        assert_eq!(field_of(r#"{"message":5}"#), "message");
    }

    #[test]
    fn a_text_is_required() {
        assert_eq!(
            parse_prompt_request(b"{}").unwrap_err().to_string(),
            "message: required (or custom_prompt), and not blank"
        );
        assert_eq!(field_of(r#"{"message":"  ","include_todo_context":true}"#), "message");
        assert_eq!(field_of(r#"{"message":null}"#), "message");
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_blamed_as_a_whole() {
        assert_eq!(field_of(""), "body");
        assert_eq!(field_of("{\"message\":"), "body");
        assert_eq!(field_of(r#"["message"]"#), "body");
    }
}
