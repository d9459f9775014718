//! The container image of a cloud runner (`infra/runner/Dockerfile`), built and run here: buildah
//! (Debian's, daemonless; Docker's engine does not run on these machines) builds the Dockerfile on
//! a Debian base made from Debian's mirror (`ensure_runner_image_base` in scripts/lib/setup.sh:
//! Docker Hub is out of reach), with the runner this test process built, and the image's
//! entrypoint, run as the image's user, connects to the real stack as a cloud runner and serves a
//! tool call. The image and its container are removed by ID at the end.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::runner::RunnerKind;
use wuhu_e2e::runner::{TempDir, ToolTurn, runner_bin};
use wuhu_e2e::stack::repo_root;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions, wait_until};

/// Runs a setup function and prints one exported variable.
fn setup_var(function: &str, variable: &str) -> String {
    let output = Command::new("bash")
        .args([
            "-c",
            &format!("source scripts/lib/setup.sh && {function} && printf '%s' \"${variable}\""),
        ])
        .current_dir(repo_root())
        .stderr(Stdio::inherit())
        .output()
        .expect("run bash");
    assert!(output.status.success(), "{function} failed");
    String::from_utf8(output.stdout).expect("utf-8")
}

/// `buildah ARGS` with the storage and isolation `ensure_buildah` chose.
fn buildah(args: &[&str]) -> String {
    let output = Command::new("buildah")
        .args(args)
        .env("STORAGE_DRIVER", "vfs")
        .env("BUILDAH_ISOLATION", "chroot")
        .output()
        .expect("run buildah");
    assert!(
        output.status.success(),
        "buildah {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Removes the container, the image and the process on drop (by ID, never by name pattern).
struct Cleanup {
    image: String,
    container: Option<String>,
    child: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's process group; no memory is touched.
            unsafe {
                libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM);
            }
            let _ = child.wait();
        }
        let run = |args: &[&str]| {
            let _ = Command::new("buildah")
                .args(args)
                .env("STORAGE_DRIVER", "vfs")
                .output();
        };
        if let Some(container) = &self.container {
            run(&["rm", container]);
        }
        run(&["rmi", &self.image]);
    }
}

#[test]
fn the_runner_image_builds_and_its_entrypoint_connects_as_a_cloud_runner() {
    let base = setup_var("ensure_runner_image_base", "RUNNER_IMAGE_BASE");
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let _guard = stack.guard();

    // The build context holds only the binary, as `.dockerignore` keeps it for a real build.
    let context = TempDir::new("wuhu-e2e-image");
    std::fs::create_dir_all(context.path().join("dist")).unwrap();
    std::fs::copy(runner_bin(), context.path().join("dist/wuhu-runner")).expect("copy the runner");
    let image = format!("localhost/{}", unique_name("wuhu-runner-e2e"));
    let mut cleanup = Cleanup {
        image: image.clone(),
        container: None,
        child: None,
    };
    let dockerfile = repo_root().join("infra/runner/Dockerfile");
    buildah(&[
        "bud",
        "--quiet",
        "--layers",
        "-f",
        &dockerfile.display().to_string(),
        "--build-arg",
        &format!("BASE={base}"),
        "--build-arg",
        "RUNNER=dist/wuhu-runner",
        "-t",
        &image,
        &context.path().display().to_string(),
    ]);
    let inspected: Value =
        serde_json::from_str(&buildah(&["inspect", "--type", "image", &image])).expect("JSON");
    let config = &inspected["OCIv1"]["config"];
    assert_eq!(config["User"], "10001:10001", "{config}");
    let entrypoint: Vec<String> = config["Entrypoint"]
        .as_array()
        .expect("an entrypoint")
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect();
    assert_eq!(
        entrypoint,
        ["/usr/local/bin/wuhu-runner", "register", "--kind", "cloud"]
    );

    // The entrypoint with the arguments `docker run IMAGE ARGS` would add, as the image's user;
    // the token from a file mounted read-only, as a container platform mounts a secret (never in
    // the image, never on a command line).
    let container = buildah(&["from", "--quiet", &image]);
    cleanup.container = Some(container.clone());
    let tenant = unique_name("image");
    let token = stack.cloud_runner_token("ops", &tenant);
    let log = context.path().join("runner.log");
    let secret = context.write("runner-token", &token);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut args: Vec<String> = vec![
        "run".into(),
        "--volume".into(),
        format!("{}:/run/secrets/wuhu-runner-token:ro", secret.display()),
        "--env".into(),
        "WUHU_RUNNER_TOKEN_FILE=/run/secrets/wuhu-runner-token".into(),
        container.clone(),
        "--".into(),
    ];
    args.extend(entrypoint);
    args.extend([
        "--server".into(),
        stack.base_url(),
        "--name".into(),
        "image-1".into(),
        "--workspaces-root".into(),
        "/home/wuhu/.wuhu/workspaces".into(),
        "--env".into(),
        "skel=/etc/skel".into(),
        // buildah's chroot isolation (the only one without a container runtime here) refuses
        // user namespaces to what runs in it (unshare in a chroot is EPERM), so the runner
        // cannot make cells and would refuse to start; under Docker or Podman with the options
        // docs/deploy.md names it makes them. Cells themselves: tests/tests/cells.rs.
        "--sandbox".into(),
        "off".into(),
    ]);
    use std::os::unix::process::CommandExt;
    cleanup.child = Some(
        Command::new("buildah")
            .args(&args)
            .env("STORAGE_DRIVER", "vfs")
            .env("BUILDAH_ISOLATION", "chroot")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .expect("buildah run"),
    );
    let api = stack.client("ana", &tenant);
    let listed = wait_until(Duration::from_secs(60), || {
        let response = api.get("/v1/runners");
        response.json()["runners"]
            .as_array()?
            .iter()
            .find(|r| r["name"] == "image-1" && r["connected"] == true)
            .cloned()
    })
    .unwrap_or_else(|_| {
        panic!(
            "the image's runner did not connect: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert_eq!(listed["kind"], json!(RunnerKind::Cloud), "{listed}");

    // A member's session gets a folder-template workspace in the container and runs a command
    // there, as the image's user.
    let defined = api.post(
        "/v1/environments",
        &json!({"name": "work", "kind": "folder-template", "templatePath": "/etc/skel"}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    let session = api.create_fake_session().id;
    let turn = ToolTurn::start(
        &api,
        &session,
        &[(
            "request_environment",
            json!({"spec": "work", "preference": "cloud"}),
        )],
    );
    let (results, _) = turn.finish(&api, Duration::from_secs(60));
    assert!(!results[0].is_error, "{}", results[0].content);
    let turn = ToolTurn::start(
        &api,
        &session,
        &[(
            "bash",
            json!({"command": "id -un; pwd; test -f .bashrc && git --version | cut -d' ' -f1-2"}),
        )],
    );
    let (results, _) = turn.finish(&api, Duration::from_secs(60));
    let lines: Vec<&str> = results[0].content.lines().collect();
    assert_eq!(lines.first(), Some(&"wuhu"), "{:?}", results[0]);
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.starts_with("/home/wuhu/.wuhu/workspaces/")),
        "{:?}",
        results[0]
    );
    assert_eq!(lines.get(2), Some(&"git version"), "{:?}", results[0]);
}
