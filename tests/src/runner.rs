//! Real `wuhu-runner` processes against a [`Stack`], a raw runner WebSocket client, and helpers
//! for tests that drive environments through the fake provider.
//!
//! * [`runner_bin`]: builds `wuhu-runner` once per test process (`cargo build -p wuhu-runner`,
//!   the profile of the running binary) and returns its path; `$WUHU_RUNNER_BIN` overrides.
//! * [`Runner`]: one `wuhu-runner register …` process with a clean environment (its own
//!   `HOME`, a fixed `PATH`, the token in `WUHU_RUNNER_TOKEN`, plus variables a test adds),
//!   stdout+stderr captured to a log file, waited for (`connected to … as NAME`) with a
//!   deadline, killed by PID ([`Runner::kill_hard`], on drop, or when the test process exits).
//! * [`RawRunner`]: a WebSocket client speaking the runner protocol by hand (garbage frames).
//! * [`ToolTurn`]: a fake-provider turn of tool calls, started without waiting, so a test can
//!   act while it runs (approvals, killing a runner) and collect the results afterwards.
//! * [`TempDir`]: a temp dir removed on drop unless the test failed.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::protocol::WebSocket;
use wuhu_core::wire::runner::{
    AttachOutcome, AttachedEnvironment, EnvironmentKind, HEARTBEAT_FRAME, RUNNER_CONNECT_PATH,
    RUNNER_PROTOCOL_VERSION, RunnerKind, RunnerMessage, ServerMessage, Snapshot, decode_frame,
    encode_frame, os_display_name,
};
use wuhu_core::wire::{Entry, ToolResult};

use crate::api::Api;
use crate::entries::{assistant, describe, fake_directive, position_of_user, tool_result};
use crate::stack::{Stack, repo_root};

/// How long a runner may take to print `connected to`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The `PATH` runners get: real directories only, so snapshot validation finds nothing stale.
pub const RUNNER_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The `wuhu-runner` binary, built once per process in the profile of the running binary
/// (`target/debug` for tests, `target/release` for `cargo run --release --bin bench`).
/// `$WUHU_RUNNER_BIN` skips the build.
pub fn runner_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("WUHU_RUNNER_BIN") {
            let bin = PathBuf::from(bin);
            assert!(bin.exists(), "WUHU_RUNNER_BIN={} is missing", bin.display());
            return bin;
        }
        let profile_dir = profile_dir();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let target_dir = profile_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| repo_root().join("target"));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(repo_root())
            .args(["build", "--quiet", "-p", "wuhu-runner", "--bin", "wuhu-runner"])
            .env("CARGO_TARGET_DIR", &target_dir);
        if release {
            command.arg("--release");
        }
        let bin = profile_dir.join("wuhu-runner");
        let status = command.status();
        match status {
            Ok(s) if s.success() => {}
            // Someone may be editing the runner right now: an existing binary still serves.
            Ok(_) | Err(_) if bin.exists() => eprintln!(
                "wuhu-e2e: warning: `cargo build -p wuhu-runner` failed ({status:?}); using the existing {}",
                bin.display()
            ),
            other => panic!("`cargo build -p wuhu-runner` failed: {other:?}"),
        }
        assert!(bin.exists(), "no runner binary at {}", bin.display());
        bin
    })
}

/// `target/<profile>` of the running executable (test binaries live in its `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe has a parent").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// A temp dir removed on drop, unless the thread is panicking (a failed test) or
/// `WUHU_E2E_KEEP` is set. The path is canonical (runners report canonical roots).
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A fresh dir named after `prefix`.
    pub fn new(prefix: &str) -> TempDir {
        let path = crate::util::make_temp_dir(prefix);
        let path = std::fs::canonicalize(&path).unwrap_or(path);
        TempDir { path }
    }

    /// The dir.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/rel`, created as a directory.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let dir = self.path.join(rel);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        dir
    }

    /// Writes `path/rel` (parents created).
    pub fn write(&self, rel: &str, content: &str) -> PathBuf {
        let file = self.path.join(rel);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).expect("create parent dir");
        }
        std::fs::write(&file, content).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        file
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("WUHU_E2E_KEEP").is_some() {
            eprintln!("wuhu-e2e: keeping {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// How to start a runner.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// `--server`.
    pub server: String,
    /// Passed as `WUHU_RUNNER_TOKEN` (so it is in the runner's environment, where the snapshot
    /// must not pick it up).
    pub token: String,
    /// `--name`.
    pub name: String,
    /// `--kind`.
    pub kind: RunnerKind,
    /// The token [`RunnerConfig::kind`] switches to for `cloud`: the server registers a cloud
    /// runner only with a token that says `runnerKind: cloud`.
    pub cloud_token: String,
    /// `--allow-any-path`: most tests define environments on arbitrary temp dirs; tests of the
    /// runner's path rule turn it off.
    pub allow_any_path: bool,
    /// `--env NAME=PATH`.
    pub envs: Vec<(String, PathBuf)>,
    /// `--workspaces-root`; default `<runner dir>/workspaces`.
    pub workspaces_root: Option<PathBuf>,
    /// Variables added to the runner's (otherwise clean) environment.
    pub vars: Vec<(String, String)>,
    /// More arguments after `register`.
    pub args: Vec<String>,
    /// `--verbose` (a log line per request).
    pub verbose: bool,
    /// Which machine the runner is on, for its key (decision 0024): runners of one identity in
    /// this test process share their `~/.wuhu/runner-key`, as one machine restarted would
    /// (the hub binds a name to the key of its first runner). `None`: a key of its own (another
    /// machine, [`RunnerConfig::fresh_key`]).
    pub key_identity: Option<String>,
}

/// The keys of the runners started so far, by [`RunnerConfig::key_identity`]: the first
/// runner's key file, and its bytes once read (the file goes with that runner's temp dir).
static KEYS: std::sync::Mutex<Vec<KnownKey>> = std::sync::Mutex::new(Vec::new());

/// An identity, the key file of its first runner, and the key's bytes once read.
type KnownKey = (String, PathBuf, Option<Vec<u8>>);

impl RunnerConfig {
    /// A key of its own: the runner is on another machine than earlier runners of its name.
    pub fn fresh_key(mut self) -> RunnerConfig {
        self.key_identity = None;
        self
    }

    /// A `local` runner named `name`, owned by `sub` in `tenant`, for `stack`.
    pub fn new(stack: &Stack, sub: &str, tenant: &str, name: &str) -> RunnerConfig {
        RunnerConfig {
            server: stack.base_url(),
            token: stack.runner_token(sub, tenant),
            name: name.to_string(),
            kind: RunnerKind::Local,
            cloud_token: stack.cloud_runner_token(sub, tenant),
            allow_any_path: true,
            envs: Vec::new(),
            workspaces_root: None,
            vars: Vec::new(),
            args: Vec::new(),
            verbose: true,
            // Not the server's URL: a restarted stack (a new port, the same state) must meet
            // the key it bound before.
            key_identity: Some(format!("{tenant}|{sub}|{name}")),
        }
    }

    /// Sets `--kind`; `cloud` also switches to a token with `runnerKind: cloud` (without it the
    /// server registers the runner as local whatever `--kind` says). Use
    /// [`RunnerConfig::claimed_kind`] to say `cloud` with a local token.
    pub fn kind(mut self, kind: RunnerKind) -> RunnerConfig {
        self.kind = kind;
        if kind == RunnerKind::Cloud {
            self.token = self.cloud_token.clone();
        }
        self
    }

    /// Sets `--kind` only, keeping the token (an impostor saying `cloud` in `hello`).
    pub fn claimed_kind(mut self, kind: RunnerKind) -> RunnerConfig {
        self.kind = kind;
        self
    }

    /// Sets `--allow-any-path` (default on in tests).
    pub fn allow_any_path(mut self, allow: bool) -> RunnerConfig {
        self.allow_any_path = allow;
        self
    }

    /// Adds `--env name=path`.
    pub fn env(mut self, name: &str, path: impl Into<PathBuf>) -> RunnerConfig {
        self.envs.push((name.to_string(), path.into()));
        self
    }

    /// Sets `--workspaces-root`.
    pub fn workspaces_root(mut self, dir: impl Into<PathBuf>) -> RunnerConfig {
        self.workspaces_root = Some(dir.into());
        self
    }

    /// Adds a variable to the runner's environment.
    pub fn var(mut self, name: &str, value: impl Into<String>) -> RunnerConfig {
        self.vars.push((name.to_string(), value.into()));
        self
    }

    /// Replaces the token.
    pub fn token(mut self, token: impl Into<String>) -> RunnerConfig {
        self.token = token.into();
        self
    }

    /// Sets `--verbose`.
    pub fn verbose(mut self, verbose: bool) -> RunnerConfig {
        self.verbose = verbose;
        self
    }
}

/// A `wuhu-runner register` process.
pub struct Runner {
    config: RunnerConfig,
    dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    watchdog: Option<Child>,
    /// Log length when the current process started.
    log_offset: u64,
    starts: u32,
}

impl Runner {
    /// Starts a runner and waits until it is connected. Panics (with its log) when it is not
    /// within [`CONNECT_TIMEOUT`].
    #[track_caller]
    pub fn start(config: RunnerConfig) -> Runner {
        let mut runner = Runner::spawn(config);
        runner.wait_connected(CONNECT_TIMEOUT);
        runner
    }

    /// Gives this runner the key of the earlier runner of its identity (a copy of its
    /// `~/.wuhu/runner-key`), or records where its own will be.
    fn share_key(&self, config: &RunnerConfig) {
        let Some(identity) = &config.key_identity else {
            return;
        };
        let mine = self.dir.join("home/.wuhu/runner-key");
        let mut keys = KEYS.lock().unwrap_or_else(|p| p.into_inner());
        match keys.iter_mut().find(|(id, _, _)| id == identity) {
            Some((_, earlier, bytes)) if *earlier != mine && !mine.exists() => {
                if bytes.is_none() {
                    *bytes = std::fs::read(&*earlier).ok();
                }
                if let Some(bytes) = bytes {
                    use std::os::unix::fs::PermissionsExt;
                    std::fs::create_dir_all(mine.parent().expect("parent")).expect("key dir");
                    std::fs::write(&mine, bytes).expect("copy the runner key");
                    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o600))
                        .expect("chmod the runner key");
                }
            }
            Some(_) => {}
            None => keys.push((identity.clone(), mine, None)),
        }
    }

    /// Keeps the bytes of the key this runner made (the first of its identity), so later
    /// runners of the identity get it after this one's directory is gone.
    fn remember_key(&self) {
        let Some(identity) = &self.config.key_identity else {
            return;
        };
        let mine = self.dir.join("home/.wuhu/runner-key");
        let mut keys = KEYS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, earlier, bytes)) = keys.iter_mut().find(|(id, _, _)| id == identity)
            && *earlier == mine
            && bytes.is_none()
        {
            *bytes = std::fs::read(&mine).ok();
        }
    }

    /// Starts a runner without waiting for anything.
    pub fn spawn(config: RunnerConfig) -> Runner {
        let dir = crate::util::make_temp_dir(&format!("wuhu-e2e-runner-{}", config.name));
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        std::fs::create_dir_all(dir.join("home")).expect("create runner home");
        let mut runner = Runner {
            log_path: dir.join("runner.log"),
            dir,
            config,
            child: None,
            watchdog: None,
            log_offset: 0,
            starts: 0,
        };
        runner.spawn_process();
        runner
    }

    /// The config it runs with.
    pub fn config(&self) -> &RunnerConfig {
        &self.config
    }

    /// `--name`.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The PID of the running process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The runner's private dir (its `HOME` is `dir/home`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The workspaces root it was given (or its default under [`Runner::dir`]).
    pub fn workspaces_root(&self) -> PathBuf {
        self.config
            .workspaces_root
            .clone()
            .unwrap_or_else(|| self.dir.join("workspaces"))
    }

    /// Everything the runner printed, over all its starts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// What the current process printed.
    pub fn current_log(&self) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        let start = (self.log_offset as usize).min(log.len());
        String::from_utf8_lossy(&log[start..]).into_owned()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until the current process printed `connected to … as NAME`. Panics with the log
    /// when it exits or the deadline passes first.
    #[track_caller]
    pub fn wait_connected(&mut self, timeout: Duration) {
        let needle = format!("as {}", self.config.name);
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.current_log();
            if log
                .lines()
                .any(|l| l.contains("connected to ") && l.contains(&needle))
            {
                self.remember_key();
                return;
            }
            if let Some(status) = self.try_wait() {
                panic!(
                    "runner {} exited ({status}) before connecting; log {}:\n{}",
                    self.config.name,
                    self.log_path.display(),
                    self.log_tail(40)
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "runner {} did not connect within {timeout:?}; log {}:\n{}",
                    self.config.name,
                    self.log_path.display(),
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status, if the process has exited (reaped here).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        crate::util::wait_until(timeout, || self.try_wait()).ok()
    }

    /// SIGKILLs the runner (no goodbye to the server) and reaps it. Its tool processes run in
    /// their own process groups and are left alone.
    pub fn kill_hard(&mut self) {
        self.stop_watchdog();
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the PID of our own unreaped child; no memory is touched.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }

    /// SIGTERMs the runner and waits up to `grace` before SIGKILL.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.stop_watchdog();
        let mut child = self.child.take()?;
        // SAFETY: as in kill_hard.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as in kill_hard.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
        }
        child.wait().ok()
    }

    /// Kills the process (if running) and starts it again with the same config, waiting until
    /// it is connected.
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill_hard();
        self.spawn_process();
        self.wait_connected(CONNECT_TIMEOUT);
    }

    fn spawn_process(&mut self) {
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open runner log");
        let _ = writeln!(log, "===== wuhu-e2e: runner start #{} =====", self.starts);
        self.log_offset = log.metadata().map(|m| m.len()).unwrap_or(0);
        let config = &self.config;
        let workspaces_root = self.workspaces_root();
        self.share_key(config);
        let mut command = Command::new(runner_bin());
        command
            .current_dir(&self.dir)
            .env_clear()
            .env("PATH", RUNNER_PATH)
            .env("HOME", self.dir.join("home"))
            .env(
                "USER",
                std::env::var("USER").unwrap_or_else(|_| "wuhu".into()),
            )
            .env("LANG", "C.UTF-8")
            .env("WUHU_RUNNER_TOKEN", &config.token)
            .arg("register")
            .args(["--server", &config.server, "--name", &config.name])
            .args(["--kind", config.kind.as_str()])
            .arg("--workspaces-root")
            .arg(&workspaces_root);
        for (name, path) in &config.envs {
            command
                .arg("--env")
                .arg(format!("{name}={}", path.display()));
        }
        if config.verbose {
            command.arg("--verbose");
        }
        if config.allow_any_path {
            command.arg("--allow-any-path");
        }
        command.args(&config.args);
        for (name, value) in &config.vars {
            command.env(name, value);
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .process_group(0);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", runner_bin().display()));
        self.watchdog = spawn_watchdog(child.id());
        self.child = Some(child);
    }

    fn stop_watchdog(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            // SAFETY: the watchdog shell leads its own process group (ours, unreaped).
            unsafe {
                libc::kill(-(watchdog.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.remember_key();
        let failed = std::thread::panicking();
        if failed {
            eprintln!(
                "wuhu-e2e: runner {} log tail ({}):\n{}",
                self.config.name,
                self.log_path.display(),
                self.log_tail(30)
            );
        }
        self.stop(Duration::from_secs(3));
        if !failed && std::env::var_os("WUHU_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A shell that waits for EOF on its stdin (our end closes when this process exits), then
/// SIGKILLs `pid` (a runner; a local MCP server, `crate::mcp_servers`). Stopped before the
/// process is reaped, so it never signals a recycled PID.
pub(crate) fn spawn_watchdog(pid: u32) -> Option<Child> {
    Command::new("sh")
        .args([
            "-c",
            "cat >/dev/null; kill -s KILL \"$1\" 2>/dev/null",
            "wuhu-e2e-runner-watchdog",
            &pid.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}

/// The `attach_result` of a local environment `name` at `root` (its snapshot's cwd), now.
fn local_attach_result(
    id: String,
    name: String,
    root: &str,
    cell: Box<wuhu_core::cell::CellSettings>,
) -> RunnerMessage {
    RunnerMessage::AttachResult {
        id,
        outcome: AttachOutcome::Ok {
            environment: AttachedEnvironment {
                name,
                kind: EnvironmentKind::Local,
                root: root.to_string(),
                os: os_display_name(std::env::consts::OS),
                repo_path: None,
                branch: None,
                snapshot: Snapshot {
                    cwd: root.to_string(),
                    env: Default::default(),
                    captured_at: crate::util::unix_now(),
                },
                agents_md: None,
                agents_md_truncated: false,
                agents_md_file: None,
                cell,
            },
        },
    }
}

/// A hand-driven runner connection (tungstenite over a plain TCP stream).
pub struct RawRunner {
    ws: WebSocket<TcpStream>,
}

impl RawRunner {
    /// Opens `ws://…/v1/runners/connect` with `Authorization: Bearer <token>`.
    ///
    /// # Errors
    /// The handshake error (an HTTP 401 refusal is `tungstenite::Error::Http`).
    pub fn connect(base_url: &str, token: &str) -> Result<RawRunner, Box<tungstenite::Error>> {
        use tungstenite::client::IntoClientRequest;
        let host_port = base_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let url = format!("ws://{host_port}{RUNNER_CONNECT_PATH}");
        let mut request = url.into_client_request().map_err(Box::new)?;
        request.headers_mut().insert(
            "Authorization",
            format!("Bearer {token}").parse().expect("header value"),
        );
        let stream = TcpStream::connect(&host_port).map_err(|e| Box::new(e.into()))?;
        stream.set_nodelay(true).ok();
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .map_err(|e| Box::new(e.into()))?;
        let (ws, _response) =
            tungstenite::client::client(request, stream).map_err(|e| match e {
                tungstenite::HandshakeError::Failure(e) => Box::new(e),
                tungstenite::HandshakeError::Interrupted(_) => {
                    Box::new(tungstenite::Error::ConnectionClosed)
                }
            })?;
        Ok(RawRunner { ws })
    }

    /// A valid `hello` for a runner named `name` offering nothing.
    pub fn hello(name: &str, kind: RunnerKind) -> String {
        RawRunner::hello_offering(name, kind, &[])
    }

    /// A valid `hello` for a runner named `name` offering `(name, path)` environments.
    pub fn hello_offering(name: &str, kind: RunnerKind, environments: &[(&str, &str)]) -> String {
        encode_frame(&RunnerMessage::Hello {
            version: RUNNER_PROTOCOL_VERSION,
            name: name.to_string(),
            kind,
            os: wuhu_core::wire::runner::os_display_name(std::env::consts::OS),
            arch: std::env::consts::ARCH.to_string(),
            capabilities: vec!["bash".to_string()],
            environments: environments
                .iter()
                .map(|(name, path)| wuhu_core::wire::runner::OfferedEnvironment {
                    name: name.to_string(),
                    path: path.to_string(),
                })
                .collect(),
            runner_version: Some("e2e".to_string()),
            replace: false,
            key: None,
        })
    }

    /// Sends a text frame.
    #[track_caller]
    pub fn send_text(&mut self, text: &str) {
        self.ws
            .send(tungstenite::Message::text(text))
            .unwrap_or_else(|e| panic!("send {text:?}: {e}"));
    }

    /// Sends a text frame; the error when the server already closed the connection (a big
    /// frame may be cut off by the close).
    ///
    /// # Errors
    /// The send error, as text.
    pub fn try_send_text(&mut self, text: &str) -> Result<(), String> {
        self.ws
            .send(tungstenite::Message::text(text))
            .map_err(|e| e.to_string())
    }

    /// Sends `text` as one message of WebSocket fragments of `chunk` bytes (a text frame, then
    /// continuation frames), pausing `pause` between fragments; stops at the first write error
    /// (the server closed). Returns when the last fragment was written, or the error.
    ///
    /// # Errors
    /// The write error, as text.
    pub fn try_send_fragmented(
        &mut self,
        text: &str,
        chunk: usize,
        pause: Duration,
    ) -> Result<(), String> {
        use tungstenite::protocol::frame::Frame;
        use tungstenite::protocol::frame::coding::{Data, OpCode};
        let bytes = text.as_bytes();
        let pieces: Vec<&[u8]> = bytes.chunks(chunk.max(1)).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let opcode = if i == 0 {
                OpCode::Data(Data::Text)
            } else {
                OpCode::Data(Data::Continue)
            };
            let frame = Frame::message(piece.to_vec(), opcode, i + 1 == pieces.len());
            self.ws
                .send(tungstenite::Message::Frame(frame))
                .map_err(|e| e.to_string())?;
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        Ok(())
    }

    /// Reads until the connection ends within `timeout`, skipping any text frames. `Ok` with
    /// the close frame's code and reason (`None` when it ended without one: reset, EOF);
    /// `Err` when it was still open at the deadline.
    ///
    /// # Errors
    /// The deadline passed with the connection open.
    pub fn wait_closed(&mut self, timeout: Duration) -> Result<Option<(u16, String)>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("the connection was still open after {timeout:?}"));
            }
            self.ws
                .get_mut()
                .set_read_timeout(Some(left))
                .map_err(|e| e.to_string())?;
            match self.ws.read() {
                Ok(tungstenite::Message::Close(close)) => {
                    return Ok(close.map(|c| (u16::from(c.code), c.reason.to_string())));
                }
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(_) => return Ok(None),
            }
        }
    }

    /// Sends a binary frame.
    #[track_caller]
    pub fn send_binary(&mut self, bytes: &[u8]) {
        self.ws
            .send(tungstenite::Message::binary(bytes.to_vec()))
            .unwrap_or_else(|e| panic!("send binary: {e}"));
    }

    /// Sends `{"type":"heartbeat"}`.
    #[track_caller]
    pub fn heartbeat(&mut self) {
        self.send_text(HEARTBEAT_FRAME);
    }

    /// The next text frame (skipping pings/pongs) within `timeout`, as raw text.
    #[track_caller]
    pub fn next_text(&mut self, timeout: Duration) -> String {
        self.ws
            .get_mut()
            .set_read_timeout(Some(timeout))
            .expect("set read timeout");
        loop {
            match self.ws.read() {
                Ok(tungstenite::Message::Text(text)) => return text.to_string(),
                Ok(tungstenite::Message::Close(close)) => {
                    panic!("the server closed the runner connection: {close:?}")
                }
                Ok(_) => continue,
                Err(e) => panic!("reading a frame within {timeout:?}: {e}"),
            }
        }
    }

    /// The next text frame within `timeout`, or `None` when the connection closed, failed or
    /// stayed silent.
    pub fn try_next_text(&mut self, timeout: Duration) -> Option<String> {
        self.ws.get_mut().set_read_timeout(Some(timeout)).ok()?;
        loop {
            match self.ws.read() {
                Ok(tungstenite::Message::Text(text)) => return Some(text.to_string()),
                Ok(tungstenite::Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Serves requests on a background thread as a runner that does no work: `attach` gets a
    /// `local` environment at `root` (empty snapshot env), `tool_call` an empty successful
    /// result, `validate` nothing stale, `detach` ok. For measuring the session and hub
    /// without process spawns. Ends when the connection does; returns the calls answered.
    pub fn serve_instantly(mut self, root: &str) -> std::thread::JoinHandle<usize> {
        use wuhu_core::wire::runner::DetachOutcome;
        let root = root.to_string();
        std::thread::spawn(move || {
            let mut calls = 0;
            while let Some(text) = self.try_next_text(Duration::from_secs(3600)) {
                let reply = match decode_frame::<ServerMessage>(&text) {
                    Ok(ServerMessage::Attach { id, spec, .. }) => {
                        local_attach_result(id, spec.name, &root, Box::new(spec.cell))
                    }
                    Ok(ServerMessage::ToolCall { id, .. }) => {
                        calls += 1;
                        RunnerMessage::ToolResult {
                            id,
                            content: String::new(),
                            is_error: false,
                            details: Some(json!({"exitCode": 0})),
                            blobs: Vec::new(),
                        }
                    }
                    Ok(ServerMessage::Validate { id, .. }) => RunnerMessage::ValidateResult {
                        id,
                        stale: Vec::new(),
                    },
                    Ok(ServerMessage::Detach { id, .. }) => RunnerMessage::DetachResult {
                        id,
                        outcome: DetachOutcome::Ok {
                            removed: false,
                            branch: None,
                            head: None,
                        },
                    },
                    _ => continue,
                };
                if self
                    .ws
                    .send(tungstenite::Message::text(encode_frame(&reply)))
                    .is_err()
                {
                    break;
                }
            }
            calls
        })
    }

    /// A raw runner of `sub`'s named `name` offering environment `env` at `root`, welcomed
    /// within `timeout`.
    #[track_caller]
    pub fn welcomed(
        stack: &Stack,
        sub: &str,
        tenant: &str,
        (name, env, root): (&str, &str, &Path),
        timeout: Duration,
    ) -> RawRunner {
        let token = stack.runner_token(sub, tenant);
        let mut raw = RawRunner::connect(&stack.base_url(), &token)
            .unwrap_or_else(|e| panic!("connect a raw runner: {e}"));
        raw.send_text(&RawRunner::hello_offering(
            name,
            RunnerKind::Local,
            &[(env, &root.display().to_string())],
        ));
        match raw.next_request(timeout) {
            ServerMessage::Welcome { .. } => raw,
            other => panic!("expected welcome, got {other:?}"),
        }
    }

    /// The next request frame (heartbeat acks skipped).
    #[track_caller]
    pub fn next_request(&mut self, timeout: Duration) -> ServerMessage {
        loop {
            match self.next_message(timeout) {
                ServerMessage::HeartbeatAck {} => continue,
                other => return other,
            }
        }
    }

    /// Reads the next request, an `attach`, and answers it: a local environment at `root`.
    #[track_caller]
    pub fn answer_attach(&mut self, root: &Path, timeout: Duration) {
        let ServerMessage::Attach { id, spec, .. } = self.next_request(timeout) else {
            panic!("expected attach");
        };
        let root = root.display().to_string();
        let reply = local_attach_result(id, spec.name, &root, Default::default());
        self.send_text(&encode_frame(&reply));
    }

    /// The next frame, decoded.
    #[track_caller]
    pub fn next_message(&mut self, timeout: Duration) -> ServerMessage {
        let text = self.next_text(timeout);
        decode_frame::<ServerMessage>(&text)
            .unwrap_or_else(|e| panic!("undecodable server frame {text:?}: {e}"))
    }

    /// Reads until the server's close frame within `timeout`: its code and reason, or `None`
    /// when the connection ended without one (or stayed open).
    pub fn next_close(&mut self, timeout: Duration) -> Option<(u16, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            self.ws
                .get_mut()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            match self.ws.read() {
                Ok(tungstenite::Message::Close(Some(frame))) => {
                    return Some((u16::from(frame.code), frame.reason.to_string()));
                }
                Ok(tungstenite::Message::Close(None)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Closes the connection politely.
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}

/// A turn of tool calls through the fake provider, enqueued but not waited for.
#[derive(Clone, Debug)]
pub struct ToolTurn {
    /// The session.
    pub session: String,
    /// The user message that carries the directive.
    pub content: String,
    /// The reply after the tool results (marks the turn's end).
    pub marker: String,
    /// How many calls it makes.
    pub calls: usize,
}

impl ToolTurn {
    /// Enqueues (followUp) a message whose reply calls `calls` (name, arguments) one step.
    #[track_caller]
    pub fn start(api: &Api, session: &str, calls: &[(&str, Value)]) -> ToolTurn {
        let marker = format!("tool calls done {}", crate::util::random_hex(6));
        let calls_json: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
            .collect();
        let content = fake_directive(&json!({"toolCalls": calls_json, "afterTools": marker}));
        api.enqueue(session, "followUp", &content);
        ToolTurn {
            session: session.to_string(),
            content,
            marker,
            calls: calls.len(),
        }
    }

    /// Whether the step after the tool results is in `entries`: the `afterTools` reply, or
    /// any assistant message after the last result. (The fake provider answers a
    /// `custom_message` that follows the results, such as AGENTS.md or a resume note, with an
    /// echo instead of `afterTools`.)
    pub fn is_done(&self, entries: &[Entry]) -> bool {
        let marker_seen = entries
            .iter()
            .any(|e| assistant(e).is_some_and(|m| m.text() == self.marker));
        if marker_seen {
            return true;
        }
        let Some(start) = position_of_user(entries, &self.content) else {
            return false;
        };
        let Some(ids) = self.call_ids(entries) else {
            return false;
        };
        let mut last = start;
        for id in &ids {
            match entries[start..]
                .iter()
                .position(|e| tool_result(e).is_some_and(|r| r.tool_call_id == *id))
            {
                Some(at) => last = last.max(start + at),
                None => return false,
            }
        }
        !ids.is_empty() && entries[last + 1..].iter().any(|e| assistant(e).is_some())
    }

    /// The ids of the calls the turn made, once its assistant entry is in `entries`.
    pub fn call_ids(&self, entries: &[Entry]) -> Option<Vec<String>> {
        let start = position_of_user(entries, &self.content)?;
        entries[start + 1..]
            .iter()
            .find_map(assistant)
            .map(|m| m.tool_calls().map(|c| c.id.clone()).collect())
    }

    /// Waits for the turn to end; returns the results in call order and the transcript.
    #[track_caller]
    pub fn finish(&self, api: &Api, timeout: Duration) -> (Vec<ToolResult>, Vec<Entry>) {
        let entries = api.wait_transcript(
            &self.session,
            "the step after the tool results",
            timeout,
            |e| self.is_done(e),
        );
        let text = describe(&entries);
        let ids = self.call_ids(&entries).unwrap_or_default();
        assert_eq!(ids.len(), self.calls, "tool calls made:\n{text}");
        let start = position_of_user(&entries, &self.content).unwrap_or(0);
        let results = ids
            .iter()
            .map(|call_id| {
                entries[start..]
                    .iter()
                    .filter_map(tool_result)
                    .find(|r| r.tool_call_id == *call_id)
                    .cloned()
                    .unwrap_or_else(|| panic!("no result for tool call {call_id}:\n{text}"))
            })
            .collect();
        (results, entries)
    }

    /// Entries from this turn's user message on (empty until it is in the transcript).
    pub fn entries_since<'a>(&self, entries: &'a [Entry]) -> &'a [Entry] {
        match position_of_user(entries, &self.content) {
            Some(start) => &entries[start..],
            None => &[],
        }
    }
}
