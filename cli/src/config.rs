//! `~/.wuhu/client.yml`: named profiles (server URL and token), and how the server and token
//! of a command are chosen.
//!
//! Resolution order, for the server and for the token separately:
//!
//! 1. the flag (`--server`, `--token`);
//! 2. the environment (`WUHU_SERVER`, `WUHU_TOKEN`);
//! 3. the profile (`--profile`, else `WUHU_PROFILE`, else the file's `current`, else `default`);
//! 4. the default: server [`DEFAULT_SERVER`], no token.
//!
//! The file lives at `$WUHU_CONFIG` when set, else `$HOME/.wuhu/client.yml`. It holds tokens, so
//! it is written with mode 0600 (through a temporary file renamed over it) and its directory
//! with 0700.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The server when nothing else names one: `wrangler dev`'s default address.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8787";

/// The profile used when none is named and the file has no `current`.
pub const DEFAULT_PROFILE: &str = "default";

/// The whole file.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFile {
    /// The profile used when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
    /// Seed 001's flat form (`server:` at the top); read as the `default` profile's server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// One profile.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// Server base URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Bearer token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Where a resolved value came from (shown by `wuhu whoami`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A command-line flag.
    Flag,
    /// `WUHU_SERVER` / `WUHU_TOKEN`.
    Env,
    /// The profile in the config file.
    Profile,
    /// The built-in default.
    Default,
}

/// What a command talks to.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The profile consulted.
    pub profile: String,
    /// Server base URL.
    pub server: String,
    /// Where `server` came from.
    pub server_source: Source,
    /// Bearer token, if any.
    pub token: Option<String>,
    /// Where `token` came from (`Default` when there is none).
    pub token_source: Source,
}

/// The inputs of resolution (kept apart from the process so it can be tested as a table).
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// `--server`.
    pub server_flag: Option<String>,
    /// `--token`.
    pub token_flag: Option<String>,
    /// `--profile`.
    pub profile_flag: Option<String>,
    /// `WUHU_SERVER`.
    pub server_env: Option<String>,
    /// `WUHU_TOKEN`.
    pub token_env: Option<String>,
    /// `WUHU_PROFILE`.
    pub profile_env: Option<String>,
}

impl Inputs {
    /// Flags as given; the environment from the process (empty values count as unset).
    pub fn from_env(
        server: Option<String>,
        token: Option<String>,
        profile: Option<String>,
    ) -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Inputs {
            server_flag: server,
            token_flag: token,
            profile_flag: profile,
            server_env: var("WUHU_SERVER"),
            token_env: var("WUHU_TOKEN"),
            profile_env: var("WUHU_PROFILE"),
        }
    }
}

impl ConfigFile {
    /// The profile a command uses.
    pub fn profile_name(&self, inputs: &Inputs) -> String {
        inputs
            .profile_flag
            .clone()
            .or_else(|| inputs.profile_env.clone())
            .or_else(|| self.current.clone())
            .unwrap_or_else(|| DEFAULT_PROFILE.to_string())
    }

    /// Applies the resolution order (module docs).
    pub fn resolve(&self, inputs: &Inputs) -> Resolved {
        let profile_name = self.profile_name(inputs);
        let profile = self.profiles.get(&profile_name);
        let flat_server = (profile_name == DEFAULT_PROFILE)
            .then(|| self.server.clone())
            .flatten();
        let (server, server_source) = if let Some(s) = &inputs.server_flag {
            (s.clone(), Source::Flag)
        } else if let Some(s) = &inputs.server_env {
            (s.clone(), Source::Env)
        } else if let Some(s) = profile.and_then(|p| p.server.clone()).or(flat_server) {
            (s, Source::Profile)
        } else {
            (DEFAULT_SERVER.to_string(), Source::Default)
        };
        let (token, token_source) = if let Some(t) = &inputs.token_flag {
            (Some(t.clone()), Source::Flag)
        } else if let Some(t) = &inputs.token_env {
            (Some(t.clone()), Source::Env)
        } else if let Some(t) = profile.and_then(|p| p.token.clone()) {
            (Some(t), Source::Profile)
        } else {
            (None, Source::Default)
        };
        Resolved {
            profile: profile_name,
            server,
            server_source,
            token,
            token_source,
        }
    }
}

/// `$WUHU_CONFIG`, else `$HOME/.wuhu/client.yml`.
///
/// # Errors
/// Neither variable is set.
pub fn config_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("WUHU_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("HOME is not set; set WUHU_CONFIG to the config file's path")?;
    Ok(Path::new(&home).join(".wuhu").join("client.yml"))
}

/// Reads the file; a missing file is an empty configuration.
///
/// # Errors
/// The file exists but cannot be read or parsed.
pub fn load(path: &Path) -> Result<ConfigFile> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(ConfigFile::default()),
        Ok(text) => serde_norway::from_str(&text)
            .with_context(|| format!("cannot parse {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Writes the file with mode 0600 (its directory 0700 when created here).
///
/// # Errors
/// The directory or file cannot be written.
pub fn save(path: &Path, config: &ConfigFile) -> Result<()> {
    let text = serde_norway::to_string(config).context("cannot encode the config")?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        set_mode(dir, 0o700)?;
    }
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    write_private(&tmp, text.as_bytes())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Created 0600 from the start: the token is never readable by others, not even briefly.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> ConfigFile {
        serde_norway::from_str(
            "current: work\nprofiles:\n  work:\n    server: https://work\n    token: tw\n  default:\n    server: https://home\n",
        )
        .unwrap()
    }

    fn inputs(
        flags: (Option<&str>, Option<&str>, Option<&str>),
        env: (Option<&str>, Option<&str>, Option<&str>),
    ) -> Inputs {
        let s = |v: Option<&str>| v.map(str::to_string);
        Inputs {
            server_flag: s(flags.0),
            token_flag: s(flags.1),
            profile_flag: s(flags.2),
            server_env: s(env.0),
            token_env: s(env.1),
            profile_env: s(env.2),
        }
    }

    #[test]
    fn flag_then_env_then_profile_then_default() {
        let config = file();
        /// Profile, server, its source, token, its source.
        type Want<'a> = (&'a str, &'a str, Source, Option<&'a str>, Source);
        let table: &[(Inputs, Want<'_>)] = &[
            (
                inputs((None, None, None), (None, None, None)),
                (
                    "work",
                    "https://work",
                    Source::Profile,
                    Some("tw"),
                    Source::Profile,
                ),
            ),
            (
                inputs((None, None, None), (Some("https://env"), Some("te"), None)),
                ("work", "https://env", Source::Env, Some("te"), Source::Env),
            ),
            (
                inputs(
                    (Some("https://flag"), Some("tf"), None),
                    (Some("https://env"), Some("te"), None),
                ),
                (
                    "work",
                    "https://flag",
                    Source::Flag,
                    Some("tf"),
                    Source::Flag,
                ),
            ),
            (
                inputs((None, None, Some("default")), (None, None, Some("work"))),
                (
                    "default",
                    "https://home",
                    Source::Profile,
                    None,
                    Source::Default,
                ),
            ),
            (
                inputs((None, None, None), (None, None, Some("nope"))),
                (
                    "nope",
                    DEFAULT_SERVER,
                    Source::Default,
                    None,
                    Source::Default,
                ),
            ),
        ];
        for (i, (inputs, want)) in table.iter().enumerate() {
            let got = config.resolve(inputs);
            assert_eq!(
                (
                    got.profile.as_str(),
                    got.server.as_str(),
                    got.server_source,
                    got.token.as_deref(),
                    got.token_source
                ),
                *want,
                "row {i}"
            );
        }
    }

    #[test]
    fn seed_001_flat_server_is_the_default_profile() {
        let config: ConfigFile =
            serde_norway::from_str("server: http://127.0.0.1:5530\nusername: alice@mac\n").unwrap();
        let got = config.resolve(&Inputs::default());
        assert_eq!(got.server, "http://127.0.0.1:5530");
        assert_eq!(got.server_source, Source::Profile);
    }

    #[cfg(unix)]
    #[test]
    fn saved_files_are_private_and_round_trip() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("wuhu-cli-config-{}", std::process::id()));
        let path = dir.join("nested").join("client.yml");
        save(&path, &file()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(load(&path).unwrap(), file());
        assert_eq!(
            load(&dir.join("absent.yml")).unwrap(),
            ConfigFile::default()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
