//! The local stack: `wrangler dev` running the built Worker on an ephemeral port with a temp
//! state dir, plus a [`FakeOpenAi`] server its `OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL`
//! point at (one server, each dialect under its own path).
//!
//! Wrangler runs in its own process group (workerd is its child), so stopping signals the
//! group. A watchdog shell holding a pipe from this process kills the group when the test
//! process exits for any reason, so a stack kept in a `static` never outlives its tests.
//! The temp dir is removed when the stack goes away, unless a test failed
//! ([`Stack::guard`] or a panic during drop marks it to be kept).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::api::Api;
use crate::fake_openai::FakeOpenAi;
use crate::http::Request;
use crate::jwt;

/// The marker file that keeps a temp dir after the stack goes away.
const KEEP_MARKER: &str = "KEEP";
/// The API key the Worker is given for the openai-compatible provider.
pub const OPENAI_TEST_KEY: &str = "test-key";
/// The API key the Worker is given for the anthropic provider.
pub const ANTHROPIC_TEST_KEY: &str = "test-anthropic-key";

/// Set to `1` to keep wrangler's DevTools proxy on in tests and benchmarks (to attach DevTools
/// to a test's Worker while debugging it).
pub const KEEP_DEVTOOLS_VAR: &str = "WUHU_WRANGLER_DEVTOOLS";

/// Whether the stacks this process starts run without wrangler's DevTools proxy (the default).
pub fn devtools_off() -> bool {
    std::env::var(KEEP_DEVTOOLS_VAR).map_or(true, |v| v != "1")
}

/// Starts `wrangler dev` without its DevTools proxy, unless [`KEEP_DEVTOOLS_VAR`] is `1`.
///
/// Why: the proxy enables the runtime's `Network` inspector domain, and then every chunk of
/// every streamed subrequest (a follow stream the router relays, a provider's reply) becomes
/// an inspector event that wrangler's proxy forwards to its Node process as an HTTP request on
/// a new loopback connection. Cloudflare runs nothing like it, and it dominated what the
/// benchmarks measured on streams: 200 followers of a 1,000-delta reply saw a delivery lag p99
/// of 634–1,059 ms with it and 55–105 ms without it, alternating, same load
/// (docs/benchmarks.md). The e2e tests get the same stack as the benchmarks.
///
/// How: wrangler 4 has no flag for it; it turns the proxy off (`inspectorEnabled`) when it runs
/// in VS Code's JavaScript debug terminal, which it detects by `VSCODE_INSPECTOR_OPTIONS`.
/// Miniflare reads that variable only to attach VS Code's debugger when `NODE_OPTIONS` names
/// its bootloader, so the harness clears `NODE_OPTIONS` as well. Worker logs are unaffected:
/// they reach wrangler's output through workerd's stdout, not the inspector.
pub fn without_devtools(command: &mut Command) -> &mut Command {
    if devtools_off() {
        command
            .env("VSCODE_INSPECTOR_OPTIONS", "{}")
            .env_remove("NODE_OPTIONS");
    }
    command
}

/// How to start a stack.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// `WUHU_FAKE_DELAY_MS` (per-chunk delay of the fake provider); `None` leaves the Worker's default.
    pub fake_delay_ms: Option<u64>,
    /// More `--var NAME:VALUE` pairs.
    pub vars: Vec<(String, String)>,
    /// How long `/healthz` may take to answer 200.
    pub start_timeout: Duration,
    /// How long a SIGINT may take before SIGKILL.
    pub stop_timeout: Duration,
    /// Another program to run instead of wrangler (harness self-tests); skips the build check.
    pub wrangler_bin: Option<PathBuf>,
    /// `WUHU_JWT_SECRET`; `None` generates a strong random one.
    pub secret: Option<String>,
    /// `WUHU_ENABLE_FAKE_PROVIDER=1` (the tests drive sessions through `fake`); `false` starts
    /// the Worker as it is deployed, which refuses `fake`.
    pub fake_provider: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        StackOptions {
            fake_delay_ms: None,
            vars: Vec::new(),
            start_timeout: Duration::from_secs(60),
            stop_timeout: Duration::from_secs(10),
            wrangler_bin: None,
            secret: None,
            fake_provider: true,
        }
    }
}

/// A running Worker under `wrangler dev`.
pub struct Stack {
    options: StackOptions,
    root: PathBuf,
    wrangler_bin: PathBuf,
    dir: PathBuf,
    persist_dir: PathBuf,
    log_path: PathBuf,
    secret: String,
    /// `WUHU_CHANNEL_KEY`: kept across restarts, so sealed channel credentials still open.
    channel_key: String,
    /// `WUHU_SECRETS_KEY`: kept across restarts, so sealed secrets still open.
    secrets_key: String,
    port: u16,
    child: Option<Child>,
    watchdog: Option<Child>,
    openai: FakeOpenAi,
    starts: u32,
}

/// This test binary's stack, shared by its tests (each uses a tenant of its own): started by the
/// first call with `options`; later calls get the same one (one binary, one stack, one set of
/// options: a test that needs others starts a stack of its own).
pub fn shared_stack(options: impl FnOnce() -> StackOptions) -> &'static Stack {
    static STACK: std::sync::OnceLock<Stack> = std::sync::OnceLock::new();
    STACK.get_or_init(|| Stack::start_with(options()))
}

/// [`shared_stack`] whose `fake` provider answers at once (what most files want).
pub fn shared_fake_stack() -> &'static Stack {
    shared_stack(|| StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    })
}

impl Stack {
    /// Starts a stack with default options. Panics (with the wrangler log) when it cannot.
    pub fn start() -> Stack {
        Stack::start_with(StackOptions::default())
    }

    /// Starts a stack. Panics (with the wrangler log) when it cannot.
    pub fn start_with(options: StackOptions) -> Stack {
        let root = repo_root();
        let custom_bin = options.wrangler_bin.is_some();
        if !custom_bin {
            ensure_worker_built();
        }
        // What wrangler.toml's entry (worker/entry.mjs) imports: worker-build's output and the
        // js sandbox's own module.
        let missing: Vec<String> = [
            "wrangler.toml",
            "worker/build/index.js",
            "worker/build/sandbox_guest.wasm",
        ]
        .iter()
        .filter(|p| !custom_bin && !root.join(p).exists())
        .map(|p| root.join(p).display().to_string())
        .collect();
        assert!(
            missing.is_empty(),
            "the end-to-end tests need a built Worker; missing: {}.\n\
             Run `scripts/test` (builds it first) or `bash -c 'source scripts/lib/setup.sh && build_worker'`.",
            missing.join(", ")
        );
        let wrangler_bin = options.wrangler_bin.clone().unwrap_or_else(|| {
            std::env::var_os("WRANGLER_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("node_modules/.bin/wrangler"))
        });
        assert!(
            wrangler_bin.exists(),
            "wrangler not found at {} (set WRANGLER_BIN, or run `bash -c 'source scripts/lib/setup.sh && ensure_npm_packages'`)",
            wrangler_bin.display()
        );
        let secret = options
            .secret
            .clone()
            .unwrap_or_else(|| crate::util::random_hex(32));
        let dir = crate::util::make_temp_dir("wuhu-e2e");
        let persist_dir = dir.join("state");
        std::fs::create_dir_all(&persist_dir).expect("create state dir");
        let mut stack = Stack {
            options,
            root,
            wrangler_bin,
            log_path: dir.join("wrangler.log"),
            dir,
            persist_dir,
            secret,
            channel_key: crate::util::random_hex(32),
            secrets_key: crate::util::random_hex(32),
            port: 0,
            child: None,
            watchdog: None,
            openai: FakeOpenAi::start(),
            starts: 0,
        };
        stack.spawn_and_wait();
        stack
    }

    /// SIGKILLs wrangler and workerd (no graceful shutdown), then starts again on the same
    /// state dir, secret and fake OpenAI server. The port changes: use [`Stack::url`] afresh.
    pub fn restart_killed(&mut self) {
        self.kill_group(libc::SIGKILL, Duration::ZERO);
        self.spawn_and_wait();
    }

    /// Stops gracefully (SIGINT, then SIGKILL after the stop timeout) and starts again on the
    /// same state.
    pub fn restart(&mut self) {
        let timeout = self.options.stop_timeout;
        self.kill_group(libc::SIGINT, timeout);
        self.spawn_and_wait();
    }

    /// Sets `WUHU_SECRETS_KEY` for the next start (it is kept across restarts otherwise);
    /// returns the key it replaces (for `WUHU_SECRETS_KEY_PREVIOUS`, see `docs/deploy.md`).
    pub fn set_secrets_key(&mut self, key: String) -> String {
        std::mem::replace(&mut self.secrets_key, key)
    }

    /// Sets `--var NAME:VALUE` for the next start (`None` drops it): it takes effect at the next
    /// [`Stack::restart`] or [`Stack::restart_killed`] (a fault that ends, say).
    pub fn set_var(&mut self, name: &str, value: Option<&str>) {
        self.options.vars.retain(|(n, _)| n != name);
        if let Some(value) = value {
            self.options
                .vars
                .push((name.to_string(), value.to_string()));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An absolute URL for `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// The fake OpenAI server behind `OPENAI_BASE_URL`.
    pub fn openai(&self) -> &FakeOpenAi {
        &self.openai
    }

    /// The JWT secret the Worker was given.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The `--persist-to` dir (DO SQLite, R2 objects).
    pub fn persist_dir(&self) -> &Path {
        &self.persist_dir
    }

    /// The temp dir holding state and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The wrangler stdout+stderr log.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The JSON lines of the Worker's log (`observe`: request and turn lines), in order.
    pub fn log_events(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        text.lines()
            .filter_map(|line| line.find("{\"").map(|i| &line[i..]))
            .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
            .filter(|v| v.get("event").is_some())
            .collect()
    }

    /// The last `lines` lines of the wrangler log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path, lines)
    }

    /// The PID of the wrangler process (also its process group id).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A valid user token (1 h).
    pub fn user_token(&self, sub: &str, tenant: &str) -> String {
        jwt::hs256(self.secret.as_bytes(), &jwt::user_claims(sub, tenant, 3600))
    }

    /// A valid runner token (`typ: "runner"`), which the user API must refuse.
    pub fn runner_token(&self, sub: &str, tenant: &str) -> String {
        jwt::hs256(
            self.secret.as_bytes(),
            &jwt::runner_claims(sub, tenant, 3600),
        )
    }

    /// A token with exactly these claims, signed with the stack's secret.
    pub fn token_with_claims(&self, claims: &serde_json::Value) -> String {
        jwt::hs256(self.secret.as_bytes(), claims)
    }

    /// A valid admin token (1 h).
    pub fn admin_token(&self, sub: &str, tenant: &str) -> String {
        let mut claims = jwt::user_claims(sub, tenant, 3600);
        claims["role"] = serde_json::json!("admin");
        self.token_with_claims(&claims)
    }

    /// A runner token with `runnerKind: "cloud"`: only an operator holding the secret mints one.
    pub fn cloud_runner_token(&self, sub: &str, tenant: &str) -> String {
        let mut claims = jwt::runner_claims(sub, tenant, 3600);
        claims["runnerKind"] = serde_json::json!("cloud");
        self.token_with_claims(&claims)
    }

    /// An API client authenticated as an admin `sub` in `tenant`.
    pub fn admin_client(&self, sub: &str, tenant: &str) -> Api {
        Api::new(self.base_url(), Some(self.admin_token(sub, tenant)))
    }

    /// A correctly signed token that expired an hour ago.
    pub fn expired_token(&self, sub: &str, tenant: &str) -> String {
        jwt::hs256(
            self.secret.as_bytes(),
            &jwt::user_claims(sub, tenant, -3600),
        )
    }

    /// A token signed with another secret.
    pub fn bad_signature_token(&self, sub: &str, tenant: &str) -> String {
        jwt::hs256(
            b"not-the-worker-secret",
            &jwt::user_claims(sub, tenant, 3600),
        )
    }

    /// An unsigned `alg: none` token.
    pub fn alg_none_token(&self, sub: &str, tenant: &str) -> String {
        jwt::alg_none(&jwt::user_claims(sub, tenant, 3600))
    }

    /// An API client authenticated as `sub` in `tenant`.
    pub fn client(&self, sub: &str, tenant: &str) -> Api {
        Api::new(self.base_url(), Some(self.user_token(sub, tenant)))
    }

    /// A client for `sub` in a fresh tenant and a session on `provider` with a fresh model name
    /// (`model_prefix` + a unique suffix), so tests sharing one stack script the fakes apart.
    /// Returns the client, the session id and the model name.
    pub fn provider_session(
        &self,
        sub: &str,
        provider: &str,
        model_prefix: &str,
        system_prompt: &str,
    ) -> (Api, String, String) {
        let api = self.client(sub, &crate::util::unique_name(provider));
        let model = crate::util::unique_name(model_prefix);
        let session = api.create_session(serde_json::json!({
            "provider": provider, "model": model, "systemPrompt": system_prompt
        }));
        assert_eq!(
            (session.provider.as_str(), session.model.as_str()),
            (provider, model.as_str()),
            "the session keeps the provider and model it was created with"
        );
        (api, session.id, model)
    }

    /// An API client with this raw token (or none).
    pub fn client_with_token(&self, token: Option<String>) -> Api {
        Api::new(self.base_url(), token)
    }

    /// Whether `GET /healthz` answers 200 right now.
    pub fn healthz_ok(&self) -> bool {
        Request::new("GET", self.url("/healthz"))
            .timeout(Duration::from_secs(5))
            .send()
            .is_ok_and(|r| r.status == 200)
    }

    /// A guard for one test on a shared stack: if the test panics, it prints the wrangler log
    /// tail and keeps the temp dir; if the test runs past [`TEST_DEADLINE`], the test process
    /// ends (see [`watchdog`]).
    pub fn guard(&self) -> FailureGuard<'_> {
        FailureGuard {
            stack: self,
            watch: watchdog::watch(self.log_path.clone()),
        }
    }

    /// Marks the temp dir to be kept after the stack goes away.
    pub fn keep_dir(&self) {
        let _ = File::create(self.dir.join(KEEP_MARKER));
    }

    fn spawn_and_wait(&mut self) {
        self.starts += 1;
        // wrangler binds its own ephemeral ports (`--port 0`) and says which in its "Ready on"
        // line. A port picked here and handed over ([`free_port`]) could be taken in between
        // by any other listener on the machine (another test's fake server): then wrangler
        // failed to start, or, worse, the fake answered `/healthz` and the test talked to it.
        self.port = 0;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open wrangler log");
        let _ = writeln!(log, "===== wuhu-e2e: start #{} =====", self.starts);
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut vars = vec![
            ("WUHU_JWT_SECRET".to_string(), self.secret.clone()),
            ("OPENAI_BASE_URL".to_string(), self.openai.base_url()),
            ("OPENAI_API_KEY".to_string(), OPENAI_TEST_KEY.to_string()),
            // The same fake server speaks the Anthropic Messages dialect under `/v1/messages`.
            (
                "ANTHROPIC_BASE_URL".to_string(),
                self.openai.anthropic_base_url(),
            ),
            (
                "ANTHROPIC_API_KEY".to_string(),
                ANTHROPIC_TEST_KEY.to_string(),
            ),
            ("WUHU_CHANNEL_KEY".to_string(), self.channel_key.clone()),
            ("WUHU_SECRETS_KEY".to_string(), self.secrets_key.clone()),
        ];
        if self.options.fake_provider {
            vars.push(("WUHU_ENABLE_FAKE_PROVIDER".to_string(), "1".to_string()));
        }
        if let Some(ms) = self.options.fake_delay_ms {
            vars.push(("WUHU_FAKE_DELAY_MS".to_string(), ms.to_string()));
        }
        // The tests (and the benchmarks) drive thousands of calls as one person on purpose:
        // rate limits are off unless a test turns them on (tests/tests/rate_limits.rs).
        if !self
            .options
            .vars
            .iter()
            .any(|(name, _)| name == "WUHU_RATE_LIMITS")
        {
            vars.push(("WUHU_RATE_LIMITS".to_string(), "off".to_string()));
        }
        vars.extend(self.options.vars.iter().cloned());
        let env_file = self.dir.join("test.env");
        std::fs::write(
            &env_file,
            "# wuhu-e2e: every variable is passed with --var\n",
        )
        .expect("write test.env");
        // With the DevTools proxy off, its port is one this harness holds until the stack is
        // up: a wrangler that starts the proxy anyway (an upgrade that changed how it is turned
        // off) cannot bind it and exits, and the start fails saying why, instead of every
        // benchmark quietly paying the proxy's tax again.
        let inspector_port_held = devtools_off().then(|| {
            std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port for the inspector")
        });
        let inspector_port = inspector_port_held
            .as_ref()
            .map_or(0, |l| l.local_addr().expect("held port").port());
        let mut command = Command::new(&self.wrangler_bin);
        command
            .current_dir(&self.root)
            .args(["dev", "--ip", "127.0.0.1", "--port", "0"])
            .args(["--inspector-port", &inspector_port.to_string()])
            .arg("--persist-to")
            .arg(&self.persist_dir)
            .arg("--show-interactive-dev-session=false")
            // An env file of our own keeps a developer's `.dev.vars` (or `.env`) out of the
            // tests: wrangler reads neither when `--env-file` is given.
            .arg("--env-file")
            .arg(&env_file);
        for (name, value) in &vars {
            command.arg("--var").arg(format!("{name}:{value}"));
        }
        without_devtools(&mut command)
            .env("WRANGLER_SEND_METRICS", "false")
            .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
            .env("WRANGLER_LOG_PATH", self.dir.join("wrangler-debug-logs"))
            .env("NO_COLOR", "1")
            .env("FORCE_COLOR", "0")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .process_group(0);
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawn {}: {err}", self.wrangler_bin.display()));
        let pgid = child.id();
        self.child = Some(child);
        self.watchdog = spawn_watchdog(pgid, &self.dir);

        let deadline = Instant::now() + self.options.start_timeout;
        loop {
            if self.port == 0 {
                self.port = ready_port(&self.log_path, log_start).unwrap_or(0);
            }
            if self.port != 0 && self.healthz_ok() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.keep_dir();
                let tail = self.log_tail(80);
                if inspector_port != 0
                    && tail.contains(&format!(
                        "Address already in use (127.0.0.1:{inspector_port})"
                    ))
                {
                    panic!(
                        "wrangler started its DevTools proxy although {} is not 1 (it tried to \
                         listen on the inspector port this harness holds, {inspector_port}): a \
                         wrangler upgrade changed how the proxy is turned off (see \
                         `without_devtools`). With the proxy on, every streamed subrequest is \
                         slowed down and the benchmarks measure wrangler. Log {}:\n{tail}",
                        KEEP_DEVTOOLS_VAR,
                        self.log_path.display()
                    );
                }
                panic!(
                    "wrangler exited ({status}) before /healthz answered; log {}:\n{tail}",
                    self.log_path.display()
                );
            }
            if Instant::now() >= deadline {
                self.keep_dir();
                let tail = self.log_tail(80);
                self.kill_group(libc::SIGKILL, Duration::ZERO);
                panic!(
                    "/healthz did not answer 200 within {:?}; log {}:\n{tail}",
                    self.options.start_timeout,
                    self.log_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Signals the process group, waits up to `grace` for wrangler to exit, then SIGKILLs
    /// whatever is left of the group and waits until it is gone.
    fn kill_group(&mut self, signal: libc::c_int, grace: Duration) {
        if let Some(mut watchdog) = self.watchdog.take() {
            // The shell and its `cat` share their own group.
            signal_group(watchdog.id() as libc::pid_t, libc::SIGKILL);
            let _ = watchdog.wait();
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = child.id() as libc::pid_t;
        signal_group(pgid, signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(pgid, libc::SIGKILL);
        let _ = child.wait();
        // workerd is not our child: wait until the group is empty.
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_alive(pgid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            self.keep_dir();
            eprintln!(
                "wuhu-e2e: keeping {} ; wrangler log tail:\n{}",
                self.dir.display(),
                self.log_tail(60)
            );
        }
        let timeout = self.options.stop_timeout;
        self.kill_group(libc::SIGINT, timeout);
        if !self.dir.join(KEEP_MARKER).exists() && std::env::var_os("WUHU_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// See [`Stack::guard`].
pub struct FailureGuard<'a> {
    stack: &'a Stack,
    watch: u64,
}

impl Drop for FailureGuard<'_> {
    fn drop(&mut self) {
        watchdog::unwatch(self.watch);
        if std::thread::panicking() {
            self.stack.keep_dir();
            eprintln!(
                "wuhu-e2e: test failed; keeping {} ; wrangler log tail:\n{}",
                self.stack.dir.display(),
                self.stack.log_tail(60)
            );
        }
    }
}

/// How long one test holding a [`FailureGuard`] may run. A hung test must fail the run, naming
/// itself, long before the CI's own limit ends everything without a word.
/// `WUHU_E2E_TEST_DEADLINE` (seconds) overrides it.
pub const TEST_DEADLINE: Duration = Duration::from_secs(600);

fn test_deadline() -> Duration {
    std::env::var("WUHU_E2E_TEST_DEADLINE")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(TEST_DEADLINE, Duration::from_secs)
}

/// Ends the test process when a guarded test outlives [`TEST_DEADLINE`]: it prints the test's
/// name and the wrangler log tail, then exits with 101 (libtest's failure code). The stacks'
/// own watchdog shells (see [`Stack`]) kill the wrangler groups when the process is gone.
mod watchdog {
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::{Mutex, Once};
    use std::time::{Duration, Instant};

    struct Watched {
        id: u64,
        test: String,
        log: PathBuf,
        since: Instant,
    }

    static WATCHED: Mutex<(u64, Vec<Watched>)> = Mutex::new((0, Vec::new()));
    static START: Once = Once::new();
    /// How often the deadline is checked.
    const CHECK_EVERY: Duration = Duration::from_secs(5);

    pub(super) fn watch(log: PathBuf) -> u64 {
        START.call_once(|| {
            std::thread::Builder::new()
                .name("wuhu-e2e-watchdog".into())
                .spawn(run)
                .expect("spawn the test watchdog");
        });
        let test = std::thread::current()
            .name()
            .unwrap_or("a test on the main thread")
            .to_string();
        let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        watched.0 += 1;
        let id = watched.0;
        watched.1.push(Watched {
            id,
            test,
            log,
            since: Instant::now(),
        });
        id
    }

    pub(super) fn unwatch(id: u64) {
        let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        watched.1.retain(|w| w.id != id);
    }

    fn run() {
        loop {
            std::thread::sleep(CHECK_EVERY);
            let watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(late) = watched
                .1
                .iter()
                .find(|w| w.since.elapsed() > super::test_deadline())
            {
                // Straight to fd 2: `eprintln!` in a thread spawned by a test goes to that
                // test's captured output, which is lost when the process exits.
                let _ = writeln!(
                    std::io::stderr(),
                    "wuhu-e2e: test `{}` has run for over {} s: ending the test process. \
                     Wrangler log tail:\n{}",
                    late.test,
                    super::test_deadline().as_secs(),
                    super::tail(&late.log, 60)
                );
                std::process::exit(101);
            }
        }
    }
}

/// Builds the Worker once per test process when its inputs changed since `worker/build` was
/// built (`build_worker` in scripts/lib/setup.sh: a content hash kept beside the build; a
/// fraction of a second when nothing changed), so a test never runs against a stale Worker.
/// `WUHU_WORKER_BUILT=1` skips it (scripts/test sets it after building).
pub fn ensure_worker_built() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        if std::env::var_os("WUHU_WORKER_BUILT").is_some_and(|v| v == "1") {
            return;
        }
        let status = Command::new("bash")
            .args(["-c", "source scripts/lib/setup.sh && build_worker"])
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .status()
            .expect("run bash");
        assert!(
            status.success(),
            "building the Worker failed ({status}); see the output above"
        );
    });
}

/// The workspace root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The port of wrangler's `Ready on http://127.0.0.1:PORT` line, in the log after `offset`.
pub fn ready_port(log_path: &Path, offset: u64) -> Option<u16> {
    let mut file = File::open(log_path).ok()?;
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    const READY: &str = "Ready on http://127.0.0.1:";
    let rest = &text[text.find(READY)? + READY.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|port| *port != 0)
}

/// An ephemeral port that was free a moment ago (nothing listens there now: a test's
/// "unreachable server"). Never hand it to a server to bind: another listener may take it
/// first; let the server bind port 0 and say which it got.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

/// Sends `signal` to process group `pgid` (never to groups 0 and 1).
pub fn signal_group(pgid: libc::pid_t, signal: libc::c_int) {
    if pgid > 1 {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Whether any process of group `pgid` is alive.
pub fn group_alive(pgid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pgid > 1 && unsafe { libc::kill(-pgid, 0) } == 0
}

/// A shell that waits for EOF on its stdin (our end of the pipe closes when this process
/// exits), then stops the group and removes the temp dir unless it is marked to be kept.
fn spawn_watchdog(pgid: u32, dir: &Path) -> Option<Child> {
    let script = r#"
cat >/dev/null
kill -s INT -- "-$1" 2>/dev/null
i=0
while kill -s 0 -- "-$1" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -s KILL -- "-$1" 2>/dev/null
if [ ! -e "$2/KEEP" ] && [ -z "$WUHU_E2E_KEEP" ]; then rm -rf "$2"; fi
"#;
    Command::new("sh")
        .args(["-c", script, "wuhu-e2e-watchdog", &pgid.to_string()])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    let _ = file.seek(SeekFrom::Start(start));
    let mut text = String::new();
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    text.push_str(&String::from_utf8_lossy(&bytes));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for wrangler: serves `/healthz` on `--port` (0: an ephemeral one), says where as
    /// wrangler does, and has a child (like workerd).
    const FAKE_WRANGLER: &str = r#"#!/usr/bin/env python3
import http.server, subprocess, sys, os
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
child = subprocess.Popen(["sleep", "1000"])
print(f"pids {os.getpid()} {child.pid}", flush=True)
print("args " + " ".join(args), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), H)
print(f"[wrangler:info] Ready on http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
"#;

    fn pids(stack: &Stack) -> Vec<libc::pid_t> {
        let log = std::fs::read_to_string(stack.log_path()).unwrap();
        let line = log
            .lines()
            .rfind(|l| l.starts_with("pids "))
            .expect("pids line");
        line.split(' ')
            .skip(1)
            .map(|p| p.parse().unwrap())
            .collect()
    }

    fn alive(pid: libc::pid_t) -> bool {
        // A zombie of ours would still count; these are all reaped or not our children.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
    }

    #[test]
    fn stack_kills_the_whole_group_on_restart_and_drop() {
        let script_dir = crate::util::make_temp_dir("wuhu-e2e-fake-wrangler");
        let script = script_dir.join("wrangler");
        std::fs::write(&script, FAKE_WRANGLER).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let options = StackOptions {
            wrangler_bin: Some(script),
            fake_delay_ms: Some(0),
            stop_timeout: Duration::from_secs(3),
            ..StackOptions::default()
        };
        let mut stack = Stack::start_with(options);
        assert!(stack.healthz_ok());
        let log = std::fs::read_to_string(stack.log_path()).unwrap();
        assert!(
            log.contains(&format!("--var WUHU_JWT_SECRET:{}", stack.secret())),
            "{log}"
        );
        assert!(log.contains("--var WUHU_FAKE_DELAY_MS:0"), "{log}");
        assert!(
            log.contains(&format!(
                "--var OPENAI_BASE_URL:{}",
                stack.openai().base_url()
            )),
            "{log}"
        );
        let first = pids(&stack);
        let first_port = stack.base_url();
        stack.restart_killed();
        assert!(
            first.iter().all(|&p| !alive(p)),
            "old group survived: {first:?}"
        );
        assert!(stack.healthz_ok());
        assert_ne!(stack.base_url(), first_port);
        let second = pids(&stack);
        assert_ne!(first, second);
        let dir = stack.dir().to_path_buf();
        drop(stack);
        assert!(
            second.iter().all(|&p| !alive(p)),
            "group survived drop: {second:?}"
        );
        assert!(!dir.exists(), "temp dir kept after a clean drop");
        let _ = std::fs::remove_dir_all(script_dir);
    }
}
