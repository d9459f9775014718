//! Cells: what a session's commands and file tools may reach on a runner (issue 30, decision
//! 0023). The runner performs these rules (Linux: namespaces, Landlock, seccomp, resource limits;
//! macOS: a Seatbelt profile from [`seatbelt::profile`]); everything with meaning is here, sans IO.
//!
//! A cell is made for every `bash` call, background job and file tool of a session in an
//! environment. It may
//! * read and write the environment's root, the call's temp dir (`TMPDIR`, and `/tmp` on
//!   Linux), the session's own home on the runner (`HOME`), and a worktree's git directory;
//! * read (and run) the system: [`system_read_only`], `/etc` without the entries that hold
//!   secrets ([`etc_grants`]), the paths a definition lists in `readOnlyPaths`
//!   ([`check_read_only_path`]), and the session's own logs (full outputs, job logs);
//! * nothing else: not `$HOME`, not the runner's config, key, logs or state ([`Protected`]), not
//!   other sessions' workspaces.
//!
//! Its network is [`network::Network`]; its resource limits are [`CellLimits`] (defaults, which a
//! definition's `limits` may change within [`CellLimits::MAX`]).

pub mod network;
pub mod seatbelt;
pub mod uids;

use serde::{Deserialize, Serialize};

use crate::wire::environment_kind::EnvironmentKind;
pub use network::Network;

/// Most `readOnlyPaths` a definition may list.
pub const MAX_READ_ONLY_PATHS: usize = 64;

/// What a definition says about its cell: carried in the attach spec and in every call's
/// environment context (the runner keeps no state), so the cell of a call is the cell its
/// definition asked for when it was attached.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CellSettings {
    /// The cell's network; absent: [`Network::default_for`] the runner and environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// More directories (or files) the cell may read and run: toolchains outside the system
    /// directories (`/opt/rust`, `/home/ana/.rustup`). Absolute; never one holding the
    /// runner's own files ([`check_read_only_path`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_paths: Vec<String>,
    /// Resource limits that differ from the defaults.
    #[serde(default, skip_serializing_if = "LimitOverrides::is_empty")]
    pub limits: LimitOverrides,
}

impl CellSettings {
    /// Whether nothing differs from the defaults (then it is left out of the wire).
    pub fn is_default(&self) -> bool {
        *self == CellSettings::default()
    }

    /// Checks a definition's cell settings.
    ///
    /// # Errors
    /// A message for a 400 naming the first bad field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(network) = &self.network {
            network.validate()?;
        }
        if self.read_only_paths.len() > MAX_READ_ONLY_PATHS {
            return Err(format!(
                "readOnlyPaths lists at most {MAX_READ_ONLY_PATHS} paths"
            ));
        }
        for path in &self.read_only_paths {
            check_path_syntax("readOnlyPaths entry", path)?;
        }
        CellLimits::DEFAULT.with(&self.limits).map(|_| ())
    }
}

/// A definition's `limits`: each absent field keeps its default ([`CellLimits::DEFAULT`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitOverrides {
    /// Processes (and threads) the cell may have at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// Open files per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Largest file a process may write, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// CPU seconds per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
}

impl LimitOverrides {
    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        *self == LimitOverrides::default()
    }
}

/// The resource limits of a cell (Linux: `RLIMIT_NPROC`, `RLIMIT_NOFILE`, `RLIMIT_FSIZE`,
/// `RLIMIT_CPU`, soft and hard; macOS: the same limits, by `ulimit` before the command).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CellLimits {
    /// Processes (and threads) at once. On Linux the count is per cell (each cell has its own
    /// user namespace), except for a runner that runs cells as root: the kernel exempts uid 0.
    pub processes: u64,
    /// Open files per process.
    pub open_files: u64,
    /// Largest file a process may write, in bytes: writing past it fails (`EFBIG`, `SIGXFSZ`).
    pub file_size_bytes: u64,
    /// CPU seconds per process; a process over it is killed (`SIGXCPU`, then `SIGKILL`).
    pub cpu_seconds: u64,
}

impl CellLimits {
    /// The limits of a cell whose definition names none.
    pub const DEFAULT: CellLimits = CellLimits {
        processes: 1024,
        open_files: 4096,
        file_size_bytes: 16 << 30,
        cpu_seconds: 3600,
    };
    /// The smallest a definition may set.
    pub const MIN: CellLimits = CellLimits {
        processes: 16,
        open_files: 64,
        file_size_bytes: 1 << 20,
        cpu_seconds: 1,
    };
    /// The largest a definition may set.
    pub const MAX: CellLimits = CellLimits {
        processes: 16_384,
        open_files: 1 << 20,
        file_size_bytes: 1 << 40,
        cpu_seconds: 7 * 86_400,
    };

    /// These limits with a definition's overrides.
    ///
    /// # Errors
    /// A message naming a field outside [`CellLimits::MIN`]..=[`CellLimits::MAX`].
    pub fn with(self, overrides: &LimitOverrides) -> Result<CellLimits, String> {
        let pick = |field: &str, value: Option<u64>, default: u64, min: u64, max: u64| match value {
            None => Ok(default),
            Some(v) if (min..=max).contains(&v) => Ok(v),
            Some(v) => Err(format!("limits.{field} is {v}; it must be {min} to {max}")),
        };
        Ok(CellLimits {
            processes: pick(
                "processes",
                overrides.processes,
                self.processes,
                Self::MIN.processes,
                Self::MAX.processes,
            )?,
            open_files: pick(
                "openFiles",
                overrides.open_files,
                self.open_files,
                Self::MIN.open_files,
                Self::MAX.open_files,
            )?,
            file_size_bytes: pick(
                "fileSizeBytes",
                overrides.file_size_bytes,
                self.file_size_bytes,
                Self::MIN.file_size_bytes,
                Self::MAX.file_size_bytes,
            )?,
            cpu_seconds: pick(
                "cpuSeconds",
                overrides.cpu_seconds,
                self.cpu_seconds,
                Self::MIN.cpu_seconds,
                Self::MAX.cpu_seconds,
            )?,
        })
    }
}

/// The operating system a cell is made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Os {
    /// Linux: namespaces, Landlock, seccomp.
    Linux,
    /// macOS: Seatbelt.
    MacOs,
}

/// The system directories every cell may read and run (those that exist on the machine).
pub fn system_read_only(os: Os) -> &'static [&'static str] {
    match os {
        Os::Linux => &[
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            // glibc's and Python's CPU count.
            "/sys/devices/system/cpu",
        ],
        Os::MacOs => &[
            "/usr",
            "/bin",
            "/sbin",
            "/System",
            "/Library/Developer/CommandLineTools",
            "/Library/Frameworks",
            "/Library/Preferences/SystemConfiguration",
            "/Applications/Xcode.app",
            "/opt/homebrew",
            "/private/var/db/timezone",
            "/private/var/db/dyld",
        ],
    }
}

/// Device files every cell may read and write.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// The system's configuration directory on `os`.
pub fn etc_dir(os: Os) -> &'static str {
    match os {
        Os::Linux => "/etc",
        Os::MacOs => "/private/etc",
    }
}

/// Entries below `/etc` that hold secrets: a cell never reads them (`*` stands for any part of
/// one name).
pub const ETC_SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "master.passwd",
    "sudoers",
    "sudoers.d",
    "ssh/ssh_host_*_key",
    "ssl/private",
    "pki/tls/private",
    "security/opasswd",
    "krb5.keytab",
    "NetworkManager/system-connections",
    "wireguard",
    "openvpn",
    "credstore",
    "credstore.encrypted",
    "wuhu",
];

/// The directories (below `/etc`) whose entries the runner lists for [`etc_grants`]: `/etc`
/// itself and every directory on the way to a secret.
pub fn etc_dirs_to_list(os: Os) -> Vec<String> {
    let etc = etc_dir(os);
    let mut dirs = vec![etc.to_string()];
    for secret in ETC_SECRETS {
        let mut parts: Vec<&str> = secret.split('/').collect();
        parts.pop();
        for depth in 1..=parts.len() {
            let dir = format!("{etc}/{}", parts[..depth].join("/"));
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// One entry of a listed directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedEntry {
    /// Its name.
    pub name: String,
    /// Where it leads when it is a symbolic link (canonical), else `None`.
    pub link_target: Option<String>,
}

/// What of `/etc` a cell may read, from the listings of [`etc_dirs_to_list`] (a directory the
/// runner could not list is `None` and grants nothing below it): every entry except those on
/// the way to a secret, which are opened up one level further, and the secrets themselves; plus
/// the targets of granted symbolic links (`/etc/resolv.conf` →
/// `/run/systemd/resolve/stub-resolv.conf`) that hold no runner file.
pub fn etc_grants(
    os: Os,
    listing: &dyn Fn(&str) -> Option<Vec<ListedEntry>>,
    protected: &[Protected],
) -> Vec<String> {
    fn walk(
        dir: &str,
        rel: &str,
        listing: &dyn Fn(&str) -> Option<Vec<ListedEntry>>,
        protected: &[Protected],
        out: &mut Vec<String>,
    ) {
        let Some(entries) = listing(dir) else {
            return;
        };
        for entry in entries {
            let rel_entry = if rel.is_empty() {
                entry.name.clone()
            } else {
                format!("{rel}/{}", entry.name)
            };
            if ETC_SECRETS.iter().any(|s| glob_matches(s, &rel_entry)) {
                continue;
            }
            let path = format!("{dir}/{}", entry.name);
            let leads_to_secret = ETC_SECRETS
                .iter()
                .any(|s| s.starts_with(&format!("{rel_entry}/")));
            if leads_to_secret {
                walk(&path, &rel_entry, listing, protected, out);
                continue;
            }
            out.push(path);
            if let Some(target) = entry.link_target
                && target.starts_with('/')
                && check_read_only_path(&target, protected).is_ok()
            {
                out.push(target);
            }
        }
    }
    let mut out = Vec::new();
    walk(etc_dir(os), "", listing, protected, &mut out);
    out
}

/// `pattern` (one `*` at most per name) matches `text` name by name.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let (mut p, mut t) = (pattern.split('/'), text.split('/'));
    loop {
        match (p.next(), t.next()) {
            (None, None) => return true,
            (Some(p), Some(t)) => {
                let ok = match p.split_once('*') {
                    None => p == t,
                    Some((head, tail)) => {
                        t.len() >= head.len() + tail.len()
                            && t.starts_with(head)
                            && t.ends_with(tail)
                    }
                };
                if !ok {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// A path of the runner's own that no cell may reach: its config file, key, runtime and log
/// directories, the store's credential files, the workspaces root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protected {
    /// Absolute, normalised.
    pub path: String,
    /// What it is, for messages (`the runner's config file`).
    pub what: String,
    /// Whether an environment root may lie strictly inside it (the workspaces root: each
    /// session's copy is a directory in it, the root itself is every session's).
    pub holds_roots: bool,
}

impl Protected {
    /// A protected path.
    pub fn new(path: impl Into<String>, what: impl Into<String>) -> Protected {
        Protected {
            path: normalize(&path.into()),
            what: what.into(),
            holds_roots: false,
        }
    }

    /// The workspaces root: environment roots lie inside it.
    pub fn holding_roots(mut self) -> Protected {
        self.holds_roots = true;
        self
    }
}

/// Whether a file holding the runner's secrets (its token, its store's keys) is private enough
/// to read: no permission bit for group or others (`0600`, `0400`).
///
/// # Errors
/// Why not, with the command that fixes it; the runner refuses to start.
pub fn check_secret_file_mode(path: &str, what: &str, mode: u32) -> Result<(), String> {
    if mode & 0o077 == 0 {
        return Ok(());
    }
    Err(format!(
        "{path} holds {what} but other users may read or change it (mode {:04o}); run: chmod 600 {path}",
        mode & 0o7777
    ))
}

/// Whether `path` is `base` or lies below it (both absolute and normalised).
pub fn is_within(path: &str, base: &str) -> bool {
    if base == "/" {
        return path.starts_with('/');
    }
    path == base || (path.starts_with(base) && path.as_bytes().get(base.len()) == Some(&b'/'))
}

/// `.` removed and `..` resolved lexically, no trailing `/` (`/` stays `/`).
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

fn check_path_syntax(field: &str, path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!(
            "{field} {path:?} must be an absolute path (starting with /)"
        ));
    }
    if path.len() > crate::wire::MAX_PATH_BYTES {
        return Err(format!(
            "{field} exceeds {} bytes",
            crate::wire::MAX_PATH_BYTES
        ));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("{field} {path:?} must not contain .."));
    }
    Ok(())
}

/// Whether a definition's read-only path may be granted: absolute, and neither holding nor
/// inside a [`Protected`] path (`/` and `$HOME` hold the runner's config; a workspaces root
/// holds every session's workspace).
///
/// # Errors
/// Why not, naming the protected path.
pub fn check_read_only_path(path: &str, protected: &[Protected]) -> Result<(), String> {
    check_path_syntax("read-only path", path)?;
    let path = normalize(path);
    for p in protected {
        if is_within(&p.path, &path) || is_within(&path, &p.path) {
            return Err(format!(
                "read-only path {path} {} {} ({})",
                if is_within(&p.path, &path) {
                    "holds"
                } else {
                    "is inside"
                },
                p.what,
                p.path
            ));
        }
    }
    Ok(())
}

/// Whether an environment root (or a worktree's git directory) may be a cell's read-write
/// root: it holds no [`Protected`] path and lies in none, except strictly inside one that
/// [holds roots](Protected::holds_roots).
///
/// # Errors
/// Why not, naming the protected path.
pub fn check_root(root: &str, protected: &[Protected]) -> Result<(), String> {
    let root = normalize(root);
    for p in protected {
        if is_within(&p.path, &root) {
            return Err(format!(
                "the environment root {root} holds {} ({}); a cell could read it. Offer a directory that does not contain it",
                p.what, p.path
            ));
        }
        if is_within(&root, &p.path) && !p.holds_roots {
            return Err(format!(
                "the environment root {root} is inside {} ({})",
                p.what, p.path
            ));
        }
    }
    Ok(())
}

/// The facts a cell is made from; the runner gathers them.
#[derive(Clone, Debug)]
pub struct CellFacts<'a> {
    /// The machine's OS.
    pub os: Os,
    /// The environment's kind.
    pub kind: EnvironmentKind,
    /// Whether the runner is a cloud runner (decides the default network).
    pub cloud_runner: bool,
    /// The environment root (canonical).
    pub root: &'a str,
    /// A worktree's git directory (`<repo>/.git`, canonical): commits write to it.
    pub git_dir: Option<&'a str>,
    /// The call's temp dir (canonical).
    pub temp_dir: &'a str,
    /// The session's logs on this runner (full outputs, job logs): read-only.
    pub session_logs: Option<&'a str>,
    /// The session's own home on this runner (`HOME` in the cell: the runner's home is not
    /// the cell's), kept across its calls: read-write.
    pub home: Option<&'a str>,
    /// The definition's settings.
    pub settings: &'a CellSettings,
    /// The runner's own paths.
    pub protected: &'a [Protected],
    /// What of `/etc` is granted ([`etc_grants`]).
    pub etc: &'a [String],
}

/// What a cell may reach, ready for the runner to enforce.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CellPolicy {
    /// Read, write, create, delete and run below these.
    pub read_write: Vec<String>,
    /// Read and run below these.
    pub read_only: Vec<String>,
    /// Device files to read and write.
    pub devices: Vec<String>,
    /// The call's temp dir (also `/tmp` on Linux).
    pub temp_dir: String,
    /// The network.
    pub network: Network,
    /// The resource limits.
    pub limits: CellLimits,
    /// Read-only paths of the definition that were not granted, with why (the runner tells
    /// the session in the call's output once).
    pub refused: Vec<String>,
}

/// The policy of a cell.
///
/// # Errors
/// When the root (or a worktree's git directory) holds or lies in a runner path
/// ([`check_root`]), or the definition's limits are out of bounds: the call is refused, unrun.
pub fn cell_policy(facts: &CellFacts<'_>) -> Result<CellPolicy, String> {
    check_root(facts.root, facts.protected)?;
    let mut read_write = vec![normalize(facts.root), normalize(facts.temp_dir)];
    if let Some(home) = facts.home {
        read_write.push(normalize(home));
    }
    if let Some(git_dir) = facts.git_dir {
        check_root(git_dir, facts.protected)?;
        read_write.push(normalize(git_dir));
    }
    let mut read_only: Vec<String> = system_read_only(facts.os)
        .iter()
        .map(|p| p.to_string())
        .collect();
    read_only.extend(facts.etc.iter().cloned());
    if let Some(logs) = facts.session_logs {
        read_only.push(normalize(logs));
    }
    let mut refused = Vec::new();
    for path in &facts.settings.read_only_paths {
        match check_read_only_path(path, facts.protected) {
            Ok(()) => read_only.push(normalize(path)),
            Err(why) => refused.push(why),
        }
    }
    read_only.sort();
    read_only.dedup();
    let network = facts.settings.network.clone().unwrap_or_else(|| {
        Network::default_for(facts.cloud_runner, facts.kind == EnvironmentKind::Local)
    });
    Ok(CellPolicy {
        read_write,
        read_only,
        devices: DEVICES.iter().map(|d| d.to_string()).collect(),
        temp_dir: normalize(facts.temp_dir),
        network,
        limits: CellLimits::DEFAULT.with(&facts.settings.limits)?,
        refused,
    })
}

/// What a cell may do with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and write.
    ReadWrite,
    /// Read only.
    ReadOnly,
    /// Nothing.
    None,
}

impl CellPolicy {
    /// What the cell may do with `path` (absolute, normalised), by the lists alone: the file
    /// tools check a path with this before they open it (the kernel checks again).
    pub fn access(&self, path: &str) -> Access {
        if self.read_write.iter().any(|base| is_within(path, base)) {
            Access::ReadWrite
        } else if self.read_only.iter().any(|base| is_within(path, base))
            || self.devices.iter().any(|d| d == path)
        {
            Access::ReadOnly
        } else {
            Access::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protected() -> Vec<Protected> {
        vec![
            Protected::new("/home/ana/.wuhu/runner.yml", "the runner's config file"),
            Protected::new("/home/ana/.wuhu/run", "the runner's runtime directory"),
            Protected::new("/home/ana/.wuhu/workspaces", "the workspaces root").holding_roots(),
            Protected::new("/home/ana/.aws/credentials", "the store's credentials"),
        ]
    }

    #[test]
    fn read_only_paths_never_reach_the_runners_files() {
        let cases: &[(&str, Result<(), &str>)] = &[
            ("/opt/rust", Ok(())),
            ("/home/ana/.rustup", Ok(())),
            ("/home/ana/.wuhu/bin", Ok(())),
            ("/", Err("holds the runner's config file")),
            ("/home", Err("holds")),
            ("/home/ana", Err("holds")),
            ("/home/ana/.wuhu", Err("holds")),
            ("/home/ana/.wuhu/runner.yml", Err("holds")),
            (
                "/home/ana/.wuhu/run/sessions",
                Err("is inside the runner's runtime"),
            ),
            (
                "/home/ana/.wuhu/workspaces",
                Err("holds the workspaces root"),
            ),
            // Another session's workspace.
            (
                "/home/ana/.wuhu/workspaces/other",
                Err("is inside the workspaces root"),
            ),
            ("/home/ana/.aws", Err("holds the store's credentials")),
            ("relative", Err("absolute")),
            ("/opt/../home/ana", Err("must not contain ..")),
        ];
        for (path, want) in cases {
            let got = check_read_only_path(path, &protected());
            match want {
                Ok(()) => assert_eq!(got, Ok(()), "{path}"),
                Err(part) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(part)),
                    "{path}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn roots_hold_no_runner_file_and_lie_in_none_but_the_workspaces_root() {
        let cases: &[(&str, bool)] = &[
            ("/home/ana/src/api", true),
            ("/home/ana/.wuhu/workspaces/5b1c", true),
            ("/home/ana/.wuhu/workspaces", false),
            ("/home/ana", false),
            ("/home/ana/.wuhu", false),
            ("/home/ana/.wuhu/run/x", false),
            ("/", false),
        ];
        for (root, ok) in cases {
            assert_eq!(check_root(root, &protected()).is_ok(), *ok, "{root}");
        }
    }

    #[test]
    fn etc_keeps_its_secrets() {
        let listing = |dir: &str| -> Option<Vec<ListedEntry>> {
            let names: &[&str] = match dir {
                "/etc" => &[
                    "passwd",
                    "shadow",
                    "gshadow",
                    "ssh",
                    "ssl",
                    "hosts",
                    "resolv.conf",
                    "sudoers.d",
                    "wuhu",
                    "pki",
                ],
                "/etc/ssh" => &[
                    "ssh_config",
                    "ssh_host_ed25519_key",
                    "ssh_host_ed25519_key.pub",
                    "ssh_host_rsa_key",
                ],
                "/etc/ssl" => &["certs", "private", "openssl.cnf"],
                // The runner could not list /etc/pki: nothing below it.
                _ => return None,
            };
            Some(
                names
                    .iter()
                    .map(|n| ListedEntry {
                        name: n.to_string(),
                        link_target: match *n {
                            "resolv.conf" => {
                                Some(String::from("/run/systemd/resolve/stub-resolv.conf"))
                            }
                            "hosts" => Some(String::from("/home/ana/.wuhu/run/hosts")),
                            _ => None,
                        },
                    })
                    .collect(),
            )
        };
        let got = etc_grants(Os::Linux, &listing, &protected());
        assert_eq!(
            got,
            [
                "/etc/passwd",
                "/etc/ssh/ssh_config",
                "/etc/ssh/ssh_host_ed25519_key.pub",
                "/etc/ssl/certs",
                "/etc/ssl/openssl.cnf",
                // A link into the runner's files grants only the link.
                "/etc/hosts",
                "/etc/resolv.conf",
                "/run/systemd/resolve/stub-resolv.conf",
            ]
        );
        let dirs = etc_dirs_to_list(Os::Linux);
        for dir in [
            "/etc",
            "/etc/ssh",
            "/etc/ssl",
            "/etc/pki",
            "/etc/pki/tls",
            "/etc/security",
        ] {
            assert!(dirs.contains(&dir.to_string()), "{dir}: {dirs:?}");
        }
        assert_eq!(etc_dirs_to_list(Os::MacOs)[0], "/private/etc");
    }

    #[test]
    fn a_cell_is_its_root_its_temp_dir_and_the_system() {
        let settings = CellSettings {
            network: None,
            read_only_paths: vec![String::from("/opt/rust"), String::from("/home/ana")],
            limits: LimitOverrides {
                processes: Some(64),
                ..LimitOverrides::default()
            },
        };
        let facts = CellFacts {
            os: Os::Linux,
            kind: EnvironmentKind::FolderTemplate,
            cloud_runner: true,
            root: "/home/ana/.wuhu/workspaces/5b1c",
            git_dir: None,
            temp_dir: "/home/ana/.wuhu/run/calls/call-1",
            session_logs: Some("/home/ana/.wuhu/run/logs/sessions/5b1c"),
            home: None,
            settings: &settings,
            protected: &protected(),
            etc: &[String::from("/etc/passwd")],
        };
        let policy = cell_policy(&facts).unwrap();
        assert_eq!(
            policy.read_write,
            [
                "/home/ana/.wuhu/workspaces/5b1c",
                "/home/ana/.wuhu/run/calls/call-1"
            ]
        );
        assert!(policy.read_only.contains(&String::from("/opt/rust")));
        assert!(policy.read_only.contains(&String::from("/etc/passwd")));
        assert_eq!(policy.refused.len(), 1, "{:?}", policy.refused);
        assert!(
            policy.refused[0].contains("/home/ana holds"),
            "{:?}",
            policy.refused
        );
        assert_eq!(policy.limits.processes, 64);
        assert_eq!(policy.limits.open_files, CellLimits::DEFAULT.open_files);
        assert!(matches!(policy.network, Network::Allow(_)));
        let cases: &[(&str, Access)] = &[
            (
                "/home/ana/.wuhu/workspaces/5b1c/src/main.rs",
                Access::ReadWrite,
            ),
            ("/home/ana/.wuhu/workspaces/5b1c2", Access::None),
            ("/home/ana/.wuhu/workspaces/other/secret", Access::None),
            ("/home/ana/.wuhu/runner.yml", Access::None),
            ("/home/ana/.ssh/id_ed25519", Access::None),
            ("/usr/bin/env", Access::ReadOnly),
            ("/etc/passwd", Access::ReadOnly),
            ("/etc/shadow", Access::None),
            ("/dev/null", Access::ReadOnly),
            (
                "/home/ana/.wuhu/run/logs/sessions/5b1c/jobs/j.log",
                Access::ReadOnly,
            ),
            (
                "/home/ana/.wuhu/run/logs/sessions/other/jobs/j.log",
                Access::None,
            ),
        ];
        for (path, want) in cases {
            assert_eq!(policy.access(path), *want, "{path}");
        }
        // A local environment on a person's machine is open; a root holding the runner's files
        // is refused.
        let local = CellFacts {
            kind: EnvironmentKind::Local,
            cloud_runner: false,
            root: "/home/ana/src/api",
            ..facts.clone()
        };
        assert_eq!(cell_policy(&local).unwrap().network, Network::Open);
        let home = CellFacts {
            root: "/home/ana",
            ..facts.clone()
        };
        assert!(
            cell_policy(&home)
                .unwrap_err()
                .contains("holds the runner's config file")
        );
    }

    #[test]
    fn limits_have_defaults_and_bounds() {
        let ok = LimitOverrides {
            processes: Some(16),
            open_files: Some(1 << 20),
            file_size_bytes: Some(1 << 20),
            cpu_seconds: None,
        };
        let limits = CellLimits::DEFAULT.with(&ok).unwrap();
        assert_eq!(limits.cpu_seconds, CellLimits::DEFAULT.cpu_seconds);
        for (bad, field) in [
            (
                LimitOverrides {
                    processes: Some(15),
                    ..LimitOverrides::default()
                },
                "processes",
            ),
            (
                LimitOverrides {
                    open_files: Some((1 << 20) + 1),
                    ..LimitOverrides::default()
                },
                "openFiles",
            ),
            (
                LimitOverrides {
                    file_size_bytes: Some(0),
                    ..LimitOverrides::default()
                },
                "fileSizeBytes",
            ),
            (
                LimitOverrides {
                    cpu_seconds: Some(0),
                    ..LimitOverrides::default()
                },
                "cpuSeconds",
            ),
        ] {
            let err = CellLimits::DEFAULT.with(&bad).unwrap_err();
            assert!(err.contains(field), "{err}");
        }
        let json = r#"{"network":{"allow":["github.com"]},"readOnlyPaths":["/opt/rust"],"limits":{"processes":64}}"#;
        let settings: CellSettings = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&settings).unwrap(), json);
        assert!(settings.validate().is_ok());
        assert!(serde_json::from_str::<CellSettings>(r#"{"limits":{"memory":1}}"#).is_err());
        let bad = CellSettings {
            read_only_paths: vec![String::from("opt")],
            ..CellSettings::default()
        };
        assert!(bad.validate().is_err());
        assert!(CellSettings::default().is_default());
    }

    #[test]
    fn secret_files_are_for_their_owner_alone() {
        let cases = [
            (0o100600, true),
            (0o100400, true),
            (0o100700, true),
            (0o100640, false),
            (0o100644, false),
            (0o100604, false),
            (0o100660, false),
            (0o100666, false),
        ];
        for (mode, ok) in cases {
            let got = check_secret_file_mode("/h/.wuhu/runner.yml", "the runner token", mode);
            assert_eq!(got.is_ok(), ok, "{mode:o}");
            if let Err(e) = got {
                assert!(e.contains("chmod 600 /h/.wuhu/runner.yml"), "{e}");
                assert!(e.contains(&format!("mode {:04o}", mode & 0o7777)), "{e}");
            }
        }
    }

    #[test]
    fn paths_normalise_and_nest() {
        assert_eq!(normalize("/a/./b/../c/"), "/a/c");
        assert_eq!(normalize("/../.."), "/");
        assert!(is_within("/a/b", "/a"));
        assert!(is_within("/a", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert!(is_within("/x", "/"));
        assert!(glob_matches("ssh/ssh_host_*_key", "ssh/ssh_host_rsa_key"));
        assert!(!glob_matches(
            "ssh/ssh_host_*_key",
            "ssh/ssh_host_rsa_key.pub"
        ));
        assert!(!glob_matches("ssh/ssh_host_*_key", "ssh"));
    }
}
