//! Where the control API's bearer token comes from and where it is kept.
//!
//! The daemon uses the value of the environment variable `control.token_env` names.
//! When that variable is unset (or empty), it generates a random token at start-up and
//! writes it to the token file — `control.token_file`, or by default
//! `$XDG_STATE_HOME/shepherd/control.token` (`~/.local/state/shepherd/control.token`) —
//! with mode 0600 in a directory it creates with mode 0700, and removes the file on
//! shutdown. The CLI looks in the same two places, the variable first.
//!
//! A [`ControlToken`] prints as `***` (`Debug` and `Display`): the value leaves this
//! module only through [`ControlToken::expose`], for the `Authorization` header and the
//! comparison. Errors name the variable or the file, never the value.

use std::ffi::OsString;
use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use shepherd_actors::config::ControlConfig;

/// The default token file, under the user's state directory.
const STATE_SUBDIR: &str = "shepherd";
const TOKEN_FILE_NAME: &str = "control.token";

/// A bearer token. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlToken(String);

impl ControlToken {
    /// A token from text (surrounding whitespace dropped); `None` when empty.
    pub fn new(text: &str) -> Option<Self> {
        let t = text.trim();
        (!t.is_empty()).then(|| Self(t.to_string()))
    }

    /// A fresh random token (a v4 UUID: 122 random bits).
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The secret itself: for the `Authorization` header and the comparison only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ControlToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlToken(***)")
    }
}

impl fmt::Display for ControlToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a token was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOrigin {
    /// The environment variable with this name.
    Env(String),
    /// The token file (read by the CLI, or written by the daemon).
    File(PathBuf),
}

impl fmt::Display for TokenOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(name) => write!(f, "the variable {name}"),
            Self::File(path) => write!(f, "the file {}", path.display()),
        }
    }
}

/// Why no token could be established or found.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(
        "control.token_file: no default location (neither XDG_STATE_HOME nor HOME is set to an \
         absolute path); set control.token_file or {env}"
    )]
    NoStateDir { env: String },
    #[error("{name} is set but is not valid UTF-8")]
    NotUnicode { name: String },
    #[error("cannot write the control token file {}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error(
        "no control token: {env} is not set and {} does not exist; is the daemon running \
         (`shepherd run`) with this configuration?",
        path.display()
    )]
    NotFound { env: String, path: PathBuf },
    #[error("cannot read the control token file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the control token file {} is empty", path.display())]
    Empty { path: PathBuf },
}

/// The token from the variable `name`, if it is set and not empty.
pub fn from_env(name: &str, lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Option<ControlToken>, TokenError> {
    match lookup(name).map(OsString::into_string) {
        None => Ok(None),
        Some(Err(_)) => Err(TokenError::NotUnicode { name: name.to_string() }),
        Some(Ok(text)) => Ok(ControlToken::new(&text)),
    }
}

/// The token file: `control.token_file` (a leading `~/` is the home directory), or the
/// default under the user's state directory.
pub fn token_file_path(cfg: &ControlConfig, lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, TokenError> {
    let absolute = |name: &str| lookup(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let no_dir = || TokenError::NoStateDir { env: cfg.token_env.clone() };
    let configured = cfg.token_file.trim();
    if !configured.is_empty() {
        return match configured.strip_prefix("~/") {
            Some(rest) => Ok(absolute("HOME").ok_or_else(no_dir)?.join(rest)),
            None => Ok(PathBuf::from(configured)),
        };
    }
    let state = absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("state")))
        .ok_or_else(no_dir)?;
    Ok(state.join(STATE_SUBDIR).join(TOKEN_FILE_NAME))
}

/// The daemon's token, and the file it wrote (if it generated the token).
#[derive(Debug)]
pub struct IssuedToken {
    pub token: ControlToken,
    pub origin: TokenOrigin,
    written: Option<PathBuf>,
}

impl IssuedToken {
    /// The variable's token, or a generated one written to the token file.
    pub fn issue(cfg: &ControlConfig, lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Self, TokenError> {
        if let Some(token) = from_env(&cfg.token_env, lookup)? {
            return Ok(Self { token, origin: TokenOrigin::Env(cfg.token_env.clone()), written: None });
        }
        let path = token_file_path(cfg, lookup)?;
        let token = ControlToken::generate();
        write_private(&path, &token).map_err(|source| TokenError::Write { path: path.clone(), source })?;
        Ok(Self { token, origin: TokenOrigin::File(path.clone()), written: Some(path) })
    }

    /// The file written at start-up, if any.
    pub fn written_file(&self) -> Option<&Path> {
        self.written.as_deref()
    }

    /// Removes the written file, if it still holds this token (another daemon may have
    /// replaced it since). Idempotent.
    pub fn withdraw(&mut self) {
        let Some(path) = self.written.take() else { return };
        match std::fs::read_to_string(&path) {
            Ok(text) if ControlToken::new(&text).as_ref() == Some(&self.token) => {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(file = %path.display(), error = %e, "could not remove the control token file");
                }
            }
            Ok(_) => {
                tracing::info!(file = %path.display(), "control token file holds another token now; left in place")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %path.display(), error = %e, "could not read the control token file"),
        }
    }
}

impl Drop for IssuedToken {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// The CLI's token: the variable, else the file.
pub fn find_for_client(
    cfg: &ControlConfig,
    lookup: &dyn Fn(&str) -> Option<OsString>,
) -> Result<(ControlToken, TokenOrigin), TokenError> {
    if let Some(token) = from_env(&cfg.token_env, lookup)? {
        return Ok((token, TokenOrigin::Env(cfg.token_env.clone())));
    }
    let path = token_file_path(cfg, lookup)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TokenError::NotFound { env: cfg.token_env.clone(), path })
        }
        Err(source) => return Err(TokenError::Read { path, source }),
    };
    match ControlToken::new(&text) {
        Some(token) => Ok((token, TokenOrigin::File(path))),
        None => Err(TokenError::Empty { path }),
    }
}

/// Writes `token` to `path` readable by the owner only: a 0600 temporary file in the
/// same directory, renamed over `path` (so no reader ever sees a partial token, and a
/// pre-existing file with wider permissions is replaced, not reused).
fn write_private(path: &Path, token: &ControlToken) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        writeln!(f, "{}", token.expose())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        move |k| map.get(k).cloned()
    }

    fn cfg(token_file: &str) -> ControlConfig {
        ControlConfig { token_file: token_file.to_string(), ..ControlConfig::default() }
    }

    #[test]
    fn a_token_never_prints_its_value() {
        let t = ControlToken::new("s3cret").unwrap();
        assert!(!format!("{t} {t:?}").contains("s3cret"));
        assert_eq!(t.expose(), "s3cret");
    }

    #[test]
    fn the_default_file_is_under_xdg_state_home_else_under_home() {
        let xdg = env(&[("XDG_STATE_HOME", "/st"), ("HOME", "/h")]);
        assert_eq!(token_file_path(&cfg(""), &xdg).unwrap(), PathBuf::from("/st/shepherd/control.token"));
        let home = env(&[("XDG_STATE_HOME", "relative/ignored"), ("HOME", "/h")]);
        assert_eq!(token_file_path(&cfg(""), &home).unwrap(), PathBuf::from("/h/.local/state/shepherd/control.token"));
        assert!(matches!(token_file_path(&cfg(""), &env(&[])), Err(TokenError::NoStateDir { .. })));
    }

    #[test]
    fn a_configured_file_wins_and_may_start_with_the_home_directory() {
        let e = env(&[("HOME", "/h"), ("XDG_STATE_HOME", "/st")]);
        assert_eq!(token_file_path(&cfg("/etc/t"), &e).unwrap(), PathBuf::from("/etc/t"));
        assert_eq!(token_file_path(&cfg("~/t/x"), &e).unwrap(), PathBuf::from("/h/t/x"));
    }

    #[test]
    fn the_variable_is_used_as_is_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t");
        let c = cfg(file.to_str().unwrap());
        let issued = IssuedToken::issue(&c, &env(&[("SHEPHERD_CONTROL_TOKEN", " abc \n")])).unwrap();
        assert_eq!(issued.token.expose(), "abc");
        assert_eq!(issued.origin, TokenOrigin::Env("SHEPHERD_CONTROL_TOKEN".into()));
        assert!(!file.exists());
    }

    #[test]
    fn without_the_variable_a_token_is_generated_written_0600_found_by_the_client_and_withdrawn() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("new").join("control.token");
        let c = cfg(file.to_str().unwrap());
        let mut issued = IssuedToken::issue(&c, &env(&[("SHEPHERD_CONTROL_TOKEN", "")])).unwrap();
        assert_eq!(issued.token.expose().len(), 32);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode & 0o077, 0, "directory private: {dir_mode:o}");

        let (found, origin) = find_for_client(&c, &env(&[])).unwrap();
        assert_eq!(found, issued.token);
        assert_eq!(origin, TokenOrigin::File(file.clone()));

        issued.withdraw();
        assert!(!file.exists());
        assert!(matches!(find_for_client(&c, &env(&[])), Err(TokenError::NotFound { .. })));
    }

    #[test]
    fn a_file_replaced_by_another_daemon_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("control.token");
        let c = cfg(file.to_str().unwrap());
        let mut issued = IssuedToken::issue(&c, &env(&[])).unwrap();
        std::fs::write(&file, "someone-else\n").unwrap();
        issued.withdraw();
        assert!(file.exists());
    }

    #[test]
    fn the_client_prefers_the_variable_and_refuses_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("control.token");
        std::fs::write(&file, "\n").unwrap();
        let c = cfg(file.to_str().unwrap());
        let (t, origin) = find_for_client(&c, &env(&[("SHEPHERD_CONTROL_TOKEN", "v")])).unwrap();
        assert_eq!((t.expose(), origin), ("v", TokenOrigin::Env("SHEPHERD_CONTROL_TOKEN".into())));
        assert!(matches!(find_for_client(&c, &env(&[])), Err(TokenError::Empty { .. })));
    }
}
