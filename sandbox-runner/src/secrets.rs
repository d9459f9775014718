//! The runner's own secrets (its token, its store's keys): read once at start, out of every
//! cell's reach, and never left where a child could read them (issue 30, security review N4).
//!
//! * Files holding them must be private to the runner's user ([`check_secret_file`], rule
//!   [`wuhu_core::cell::check_secret_file_mode`]): the runner refuses to start otherwise.
//! * Once read, the variables that carried them are wiped from the process's own environment
//!   block ([`scrub_environment`]), so `/proc/<runner pid>/environ` no longer shows them (a cell
//!   cannot reach that file anyway: it has a `/proc` of its own).
//! * Children never inherit them: every command starts from an empty environment plus its
//!   snapshot's variables.
//! * The paths are [`Protected`]: no cell may read them, hold them in its root, or be granted
//!   them as read-only paths ([`protected_paths`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use wuhu_core::cell::{Protected, check_secret_file_mode};

/// Variables no command of a session gets from the runner: its token and everything of AWS
/// (keys, and where the store's credentials come from).
pub fn is_secret_variable(name: &str) -> bool {
    name == "WUHU_RUNNER_TOKEN" || name.starts_with("AWS_") || name == "WUHU_STORE_CREDENTIALS"
}

/// Variables whose values are secrets, wiped from the runner's own environment after start.
/// The other `AWS_*` variables stay: they say where the store's credentials come from
/// (`AWS_PROFILE`, `AWS_CONFIG_FILE`, `AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`, the
/// container endpoint and its `AWS_CONTAINER_AUTHORIZATION_TOKEN`), and the credentials chain
/// reads them again at every refresh of expiring credentials. Static keys never expire, so
/// they are read once, at start, and can go.
pub fn is_scrubbed_variable(name: &str) -> bool {
    matches!(
        name,
        "WUHU_RUNNER_TOKEN"
            | "WUHU_STORE_CREDENTIALS"
            | "AWS_ACCESS_KEY_ID"
            | "AWS_SECRET_ACCESS_KEY"
            | "AWS_SESSION_TOKEN"
    )
}

/// Refuses a file holding `what` that group or others may read (`chmod 600` fixes it).
///
/// # Errors
/// The message the runner stops with.
pub fn check_secret_file(path: &Path, what: &str) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) => {
            check_secret_file_mode(&path.to_string_lossy(), what, meta.permissions().mode())
        }
        Err(_) => Ok(()),
    }
}

/// Whether an AWS shared file holds keys (`aws_secret_access_key`, `aws_session_token`): the
/// credentials file always may, a config file may too (a `credential_process` line alone is no
/// key).
pub fn holds_store_keys(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines().any(|line| {
            let key = line.split('=').next().unwrap_or_default().trim();
            key.eq_ignore_ascii_case("aws_secret_access_key")
                || key.eq_ignore_ascii_case("aws_session_token")
        })
    })
}

/// Wipes the values of the variables [`is_scrubbed_variable`] names from this process's
/// environment: overwritten in place (where `/proc/self/environ` reads them), then removed.
///
/// # Safety
/// Call before any other thread starts: it writes the environment block.
pub unsafe fn scrub_environment() {
    let names: Vec<std::ffi::OsString> = std::env::vars_os()
        .map(|(name, _)| name)
        .filter(|name| name.to_str().is_some_and(is_scrubbed_variable))
        .collect();
    for name in names {
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c_name) = std::ffi::CString::new(name.as_bytes()) {
            // SAFETY: getenv returns the value inside the environment block (or NULL); we
            // overwrite its bytes, never its terminator, while no other thread runs.
            unsafe {
                let value = libc::getenv(c_name.as_ptr());
                if !value.is_null() {
                    let len = libc::strlen(value);
                    std::ptr::write_bytes(value, b'*', len);
                }
                std::env::remove_var(&name);
            }
        }
    }
}

/// The runner's own paths no cell may reach: its config file, key, runtime directory,
/// workspaces root (each session's copy lies in it), the store's credential files, and the
/// credential stores of its user (`~/.ssh`, `~/.aws`, `~/.gnupg`, …).
pub fn protected_paths(
    home: Option<&Path>,
    config_file: Option<&Path>,
    run_dir: &Path,
    workspaces_root: &Path,
    extra: &[PathBuf],
) -> Vec<Protected> {
    let show = |p: &Path| {
        let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        p.to_string_lossy().into_owned()
    };
    let mut out = vec![
        Protected::new(show(run_dir), "the runner's runtime directory"),
        Protected::new(show(workspaces_root), "the workspaces root").holding_roots(),
    ];
    if let Some(config) = config_file {
        out.push(Protected::new(show(config), "the runner's config file"));
    }
    if let Some(home) = home {
        out.push(Protected::new(
            show(&home.join(".wuhu").join("runner.yml")),
            "the runner's config file",
        ));
        out.push(Protected::new(
            show(&home.join(".wuhu").join("runner-key")),
            "the runner's key",
        ));
        for dir in [
            ".ssh",
            ".aws",
            ".gnupg",
            ".kube",
            ".docker",
            ".config/gcloud",
            ".netrc",
        ] {
            out.push(Protected::new(
                show(&home.join(dir)),
                "a credential store of the runner's user",
            ));
        }
    }
    for path in extra {
        out.push(Protected::new(show(path), "the store's credentials"));
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup_by(|a, b| a.path == b.path);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_must_be_private() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("runner.yml");
        std::fs::write(&file, "token: x\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = check_secret_file(&file, "the runner token").unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_secret_file(&file, "the runner token").is_ok());
        assert!(check_secret_file(&dir.path().join("missing"), "x").is_ok());
        assert!(is_secret_variable("WUHU_RUNNER_TOKEN"));
        assert!(is_secret_variable("AWS_SECRET_ACCESS_KEY"));
        assert!(!is_secret_variable("PATH"));
        // What the credentials chain reads again at a refresh stays in the runner's own
        // environment (commands never get it).
        assert!(is_scrubbed_variable("AWS_SECRET_ACCESS_KEY"));
        assert!(!is_scrubbed_variable("AWS_PROFILE"));
        assert!(!is_scrubbed_variable("AWS_WEB_IDENTITY_TOKEN_FILE"));
        assert!(is_secret_variable("AWS_PROFILE"));
    }

    #[test]
    fn protected_paths_name_the_runners_files() {
        let paths = protected_paths(
            Some(Path::new("/home/ana")),
            Some(Path::new("/etc/wuhu/runner.yml")),
            Path::new("/home/ana/.wuhu/run"),
            Path::new("/srv/ws"),
            &[PathBuf::from("/home/ana/.aws/credentials")],
        );
        let names: Vec<&str> = paths.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "/etc/wuhu/runner.yml",
            "/home/ana/.wuhu/runner.yml",
            "/home/ana/.wuhu/runner-key",
            "/home/ana/.wuhu/run",
            "/home/ana/.ssh",
            "/srv/ws",
        ] {
            assert!(names.contains(&want), "{want}: {names:?}");
        }
        assert!(paths.iter().any(|p| p.path == "/srv/ws" && p.holds_roots));
    }
}
