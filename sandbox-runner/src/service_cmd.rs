//! `wuhu-runner service install | uninstall | status`: the command line around
//! [`wuhu_runner::service`], which decides what to write and run.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Subcommand, ValueEnum};
use wuhu_runner::service::{self, Layout, ServiceSpec, Target, system};

use crate::RegisterArgs;

/// The `service` subcommands.
// Parsed once per process: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub(crate) enum ServiceCommand {
    /// Write the service and start it. Takes `register`'s flags (the settings the service runs
    /// with; ~/.wuhu/runner.yml is read too); the token (--token, WUHU_RUNNER_TOKEN,
    /// --token-file or the config file's) is written to a file only the service's user can read
    /// (mode 0600), never into the service file. Installing again replaces the service.
    #[command(after_help = INSTALL_HELP)]
    Install(InstallArgs),
    /// Stop the service and remove what `install` wrote: the service file, the token file and
    /// (macOS) the log. The config file and workspaces stay.
    Uninstall(ScopeArgs),
    /// Whether the service is installed and running, and its last log lines. Exit code 0:
    /// running; 3: installed, not running; 4: not installed.
    Status(ScopeArgs),
}

pub(crate) const INSTALL_HELP: &str = "\
Examples:
  # This Mac, at log-in (a launchd agent; logs in ~/Library/Logs/wuhu-runner.log):
  WUHU_RUNNER_TOKEN=... wuhu-runner service install --server https://wuhu.example.com \\
      --name ana-mac --env api=~/src/api

  # A Linux VM, at boot (as root; the runner runs as the account wuhu):
  WUHU_RUNNER_TOKEN=... wuhu-runner service install --system --run-as wuhu \\
      --server https://wuhu.example.com --name build-1 --kind cloud \\
      --workspaces-root /srv/wuhu/workspaces

  # See what would be written, without writing it:
  wuhu-runner service install --dry-run --server https://wuhu.example.com --name x

Paths given to --config, --workspaces-root and --env must be absolute or start with ~ (the
service starts in its user's home directory).";

/// Where the service goes.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ScopeArgs {
    /// Linux: a system unit (/etc/systemd/system, started at boot; needs root) instead of a
    /// user unit.
    #[arg(long)]
    system: bool,
    /// The platform to write for, for --dry-run on another machine.
    #[arg(long, value_enum, hide = true)]
    platform: Option<PlatformArg>,
}

/// `service install`'s own flags, besides `register`'s.
#[derive(clap::Args, Debug)]
pub(crate) struct InstallArgs {
    #[command(flatten)]
    register: RegisterArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    /// With --system: the account the runner (and every command a session runs) runs as.
    #[arg(long, value_name = "USER")]
    run_as: Option<String>,
    /// The service's PATH [default: the binary's directory, ~/.cargo/bin, ~/.local/bin,
    /// Homebrew's and the system's]. Pass "$PATH" to give it your shell's.
    #[arg(long, value_name = "DIRS")]
    path: Option<String>,
    /// Write the files but neither load nor start the service.
    #[arg(long)]
    no_start: bool,
    /// Print what would be written and run (the token shown as its length), change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum PlatformArg {
    Macos,
    Linux,
}

/// `install`'s own flags and whether each takes a value: they are not `register`'s, so they
/// are not passed on to the service.
const INSTALL_ONLY_FLAGS: [(&str, bool); 8] = [
    ("--system", false),
    ("--run-as", true),
    ("--path", true),
    ("--no-start", false),
    ("--dry-run", false),
    ("--platform", true),
    ("--token", true),
    ("--token-file", true),
];

/// Runs a `service` subcommand.
pub(crate) fn run(command: ServiceCommand) -> anyhow::Result<u8> {
    match command {
        ServiceCommand::Install(args) => install(args),
        ServiceCommand::Uninstall(scope) => uninstall(&scope),
        ServiceCommand::Status(scope) => status(&scope),
    }
}

fn is_macos(platform: Option<PlatformArg>) -> bool {
    platform.map_or(cfg!(target_os = "macos"), |p| p == PlatformArg::Macos)
}

fn home() -> anyhow::Result<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .context("HOME is not set")
}

/// A selected target: its layout, the home of the account it runs as, and that account's ids
/// when files must be given to it (a system unit).
struct Selected {
    target: Target,
    layout: Layout,
    home: PathBuf,
    owner: Option<(u32, u32)>,
}

fn target(scope: &ScopeArgs, run_as: Option<&str>) -> anyhow::Result<Selected> {
    let target = system::select_target(
        is_macos(scope.platform),
        scope.system,
        run_as,
        system::current_uid(),
    )
    .map_err(anyhow::Error::msg)?;
    let (home, owner) = match &target {
        Target::SystemdSystem { run_as } => {
            let account = system::account(run_as).map_err(anyhow::Error::msg)?;
            (account.home.clone(), Some((account.uid, account.gid)))
        }
        _ => (home()?, None),
    };
    let layout = Layout::new(&target, &home);
    Ok(Selected {
        target,
        layout,
        home,
        owner,
    })
}

/// Reads a token file: its first line, trimmed. Warns when others may read it.
pub(crate) fn read_token_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    /// A token is a JWT of a few hundred bytes; a bigger file is the wrong file.
    const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(MAX_TOKEN_FILE_BYTES + 1)
                .read_to_string(&mut text)
        })
        .with_context(|| format!("--token-file {}", path.display()))?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        bail!(
            "--token-file {}: over {MAX_TOKEN_FILE_BYTES} bytes; a runner token is a few hundred",
            path.display()
        );
    }
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        bail!("--token-file {}: the file is empty", path.display());
    }
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "wuhu-runner: warning: {} can be read by other users (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
    Ok(token)
}

/// The arguments after `service install`, as given.
fn install_argv() -> Vec<String> {
    let argv: Vec<String> = std::env::args().collect();
    let at = argv
        .windows(2)
        .position(|w| w[0] == "service" && w[1] == "install")
        .map_or(argv.len(), |i| i + 2);
    argv[at..].to_vec()
}

/// Refuses relative paths: the service starts in its user's home, not here.
fn check_paths(args: &RegisterArgs) -> anyhow::Result<()> {
    let relative = |p: &str| !(p.starts_with('/') || p.starts_with('~'));
    if let Some(config) = &args.config
        && relative(&config.to_string_lossy())
    {
        bail!(
            "--config {}: give an absolute path (the service starts in its user's home directory)",
            config.display()
        );
    }
    if let Some(root) = &args.workspaces_root
        && relative(root)
    {
        bail!("--workspaces-root {root}: give an absolute path or one starting with ~");
    }
    for env in &args.envs {
        if let Some((_, path)) = env.split_once('=')
            && relative(path)
        {
            bail!("--env {env}: give an absolute path or one starting with ~");
        }
    }
    Ok(())
}

fn install(args: InstallArgs) -> anyhow::Result<u8> {
    let Selected {
        target,
        layout,
        home,
        owner,
    } = target(&args.scope, args.run_as.as_deref())?;
    if args.scope.platform.is_some()
        && is_macos(args.scope.platform) != cfg!(target_os = "macos")
        && !args.dry_run
    {
        bail!("--platform for another system works only with --dry-run");
    }
    check_paths(&args.register)?;
    // The settings the service will run with, checked now rather than in a restart loop.
    let (config, _) = crate::resolve_config(&args.register, Some(&home))
        .context("the service would not start")?;
    let binary = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .context("cannot find this program's own path")?;
    if binary.components().any(|c| c.as_os_str() == "target") {
        eprintln!(
            "wuhu-runner: warning: the service will run {} (a build directory): install the binary first (cargo install, or copy it to /usr/local/bin) and run service install from there",
            binary.display()
        );
    }
    let spec = ServiceSpec {
        path: args
            .path
            .clone()
            .unwrap_or_else(|| service::default_path(&target, &home, &binary)),
        register_args: service::without_flags(&install_argv(), &INSTALL_ONLY_FLAGS),
        binary,
        home: home.clone(),
    };
    let uid = owner.map_or_else(system::current_uid, |(uid, _)| uid);
    let start = !args.no_start && !args.dry_run;
    let plan = service::install_plan(&target, &layout, &spec, &config.token, uid, start)?;
    if args.dry_run {
        for file in &plan.write {
            println!("# {} (mode {:o})", file.path.display(), file.mode);
            if file.secret {
                println!("<the token, {} bytes>\n", config.token.trim().len());
            } else {
                println!("{}", file.contents);
            }
        }
        for command in plan.best_effort.iter().chain(&plan.commands) {
            println!("$ {}", command.join(" "));
        }
        return Ok(0);
    }
    if start && !matches!(target, Target::LaunchdAgent) && !system::systemd_booted() {
        bail!(
            "systemd is not running on this machine (no /run/systemd/system): nothing was written; --no-start writes the unit without starting it"
        );
    }
    let applied = match system::apply(&plan, owner) {
        Ok(applied) => applied,
        Err((applied, error)) => {
            for line in &applied.lines {
                println!("{line}");
            }
            bail!(error);
        }
    };
    for line in &applied.lines {
        println!("{line}");
    }
    println!(
        "wuhu-runner service: installed as {} ({})",
        config.name,
        layout.service_file.display()
    );
    if start {
        println!(
            "  status: wuhu-runner service status{}",
            scope_flag(&target)
        );
        if target == Target::SystemdUser && !lingering() {
            println!(
                "  note: it stops when you log out; `loginctl enable-linger` keeps it running"
            );
        }
    } else {
        match &target {
            Target::LaunchdAgent => println!(
                "  start: launchctl bootstrap gui/{uid} {}",
                layout.service_file.display()
            ),
            Target::SystemdUser => println!(
                "  start: systemctl --user daemon-reload && systemctl --user enable --now {}",
                service::SYSTEMD_UNIT
            ),
            Target::SystemdSystem { .. } => println!(
                "  start: systemctl daemon-reload && systemctl enable --now {}",
                service::SYSTEMD_UNIT
            ),
        }
    }
    println!("  logs: {}", logs_hint(&target, &layout));
    Ok(0)
}

fn scope_flag(target: &Target) -> &'static str {
    if matches!(target, Target::SystemdSystem { .. }) {
        " --system"
    } else {
        ""
    }
}

fn logs_hint(target: &Target, layout: &Layout) -> String {
    match target {
        Target::LaunchdAgent => format!(
            "tail -f {}",
            layout
                .log_file
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display()
        ),
        Target::SystemdUser => format!("journalctl --user -u {} -f", service::SYSTEMD_UNIT),
        Target::SystemdSystem { .. } => format!("journalctl -u {} -f", service::SYSTEMD_UNIT),
    }
}

/// Whether the current user's services keep running after log-out.
fn lingering() -> bool {
    let user = std::env::var("USER").unwrap_or_default();
    std::process::Command::new("loginctl")
        .args(["show-user", &user, "--property=Linger"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "Linger=yes")
}

fn uninstall(scope: &ScopeArgs) -> anyhow::Result<u8> {
    let run_as = scope.system.then(|| String::from("root"));
    let Selected {
        target,
        layout,
        owner,
        ..
    } = target(scope, run_as.as_deref())?;
    let uid = owner.map_or_else(system::current_uid, |(uid, _)| uid);
    let mut plan = service::uninstall_plan(&target, &layout, uid);
    if !matches!(target, Target::LaunchdAgent) && !system::systemd_booted() {
        // Nothing to stop or reload; the files still go.
        plan.best_effort.clear();
        plan.commands.clear();
    }
    let applied = system::apply(&plan, None).map_err(|(_, e)| anyhow::Error::msg(e))?;
    if applied.lines.is_empty() {
        println!("wuhu-runner service: not installed; nothing to remove");
    }
    for line in &applied.lines {
        println!("{line}");
    }
    Ok(0)
}

fn status(scope: &ScopeArgs) -> anyhow::Result<u8> {
    // Reading a system unit's state needs no root: no account checks here.
    let (target, layout, owner) = if scope.system && !is_macos(scope.platform) {
        let target = Target::SystemdSystem {
            run_as: String::new(),
        };
        let layout = Layout::new(&target, Path::new("/"));
        (target, layout, None)
    } else {
        let selected = target(scope, None)?;
        (selected.target, selected.layout, selected.owner)
    };
    if !layout.service_file.exists() {
        println!(
            "wuhu-runner service: not installed ({} does not exist)",
            layout.service_file.display()
        );
        return Ok(4);
    }
    println!(
        "wuhu-runner service: installed ({}; token in {})",
        layout.service_file.display(),
        layout.token_file.display()
    );
    let uid = owner.map_or_else(system::current_uid, |(uid, _)| uid);
    if !matches!(target, Target::LaunchdAgent) && !system::systemd_booted() {
        println!("systemd is not running on this machine: the unit is not loaded");
        return Ok(3);
    }
    let mut running = false;
    for command in service::status_commands(&target, uid) {
        let (code, output) = system::status_output(&command).map_err(anyhow::Error::msg)?;
        match target {
            Target::LaunchdAgent => {
                // `launchctl print` is long: the state, the PID and the last exit.
                for line in output.lines().map(str::trim).filter(|l| {
                    l.starts_with("state =")
                        || l.starts_with("pid =")
                        || l.starts_with("last exit code")
                        || l.starts_with("runs =")
                }) {
                    println!("  {line}");
                }
                running = code == 0 && output.contains("state = running");
                if code != 0 {
                    println!("  not loaded (launchctl print exited {code})");
                }
            }
            _ => {
                print!("{output}");
                running = code == 0;
            }
        }
    }
    if let Some(log) = &layout.log_file {
        println!("last lines of {}:", log.display());
        match system::log_tail(log, 20) {
            Ok(tail) => println!("{tail}"),
            Err(e) => println!("  ({e})"),
        }
    }
    println!("logs: {}", logs_hint(&target, &layout));
    Ok(if running { 0 } else { 3 })
}
