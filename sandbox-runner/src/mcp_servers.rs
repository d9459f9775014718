//! Stdio MCP servers of attached environments (issue 33, decision 0040): the runner starts a
//! server the first time a session sends a request for it (a `tool_call` of
//! [`mcp::TOOL`]), in the environment's cell with its working directory and variables, keeps it
//! for the attachment, and stops it (its whole process group) on `detach` and when the runner
//! exits.
//!
//! The protocol is MCP's stdio transport: newline-delimited JSON-RPC 2.0 on the child's stdin
//! and stdout, `initialize` then `notifications/initialized`, then the session's requests, passed
//! through as they are (method and params) with their results answered whole. Bounds: one
//! message of at most [`mcp::MAX_MESSAGE_BYTES`]; a result relayed of at most
//! [`mcp::MAX_RELAYED_RESULT_BYTES`]; a timeout per request; the last
//! [`mcp::STDERR_TAIL_BYTES`] of stderr kept (the rest drained); a server that exited started
//! again at most [`mcp::MAX_RESTARTS`] times an attachment.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{oneshot, watch};
use wuhu_core::wire::runner::mcp::{self, McpRequest, McpResponse, RpcError, StdioServer};
use wuhu_core::wire::runner::{EnvironmentContext, SecretEnv};

use crate::cell::{CallCell, Cells};
use crate::executor::{RunnerDirs, call_cell, session_home};
use crate::jobs::session_log_dir;
use crate::tools::bash::{DEFAULT_PATH, GroupGuard, shell_command};
use crate::tools::{CancelSignal, ToolOutput};

/// The protocol revision this client asks for.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// How long a killed server's process may take to be reaped before stop gives up waiting.
const REAP_WAIT: Duration = Duration::from_secs(5);

/// `(session, environment, server)`.
type Key = (String, String, String);

/// Every server this runner keeps, by session, environment and name.
pub struct McpServers {
    slots: Arc<Mutex<HashMap<Key, Arc<Slot>>>>,
    /// A server no request used for this long is stopped (the next request starts it again,
    /// which counts as no restart): a session that never detaches (one deleted with a `local`
    /// environment attached, one left idle) does not keep processes forever.
    idle_stop: Duration,
    sweeping: std::sync::atomic::AtomicBool,
}

impl Default for McpServers {
    fn default() -> McpServers {
        McpServers::with_idle_stop(mcp::IDLE_STOP)
    }
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServers").finish_non_exhaustive()
    }
}

/// One server of one attachment: its running process, if any, and how often it was started.
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
    /// When a request last used it, and how many run now (an idle stop waits for none).
    used: Mutex<(std::time::Instant, usize)>,
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            state: Default::default(),
            used: Mutex::new((std::time::Instant::now(), 0)),
        }
    }
}

/// Marks a slot in use while a request runs.
struct InUse<'a>(&'a Slot);

impl<'a> InUse<'a> {
    fn new(slot: &'a Slot) -> InUse<'a> {
        let mut used = slot.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = (std::time::Instant::now(), used.1 + 1);
        InUse(slot)
    }
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        let mut used = self.0.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = (std::time::Instant::now(), used.1.saturating_sub(1));
    }
}

#[derive(Default)]
struct SlotState {
    process: Option<Arc<Process>>,
    /// What the process was started from (the entry, the root and the cwd): a changed entry
    /// starts a new process.
    fingerprint: String,
    /// Starts after the first (a server that exited, or failed to start).
    restarts: u32,
    /// Why the last process ended, or its start failed.
    last_failure: Option<String>,
}

/// A running server.
struct Process {
    pid: Option<u32>,
    stdin: Arc<tokio::sync::Mutex<ChildStdin>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    next_id: AtomicU64,
    /// `Some(why)` once it ended (its stdout closed and it was reaped).
    ended: watch::Receiver<Option<String>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Killed (the group) when the last holder lets go.
    group: Mutex<GroupGuard>,
    _cell: Option<Arc<CallCell>>,
    temp_dir: PathBuf,
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.temp_dir);
    }
}

/// What a request gets: the JSON-RPC answer, or why there is none.
type Reply = Result<Value, String>;

/// A request without an answer: whether the server got it, and why.
struct Failed {
    sent: bool,
    message: String,
}

impl Failed {
    fn sent(message: impl Into<String>) -> Failed {
        Failed {
            sent: true,
            message: message.into(),
        }
    }
}

impl McpServers {
    /// Servers stopped after `idle_stop` without a request (tests use a short one).
    pub fn with_idle_stop(idle_stop: Duration) -> McpServers {
        McpServers {
            slots: Arc::default(),
            idle_stop,
            sweeping: Default::default(),
        }
    }

    /// Starts, once, the task that stops idle servers (every quarter of the idle time); it ends
    /// when these servers are dropped.
    fn sweep_idle(&self) {
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let slots = Arc::downgrade(&self.slots);
        let idle_stop = self.idle_stop;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(idle_stop / 4).await;
                let Some(slots) = slots.upgrade() else {
                    return;
                };
                let all: Vec<(Key, Arc<Slot>)> = slots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(k, s)| (k.clone(), s.clone()))
                    .collect();
                for (key, slot) in all {
                    let idle = {
                        let used = slot.used.lock().unwrap_or_else(|p| p.into_inner());
                        used.1 == 0 && used.0.elapsed() >= idle_stop
                    };
                    // A slot busy starting is not idle. An idle one is forgotten whole: the
                    // next request starts afresh.
                    if idle && let Ok(mut state) = slot.state.try_lock() {
                        if let Some(process) = state.process.take() {
                            process.kill();
                        }
                        let mut all = slots.lock().unwrap_or_else(|p| p.into_inner());
                        if all.get(&key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                            all.remove(&key);
                        }
                    }
                }
                drop(slots);
            }
        });
    }

    /// The servers' processes (for tests: that they are gone).
    pub async fn pids(&self, session_id: &str, environment: &str) -> Vec<u32> {
        let slots: Vec<Arc<Slot>> = self
            .lock()
            .iter()
            .filter(|((s, e, _), _)| s == session_id && e == environment)
            .map(|(_, slot)| slot.clone())
            .collect();
        let mut pids = Vec::new();
        for slot in slots {
            if let Some(pid) = slot.state.lock().await.process.as_ref().and_then(|p| p.pid) {
                pids.push(pid);
            }
        }
        pids
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one [`mcp::TOOL`] call: starts the server when it does not run, sends the request
    /// and answers its result as `details` ([`McpResponse`]). Never fails: problems are error
    /// outputs that say what happened.
    pub async fn call(
        &self,
        place: &Place<'_>,
        arguments: Value,
        secret_env: &SecretEnv,
        cancel: CancelSignal,
    ) -> ToolOutput {
        let (session_id, environment) = (place.session_id, place.environment);
        let request: McpRequest = match serde_json::from_value(arguments) {
            Ok(request) => request,
            Err(e) => {
                return ToolOutput::error(format!("invalid arguments for {}: {e}", mcp::TOOL));
            }
        };
        if let Err(e) = mcp::check_servers(std::slice::from_ref(&request.server)) {
            return ToolOutput::error(e);
        }
        let name = request.server.name.clone();
        let key = (
            session_id.to_string(),
            environment.name.clone(),
            name.clone(),
        );
        self.sweep_idle();
        let slot = self.lock().entry(key).or_default().clone();
        let _in_use = InUse::new(&slot);
        let timeout = request
            .timeout_seconds
            .unwrap_or(mcp::DEFAULT_TIMEOUT_SECONDS)
            .clamp(1, 3600);
        // A request the server never got (it had ended, unnoticed yet) is sent once more, to a
        // new process: nothing of it ran.
        for attempt in 0..2 {
            let process = match process_for(&slot, place, &request.server, secret_env).await {
                Ok(process) => process,
                Err(refused) => return ToolOutput::error(refused),
            };
            let answer = process
                .request(
                    &request.method,
                    request.params.clone(),
                    timeout,
                    cancel.clone(),
                )
                .await;
            match answer {
                Ok(answer) => return response_output(answer),
                Err(Failed { sent, message }) => {
                    // A server that ended is started again by the next request (not this one
                    // when it was sent: the request may have done half its work).
                    let mut ended = process.ended.clone();
                    if !sent {
                        let _ =
                            tokio::time::timeout(REAP_WAIT, ended.wait_for(Option::is_some)).await;
                    }
                    let mut state = slot.state.lock().await;
                    if let Some(why) = process.ended() {
                        if state
                            .process
                            .as_ref()
                            .is_some_and(|p| Arc::ptr_eq(p, &process))
                        {
                            state.last_failure = Some(why);
                        }
                        if !sent && attempt == 0 {
                            continue;
                        }
                    }
                    return ToolOutput::error(message);
                }
            }
        }
        ToolOutput::error("the server ended before the request reached it")
    }

    /// Stops every server of `environment` in `session_id` (detach) and waits, boundedly, until
    /// their processes are gone. Answers how many were stopped.
    pub async fn stop(&self, session_id: &str, environment: &str) -> usize {
        let slots: Vec<Arc<Slot>> = {
            let mut all = self.lock();
            let keys: Vec<Key> = all
                .keys()
                .filter(|(s, e, _)| s == session_id && e == environment)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| all.remove(k)).collect()
        };
        let mut stopped = 0;
        for slot in slots {
            let process = slot.state.lock().await.process.take();
            if let Some(process) = process {
                process.kill();
                let mut ended = process.ended.clone();
                let _ = tokio::time::timeout(REAP_WAIT, ended.wait_for(Option::is_some)).await;
                stopped += 1;
            }
        }
        stopped
    }

    /// Stops every server of `session_id` (its deletion).
    pub async fn stop_session(&self, session_id: &str) {
        let environments: Vec<String> = self
            .lock()
            .keys()
            .filter(|(s, _, _)| s == session_id)
            .map(|(_, e, _)| e.clone())
            .collect();
        for environment in environments {
            self.stop(session_id, &environment).await;
        }
    }
}

/// Where a server runs: the runner's directories and cells (`None`: no sandbox), for one
/// session's environment.
#[derive(Clone, Copy)]
pub struct Place<'a> {
    /// The runner's directories.
    pub dirs: &'a RunnerDirs,
    /// Its cells, when it makes them.
    pub cells: Option<&'a Arc<Cells>>,
    /// The session.
    pub session_id: &'a str,
    /// The environment, as the call's context gives it.
    pub environment: &'a EnvironmentContext,
}

/// The slot's running process, started now when there is none (within the restarts allowed).
async fn process_for(
    slot: &Slot,
    place: &Place<'_>,
    server: &StdioServer,
    secret_env: &SecretEnv,
) -> Result<Arc<Process>, String> {
    let mut state = slot.state.lock().await;
    let fingerprint = fingerprint(server, place.environment, secret_env);
    if let Some(process) = running(&mut state, &fingerprint) {
        return Ok(process);
    }
    if state.process.take().is_some() || state.last_failure.is_some() {
        state.restarts += 1;
    }
    if state.restarts > mcp::MAX_RESTARTS {
        return Err(format!(
            "the server exited or failed to start {} times ({}); it is not started again until the environment is attached again",
            state.restarts,
            state.last_failure.as_deref().unwrap_or("no reason known")
        ));
    }
    match start(place, server, secret_env).await {
        Ok(process) => {
            let process = Arc::new(process);
            state.process = Some(process.clone());
            state.fingerprint = fingerprint;
            state.last_failure = None;
            Ok(process)
        }
        Err(e) => {
            state.last_failure = Some(e.clone());
            Err(format!("the server did not start: {e}"))
        }
    }
}

/// The slot's process when it runs and was started from this very entry; a process of another
/// entry is stopped.
fn running(state: &mut SlotState, fingerprint: &str) -> Option<Arc<Process>> {
    let process = state.process.as_ref()?;
    if state.fingerprint != fingerprint {
        // The definition changed: the old process goes, the new one counts as a first start.
        if let Some(old) = state.process.take() {
            old.kill();
        }
        state.restarts = 0;
        state.last_failure = None;
        return None;
    }
    if let Some(why) = process.ended() {
        state.last_failure = Some(why);
        return None;
    }
    Some(process.clone())
}

/// What a running process was started from: its entry, its place, and a digest of its secrets'
/// values (a secret that changed in the vault starts a new process; the values themselves are
/// kept only in the process's environment).
fn fingerprint(
    server: &StdioServer,
    environment: &EnvironmentContext,
    secret_env: &SecretEnv,
) -> String {
    use sha2::{Digest, Sha256};
    let mut secrets = Sha256::new();
    for (name, value) in &secret_env.0 {
        secrets.update((name.len() as u64).to_le_bytes());
        secrets.update(name.as_bytes());
        secrets.update((value.len() as u64).to_le_bytes());
        secrets.update(value.as_bytes());
    }
    let digest: String = secrets
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    json!([server, environment.root, environment.snapshot.cwd, digest]).to_string()
}

/// The `tool_result` of an answer: `details` is the [`McpResponse`]; a result too large to
/// relay is an error.
fn response_output(answer: Value) -> ToolOutput {
    let response = match answer.get("error") {
        Some(error) => McpResponse {
            result: Value::Null,
            error: Some(RpcError {
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            }),
        },
        None => McpResponse {
            result: answer.get("result").cloned().unwrap_or(Value::Null),
            error: None,
        },
    };
    let details = serde_json::to_value(&response).unwrap_or_default();
    let size = details.to_string().len();
    if size > mcp::MAX_RELAYED_RESULT_BYTES {
        return ToolOutput::error(format!(
            "the answer is {size} bytes, more than the {} bytes a result may carry back to the session",
            mcp::MAX_RELAYED_RESULT_BYTES
        ));
    }
    ToolOutput::ok("").with_details(details)
}

impl Process {
    fn ended(&self) -> Option<String> {
        self.ended.borrow().clone()
    }

    /// Kills its process group (once it ended, its group id may be another's: not then).
    fn kill(&self) {
        if self.ended().is_none() {
            self.group.lock().unwrap_or_else(|p| p.into_inner()).kill();
        }
    }

    fn stderr_tail(&self) -> String {
        tail_text(&self.stderr)
    }

    async fn send(&self, message: &Value) -> Result<(), String> {
        write_message(&self.stdin, message).await
    }

    /// Sends `method` and waits for its answer, at most `timeout` seconds (or until the call is
    /// cancelled, or the server ends).
    async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: u32,
        mut cancel: CancelSignal,
    ) -> Result<Value, Failed> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let forget = || {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        };
        if let Some(why) = self.ended() {
            forget();
            return Err(Failed {
                sent: false,
                message: self.ended_text(&why),
            });
        }
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            message["params"] = params;
        }
        if let Err(message) = self.send(&message).await {
            forget();
            return Err(Failed {
                sent: false,
                message,
            });
        }
        let cancelled_note = |reason: &str| {
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": id, "reason": reason}})
        };
        tokio::select! {
            reply = rx => match reply {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(e)) => Err(Failed::sent(e)),
                Err(_) => Err(Failed::sent(self.ended_text(&self.ended().unwrap_or_default()))),
            },
            () = tokio::time::sleep(Duration::from_secs(u64::from(timeout))) => {
                forget();
                let _ = self.send(&cancelled_note("timed out")).await;
                Err(Failed::sent(format!("no answer within {timeout} s")))
            }
            () = cancel.cancelled() => {
                forget();
                let _ = self.send(&cancelled_note("cancelled")).await;
                Err(Failed::sent("cancelled"))
            }
        }
    }

    fn ended_text(&self, why: &str) -> String {
        let tail = self.stderr_tail();
        if tail.is_empty() {
            format!("the server ended during the request ({why})")
        } else {
            format!("the server ended during the request ({why}); the end of its stderr:\n{tail}")
        }
    }
}

/// Writes one message, a line, to the server's stdin.
async fn write_message(
    stdin: &tokio::sync::Mutex<ChildStdin>,
    message: &Value,
) -> Result<(), String> {
    let mut line = message.to_string();
    line.push('\n');
    let mut stdin = stdin.lock().await;
    stdin
        .write_all(line.as_bytes())
        .await
        .map_err(|e| format!("cannot write to the server: {e}"))?;
    stdin
        .flush()
        .await
        .map_err(|e| format!("cannot write to the server: {e}"))
}

fn tail_text(tail: &Mutex<VecDeque<u8>>) -> String {
    let tail = tail.lock().unwrap_or_else(|p| p.into_inner());
    let bytes: Vec<u8> = tail.iter().copied().collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// Starts `server` for `session_id` in `environment` and completes its `initialize`.
async fn start(
    place: &Place<'_>,
    server: &StdioServer,
    secret_env: &SecretEnv,
) -> Result<Process, String> {
    let Place {
        dirs,
        cells,
        session_id,
        environment,
    } = *place;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let root = Path::new(&environment.root)
        .canonicalize()
        .ok()
        .filter(|r| r.is_dir())
        .ok_or_else(|| format!("its root {} no longer exists", environment.root))?;
    let cwd = if environment.snapshot.cwd.is_empty() {
        root.clone()
    } else {
        PathBuf::from(&environment.snapshot.cwd)
    };
    if !cwd.is_dir() {
        return Err(format!(
            "working directory {} no longer exists",
            cwd.display()
        ));
    }
    let temp_dir = dirs.temp_root.join(format!(
        "mcp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&temp_dir)
        .map_err(|e| format!("cannot create a temp dir {}: {e}", temp_dir.display()))?;
    let cleanup = |e: String| {
        let _ = std::fs::remove_dir_all(&temp_dir);
        e
    };
    let session_logs = session_log_dir(&dirs.log_dir, session_id);
    let session_uid = cells
        .and_then(|c| c.session_uids())
        .and_then(|u| u.uid_for(session_id).ok());
    crate::private_dir::create_for(&session_logs, session_uid)
        .map_err(|e| cleanup(format!("cannot create the session's log directory: {e}")))?;
    let home = session_home(dirs, session_id);
    // The same cell a `bash` call of this environment gets: its network, its paths, its limits,
    // the session's own home, never the runner's own files.
    let cell = call_cell(
        cells,
        session_id,
        environment,
        &root,
        &temp_dir,
        &session_logs,
        Some(&home),
    )
    .map_err(cleanup)?;
    let mut vars = environment.snapshot.env.clone();
    vars.extend(server.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // A secret wins over a captured variable of its name, as in `bash`.
    vars.extend(
        secret_env
            .0
            .iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    let mut cmd = shell_command(cell.as_deref(), &vars);
    // `exec`: the server is the shell's process (its group's leader), found in the PATH.
    cmd.arg("-c")
        .arg("exec \"$0\" \"$@\"")
        .arg(&server.command)
        .args(&server.args)
        .current_dir(&cwd)
        .env_clear()
        .envs(&vars)
        .env("TMPDIR", &temp_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if !vars.contains_key("PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    if let Some(cell) = &cell {
        cmd.env("HOME", &home);
        cmd.envs(cell.env());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| cleanup(format!("cannot start {:?}: {e}", server.command)))?;
    let pid = child.id();
    let group = GroupGuard(pid.map(|p| p as i32));
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(cleanup(String::from("the server's pipes were not made")));
    };
    let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
    tokio::spawn(drain_stderr(stderr, stderr_tail.clone()));
    let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>> = Arc::default();
    let (ended_tx, ended) = watch::channel(None);
    let stdin = Arc::new(tokio::sync::Mutex::new(stdin));
    let process = Process {
        pid,
        stdin: stdin.clone(),
        pending: pending.clone(),
        next_id: AtomicU64::new(1),
        ended,
        stderr: stderr_tail.clone(),
        group: Mutex::new(group),
        _cell: cell,
        temp_dir,
    };
    // The reader: answers go to their requests; the server's own requests are answered
    // (`ping`; anything else: this client offers no such capability).
    let reader_pending = pending.clone();
    let reader_tail = stderr_tail.clone();
    tokio::spawn(async move {
        // Also killed here when the runtime drops this task (the runner exits).
        let mut guard = GroupGuard(pid.map(|p| p as i32));
        let why = read_messages(stdout, &reader_pending, &stdin).await;
        let status = match tokio::time::timeout(REAP_WAIT, child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("cannot wait for it: {e}"),
            Err(_) => {
                guard.kill();
                let _ = child.wait().await;
                String::from("killed: it closed its output and did not exit")
            }
        };
        guard.disarm();
        let why = format!("{why}; {status}");
        let reply = {
            let tail = tail_text(&reader_tail);
            if tail.is_empty() {
                format!("the server ended during the request ({why})")
            } else {
                format!(
                    "the server ended during the request ({why}); the end of its stderr:\n{tail}"
                )
            }
        };
        // Ended first: a request that hears of it finds the process ended.
        let _ = ended_tx.send(Some(why));
        for (_, waiting) in reader_pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let _ = waiting.send(Err(reply.clone()));
        }
    });
    let started = async {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "wuhu-runner", "version": env!("CARGO_PKG_VERSION")},
        });
        let answer = process
            .request(
                "initialize",
                params,
                mcp::START_TIMEOUT_SECONDS,
                CancelSignal::never(),
            )
            .await
            .map_err(|f| f.message)?;
        if let Some(error) = answer.get("error") {
            return Err(format!("initialize failed: {error}"));
        }
        process
            .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
    };
    if let Err(e) = started.await {
        let tail = process.stderr_tail();
        return Err(if tail.is_empty() || e.contains("the end of its stderr") {
            e
        } else {
            format!("{e}; the end of its stderr:\n{tail}")
        });
    }
    Ok(process)
}

/// Reads newline-delimited JSON-RPC messages until the server closes its stdout; answers why
/// it stopped reading.
async fn read_messages(
    stdout: impl AsyncRead + Unpin,
    pending: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    stdin: &Arc<tokio::sync::Mutex<ChildStdin>>,
) -> String {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line_bounded(&mut reader, &mut line, mcp::MAX_MESSAGE_BYTES).await {
            Ok(Line::End) => return String::from("it closed its output"),
            Ok(Line::TooLong) => {
                // Which request it answered cannot be known without reading it whole: every
                // waiting request fails (a stdio server mostly has one at a time).
                let error = format!(
                    "the server sent a message larger than {} MiB",
                    mcp::MAX_MESSAGE_BYTES / (1024 * 1024)
                );
                for (_, waiting) in pending.lock().unwrap_or_else(|p| p.into_inner()).drain() {
                    let _ = waiting.send(Err(error.clone()));
                }
            }
            Ok(Line::Full) => {
                if let Some(answer) = dispatch(&line, pending) {
                    // Not awaited here: a server that does not read its stdin must not stop
                    // this reader.
                    let stdin = stdin.clone();
                    tokio::spawn(async move {
                        let _ = write_message(&stdin, &answer).await;
                    });
                }
            }
            Err(e) => return format!("reading its output failed: {e}"),
        }
    }
}

/// Hands an answer to its request; answers what to send back for a request of the server's.
fn dispatch(line: &[u8], pending: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>) -> Option<Value> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    // Not JSON (a server that logs to stdout): skipped, as the reference clients do.
    let Ok(message) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    let id = message.get("id");
    match (message.get("method"), id) {
        (Some(method), Some(id)) => Some(if method == "ping" {
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        } else {
            json!({"jsonrpc": "2.0", "id": id,
                       "error": {"code": -32601, "message": "this client offers no such capability"}})
        }),
        // A notification (progress, logs): not shown yet.
        (Some(_), None) => None,
        (None, Some(id)) => {
            let id = id.as_u64()?;
            let waiting = pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            if let Some(waiting) = waiting {
                let answer = if message.get("result").is_some() || message.get("error").is_some() {
                    Ok(message)
                } else {
                    Err(String::from("a malformed answer: neither result nor error"))
                };
                let _ = waiting.send(answer);
            }
            None
        }
        (None, None) => None,
    }
}

enum Line {
    Full,
    TooLong,
    End,
}

/// Reads one line into `line` (without its newline), at most `max` bytes; a longer one is read
/// to its end and dropped.
async fn read_line_bounded(
    reader: &mut (impl AsyncBufReadExt + Unpin),
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    let mut too_long = false;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(if line.is_empty() && !too_long {
                Line::End
            } else if too_long {
                Line::TooLong
            } else {
                Line::Full
            });
        }
        let (chunk, found) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (&buffer[..at], Some(at)),
            None => (buffer, None),
        };
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        let used = found.map_or(buffer.len(), |at| at + 1);
        reader.consume(used);
        if found.is_some() {
            return Ok(if too_long { Line::TooLong } else { Line::Full });
        }
    }
}

/// Keeps the last [`mcp::STDERR_TAIL_BYTES`] of a server's stderr; reads all of it, so the
/// server never blocks on a full pipe.
async fn drain_stderr(mut stderr: impl AsyncRead + Unpin, tail: Arc<Mutex<VecDeque<u8>>>) {
    let mut buffer = vec![0u8; 8192];
    while let Ok(n) = stderr.read(&mut buffer).await {
        if n == 0 {
            return;
        }
        let mut tail = tail.lock().unwrap_or_else(|p| p.into_inner());
        tail.extend(&buffer[..n]);
        let excess = tail.len().saturating_sub(mcp::STDERR_TAIL_BYTES);
        tail.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded() {
        let input: &[u8] = b"short\nxxxxxxxxxxxx\nend";
        let mut reader = BufReader::with_capacity(4, input);
        let mut line = Vec::new();
        let mut seen = Vec::new();
        loop {
            line.clear();
            match read_line_bounded(&mut reader, &mut line, 8).await.unwrap() {
                Line::End => break,
                Line::TooLong => seen.push(String::from("<too long>")),
                Line::Full => seen.push(String::from_utf8(line.clone()).unwrap()),
            }
        }
        assert_eq!(seen, ["short", "<too long>", "end"]);
    }
}
