//! `wuhu-runner service install | uninstall | status`: keeps `wuhu-runner register` running as a
//! service of the machine's own manager.
//!
//! * macOS: a launchd agent of the user, `~/Library/LaunchAgents/dev.wuhu.runner.plist`, logs in
//!   `~/Library/Logs/wuhu-runner.log`.
//! * Linux: a systemd user unit, `~/.config/systemd/user/wuhu-runner.service`, or with `--system`
//!   a system unit, `/etc/systemd/system/wuhu-runner.service`, running as `--run-as USER`; logs
//!   in the journal.
//!
//! The service starts the binary that installed it (its own absolute path) with `register` and
//! the flags given to `install`. The token is never on that command line (it would show in `ps`
//! and in the unit file): `install` writes it to a file only its user can read (mode 0600:
//! `~/.wuhu/runner.token`, or `/etc/wuhu/runner.token` for a system unit) and the service reads
//! it with `--token-file`. `PATH` holds Homebrew's and the usual per-user tool directories
//! (launchd and systemd start services with a bare one, so `git` or `node` from Homebrew would
//! be missing), or what `--path` says.
//!
//! This module decides without I/O: where the files go ([`Layout`]), what they hold
//! ([`launchd_plist`], [`systemd_unit`]) and which commands load, reload and unload them
//! ([`Plan`]). [`system`] performs a plan and reads the status.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub mod system;

/// The launchd label and plist name (`dev.wuhu.runner.plist`).
pub const LAUNCHD_LABEL: &str = "dev.wuhu.runner";
/// The systemd unit name.
pub const SYSTEMD_UNIT: &str = "wuhu-runner.service";
/// How long the service manager waits after SIGTERM before SIGKILL: the runner saves held cloud
/// workspaces before it exits, for at most 120 s (`EXIT_SAVE_LIMIT` in main.rs).
pub const STOP_TIMEOUT_SECONDS: u32 = 150;
/// The runner's exit code when the server refuses its token or the runner: restarting would
/// only be refused again.
pub const REFUSED_EXIT_CODE: u8 = 2;

/// Which service manager, and for whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A launchd agent of the current user (macOS).
    LaunchdAgent,
    /// A systemd user unit of the current user (Linux).
    SystemdUser,
    /// A systemd system unit (Linux, as root) whose process runs as `run_as`.
    SystemdSystem {
        /// The account the runner runs as (`User=`).
        run_as: String,
    },
}

/// Where a target's files live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The launchd plist or the systemd unit.
    pub service_file: PathBuf,
    /// The token, mode 0600.
    pub token_file: PathBuf,
    /// The log file the service manager writes (launchd); `None` where the journal keeps them.
    pub log_file: Option<PathBuf>,
    /// Directories `install` may create and `uninstall` removes again when they are empty.
    pub created_dirs: Vec<PathBuf>,
}

impl Layout {
    /// The layout of `target` for a user whose home is `home` (the current user's, or for a
    /// system unit the `run_as` account's).
    pub fn new(target: &Target, home: &Path) -> Layout {
        match target {
            Target::LaunchdAgent => Layout {
                service_file: home
                    .join("Library/LaunchAgents")
                    .join(format!("{LAUNCHD_LABEL}.plist")),
                token_file: home.join(".wuhu/runner.token"),
                log_file: Some(home.join("Library/Logs/wuhu-runner.log")),
                created_dirs: vec![home.join(".wuhu")],
            },
            Target::SystemdUser => Layout {
                service_file: home.join(".config/systemd/user").join(SYSTEMD_UNIT),
                token_file: home.join(".wuhu/runner.token"),
                log_file: None,
                created_dirs: vec![
                    home.join(".wuhu"),
                    home.join(".config/systemd/user"),
                    home.join(".config/systemd"),
                ],
            },
            Target::SystemdSystem { .. } => Layout {
                service_file: Path::new("/etc/systemd/system").join(SYSTEMD_UNIT),
                token_file: PathBuf::from("/etc/wuhu/runner.token"),
                log_file: None,
                created_dirs: vec![PathBuf::from("/etc/wuhu")],
            },
        }
    }
}

/// What the service runs, and with what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The runner binary's absolute path.
    pub binary: PathBuf,
    /// The arguments after `register` (the flags given to `install`, without the token), to
    /// which `--token-file` is added.
    pub register_args: Vec<String>,
    /// The service's `PATH`.
    pub path: String,
    /// The home directory of the account the runner runs as: its working directory.
    pub home: PathBuf,
}

/// The default `PATH` of the service: the binary's own directory, the per-user tool directories
/// (`~/.cargo/bin`, `~/.local/bin`), Homebrew's (`/opt/homebrew` on Apple silicon,
/// `/usr/local` on Intel Macs, `/home/linuxbrew/.linuxbrew` on Linux) and the system's.
pub fn default_path(target: &Target, home: &Path, binary: &Path) -> String {
    let mut dirs: Vec<String> = Vec::new();
    if let Some(dir) = binary.parent() {
        dirs.push(dir.display().to_string());
    }
    dirs.push(home.join(".cargo/bin").display().to_string());
    dirs.push(home.join(".local/bin").display().to_string());
    let system: &[&str] = match target {
        Target::LaunchdAgent => &[
            "/opt/homebrew/bin",
            "/opt/homebrew/sbin",
            "/usr/local/bin",
            "/usr/local/sbin",
            "/usr/bin",
            "/bin",
            "/usr/sbin",
            "/sbin",
        ],
        Target::SystemdUser | Target::SystemdSystem { .. } => &[
            "/home/linuxbrew/.linuxbrew/bin",
            "/home/linuxbrew/.linuxbrew/sbin",
            "/usr/local/bin",
            "/usr/local/sbin",
            "/usr/bin",
            "/bin",
            "/usr/sbin",
            "/sbin",
        ],
    };
    dirs.extend(system.iter().map(|d| d.to_string()));
    let mut seen = std::collections::BTreeSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs.join(":")
}

/// A problem with what a service would run.
#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum ServiceError {
    /// A value a service file cannot carry (a control character, or a path that is not valid
    /// UTF-8).
    #[error("{what} {value:?} cannot be put in a service file: {why}")]
    Unrepresentable {
        /// Which value.
        what: String,
        /// The value (never a token: tokens go to the token file).
        value: String,
        /// Why.
        why: &'static str,
    },
}

fn check_text(what: &str, value: &str) -> Result<(), ServiceError> {
    if value.chars().any(char::is_control) {
        return Err(ServiceError::Unrepresentable {
            what: what.to_string(),
            value: value.to_string(),
            why: "it holds a control character (a line break, a tab)",
        });
    }
    Ok(())
}

fn path_text(what: &str, path: &Path) -> Result<String, ServiceError> {
    let text = path.to_str().ok_or_else(|| ServiceError::Unrepresentable {
        what: what.to_string(),
        value: path.display().to_string(),
        why: "it is not valid UTF-8",
    })?;
    check_text(what, text)?;
    Ok(text.to_string())
}

/// The full argument list of the service's process: binary, `register`, the flags, then
/// `--token-file FILE`.
///
/// # Errors
///
/// [`ServiceError::Unrepresentable`] for a control character or a path that is not UTF-8.
pub fn command_line(spec: &ServiceSpec, token_file: &Path) -> Result<Vec<String>, ServiceError> {
    let mut argv = vec![
        path_text("the runner's path", &spec.binary)?,
        "register".into(),
    ];
    for arg in &spec.register_args {
        check_text("the argument", arg)?;
        argv.push(arg.clone());
    }
    argv.push("--token-file".into());
    argv.push(path_text("the token file", token_file)?);
    Ok(argv)
}

/// Escapes text for an XML element's content.
fn xml_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The launchd agent's plist (macOS): runs at log-in, restarted after a failure (not after a
/// clean exit, and at most every 10 s), `PATH` set, stdout and stderr appended to the log file,
/// [`STOP_TIMEOUT_SECONDS`] between SIGTERM and SIGKILL.
///
/// # Errors
///
/// [`ServiceError::Unrepresentable`].
pub fn launchd_plist(spec: &ServiceSpec, layout: &Layout) -> Result<String, ServiceError> {
    let argv = command_line(spec, &layout.token_file)?;
    check_text("PATH", &spec.path)?;
    let home = path_text("the home directory", &spec.home)?;
    let log = match &layout.log_file {
        Some(log) => path_text("the log file", log)?,
        None => String::from("/dev/null"),
    };
    let mut out = String::new();
    out.push_str(concat!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
        "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n",
        "<!-- Written by `wuhu-runner service install`; removed by `wuhu-runner service uninstall`.\n",
        "     The token is in the file after token-file (mode 0600), never here. -->\n",
        "<plist version=\"1.0\">\n<dict>\n",
    ));
    let _ = writeln!(
        out,
        "  <key>Label</key>\n  <string>{LAUNCHD_LABEL}</string>"
    );
    out.push_str("  <key>ProgramArguments</key>\n  <array>\n");
    for arg in &argv {
        let _ = writeln!(out, "    <string>{}</string>", xml_text(arg));
    }
    out.push_str("  </array>\n");
    let _ = writeln!(
        out,
        "  <key>EnvironmentVariables</key>\n  <dict>\n    <key>PATH</key>\n    <string>{}</string>\n  </dict>",
        xml_text(&spec.path)
    );
    let _ = writeln!(
        out,
        "  <key>WorkingDirectory</key>\n  <string>{}</string>",
        xml_text(&home)
    );
    out.push_str("  <key>RunAtLoad</key>\n  <true/>\n");
    out.push_str(
        "  <key>KeepAlive</key>\n  <dict>\n    <key>SuccessfulExit</key>\n    <false/>\n  </dict>\n",
    );
    out.push_str("  <key>ThrottleInterval</key>\n  <integer>10</integer>\n");
    let _ = writeln!(
        out,
        "  <key>ExitTimeOut</key>\n  <integer>{STOP_TIMEOUT_SECONDS}</integer>"
    );
    let _ = writeln!(
        out,
        "  <key>StandardOutPath</key>\n  <string>{log}</string>\n  <key>StandardErrorPath</key>\n  <string>{log}</string>",
        log = xml_text(&log)
    );
    out.push_str("</dict>\n</plist>\n");
    Ok(out)
}

/// Quotes one word of a systemd command line (`ExecStart=`): plain words stay as they are,
/// others go in double quotes with `\` and `"` escaped; `%` (specifiers) and `$` (variables) are
/// doubled, so every byte reaches the process as written.
pub fn systemd_word(word: &str) -> String {
    let escaped = word.replace('%', "%%").replace('$', "$$");
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_.:=,@+-%$".contains(c));
    if plain {
        return escaped;
    }
    let mut out = String::from("\"");
    for c in escaped.chars() {
        if c == '\\' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// One `Environment=` assignment: in double quotes with `\\` and `"` escaped and `%` doubled
/// (`$` means nothing there).
pub fn systemd_assignment(name: &str, value: &str) -> String {
    let mut out = String::from("\"");
    for c in format!("{name}={value}").chars() {
        match c {
            '\\' | '"' => {
                out.push('\\');
                out.push(c);
            }
            '%' => out.push_str("%%"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The systemd unit: started at boot (system) or log-in (user), restarted after a failure
/// except exit code [`REFUSED_EXIT_CODE`] (a refused token), the runner's process group stopped
/// with SIGTERM and [`STOP_TIMEOUT_SECONDS`] to save held workspaces.
///
/// # Errors
///
/// [`ServiceError::Unrepresentable`].
pub fn systemd_unit(
    spec: &ServiceSpec,
    layout: &Layout,
    target: &Target,
) -> Result<String, ServiceError> {
    let argv = command_line(spec, &layout.token_file)?;
    check_text("PATH", &spec.path)?;
    let mut out = String::new();
    out.push_str(concat!(
        "# Written by `wuhu-runner service install`; removed by `wuhu-runner service uninstall`.\n",
        "# The token is in the file after --token-file (mode 0600), never here.\n",
        "[Unit]\n",
        "Description=Wuhu runner (lends environments to Wuhu sessions)\n",
    ));
    if matches!(target, Target::SystemdSystem { .. }) {
        out.push_str("After=network-online.target\nWants=network-online.target\n");
    }
    out.push_str("\n[Service]\nType=exec\n");
    if let Target::SystemdSystem { run_as } = target {
        check_text("--run-as", run_as)?;
        let _ = writeln!(out, "User={run_as}");
    }
    // `~` is the home directory of the service's user, in both kinds of unit.
    out.push_str("WorkingDirectory=~\n");
    let _ = writeln!(
        out,
        "Environment={}",
        systemd_assignment("PATH", &spec.path)
    );
    let words: Vec<String> = argv.iter().map(|a| systemd_word(a)).collect();
    let _ = writeln!(out, "ExecStart={}", words.join(" "));
    let _ = writeln!(
        out,
        "# Exit code {REFUSED_EXIT_CODE}: the server refused the token; restarting would not help.\n\
         RestartPreventExitStatus={REFUSED_EXIT_CODE}\n\
         Restart=on-failure\n\
         RestartSec=10\n\
         # SIGTERM to the runner first (it stops its tools and saves held workspaces), then the rest.\n\
         KillMode=mixed\n\
         TimeoutStopSec={STOP_TIMEOUT_SECONDS}"
    );
    out.push_str("\n[Install]\n");
    match target {
        Target::SystemdSystem { .. } => out.push_str("WantedBy=multi-user.target\n"),
        _ => out.push_str("WantedBy=default.target\n"),
    }
    Ok(out)
}

/// One file `install` writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileToWrite {
    /// Where.
    pub path: PathBuf,
    /// What.
    pub contents: String,
    /// Its mode.
    pub mode: u32,
    /// Whether it is the token (never printed, owned by the service's account).
    pub secret: bool,
}

/// What `install` or `uninstall` does, in order: files first, then commands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Files to write (install).
    pub write: Vec<FileToWrite>,
    /// Files to remove (uninstall), and directories to remove when empty.
    pub remove: Vec<PathBuf>,
    /// Commands that load or unload the service; each must succeed.
    pub commands: Vec<Vec<String>>,
    /// Commands whose failure is expected and harmless (unloading what is not loaded).
    pub best_effort: Vec<Vec<String>>,
    /// A command that succeeds while the old service is still loaded: polled (up to 10 s) after
    /// the best-effort commands, before `commands`. launchd unloads asynchronously, and
    /// `bootstrap` of a label still being removed fails ("Input/output error").
    pub until_fails: Option<Vec<String>>,
}

fn command(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

fn systemctl(target: &Target, words: &[&str]) -> Vec<String> {
    let mut out = vec![String::from("systemctl")];
    if *target == Target::SystemdUser {
        out.push("--user".into());
    }
    out.extend(words.iter().map(|w| w.to_string()));
    out
}

/// The launchd domain of a user's agents, `gui/<uid>`.
pub fn launchd_domain(uid: u32) -> String {
    format!("gui/{uid}")
}

/// The install plan: the token file (0600) and the service file (0644), then the commands that
/// (re)load and start it, so installing again with other flags replaces the running service.
///
/// # Errors
///
/// [`ServiceError::Unrepresentable`].
pub fn install_plan(
    target: &Target,
    layout: &Layout,
    spec: &ServiceSpec,
    token: &str,
    uid: u32,
    start: bool,
) -> Result<Plan, ServiceError> {
    let service_file = match target {
        Target::LaunchdAgent => launchd_plist(spec, layout)?,
        _ => systemd_unit(spec, layout, target)?,
    };
    let service_path = path_text("the service file", &layout.service_file)?;
    let write = vec![
        FileToWrite {
            path: layout.token_file.clone(),
            contents: format!("{}\n", token.trim()),
            mode: 0o600,
            secret: true,
        },
        FileToWrite {
            path: layout.service_file.clone(),
            contents: service_file,
            mode: 0o644,
            secret: false,
        },
    ];
    let (commands, best_effort, until_fails) = match target {
        Target::LaunchdAgent => {
            let domain = launchd_domain(uid);
            let service = format!("{domain}/{LAUNCHD_LABEL}");
            // bootout first: bootstrap refuses a label that is loaded already, and a reinstall
            // must start the new plist.
            let best_effort = vec![command(&["launchctl", "bootout", &service])];
            let until_fails = start.then(|| command(&["launchctl", "print", &service]));
            let commands = if start {
                vec![
                    command(&["launchctl", "bootstrap", &domain, &service_path]),
                    command(&["launchctl", "enable", &service]),
                ]
            } else {
                Vec::new()
            };
            (
                commands,
                if start { best_effort } else { Vec::new() },
                until_fails,
            )
        }
        _ if start => (
            vec![
                systemctl(target, &["daemon-reload"]),
                systemctl(target, &["enable", SYSTEMD_UNIT]),
                systemctl(target, &["restart", SYSTEMD_UNIT]),
            ],
            Vec::new(),
            None,
        ),
        _ => (Vec::new(), Vec::new(), None),
    };
    Ok(Plan {
        write,
        remove: Vec::new(),
        commands,
        best_effort,
        until_fails,
    })
}

/// The uninstall plan: stop and unload the service (best effort: it may not be loaded), remove
/// its file, the token file and the log file, then the directories `install` created if they
/// are empty, and reload systemd.
pub fn uninstall_plan(target: &Target, layout: &Layout, uid: u32) -> Plan {
    let mut remove = vec![layout.service_file.clone(), layout.token_file.clone()];
    remove.extend(layout.log_file.iter().cloned());
    remove.extend(layout.created_dirs.iter().cloned());
    let (best_effort, commands) = match target {
        Target::LaunchdAgent => (
            vec![command(&[
                "launchctl",
                "bootout",
                &format!("{}/{LAUNCHD_LABEL}", launchd_domain(uid)),
            ])],
            Vec::new(),
        ),
        _ => (
            vec![systemctl(target, &["disable", "--now", SYSTEMD_UNIT])],
            vec![systemctl(target, &["daemon-reload"])],
        ),
    };
    Plan {
        write: Vec::new(),
        remove,
        commands,
        best_effort,
        until_fails: None,
    }
}

/// The commands that show a service's state (and, for systemd, its last log lines).
pub fn status_commands(target: &Target, uid: u32) -> Vec<Vec<String>> {
    match target {
        Target::LaunchdAgent => vec![command(&[
            "launchctl",
            "print",
            &format!("{}/{LAUNCHD_LABEL}", launchd_domain(uid)),
        ])],
        _ => vec![systemctl(
            target,
            &["status", "--no-pager", "--lines=20", SYSTEMD_UNIT],
        )],
    }
}

/// The arguments given to `install` without `flags` (name, whether it takes a value; both
/// `--flag VALUE` and `--flag=VALUE`): what remains is `register`'s part, the service's command
/// line. Among the flags removed is the token (`--token`), which goes to the token file.
pub fn without_flags(args: &[String], flags: &[(&str, bool)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for arg in args {
        if skip_next {
            skip_next = false;
            continue;
        }
        if let Some((_, takes_value)) = flags.iter().find(|(name, _)| arg == name) {
            skip_next = *takes_value;
            continue;
        }
        if flags
            .iter()
            .any(|(name, takes_value)| *takes_value && arg.starts_with(&format!("{name}=")))
        {
            continue;
        }
        out.push(arg.clone());
    }
    out
}

#[cfg(test)]
mod tests;
