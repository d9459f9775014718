//! Small helpers: time, randomness, temp dirs, polling with deadlines.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often [`wait_until`] polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Unix seconds now.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `n` random bytes as lowercase hex, from `/dev/urandom` (with a time-based fallback).
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    let from_os = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !from_os {
        let mut rng = wuhu_core::SplitMix64::new(unique_seed());
        for chunk in bytes.chunks_mut(8) {
            let word = rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A short unique name with a prefix, e.g. a tenant per test: `steer-3f9a1c`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", random_hex(4))
}

fn unique_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32) ^ COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Creates a fresh temp directory under `$WUHU_E2E_TMPDIR` or the system temp dir.
pub fn make_temp_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("WUHU_E2E_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let name = format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        random_hex(3)
    );
    let dir = base.join(name);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|err| panic!("create temp dir {}: {err}", dir.display()));
    dir
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Some`, or `timeout` passes.
///
/// # Errors
/// [`TimedOut`] when the deadline passed.
pub fn wait_until<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Result<T, TimedOut> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(TimedOut(timeout));
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// [`wait_until`] that panics with `what` on timeout.
#[track_caller]
pub fn wait_for<T>(what: &str, timeout: Duration, probe: impl FnMut() -> Option<T>) -> T {
    match wait_until(timeout, probe) {
        Ok(value) => value,
        Err(TimedOut(t)) => panic!("timed out after {t:?} waiting for {what}"),
    }
}

/// A poll that never succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut(pub Duration);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "timed out after {:?}", self.0)
    }
}

impl std::error::Error for TimedOut {}

/// RFC 3339 UTC timestamp (`2026-11-22T03:47:00Z`) without a date crate.
pub fn rfc3339_utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let t = wuhu_core::civil_time::CivilTime::from_unix(secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// The PID on this machine of the process a command in a cell knows as `pid_in_cell` (`$$`,
/// `$!`; cells have PID namespaces of their own, decision 0023), found as the process whose
/// innermost namespace PID (`NSpid` in `/proc/<pid>/status`) it is and whose working
/// directory lies below `cwd_under` (the test's own directory tells its cells apart). A
/// process outside any cell (`--sandbox off`) is found the same way. `None` when there is no
/// such process (it ended).
pub fn host_pid(pid_in_cell: i32, cwd_under: &std::path::Path) -> Option<i32> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let innermost = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last())
            .and_then(|id| id.parse::<i32>().ok());
        if innermost != Some(pid_in_cell) {
            continue;
        }
        let under = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .is_ok_and(|cwd| cwd.starts_with(cwd_under));
        if under {
            return Some(pid);
        }
    }
    None
}

/// Files under `dir` that contain any of `needles` (byte strings): what a test asserts no
/// stored state holds (a credential, a secret's value).
pub fn files_containing(dir: &std::path::Path, needles: &[&[u8]]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && needles
                    .iter()
                    .any(|n| bytes.windows(n.len()).any(|w| w == *n))
            {
                found.push(path);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_format() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(1_795_319_999)),
            "2026-11-22T03:59:59Z"
        );
    }

    #[test]
    fn wait_until_polls_and_times_out() {
        let mut n = 0;
        assert_eq!(
            wait_until(Duration::from_secs(5), || {
                n += 1;
                (n == 3).then_some(n)
            }),
            Ok(3)
        );
        assert!(wait_until(Duration::from_millis(120), || None::<()>).is_err());
    }

    #[test]
    fn random_names_differ() {
        assert_ne!(random_hex(16), random_hex(16));
        assert_eq!(random_hex(16).len(), 32);
    }
}
