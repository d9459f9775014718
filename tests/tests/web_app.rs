//! The web app in a real browser: headless Chromium (Debian's `chromium`, driven by
//! `playwright-core` from `package.json`) against the real stack and a real `wuhu-runner`.
//! The browser script is `tests/web/app_in_chromium.mjs`; it signs in (a cookie session), creates a session, watches
//! a reply stream in over the session socket (the Worker's request log shows the upgrade and no
//! `follow` or HTTP enqueue), gets a 600-delta reply on one socket (the page acks), reloads
//! mid-stream (nothing lost or doubled), sees a dropped socket resume with every message once
//! (a proxy cuts it), cancels a queued follow-up, steers mid-turn and stops over the socket, sees a
//! send whose reply was lost sent again over HTTP under its key and queued once, falls back to SSE and
//! HTTP through a proxy that refuses WebSockets, sees a session page go back to sign-in when its
//! cookie session is revoked (close 4401), renames and searches, answers an approval for alice's machine that
//! bob's prompt asked for (bob's own Stop there gets the socket's 403, shown), shows an image a tool read (`<img>` from `GET /v1/blobs/:id`, decoded), edits a workspace document, manages environment definitions, mints a
//! runner token and connects a real runner with the command the page shows, mints a personal
//! token on the Tokens page (keyboard only), copies it, uses it against the API, revokes it after
//! a confirm and sees the API refuse it (401), checks that a page on
//! a listed origin may call the API with a bearer token and an unlisted one may not, that a
//! cross-site request riding the cookie changes nothing, checks phone width, and fails on any
//! console error.
//!
//! `scripts/test` installs Chromium (`ensure_chromium`) and builds the app (`build_worker`).
//! `WUHU_SCREENSHOTS=docs/screenshots` refreshes the README's screenshots.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wuhu_e2e::drop_proxy::DropProxy;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, runner_bin};
use wuhu_e2e::stack::{free_port, repo_root};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions};

/// The whole browser script's deadline (it takes about half a minute).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

fn chromium() -> PathBuf {
    let path = std::env::var_os("WUHU_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "no Chromium at {} (install it: `bash -c 'source scripts/lib/setup.sh && ensure_chromium'`, or set WUHU_CHROMIUM)",
        path.display()
    );
    path
}

#[test]
fn the_web_app_works_in_chromium() {
    let chromium = chromium();
    let root = repo_root();
    assert!(
        root.join("web/dist/index.html").exists()
            && root.join("node_modules/playwright-core").exists(),
        "the web app is not built or playwright-core is missing: run `bash -c 'source scripts/lib/setup.sh && build_worker'`"
    );
    // Two pages on other origins: one listed for CORS, one not (the script serves them).
    let allowed_port = free_port();
    let foreign_port = free_port();
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![(
            "WUHU_ALLOWED_ORIGINS".to_string(),
            format!("http://127.0.0.1:{allowed_port}"),
        )],
        ..StackOptions::default()
    });
    let tenant = unique_name("web");
    let dir = TempDir::new("wuhu-e2e-web");
    let api_dir = dir.mkdir("api");
    // An image the browser script has a tool read, then sees in the transcript.
    std::fs::write(
        api_dir.join("shot.png"),
        wuhu_e2e::png::solid(3, 2, [30, 90, 220, 255]),
    )
    .expect("write shot.png");
    let runner = Runner::start(
        RunnerConfig::new(&stack, "alice", &tenant, "mac")
            .env("api", &api_dir)
            .workspaces_root(dir.mkdir("workspaces")),
    );

    // The browser reaches the Worker through a proxy the script can tell to cut every
    // connection (a dropped network), by connecting to its control port.
    let proxy = DropProxy::start(&stack.base_url().replace("http://", ""));
    // And through one that cannot carry WebSockets (the page falls back to SSE and HTTP).
    let no_websockets =
        DropProxy::start_without_websockets(&stack.base_url().replace("http://", ""));

    let log_path = dir.path().join("browser.log");
    let log = File::create(&log_path).expect("create browser log");
    let mut command = Command::new("node");
    command
        .current_dir(&root)
        .arg("tests/web/app_in_chromium.mjs")
        .env("WUHU_URL", proxy.url())
        .env("WUHU_DROP_ADDR", proxy.control_addr().to_string())
        .env("WUHU_NO_WS_URL", no_websockets.url())
        .env("WUHU_ALICE_TOKEN", stack.user_token("alice", &tenant))
        .env("WUHU_BOB_TOKEN", stack.user_token("bob", &tenant))
        .env("WUHU_ADMIN_TOKEN", stack.admin_token("root", &tenant))
        .env("WUHU_RUNNER", runner.name())
        .env("WUHU_API_DIR", &api_dir)
        .env("WUHU_CHROMIUM", &chromium)
        .env("WUHU_ALLOWED_PORT", allowed_port.to_string())
        .env("WUHU_FOREIGN_PORT", foreign_port.to_string())
        .env("WUHU_RUNNER_BIN", runner_bin())
        .env("WUHU_STACK_LOG", stack.log_path())
        .env("WUHU_FAILURE_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone log"))
        .stderr(log)
        // Node and the Chromium it starts share a process group, killed together on timeout.
        .process_group(0);
    if let Some(shots) = std::env::var_os("WUHU_SCREENSHOTS") {
        command.env("WUHU_SCREENSHOTS", root.join(shots));
    }
    let started = Instant::now();
    let mut child = command.spawn().expect("spawn node");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            // SAFETY: signalling a process group we created; no memory is involved.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("{output}");
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!(
            "the browser script failed ({s}) after {:?}:\n{output}\nrunner log:\n{}",
            started.elapsed(),
            runner.log_tail(30)
        ),
        None => panic!("the browser script took over {SCRIPT_TIMEOUT:?}:\n{output}"),
    }
}
