//! Cells end to end (issue 30): sessions on a real cloud runner try the escape corpus through
//! `bash` and the file tools, each attempt is a tool result that says it was refused, and the
//! runner keeps serving; package-manager-shaped work through an allow list and a compiler run
//! inside the cell succeed. Also: a runner's name is not taken over by a second connection
//! (a stolen token) unless it says `--replace`, and `--sandbox off` is visible.
//!
//! One `wrangler dev` for the file; each test has its own tenant and runners.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::ToolResult;
use wuhu_core::wire::runner::RunnerKind;
use wuhu_e2e::fake_http::{FakeHttp, HttpReply};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(120);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

#[track_caller]
fn define(api: &Api, body: Value) {
    let response = api.post("/v1/environments", &body);
    assert_eq!(response.status, 201, "define {body}: {response}");
}

/// A session with `names` attached (in that order); returns its id and each environment's root.
#[track_caller]
fn session_with(api: &Api, names: &[&str]) -> (String, Vec<String>) {
    let id = api.create_fake_session().id;
    let mut roots = Vec::new();
    for name in names {
        let attach = api.run_tool(&id, "request_environment", json!({"spec": name}), TURN);
        assert!(!attach.is_error, "attach {name}: {}", attach.content);
        let session = api.session(&id);
        let attached = session
            .environments
            .iter()
            .find(|a| a.name() == *name)
            .unwrap_or_else(|| panic!("{name} is not attached"));
        roots.push(attached.environment.root.clone());
    }
    (id, roots)
}

/// Runs `calls` as one turn's tool calls; their results in order.
#[track_caller]
fn run(api: &Api, id: &str, calls: &[(&str, Value)]) -> Vec<ToolResult> {
    let results = api.run_tool_calls(id, calls, TURN);
    assert_eq!(results.len(), calls.len());
    results
}

fn bash(environment: &str, command: &str) -> (&'static str, Value) {
    (
        "bash",
        json!({"environment": environment, "command": command}),
    )
}

/// Words of a refusal, as the kernel, the shell, curl or the runner put it.
fn says_refused(text: &str) -> bool {
    [
        "Permission denied",
        "Operation not permitted",
        "No such process",
        "No such file",
        "outside this session's cell",
        "read-only in this session's cell",
        "blocked connect",
        "Could not resolve",
        "Couldn't connect",
        "Network is unreachable",
        "Invalid cross-device link",
        "File size limit exceeded",
        "fork: retry",
        "Resource temporarily unavailable",
    ]
    .iter()
    .any(|w| text.contains(w))
}

#[test]
fn sessions_in_cells_are_refused_every_escape_and_the_runner_keeps_serving() {
    let _guard = stack().guard();
    let tenant = unique_name("cells");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-cells");
    let template = dir.mkdir("templates/web");
    dir.write(
        "templates/web/hello.c",
        "#include <stdio.h>\nint main(void) { puts(\"built in the cell\"); return 0; }\n",
    );
    // The runner's config file holds its token (mode 600), as on a cloud VM.
    let token = stack().cloud_runner_token("ana", &tenant);
    let config = dir.write("runner.yml", &format!("token: {token}\n"));
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A package registry on this machine's loopback, listed in the allow list.
    let registry = FakeHttp::start();
    registry.route(
        "/pkg/index.js",
        HttpReply::text(200, "module.exports = 42;\n"),
    );
    let mut runner_config = RunnerConfig::new(stack(), "ana", &tenant, "cell-vm")
        .kind(RunnerKind::Cloud)
        .allow_any_path(false)
        .env("templates", dir.path().join("templates"));
    runner_config.args = vec!["--config".into(), config.display().to_string()];
    let runner = Runner::start(runner_config);
    let home = runner.dir().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").unwrap();
    let runner_pid = runner.pid().expect("running");

    let allow = json!({"allow": [format!("127.0.0.1:{}", registry.port()), "localhost"]});
    for (name, network) in [("web", allow), ("offline", json!("none"))] {
        define(
            &api,
            json!({
                "name": name,
                "kind": "folder-template",
                "runner": "cell-vm",
                "templatePath": template.display().to_string(),
                "network": network,
                "limits": {"processes": 64, "fileSizeBytes": 1_048_576},
            }),
        );
    }
    let (other, other_roots) = session_with(&api, &["web"]);
    let other_root = &other_roots[0];
    run(
        &api,
        &other,
        &[bash("web", "echo other-session-secret > secret.txt")],
    );
    let (id, roots) = session_with(&api, &["web", "offline"]);
    let root = &roots[0];
    assert_ne!(root, other_root);

    let config_path = config.display().to_string();
    let home_text = home.display().to_string();
    let outside = dir.path().join("planted.txt");
    let outside_text = outside.display().to_string();
    let port = registry.port();
    let escapes: Vec<(&str, (&str, Value))> = vec![
        (
            "the config file",
            bash("web", &format!("cat {config_path}")),
        ),
        (
            "the parent's environment",
            bash("web", "tr '\\0' '\\n' </proc/$PPID/environ"),
        ),
        (
            "the runner's command line and environment",
            bash(
                "web",
                &format!("cat /proc/{runner_pid}/cmdline /proc/{runner_pid}/environ"),
            ),
        ),
        (
            "~/.ssh",
            bash("web", &format!("cat {home_text}/.ssh/id_ed25519")),
        ),
        (
            "write by absolute path",
            bash("web", &format!("echo x > {outside_text}")),
        ),
        (
            "write through ..",
            bash("web", "echo x > ../../planted.txt"),
        ),
        (
            "a symlink planted in the root",
            bash("web", &format!("ln -sf {config_path} link; cat link")),
        ),
        (
            "a hard link",
            bash("web", &format!("ln {config_path} hard && cat hard")),
        ),
        (
            "another session's workspace",
            bash("web", &format!("cat {other_root}/secret.txt")),
        ),
        (
            "signal the runner",
            bash("web", &format!("kill -9 {runner_pid}")),
        ),
        (
            "fork bomb",
            bash("web", "bomb() { bomb | bomb & }; bomb; sleep 3; exit 1"),
        ),
        (
            "fill the disk",
            bash("web", "head -c 20000000 /dev/zero > big.bin"),
        ),
        (
            "a host not in the allow list",
            bash("web", "curl -sSf --max-time 20 https://evil.example/"),
        ),
        (
            "an IP literal",
            bash("web", "curl -sSf --max-time 20 http://93.184.216.34/"),
        ),
        (
            "a private address",
            bash(
                "web",
                "curl -sSf --max-time 20 http://169.254.169.254/latest/meta-data",
            ),
        ),
        (
            "DNS rebinding: a listed name resolving to a private address",
            bash(
                "web",
                &format!("curl -sSf --max-time 20 http://localhost:{}/", port ^ 1),
            ),
        ),
        (
            "around the proxy",
            bash(
                "web",
                &format!(
                    "curl -sSf --max-time 20 --noproxy '*' http://127.0.0.1:{port}/pkg/index.js"
                ),
            ),
        ),
        (
            "a network: none environment",
            bash(
                "offline",
                &format!("curl -sSf --max-time 20 http://127.0.0.1:{port}/pkg/index.js"),
            ),
        ),
        (
            "read of the config",
            ("read", json!({"environment": "web", "path": config_path})),
        ),
        (
            "read through the link",
            ("read", json!({"environment": "web", "path": "link"})),
        ),
        (
            "write outside",
            (
                "write",
                json!({"environment": "web", "path": outside_text, "content": "x"}),
            ),
        ),
        (
            "ls of the other workspace",
            ("ls", json!({"environment": "web", "path": other_root})),
        ),
    ];
    let calls: Vec<(&str, Value)> = escapes.iter().map(|(_, call)| call.clone()).collect();
    let results = run(&api, &id, &calls);
    for ((what, _), result) in escapes.iter().zip(&results) {
        let content = &result.content;
        assert!(result.is_error, "{what}: not refused: {content}");
        assert!(says_refused(content), "{what}: {content}");
        for secret in [
            token.as_str(),
            "PRIVATE KEY",
            "other-session-secret",
            "module.exports",
        ] {
            assert!(!content.contains(secret), "{what}: leaked: {content}");
        }
    }
    let text_of = |what: &str| {
        let at = escapes.iter().position(|(w, _)| *w == what).unwrap();
        results[at].content.clone()
    };
    assert!(
        text_of("a host not in the allow list")
            .contains("wuhu: blocked connect to evil.example:443 (not in allow list)"),
        "{}",
        text_of("a host not in the allow list")
    );
    assert!(
        text_of("DNS rebinding: a listed name resolving to a private address")
            .contains("a private address not in allow list")
    );
    assert!(!outside.exists(), "a write landed outside the root");
    let big = std::path::Path::new(root).join("big.bin");
    assert!(std::fs::metadata(&big).map(|m| m.len()).unwrap_or(0) <= 1_048_576);

    // Still serving, and what a session should do works in the cell: an npm-install-shaped
    // download from the listed registry, a build with the system's compiler.
    assert!(runner_alive(runner_pid), "the runner died");
    let ok = run(
        &api,
        &id,
        &[
            bash(
                "web",
                &format!(
                    "set -e; mkdir -p node_modules/pkg; curl -sSf http://127.0.0.1:{port}/pkg/index.js -o node_modules/pkg/index.js; cat node_modules/pkg/index.js"
                ),
            ),
            bash("web", "set -e; cc -o hello hello.c; ./hello"),
            (
                "read",
                json!({"environment": "web", "path": "/etc/passwd", "limit": 1}),
            ),
        ],
    );
    assert!(
        !ok[0].is_error && ok[0].content.contains("module.exports = 42;"),
        "{}",
        ok[0].content
    );
    assert!(
        !ok[1].is_error && ok[1].content.contains("built in the cell"),
        "{}",
        ok[1].content
    );
    assert!(!ok[2].is_error, "{}", ok[2].content);
    assert_eq!(
        registry.requests_to("/pkg/index.js").len(),
        1,
        "only the proxied download"
    );
}

fn runner_alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
fn a_stolen_token_cannot_take_a_live_runner_over_and_replace_says_why() {
    let _guard = stack().guard();
    let tenant = unique_name("takeover");
    let api = stack().client("ana", &tenant);
    let mut first = Runner::start(RunnerConfig::new(stack(), "ana", &tenant, "build-1"));
    assert!(
        first.log().contains("made this runner's key"),
        "{}",
        first.log_tail(20)
    );
    // The same token and name from another machine (its own HOME, so its own key): refused
    // for good, the name is bound to the first runner's key; so is a hello with no key at all.
    let mut thief =
        Runner::spawn(RunnerConfig::new(stack(), "ana", &tenant, "build-1").fresh_key());
    let status = thief
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the thief kept trying: {}", thief.log_tail(20)));
    assert_eq!(status.code(), Some(2), "{}", thief.log_tail(20));
    assert!(
        thief.log().contains("is bound to another key"),
        "{}",
        thief.log_tail(20)
    );
    let token = stack().runner_token("ana", &tenant);
    let mut raw = wuhu_e2e::runner::RawRunner::connect(&stack().base_url(), &token)
        .unwrap_or_else(|e| panic!("raw connection: {e}"));
    raw.send_text(&wuhu_e2e::runner::RawRunner::hello(
        "build-1",
        RunnerKind::Local,
    ));
    let refused: Value = serde_json::from_str(&raw.next_text(Duration::from_secs(15))).unwrap();
    assert_eq!(refused["code"], "key_required", "{refused}");
    // The same key (the same machine) started twice: refused while the first is alive, and it
    // retries; the first keeps its connection.
    let mut twice = Runner::spawn(RunnerConfig::new(stack(), "ana", &tenant, "build-1"));
    wuhu_e2e::wait_for(
        "the second start to be refused name_in_use",
        Duration::from_secs(30),
        || {
            twice
                .log()
                .contains("is already connected and alive")
                .then_some(())
        },
    );
    twice.kill_hard();
    assert!(first.try_wait().is_none(), "{}", first.log_tail(20));
    assert!(
        !first.log().contains("reconnecting"),
        "the first runner lost its connection: {}",
        first.log_tail(20)
    );
    let runners = api.get("/v1/runners");
    assert_eq!(runners.status, 200, "{runners}");
    assert_eq!(runners.json()["runners"][0]["sandbox"], "on", "{runners}");
    // --replace with the key takes over; the first prints why it stopped and exits 2.
    let mut config = RunnerConfig::new(stack(), "ana", &tenant, "build-1");
    config.args = vec!["--replace".into()];
    let _third = Runner::start(config);
    let status = first
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the replaced runner did not stop: {}", first.log_tail(20)));
    assert_eq!(status.code(), Some(2), "{}", first.log_tail(20));
    assert!(
        first
            .log()
            .contains("refused: another wuhu-runner took over runner \"build-1\" with --replace"),
        "{}",
        first.log_tail(20)
    );
}

#[test]
fn sandbox_off_is_announced_and_listed() {
    let _guard = stack().guard();
    let tenant = unique_name("nosandbox");
    let api = stack().client("ana", &tenant);
    let mut config = RunnerConfig::new(stack(), "ana", &tenant, "open-mac");
    config.args = vec!["--sandbox".into(), "off".into()];
    let runner = Runner::start(config);
    assert!(
        runner.log().contains("warning: --sandbox off"),
        "{}",
        runner.log_tail(20)
    );
    let runners = api.get("/v1/runners");
    assert_eq!(runners.json()["runners"][0]["sandbox"], "off", "{runners}");
}

/// A cloud runner started as root with `--isolate-uids` (decision 0023, addendum): each
/// session's commands run as its own uid, the files it makes are that uid's, another session
/// cannot read them, a deleted session's uid is given back, and an environment shared between
/// sessions (a local directory) is refused with the reason.
#[test]
fn a_root_runner_runs_each_session_as_its_own_uid() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: --isolate-uids needs a runner started as root (CI runs as root)");
        return;
    }
    let _guard = stack().guard();
    let tenant = unique_name("uids");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-uids");
    let template = dir.mkdir("templates/app");
    dir.write("templates/app/README.md", "the template\n");
    let base = dir.path().join("isolated");
    let mut config = RunnerConfig::new(stack(), "ana", &tenant, "iso-vm")
        .kind(RunnerKind::Cloud)
        .allow_any_path(false)
        .env("templates", dir.path().join("templates"))
        .workspaces_root(base.join("workspaces"));
    config.args = vec![
        "--isolate-uids".into(),
        "42000-42009".into(),
        "--isolate-uids-dir".into(),
        base.display().to_string(),
    ];
    let runner = Runner::start(config);
    assert!(
        runner
            .log()
            .contains("each session runs as its own uid from 42000-42009"),
        "{}",
        runner.log()
    );
    define(
        &api,
        json!({
            "name": "app",
            "kind": "folder-template",
            "runner": "iso-vm",
            "templatePath": template.display().to_string(),
            "network": "none",
        }),
    );
    define(
        &api,
        json!({
            "name": "shared",
            "kind": "local",
            "runner": "iso-vm",
            "path": dir.path().join("templates").display().to_string(),
        }),
    );
    let (a, a_roots) = session_with(&api, &["app"]);
    let (b, _) = session_with(&api, &["app"]);
    let results = run(
        &api,
        &a,
        &[bash(
            "app",
            "id -u; echo mine > a.txt; stat -c '%u %a' . a.txt README.md",
        )],
    );
    assert_eq!(
        results[0].content.lines().take(4).collect::<Vec<_>>(),
        ["42000", "42000 700", "42000 644", "42000 644"],
        "{}",
        results[0].content
    );
    let a_file = format!("{}/a.txt", a_roots[0]);
    let results = run(
        &api,
        &b,
        &[bash(
            "app",
            &format!("id -u; cat {a_file}; ls {}", a_roots[0]),
        )],
    );
    let out = &results[0].content;
    assert_eq!(out.lines().next(), Some("42001"), "{out}");
    assert!(!out.contains("mine") && says_refused(out), "{out}");

    // A local directory would be shared between sessions: refused, saying why.
    let id = api.create_fake_session().id;
    let attach = api.run_tool(&id, "request_environment", json!({"spec": "shared"}), TURN);
    assert!(
        attach.is_error && attach.content.contains("folder-template environments only"),
        "{}",
        attach.content
    );

    // Deleted, its copy goes and its uid is given back.
    let table = base.join("session-uids.json");
    assert!(std::fs::read_to_string(&table).unwrap().contains(&a));
    let deleted = api.send(api.request("DELETE", &format!("/v1/sessions/{a}")));
    assert!(deleted.status == 204 || deleted.status == 202, "{deleted}");
    wuhu_e2e::wait_for("A's uid given back", TURN, || {
        let text = std::fs::read_to_string(&table).unwrap_or_default();
        (!text.contains(&a) && text.contains(&b)).then_some(())
    });
    assert!(!std::path::Path::new(&a_roots[0]).exists());
    drop(runner);
}
