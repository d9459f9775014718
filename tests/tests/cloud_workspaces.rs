//! Cloud workspaces on S3-compatible storage, through the real Worker, real `wuhu-runner`
//! processes with `--store` and a real S3-compatible server (moto, [`wuhu_e2e::moto`]):
//! a workspace moves from one runner to another with every saved file (and without the skipped
//! directories), a save uploads only what changed, and of two runners saving one workspace the
//! one that lost it is told and keeps its copy; a save deletes the objects its manifest no longer
//! references; deleting the session discards its stored workspaces and local copies, also on a
//! runner that was away during the `DELETE` (when it connects again). The runner's S3 keys come
//! from the AWS credentials chain: an instance role through IMDSv2 (a local fake,
//! [`wuhu_e2e::fake_imds`]) with keys fetched again when they expire, STS (moto's) for a web
//! identity token and for a profile's `role_arn` with `source_profile`, an SSO profile and a
//! container credentials endpoint (local fakes of AWS's wire formats).
//!
//! One `wrangler dev` and one moto for the file; every test uses its own tenant, bucket prefix,
//! runners and temp dirs.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::ToolResult;
use wuhu_core::wire::runner::RunnerKind;
use wuhu_e2e::fake_imds::FakeImds;
use wuhu_e2e::moto::Moto;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(120);
const BUCKET: &str = "wuhu-e2e";

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        let moto = Moto::start();
        moto.create_bucket(BUCKET);
        moto
    })
}

/// One test's world: a tenant, the user `ana`, a temp dir and a bucket prefix.
struct World {
    tenant: String,
    api: Api,
    dir: TempDir,
    prefix: String,
}

impl World {
    fn new(prefix: &str) -> World {
        let tenant = unique_name(prefix);
        World {
            api: stack().client("ana", &tenant),
            dir: TempDir::new(&format!("wuhu-e2e-{prefix}")),
            prefix: tenant.clone(),
            tenant,
        }
    }

    /// A cloud runner with `--store` on moto; credentials from the environment.
    fn cloud_runner(&self, name: &str) -> RunnerConfig {
        self.cloud_runner_without_keys(name)
            .var("AWS_ACCESS_KEY_ID", "wuhu-e2e-key")
            .var("AWS_SECRET_ACCESS_KEY", "wuhu-e2e-secret")
    }

    /// A cloud runner with `--store` on moto and no credentials in its environment.
    fn cloud_runner_without_keys(&self, name: &str) -> RunnerConfig {
        let mut config = RunnerConfig::new(stack(), "ops", &self.tenant, name)
            .kind(RunnerKind::Cloud)
            .workspaces_root(self.dir.mkdir(&format!("workspaces-{name}")));
        config.args.extend([
            String::from("--store"),
            format!("s3://{BUCKET}/{}", self.prefix),
            String::from("--store-endpoint"),
            moto().endpoint(),
            String::from("--store-region"),
            String::from("us-east-1"),
        ]);
        config
    }

    /// Defines `web`, a folder template holding `README.md`.
    fn define_web(&self) {
        let template = self.dir.mkdir("template-web");
        self.dir
            .write("template-web/README.md", "template readme\n");
        let response = self.api.post(
            "/v1/environments",
            &json!({"name": "web", "kind": "folder-template", "templatePath": template}),
        );
        assert_eq!(response.status, 201, "{response}");
    }

    /// The stored manifest of `session`'s `web`, if any.
    fn manifest(&self, session: &str) -> Option<Value> {
        let key = format!("{}/workspaces/{session}/web/manifest.json", self.prefix);
        moto()
            .get(BUCKET, &key)
            .map(|b| serde_json::from_slice(&b).expect("manifest JSON"))
    }

    /// Every stored key of `session`'s workspaces.
    fn session_keys(&self, session: &str) -> Vec<String> {
        moto().keys(BUCKET, &format!("{}/workspaces/{session}/", self.prefix))
    }

    /// The stored content of `path` in `session`'s `web`.
    fn stored_text(&self, session: &str, path: &str) -> String {
        let manifest = self.manifest(session).expect("a stored manifest");
        let sha = manifest["files"][path]["sha256"]
            .as_str()
            .unwrap_or_else(|| panic!("{path} not in the manifest: {manifest}"));
        let key = format!("{}/workspaces/{session}/web/objects/{sha}", self.prefix);
        String::from_utf8(moto().get(BUCKET, &key).expect("the object")).expect("utf-8")
    }
}

#[track_caller]
fn run_tool(api: &Api, session: &str, name: &str, arguments: Value) -> ToolResult {
    let turn = ToolTurn::start(api, session, &[(name, arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

#[track_caller]
fn ok(result: ToolResult) -> String {
    assert!(!result.is_error, "tool error: {}", result.content);
    result.content
}

#[track_caller]
fn bash(api: &Api, session: &str, command: &str) -> String {
    ok(run_tool(api, session, "bash", json!({"command": command})))
}

#[track_caller]
fn attach_web(api: &Api, session: &str, runner: &str) -> String {
    let content = ok(run_tool(
        api,
        session,
        "request_environment",
        json!({"spec": "web", "preference": "cloud"}),
    ));
    assert!(
        content.contains(&format!("attached on runner \"{runner}\"")),
        "{content}"
    );
    content
}

#[track_caller]
fn detach_web(api: &Api, session: &str) -> String {
    ok(run_tool(
        api,
        session,
        "detach_environment",
        json!({"name": "web"}),
    ))
}

/// The last `saved workspace <label>: …` line of a runner's log.
#[track_caller]
fn last_save_report(runner: &Runner, label: &str) -> String {
    let needle = format!("saved workspace {label}:");
    runner
        .log()
        .lines()
        .rev()
        .find(|l| l.contains(&needle) && !l.contains("NOT saved"))
        .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{}", runner.log_tail(40)))
        .to_string()
}

#[test]
fn a_workspace_moves_to_another_runner_with_its_files_and_saves_only_changes() {
    let _guard = stack().guard();
    let world = World::new("s3move");
    world.define_web();
    let api = &world.api;
    let session = api.create_fake_session().id;
    let label = format!("{session}/web");

    let mut a = Runner::start(world.cloud_runner("cloud-a"));
    attach_web(api, &session, "cloud-a");
    let root_a = a.workspaces_root().join(&session);
    let written = bash(
        api,
        &session,
        "set -e; echo one > notes.txt; mkdir -p .git src empty && echo 'ref: refs/heads/main' > .git/HEAD; \
         echo 'fn main() {}' > src/main.rs; cp src/main.rs src/copy.rs; ln -s notes.txt link; \
         printf '#!/bin/sh\\necho run\\n' > run.sh; chmod +x run.sh; \
         mkdir -p node_modules/pkg target/debug .venv/bin; echo m > node_modules/pkg/index.js; \
         echo t > target/debug/out; echo v > .venv/bin/python; \
         head -c 9000000 /dev/urandom > big.bin; sha256sum big.bin",
    );
    let big_sha = written.split_whitespace().next().expect("sha256sum output");

    // Detach saves (the 9 MB file in two parts: over the 8 MiB threshold) and deletes the local
    // copy.
    let detached = detach_web(api, &session);
    assert!(
        detached.starts_with("Environment \"web\" detached."),
        "{detached}"
    );
    assert!(!detached.contains("not saved"), "{detached}");
    let first = last_save_report(&a, &label);
    // 9 paths: notes.txt .git/HEAD src/main.rs src/copy.rs link run.sh big.bin README.md empty;
    // src/copy.rs has src/main.rs's content and a link or a directory has none: 6 contents,
    // the 9 MB one in 2 parts.
    assert!(
        first.contains(": 9 paths (9 changed, 0 removed), uploaded 6 objects"),
        "{first}"
    );
    // 5 single PUTs + 2 parts + the manifest.
    assert!(
        first.contains("puts=8, deleted 0 unreferenced objects;"),
        "{first}"
    );
    assert!(
        first.contains("not saved: .venv/, node_modules/, target/"),
        "{first}"
    );
    assert!(a.log().contains("part 2 of 2"), "{}", a.log_tail(30));
    assert!(!root_a.exists(), "the local copy is deleted after detach");
    let manifest = world.manifest(&session).expect("a manifest");
    let files = manifest["files"].as_object().expect("files");
    assert!(files.keys().all(|p| !p.starts_with("node_modules")
        && !p.starts_with("target")
        && !p.starts_with(".venv")));
    a.stop(Duration::from_secs(30));

    // Runner B reads its credentials from a shared credentials file (profile `e2e`).
    let credentials = world.dir.write(
        "aws-credentials",
        "[e2e]\naws_access_key_id = wuhu-e2e-key\naws_secret_access_key = wuhu-e2e-secret\n",
    );
    let mut config_b = world.cloud_runner("cloud-b");
    config_b.vars.retain(|(k, _)| !k.starts_with("AWS_"));
    let config_b = config_b
        .var("AWS_SHARED_CREDENTIALS_FILE", credentials.to_string_lossy())
        .var("AWS_PROFILE", "e2e");
    // Readable by others (as written): the runner refuses to start, naming the fix.
    let mut refused = Runner::spawn(config_b.clone());
    let status = refused
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| {
            panic!(
                "started with an open credentials file: {}",
                refused.log_tail(20)
            )
        });
    assert_eq!(status.code(), Some(1), "{}", refused.log_tail(20));
    assert!(
        refused.log().contains("chmod 600"),
        "{}",
        refused.log_tail(20)
    );
    std::fs::set_permissions(
        &credentials,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod the credentials");
    let b = Runner::start(config_b);
    assert!(
        b.log().contains("credentials from ProfileFile)"),
        "{}",
        b.log_tail(20)
    );
    attach_web(api, &session, "cloud-b");
    let shown = bash(
        api,
        &session,
        "cat notes.txt .git/HEAD src/copy.rs; readlink link; ./run.sh; test -d empty && echo empty-dir; \
         for d in node_modules target .venv; do test -e $d && echo \"$d is back\"; done; \
         sha256sum big.bin",
    );
    assert!(
        shown.starts_with("one\nref: refs/heads/main\nfn main() {}\nnotes.txt\nrun\nempty-dir\n"),
        "{shown}"
    );
    assert!(!shown.contains("is back"), "{shown}");
    assert!(shown.contains(big_sha), "{shown} vs {big_sha}");
    assert!(
        b.log().contains(&format!("hydrated workspace {label}")),
        "{}",
        b.log_tail(20)
    );

    // One changed file: one object and the manifest.
    bash(api, &session, "echo two > notes.txt; rm src/copy.rs");
    detach_web(api, &session);
    let second = last_save_report(&b, &label);
    assert!(
        second.contains(
            ": 8 paths (1 changed, 1 removed), uploaded 1 objects (4 bytes), puts=2, deleted 1 unreferenced objects;"
        ),
        "{second}"
    );
    assert_eq!(world.stored_text(&session, "notes.txt"), "two\n");
}

#[test]
fn of_two_runners_saving_one_workspace_the_one_that_lost_it_is_told_and_keeps_its_copy() {
    let _guard = stack().guard();
    let world = World::new("s3race");
    world.define_web();
    let api = &world.api;
    let session = api.create_fake_session().id;
    let label = format!("{session}/web");

    // A attaches and writes, then dies without saving (its lease stays).
    let mut a = Runner::start(world.cloud_runner("cloud-a"));
    attach_web(api, &session, "cloud-a");
    bash(api, &session, "echo from-a > who.txt");
    let root_a = a
        .workspaces_root()
        .join(&session)
        .canonicalize()
        .expect("A's copy");
    a.kill_hard();
    let detached = detach_web(api, &session);
    assert!(detached.contains("cloud-a"), "{detached}");

    // B takes the workspace over, writes and detaches: its save wins.
    let b = Runner::start(world.cloud_runner("cloud-b"));
    attach_web(api, &session, "cloud-b");
    assert!(
        b.log().contains(&format!(
            "took workspace {label} over from runner \"cloud-a\""
        )),
        "{}",
        b.log_tail(20)
    );
    bash(api, &session, "echo from-b > who.txt");
    detach_web(api, &session);
    last_save_report(&b, &label);
    assert_eq!(world.stored_text(&session, "who.txt"), "from-b\n");

    // A comes back, adopts the workspace it held, and tries to save it before exiting: refused,
    // said in its log, and its copy stays.
    a.restart();
    assert!(
        a.current_log().contains("1 workspace(s) adopted"),
        "{}",
        a.log_tail(20)
    );
    a.stop(Duration::from_secs(60));
    let log = a.current_log();
    let refused = log
        .lines()
        .find(|l| l.contains(&format!("NOT saved workspace {label}")))
        .unwrap_or_else(|| panic!("no refusal in A's log:\n{log}"));
    assert!(
        refused.contains(&format!("keeps its copy at {}", root_a.display())),
        "{refused}"
    );
    assert_eq!(
        std::fs::read_to_string(root_a.join("who.txt")).expect("A's copy"),
        "from-a\n"
    );
    assert_eq!(world.stored_text(&session, "who.txt"), "from-b\n");
}

#[test]
fn a_save_deletes_the_objects_its_manifest_no_longer_references_and_keeps_the_rest() {
    let _guard = stack().guard();
    let world = World::new("s3gc");
    world.define_web();
    let api = &world.api;
    let session = api.create_fake_session().id;
    let label = format!("{session}/web");
    let object = |sha: &str| {
        moto().get(
            BUCKET,
            &format!("{}/workspaces/{session}/web/objects/{sha}", world.prefix),
        )
    };
    let sha_of = |manifest: &Value, path: &str| {
        manifest["files"][path]["sha256"]
            .as_str()
            .unwrap_or_else(|| panic!("{path} not in {manifest}"))
            .to_string()
    };

    // This runner's keys come from a `credential_process` in the shared config file.
    let script = world.dir.write(
        "creds.sh",
        "#!/bin/sh\nprintf '{\"Version\": 1, \"AccessKeyId\": \"wuhu-e2e-key\", \"SecretAccessKey\": \"wuhu-e2e-secret\", \"Expiration\": \"2999-01-01T00:00:00Z\"}'\n",
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod the script");
    let aws_config = world.dir.write(
        "aws-config",
        &format!("[default]\ncredential_process = {}\n", script.display()),
    );
    let mut config = world.cloud_runner("cloud-gc");
    config.vars.retain(|(k, _)| !k.starts_with("AWS_"));
    let config = config
        .var("AWS_CONFIG_FILE", aws_config.to_string_lossy())
        .var(
            "AWS_SHARED_CREDENTIALS_FILE",
            world.dir.path().join("no-credentials").to_string_lossy(),
        );
    let runner = Runner::start(config);
    assert!(
        runner
            .log()
            .contains("credentials from CredentialProcess, expiring in "),
        "{}",
        runner.log_tail(20)
    );
    attach_web(api, &session, "cloud-gc");
    bash(
        api,
        &session,
        "echo old > changed.txt; echo kept > renamed.txt; echo same > a.txt; cp a.txt b.txt",
    );
    detach_web(api, &session);
    let first = world.manifest(&session).expect("the first manifest");
    let old_changed = sha_of(&first, "changed.txt");
    let renamed = sha_of(&first, "renamed.txt");
    let shared = sha_of(&first, "a.txt");
    assert!(object(&old_changed).is_some());

    // Change one file, rename another, remove one of two paths sharing a content.
    attach_web(api, &session, "cloud-gc");
    bash(
        api,
        &session,
        "echo new > changed.txt; mv renamed.txt moved.txt; rm b.txt",
    );
    detach_web(api, &session);
    let second = last_save_report(&runner, &label);
    // Exactly one object lost its last reference: the changed file's old content.
    assert!(
        second.contains("uploaded 1 objects (4 bytes), puts=2, deleted 1 unreferenced objects;"),
        "{second}"
    );
    let manifest = world.manifest(&session).expect("the second manifest");
    assert_eq!(sha_of(&manifest, "moved.txt"), renamed);
    assert_eq!(object(&old_changed), None, "the old content is deleted");
    assert_eq!(object(&renamed).as_deref(), Some(&b"kept\n"[..]));
    assert_eq!(object(&shared).as_deref(), Some(&b"same\n"[..]));
    // Every object the manifest references is there.
    for (path, entry) in manifest["files"].as_object().expect("files") {
        if let Some(sha) = entry["sha256"].as_str() {
            assert!(object(sha).is_some(), "{path}: object {sha} missing");
        }
    }
    assert_eq!(world.stored_text(&session, "changed.txt"), "new\n");
}

fn delete_session(api: &Api, session: &str) -> u16 {
    api.send(api.request("DELETE", &format!("/v1/sessions/{session}")))
        .status
}

/// Waits until the runner said it discarded `session`'s workspaces (it says so after deleting
/// them), then checks that `session` has no stored key and `root` is gone.
#[track_caller]
fn wait_discarded(world: &World, runner: &Runner, session: &str, root: &std::path::Path) {
    let said = format!("session {session} was deleted: discarded its workspaces");
    let waited = wuhu_e2e::util::wait_until(Duration::from_secs(60), || {
        runner.log().contains(&said).then_some(())
    });
    assert!(waited.is_ok(), "no {said:?} in:\n{}", runner.log_tail(20));
    assert_eq!(world.session_keys(session), Vec::<String>::new());
    assert!(!root.exists(), "{} is still there", root.display());
}

#[test]
fn deleting_the_session_discards_its_stored_workspace_and_local_copy() {
    let _guard = stack().guard();
    let world = World::new("s3del");
    world.define_web();
    let api = &world.api;
    let session = api.create_fake_session().id;
    let other = api.create_fake_session().id;

    let mut runner = Runner::start(world.cloud_runner("cloud-del"));
    // Another session's workspace on the same runner and store: it stays.
    attach_web(api, &other, "cloud-del");
    bash(api, &other, "echo other > keep.txt");
    detach_web(api, &other);
    let others = world.session_keys(&other);
    assert!(!others.is_empty());

    attach_web(api, &session, "cloud-del");
    bash(api, &session, "echo saved > a.txt");
    detach_web(api, &session);
    assert!(world.manifest(&session).is_some());
    // Attached again: a held local copy and a lease, and a file not saved yet.
    attach_web(api, &session, "cloud-del");
    bash(api, &session, "echo unsaved > b.txt");
    let root = runner.workspaces_root().join(&session);
    assert!(root.join("b.txt").exists());
    let keys = world.session_keys(&session);
    assert!(
        keys.iter().any(|k| k.ends_with("/web/lease.json"))
            && keys.iter().any(|k| k.ends_with("/web/manifest.json"))
            && keys.iter().any(|k| k.contains("/web/objects/")),
        "{keys:?}"
    );

    let before = runner.log().len();
    assert_eq!(delete_session(api, &session), 204);
    wait_discarded(&world, &runner, &session, &root);
    // The runner no longer saves it: its exit save uploads nothing of the session.
    runner.stop(Duration::from_secs(60));
    assert_eq!(world.session_keys(&session), Vec::<String>::new());
    let after = runner.log()[before..].to_string();
    assert!(
        !after.contains(&format!("saved workspace {session}/")),
        "{after}"
    );
    assert_eq!(world.session_keys(&other), others);
}

#[test]
fn a_runner_away_during_the_delete_discards_the_workspace_when_it_connects() {
    let _guard = stack().guard();
    let world = World::new("s3delaway");
    world.define_web();
    let api = &world.api;
    let session = api.create_fake_session().id;

    let mut runner = Runner::start(world.cloud_runner("cloud-away"));
    attach_web(api, &session, "cloud-away");
    bash(api, &session, "echo saved > a.txt");
    detach_web(api, &session);
    attach_web(api, &session, "cloud-away");
    bash(api, &session, "echo unsaved > b.txt");
    let root = runner.workspaces_root().join(&session);
    // The runner dies holding the workspace (its copy and its record of it stay on disk).
    runner.kill_hard();
    assert!(root.join("b.txt").exists());

    assert_eq!(delete_session(api, &session), 204);
    // Nobody could discard anything yet.
    assert!(!world.session_keys(&session).is_empty());
    assert!(root.exists());

    // Back: it adopts the workspace, connects, is told, and discards it.
    runner.restart();
    wait_discarded(&world, &runner, &session, &root);
    runner.stop(Duration::from_secs(60));
    assert_eq!(world.session_keys(&session), Vec::<String>::new());
    assert!(
        !runner
            .current_log()
            .contains(&format!("saved workspace {session}/"))
    );
}

/// The access key ids that signed moto's requests for `world`'s keys since `from` (moto logs
/// each request line; rusty-s3 signs in the query, `X-Amz-Credential=KEY/DATE/…`), in order.
fn signing_keys(world: &World, from: usize) -> Vec<String> {
    let log = moto().log();
    let object_path = format!("/{BUCKET}/{}/", world.prefix);
    let listing = format!("prefix={}/", world.prefix);
    log[from.min(log.len())..]
        .lines()
        .filter(|line| line.contains(&object_path) || line.contains(&listing))
        .filter_map(|line| {
            let rest = &line[line.find("X-Amz-Credential=")? + "X-Amz-Credential=".len()..];
            let end = rest.find(['/', '%', '&']).unwrap_or(rest.len());
            Some(rest[..end].to_string())
        })
        .collect()
}

/// A save through a store whose keys came from `runner`'s chain: attach, write, detach.
fn save_one_file(world: &World, runner: &str) -> String {
    let api = &world.api;
    let session = api.create_fake_session().id;
    attach_web(api, &session, runner);
    bash(api, &session, "echo saved > saved.txt");
    detach_web(api, &session);
    assert_eq!(world.stored_text(&session, "saved.txt"), "saved\n");
    session
}

#[test]
fn an_instance_role_signs_through_imdsv2_and_its_keys_are_fetched_again_when_they_expire() {
    let _guard = stack().guard();
    let world = World::new("s3imds");
    world.define_web();
    let api = &world.api;
    let imds = FakeImds::start();
    // The first keys live 20 s: long enough to attach, short enough to wait out.
    imds.set_lifetime(20);
    let moto_log_start = moto().log().len();
    let runner = Runner::start(
        world
            .cloud_runner_without_keys("cloud-imds")
            .var("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint()),
    );
    let started = runner.log();
    assert!(
        started.contains("credentials from IMDSv2, expiring in "),
        "{started}"
    );
    let session = api.create_fake_session().id;
    attach_web(api, &session, "cloud-imds");
    bash(api, &session, "echo one > one.txt");
    let (first_key, first_expiry) = imds.issued()[0].clone();
    assert_eq!(
        imds.issued().len(),
        1,
        "one fetch at start: {:?}",
        imds.issued()
    );
    // Keys fetched after this live an hour; the runner fetches them once the first expired.
    imds.set_lifetime(3600);
    wuhu_e2e::wait_for("the first keys to expire", Duration::from_secs(30), || {
        (wuhu_e2e::util::unix_now() > first_expiry).then_some(())
    });
    detach_web(api, &session);
    assert_eq!(world.stored_text(&session, "one.txt"), "one\n");

    let issued = imds.issued();
    assert_eq!(issued.len(), 2, "{issued:?}");
    let keys = signing_keys(&world, moto_log_start);
    let first_use = keys.iter().position(|k| *k == first_key);
    let second_use = keys.iter().position(|k| *k == issued[1].0);
    assert!(
        first_use.is_some() && second_use > first_use,
        "the hydrate signed with {first_key}, the save with {}: {keys:?}",
        issued[1].0
    );
    assert!(
        keys[second_use.unwrap()..]
            .iter()
            .all(|k| *k == issued[1].0),
        "no request after the refresh used the expired keys: {keys:?}"
    );
    assert!(
        runner.log().contains("credentials refreshed from IMDSv2"),
        "{}",
        runner.log_tail(20)
    );
    // IMDSv2 only: every read carried a live session token, asked for with a TTL.
    assert_eq!(imds.refused(), Vec::<String>::new());
    let puts = imds
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT")
        .count();
    assert!(puts >= 1, "{:?}", imds.requests());
}

#[test]
fn a_web_identity_token_and_a_role_profile_get_keys_from_sts() {
    let _guard = stack().guard();
    let world = World::new("s3sts");
    world.define_web();
    let role = "arn:aws:iam::123456789012:role/wuhu-runner";
    let no_imds = |config: RunnerConfig| {
        config
            .var("AWS_ENDPOINT_URL_STS", moto().endpoint())
            .var("AWS_EC2_METADATA_DISABLED", "true")
    };

    // EKS-style: a projected service-account token and the role to assume with it.
    let token_file = world
        .dir
        .write("web-identity-token", "eyJhbGciOiJSUzI1NiJ9.e2e.token");
    let from = moto().log().len();
    let web_identity = Runner::start(no_imds(
        world
            .cloud_runner_without_keys("cloud-oidc")
            .var(
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.display().to_string(),
            )
            .var("AWS_ROLE_ARN", role)
            .var("AWS_ROLE_SESSION_NAME", "wuhu-e2e")
            .var("AWS_REGION", "us-east-1"),
    ));
    assert!(
        web_identity
            .log()
            .contains("credentials from WebIdentityToken, expiring in "),
        "{}",
        web_identity.log()
    );
    save_one_file(&world, "cloud-oidc");
    let keys = signing_keys(&world, from);
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("ASIA")),
        "the S3 requests are signed with STS's temporary keys: {keys:?}"
    );
    drop(web_identity);

    // A profile that assumes a role with another profile's keys.
    let config_file = world.dir.write(
        "aws-config",
        &format!(
            "[profile base]\naws_access_key_id = AKIDBASEPROFILE\naws_secret_access_key = base-secret\n\n\
             [profile runner]\nrole_arn = {role}\nsource_profile = base\nregion = us-east-1\n"
        ),
    );
    // It holds keys: private to the runner's user, or the runner refuses to start.
    std::fs::set_permissions(
        &config_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod the config");
    let from = moto().log().len();
    let assumed = Runner::start(no_imds(
        world
            .cloud_runner_without_keys("cloud-role")
            .var("AWS_CONFIG_FILE", config_file.display().to_string())
            .var("AWS_PROFILE", "runner"),
    ));
    assert!(
        assumed
            .log()
            .contains("credentials from AssumeRoleProvider, expiring in "),
        "{}",
        assumed.log()
    );
    save_one_file(&world, "cloud-role");
    let keys = signing_keys(&world, from);
    assert!(
        !keys.is_empty()
            && keys
                .iter()
                .all(|k| k.starts_with("ASIA") && k != "AKIDBASEPROFILE"),
        "the S3 requests are signed with the assumed role's keys, not the source profile's: {keys:?}"
    );
}

#[test]
fn a_runner_without_credentials_stops_at_start_saying_what_the_chain_tried() {
    let world = World::new("s3none");
    let config = world
        .cloud_runner_without_keys("cloud-none")
        .var("AWS_EC2_METADATA_DISABLED", "true");
    let mut runner = Runner::spawn(config);
    let status = runner.wait_exit(Duration::from_secs(60));
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", runner.log());
    let log = runner.log();
    assert!(
        log.contains("--store: no S3 credentials from the AWS credentials chain"),
        "{log}"
    );
}

#[test]
fn sso_and_container_credentials_sign_the_store() {
    let _guard = stack().guard();
    let world = World::new("s3sso");
    world.define_web();
    let now = wuhu_e2e::util::unix_now();
    let expires_at = std::time::UNIX_EPOCH + Duration::from_secs((now + 3600) as u64);
    // AWS's SSO portal (GetRoleCredentials) and an ECS credentials endpoint, as local fakes
    // speaking their wire formats.
    let aws = wuhu_e2e::FakeHttp::start();
    aws.route(
        "/federation/credentials",
        wuhu_e2e::HttpReply::json(&json!({"roleCredentials": {
            "accessKeyId": "ASIAFAKESSO0001",
            "secretAccessKey": "fake-sso-secret",
            "sessionToken": "fake-sso-session-token",
            "expiration": (now + 3600) * 1000,
        }})),
    );
    aws.route(
        "/ecs-credentials",
        wuhu_e2e::HttpReply::json(&json!({
            "AccessKeyId": "ASIAFAKEECS0001",
            "SecretAccessKey": "fake-ecs-secret",
            "Token": "fake-ecs-session-token",
            "Expiration": wuhu_e2e::util::rfc3339_utc(expires_at),
        })),
    );

    // SSO: a profile with sso_start_url and the token `aws sso login` left in the cache.
    let start_url = "https://wuhu-e2e.awsapps.com/start";
    let home = world.dir.mkdir("sso-home");
    let sha1 = std::process::Command::new("sh")
        .args([
            "-c",
            "printf '%s' \"$1\" | sha1sum | cut -d' ' -f1",
            "sh",
            start_url,
        ])
        .output()
        .expect("sha1sum");
    let cache_name = String::from_utf8_lossy(&sha1.stdout).trim().to_string();
    world.dir.write(
        &format!("sso-home/.aws/sso/cache/{cache_name}.json"),
        &json!({"accessToken": "sso-access-token", "expiresAt": "2099-01-01T00:00:00Z",
                "region": "us-east-1", "startUrl": start_url})
        .to_string(),
    );
    world.dir.write(
        "sso-home/.aws/config",
        &format!(
            "[profile runner]\nsso_start_url = {start_url}\nsso_region = us-east-1\n\
             sso_account_id = 123456789012\nsso_role_name = WuhuRunner\nregion = us-east-1\n"
        ),
    );
    let from = moto().log().len();
    let sso = Runner::start(
        world
            .cloud_runner_without_keys("cloud-sso")
            .var("HOME", home.display().to_string())
            .var("AWS_PROFILE", "runner")
            .var("AWS_ENDPOINT_URL_SSO", aws.base_url())
            .var("AWS_EC2_METADATA_DISABLED", "true"),
    );
    assert!(
        sso.log().contains("credentials from SSO, expiring in "),
        "{}",
        sso.log()
    );
    save_one_file(&world, "cloud-sso");
    let keys = signing_keys(&world, from);
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k == "ASIAFAKESSO0001"),
        "{keys:?}"
    );
    let asked = aws.requests_to("/federation/credentials");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0].header("x-amz-sso_bearer_token"),
        Some("sso-access-token")
    );
    assert!(
        asked[0].path.contains("role_name=WuhuRunner")
            && asked[0].path.contains("account_id=123456789012"),
        "{}",
        asked[0].path
    );
    drop(sso);

    // A container's credentials endpoint with its authorization token.
    let from = moto().log().len();
    let ecs = Runner::start(
        world
            .cloud_runner_without_keys("cloud-ecs")
            .var(
                "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                aws.url("/ecs-credentials"),
            )
            .var(
                "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                "ecs-authorization-token",
            )
            .var("AWS_EC2_METADATA_DISABLED", "true"),
    );
    assert!(
        ecs.log()
            .contains("credentials from EcsContainer, expiring in "),
        "{}",
        ecs.log()
    );
    save_one_file(&world, "cloud-ecs");
    let keys = signing_keys(&world, from);
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k == "ASIAFAKEECS0001"),
        "{keys:?}"
    );
    let asked = aws.requests_to("/ecs-credentials");
    assert_eq!(
        asked[0].header("authorization"),
        Some("ecs-authorization-token"),
        "{asked:?}"
    );
}
