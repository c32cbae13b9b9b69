//! What Shepherd keeps of what git printed: a bounded number of `git status --porcelain`
//! entries, each bounded in length and safe to put in Markdown (printable ASCII, no
//! backtick to close the code span it is shown in).
//!
//! Pure: it reads no repository and runs nothing. The bounds are the adapter's, like its
//! timeout: a repository with a million untracked files costs at most [`MAX_STATUS_BYTES`]
//! of reading and [`MAX_DIRTY_ENTRIES`] entries kept, whatever its size.

/// At most this much of `git status`' output is read; git is killed past it.
pub(super) const MAX_STATUS_BYTES: usize = 256 * 1024;
/// At most this many uncommitted entries are kept (the rest are only counted).
pub(super) const MAX_DIRTY_ENTRIES: usize = 200;
/// An entry (or branch name) longer than this, once escaped, is shortened with `…`.
pub(super) const MAX_ENTRY_CHARS: usize = 300;

/// The uncommitted entries kept of one `git status --porcelain`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Dirty {
    pub kept: Vec<String>,
    /// Entries read but not kept (past [`MAX_DIRTY_ENTRIES`]).
    pub omitted: usize,
    /// The output was cut (past [`MAX_STATUS_BYTES`]): there are more than counted.
    pub truncated: bool,
}

/// The entries of `output` (porcelain v1 lines); `cut` says git was stopped mid-output,
/// so a last line without its newline is a fragment and is dropped.
pub(super) fn dirty(output: &[u8], cut: bool) -> Dirty {
    let mut lines: Vec<&[u8]> = output.split(|b| *b == b'\n').collect();
    // The piece after the last newline: empty when complete, a fragment when cut.
    if cut || lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    let mut out = Dirty { truncated: cut, ..Dirty::default() };
    for line in lines.into_iter().filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
        if out.kept.len() < MAX_DIRTY_ENTRIES {
            out.kept.push(markdown_safe(&String::from_utf8_lossy(line)));
        } else {
            out.omitted += 1;
        }
    }
    out
}

/// `text` as printable ASCII without backticks: every other character is escaped
/// (`\x1b`, `\x60`, `\u{202e}`), and the result is at most [`MAX_ENTRY_CHARS`] long
/// (`…` marks a shortened one). Git quotes unusual paths itself (`core.quotePath`); this
/// holds whatever git printed.
pub(super) fn markdown_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_ENTRY_CHARS));
    for c in text.chars() {
        let piece = match c {
            ' ' => " ".to_string(),
            '`' => "\\x60".to_string(),
            c if c.is_ascii_graphic() => c.to_string(),
            c if c.is_ascii() => format!("\\x{:02x}", c as u32),
            c => format!("\\u{{{:x}}}", c as u32),
        };
        if out.len() + piece.len() > MAX_ENTRY_CHARS {
            // ASCII so far: bytes are characters.
            out.push('…');
            return out;
        }
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_kept_in_order_and_blank_lines_are_not_entries() {
        let d = dirty(b" M src/a.rs\n?? new.rs\n\n", false);
        assert_eq!(d, Dirty { kept: vec![" M src/a.rs".into(), "?? new.rs".into()], omitted: 0, truncated: false });
    }

    #[test]
    fn past_the_entry_bound_entries_are_counted_not_kept() {
        let out: String = (0..MAX_DIRTY_ENTRIES + 7).map(|i| format!("?? f{i}\n")).collect();
        let d = dirty(out.as_bytes(), false);
        assert_eq!(d.kept.len(), MAX_DIRTY_ENTRIES);
        assert_eq!(d.kept.last().map(String::as_str), Some(format!("?? f{}", MAX_DIRTY_ENTRIES - 1).as_str()));
        assert_eq!((d.omitted, d.truncated), (7, false));
    }

    #[test]
    fn cut_output_drops_its_fragment_and_says_there_is_more() {
        let d = dirty(b"?? a\n?? b\n?? unfinished-na", true);
        assert_eq!(d.kept, ["?? a", "?? b"]);
        assert!(d.truncated);
    }

    #[test]
    fn control_characters_backticks_and_non_ascii_are_escaped() {
        assert_eq!(markdown_safe("?? a\tb`c\u{1b}[31m\u{202e}d\r"), "?? a\\x09b\\x60c\\x1b[31m\\u{202e}d\\x0d");
        assert_eq!(markdown_safe(r#"?? "caf\303\251.rs""#), r#"?? "caf\303\251.rs""#, "git's quoting survives");
    }

    #[test]
    fn a_long_entry_is_shortened() {
        let long = format!("?? {}", "a".repeat(10 * MAX_ENTRY_CHARS));
        let safe = markdown_safe(&long);
        assert!(safe.ends_with('…') && safe.chars().count() <= MAX_ENTRY_CHARS + 1, "{safe}");
        let escapes = "\u{7}".repeat(MAX_ENTRY_CHARS);
        assert!(markdown_safe(&escapes).chars().count() <= MAX_ENTRY_CHARS + 1);
    }
}
