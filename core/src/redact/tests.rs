use std::borrow::Cow;

use proptest::prelude::*;

use super::*;

/// The corpus lines: comments and blank lines dropped, `\n` unescaped.
fn lines(corpus: &str) -> impl Iterator<Item = String> + '_ {
    corpus.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(|l| l.replace(r"\n", "\n"))
}

/// `«secret»` marked text → (the text as written, the text as redacted, the secrets).
fn unmark(line: &str) -> (String, String, Vec<String>) {
    let (mut plain, mut redacted, mut secrets) = (String::new(), String::new(), Vec::new());
    let mut rest = line;
    while let Some(open) = rest.find('«') {
        let close = rest[open..].find('»').map(|c| open + c).expect("a « without »");
        plain.push_str(&rest[..open]);
        redacted.push_str(&rest[..open]);
        let secret = &rest[open + '«'.len_utf8()..close];
        plain.push_str(secret);
        redacted.push_str(MARK);
        secrets.push(secret.to_string());
        rest = &rest[close + '»'.len_utf8()..];
    }
    plain.push_str(rest);
    redacted.push_str(rest);
    (plain, redacted, secrets)
}

#[test]
fn every_secret_in_the_corpus_is_redacted_and_nothing_else() {
    let r = Redactor::default();
    let mut failures = Vec::new();
    for line in lines(include_str!("corpus/secrets.txt")) {
        let (plain, expected, secrets) = unmark(&line);
        assert!(!secrets.is_empty(), "a corpus line without a marked secret: {line}");
        let got = r.redact(&plain);
        if got != expected {
            failures.push(format!("  in:   {plain:?}\n  want: {expected:?}\n  got:  {got:?}"));
        }
        for s in &secrets {
            assert!(!got.contains(s.as_str()) || expected.contains(s.as_str()), "{s} leaked: {got}");
        }
    }
    assert!(failures.is_empty(), "{} corpus line(s) redacted wrongly:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn look_alikes_survive_unchanged() {
    let r = Redactor::default();
    let changed: Vec<String> = lines(include_str!("corpus/lookalikes.txt"))
        .filter_map(|l| match r.redact(&l) {
            Cow::Borrowed(_) => None,
            Cow::Owned(got) if got == l => None,
            Cow::Owned(got) => Some(format!("  {l:?}\n→ {got:?}")),
        })
        .collect();
    assert!(changed.is_empty(), "look-alikes were changed:\n{}", changed.join("\n"));
}

#[test]
fn a_text_without_secrets_comes_back_borrowed() {
    let text = "Port the parser to Rust; commit 9fceb02d0ae598e95dc970b74767f19372d61af8.";
    assert!(matches!(Redactor::default().redact(text), Cow::Borrowed(t) if t == text));
}

#[test]
fn configured_patterns_add_to_the_built_in_shapes() {
    let r = Redactor::new(&[r"ACME-\d{6}".into(), r"pin (?P<secret>\d{4})".into()], false).unwrap();
    assert_eq!(
        r.redact("ticket ACME-123456, pin 1234, DATABASE_PASSWORD=hunter2"),
        "ticket [REDACTED], pin [REDACTED], DATABASE_PASSWORD=[REDACTED]"
    );
}

#[test]
fn replace_defaults_keeps_only_the_configured_patterns() {
    let r = Redactor::new(&[r"ACME-\d{6}".into()], true).unwrap();
    assert_eq!(r.redact("ACME-123456 DATABASE_PASSWORD=hunter2"), "[REDACTED] DATABASE_PASSWORD=hunter2");
    let off = Redactor::new(&[], true).unwrap();
    assert!(matches!(off.redact("password=hunter2"), Cow::Borrowed(_)), "no patterns: nothing is redacted");
}

#[test]
fn an_invalid_configured_pattern_names_its_index() {
    let e = Redactor::new(&["ok".into(), "(unclosed".into()], false).unwrap_err();
    assert_eq!(e.index, 1, "{e}");
}

#[test]
fn a_megabyte_of_mixed_text_is_redacted_in_one_pass() {
    // Linear-ish: one set pass, then only the matching rules. Printed, not asserted
    // (`cargo test -p shepherd-actors --lib redact -- --nocapture` shows the time).
    let chunk = "fn main() { let x = 1; } // naïve café — ünïcödé text, commit 9fceb02d0ae598e9\n\
                 {\"password\": \"hunter2-xyz\"} postgres://u:pw-123456@db/app ghp_R7bXc2VqL9mT4kWn8sZp1YdH6fJ3aQ0eUiOx\n";
    let text = chunk.repeat(1_048_576 / chunk.len() + 1);
    let started = std::time::Instant::now();
    let out = Redactor::default().redact(&text);
    eprintln!("redacted {} bytes in {:?}", text.len(), started.elapsed());
    assert!(!out.contains("hunter2-xyz") && !out.contains("pw-123456") && !out.contains("R7bXc2VqL9mT"));
    assert_eq!(out.matches(MARK).count(), 3 * (1_048_576 / chunk.len() + 1));
}

/// Text made of the pieces secrets and their look-alikes are made of.
fn texty() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("password".to_string()),
        Just("DATABASE_PASSWORD".to_string()),
        Just("token".to_string()),
        Just("Authorization: Bearer ".to_string()),
        Just("://".to_string()),
        Just("@".to_string()),
        Just(":".to_string()),
        Just("=".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("\\".to_string()),
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just("ghp_".to_string()),
        Just("sk-".to_string()),
        Just("eyJ".to_string()),
        Just(".".to_string()),
        Just("(".to_string()),
        Just("$".to_string()),
        Just(MARK.to_string()),
        Just("-----BEGIN RSA PRIVATE KEY-----".to_string()),
        Just("-----END RSA PRIVATE KEY-----".to_string()),
        "[A-Za-z0-9_-]{1,24}",
        "[ -~]{0,6}",
    ];
    proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

proptest! {
    #[test]
    fn redacting_twice_changes_nothing_more(text in texty()) {
        let r = Redactor::default();
        let once = r.redact(&text).into_owned();
        let twice = r.redact(&once).into_owned();
        prop_assert_eq!(&twice, &once, "from {:?}", text);
    }

    #[test]
    fn a_text_nothing_matches_is_returned_as_it_is(text in "[ -~\n]{0,200}") {
        let r = Redactor::default();
        let out = r.redact(&text);
        if !r.0.any.is_match(&text) {
            prop_assert!(matches!(out, Cow::Borrowed(_)));
        }
        if out.matches(MARK).count() == text.matches(MARK).count() {
            prop_assert_eq!(out.len(), text.len(), "nothing redacted, nothing lengthened");
        }
    }
}
