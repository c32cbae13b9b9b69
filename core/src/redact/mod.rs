//! The one redactor for every text that leaves Shepherd's hands: continuations and the
//! hand-off files, the advisor's prompt, journal reasons (and so the ledger, the status
//! file and API, toasts), session titles and todos in status output, echoed prompts,
//! and every log line.
//!
//! Pure: patterns in, text out. It decides what a secret looks like
//! ([`patterns`] holds the built-in shapes; `handoff.redact_patterns` adds to them,
//! `handoff.redact_patterns_replace` replaces them) and replaces it by [`MARK`],
//! keeping the key name or the token's kind so the text stays useful
//! (`DATABASE_PASSWORD=[REDACTED]`). It must not decide *where* redaction applies:
//! that is the callers' choke points.
//!
//! Cost: one pass of a [`RegexSet`] over the text; a text that matches nothing is
//! returned borrowed, without allocating. Only the patterns that matched run again, to
//! replace (and, when something was replaced, the set once more to be sure nothing new
//! appeared).

mod patterns;

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use regex::{Captures, Regex, RegexSet};

/// What a secret is replaced by.
pub const MARK: &str = "[REDACTED]";

/// Passes after the first, at most (each only when the one before changed the text).
const MAX_PASSES: usize = 3;

/// A configured pattern that is not a regular expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pattern {index}: not a regular expression: {reason}")]
pub struct PatternError {
    /// The pattern's index among the configured ones.
    pub index: usize,
    pub reason: String,
}

/// Compiled once, cheap to clone (shared), safe to use from any thread.
#[derive(Clone)]
pub struct Redactor(Arc<Rules>);

struct Rules {
    /// Which rules match at all: one pass over the text.
    any: RegexSet,
    rules: Vec<Rule>,
}

struct Rule {
    re: Regex,
    /// Values that this rule finds but that are not secrets (code, placeholders).
    spare: Option<fn(&str) -> bool>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor").field("patterns", &self.0.rules.len()).finish()
    }
}

impl Default for Redactor {
    /// The built-in shapes only.
    fn default() -> Self {
        static DEFAULTS: OnceLock<Redactor> = OnceLock::new();
        DEFAULTS.get_or_init(|| Redactor::new(&[], false).expect("the built-in patterns compile")).clone()
    }
}

impl Redactor {
    /// The built-in shapes followed by `extra`, or `extra` alone when `replace_defaults`.
    pub fn new(extra: &[String], replace_defaults: bool) -> Result<Self, PatternError> {
        let mut rules = Vec::new();
        let mut sources = Vec::new();
        if !replace_defaults {
            for (name, p) in patterns::defaults() {
                let re = Regex::new(&p).unwrap_or_else(|e| panic!("built-in pattern {name:?}: {e}"));
                let spare = name.starts_with("secret key").then_some(patterns::is_not_a_secret as fn(&str) -> bool);
                rules.push(Rule { re, spare });
                sources.push(p);
            }
        }
        for (index, p) in extra.iter().enumerate() {
            let re = Regex::new(p).map_err(|e| PatternError { index, reason: e.to_string() })?;
            rules.push(Rule { re, spare: None });
            sources.push(p.clone());
        }
        let any = RegexSet::new(&sources).map_err(|e| PatternError { index: 0, reason: e.to_string() })?;
        Ok(Redactor(Arc::new(Rules { any, rules })))
    }

    /// `text` with every secret replaced by [`MARK`]; borrowed when nothing matched.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let Cow::Owned(mut out) = self.pass(text) else { return Cow::Borrowed(text) };
        // A replacement can complete a shape for another pattern (rare, and only in
        // contrived text): again until nothing changes, so redacting is idempotent.
        for _ in 0..MAX_PASSES {
            match self.pass(&out) {
                Cow::Owned(next) if next != out => out = next,
                _ => break,
            }
        }
        Cow::Owned(out)
    }

    /// Every matching pattern once, in order.
    fn pass<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let hits = self.0.any.matches(text);
        let mut out = Cow::Borrowed(text);
        for i in hits.iter() {
            let rule = &self.0.rules[i];
            let replaced = rule.re.replace_all(&out, |c: &Captures<'_>| rule.replace(c));
            if let Cow::Owned(s) = replaced {
                out = Cow::Owned(s);
            }
        }
        out
    }

    /// [`Redactor::redact`] into an owned string, reusing it when nothing matched.
    pub fn redact_owned(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(s) => s,
        }
    }

    /// [`Redactor::redact_owned`] in place (a `String`, or a `Box<str>` kept to size).
    pub fn redact_in_place<T: AsRef<str> + From<String>>(&self, text: &mut T) {
        if let Cow::Owned(s) = self.redact(text.as_ref()) {
            *text = T::from(s);
        }
    }
}

impl Rule {
    /// The match with its `secret` group (or all of it) replaced — unless that is
    /// already redacted, or a value this rule spares.
    fn replace(&self, c: &Captures<'_>) -> String {
        let whole = c.get(0).expect("group 0 is the match");
        let Some(secret) = c.name("secret") else { return MARK.to_string() };
        // What an earlier pattern (or an earlier pass) left: `[REDACTED]`, or cut short
        // by a pattern's last character (`[REDACTED`).
        let done = MARK.starts_with(secret.as_str()) && secret.len() + 1 >= MARK.len();
        if done || self.spare.is_some_and(|spare| spare(secret.as_str())) {
            return whole.as_str().to_string();
        }
        let (from, to) = (secret.start() - whole.start(), secret.end() - whole.start());
        let w = whole.as_str();
        format!("{}{MARK}{}", &w[..from], &w[to..])
    }
}

#[cfg(test)]
mod tests;
