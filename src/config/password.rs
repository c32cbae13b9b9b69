//! Where a server's password comes from: the environment variable that
//! `servers[].password_env` names, read when the password is needed.
//!
//! This module decides when such a variable counts as set (present, valid UTF-8, not
//! empty). It must never put a password into a log line, an error or rendered output:
//! errors name the variable, not its value.

use std::ffi::OsString;
use std::fmt;

use shepherd_actors::config::ServerConfig;

use super::ConfigError;

/// The state of the variable a `password_env` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PasswordVar {
    Set(String),
    Unset,
    Empty,
    NotUnicode,
}

impl PasswordVar {
    pub(crate) fn read(name: &str, lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        match lookup(name).map(OsString::into_string) {
            None => Self::Unset,
            Some(Err(_)) => Self::NotUnicode,
            Some(Ok(value)) if value.is_empty() => Self::Empty,
            Some(Ok(value)) => Self::Set(value),
        }
    }
}

/// Describes the state without the value: `is set`, `is not set`, …
impl fmt::Display for PasswordVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Set(_) => "is set",
            Self::Unset => "is not set",
            Self::Empty => "is set but empty",
            Self::NotUnicode => "is not valid UTF-8",
        })
    }
}

/// The password of `server`: `None` if it names no `password_env`; an error naming the
/// variable if it names one that is not set (or empty, or not UTF-8).
pub fn resolve_password(server: &ServerConfig) -> Result<Option<String>, ConfigError> {
    resolve_password_with(server, |name| std::env::var_os(name))
}

pub(crate) fn resolve_password_with(
    server: &ServerConfig,
    lookup: impl Fn(&str) -> Option<OsString>,
) -> Result<Option<String>, ConfigError> {
    let Some(var) = &server.password_env else {
        return Ok(None);
    };
    match PasswordVar::read(var, lookup) {
        PasswordVar::Set(password) => Ok(Some(password)),
        state => Err(ConfigError::PasswordUnavailable {
            server: server.name.clone(),
            var: var.to_owned(),
            state: state.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_with_password_env(var: Option<&str>) -> ServerConfig {
        let mut server = ServerConfig::new("local", "http://127.0.0.1:4096");
        server.password_env = var.map(str::to_owned);
        server
    }

    #[test]
    fn a_server_without_password_env_has_no_password() {
        let none = resolve_password_with(&server_with_password_env(None), |_| None).unwrap();
        assert_eq!(none, None);
    }

    #[test]
    fn the_password_is_read_from_the_named_variable() {
        let server = server_with_password_env(Some("OPENCODE_PW"));
        let password =
            resolve_password_with(&server, |name| (name == "OPENCODE_PW").then(|| OsString::from("hunter2")));
        assert_eq!(password.unwrap().as_deref(), Some("hunter2"));
    }

    #[test]
    fn an_unset_variable_is_an_error_naming_the_variable_and_the_server() {
        let server = server_with_password_env(Some("OPENCODE_PW"));
        let err = resolve_password_with(&server, |_| None).unwrap_err().to_string();
        assert!(err.contains("OPENCODE_PW") && err.contains("local") && err.contains("not set"), "{err}");
    }

    #[test]
    fn an_empty_variable_counts_as_missing() {
        let server = server_with_password_env(Some("OPENCODE_PW"));
        let err = resolve_password_with(&server, |_| Some(OsString::new())).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
