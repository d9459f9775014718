//! Stdio MCP servers of an environment (issue 33), as `mcp_request` calls run them: the official
//! reference server (`@modelcontextprotocol/server-everything`, stdio mode, from the repository's
//! `node_modules`) started in a cell on its first request, kept between requests, killed
//! mid-call, started again at most `MAX_RESTARTS` times, and gone with its whole process group
//! after detach. The session's side is `tests/tests/mcp_client.rs`.
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::cell::CellSettings;
use wuhu_core::wire::runner::mcp::{self, McpRequest, McpResponse, StdioServer};
use wuhu_core::wire::runner::{
    EnvironmentContext, EnvironmentKind, SandboxMode, SecretEnv, Snapshot,
};
use wuhu_runner::cell::Cells;
use wuhu_runner::executor::RunnerDirs;
use wuhu_runner::mcp_servers::{McpServers, Place};
use wuhu_runner::tools::{CancelSignal, ToolOutput};

const SESSION: &str = "11111111-1111-4111-8111-111111111111";

struct World {
    _base: tempfile::TempDir,
    home: PathBuf,
    root: PathBuf,
    dirs: RunnerDirs,
    cells: Arc<Cells>,
    servers: Arc<McpServers>,
    node_modules: PathBuf,
}

fn node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../node_modules")
        .canonicalize()
        .expect("node_modules at the repository's root (npm ci)")
}

impl World {
    fn new() -> World {
        let base = tempfile::tempdir().unwrap();
        let top = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "mcp-{}",
            base.path().file_name().unwrap().to_string_lossy()
        ));
        let home = top.join("home");
        let workspaces = home.join(".wuhu/workspaces");
        let root = workspaces.join(SESSION);
        std::fs::create_dir_all(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let home = home.canonicalize().unwrap();
        std::fs::write(home.join(".wuhu/runner.yml"), "token: the-runner-token\n").unwrap();
        let run_dir = home.join(".wuhu/run");
        let dirs = RunnerDirs::private(&run_dir).unwrap();
        let protected = wuhu_runner::secrets::protected_paths(
            Some(&home),
            Some(&home.join(".wuhu/runner.yml")),
            &run_dir,
            &workspaces,
            &[],
        );
        let cells = Cells::with_exe(
            PathBuf::from(env!("CARGO_BIN_EXE_wuhu-runner")),
            SandboxMode::On,
            protected,
            &run_dir,
            true,
        )
        .expect("this machine makes cells");
        World {
            _base: base,
            home,
            root,
            dirs,
            cells,
            servers: Arc::default(),
            node_modules: node_modules(),
        }
    }

    fn context(&self) -> EnvironmentContext {
        let env = BTreeMap::from([(
            String::from("PATH"),
            String::from("/usr/local/bin:/usr/bin:/bin"),
        )]);
        EnvironmentContext {
            name: String::from("api"),
            kind: EnvironmentKind::FolderTemplate,
            root: self.root.to_string_lossy().into_owned(),
            snapshot: Snapshot {
                cwd: self.root.to_string_lossy().into_owned(),
                env,
                captured_at: 0,
            },
            repo_path: None,
            branch: None,
            // The reference server's code is read (and run by node) from the repository.
            cell: CellSettings {
                read_only_paths: vec![self.node_modules.to_string_lossy().into_owned()],
                ..Default::default()
            },
        }
    }

    /// The reference server in stdio mode; `before` runs first in the same shell (whose
    /// process group the server then leads).
    fn everything(&self, before: &str) -> StdioServer {
        let entry = self
            .node_modules
            .join("@modelcontextprotocol/server-everything/dist/index.js");
        StdioServer {
            name: String::from("every"),
            command: String::from("bash"),
            args: vec![
                String::from("-c"),
                format!("{before} exec node {} stdio", entry.display()),
            ],
            env: BTreeMap::from([(String::from("GREETING"), String::from("hola"))]),
            secrets: Vec::new(),
        }
    }

    async fn request(
        &self,
        server: &StdioServer,
        method: &str,
        params: Value,
        timeout: Option<u32>,
        cancel: CancelSignal,
    ) -> ToolOutput {
        self.request_with_secrets(
            server,
            method,
            params,
            timeout,
            cancel,
            &SecretEnv::default(),
        )
        .await
    }

    async fn request_with_secrets(
        &self,
        server: &StdioServer,
        method: &str,
        params: Value,
        timeout: Option<u32>,
        cancel: CancelSignal,
        secret_env: &SecretEnv,
    ) -> ToolOutput {
        let request = McpRequest {
            server: server.clone(),
            method: method.into(),
            params,
            timeout_seconds: timeout,
        };
        let context = self.context();
        let place = Place {
            dirs: &self.dirs,
            cells: Some(&self.cells),
            session_id: SESSION,
            environment: &context,
        };
        self.servers
            .call(
                &place,
                serde_json::to_value(request).unwrap(),
                secret_env,
                cancel,
            )
            .await
    }

    async fn tool(
        &self,
        server: &StdioServer,
        name: &str,
        arguments: Value,
    ) -> Result<Value, String> {
        let out = self
            .request(
                server,
                "tools/call",
                json!({"name": name, "arguments": arguments}),
                None,
                CancelSignal::never(),
            )
            .await;
        result(out)
    }
}

fn result(out: ToolOutput) -> Result<Value, String> {
    if out.is_error {
        return Err(out.content);
    }
    let response: McpResponse = serde_json::from_value(out.details.unwrap()).unwrap();
    match response.error {
        Some(e) => Err(format!("rpc {}: {}", e.code, e.message)),
        None => Ok(response.result),
    }
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Whether any process of the group `pgid` is left (a zombie counts until it is reaped).
fn group_alive(pgid: u32) -> bool {
    unsafe { libc::kill(-(pgid as i32), 0) == 0 }
}

/// Whether every process of the group `pgid` is gone within 2 s: the wrapper is reaped by
/// the runner; what it forked (PID 1 of the cell's PID namespace and below) dies with it and
/// is reaped by the machine's init, soon after.
async fn gone(pgid: u32) -> bool {
    for _ in 0..100 {
        if !group_alive(pgid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Processes of the group `pgid`, from `/proc`.
fn group_members(pgid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid pgrp ...: the fields after the last ')'.
            let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
            after.split_whitespace().nth(2) == Some(&*pgid.to_string())
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_runs_in_the_cell_and_is_gone_after_detach() {
    let world = World::new();
    // A child of the server's shell, in its process group: it must go with the server.
    let server = world.everything(&format!(
        "sleep 1000 & echo $! > sleeper.pid; env > env.txt; cat {} > token.txt 2>&1;",
        world.home.join(".wuhu/runner.yml").display()
    ));

    let listed = result(
        world
            .request(
                &server,
                "tools/list",
                json!({}),
                None,
                CancelSignal::never(),
            )
            .await,
    )
    .unwrap();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"get-sum"),
        "{names:?}"
    );
    let echoed = world
        .tool(&server, "echo", json!({"message": "hi"}))
        .await
        .unwrap();
    assert_eq!(text(&echoed), "Echo: hi");
    let sum = world
        .tool(&server, "get-sum", json!({"a": 2, "b": 3}))
        .await
        .unwrap();
    assert_eq!(text(&sum), "The sum of 2 and 3 is 5.");
    // One process served all three: it is kept.
    let pids = world.servers.pids(SESSION, "api").await;
    assert_eq!(pids.len(), 1);
    // A JSON-RPC error is the server's answer, not a failure of the runner.
    let unknown = world.tool(&server, "no-such-tool", json!({})).await;
    assert!(
        matches!(&unknown, Ok(r) if r["isError"] == true)
            || matches!(&unknown, Err(e) if e.starts_with("rpc")),
        "{unknown:?}"
    );

    // Its environment: the snapshot's variables and the entry's, the cell's home and temp dir,
    // the environment's directory; never the runner's token file in reach.
    let env = std::fs::read_to_string(world.root.join("env.txt")).unwrap();
    assert!(env.contains("GREETING=hola"), "{env}");
    assert!(env.contains("PWD=") && env.contains(&*world.root.to_string_lossy()));
    let token = std::fs::read_to_string(world.root.join("token.txt")).unwrap();
    assert!(!token.contains("the-runner-token"), "{token}");
    assert!(
        env.contains(&format!("TMPDIR={}", world.dirs.temp_root.display())),
        "{env}"
    );

    // A request that takes longer than its timeout fails, and the server serves the next.
    let slow = world
        .request(
            &server,
            "tools/call",
            json!({"name": "trigger-long-running-operation", "arguments": {"duration": 5, "steps": 5}}),
            Some(1),
            CancelSignal::never(),
        )
        .await;
    assert!(
        slow.is_error && slow.content == "no answer within 1 s",
        "{}",
        slow.content
    );
    assert_eq!(world.servers.pids(SESSION, "api").await, pids);

    // Killed mid-call: the call fails saying so, and the next request starts it again.
    let call = {
        let server = server.clone();
        let world = &world;
        async move {
            world
                .request(
                    &server,
                    "tools/call",
                    json!({"name": "trigger-long-running-operation", "arguments": {"duration": 30, "steps": 3}}),
                    None,
                    CancelSignal::never(),
                )
                .await
        }
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The server's whole group (its cell's wrapper, node, the sleeper), as a crash or the
        // OOM killer would.
        unsafe { libc::kill(-(pids[0] as i32), libc::SIGKILL) };
    };
    let (killed, ()) = tokio::join!(call, killer);
    assert!(killed.is_error, "{}", killed.content);
    assert!(
        killed
            .content
            .starts_with("the server ended during the request"),
        "{}",
        killed.content
    );
    let again = world
        .tool(&server, "echo", json!({"message": "back"}))
        .await
        .unwrap();
    assert_eq!(text(&again), "Echo: back");
    let restarted = world.servers.pids(SESSION, "api").await;
    assert_eq!(restarted.len(), 1);
    assert_ne!(restarted, pids);
    // The cell's wrapper, node and the sleeper (the cell's PID 1 forked by the wrapper).
    let members = group_members(restarted[0]);
    assert!(members >= 3, "{members} processes in the server's group");
    assert!(
        gone(pids[0]).await,
        "the killed server's group was not reaped"
    );

    // Detach: the server and everything of its group are gone when stop answers.
    assert_eq!(world.servers.stop(SESSION, "api").await, 1);
    assert!(
        gone(restarted[0]).await,
        "a process of the server's group outlived detach"
    );
    assert!(world.servers.pids(SESSION, "api").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_keeps_dying_is_started_at_most_max_restarts_times() {
    let world = World::new();
    let counter = world.root.join("starts");
    let dying = StdioServer {
        name: String::from("dies"),
        command: String::from("bash"),
        args: vec![
            String::from("-c"),
            format!(
                "echo start >> {}; echo 'no such luck' >&2; exit 3",
                counter.display()
            ),
        ],
        env: BTreeMap::new(),
        secrets: Vec::new(),
    };
    for attempt in 0..=mcp::MAX_RESTARTS {
        let out = world
            .request(&dying, "tools/list", json!({}), None, CancelSignal::never())
            .await;
        assert!(out.is_error, "{}", out.content);
        assert!(
            out.content.starts_with("the server did not start")
                && out.content.contains("no such luck"),
            "attempt {attempt}: {}",
            out.content
        );
    }
    let refused = world
        .request(&dying, "tools/list", json!({}), None, CancelSignal::never())
        .await;
    assert!(
        refused.is_error
            && refused
                .content
                .contains("it is not started again until the environment is attached again"),
        "{}",
        refused.content
    );
    let starts = std::fs::read_to_string(&counter).unwrap().lines().count();
    assert_eq!(starts, mcp::MAX_RESTARTS as usize + 1);
    // Attached again (detach, then a first request): it gets its starts back.
    world.servers.stop(SESSION, "api").await;
    let out = world
        .request(&dying, "tools/list", json!({}), None, CancelSignal::never())
        .await;
    assert!(
        out.content.starts_with("the server did not start"),
        "{}",
        out.content
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_bounded_at_4_mib_read_and_1_mib_relayed() {
    let world = World::new();
    // A server that answers a request with a result of `params.size` bytes, and pings us first.
    let script = r#"
        const rl = require("readline").createInterface({input: process.stdin});
        const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
        rl.on("line", (l) => {
            const m = JSON.parse(l);
            if (m.id === undefined || m.method === undefined) return;
            if (m.method === "initialize") {
                send({jsonrpc: "2.0", id: "p1", method: "ping"});
                return send({jsonrpc: "2.0", id: m.id, result: {protocolVersion: "2025-06-18", capabilities: {}, serverInfo: {name: "big", version: "1"}}});
            }
            send({jsonrpc: "2.0", id: m.id, result: {text: "x".repeat(m.params.size)}});
        });
    "#;
    let big = StdioServer {
        name: String::from("big"),
        command: String::from("node"),
        args: vec![String::from("-e"), script.to_string()],
        env: BTreeMap::new(),
        secrets: Vec::new(),
    };
    let sized = |size: usize| {
        let world = &world;
        let big = big.clone();
        async move {
            world
                .request(
                    &big,
                    "x/size",
                    json!({"size": size}),
                    Some(20),
                    CancelSignal::never(),
                )
                .await
        }
    };
    let small = result(sized(10).await).unwrap();
    assert_eq!(small["text"], "xxxxxxxxxx");
    // Just within what a result may carry back; just past it.
    let fits = mcp::MAX_RELAYED_RESULT_BYTES - r#"{"result":{"text":""}}"#.len();
    let relayed = result(sized(fits).await).unwrap();
    assert_eq!(relayed["text"].as_str().unwrap().len(), fits);
    let too_big_to_relay = sized(fits + 1).await;
    assert!(
        too_big_to_relay.is_error && too_big_to_relay.content.contains("more than the"),
        "{}",
        too_big_to_relay.content
    );
    // A message past 4 MiB is not read whole: the request fails, the server serves on.
    let too_big = sized(mcp::MAX_MESSAGE_BYTES).await;
    assert!(
        too_big.is_error && too_big.content == "the server sent a message larger than 4 MiB",
        "{}",
        too_big.content
    );
    let after = result(sized(3).await).unwrap();
    assert_eq!(after["text"], "xxx");
    assert_eq!(world.servers.pids(SESSION, "api").await.len(), 1);
    world.servers.stop(SESSION, "api").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_no_request_uses_is_stopped_and_the_next_request_starts_it_again() {
    let mut world = World::new();
    world.servers = Arc::new(McpServers::with_idle_stop(Duration::from_millis(800)));
    let server = world.everything("");
    let first = world.tool(&server, "echo", json!({"message": "one"})).await;
    assert_eq!(text(&first.unwrap()), "Echo: one");
    let pids = world.servers.pids(SESSION, "api").await;
    assert_eq!(pids.len(), 1);
    // A request that outlasts the idle time keeps it: it is in use.
    let slow = world
        .tool(
            &server,
            "trigger-long-running-operation",
            json!({"duration": 2, "steps": 2}),
        )
        .await;
    assert!(slow.is_ok(), "{slow:?}");
    assert_eq!(world.servers.pids(SESSION, "api").await, pids);
    assert!(
        gone_within(&world, Duration::from_secs(10)).await,
        "the idle server was kept"
    );
    assert!(
        gone(pids[0]).await,
        "the idle server's group was not stopped"
    );
    let again = world.tool(&server, "echo", json!({"message": "two"})).await;
    assert_eq!(text(&again.unwrap()), "Echo: two");
    let restarted = world.servers.pids(SESSION, "api").await;
    assert!(restarted.len() == 1 && restarted != pids, "{restarted:?}");
    world.servers.stop(SESSION, "api").await;
}

/// Whether the world's servers of `api` are all stopped within `timeout`.
async fn gone_within(world: &World, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if world.servers.pids(SESSION, "api").await.is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_secrets_are_in_its_environment_and_a_changed_value_starts_it_again() {
    let world = World::new();
    let mut server = world.everything("");
    server.secrets = vec![String::from("API_TOKEN")];
    // The server's environment as `get-env` prints it, started (or not) with this value.
    let env_with = |value: &'static str| {
        let (world, server) = (&world, &server);
        async move {
            let secrets = SecretEnv(BTreeMap::from([(String::from("API_TOKEN"), value.into())]));
            let get_env = json!({"name": "get-env", "arguments": {}});
            let out = world
                .request_with_secrets(
                    server,
                    "tools/call",
                    get_env,
                    None,
                    CancelSignal::never(),
                    &secrets,
                )
                .await;
            text(&result(out).unwrap())
        }
    };

    let env = env_with("v-one").await;
    assert!(env.contains("\"API_TOKEN\": \"v-one\""), "{env}");
    assert!(env.contains("\"GREETING\": \"hola\""), "{env}");
    let pids = world.servers.pids(SESSION, "api").await;
    assert_eq!(pids.len(), 1);

    // The same values: the same process.
    assert!(env_with("v-one").await.contains("v-one"));
    assert_eq!(world.servers.pids(SESSION, "api").await, pids);

    // A value changed in the vault: a new process with the new value (the old one is gone).
    let env = env_with("v-two").await;
    assert!(env.contains("v-two") && !env.contains("v-one"), "{env}");
    let restarted = world.servers.pids(SESSION, "api").await;
    assert_eq!(restarted.len(), 1);
    assert_ne!(restarted, pids);
    assert!(gone(pids[0]).await);

    // Nothing of a value is kept in what the runner wrote for the server.
    for entry in walk(&world.dirs.temp_root).chain(walk(&world.home)) {
        if let Ok(bytes) = std::fs::read(&entry) {
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("v-two"),
                "{} holds a secret",
                entry.display()
            );
        }
    }
    world.servers.stop(SESSION, "api").await;
}

/// Every file below `dir`.
fn walk(dir: &Path) -> impl Iterator<Item = PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => todo.push(path),
                Ok(t) if t.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files.into_iter()
}
