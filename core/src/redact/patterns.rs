//! The built-in secret shapes: what [`super::Redactor`] removes unless
//! `handoff.redact_patterns_replace` is set.
//!
//! A pattern with a group named `secret` has only that group replaced, so the key name,
//! the scheme or the token's kind stays readable (`DATABASE_PASSWORD=[REDACTED]`,
//! `postgres://user:[REDACTED]@host`, `ghp_[REDACTED]`); a pattern without one has its
//! whole match replaced. `\b` is written for readability and compiled as the ASCII word
//! boundary (`(?-u:\b)`), which keeps the regex engine on its fast path on any text.

/// A key whose value is a secret: env-style (`DATABASE_PASSWORD`), JSON and YAML
/// (`"password"`, `clientSecret`), INI/TOML (`aws_secret_access_key`). Only names that
/// *end* in a secret word, so `max_tokens` and `token_limit` are not keys of secrets.
const SECRET_KEY: &str = r"(?i)\b[A-Za-z0-9_.-]*(?:password|passwd|passphrase|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|auth[_-]?key|credentials?)";

/// `(name, pattern)`, applied in this order.
pub(super) fn defaults() -> Vec<(&'static str, String)> {
    let keyed = |tail: &str| format!(r#"{SECRET_KEY}\\?["']?\s*[:=]\s*{tail}"#);
    vec![
        // PEM and PGP private keys: the armour lines stay, the body goes (to the end of the
        // text when the END line was cut off).
        (
            "private key block",
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?P<secret>[\s\S]*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\z)"
                .into(),
        ),
        // `scheme://user:password@host`: the password.
        ("URL credentials", r#"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s:/?#@"'<>]+:(?P<secret>[^\s/?#@"'<>]+)@"#.into()),
        // `Authorization: Basic …`, `"authorization": "Bearer …"`, `Proxy-Authorization`.
        (
            "authorization header",
            r#"(?i)\b(?:proxy-)?authorization\\?["']?\s*[:=]\s*\\?["']?(?:(?:basic|bearer|token|digest|negotiate|apikey)\s+)?(?P<secret>[^\s"'\\,;]{6,})"#
                .into(),
        ),
        ("bearer token", r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)".into()),
        // Quoted values first (they may hold spaces), then bare ones.
        ("secret key, double-quoted value", keyed(r#"\\?"(?P<secret>[^"\\\r\n]+)\\?""#)),
        ("secret key, single-quoted value", keyed(r"'(?P<secret>[^'\r\n]+)'")),
        // A closing bracket that ends a bare value is the text's, not the secret's.
        ("secret key, bare value", keyed(r#"(?P<secret>[^\s"'\\,;]{2,}[^\s"'\\,;)\]}>])"#)),
        // Well-known token shapes (the kind prefix stays).
        ("GitHub token", r"\b(?:ghp|gho|ghu|ghs|ghr)_(?P<secret>[A-Za-z0-9]{20,})".into()),
        ("GitHub fine-grained token", r"\bgithub_pat_(?P<secret>[A-Za-z0-9_]{22,})".into()),
        ("GitLab token", r"\bglpat-(?P<secret>[A-Za-z0-9_-]{20,})".into()),
        ("Slack token", r"\bxox[abposr]-(?P<secret>[A-Za-z0-9-]{10,})".into()),
        ("Slack webhook", r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9/]{20,})".into()),
        ("Stripe key", r"\b(?:sk|rk)_(?:live|test)_(?P<secret>[A-Za-z0-9]{16,})".into()),
        ("Stripe webhook secret", r"\bwhsec_(?P<secret>[A-Za-z0-9]{20,})".into()),
        ("Google API key", r"\bAIza(?P<secret>[0-9A-Za-z_-]{35})".into()),
        ("Google OAuth token", r"\bya29\.(?P<secret>[0-9A-Za-z_-]{20,})".into()),
        ("AWS access key id", r"\b(?:AKIA|ASIA|ABIA|ACCA)(?P<secret>[0-9A-Z]{16})\b".into()),
        ("OpenAI or Anthropic key", r"\bsk-(?:ant-(?:[a-z]+[0-9]*-)?|proj-|svcacct-|admin-)?(?P<secret>[A-Za-z0-9_-]{16,})".into()),
        ("npm token", r"\bnpm_(?P<secret>[A-Za-z0-9]{36})\b".into()),
        ("PyPI token", r"\bpypi-(?P<secret>AgE[A-Za-z0-9_-]{40,})".into()),
        ("Hugging Face token", r"\bhf_(?P<secret>[A-Za-z0-9]{30,})\b".into()),
        ("SendGrid key", r"\bSG\.(?P<secret>[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,})".into()),
        // A JWT's claims are as private as its signature: all of it goes.
        ("JSON web token", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}".into()),
    ]
    .into_iter()
    .map(|(name, p)| (name, p.replace(r"\b", r"(?-u:\b)")))
    .collect()
}

/// A value the keyed patterns found that is code or a placeholder, not a secret:
/// `next_token()`, `self.config.password(`, `${DB_PASSWORD}`, `$TOKEN`, `<your-token>`;
/// or what an earlier pattern left (`x-access-token:[REDACTED]@github.com`).
pub(super) fn is_not_a_secret(value: &str) -> bool {
    if value.starts_with(super::MARK) || value.starts_with(['$', '<', '{', '%']) {
        return true;
    }
    // A call: a (dotted or `::`) identifier path followed by `(`.
    match value.find('(') {
        Some(open) if open > 0 => {
            let path = &value[..open];
            let ident = |s: &str| {
                s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '&')
                    && s.chars().skip(1).all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            path.split(['.', ':']).filter(|s| !s.is_empty()).all(ident)
        }
        _ => false,
    }
}
