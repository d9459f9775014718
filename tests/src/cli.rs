//! Driving the real `wuhu` binary: one-shot commands in a private `HOME`, long-running ones
//! with their output read as it comes, `wuhu chat` inside `tmux`, and a TCP relay whose
//! connections a test can cut (a dropped network, or a server that moved to another port).
//!
//! * [`wuhu_bin`]: builds `wuhu` once per test process (`cargo build -p wuhu-cli`);
//!   `$WUHU_CLI_BIN` skips the build.
//! * [`Wuhu`]: a user of the CLI: own temp `HOME`, environment cleared but `PATH`.
//! * [`Relay`]: a loopback TCP relay to a target port, with [`Relay::cut`] and
//!   [`Relay::retarget`].
//! * [`Tmux`]: a terminal session on a private tmux socket; killed on drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;

use crate::runner::TempDir;
use crate::stack::repo_root;
use crate::util::wait_until;

/// How long a one-shot command ([`Wuhu::run`]) may take before it is killed and the test fails
/// with what it printed: a hung command must fail its test, never hang the suite.
pub const RUN_DEADLINE: Duration = Duration::from_secs(180);

/// The `wuhu` binary, built once per process in the profile of the running test binary.
pub fn wuhu_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("WUHU_CLI_BIN") {
            let bin = PathBuf::from(bin);
            assert!(bin.exists(), "WUHU_CLI_BIN={} is missing", bin.display());
            return bin;
        }
        let exe = std::env::current_exe().expect("current_exe");
        let mut profile_dir = exe.parent().expect("exe has a parent").to_path_buf();
        if profile_dir.file_name().is_some_and(|n| n == "deps") {
            profile_dir.pop();
        }
        let target_dir = profile_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| repo_root().join("target"));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command
            .current_dir(repo_root())
            .args(["build", "--quiet", "-p", "wuhu-cli", "--bin", "wuhu"])
            .env("CARGO_TARGET_DIR", &target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            command.arg("--release");
        }
        let status = command.status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "`cargo build -p wuhu-cli` failed: {status:?}"
        );
        let bin = profile_dir.join("wuhu");
        assert!(bin.exists(), "no wuhu binary at {}", bin.display());
        bin
    })
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Ran {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    /// The exit code (`-1` when killed by a signal).
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// Stdout as JSON; panics with the output otherwise.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Stderr as JSON (the `--json` error object); panics otherwise.
    #[track_caller]
    pub fn error_json(&self) -> Value {
        serde_json::from_str(self.stderr.trim())
            .unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {self:?}"))
    }

    /// Panics with the output unless the exit code is 0.
    #[track_caller]
    pub fn ok(self) -> Ran {
        assert_eq!(self.code(), 0, "wuhu failed: {self:?}");
        self
    }
}

impl From<Output> for Ran {
    fn from(output: Output) -> Ran {
        Ran {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// A person using the CLI: a private `HOME` (so `~/.wuhu/client.yml` is theirs) and a clean
/// environment plus whatever [`Wuhu::env`] adds.
pub struct Wuhu {
    home: TempDir,
    env: Vec<(String, String)>,
}

impl Default for Wuhu {
    fn default() -> Self {
        Wuhu::new()
    }
}

impl Wuhu {
    /// A user with an empty home.
    pub fn new() -> Wuhu {
        Wuhu {
            home: TempDir::new("wuhu-cli-home"),
            env: Vec::new(),
        }
    }

    /// Sets a variable for every later command.
    pub fn env(mut self, name: &str, value: &str) -> Wuhu {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// The default config file.
    pub fn config_path(&self) -> PathBuf {
        self.home().join(".wuhu").join("client.yml")
    }

    /// A command with this user's environment (no stdin).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(wuhu_bin());
        command
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .stdin(Stdio::null());
        for (name, value) in &self.env {
            command.env(name, value);
        }
        command
    }

    /// Runs `wuhu args…` to the end; kills it and fails after [`RUN_DEADLINE`].
    #[track_caller]
    pub fn run(&self, args: &[&str]) -> Ran {
        self.spawn_inner(args, None).finish(RUN_DEADLINE)
    }

    /// Runs `wuhu args…` with `input` on stdin (which then ends); kills it and fails after
    /// [`RUN_DEADLINE`].
    #[track_caller]
    pub fn run_with_stdin(&self, args: &[&str], input: &str) -> Ran {
        self.spawn_inner(args, Some(input)).finish(RUN_DEADLINE)
    }

    /// Starts `wuhu args…` in the background, its stdout read line by line as it comes.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.spawn_inner(args, None)
    }

    /// [`Wuhu::spawn`] with `input` on stdin, which then ends.
    pub fn spawn_with_stdin(&self, args: &[&str], input: &str) -> Running {
        self.spawn_inner(args, Some(input))
    }

    fn spawn_inner(&self, args: &[&str], input: Option<&str>) -> Running {
        let mut command = self.command(args);
        if input.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn wuhu");
        if let Some(input) = input {
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(input.as_bytes()).expect("write stdin");
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout_text = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("stdout");
        let (sink, text_sink) = (lines.clone(), stdout_text.clone());
        let out_reader = std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut raw = Vec::new();
            while matches!(reader.read_until(b'\n', &mut raw), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&raw).into_owned();
                text_sink.lock().expect("stdout").push_str(&text);
                let line = text.strip_suffix('\n').unwrap_or(&text);
                let line = line.strip_suffix('\r').unwrap_or(line);
                sink.lock().expect("lines").push(line.to_string());
                raw.clear();
            }
        });
        let mut err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        let err_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            sink.lock().expect("stderr").push_str(&text);
        });
        Running {
            child,
            lines,
            stdout: stdout_text,
            stderr,
            readers: vec![out_reader, err_reader],
        }
    }
}

/// A `wuhu` process in the background; killed (by pid) on drop.
pub struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    /// The stdout lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Waits for a stdout line matching `pred`.
    #[track_caller]
    pub fn wait_line(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) {
        if wait_until(timeout, || {
            self.lines().iter().any(|l| pred(l)).then_some(())
        })
        .is_err()
        {
            panic!(
                "timed out waiting for {what}; stdout so far: {:#?}",
                self.lines()
            );
        }
    }

    /// Waits for the process to exit; kills it after `timeout`.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let waited = wait_until(timeout, || self.child.try_wait().ok().flatten());
        match waited {
            Ok(status) => {
                // The pipes close with the process: the readers have everything once joined.
                for reader in self.readers.drain(..) {
                    let _ = reader.join();
                }
                status
            }
            Err(_) => {
                let _ = self.child.kill();
                panic!(
                    "wuhu did not exit in {timeout:?}; stdout {:#?}, stderr {}",
                    self.lines(),
                    self.stderr()
                );
            }
        }
    }

    /// Stderr so far (complete once the process exited).
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }

    /// Waits for the exit (killing it and failing after `timeout`) and returns what it printed.
    #[track_caller]
    pub fn finish(mut self, timeout: Duration) -> Ran {
        let status = self.wait_exit(timeout);
        Ran {
            status,
            stdout: self.stdout.lock().expect("stdout").clone(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A loopback TCP relay: accepts on its own port and pipes each connection to the target
/// port. [`Relay::cut`] shuts every open connection (both sides see the network drop).
pub struct Relay {
    port: u16,
    target: Arc<AtomicU16>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// A relay to `127.0.0.1:target`.
    pub fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let port = listener.local_addr().expect("relay addr").port();
        let target = Arc::new(AtomicU16::new(target));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (t, o) = (target.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", t.load(Ordering::SeqCst))) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                {
                    let mut open = o.lock().expect("relay");
                    for stream in [&client, &server] {
                        if let Ok(copy) = stream.try_clone() {
                            open.push(copy);
                        }
                    }
                }
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        Relay { port, target, open }
    }

    /// `http://127.0.0.1:PORT` of the relay.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// New connections go to `target` from now on.
    pub fn retarget(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
    }

    /// Shuts every connection open now; returns how many streams were shut.
    pub fn cut(&self) -> usize {
        let mut open = self.open.lock().expect("relay");
        let n = open.len();
        for stream in open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        n
    }
}

fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// A terminal (tmux on a private socket) running one command; the server is killed on drop.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `command` (a shell line) in a 160×50 terminal with `env` set.
    pub fn start(command: &str, env: &[(&str, &str)]) -> Tmux {
        let socket = format!("wuhu-e2e-{}", crate::util::random_hex(6));
        let mut tmux = Command::new("tmux");
        tmux.args([
            "-L",
            &socket,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "50",
        ]);
        for (name, value) in env {
            tmux.args(["-e", &format!("{name}={value}")]);
        }
        tmux.arg(command);
        let status = tmux.status().expect("run tmux");
        assert!(status.success(), "tmux new-session failed: {status:?}");
        // Keep the pane after the command exits so its last screen can be read.
        let _ = Command::new("tmux")
            .args(["-L", &socket, "set-option", "-g", "remain-on-exit", "on"])
            .status();
        Tmux { socket }
    }

    /// Types `keys` (tmux key names, e.g. `Enter`, `C-c`) literally when `literal`.
    pub fn send(&self, keys: &str, literal: bool) {
        let mut command = Command::new("tmux");
        command.args(["-L", &self.socket, "send-keys", "-t", "0"]);
        if literal {
            command.arg("-l");
        }
        command.arg(keys);
        let status = command.status().expect("tmux send-keys");
        assert!(status.success(), "tmux send-keys failed");
    }

    /// Types a line and Enter.
    pub fn type_line(&self, line: &str) {
        self.send(line, true);
        self.send("Enter", false);
    }

    /// The screen and scrollback as text.
    pub fn capture(&self) -> String {
        self.capture_pane(false)
    }

    /// The screen with the escape sequences of its colours and attributes (`capture-pane -e`):
    /// plain text has none.
    pub fn capture_with_escapes(&self) -> String {
        self.capture_pane(true)
    }

    fn capture_pane(&self, escapes: bool) -> String {
        let mut args = vec!["-L", &self.socket, "capture-pane", "-p", "-J"];
        if escapes {
            args.push("-e");
        }
        args.extend(["-S", "-2000", "-t", "0"]);
        let output = Command::new("tmux")
            .args(args)
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Whether the pane's command has exited.
    pub fn exited(&self) -> bool {
        let output = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "display-message",
                "-p",
                "-t",
                "0",
                "#{pane_dead}",
            ])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&output.stdout).trim() == "1"
    }

    /// Waits until the screen satisfies `pred`; panics with the screen otherwise.
    #[track_caller]
    pub fn wait_screen(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        match wait_until(timeout, || {
            let screen = self.capture();
            pred(&screen).then_some(screen)
        }) {
            Ok(screen) => screen,
            Err(_) => panic!("timed out waiting for {what}; screen:\n{}", self.capture()),
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .status();
    }
}
