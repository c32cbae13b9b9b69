//! Who may use the control API: the bearer-token check, pure.
//!
//! A request that acts needs `Authorization: Bearer <token>`; a read (GET/HEAD) may go
//! without one when `control.allow_unauthenticated_reads` is on. The comparison takes
//! the same time wherever the first differing byte is (the token's length is not a
//! secret: generated tokens are always 32 hex digits). Errors never carry the token.

use super::token::ControlToken;

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Look (GET, HEAD).
    Read,
    /// Change something (everything else).
    Act,
}

impl Access {
    pub fn of_method(method: &str) -> Self {
        match method {
            "GET" | "HEAD" => Self::Read,
            _ => Self::Act,
        }
    }
}

/// Why a request is refused (answered with 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("missing bearer token: send `Authorization: Bearer <token>`")]
    MissingToken,
    #[error("the Authorization header is not `Bearer <token>`")]
    NotBearer,
    #[error("wrong bearer token")]
    WrongToken,
}

/// The access policy of one running server.
#[derive(Debug, Clone)]
pub struct Gate {
    token: ControlToken,
    allow_unauthenticated_reads: bool,
}

impl Gate {
    pub fn new(token: ControlToken, allow_unauthenticated_reads: bool) -> Self {
        Self { token, allow_unauthenticated_reads }
    }

    /// Decides on a request from its access kind and its raw `Authorization` header.
    pub fn check(&self, access: Access, authorization: Option<&[u8]>) -> Result<(), Denied> {
        if access == Access::Read && self.allow_unauthenticated_reads {
            return Ok(());
        }
        let header = authorization.ok_or(Denied::MissingToken)?;
        let presented = bearer(header).ok_or(Denied::NotBearer)?;
        if constant_time_eq(presented, self.token.expose().as_bytes()) {
            Ok(())
        } else {
            Err(Denied::WrongToken)
        }
    }
}

/// The credentials of a `Bearer` header (scheme case-insensitive, RFC 6750).
fn bearer(header: &[u8]) -> Option<&[u8]> {
    let header = header.trim_ascii();
    let (scheme, rest) = header.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let credentials = rest.trim_ascii();
    (!credentials.is_empty()).then_some(credentials)
}

/// Equal bytes, compared without an early exit.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(allow_reads: bool) -> Gate {
        Gate::new(ControlToken::new("tok-123").unwrap(), allow_reads)
    }

    #[test]
    fn the_right_bearer_token_is_accepted_for_reads_and_acts() {
        let g = gate(false);
        assert_eq!(g.check(Access::Act, Some(b"Bearer tok-123")), Ok(()));
        assert_eq!(g.check(Access::Read, Some(b"bearer  tok-123 ")), Ok(()));
    }

    #[test]
    fn a_missing_malformed_or_wrong_token_is_refused() {
        let g = gate(false);
        assert_eq!(g.check(Access::Act, None), Err(Denied::MissingToken));
        assert_eq!(g.check(Access::Read, None), Err(Denied::MissingToken));
        assert_eq!(g.check(Access::Act, Some(b"tok-123")), Err(Denied::NotBearer));
        assert_eq!(g.check(Access::Act, Some(b"Basic tok-123")), Err(Denied::NotBearer));
        assert_eq!(g.check(Access::Act, Some(b"Bearer")), Err(Denied::NotBearer));
        assert_eq!(g.check(Access::Act, Some(b"Bearertok-123")), Err(Denied::NotBearer));
        assert_eq!(g.check(Access::Act, Some(b"Bearer tok-124")), Err(Denied::WrongToken));
        assert_eq!(g.check(Access::Act, Some(b"Bearer tok-1234")), Err(Denied::WrongToken));
        assert_eq!(g.check(Access::Act, Some(b"Bearer tok")), Err(Denied::WrongToken));
    }

    #[test]
    fn unauthenticated_reads_when_allowed_open_reads_only() {
        let g = gate(true);
        assert_eq!(g.check(Access::of_method("GET"), None), Ok(()));
        assert_eq!(g.check(Access::of_method("POST"), None), Err(Denied::MissingToken));
        assert_eq!(g.check(Access::of_method("POST"), Some(b"Bearer nope")), Err(Denied::WrongToken));
    }

    #[test]
    fn refusals_do_not_carry_the_token() {
        for denied in [Denied::MissingToken, Denied::NotBearer, Denied::WrongToken] {
            assert!(!denied.to_string().contains("tok-123"));
        }
        assert!(!format!("{:?}", gate(false)).contains("tok-123"));
    }
}
