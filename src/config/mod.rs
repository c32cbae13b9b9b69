//! Loading the binary's configuration: which sources count, in which order, and how a
//! wrong value is reported.
//!
//! The schema (keys, types, every default number) lives in
//! [`shepherd_actors::config`]; this module must not name a default of its own. Layers,
//! lowest first, each overriding the keys it names:
//! 1. built-in defaults (the schema's `Default` impls);
//! 2. one TOML file: `--config FILE`, which must exist, else [`DEFAULT_FILE_NAME`] in the
//!    current directory if it is there ([`ConfigSources::or_default_file`]);
//! 3. environment variables `SHEPHERD_<SECTION>__<KEY>`, keys lower-cased
//!    (`SHEPHERD_RECOVERY__STALL_TIMEOUT=30s`, `SHEPHERD_SERVERS__0__URL=http://…`). A
//!    `SHEPHERD_` variable without the double underscore (`SHEPHERD_OPENCODE_BIN`,
//!    `SHEPHERD_CONTROL_TOKEN`) is not configuration and is ignored; one with it that
//!    names no key is an error;
//! 4. flags: `--server URL` replaces the server list by one server named
//!    [`SERVER_FLAG_NAME`], then every `--set key.path=value`, in order.
//!
//! A value in the file must have the schema's type: `max_recoveries = 2.7`, `name = 5`
//! and `enabled = "yes"` are refused. Values from the environment and from flags are
//! strings; they become numbers or booleans, spaces around them ignored, where the schema
//! asks for one (`SHEPHERD_RECOVERY__MAX_RECOVERIES=5`), and nowhere else (`strict`:
//! the `config` crate's own deserializer would convert leniently in every layer). Every
//! failure is a [`ConfigError`] naming the key path, the
//! reason and the layer it came from: `recovery.stall_timeout: invalid duration "3
//! parsecs" (…) (from environment variable SHEPHERD_RECOVERY__STALL_TIMEOUT)`. Unknown
//! keys fail in every layer. Once the layers are merged, [`Config::validate`] checks
//! ranges and relations.
//!
//! The `config` crate does the layering; `layers` says what each layer contributes, under
//! which key and origin; `merged` reads the result into the schema, with key paths and
//! origins in errors, through `strict`, which keeps each value's type and converts only
//! environment and flag text; `render` prints the effective config for `shepherd config check`
//! (secrets masked); `password` reads `servers[].password_env`; `diff` says what a reload
//! changes.

pub mod diff;
mod layers;
mod merged;
mod password;
mod render;
mod strict;

use std::path::{Path, PathBuf};

use shepherd_actors::config::{Config, InvalidValue};

pub use self::layers::{Origin, ENV_PREFIX};
pub use self::password::resolve_password;
pub use self::render::{render_effective, render_with_origins, MASK};

use self::layers::Layer;
use self::merged::Merged;

/// The file read when `--config` is not given, if it exists in the current directory.
pub const DEFAULT_FILE_NAME: &str = "shepherd.toml";

/// The name of the one server that `--server URL` configures.
pub const SERVER_FLAG_NAME: &str = "default";

/// What the command line says about where configuration comes from (the environment is
/// read by [`load`] itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigSources {
    /// The TOML file. When it is given it must exist.
    pub file: Option<PathBuf>,
    /// `key.path=value` assignments from `--set`, applied in order, last.
    pub overrides: Vec<String>,
    /// `--server URL`: replaces the server list by one server named [`SERVER_FLAG_NAME`].
    pub server_url: Option<String>,
}

impl ConfigSources {
    /// Without an explicit file: [`DEFAULT_FILE_NAME`] in the current directory if it
    /// exists, else the user's ([`user_config_path`]) if that exists. [`load`] does this
    /// itself; call it to learn which file will be read.
    pub fn or_default_file(self) -> Self {
        self.or_default_file_in(Path::new("."), &|name| std::env::var_os(name))
    }

    fn or_default_file_in(mut self, dir: &Path, lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Self {
        if self.file.is_none() {
            let here = dir.join(DEFAULT_FILE_NAME);
            self.file = [Some(here), user_config_path(lookup)].into_iter().flatten().find(|p| p.is_file());
        }
        self
    }
}

/// The user's configuration file: `$XDG_CONFIG_HOME/shepherd/shepherd.toml`, else
/// `~/.config/shepherd/shepherd.toml` (where `shepherd init` writes).
pub fn user_config_path(lookup: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let absolute = |name: &str| lookup(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let base = absolute("XDG_CONFIG_HOME").or_else(|| absolute("HOME").map(|h| h.join(".config")))?;
    Some(base.join("shepherd").join(DEFAULT_FILE_NAME))
}

/// Why the configuration could not be loaded. Every variant names what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {}: not found", path.display())]
    FileNotFound { path: PathBuf },
    #[error("config file {}: cannot be read: {source}", path.display())]
    FileUnreadable { path: PathBuf, source: std::io::Error },
    #[error("config file {}: {message}", path.display())]
    FileSyntax { path: PathBuf, message: String },
    /// A `--set` flag or a configuration variable's name that is not a key assignment.
    #[error("{origin}: {reason}")]
    Malformed { origin: Origin, reason: String },
    /// A key that does not exist, or a value that is wrong for its key; from a file, the
    /// line that writes it (or the header of the table it is missing from).
    #[error("{key}: {reason} (from {origin}{})", at_line(*.line))]
    Invalid { key: String, reason: String, origin: Origin, line: Option<usize> },
    #[error("environment variable {var}: the value is not valid UTF-8")]
    NotUnicode { var: String },
    /// `servers[].password_env` names a variable that holds no usable password.
    #[error("server {server:?}: password_env names {var}, which {state}")]
    PasswordUnavailable { server: String, var: String, state: String },
}

/// `, line N` after a file's name, when the line is known.
fn at_line(line: Option<usize>) -> String {
    line.map(|n| format!(", line {n}")).unwrap_or_default()
}

/// Loads the configuration from `sources`, the default file if no file is named, and
/// the process environment; then validates it.
pub fn load(sources: &ConfigSources) -> Result<Config, ConfigError> {
    load_with_origins(sources).map(|(config, _)| config)
}

/// [`load`], and which layer set each value (for `shepherd config check`).
pub fn load_with_origins(sources: &ConfigSources) -> Result<(Config, Origins), ConfigError> {
    let sources = sources.clone().or_default_file();
    load_merged(&sources, &config_vars_of_process()?)
}

/// Loads the configuration from `sources` and the given environment (name, value pairs;
/// variables that are not configuration are ignored), then validates it. Reads the file
/// `sources.file` if any, and nothing else: no process environment, no default file.
pub fn load_with_env(sources: &ConfigSources, env: &[(String, String)]) -> Result<Config, ConfigError> {
    load_merged(sources, env).map(|(config, _)| config)
}

/// Which layer set each value of a loaded configuration.
pub struct Origins(Merged);

impl Origins {
    /// The layer that set `key` (`recovery.stall_timeout`, `servers[0].url`), or
    /// [`Origin::Default`] when none did.
    pub fn of(&self, key: &str) -> Origin {
        self.0.written_by(key)
    }
}

fn load_merged(sources: &ConfigSources, env: &[(String, String)]) -> Result<(Config, Origins), ConfigError> {
    let malformed = |(origin, reason)| ConfigError::Malformed { origin, reason };
    let mut layers = Vec::new();
    if let Some(path) = &sources.file {
        layers.push(read_file(path)?);
    }
    layers.push(Layer::environment(env).map_err(malformed)?);
    if let Some(url) = &sources.server_url {
        layers.push(Layer::server_flag(SERVER_FLAG_NAME, url));
    }
    for assignment in &sources.overrides {
        layers.push(Layer::set_flag(assignment).map_err(malformed)?);
    }

    let merged = Merged::of(layers).map_err(|e| ConfigError::Invalid {
        key: "(top level)".to_owned(),
        reason: e.to_string(),
        origin: Origin::Default,
        line: None,
    })?;
    let config: Config = merged.deserialize()?;
    config.validate().map_err(|InvalidValue { key, reason }| merged.invalid(key, reason))?;
    Ok((config, Origins(merged)))
}

fn read_file(path: &Path) -> Result<Layer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ConfigError::FileNotFound { path: path.to_owned() },
        _ => ConfigError::FileUnreadable { path: path.to_owned(), source },
    })?;
    Layer::file(path, &text)
        .map_err(|message| ConfigError::FileSyntax { path: path.to_owned(), message: message.trim_end().to_owned() })
}

/// The process's configuration variables (`SHEPHERD_` names with a `__`); other
/// variables are not looked at, whatever their encoding.
fn config_vars_of_process() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !layers::is_configuration_var(name) {
            continue;
        }
        let value = value.into_string().map_err(|_| ConfigError::NotUnicode { var: name.to_owned() })?;
        vars.push((name.to_owned(), value));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use shepherd_actors::config::LogFormat;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn toml_file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file
    }

    fn with_file(file: &tempfile::NamedTempFile) -> ConfigSources {
        ConfigSources { file: Some(file.path().to_owned()), ..ConfigSources::default() }
    }

    fn with_overrides(overrides: &[&str]) -> ConfigSources {
        ConfigSources { overrides: overrides.iter().map(|s| s.to_string()).collect(), ..ConfigSources::default() }
    }

    fn error_text(result: Result<Config, ConfigError>) -> String {
        result.expect_err("loading should fail").to_string()
    }

    #[test]
    fn defaults_load_when_there_is_no_file_no_environment_and_no_flag() {
        let config = load_with_env(&ConfigSources::default(), &[]).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn a_file_overrides_the_defaults_and_leaves_the_rest_alone() {
        let file = toml_file("[recovery]\nstall_timeout = \"2m\"\n[log]\nformat = \"json\"\n");
        let config = load_with_env(&with_file(&file), &[]).unwrap();
        assert_eq!(config.recovery.stall_timeout, Duration::from_secs(120));
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(config.recovery.cooldown, Config::default().recovery.cooldown);
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let file = toml_file("[recovery]\nstall_timeout = \"2m\"\n");
        let vars = env(&[("SHEPHERD_RECOVERY__STALL_TIMEOUT", "30s"), ("SHEPHERD_LOG__FORMAT", "json")]);
        let config = load_with_env(&with_file(&file), &vars).unwrap();
        assert_eq!(config.recovery.stall_timeout, Duration::from_secs(30));
        assert_eq!(config.log.format, LogFormat::Json);
    }

    #[test]
    fn a_flag_overrides_the_environment() {
        let vars = env(&[("SHEPHERD_RECOVERY__STALL_TIMEOUT", "30s")]);
        let config = load_with_env(&with_overrides(&["recovery.stall_timeout=5s"]), &vars).unwrap();
        assert_eq!(config.recovery.stall_timeout, Duration::from_secs(5));
    }

    #[test]
    fn numbers_from_the_environment_and_flags_are_parsed_from_their_strings() {
        let vars = env(&[("SHEPHERD_RECOVERY__MAX_RECOVERIES", "5")]);
        let config = load_with_env(&with_overrides(&["recovery.tool_grace_factor=2.5"]), &vars).unwrap();
        assert_eq!(config.recovery.max_recoveries, 5);
        assert_eq!(config.recovery.tool_grace_factor, 2.5);
    }

    #[test]
    fn the_server_flag_replaces_the_server_list_with_one_server_named_default() {
        let file = toml_file(
            "[[servers]]\nname = \"a\"\nurl = \"http://a:1\"\n[[servers]]\nname = \"b\"\nurl = \"http://b:1\"\n",
        );
        let sources = ConfigSources { server_url: Some("http://127.0.0.1:4096".into()), ..with_file(&file) };
        let config = load_with_env(&sources, &[]).unwrap();
        assert_eq!(config.servers.len(), 1);
        assert_eq!(config.servers[0].name, SERVER_FLAG_NAME);
        assert_eq!(config.servers[0].url, "http://127.0.0.1:4096");
    }

    #[test]
    fn set_flags_apply_after_the_server_flag() {
        let sources = ConfigSources {
            server_url: Some("http://127.0.0.1:4096".into()),
            ..with_overrides(&["servers[0].password_env=OPENCODE_PW"])
        };
        let config = load_with_env(&sources, &[]).unwrap();
        assert_eq!(config.servers[0].password_env.as_deref(), Some("OPENCODE_PW"));
    }

    #[test]
    fn a_server_can_be_described_entirely_in_the_environment() {
        let vars = env(&[
            ("SHEPHERD_SERVERS__0__URL", "http://127.0.0.1:4096"),
            ("SHEPHERD_SERVERS__0__NAME", "local"),
            ("SHEPHERD_SERVERS__0__LIST_LIMIT", "50"),
        ]);
        let config = load_with_env(&ConfigSources::default(), &vars).unwrap();
        assert_eq!(config.servers[0].name, "local");
        assert_eq!(config.servers[0].list_limit, 50);
    }

    #[test]
    fn an_explicitly_named_missing_file_is_an_error() {
        let sources = ConfigSources { file: Some("/nonexistent/shepherd.toml".into()), ..ConfigSources::default() };
        let err = load_with_env(&sources, &[]).unwrap_err();
        assert!(matches!(err, ConfigError::FileNotFound { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/shepherd.toml"), "{err}");
    }

    #[test]
    fn the_default_file_is_read_only_when_it_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let none = |_: &str| None;
        assert_eq!(ConfigSources::default().or_default_file_in(dir.path(), &none).file, None);
        std::fs::write(dir.path().join(DEFAULT_FILE_NAME), "").unwrap();
        let found = ConfigSources::default().or_default_file_in(dir.path(), &none).file;
        assert_eq!(found, Some(dir.path().join(DEFAULT_FILE_NAME)));
        let named = ConfigSources { file: Some("other.toml".into()), ..ConfigSources::default() };
        assert_eq!(named.or_default_file_in(dir.path(), &none).file, Some("other.toml".into()));
    }

    #[test]
    fn the_user_s_file_is_read_when_the_current_directory_has_none() {
        let cwd = tempfile::tempdir().unwrap();
        let xdg = tempfile::tempdir().unwrap();
        let config_home = xdg.path().as_os_str().to_owned();
        let env = move |name: &str| (name == "XDG_CONFIG_HOME").then(|| config_home.clone());
        assert_eq!(ConfigSources::default().or_default_file_in(cwd.path(), &env).file, None, "only if it exists");
        let user = xdg.path().join("shepherd").join(DEFAULT_FILE_NAME);
        std::fs::create_dir_all(user.parent().unwrap()).unwrap();
        std::fs::write(&user, "").unwrap();
        assert_eq!(ConfigSources::default().or_default_file_in(cwd.path(), &env).file, Some(user));
        std::fs::write(cwd.path().join(DEFAULT_FILE_NAME), "").unwrap();
        let here = ConfigSources::default().or_default_file_in(cwd.path(), &env).file;
        assert_eq!(here, Some(cwd.path().join(DEFAULT_FILE_NAME)), "./shepherd.toml comes first");
    }

    #[test]
    fn a_toml_syntax_error_names_the_file_and_the_line() {
        let file = toml_file("[recovery\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(text.contains(&file.path().display().to_string()) && text.contains("line 1"), "{text}");
    }

    #[test]
    fn an_unknown_key_in_the_file_fails_with_its_path_and_the_file() {
        let file = toml_file("[recovery]\nstall_timout = \"3m\"\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(text.starts_with("recovery.stall_timout: unknown key"), "{text}");
        assert!(text.contains("did you mean `stall_timeout`"), "{text}");
        assert!(text.contains(&file.path().display().to_string()), "{text}");
    }

    #[test]
    fn an_unknown_environment_key_fails_naming_the_variable() {
        let vars = env(&[("SHEPHERD_RECOVERY__NOPE", "1")]);
        let text = error_text(load_with_env(&ConfigSources::default(), &vars));
        assert!(text.starts_with("recovery.nope: unknown key"), "{text}");
        assert!(text.contains("environment variable SHEPHERD_RECOVERY__NOPE"), "{text}");
    }

    #[test]
    fn an_unknown_environment_section_fails_naming_the_variable() {
        let vars = env(&[("SHEPHERD_OPENCODE__BIN", "/usr/bin/opencode")]);
        let text = error_text(load_with_env(&ConfigSources::default(), &vars));
        assert!(text.starts_with("opencode: unknown key"), "{text}");
        assert!(text.contains("SHEPHERD_OPENCODE__BIN"), "{text}");
    }

    #[test]
    fn variables_without_a_double_underscore_are_not_configuration() {
        let vars = env(&[
            ("SHEPHERD_OPENCODE_BIN", "/usr/bin/opencode"),
            ("SHEPHERD_OPENCODE_CACHE", "/tmp/cache"),
            ("SHEPHERD_CONTROL_TOKEN", "secret"),
            ("PATH", "/usr/bin"),
        ]);
        let config = load_with_env(&ConfigSources::default(), &vars).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn a_bad_duration_fails_naming_the_key_the_reason_and_the_variable() {
        let vars = env(&[("SHEPHERD_RECOVERY__STALL_TIMEOUT", "3 parsecs")]);
        let text = error_text(load_with_env(&ConfigSources::default(), &vars));
        assert!(text.starts_with("recovery.stall_timeout: invalid duration \"3 parsecs\""), "{text}");
        assert!(text.ends_with("(from environment variable SHEPHERD_RECOVERY__STALL_TIMEOUT)"), "{text}");
    }

    #[test]
    fn a_number_that_is_not_one_fails_naming_the_key_and_the_flag() {
        let text = error_text(load_with_env(&with_overrides(&["recovery.max_recoveries=many"]), &[]));
        assert!(text.starts_with("recovery.max_recoveries: invalid type: string \"many\""), "{text}");
        assert!(text.contains("flag --set recovery.max_recoveries"), "{text}");
    }

    #[test]
    fn a_fraction_in_the_file_where_a_whole_number_is_wanted_is_refused_naming_the_key_and_the_file() {
        let file = toml_file("[recovery]\nmax_recoveries = 2.7\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(
            text.starts_with("recovery.max_recoveries: invalid type: floating point `2.7`, expected u32"),
            "{text}"
        );
        assert!(text.contains(&file.path().display().to_string()), "{text}");
    }

    #[test]
    fn a_number_in_the_file_where_text_is_wanted_is_refused() {
        let file = toml_file("[[servers]]\nname = 5\nurl = \"http://127.0.0.1:4096\"\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(text.starts_with("servers[0].name: invalid type: integer `5`, expected a string"), "{text}");
    }

    #[test]
    fn text_in_the_file_where_a_boolean_is_wanted_is_refused() {
        let file = toml_file("[nudge]\nenabled = \"yes\"\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(text.starts_with("nudge.enabled: invalid type: string \"yes\", expected a boolean"), "{text}");
        assert!(text.contains(&file.path().display().to_string()), "{text}");
    }

    #[test]
    fn a_number_from_the_environment_may_have_spaces_around_it() {
        let vars = env(&[("SHEPHERD_RECOVERY__MAX_RECOVERIES", " 5 ")]);
        let config = load_with_env(&ConfigSources::default(), &vars).unwrap();
        assert_eq!(config.recovery.max_recoveries, 5);
    }

    #[test]
    fn a_number_from_a_set_flag_is_parsed_from_its_text() {
        let config = load_with_env(&with_overrides(&["recovery.max_recoveries=5"]), &[]).unwrap();
        assert_eq!(config.recovery.max_recoveries, 5);
    }

    #[test]
    fn text_from_the_environment_stays_text_where_the_schema_wants_text() {
        let vars = env(&[("SHEPHERD_SERVERS__0__NAME", "5"), ("SHEPHERD_SERVERS__0__URL", "http://127.0.0.1:4096")]);
        let config = load_with_env(&ConfigSources::default(), &vars).unwrap();
        assert_eq!(config.servers[0].name, "5");
    }

    #[test]
    fn an_unknown_log_format_lists_the_choices() {
        let file = toml_file("[log]\nformat = \"xml\"\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(
            text.starts_with("log.format: unknown variant `xml`, expected one of `auto`, `json`, `pretty`"),
            "{text}"
        );
    }

    #[test]
    fn a_bad_url_fails_naming_servers_0_url() {
        let file = toml_file("[[servers]]\nname = \"local\"\nurl = \"127.0.0.1:4096\"\n");
        let text = error_text(load_with_env(&with_file(&file), &[]));
        assert!(text.starts_with("servers[0].url: must start with http://"), "{text}");
        assert!(text.contains(&file.path().display().to_string()), "{text}");
    }

    #[test]
    fn a_server_without_a_url_fails_naming_the_server_entry() {
        let vars = env(&[("SHEPHERD_SERVERS__0__NAME", "local")]);
        let text = error_text(load_with_env(&ConfigSources::default(), &vars));
        assert!(text.starts_with("servers[0]: missing required key `url`"), "{text}");
        assert!(text.contains("SHEPHERD_SERVERS__0__NAME"), "{text}");
    }

    #[test]
    fn an_invalid_relation_names_the_layer_that_set_the_value() {
        let vars = env(&[("SHEPHERD_RECOVERY__MAX_AUTO_SUBMITS", "0")]);
        let text = error_text(load_with_env(&ConfigSources::default(), &vars));
        assert_eq!(
            text,
            "recovery.max_auto_submits: must be at least 1 \
             (from environment variable SHEPHERD_RECOVERY__MAX_AUTO_SUBMITS)"
        );
    }

    #[test]
    fn a_set_flag_without_an_equals_sign_is_refused_naming_the_flag() {
        let text = error_text(load_with_env(&with_overrides(&["recovery.stall_timeout"]), &[]));
        assert!(text.starts_with("flag --set recovery.stall_timeout: expected KEY=VALUE"), "{text}");
    }

    #[test]
    fn secrets_never_appear_in_the_rendered_config() {
        let file = toml_file(
            "[[servers]]\nname = \"local\"\nurl = \"http://127.0.0.1:4096\"\npassword_env = \"OPENCODE_PW\"\n",
        );
        let config = load_with_env(&with_file(&file), &[]).unwrap();
        let text = render::render_with(&config, |name| (name == "OPENCODE_PW").then(|| "hunter2".into()));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("OPENCODE_PW is set"), "{text}");
    }

    #[test]
    fn the_rendered_config_names_the_layer_of_every_value_a_layer_set() {
        let file = toml_file(
            "[[servers]]\nname = \"local\"\nurl = \"http://127.0.0.1:4096\"\npassword_env = \"OPENCODE_PW\"\n",
        );
        let vars = env(&[("SHEPHERD_RECOVERY__STALL_TIMEOUT", "30s")]);
        let (config, origins) = load_merged(&with_file(&file), &vars).unwrap();
        let text = render::render_noted(&config, |_| None, |key| origins.of(key));
        let from_file = format!("from file {}", file.path().display());
        assert!(
            text.contains("stall_timeout = \"30s\" # from environment variable SHEPHERD_RECOVERY__STALL_TIMEOUT"),
            "{text}"
        );
        assert!(text.contains(&format!("url = \"http://127.0.0.1:4096\" # {from_file}")), "{text}");
        assert!(text.contains(&format!("# OPENCODE_PW is not set; {from_file}")), "{text}");
        let default = text.lines().find(|line| line.starts_with("cooldown = ")).unwrap();
        assert!(!default.contains('#'), "a default has no origin: {default}");
        assert_eq!(load_with_env(&with_file(&toml_file(&text)), &[]).unwrap(), config);
    }

    #[test]
    fn the_rendered_config_loads_back_unchanged() {
        let vars = env(&[("SHEPHERD_RECOVERY__WAIT_AFTER_ABORT", "2500ms")]);
        let config =
            load_with_env(&with_overrides(&["servers[0].name=a", "servers[0].url=http://a:1"]), &vars).unwrap();
        let file = toml_file(&render::render_with(&config, |_| None));
        assert_eq!(load_with_env(&with_file(&file), &[]).unwrap(), config);
    }
}
