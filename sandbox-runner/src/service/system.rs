//! The effects of `wuhu-runner service`: writing and removing the files of a [`Plan`], running
//! its commands, reading the state back.

use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{FileToWrite, Plan, Target};

/// An account's numeric ids and home directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// The login name.
    pub name: String,
    /// `uid`.
    pub uid: u32,
    /// `gid`.
    pub gid: u32,
    /// The home directory.
    pub home: PathBuf,
}

/// Looks up an account by name (`getpwnam_r`).
///
/// # Errors
///
/// A message when there is no such account.
pub fn account(name: &str) -> Result<Account, String> {
    let c_name = std::ffi::CString::new(name).map_err(|_| format!("no account {name:?}"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: passwd is plain old data; getpwnam_r writes into it and into buf, whose length
    // is passed, and sets result to null or to &passwd.
    let mut passwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwnam_r(
            c_name.as_ptr(),
            &mut passwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return Err(format!("no account {name:?} on this machine"));
    }
    // SAFETY: pw_dir points into buf, NUL-terminated, while buf lives.
    let home = unsafe { std::ffi::CStr::from_ptr(passwd.pw_dir) };
    Ok(Account {
        name: name.to_string(),
        uid: passwd.pw_uid,
        gid: passwd.pw_gid,
        home: PathBuf::from(std::ffi::OsStr::from_bytes(home.to_bytes())),
    })
}

/// The effective user id.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// What applying a plan did, one line each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// `wrote PATH`, `unchanged PATH`, `removed PATH`, `ran COMMAND`.
    pub lines: Vec<String>,
}

/// Writes `file` through a temporary name in its directory (so a reader never sees half of it),
/// created with its mode (never wider, even for a moment), owned by `owner` when given. Returns
/// whether the contents changed.
fn write_file(file: &FileToWrite, owner: Option<(u32, u32)>) -> std::io::Result<bool> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let unchanged = std::fs::read(&file.path).is_ok_and(|old| old == file.contents.as_bytes())
        && std::fs::metadata(&file.path)
            .is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode);
    if let Some(dir) = file.path.parent() {
        std::fs::create_dir_all(dir)?;
        if file.secret {
            // The token's directory is the account's own (~/.wuhu or /etc/wuhu).
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
            }
        }
    }
    if unchanged && owner.is_none() {
        return Ok(false);
    }
    let temp = file.path.with_extension("wuhu-partial");
    let _ = std::fs::remove_file(&temp);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(file.mode)
        .open(&temp)?;
    out.write_all(file.contents.as_bytes())?;
    out.sync_all()?;
    drop(out);
    std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(file.mode))?;
    if let Some((uid, gid)) = owner.filter(|_| file.secret) {
        std::os::unix::fs::chown(&temp, Some(uid), Some(gid))?;
    }
    std::fs::rename(&temp, &file.path)?;
    Ok(!unchanged)
}

/// Runs a command, its output shown to the user only when it fails.
fn run(words: &[String]) -> Result<(), String> {
    let (program, args) = words.split_first().ok_or("empty command")?;
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("`{}`: cannot start {program}: {e}", words.join(" ")))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    Err(format!(
        "`{}` failed ({}): {}",
        words.join(" "),
        output.status,
        format!("{stderr}{stdout}").trim()
    ))
}

/// Writes and removes the plan's files, then runs its commands (best-effort ones first, their
/// failures ignored). Stops at the first failure.
///
/// # Errors
///
/// A message naming the file or command that failed; the lines before it say what was done.
pub fn apply(plan: &Plan, owner: Option<(u32, u32)>) -> Result<Applied, (Applied, String)> {
    let mut applied = Applied::default();
    for file in &plan.write {
        match write_file(file, owner) {
            Ok(true) => applied.lines.push(format!(
                "wrote {}{}",
                file.path.display(),
                if file.secret { " (mode 0600)" } else { "" }
            )),
            Ok(false) => applied
                .lines
                .push(format!("unchanged {}", file.path.display())),
            Err(e) => {
                let message = format!("cannot write {}: {e}", file.path.display());
                return Err((applied, message));
            }
        }
    }
    for words in &plan.best_effort {
        if run(words).is_ok() {
            applied.lines.push(format!("ran {}", words.join(" ")));
        }
    }
    if let Some(probe) = &plan.until_fails {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while run(probe).is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    for path in &plan.remove {
        match remove(path) {
            Ok(true) => applied.lines.push(format!("removed {}", path.display())),
            Ok(false) => {}
            Err(e) => {
                let message = format!("cannot remove {}: {e}", path.display());
                return Err((applied, message));
            }
        }
    }
    for words in &plan.commands {
        if let Err(e) = run(words) {
            return Err((applied, e));
        }
        applied.lines.push(format!("ran {}", words.join(" ")));
    }
    Ok(applied)
}

/// Removes a file, or a directory when it is empty. Returns whether something was removed.
fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => match std::fs::remove_dir(path) {
            Ok(()) => Ok(true),
            // Not empty: the user's own files (runner.yml, workspaces) stay.
            Err(_) => Ok(false),
        },
        Ok(_) => std::fs::remove_file(path).map(|()| true),
    }
}

/// The output of a status command, whatever its exit code.
pub fn status_output(words: &[String]) -> Result<(i32, String), String> {
    let (program, args) = words.split_first().ok_or("empty command")?;
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.code().unwrap_or(-1), text))
}

/// The last `lines` lines of a log file (read from its end: a log grows without bound).
pub fn log_tail(path: &Path, lines: usize) -> std::io::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 64 * 1024;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}

/// Whether systemd runs the machine (`/run/systemd/system` exists, as `sd_booted` checks).
pub fn systemd_booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Which target the current platform and options select.
///
/// # Errors
///
/// A message for `--system` on macOS, a system unit without root, a user unit for root, or a
/// system unit that would run as root without saying so.
pub fn select_target(
    macos: bool,
    system: bool,
    run_as: Option<&str>,
    uid: u32,
) -> Result<Target, String> {
    if macos {
        if system || run_as.is_some() {
            return Err(String::from(
                "--system and --run-as are for Linux: on macOS the runner is a launchd agent of the user who installs it",
            ));
        }
        return Ok(Target::LaunchdAgent);
    }
    if !system {
        if run_as.is_some() {
            return Err(String::from("--run-as needs --system"));
        }
        if uid == 0 {
            // root has no user manager to speak of on a server, and a runner as root would run
            // every session's commands as root.
            return Err(String::from(
                "as root, install a system unit that runs as another account: --system --run-as USER",
            ));
        }
        return Ok(Target::SystemdUser);
    }
    if uid != 0 {
        return Err(String::from(
            "--system writes /etc/systemd/system: run it as root (sudo)",
        ));
    }
    match run_as {
        Some(user) => Ok(Target::SystemdSystem {
            run_as: user.to_string(),
        }),
        None => Err(String::from(
            "--system needs --run-as USER: the account the runner (and every command a session runs) runs as; --run-as root only if you mean it",
        )),
    }
}
