//! The macOS form of a cell: a Seatbelt profile (SBPL, run with `sandbox-exec -p PROFILE`),
//! generated per call from the same [`CellPolicy`] the Linux runner enforces with Landlock.
//!
//! Everything is denied unless allowed: reading and running below the read-only and read-write
//! paths, writing below the read-write ones (each minus the [`Protected`] paths, which are
//! refused even there), the device files, stat of any path (tools walk up from their cwd; no
//! file's content or directory listing comes with it), process creation, signals and process
//! information only within the sandbox, sysctl reads, and the system services name lookups need.
//! The network is nothing (`none`), the runner's proxy on loopback alone (`allow`), or everything
//! (`open`).

use super::{CellPolicy, Network, Protected};

/// The profile for `policy`; `proxy_port` is the runner's proxy for an `allow` network (on
/// `127.0.0.1`, where nothing else is allowed).
pub fn profile(policy: &CellPolicy, protected: &[Protected], proxy_port: Option<u16>) -> String {
    let mut out = String::from("(version 1)\n(deny default)\n");
    out.push_str(
        "(allow process-fork)\n\
         (allow process-exec)\n\
         (allow signal (target same-sandbox))\n\
         (allow process-info* (target same-sandbox))\n\
         (allow sysctl-read)\n\
         (allow file-read-metadata)\n\
         (allow mach-lookup\n  (global-name \"com.apple.system.opendirectoryd.libinfo\")\n  (global-name \"com.apple.system.logger\")\n  (global-name \"com.apple.system.notification_center\"))\n\
         (allow ipc-posix-shm-read-data (ipc-posix-name \"apple.shm.notification_center\"))\n",
    );
    let except = protected
        .iter()
        .map(|p| format!(" (subpath {})", quote(&p.path)))
        .collect::<String>();
    let guarded = |paths: &[String]| -> String {
        let any = paths
            .iter()
            .map(|p| format!(" (subpath {})", quote(p)))
            .collect::<String>();
        if except.is_empty() {
            format!("(require-any{any})")
        } else {
            format!("(require-all (require-any{any}) (require-not (require-any{except})))")
        }
    };
    let readable: Vec<String> = policy
        .read_only
        .iter()
        .chain(&policy.read_write)
        .cloned()
        .collect();
    out.push_str(&format!(
        "(allow file-read* process-exec {})\n",
        guarded(&readable)
    ));
    out.push_str(&format!(
        "(allow file-write* {})\n",
        guarded(&policy.read_write)
    ));
    let devices = policy
        .devices
        .iter()
        .map(|d| format!(" (literal {})", quote(d)))
        .collect::<String>();
    out.push_str(&format!(
        "(allow file-read* file-write-data file-ioctl (require-any{devices}))\n"
    ));
    match (&policy.network, proxy_port) {
        (Network::Open, _) => out.push_str("(allow network*)\n(allow system-socket)\n"),
        (Network::Allow(_), Some(port)) => out.push_str(&format!(
            "(allow network-outbound (remote tcp \"localhost:{port}\"))\n(allow system-socket)\n"
        )),
        (Network::Allow(_), None) | (Network::None, _) => {}
    }
    out
}

/// An SBPL string literal.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellLimits, CellPolicy};

    fn policy(network: Network) -> CellPolicy {
        CellPolicy {
            read_write: vec![
                String::from("/Users/ana/src/api"),
                String::from("/Users/ana/.wuhu/run/calls/call-1"),
            ],
            read_only: vec![String::from("/usr"), String::from("/opt/homebrew")],
            devices: vec![String::from("/dev/null")],
            temp_dir: String::from("/Users/ana/.wuhu/run/calls/call-1"),
            network,
            limits: CellLimits::DEFAULT,
            refused: vec![],
        }
    }

    #[test]
    fn the_profile_allows_the_cell_and_nothing_else() {
        let protected = [Protected::new(
            "/Users/ana/.wuhu/runner.yml",
            "the runner's config",
        )];
        let text = profile(&policy(Network::None), &protected, None);
        expect_test::expect![[r#"
            (version 1)
            (deny default)
            (allow process-fork)
            (allow process-exec)
            (allow signal (target same-sandbox))
            (allow process-info* (target same-sandbox))
            (allow sysctl-read)
            (allow file-read-metadata)
            (allow mach-lookup
              (global-name "com.apple.system.opendirectoryd.libinfo")
              (global-name "com.apple.system.logger")
              (global-name "com.apple.system.notification_center"))
            (allow ipc-posix-shm-read-data (ipc-posix-name "apple.shm.notification_center"))
            (allow file-read* process-exec (require-all (require-any (subpath "/usr") (subpath "/opt/homebrew") (subpath "/Users/ana/src/api") (subpath "/Users/ana/.wuhu/run/calls/call-1")) (require-not (require-any (subpath "/Users/ana/.wuhu/runner.yml")))))
            (allow file-write* (require-all (require-any (subpath "/Users/ana/src/api") (subpath "/Users/ana/.wuhu/run/calls/call-1")) (require-not (require-any (subpath "/Users/ana/.wuhu/runner.yml")))))
            (allow file-read* file-write-data file-ioctl (require-any (literal "/dev/null")))
        "#]]
        .assert_eq(&text);
        // Nothing about the network at all: denied by default.
        assert!(!text.contains("network"));
    }

    #[test]
    fn networks_and_quoting() {
        let open = profile(&policy(Network::Open), &[], None);
        assert!(
            open.contains("(allow network*)\n(allow system-socket)\n"),
            "{open}"
        );
        assert!(
            open.contains("(allow file-write* (require-any (subpath \"/Users/ana/src/api\")"),
            "{open}"
        );
        let allow = profile(
            &policy(Network::Allow(vec![String::from("github.com")])),
            &[],
            Some(41234),
        );
        assert!(
            allow.contains("(allow network-outbound (remote tcp \"localhost:41234\"))\n"),
            "{allow}"
        );
        assert!(!allow.contains("(allow network*)"));
        // Without its proxy an allow list reaches nothing.
        let no_proxy = profile(&policy(Network::Allow(vec![])), &[], None);
        assert!(!no_proxy.contains("network"));
        assert_eq!(quote("/a \"b\"\\c"), "\"/a \\\"b\\\"\\\\c\"");
        let mut odd = policy(Network::None);
        odd.read_write[0] = String::from("/Users/ana/we\"ird");
        assert!(profile(&odd, &[], None).contains("(subpath \"/Users/ana/we\\\"ird\")"));
    }
}
