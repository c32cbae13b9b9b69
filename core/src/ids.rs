//! Ids that come from an OpenCode server, checked before Shepherd uses them.
//!
//! A server (or anything between it and Shepherd) is not trusted to send well-formed
//! ids: an id becomes a URL path segment, a map key, a log field and part of a file
//! name, so one with `/`, `..`, NUL or ten kilobytes of text must stop at the edge.
//! OpenCode's ids are a kind prefix (`ses_`, `msg_`, `prt_`, `per_`, `que_`) and 26
//! characters of `[0-9A-Za-z]`; Shepherd accepts the prefix followed by 1 to
//! [`MAX_ID_LEN`] characters in all of `[A-Za-z0-9_-]` (tests use short ids such as
//! `ses_A`), and nothing else.
//!
//! What it decides: whether an id is acceptable ([`check`]), and the file-name stem for
//! an id ([`file_stem`]: the id itself when it is a safe token, a hash otherwise). What
//! it must not do: repair an id (a bad one is refused, never rewritten into a good one).

use std::borrow::Cow;
use std::fmt;

/// The longest id accepted, in bytes (OpenCode's are 30).
pub const MAX_ID_LEN: usize = 128;

/// What an id names, and so which prefix it must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Session,
    Message,
    Part,
    Permission,
    Question,
}

impl IdKind {
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Session => "ses_",
            IdKind::Message => "msg_",
            IdKind::Part => "prt_",
            IdKind::Permission => "per_",
            IdKind::Question => "que_",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IdKind::Session => "session",
            IdKind::Message => "message",
            IdKind::Part => "part",
            IdKind::Permission => "permission",
            IdKind::Question => "question",
        }
    }
}

/// Why an id was refused. Shows a bounded, escaped excerpt of the id, never all of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad {} id {}: {reason}", kind.as_str(), excerpt)]
pub struct BadId {
    pub kind: IdKind,
    /// The first characters of the id, escaped (`{:?}`), for the log.
    pub excerpt: String,
    pub reason: &'static str,
}

/// Is `id` an acceptable id of this kind?
pub fn check(kind: IdKind, id: &str) -> Result<(), BadId> {
    let refuse = |reason| Err(BadId { kind, excerpt: excerpt(id), reason });
    if id.len() > MAX_ID_LEN {
        return refuse("longer than 128 bytes");
    }
    let Some(rest) = id.strip_prefix(kind.prefix()) else {
        return refuse(match kind {
            IdKind::Session => "does not start with ses_",
            IdKind::Message => "does not start with msg_",
            IdKind::Part => "does not start with prt_",
            IdKind::Permission => "does not start with per_",
            IdKind::Question => "does not start with que_",
        });
    };
    if rest.is_empty() {
        return refuse("nothing after the prefix");
    }
    if !is_token(rest) {
        return refuse("has characters outside A-Z a-z 0-9 _ -");
    }
    Ok(())
}

/// Only `[A-Za-z0-9_-]`. (A table: every id of every event is checked, on the pump's
/// thread; the chain of comparisons it replaces was measurable there.)
fn is_token(s: &str) -> bool {
    s.bytes().all(|b| TOKEN_BYTES[usize::from(b)])
}

/// `TOKEN_BYTES[b]`: `b` may be in an id after its prefix.
const TOKEN_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        b += 1;
    }
    table
};

/// At most 40 characters of `id`, escaped: safe in a log line whatever `id` holds.
pub fn excerpt(id: &str) -> String {
    const SHOWN: usize = 40;
    let mut cut: String = id.chars().take(SHOWN).collect();
    if cut.len() < id.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// The stem of a file name for `id`: the id itself when it is 1 to [`MAX_ID_LEN`]
/// characters of `[A-Za-z0-9_-]` (it cannot name a folder, a parent or a hidden file),
/// otherwise `h` and the SHA-256 of the id in hex.
pub fn file_stem(id: &str) -> Cow<'_, str> {
    if !id.is_empty() && id.len() <= MAX_ID_LEN && is_token(id) && !id.starts_with('-') {
        return Cow::Borrowed(id);
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Cow::Owned(format!("h{hex}"))
}

/// Which ids of an event are checked, and as what. Kept inline (an event carries at
/// most [`Ids::MAX`]): every event of the stream is checked, so no allocation here.
pub(crate) struct Ids<'a> {
    ids: [(IdKind, &'a str); Ids::MAX],
    len: usize,
}

impl<'a> Ids<'a> {
    /// The most ids one event carries (a tool part: session, part, message, child).
    const MAX: usize = 4;

    pub(crate) fn new() -> Self {
        Self { ids: [(IdKind::Session, ""); Self::MAX], len: 0 }
    }

    pub(crate) fn push(&mut self, kind: IdKind, id: &'a str) {
        // An event type naming more ids is a programming error, caught by the tests.
        self.ids[self.len] = (kind, id);
        self.len += 1;
    }

    pub(crate) fn as_slice(&self) -> &[(IdKind, &'a str)] {
        &self.ids[..self.len]
    }

    pub(crate) fn check(&self) -> Result<(), BadId> {
        self.as_slice().iter().try_for_each(|(kind, id)| check(*kind, id))
    }
}

impl fmt::Debug for Ids<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice().iter().map(|(k, id)| (k.as_str(), excerpt(id)))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opencode_ids_and_short_test_ids_are_accepted() {
        assert_eq!(check(IdKind::Session, "ses_2a8c0b3f1ffeZ1x0kQvV6bQ8rT"), Ok(()));
        assert_eq!(check(IdKind::Message, "msg_U"), Ok(()));
        assert_eq!(check(IdKind::Part, "prt_a-b_c"), Ok(()));
    }

    #[test]
    fn hostile_ids_are_refused_with_a_bounded_excerpt() {
        let long = format!("ses_{}", "a".repeat(10_000));
        for id in ["../../etc/x", "ses_a/b", "..", "ses_..", "ses_%2e%2e", "ses_a\0b", "ses_", "", "msg_A", &long] {
            let e = check(IdKind::Session, id).unwrap_err();
            assert!(e.to_string().len() < 200, "{e}");
        }
    }

    #[test]
    fn file_stems_are_the_id_when_safe_and_a_hash_otherwise() {
        assert_eq!(file_stem("hf_A_1700000000000"), "hf_A_1700000000000");
        for id in ["../../etc/x", "a/b", "..", ".hidden", "-rf", "", "a\0b", &"a".repeat(129)] {
            let stem = file_stem(id);
            assert!(stem.starts_with('h') && stem.len() == 65, "{id:?} → {stem}");
            assert!(stem.bytes().all(|b| b.is_ascii_alphanumeric()));
        }
    }
}
