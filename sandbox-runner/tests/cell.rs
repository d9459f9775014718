//! Cells on this machine (Linux), through the executor as a `tool_call` runs: every escape of
//! the corpus (issue 30) is refused, and the work a session should do still works. The
//! end-to-end twin through sessions on a real runner is `tests/tests/cells.rs`.
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use wuhu_core::cell::{CellSettings, LimitOverrides, Network};
use wuhu_core::wire::runner::{EnvironmentContext, EnvironmentKind, SandboxMode, Snapshot};
use wuhu_runner::cell::Cells;
use wuhu_runner::executor::{RunnerDirs, ToolCall, execute};
use wuhu_runner::tools::{CancelSignal, ToolOutput};

struct World {
    _base: tempfile::TempDir,
    home: PathBuf,
    root: PathBuf,
    other: PathBuf,
    dirs: RunnerDirs,
    cells: Arc<Cells>,
}

impl World {
    fn new() -> World {
        let base = tempfile::tempdir().unwrap();
        // Not below /tmp, like a real runner's directories (its HOME).
        let top = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "cells-{}",
            base.path().file_name().unwrap().to_string_lossy()
        ));
        std::fs::create_dir_all(&top).unwrap();
        let top = top.canonicalize().unwrap();
        let home = top.join("home");
        let workspaces = home.join(".wuhu/workspaces");
        let root = workspaces.join("11111111-1111-4111-8111-111111111111");
        let other = workspaces.join("22222222-2222-4222-8222-222222222222");
        for dir in [&root, &other, &home.join(".ssh")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(home.join(".wuhu/runner.yml"), "token: the-runner-token\n").unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY\n").unwrap();
        std::fs::write(other.join("secret.txt"), "other session's file\n").unwrap();
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
            other,
            dirs,
            cells,
        }
    }

    fn context(&self, settings: CellSettings) -> EnvironmentContext {
        let env = BTreeMap::from([
            (
                String::from("PATH"),
                String::from("/usr/local/bin:/usr/bin:/bin"),
            ),
            (
                String::from("HOME"),
                self.home.to_string_lossy().into_owned(),
            ),
        ]);
        EnvironmentContext {
            name: String::from("work"),
            kind: EnvironmentKind::FolderTemplate,
            root: self.root.to_string_lossy().into_owned(),
            snapshot: Snapshot {
                cwd: self.root.to_string_lossy().into_owned(),
                env,
                captured_at: 0,
            },
            repo_path: None,
            branch: None,
            cell: settings,
        }
    }

    fn call(&self, settings: &CellSettings, tool: &str, arguments: Value) -> ToolOutput {
        let context = self.context(settings.clone());
        run_call(
            &self.dirs,
            &self.cells,
            "11111111-1111-4111-8111-111111111111",
            &context,
            tool,
            arguments,
        )
    }

    fn bash(&self, command: &str) -> ToolOutput {
        self.bash_with(&CellSettings::default(), command)
    }

    fn bash_with(&self, settings: &CellSettings, command: &str) -> ToolOutput {
        self.call(settings, "bash", json!({ "command": command }))
    }
}

/// Runs one tool call of `session` in `context` through the executor, as a `tool_call` would.
fn run_call(
    dirs: &RunnerDirs,
    cells: &Arc<Cells>,
    session: &str,
    context: &EnvironmentContext,
    tool: &str,
    arguments: Value,
) -> ToolOutput {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(execute(
        dirs,
        ToolCall {
            id: "c1",
            environment: context,
            tool,
            arguments,
            deadline: Some(std::time::Duration::from_secs(60)),
            session_id: session,
            jobs: None,
            cells: Some(cells),
            secret_env: &Default::default(),
            progress: None,
        },
        CancelSignal::never(),
    ))
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[test]
fn the_escape_corpus_is_refused_and_the_cell_still_works() {
    let world = World::new();
    let home = text(&world.home);
    let config = format!("{home}/.wuhu/runner.yml");
    let runner_pid = std::process::id();
    // (what, command, what the output must not contain)
    let escapes: Vec<(&str, String)> = vec![
        ("read the runner's config", format!("cat {config}")),
        (
            "the parent's environment",
            String::from("tr '\\0' '\\n' </proc/$PPID/environ"),
        ),
        (
            "the runner's environment by pid",
            format!("cat /proc/{runner_pid}/environ; cat /proc/{runner_pid}/cmdline"),
        ),
        ("read ~/.ssh", format!("cat {home}/.ssh/id_ed25519")),
        ("list $HOME", format!("ls -a {home}")),
        (
            "another session's workspace",
            format!("cat {}/secret.txt", text(&world.other)),
        ),
        (
            "a symlink planted in the root",
            format!("ln -s {config} link && cat link"),
        ),
        (
            "a hard link of the config",
            format!("ln {config} hard && cat hard"),
        ),
        ("/etc/shadow", String::from("cat /etc/shadow")),
    ];
    for (what, command) in escapes {
        let out = world.bash(&command);
        for secret in [
            "the-runner-token",
            "PRIVATE KEY",
            "other session's file",
            "root:",
        ] {
            if what == "/etc/shadow" && secret == "root:" {
                assert!(
                    !out.content.contains("root:$") && !out.content.contains("root:*:"),
                    "{what}: {}",
                    out.content
                );
                continue;
            }
            assert!(!out.content.contains(secret), "{what}: {}", out.content);
        }
    }
    // Writes outside the root: absolute, `..`, through a symlink; none lands.
    let outside = world.home.join("planted.txt");
    for command in [
        format!("echo x > {}", text(&outside)),
        String::from("echo x > ../../../planted.txt"),
        format!("ln -s {home} h; echo x > h/planted.txt"),
        format!("echo x > {}/evil.txt", text(&world.other)),
    ] {
        let out = world.bash(&command);
        assert!(out.is_error, "{command}: {}", out.content);
    }
    assert!(!outside.exists());
    assert!(!world.other.join("evil.txt").exists());
    // Signals: the runner is not in the cell's PID namespace.
    let out = world.bash(&format!(
        "kill -0 {runner_pid} && echo ALIVE-SEEN; kill -9 -1; echo done"
    ));
    assert!(!out.content.contains("ALIVE-SEEN"), "{}", out.content);
    // The file tools: the same refusals.
    for (tool, args) in [
        ("read", json!({"path": config})),
        ("read", json!({"path": format!("{home}/.ssh/id_ed25519")})),
        ("read", json!({"path": "link"})),
        ("ls", json!({"path": home})),
        ("write", json!({"path": text(&outside), "content": "x"})),
        (
            "write",
            json!({"path": "../../../planted.txt", "content": "x"}),
        ),
        (
            "write",
            json!({"path": "/usr/local/planted", "content": "x"}),
        ),
        (
            "grep",
            json!({"pattern": "token", "path": format!("{home}/.wuhu")}),
        ),
        ("find", json!({"pattern": "*", "path": text(&world.other)})),
    ] {
        let out = world.call(&CellSettings::default(), tool, args.clone());
        assert!(out.is_error, "{tool} {args}: {}", out.content);
        assert!(
            !out.content.contains("the-runner-token"),
            "{tool} {args}: {}",
            out.content
        );
    }
    assert!(!outside.exists());
    // And what a session should do works: its root, its temp dir, /tmp, the system, pipes.
    let out = world.bash(
        "set -e; echo hello > f.txt; cat f.txt; mkdir -p d && echo y > d/g; \
         echo t > \"$TMPDIR/t\" && cat \"$TMPDIR/t\"; head -c 3 /dev/urandom | wc -c; \
         echo err >&2; ls /usr/bin/env; ps -e -o pid= | wc -l",
    );
    assert!(!out.is_error, "{}", out.content);
    assert!(
        out.content.starts_with("hello\nt\n3\nerr\n/usr/bin/env\n"),
        "{}",
        out.content
    );
    let out = world.call(&CellSettings::default(), "read", json!({"path": "f.txt"}));
    assert_eq!(out.content, "hello\n");
    // HOME is the session's own (the runner's is out of reach): git and its config work, and
    // what a call leaves there is there for the next call.
    let out = world.bash(
        "set -e; git init -q g && cd g && git config --global user.email s@x && \
         git -c user.name=s commit -q --allow-empty -m first && git log --format=%s; \
         echo kept > ~/note",
    );
    assert!(
        !out.is_error && out.content.contains("first"),
        "{}",
        out.content
    );
    let out = world.bash("cat ~/note; case \"$HOME\" in */homes/*) echo session-home;; esac");
    assert_eq!(out.content, "kept\nsession-home\n");
    let out = world.call(
        &CellSettings::default(),
        "read",
        json!({"path": "/etc/passwd"}),
    );
    assert!(!out.is_error, "{}", out.content);
    let out = world.call(
        &CellSettings::default(),
        "write",
        json!({"path": "new/n.txt", "content": "n"}),
    );
    assert!(!out.is_error, "{}", out.content);
    assert_eq!(
        std::fs::read_to_string(world.root.join("new/n.txt")).unwrap(),
        "n"
    );
}

#[test]
fn limits_hold_processes_file_size_and_cpu() {
    let world = World::new();
    let small = CellSettings {
        limits: LimitOverrides {
            processes: Some(32),
            file_size_bytes: Some(1 << 20),
            cpu_seconds: Some(1),
            ..LimitOverrides::default()
        },
        ..CellSettings::default()
    };
    // A fork bomb: bounded, and the call ends by itself (its PID 1 ends, the namespace with
    // it): "survived" is printed only by a shell that ran to its end before the call's own
    // 60 s deadline. How long that takes depends on the machine's load (bash retries a refused
    // fork with a growing pause), so no wall-clock bound is asserted: one of 30 s failed a
    // fresh-clone run on a busy 2-core machine.
    let out = world.bash_with(
        &small,
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived",
    );
    assert!(out.content.contains("survived"), "{}", out.content);
    // Filling the disk past the file-size limit.
    let out = world.bash_with(
        &small,
        "head -c 5000000 /dev/zero > big; ls -l big | awk '{print $5}'",
    );
    assert!(out.content.contains("1048576"), "{}", out.content);
    // CPU time.
    let out = world.bash_with(&small, "while :; do :; done");
    assert!(out.is_error, "{}", out.content);
    assert!(out.content.contains("signal"), "{}", out.content);
}

#[test]
fn a_cell_without_network_reaches_nothing_and_an_allow_list_only_its_hosts() {
    let world = World::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            use std::io::{Read, Write};
            let mut buf = [0u8; 2048];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nregistry",
            );
        }
    });
    let fetch = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3"
    );
    let none = CellSettings {
        network: Some(Network::None),
        ..CellSettings::default()
    };
    let out = world.bash_with(&none, &fetch);
    assert!(
        out.is_error && !out.content.contains("registry"),
        "{}",
        out.content
    );
    let open = CellSettings {
        network: Some(Network::Open),
        ..CellSettings::default()
    };
    let out = world.bash_with(&open, &fetch);
    assert!(out.content.contains("registry"), "{}", out.content);
    // An allow list: the listed loopback registry through the proxy, nothing else.
    let allow = CellSettings {
        network: Some(Network::Allow(vec![
            format!("127.0.0.1:{port}"),
            String::from("localhost"),
        ])),
        ..CellSettings::default()
    };
    let out = world.bash_with(&allow, &fetch);
    assert!(
        out.is_error && !out.content.contains("registry"),
        "direct: {}",
        out.content
    );
    if Path::new("/usr/bin/curl").exists() {
        // `localhost` is listed, but its address only for the registry's port.
        let other = port ^ 1;
        let out = world.bash_with(
            &allow,
            &format!(
                "curl -sS --max-time 10 http://127.0.0.1:{port}/x; echo; \
                 curl -sS --max-time 10 https://evil.example/ ; \
                 curl -sS --max-time 10 http://localhost:{other}/ ; \
                 curl -sS --max-time 10 --noproxy '' http://10.0.0.1/"
            ),
        );
        assert!(out.content.starts_with("registry\n"), "{}", out.content);
        assert!(
            out.content
                .contains("wuhu: blocked connect to evil.example:443 (not in allow list)"),
            "{}",
            out.content
        );
        assert!(
            out.content.contains("a private address not in allow list"),
            "{}",
            out.content
        );
        assert!(
            out.content
                .contains("10.0.0.1:80 (an IP address not in allow list)"),
            "{}",
            out.content
        );
        assert_eq!(
            out.details.as_ref().unwrap()["blockedConnections"],
            3,
            "{}",
            out.content
        );
        // The same through SOCKS5 (ALL_PROXY), by name and by address.
        let out = world.bash_with(
            &allow,
            &format!(
                "curl -sS --max-time 10 -x \"$ALL_PROXY\" http://127.0.0.1:{port}/s; echo; \
                 curl -sS --max-time 10 -x \"$ALL_PROXY\" http://evil.example/"
            ),
        );
        assert!(out.content.starts_with("registry\n"), "{}", out.content);
        assert!(
            out.content
                .contains("wuhu: blocked connect to evil.example:80 (not in allow list)"),
            "{}",
            out.content
        );
    }
    // A root runner's cells each have a pids cgroup, removed when the call ends: an `allow`
    // cell's relay must not keep its cgroup alive (it did, and each call then waited half a
    // second for a removal that never came and left the cgroup behind).
    assert_no_empty_cell_cgroups();
}

/// Waits (at most 10 s) until no pids cgroup of a cell of this process is left without
/// processes; cells still running have theirs, with their processes in it. Only where cells
/// use cgroups: a root runner with a `pids` controller (cgroup v1 or v2).
fn assert_no_empty_cell_cgroups() {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return;
    }
    let Some(base) = wuhu_runner::cell::linux::pids_hierarchy() else {
        return;
    };
    let prefix = format!(
        "{}{}-",
        wuhu_runner::cell::linux::CGROUP_PREFIX,
        std::process::id()
    );
    let empty = || -> Vec<String> {
        std::fs::read_dir(&base)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .filter(|e| {
                        std::fs::read_to_string(e.path().join("cgroup.procs"))
                            .is_ok_and(|p| p.trim().is_empty())
                    })
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = empty();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cells' cgroups left behind: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A runner started as root with `--isolate-uids` (decision 0023, addendum): each session's
/// cells run as its own uid and group (no other groups), its workspace, home, logs and temp
/// dirs are that uid's (`0700`), its file tools write files as it; another session's uid cannot
/// read them at rest (checked outside any cell: plain permissions); a released uid is not given
/// again at once; environments shared between sessions are refused.
#[test]
fn sessions_with_their_own_uids_own_their_files() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    use wuhu_runner::cell::uids::{self, SessionUids};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: --isolate-uids needs root (CI runs as root)");
        return;
    }
    // Below a directory every uid may pass (a real runner's default is /var/lib/wuhu-runner).
    let base = PathBuf::from(format!(
        "/var/tmp/wuhu-isolated-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    ));
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(base.clone());
    uids::check_passable(&base).unwrap();
    let dirs = RunnerDirs::isolated(&base).unwrap();
    let workspaces = base.join("workspaces");
    uids::create_passable_dir(&workspaces).unwrap();
    let run_dir = base.join("run");
    let range = wuhu_core::cell::uids::parse_uid_range("40000-40002").unwrap();
    let table = SessionUids::open(base.join("session-uids.json"), range).unwrap();
    let cells = Cells::with_exe(
        PathBuf::from(env!("CARGO_BIN_EXE_wuhu-runner")),
        SandboxMode::On,
        wuhu_runner::secrets::protected_paths(None, None, &run_dir, &workspaces, &[]),
        &run_dir,
        true,
    )
    .unwrap()
    .isolating_uids(table)
    .unwrap();
    let (a, b) = (
        "aaaaaaaa-1111-4111-8111-111111111111",
        "bbbbbbbb-2222-4222-8222-222222222222",
    );
    // A copy as the runner makes it: as root.
    let root_of = |session: &str| {
        let root = workspaces.join(session);
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        root.canonicalize().unwrap()
    };
    let call = |session: &str, root: &Path, kind: EnvironmentKind, tool: &str, arguments: Value| {
        let context = EnvironmentContext {
            name: String::from("work"),
            kind,
            root: text(root),
            snapshot: Snapshot {
                cwd: text(root),
                env: BTreeMap::from([(
                    String::from("PATH"),
                    String::from("/usr/local/bin:/usr/bin:/bin"),
                )]),
                captured_at: 0,
            },
            repo_path: None,
            branch: None,
            cell: CellSettings::default(),
        };
        run_call(&dirs, &cells, session, &context, tool, arguments)
    };
    let bash = |session: &str, root: &Path, command: &str| {
        call(
            session,
            root,
            EnvironmentKind::FolderTemplate,
            "bash",
            json!({ "command": command }),
        )
    };
    let (root_a, root_b) = (root_of(a), root_of(b));

    let out = bash(
        a,
        &root_a,
        "id -u; id -g; id -G; echo made > made.txt; stat -c '%u %g %a' . made.txt src/main.rs $HOME /tmp",
    );
    assert!(!out.is_error, "{}", out.content);
    let lines: Vec<&str> = out.content.lines().collect();
    assert_eq!(
        &lines[..8],
        &[
            "40000",
            "40000",
            "40000",
            "40000 40000 700",
            "40000 40000 644",
            "40000 40000 644",
            "40000 40000 700",
            "40000 40000 700",
        ],
        "{}",
        out.content
    );
    // The file tools write as the session's uid too.
    let out = call(
        a,
        &root_a,
        EnvironmentKind::FolderTemplate,
        "write",
        json!({"path": "notes/by-tool.txt", "content": "written by a tool\n"}),
    );
    assert!(!out.is_error, "{}", out.content);
    for path in ["notes", "notes/by-tool.txt"] {
        let meta = std::fs::metadata(root_a.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (40000, 40000), "{path}");
    }

    let out = bash(b, &root_b, "id -u; stat -c %u .");
    assert_eq!(
        out.content.lines().take(2).collect::<Vec<_>>(),
        ["40001", "40001"]
    );
    // At rest, plain permissions keep B's uid out of A's files (no cell, no Landlock here).
    for path in [
        root_a.join("made.txt"),
        root_a.join("notes/by-tool.txt"),
        dirs.log_dir.join("jobs"),
    ] {
        let read = std::process::Command::new("/bin/cat")
            .arg(&path)
            .uid(40001)
            .gid(40001)
            .output()
            .unwrap();
        assert!(!read.status.success(), "uid 40001 read {}", path.display());
    }
    let listing = std::process::Command::new("/bin/ls")
        .arg(&workspaces)
        .uid(40001)
        .gid(40001)
        .output()
        .unwrap();
    assert!(!listing.status.success(), "the workspaces can be listed");
    let table = base.join("session-uids.json");
    assert_eq!(
        std::fs::metadata(&table).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A released uid waits its turn: the next session gets the one after B's.
    cells.release_session(a);
    let c = "cccccccc-3333-4333-8333-333333333333";
    let root_c = root_of(c);
    let out = bash(c, &root_c, "id -u");
    assert_eq!(out.content.lines().next(), Some("40002"), "{}", out.content);
    // The range is full now (B, C, and A's uid again for D); a fourth live session is refused.
    let d = "dddddddd-4444-4444-8444-444444444444";
    let root_d = root_of(d);
    assert_eq!(
        bash(d, &root_d, "id -u").content.lines().next(),
        Some("40000")
    );
    let e = "eeeeeeee-5555-4555-8555-555555555555";
    let out = bash(e, &root_of(e), "id -u");
    assert!(
        out.is_error && out.content.contains("every uid"),
        "{}",
        out.content
    );

    // A directory shared between sessions is refused.
    let out = call(
        b,
        &root_b,
        EnvironmentKind::Local,
        "bash",
        json!({"command": "true"}),
    );
    assert!(
        out.is_error && out.content.contains("folder-template environments only"),
        "{}",
        out.content
    );
}
