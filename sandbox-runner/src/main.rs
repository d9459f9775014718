//! `wuhu-runner`: hosts Wuhu environments on this machine. See `wuhu-runner --help`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use wuhu_core::wire::runner::{RunnerKind, SandboxMode};
use wuhu_runner::client::{ClientOptions, run};
use wuhu_runner::config::{Settings, default_config_path, load_settings, parse_env_flag};
use wuhu_runner::environment::EnvironmentHost;
use wuhu_runner::store::{Store, StoreConfig, spawn_interval_saves};

mod service_cmd;

#[cfg(test)]
mod doc_examples;

const AFTER_HELP: &str = "\
Examples:
  # Register this Mac with a hosted server, offering one project directory (the token in
  # WUHU_RUNNER_TOKEN or --token-file: a --token flag shows in `ps`):
  wuhu-runner register --server https://wuhu.example.com --name ana-mac --env api=~/src/api

  # The same, kept running as a service (launchd agent on macOS, systemd unit on Linux):
  wuhu-runner service install --server https://wuhu.example.com --name ana-mac --env api=~/src/api

  # A cloud VM that hosts folder templates and worktrees for sessions (its token must carry
  # runnerKind: cloud, minted by an operator; templates live under an offered directory):
  wuhu-runner register --server https://wuhu.example.com --name build-1 --kind cloud \\
      --workspaces-root /srv/wuhu/workspaces --env templates=/srv/wuhu/templates

  # Everything from ~/.wuhu/runner.yml:
  wuhu-runner register

Config file (~/.wuhu/runner.yml, YAML; flags win, --env entries are merged by name):
  server: https://wuhu.example.com
  token: eyJhbGciOi...          # a runner token (typ: runner), or WUHU_RUNNER_TOKEN
  name: ana-mac
  kind: local                   # local | cloud
  workspacesRoot: ~/.wuhu/workspaces
  environments:
    api: ~/src/api

Attach paths (local paths, templates, repositories) must be inside an --env directory or
the workspaces root unless --allow-any-path is given. Plaintext http:// or ws:// servers
are accepted only on loopback (localhost, 127.0.0.0/8, ::1).

Status lines on stderr: 'connected to URL as NAME', 'server notice: ...',
'reconnecting in 4s (reason)', 'refused: <message>'. Exit codes: 2 when the server refuses the token or the runner
(HTTP 401/403, or a permanent 'refused'), 1 for bad settings, 130/143 on SIGINT/SIGTERM.";

/// Runs Wuhu environments and coding tools on this machine for sessions on a Wuhu server.
///
/// The runner connects out to the server over WebSocket (so it works behind NAT), keeps the
/// connection alive with heartbeats, and reconnects with capped exponential backoff.
#[derive(Parser, Debug)]
#[command(name = "wuhu-runner", version, about, long_about, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Connect to a Wuhu server and serve its sessions until stopped.
    #[command(after_help = AFTER_HELP)]
    Register(RegisterArgs),
    /// Keep `register` running as a service of this machine: a launchd agent on macOS, a
    /// systemd unit on Linux.
    #[command(subcommand)]
    Service(service_cmd::ServiceCommand),
}

#[derive(clap::Args, Debug)]
struct RegisterArgs {
    /// Base URL of the Wuhu server (http://, https://, ws:// or wss://).
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// Runner token (a JWT with typ: runner). Prefer the environment variable: flags show up in
    /// `ps`.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WUHU_RUNNER_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Read the runner token from this file (its first line; keep it readable by you alone:
    /// `service install` writes one with mode 0600). Wins over --token and WUHU_RUNNER_TOKEN.
    #[arg(
        long,
        value_name = "PATH",
        env = "WUHU_RUNNER_TOKEN_FILE",
        hide_env_values = true
    )]
    token_file: Option<PathBuf>,
    /// This runner's name, unique among your runners (letters, digits, '-', '_', '.').
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Offer a local environment: a directory sessions may attach by name. Repeatable.
    #[arg(long = "env", value_name = "NAME=PATH")]
    envs: Vec<String>,
    /// Where per-session folder-template copies and git worktrees are created
    /// [default: ~/.wuhu/workspaces].
    #[arg(long, value_name = "DIR")]
    workspaces_root: Option<String>,
    /// Whether this is your own machine (local) or a cloud machine (cloud) [default: local].
    #[arg(long, value_enum)]
    kind: Option<KindArg>,
    /// Config file [default: ~/.wuhu/runner.yml; a missing default file is fine].
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Time limit for folder-template startup scripts, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    startup_timeout: u64,
    /// Also print a line for every request from the server.
    #[arg(short, long)]
    verbose: bool,
    /// Let the server attach any existing directory on this machine. Without it, attach paths
    /// (local paths, templates, repositories) must be inside an --env directory or the
    /// workspaces root.
    #[arg(long)]
    allow_any_path: bool,
    /// Keep folder-template workspaces in S3-compatible storage: hydrate them on attach from the
    /// session's saved workspace (else the template), save them on detach, every
    /// --store-save-interval and before exit, and delete the local copy after detach.
    /// Credentials: the AWS SDKs' chain (environment, AWS_PROFILE in ~/.aws/credentials and
    /// ~/.aws/config with keys, credential_process, SSO or role_arn, a web identity token, ECS
    /// container credentials, EC2 instance metadata), refreshed before they expire.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    store: Option<String>,
    /// S3 endpoint for --store (R2, MinIO, a local server); path-style addressing. Default:
    /// AWS's regional endpoint.
    #[arg(long, value_name = "URL", requires = "store")]
    store_endpoint: Option<String>,
    /// Region for --store [default: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else
    /// us-east-1].
    #[arg(long, value_name = "REGION", requires = "store")]
    store_region: Option<String>,
    /// Seconds between saves of held workspaces.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 300,
        requires = "store"
    )]
    store_save_interval: u64,
    /// Run every session's commands and file tools in a cell: the environment's root and a
    /// temp dir to write, the system to read, the network its definition names
    /// (docs/security.md). `off` gives sessions this runner's own rights on this machine.
    #[arg(long, value_enum, default_value = "on")]
    sandbox: SandboxArg,
    /// Take this runner's name over from a live connection of it (another wuhu-runner with
    /// the same token and name), which then stops. Without it such a connection is refused
    /// while the other one is alive.
    #[arg(long)]
    replace: bool,
    /// Run each session as its own uid from this range, such as 20000-29999 (a runner started
    /// as root on Linux, with cells on): its cells run as that uid and its files belong to it,
    /// so no session can read another's files at rest. Sessions get folder-template
    /// environments only (a local directory or a repository would be shared).
    #[arg(long, value_name = "FIRST-LAST")]
    isolate_uids: Option<String>,
    /// Where the isolated sessions' directories go (workspaces unless --workspaces-root, homes,
    /// logs, call temp dirs) and the table of their uids; every directory above it must be
    /// passable by other users.
    #[arg(
        long,
        value_name = "DIR",
        default_value = wuhu_runner::cell::uids::DEFAULT_ISOLATED_DIR,
        requires = "isolate_uids"
    )]
    isolate_uids_dir: PathBuf,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SandboxArg {
    On,
    Off,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum KindArg {
    Local,
    Cloud,
}

fn main() -> ExitCode {
    // A cell being made (decision 0023): this binary, run by the runner for one command. It
    // reads no settings and holds nothing of the runner's.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    #[cfg(target_os = "linux")]
    match raw.get(1).and_then(|a| a.to_str()) {
        Some("cell-exec") => {
            let code = wuhu_runner::cell::linux::cell_exec_main(&raw[2..]);
            return ExitCode::from(u8::try_from(code).unwrap_or(125));
        }
        Some("cell-probe") => {
            return ExitCode::from(wuhu_runner::cell::linux::probe_main() as u8);
        }
        _ => {}
    }
    drop(raw);
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Register(args) => register(args),
        Command::Service(command) => service_cmd::run(command),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("wuhu-runner: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The settings `register` runs with: the config file (`--config`, else `~/.wuhu/runner.yml`
/// under `home`) overlaid by the flags; the token from `--token` / `WUHU_RUNNER_TOKEN`, else
/// the file's `token` (`--token-file` wins over both). Also returns the config file's path (a
/// path no cell may reach).
fn resolve_config(
    args: &RegisterArgs,
    home: Option<&std::path::Path>,
) -> anyhow::Result<(wuhu_runner::config::RunnerConfig, Option<PathBuf>)> {
    let (config_path, required) = match &args.config {
        Some(path) => (Some(path.clone()), true),
        None => (default_config_path(home), false),
    };
    let file = match &config_path {
        Some(path) => load_settings(path, required)?,
        None => Settings::default(),
    };
    let workspaces_root_chosen = file.workspaces_root.is_some() || args.workspaces_root.is_some();
    if let (Some(path), Some(_)) = (&config_path, &file.token) {
        wuhu_runner::secrets::check_secret_file(path, "the runner token")
            .map_err(anyhow::Error::msg)?;
    }
    if std::env::args().any(|a| a == "--token" || a.starts_with("--token=")) {
        eprintln!(
            "wuhu-runner: warning: --token on the command line is visible to every process on this machine (ps); prefer WUHU_RUNNER_TOKEN or the config file (mode 600)"
        );
    }
    let mut environments = BTreeMap::new();
    for flag in &args.envs {
        let (name, path) = parse_env_flag(flag)?;
        environments.insert(name, path);
    }
    let token = match (&args.token_file, &args.token) {
        (Some(path), _) => Some(service_cmd::read_token_file(path)?),
        (None, token) => token.clone(),
    };
    let flags = Settings {
        server: args.server.clone(),
        token,
        name: args.name.clone(),
        kind: args.kind.map(|k| match k {
            KindArg::Local => RunnerKind::Local,
            KindArg::Cloud => RunnerKind::Cloud,
        }),
        workspaces_root: args.workspaces_root.clone(),
        environments,
    };
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let mut config = file.overlay(flags).resolve(home, &cwd)?;
    config.sandbox = match args.sandbox {
        SandboxArg::On => SandboxMode::On,
        SandboxArg::Off => SandboxMode::Off,
    };
    config.replace = args.replace;
    // Isolated sessions' copies must be reachable by their uids: below the isolated base
    // unless chosen.
    if args.isolate_uids.is_some() && !workspaces_root_chosen {
        config.workspaces_root = args.isolate_uids_dir.join("workspaces");
    }
    Ok((config, config_path))
}

/// Turns `host`'s cells into cells that run each session as its own uid from `range`, with the
/// sessions' directories below `base` (decision 0023, addendum).
fn isolate_uids(
    host: &mut EnvironmentHost,
    range: &str,
    base: &std::path::Path,
) -> Result<Arc<wuhu_runner::cell::Cells>, String> {
    use wuhu_runner::cell::uids;
    let range = wuhu_core::cell::uids::parse_uid_range(range)?;
    if !base.is_absolute() || !host.workspaces_root.is_absolute() {
        return Err(String::from(
            "the isolated directories must be absolute paths",
        ));
    }
    uids::check_passable(base)?;
    uids::check_passable(&host.workspaces_root)?;
    let cells = host.cells.clone();
    // Checked first: the directories are made only for a runner that may isolate.
    let table = uids::SessionUids::open(base.join("session-uids.json"), range)?;
    host.cells = wuhu_runner::cell::Cells::off();
    let cells = cells.isolating_uids(table)?;
    host.dirs = wuhu_runner::executor::RunnerDirs::isolated(base)
        .map_err(|e| format!("{}: {e}", base.display()))?;
    uids::create_passable_dir(&host.workspaces_root)
        .map_err(|e| format!("{}: {e}", host.workspaces_root.display()))?;
    let in_use = cells.session_uids().map_or(0, |u| u.in_use());
    eprintln!(
        "wuhu-runner: each session runs as its own uid from {range} ({in_use} in use); their directories are below {}",
        base.display()
    );
    Ok(cells)
}

fn register(args: RegisterArgs) -> anyhow::Result<u8> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from);
    let (config, config_path) = resolve_config(&args, home.as_deref())?;
    for env in &config.environments {
        if !std::path::Path::new(&env.path).is_dir() {
            eprintln!(
                "wuhu-runner: warning: environment {} path {} is not a directory",
                env.name, env.path
            );
        }
    }

    let mut host = EnvironmentHost::for_process(config.workspaces_root.clone());
    host.startup_timeout = Duration::from_secs(args.startup_timeout.max(1));
    host.allow_paths_in((!args.allow_any_path).then(|| {
        config
            .environments
            .iter()
            .map(|env| PathBuf::from(&env.path))
            .collect()
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let store = match &args.store {
        Some(url) => {
            let location = wuhu_runner::store::rules::parse_store_url(url)
                .map_err(|e| anyhow::anyhow!("--store: {e}"))?;
            let store_config = StoreConfig {
                location,
                endpoint: args.store_endpoint.clone(),
                region: args.store_region.clone(),
                save_interval: Duration::from_secs(args.store_save_interval.max(1)),
            };
            let store = runtime
                .block_on(Store::open(
                    &store_config,
                    &config.name,
                    &host.workspaces_root,
                ))
                .map_err(|e| anyhow::anyhow!("--store: {e}"))?;
            Some(Arc::new(store))
        }
        None => None,
    };
    host.store = store.clone();
    // The runner's own directories, private to its user, and its cells.
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    let run_dir = wuhu_runner::private_dir::runtime_dir(home.as_deref(), xdg.as_deref())
        .context("no HOME or XDG_RUNTIME_DIR for the runner's runtime directory")?;
    host.dirs = wuhu_runner::executor::RunnerDirs::private(&run_dir)
        .with_context(|| format!("runtime directory {}", run_dir.display()))?;
    let aws_files = aws_files(home.as_deref());
    let protected = wuhu_runner::secrets::protected_paths(
        home.as_deref(),
        config_path.as_deref(),
        &run_dir,
        &host.workspaces_root,
        &aws_files,
    );
    if args.store.is_some() {
        for file in &aws_files {
            if wuhu_runner::secrets::holds_store_keys(file) {
                wuhu_runner::secrets::check_secret_file(file, "the store's credentials")
                    .map_err(anyhow::Error::msg)?;
            }
        }
    }
    host.cells = wuhu_runner::cell::Cells::new(
        config.sandbox,
        protected,
        &run_dir,
        config.kind == RunnerKind::Cloud,
    )
    .map_err(|e| anyhow::anyhow!("cannot confine sessions: {e}; start with --sandbox off to run them with this runner's own rights"))?;
    if let Some(range) = &args.isolate_uids {
        host.cells = isolate_uids(&mut host, range, &args.isolate_uids_dir)
            .map_err(|e| anyhow::anyhow!("--isolate-uids: {e}"))?;
    }
    if config.sandbox == SandboxMode::Off {
        eprintln!(
            "wuhu-runner: warning: --sandbox off: sessions run commands and file tools with this runner's own rights on this machine (its files, its network, its token)"
        );
    }
    // Read; now gone from this process's environment (before any thread starts).
    // SAFETY: no other thread runs yet.
    unsafe { wuhu_runner::secrets::scrub_environment() };
    host.vars
        .retain(|(name, _)| !wuhu_runner::secrets::is_secret_variable(name));
    let temp_root = host.dirs.temp_root.clone();
    // The key the hub binds this runner's name to (decision 0024), next to its config.
    let key_path = home
        .as_deref()
        .map(|h| h.join(".wuhu").join("runner-key"))
        .context("no HOME for the runner's key (~/.wuhu/runner-key)")?;
    let (key, made) =
        wuhu_runner::key::RunnerKey::load_or_create(&key_path).map_err(anyhow::Error::msg)?;
    if made {
        eprintln!(
            "wuhu-runner: made this runner's key {} (the server binds the name to it at the first connection)",
            key_path.display()
        );
    }
    let options = ClientOptions {
        status: Arc::new(|line: &str| eprintln!("wuhu-runner: {line}")),
        verbose: args.verbose,
        jitter_seed: jitter_seed(),
        key: Some(Arc::new(key)),
    };

    let exit_store = store.clone();
    let code = runtime.block_on(async move {
        if let Some(store) = store {
            spawn_interval_saves(store);
        }
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(term) => {
                    term.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        // The connection loop runs on a worker thread, like the calls it spawns: frames and
        // results then avoid a hop to and from this (block_on) thread on every request.
        let serving = tokio::spawn(run(config, host, options));
        tokio::select! {
            fatal = serving => match fatal {
                Ok(fatal) => fatal.exit_code() as u8,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => 1,
            },
            _ = tokio::signal::ctrl_c() => 130,
            () = terminated => 143,
        }
    });
    // Held workspaces are saved before the runner exits (bounded: a hung store must not keep
    // a stopping machine up forever).
    if let Some(store) = exit_store {
        runtime.block_on(async {
            if tokio::time::timeout(EXIT_SAVE_LIMIT, store.save_all("exit"))
                .await
                .is_err()
            {
                eprintln!(
                    "wuhu-runner: store: saving before exit took over {} s; stopped",
                    EXIT_SAVE_LIMIT.as_secs()
                );
            }
        });
    }
    // Dropping the runtime drops running calls, which kills their process groups.
    runtime.shutdown_timeout(Duration::from_secs(2));
    let _ = std::fs::remove_dir_all(temp_root);
    // Cells killed mid-call could not remove their (now empty) cgroups.
    #[cfg(target_os = "linux")]
    wuhu_runner::cell::linux::remove_cell_cgroups(std::process::id());
    Ok(code)
}

/// How long saving held workspaces before exit may take.
const EXIT_SAVE_LIMIT: Duration = Duration::from_secs(120);

/// The AWS files the store's credentials chain reads (`AWS_SHARED_CREDENTIALS_FILE` /
/// `~/.aws/credentials`, `AWS_CONFIG_FILE` / `~/.aws/config`, `AWS_WEB_IDENTITY_TOKEN_FILE`)
/// that exist: protected from cells; those holding keys must be private to the runner's user.
fn aws_files(home: Option<&std::path::Path>) -> Vec<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    };
    [
        var("AWS_SHARED_CREDENTIALS_FILE")
            .or_else(|| home.map(|h| h.join(".aws").join("credentials"))),
        var("AWS_CONFIG_FILE").or_else(|| home.map(|h| h.join(".aws").join("config"))),
        var("AWS_WEB_IDENTITY_TOKEN_FILE"),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.exists())
    .collect()
}

fn jitter_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}
