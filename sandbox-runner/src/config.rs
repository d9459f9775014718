//! Runner settings: `~/.wuhu/runner.yml` overlaid by command-line flags (flags win).
//!
//! ```yaml
//! server: https://wuhu.example.com
//! token: eyJhbGciOi...        # or WUHU_RUNNER_TOKEN / --token
//! name: ana-mac
//! kind: local                 # local | cloud
//! workspacesRoot: ~/.wuhu/workspaces
//! environments:               # offered environments, NAME: PATH
//!   api: ~/src/api
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use wuhu_core::wire::runner::{OfferedEnvironment, RUNNER_CONNECT_PATH, RunnerKind, SandboxMode};

/// Settings as read from one source; every field optional so sources can be layered.
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// Base URL of the Wuhu server (`http`, `https`, `ws` or `wss`).
    #[serde(default)]
    pub server: Option<String>,
    /// A runner token (JWT with `typ: runner`).
    #[serde(default)]
    pub token: Option<String>,
    /// The runner's name, unique per owner.
    #[serde(default)]
    pub name: Option<String>,
    /// `local` or `cloud`.
    #[serde(default)]
    pub kind: Option<RunnerKind>,
    /// Where per-session folder-template copies and worktrees go.
    #[serde(default)]
    pub workspaces_root: Option<String>,
    /// Offered environments, name → path.
    #[serde(default)]
    pub environments: BTreeMap<String, String>,
}

/// Complete, validated settings the runner runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Base URL of the server as given.
    pub server: String,
    /// The runner token.
    pub token: String,
    /// The runner's name.
    pub name: String,
    /// `local` or `cloud`.
    pub kind: RunnerKind,
    /// Absolute workspaces root.
    pub workspaces_root: PathBuf,
    /// Offered environments with absolute paths, sorted by name.
    pub environments: Vec<OfferedEnvironment>,
    /// Whether sessions run in cells (`--sandbox`, default on).
    pub sandbox: SandboxMode,
    /// `--replace`: take the name over from a live connection.
    pub replace: bool,
}

/// A problem with the settings.
#[derive(thiserror::Error, Debug)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid YAML of the expected shape.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        message: String,
    },
    /// A required setting is missing from both flags and file.
    #[error("missing {0} (pass --{0} or set it in the config file)")]
    Missing(&'static str),
    /// A setting has a bad value.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The default config file, `~/.wuhu/runner.yml`.
pub fn default_config_path(home: Option<&Path>) -> Option<PathBuf> {
    home.map(|h| h.join(".wuhu").join("runner.yml"))
}

/// Parses YAML config text.
///
/// # Errors
///
/// [`ConfigError::Parse`] for invalid YAML, unknown keys or wrongly typed values.
pub fn parse_settings(text: &str, path: &Path) -> Result<Settings, ConfigError> {
    if text.trim().is_empty() {
        return Ok(Settings::default());
    }
    serde_norway::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads the config file. A missing file is empty settings unless `required` (an explicit
/// `--config`).
///
/// # Errors
///
/// [`ConfigError::Read`] or [`ConfigError::Parse`].
pub fn load_settings(path: &Path, required: bool) -> Result<Settings, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_settings(&text, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(Settings::default()),
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses one `--env NAME=PATH`.
///
/// # Errors
///
/// [`ConfigError::Invalid`] without `=`, with an empty or badly formed name, or an empty path.
pub fn parse_env_flag(text: &str) -> Result<(String, String), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        what: "--env",
        message,
    };
    let Some((name, path)) = text.split_once('=') else {
        return Err(invalid(format!("{text:?} is not NAME=PATH")));
    };
    check_name(name).map_err(|m| invalid(format!("{text:?}: {m}")))?;
    if path.is_empty() {
        return Err(invalid(format!("{text:?} has an empty path")));
    }
    Ok((name.to_string(), path.to_string()))
}

impl Settings {
    /// Layers `over` on top of `self`: set fields of `over` win; environments are merged, `over`
    /// winning for the same name.
    pub fn overlay(mut self, over: Settings) -> Settings {
        self.server = over.server.or(self.server);
        self.token = over.token.or(self.token);
        self.name = over.name.or(self.name);
        self.kind = over.kind.or(self.kind);
        self.workspaces_root = over.workspaces_root.or(self.workspaces_root);
        self.environments.extend(over.environments);
        self
    }

    /// Checks and completes the settings: required fields, URL scheme, name syntax; `~` expanded
    /// with `home`, relative paths made absolute against `cwd`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Missing`] or [`ConfigError::Invalid`].
    pub fn resolve(self, home: Option<&Path>, cwd: &Path) -> Result<RunnerConfig, ConfigError> {
        let server = self.server.ok_or(ConfigError::Missing("server"))?;
        connect_url(&server)?;
        let token = self.token.ok_or(ConfigError::Missing("token"))?;
        if token.trim().is_empty() {
            return Err(ConfigError::Missing("token"));
        }
        let name = self.name.ok_or(ConfigError::Missing("name"))?;
        check_name(&name).map_err(|message| ConfigError::Invalid {
            what: "name",
            message,
        })?;
        let workspaces_root = match self.workspaces_root {
            Some(root) => absolute(&expand_tilde(&root, home), cwd),
            None => match home {
                Some(home) => home.join(".wuhu").join("workspaces"),
                None => return Err(ConfigError::Missing("workspaces-root")),
            },
        };
        let mut environments = Vec::new();
        for (env_name, path) in self.environments {
            check_name(&env_name).map_err(|message| ConfigError::Invalid {
                what: "environment name",
                message: format!("{env_name:?}: {message}"),
            })?;
            let path = absolute(&expand_tilde(&path, home), cwd);
            environments.push(OfferedEnvironment {
                name: env_name,
                path: path.to_string_lossy().into_owned(),
            });
        }
        Ok(RunnerConfig {
            server,
            token: token.trim().to_string(),
            name,
            kind: self.kind.unwrap_or_default(),
            workspaces_root,
            environments,
            sandbox: SandboxMode::On,
            replace: false,
        })
    }
}

/// The WebSocket URL for a server base URL: `http` → `ws`, `https` → `wss`, plus
/// [`RUNNER_CONNECT_PATH`].
///
/// # Errors
///
/// [`ConfigError::Invalid`] for another scheme or no host.
pub fn connect_url(server: &str) -> Result<String, ConfigError> {
    let server = server.trim().trim_end_matches('/');
    let (scheme, rest) = server
        .split_once("://")
        .ok_or_else(|| ConfigError::Invalid {
            what: "server",
            message: format!("{server:?} is not a URL like https://wuhu.example.com"),
        })?;
    let ws_scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        other => {
            return Err(ConfigError::Invalid {
                what: "server",
                message: format!("scheme {other:?} is not http, https, ws or wss"),
            });
        }
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(ConfigError::Invalid {
            what: "server",
            message: format!("{server:?} has no host"),
        });
    }
    // Whoever sits on a plaintext path controls this machine (the server sends commands), so
    // plaintext is for loopback only.
    if ws_scheme == "ws" && !is_loopback_host(host_of(rest)) {
        return Err(ConfigError::Invalid {
            what: "server",
            message: format!(
                "{server:?} is plaintext (http:// or ws://) to a host that is not loopback; use https:// (wss://), or plaintext only to localhost, 127.0.0.1 or [::1]"
            ),
        });
    }
    Ok(format!("{ws_scheme}://{rest}{RUNNER_CONNECT_PATH}"))
}

/// The host of `host[:port][/path]` (brackets of an IPv6 literal removed), lowercased.
fn host_of(authority_and_path: &str) -> String {
    let authority = authority_and_path
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    // Credentials in the URL are not ours to interpret; the host follows the last '@'.
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.to_ascii_lowercase()
}

/// `localhost`, `*.localhost`, 127.0.0.0/8 or `::1`.
fn is_loopback_host(host: String) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// `~` or `~/x` → `home/x`; anything else unchanged.
pub fn expand_tilde(path: &str, home: Option<&Path>) -> PathBuf {
    match (path, home) {
        ("~", Some(home)) => home.to_path_buf(),
        (p, Some(home)) if p.starts_with("~/") => home.join(&p[2..]),
        (p, _) => PathBuf::from(p),
    }
}

fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(String::from("must be 1 to 64 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "{name:?} may contain only letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
server: https://wuhu.example.com/
token: file-token
name: file-name
kind: cloud
workspacesRoot: ~/ws
environments:
  api: ~/src/api
  web: /srv/web
";

    #[test]
    fn file_settings_resolve_with_tilde_and_defaults() {
        let settings = parse_settings(FILE, Path::new("runner.yml")).unwrap();
        let config = settings
            .resolve(Some(Path::new("/home/ana")), Path::new("/cwd"))
            .unwrap();
        assert_eq!(config.server, "https://wuhu.example.com/");
        assert_eq!(config.kind, RunnerKind::Cloud);
        assert_eq!(config.workspaces_root, PathBuf::from("/home/ana/ws"));
        assert_eq!(
            config.environments,
            vec![
                OfferedEnvironment {
                    name: String::from("api"),
                    path: String::from("/home/ana/src/api")
                },
                OfferedEnvironment {
                    name: String::from("web"),
                    path: String::from("/srv/web")
                },
            ]
        );
    }

    #[test]
    fn flags_win_over_the_file() {
        let file = parse_settings(FILE, Path::new("runner.yml")).unwrap();
        let (env_name, env_path) = parse_env_flag("api=rel/api").unwrap();
        let flags = Settings {
            name: Some(String::from("flag-name")),
            kind: Some(RunnerKind::Local),
            environments: BTreeMap::from([
                (env_name, env_path),
                (String::from("extra"), String::from("/x")),
            ]),
            ..Settings::default()
        };
        let config = file
            .overlay(flags)
            .resolve(Some(Path::new("/home/ana")), Path::new("/cwd"))
            .unwrap();
        assert_eq!(config.name, "flag-name");
        assert_eq!(config.token, "file-token");
        assert_eq!(config.kind, RunnerKind::Local);
        let envs: Vec<(&str, &str)> = config
            .environments
            .iter()
            .map(|e| (e.name.as_str(), e.path.as_str()))
            .collect();
        assert_eq!(
            envs,
            vec![
                ("api", "/cwd/rel/api"),
                ("extra", "/x"),
                ("web", "/srv/web")
            ]
        );
    }

    #[test]
    fn defaults_and_missing_fields() {
        let settings = Settings {
            server: Some(String::from("http://127.0.0.1:8787")),
            token: Some(String::from("t")),
            name: Some(String::from("n")),
            ..Settings::default()
        };
        let config = settings
            .clone()
            .resolve(Some(Path::new("/h")), Path::new("/"))
            .unwrap();
        assert_eq!(config.kind, RunnerKind::Local);
        assert_eq!(config.workspaces_root, PathBuf::from("/h/.wuhu/workspaces"));
        let no_token = Settings {
            token: None,
            ..settings
        };
        assert!(matches!(
            no_token.resolve(Some(Path::new("/h")), Path::new("/")),
            Err(ConfigError::Missing("token"))
        ));
    }

    #[test]
    fn bad_files_and_flags_are_errors() {
        assert!(parse_settings("nmae: x\n", Path::new("f")).is_err());
        assert!(parse_settings("kind: moon\n", Path::new("f")).is_err());
        assert!(parse_settings("server: [\n", Path::new("f")).is_err());
        assert_eq!(
            parse_settings("\n", Path::new("f")).unwrap(),
            Settings::default()
        );
        for bad in ["noequals", "=/x", "a b=/x", "api="] {
            assert!(parse_env_flag(bad).is_err(), "{bad}");
        }
        assert!(load_settings(Path::new("/nonexistent/runner.yml"), false).is_ok());
        assert!(load_settings(Path::new("/nonexistent/runner.yml"), true).is_err());
    }

    #[test]
    fn connect_urls() {
        let cases = [
            (
                "http://127.0.0.1:8787",
                Some("ws://127.0.0.1:8787/v1/runners/connect"),
            ),
            (
                "https://wuhu.example.com/",
                Some("wss://wuhu.example.com/v1/runners/connect"),
            ),
            (
                "https://example.com/wuhu",
                Some("wss://example.com/wuhu/v1/runners/connect"),
            ),
            ("wss://x", Some("wss://x/v1/runners/connect")),
            (
                "ws://localhost:8787",
                Some("ws://localhost:8787/v1/runners/connect"),
            ),
            ("http://[::1]:1", Some("ws://[::1]:1/v1/runners/connect")),
            (
                "http://127.9.9.9",
                Some("ws://127.9.9.9/v1/runners/connect"),
            ),
            ("http://wuhu.example.com", None),
            ("ws://10.0.0.5:8787", None),
            ("http://[::2]:1", None),
            ("http://localhost.evil.com", None),
            ("http://127.0.0.1@evil.com/", None),
            ("http://evil.com#@127.0.0.1", None),
            ("ftp://x", None),
            ("example.com", None),
            ("http://", None),
        ];
        for (server, want) in cases {
            assert_eq!(connect_url(server).ok().as_deref(), want, "{server}");
        }
    }
}
