//! Did the model write a tool call as text instead of calling the tool?
//!
//! Some models, when their tool-calling template breaks, print the call into their reply
//! (`<function=bash><parameter=command>ls`, `<tool_call>{…}`, `[TOOL_CALLS]…`) and stop:
//! nothing runs, and a plain "please continue" tends to produce the same text again.
//! This module finds such text in the recent assistant messages so the continue can
//! tell the model what went wrong.
//!
//! Pure: texts in, an optional [`TextualToolCall`] out. It must keep false positives
//! rare — a reply that *explains* markup (JSX or HTML in a fenced block about a web
//! page, a tag named in inline code) is not a call — so matches inside fences with a
//! web/markup language, fences whose body looks like web markup, and inline code spans
//! are ignored. Fenced JSON counts only with a `"function"` or `"tool_calls"` key.

/// One tool call written as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextualToolCall {
    /// The pattern that matched, as written in [`TAG_PATTERNS`] (or `fenced JSON`).
    pub pattern: &'static str,
    /// A short excerpt of the text around the match (for the log).
    pub excerpt: String,
}

/// One recent assistant message as the scan sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssistantText {
    /// Its text and reasoning parts, in order.
    pub texts: Vec<String>,
    /// It made at least one real tool call (a `tool` part).
    pub called_tools: bool,
}

/// Opening sequences of tool calls written as text, compared case-insensitively. A
/// prefix without its closing `>`/`]` also matches, so truncated, unclosed tags count
/// (`<function=bash` cut off mid-stream).
pub const TAG_PATTERNS: &[&str] = &[
    "<function=",
    "<invoke ",
    "<invoke>",
    "<tool_call",
    "<function_calls",
    "<function name=",
    "[tool_calls]",
    "[functioncalling]",
    "<|tool_call|>",
    "<|tool_call",
    "<tool>",
    "[function]",
    "<use_tools",
    "<function_chain",
    "<execute>",
    "<run_tool",
    "<tool_use",
    "<invoke",
];

/// The name a pattern is reported under (the case the issue and users write it in).
fn display_name(pattern: &'static str) -> &'static str {
    match pattern {
        "[tool_calls]" => "[TOOL_CALLS]/[tool_calls]",
        "[functioncalling]" => "[FunctionCalling]",
        "<tool>" => "<TOOL>",
        "[function]" => "[FUNCTION]",
        other => other,
    }
}

/// Fence languages whose blocks are examples of markup or code, never calls.
const EXAMPLE_LANGS: &[&str] = &[
    "html",
    "htm",
    "jsx",
    "tsx",
    "js",
    "javascript",
    "ts",
    "typescript",
    "vue",
    "svelte",
    "astro",
    "php",
    "erb",
    "handlebars",
    "hbs",
    "markdown",
    "md",
    "css",
    "scss",
    "python",
    "py",
    "rust",
    "rs",
    "go",
    "java",
    "c",
    "cpp",
    "ruby",
    "rb",
    "sh",
    "bash",
    "shell",
    "console",
];

/// Tags and attributes that say a block is web markup (a page, a component).
const WEB_MARKUP_HINTS: &[&str] = &[
    "<div",
    "<span",
    "<html",
    "<body",
    "<head",
    "<template",
    "<script",
    "<button",
    "<form",
    "<ul",
    "<li",
    "<p>",
    "<section",
    "<main",
    "<nav",
    "classname=",
    "class=\"",
    "onclick",
    "import react",
    "export default",
    "</>",
    "<>",
];

/// How much text around a match goes into the excerpt.
const EXCERPT_CHARS: usize = 80;

/// Scans messages newest first and returns the first call written as text. A message
/// older than one that made real tool calls is not looked at: the model has called
/// tools properly since, so an old textual call is not why it stopped now.
pub fn detect(newest_first: &[AssistantText]) -> Option<TextualToolCall> {
    for message in newest_first {
        for text in message.texts.iter().rev() {
            if let Some(found) = detect_in(text) {
                return Some(found);
            }
        }
        if message.called_tools {
            return None;
        }
    }
    None
}

/// Looks for a call written as text in one text.
pub fn detect_in(text: &str) -> Option<TextualToolCall> {
    for segment in segments(text) {
        let found = match segment {
            Segment::Prose(prose) => find_tag(&strip_inline_code(prose)),
            Segment::Fence { lang, body } => scan_fence(lang, body),
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

fn scan_fence(lang: &str, body: &str) -> Option<TextualToolCall> {
    let lang = lang.trim().to_ascii_lowercase();
    if is_json_call(&lang, body) {
        return Some(TextualToolCall { pattern: "fenced JSON", excerpt: excerpt(body, 0) });
    }
    if EXAMPLE_LANGS.contains(&lang.as_str()) {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    if WEB_MARKUP_HINTS.iter().any(|h| lower.contains(h)) {
        return None;
    }
    find_tag(body)
}

/// A fenced JSON object (by language or by shape) with a `"function"` or `"tool_calls"`
/// key — the OpenAI wire format printed instead of sent.
fn is_json_call(lang: &str, body: &str) -> bool {
    let looks_json = lang == "json" || lang == "jsonc" || (lang.is_empty() && body.trim_start().starts_with('{'));
    looks_json && (body.contains("\"function\"") || body.contains("\"tool_calls\""))
}

fn find_tag(text: &str) -> Option<TextualToolCall> {
    let lower = text.to_ascii_lowercase();
    TAG_PATTERNS
        .iter()
        .filter_map(|p| lower.find(p).map(|at| (at, *p)))
        .min_by_key(|(at, _)| *at)
        .map(|(at, p)| TextualToolCall { pattern: display_name(p), excerpt: excerpt(text, at) })
}

fn excerpt(text: &str, at: usize) -> String {
    let start = text[..at].char_indices().rev().nth(EXCERPT_CHARS / 4).map_or(0, |(i, _)| i);
    text[start..].chars().take(EXCERPT_CHARS).collect::<String>().replace('\n', " ")
}

/// Inline code spans (`` `…` ``) replaced by spaces: a tag named in backticks is talk
/// about a tag, not a call.
fn strip_inline_code(prose: &str) -> String {
    let mut out = String::with_capacity(prose.len());
    let mut in_code = false;
    for c in prose.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code && c != '\n' {
            out.push(' ');
        } else {
            if c == '\n' {
                in_code = false; // inline code never spans lines
            }
            out.push(c);
        }
    }
    out
}

enum Segment<'a> {
    Prose(&'a str),
    Fence { lang: &'a str, body: &'a str },
}

/// Splits text at ```` ``` ```` fences. An unclosed fence runs to the end (a reply cut
/// off inside its block).
fn segments(text: &str) -> Vec<Segment<'_>> {
    const FENCE: &str = "```";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(FENCE) {
        out.push(Segment::Prose(&rest[..open]));
        let after = &rest[open + FENCE.len()..];
        let (lang, body_start) = match after.find('\n') {
            Some(nl) => (&after[..nl], nl + 1),
            None => (after, after.len()),
        };
        let body_and_rest = &after[body_start..];
        match body_and_rest.find(FENCE) {
            Some(close) => {
                out.push(Segment::Fence { lang, body: &body_and_rest[..close] });
                rest = &body_and_rest[close + FENCE.len()..];
            }
            None => {
                out.push(Segment::Fence { lang, body: body_and_rest });
                rest = "";
            }
        }
    }
    out.push(Segment::Prose(rest));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> Option<&'static str> {
        detect_in(text).map(|f| f.pattern)
    }

    #[test]
    fn every_listed_pattern_is_found_in_prose() {
        let cases = [
            ("I'll look.\n<function=bash><parameter=command>ls</parameter></function>", "<function="),
            ("<invoke name=\"bash\"><parameter name=\"command\">ls</parameter></invoke>", "<invoke "),
            ("<tool_call>{\"name\": \"read\", \"arguments\": {}}</tool_call>", "<tool_call"),
            ("<function_calls>\n<invoke name=\"x\"></invoke>\n</function_calls>", "<function_calls"),
            ("<function name=\"read\">{\"path\": \"a\"}</function>", "<function name="),
            ("[TOOL_CALLS][{\"name\": \"bash\"}]", "[TOOL_CALLS]/[tool_calls]"),
            ("[tool_calls] bash ls", "[TOOL_CALLS]/[tool_calls]"),
            ("[FunctionCalling] read file", "[FunctionCalling]"),
            ("<|tool_call|>{\"name\":\"bash\"}", "<|tool_call|>"),
            ("<TOOL>bash ls</TOOL>", "<TOOL>"),
            ("[FUNCTION] bash(ls)", "[FUNCTION]"),
            ("<use_tools><bash>ls</bash></use_tools>", "<use_tools"),
            ("<function_chain>read; edit</function_chain>", "<function_chain"),
            ("<execute>ls -la</execute>", "<execute>"),
            ("<run_tool name=\"bash\">ls</run_tool>", "<run_tool"),
        ];
        for (text, want) in cases {
            assert_eq!(pattern(text), Some(want), "{text}");
        }
    }

    #[test]
    fn truncated_unclosed_tags_are_found() {
        assert_eq!(pattern("Let me list the files.\n<function=bash><parameter=comm"), Some("<function="));
        assert_eq!(pattern("Now: <tool_call"), Some("<tool_call"));
        assert_eq!(pattern("<invoke name=\"ba"), Some("<invoke "));
        assert_eq!(pattern("<|tool_call"), Some("<|tool_call"));
    }

    #[test]
    fn fenced_json_with_a_function_or_tool_calls_key_is_a_call() {
        let f = "Calling it:\n```json\n{\"function\": {\"name\": \"bash\", \"arguments\": \"{}\"}}\n```";
        assert_eq!(pattern(f), Some("fenced JSON"));
        let t = "```\n{\"tool_calls\": [{\"id\": \"1\"}]}\n```";
        assert_eq!(pattern(t), Some("fenced JSON"));
        let cut = "```json\n{\"tool_calls\": [{\"id\": ";
        assert_eq!(pattern(cut), Some("fenced JSON"), "unclosed fence");
    }

    #[test]
    fn fenced_json_without_those_keys_is_not_a_call() {
        assert_eq!(pattern("Config:\n```json\n{\"name\": \"app\", \"version\": 2}\n```"), None);
    }

    #[test]
    fn a_tag_in_a_plain_or_xml_fence_is_a_call() {
        assert_eq!(pattern("```xml\n<invoke name=\"bash\">\n```"), Some("<invoke "));
        assert_eq!(pattern("```\n<function=read><parameter=path>a</parameter></function>\n```"), Some("<function="));
    }

    #[test]
    fn jsx_in_a_fenced_block_about_a_web_page_is_not_a_call() {
        let jsx = "Here is the page component:\n```jsx\nexport default function Page() {\n  return (\n    \
                   <div className=\"tools\">\n      <execute>Run</execute>\n      <TOOL>hammer</TOOL>\n    \
                   </div>\n  );\n}\n```\nIt renders the toolbar.";
        assert_eq!(pattern(jsx), None);
        let html = "```html\n<body><function name=\"x\">docs</function></body>\n```";
        assert_eq!(pattern(html), None);
    }

    #[test]
    fn web_markup_in_an_unlabelled_fence_is_not_a_call() {
        let page = "```\n<div class=\"card\">\n  <execute>Go</execute>\n</div>\n```";
        assert_eq!(pattern(page), None);
    }

    #[test]
    fn a_tag_named_in_inline_code_is_not_a_call() {
        assert_eq!(pattern("The parser handles `<tool_call>` and `[TOOL_CALLS]` markers now."), None);
    }

    #[test]
    fn ordinary_replies_are_not_calls() {
        for text in [
            "I fixed the bug in the parser and all tests pass.",
            "The function = f(x) maps inputs; see the invoke() helper.",
            "Comparisons like a <b and c> d are fine.",
            "",
        ] {
            assert_eq!(pattern(text), None, "{text}");
        }
    }

    #[test]
    fn the_scan_stops_at_a_message_that_called_tools_properly() {
        let old = AssistantText { texts: vec!["<function=bash>".into()], called_tools: false };
        let proper = AssistantText { texts: vec!["Running the tests.".into()], called_tools: true };
        let latest = AssistantText { texts: vec!["All done.".into()], called_tools: false };
        assert_eq!(detect(&[latest.clone(), proper, old.clone()]), None);
        let found = detect(&[latest, old]).expect("found in the older message");
        assert_eq!(found.pattern, "<function=");
    }

    #[test]
    fn reasoning_text_counts_like_reply_text() {
        let m = AssistantText {
            texts: vec!["<tool_call>{\"name\": \"read\"".into(), "Let me read it.".into()],
            called_tools: false,
        };
        assert_eq!(detect(&[m]).map(|f| f.pattern), Some("<tool_call"));
    }
}
