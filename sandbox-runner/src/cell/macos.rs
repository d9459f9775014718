//! A cell on macOS (decision 0023): the command runs under `sandbox-exec -p PROFILE`, the
//! Seatbelt profile [`wuhu_core::cell::seatbelt::profile`] makes of the call's policy, with the
//! open-files, file-size and CPU limits set before it starts (macOS counts processes per user,
//! not per cell, so the process limit is not applied there). The file tools check every path
//! against the same policy, after resolving symbolic links, and open files without following a
//! final symbolic link.

use std::path::Path;

use wuhu_core::cell::{CellPolicy, Protected};

/// Apple's `sandbox-exec`, by its absolute path (never found through `PATH`).
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Whether this Mac can make cells.
///
/// # Errors
/// When `sandbox-exec` is missing.
pub fn probe() -> Result<(), String> {
    if Path::new(SANDBOX_EXEC).exists() {
        Ok(())
    } else {
        Err(format!("{SANDBOX_EXEC} is missing; cells need it"))
    }
}

/// The command for `program args` in the cell of `policy`.
pub fn command(
    policy: &CellPolicy,
    protected: &[Protected],
    proxy_port: Option<u16>,
    program: &Path,
) -> tokio::process::Command {
    let profile = wuhu_core::cell::seatbelt::profile(policy, protected, proxy_port);
    let mut cmd = tokio::process::Command::new(SANDBOX_EXEC);
    cmd.arg("-p").arg(profile).arg("--").arg(program);
    let limits = policy.limits;
    // SAFETY: setrlimit(2) is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            for (resource, value) in [
                (libc::RLIMIT_NOFILE, limits.open_files),
                (libc::RLIMIT_FSIZE, limits.file_size_bytes),
                (libc::RLIMIT_CPU, limits.cpu_seconds),
            ] {
                let mut current = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(resource, &mut current);
                let value = (value as libc::rlim_t).min(current.rlim_max);
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                libc::setrlimit(resource, &limit);
            }
            Ok(())
        });
    }
    cmd
}
