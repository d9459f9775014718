//! A local S3-compatible server for cloud-workspace tests: moto (`moto_server`, from PyPI),
//! in memory, with atomic conditional puts and no auth check
//! (`docs/decisions/0014-cloud-workspaces-on-object-storage.md`).
//!
//! The binary is `$MOTO_SERVER_BIN`, else what `ensure_moto` in `scripts/lib/setup.sh`
//! installs (idempotently, into a versioned virtualenv under `~/.cache/wuhu-tools`). Each
//! [`Moto`] listens on an ephemeral port, is waited for with a deadline, and is killed by PID on
//! drop or, through a watchdog, when the test process exits.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::http::Request;
use crate::stack::{free_port, repo_root};
use crate::util::wait_for;

/// An `Authorization` header moto accepts (it parses the key id and checks nothing else).
const FAKE_AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=wuhu-e2e-key/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";

/// One running `moto_server`.
pub struct Moto {
    child: Child,
    watchdog: Option<Child>,
    port: u16,
    log_path: PathBuf,
}

/// The `moto_server` binary: `$MOTO_SERVER_BIN`, else installed by `ensure_moto` once per
/// process.
pub fn moto_bin() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("MOTO_SERVER_BIN") {
            return PathBuf::from(bin);
        }
        let output = Command::new("bash")
            .args([
                "-c",
                "source scripts/lib/setup.sh && ensure_moto && printf '%s' \"$MOTO_SERVER_BIN\"",
            ])
            .current_dir(repo_root())
            .stderr(Stdio::inherit())
            .output()
            .expect("run ensure_moto");
        assert!(
            output.status.success(),
            "ensure_moto failed ({:?})",
            output.status
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).into_owned())
    })
}

impl Moto {
    /// Starts moto on an ephemeral port and waits until it answers.
    #[track_caller]
    pub fn start() -> Moto {
        let port = free_port();
        let dir = crate::util::make_temp_dir("wuhu-e2e-moto");
        let log_path = dir.join("moto.log");
        let log = std::fs::File::create(&log_path).expect("create the moto log");
        let child = Command::new(moto_bin())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", moto_bin().display()));
        let watchdog = spawn_watchdog(child.id());
        let moto = Moto {
            child,
            watchdog,
            port,
            log_path,
        };
        wait_for("moto to answer", Duration::from_secs(30), || {
            Request::new("GET", format!("{}/", moto.endpoint()))
                .timeout(Duration::from_secs(2))
                .send()
                .ok()
                .filter(|r| r.status == 200)
        });
        moto
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates a bucket (moto checks no signature).
    #[track_caller]
    pub fn create_bucket(&self, bucket: &str) {
        let response = Request::new("PUT", format!("{}/{bucket}", self.endpoint()))
            .send()
            .expect("create bucket");
        assert_eq!(
            response.status,
            200,
            "create bucket {bucket}: {}",
            response.text()
        );
    }

    /// An object's body, or `None` when it does not exist.
    #[track_caller]
    pub fn get(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        // moto refuses anonymous reads but checks no signature: any SigV4-shaped header does.
        let response = Request::new("GET", format!("{}/{bucket}/{key}", self.endpoint()))
            .header("Authorization", FAKE_AUTHORIZATION)
            .send()
            .expect("get object");
        match response.status {
            200 => Some(response.body.clone()),
            404 => None,
            other => panic!("GET {bucket}/{key}: {other}: {}", response.text()),
        }
    }

    /// The keys under `prefix` (one listing page: at most 1,000), sorted.
    #[track_caller]
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let response = Request::new(
            "GET",
            format!("{}/{bucket}?list-type=2&prefix={prefix}", self.endpoint()),
        )
        .header("Authorization", FAKE_AUTHORIZATION)
        .send()
        .expect("list objects");
        assert_eq!(
            response.status,
            200,
            "LIST {bucket}/{prefix}: {}",
            response.text()
        );
        let text = response.text();
        let mut keys: Vec<String> = text
            .split("<Key>")
            .skip(1)
            .filter_map(|rest| rest.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect();
        keys.sort();
        keys
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            // SAFETY: the watchdog shell leads its own process group (ours, unreaped).
            unsafe {
                libc::kill(-(watchdog.id() as libc::pid_t), libc::SIGKILL);
            }
            let _ = watchdog.wait();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A shell that waits for EOF on its stdin (our end closes when this process exits), then
/// SIGKILLs `pid`. Stopped before moto is reaped, so it never signals a recycled PID.
fn spawn_watchdog(pid: u32) -> Option<Child> {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .args([
            "-c",
            "cat >/dev/null; kill -s KILL \"$1\" 2>/dev/null",
            "wuhu-e2e-moto-watchdog",
            &pid.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()
}
