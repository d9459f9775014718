//! `scripts/dev` as a developer runs it: the token it prints is accepted by the Worker it starts,
//! whatever valid dotenv the `.dev.vars` file holds (quotes, `export`, comments, CRLF line ends,
//! a repeated key), and a second start with nothing changed does not build the Worker again.
//!
//! Each start runs the real script with `WUHU_DEV_CONFIG` naming a copy of `wrangler.toml` in a
//! temp dir (its `.dev.vars` and `.state/` then live there, never in the developer's checkout)
//! and `WUHU_PORT=0`; the script's process group is stopped by PID.

use std::io::Read as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wuhu_e2e::stack::{ensure_worker_built, group_alive, ready_port, repo_root, signal_group};
use wuhu_e2e::util::make_temp_dir;
use wuhu_e2e::{Request, jwt};

/// A running `scripts/dev`, stopped (its whole process group) on drop.
struct Dev {
    child: Child,
    log: PathBuf,
    port: u16,
    token: String,
}

impl Dev {
    fn start(dir: &Path) -> Dev {
        let log = dir.join(format!("dev-{}.log", wuhu_e2e::util::unique_name("run")));
        let out = std::fs::File::create(&log).expect("create the log");
        let child = Command::new("bash")
            .arg(repo_root().join("scripts/dev"))
            .env("WUHU_DEV_CONFIG", dir.join("wrangler.toml"))
            .env("WUHU_PORT", "0")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone the log"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("start scripts/dev");
        let mut dev = Dev {
            child,
            log,
            port: 0,
            token: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if dev.port == 0 {
                dev.port = ready_port(&dev.log, 0).unwrap_or(0);
            }
            if dev.port != 0 && dev.healthz() {
                break;
            }
            if let Some(status) = dev.child.try_wait().expect("wait") {
                panic!("scripts/dev exited ({status}):\n{}", dev.output());
            }
            assert!(
                Instant::now() < deadline,
                "scripts/dev did not answer /healthz within 120 s:\n{}",
                dev.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let output = dev.output();
        dev.token = output
            .lines()
            .find_map(|l| l.trim().strip_prefix("export TOKEN="))
            .unwrap_or_else(|| panic!("no `export TOKEN=` line:\n{output}"))
            .to_string();
        dev
    }

    fn output(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.log) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    fn healthz(&self) -> bool {
        Request::new("GET", format!("http://127.0.0.1:{}/healthz", self.port))
            .send()
            .is_ok_and(|r| r.status == 200)
    }

    /// The status of `GET /v1/sessions` with `token`.
    fn sessions_status(&self, token: &str) -> u16 {
        Request::new("GET", format!("http://127.0.0.1:{}/v1/sessions", self.port))
            .bearer(token)
            .send()
            .expect("GET /v1/sessions")
            .status
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        signal_group(pgid, libc::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(pgid, libc::SIGKILL);
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_alive(pgid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A temp dir with a copy of `wrangler.toml` whose paths point into the repository.
fn dev_dir() -> PathBuf {
    let root = repo_root();
    let dir = make_temp_dir("wuhu-dev-script");
    let config = std::fs::read_to_string(root.join("wrangler.toml")).expect("read wrangler.toml");
    let main = "main = \"worker/entry.mjs\"";
    let assets = "directory = \"web/dist\"";
    assert!(config.contains(main) && config.contains(assets), "{config}");
    let config = config
        .replace(
            main,
            &format!("main = \"{}\"", root.join("worker/entry.mjs").display()),
        )
        .replace(
            assets,
            &format!("directory = \"{}\"", root.join("web/dist").display()),
        );
    std::fs::write(dir.join("wrangler.toml"), config).expect("write wrangler.toml");
    dir
}

/// What `.dev.vars` may hold, as a developer writes it; `{S}` is the secret, `{K}` the channel
/// key (and the secrets key). Each is valid dotenv that wrangler reads as WUHU_JWT_SECRET = the secret.
const DEV_VARS: [&str; 2] = [
    // Double quotes after `export`, a comment after the value, CRLF line ends, another variable
    // in backquotes.
    "# local secrets\r\nexport WUHU_JWT_SECRET=\"{S}\"  # generated by hand\r\nOPENAI_API_KEY=`sk-test`\r\nWUHU_CHANNEL_KEY={K}\r\nWUHU_SECRETS_KEY={K}\r\n",
    // Single quotes, spaces around `=`, the key twice (the last one wins), an unquoted value with
    // a trailing comment, and no newline at the end of the file.
    "WUHU_JWT_SECRET=an-old-secret-that-is-long-enough-0123\nWUHU_CHANNEL_KEY={K} # the key\nWUHU_SECRETS_KEY='{K}'\nWUHU_JWT_SECRET = '{S}'",
];

#[test]
fn the_printed_token_is_accepted_whatever_valid_dotenv_dev_vars_holds() {
    ensure_worker_built();
    let dir = dev_dir();

    // No .dev.vars at all: the three secrets are generated into it.
    {
        let dev = Dev::start(&dir);
        assert_eq!(dev.sessions_status(&dev.token), 200, "{}", dev.output());
        let vars = std::fs::read_to_string(dir.join(".dev.vars")).expect("generated .dev.vars");
        assert!(
            vars.contains("WUHU_JWT_SECRET=")
                && vars.contains("WUHU_CHANNEL_KEY=")
                && vars.contains("WUHU_SECRETS_KEY="),
            "{vars}"
        );
        // A second start with nothing changed builds nothing.
        assert!(
            dev.output().contains("the worker is up to date"),
            "{}",
            dev.output()
        );
    }

    for (i, template) in DEV_VARS.iter().enumerate() {
        // Characters that `cut -d=` would have kept with the quotes around them: spaces, '$',
        // '=' and '#'.
        let secret = format!(
            "s3cret #{i} with spaces, $HOME and = signs, {}",
            wuhu_e2e::util::random_hex(16)
        );
        let key = wuhu_e2e::util::random_hex(32);
        let text = template.replace("{S}", &secret).replace("{K}", &key);
        std::fs::write(dir.join(".dev.vars"), &text).expect("write .dev.vars");
        let dev = Dev::start(&dir);
        assert_eq!(
            dev.sessions_status(&dev.token),
            200,
            "the printed token was refused with .dev.vars {text:?}:\n{}",
            dev.output()
        );
        // The Worker checks the secret as written: a token signed with it works, one signed
        // with a secret `cut` would have read does not.
        let claims = jwt::user_claims("ana", "dev", 600);
        assert_eq!(
            dev.sessions_status(&jwt::hs256(secret.as_bytes(), &claims)),
            200
        );
        assert_eq!(
            dev.sessions_status(&jwt::hs256(format!("\"{secret}\"").as_bytes(), &claims)),
            401
        );
        // Nothing was appended: the secret was found however it was written.
        assert_eq!(
            std::fs::read_to_string(dir.join(".dev.vars")).expect("read .dev.vars"),
            text
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dotenv scripts/dev reads `.dev.vars` with (package.json) is the one wrangler bundles: a
/// wrangler upgrade that moves to another dotenv fails here, not in a developer's first request.
#[test]
fn scripts_read_dev_vars_with_the_dotenv_wrangler_bundles() {
    let root = repo_root();
    let cli = std::fs::read_to_string(root.join("node_modules/wrangler/wrangler-dist/cli.js"))
        .expect("wrangler's cli.js (npm ci)");
    let marker = "node_modules/.pnpm/dotenv@";
    let start = cli.find(marker).expect("wrangler bundles dotenv") + marker.len();
    let bundled: String = cli[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let package: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("package.json")).expect("package.json"),
    )
    .expect("package.json is JSON");
    assert_eq!(
        package["devDependencies"]["dotenv"].as_str(),
        Some(bundled.as_str()),
        "package.json's dotenv must be the version wrangler bundles (scripts/lib/dev-vars.mjs)"
    );
    let installed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("node_modules/dotenv/package.json"))
            .expect("node_modules/dotenv"),
    )
    .expect("JSON");
    assert_eq!(installed["version"].as_str(), Some(bundled.as_str()));
}
