//! Snapshots of the working context (seed 004): capture at attach, validate on resume.

use std::collections::BTreeMap;
use std::path::Path;

use wuhu_core::snapshot_vars::may_capture;
use wuhu_core::wire::runner::{Snapshot, StaleItem, StaleKind};

pub use wuhu_core::snapshot_vars::{SNAPSHOT_WHITELIST, is_secret_name, looks_like_credential};

/// Captures a snapshot: `cwd`, and from `vars` (the runner's own environment) the whitelisted
/// names plus `extra`, minus secret-looking names and credential-looking values
/// ([`wuhu_core::snapshot_vars::may_capture`]; `extra` cannot lift that).
pub fn capture_snapshot<I>(cwd: &Path, vars: I, extra: &[String], captured_at: i64) -> Snapshot
where
    I: IntoIterator<Item = (String, String)>,
{
    let env: BTreeMap<String, String> = vars
        .into_iter()
        .filter(|(name, value)| may_capture(name, value, extra))
        .collect();
    Snapshot {
        cwd: cwd.to_string_lossy().into_owned(),
        env,
        captured_at,
    }
}

/// What in a snapshot no longer holds: the cwd, `VIRTUAL_ENV`, and each `PATH` entry must still
/// be existing directories. Empty when everything is fine.
pub fn validate_snapshot(snapshot: &Snapshot) -> Vec<StaleItem> {
    let mut stale = Vec::new();
    if !Path::new(&snapshot.cwd).is_dir() {
        stale.push(StaleItem {
            kind: StaleKind::Cwd,
            path: snapshot.cwd.clone(),
        });
    }
    if let Some(venv) = snapshot.env.get("VIRTUAL_ENV")
        && !venv.is_empty()
        && !Path::new(venv).is_dir()
    {
        stale.push(StaleItem {
            kind: StaleKind::VirtualEnv,
            path: venv.clone(),
        });
    }
    if let Some(path) = snapshot.env.get("PATH") {
        let mut seen = std::collections::BTreeSet::new();
        for entry in path.split(':') {
            if entry.is_empty() || !seen.insert(entry) {
                continue;
            }
            if !Path::new(entry).exists() {
                stale.push(StaleItem {
                    kind: StaleKind::PathEntry,
                    path: entry.to_string(),
                });
            }
        }
    }
    stale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn captures_whitelist_and_extras_never_secrets() {
        let snapshot = capture_snapshot(
            Path::new("/w"),
            vars(&[
                ("PATH", "/usr/bin"),
                ("HOME", "/home/ana"),
                ("RANDOM_THING", "x"),
                ("JAVA_HOME", "/jdk"),
                ("AWS_SECRET_ACCESS_KEY", "s"),
                ("GITHUB_TOKEN", "t"),
                ("my_api_key", "k"),
                ("DB_PASSWORD", "p"),
                ("OPENAI_API_KEY", "k"),
                ("DATABASE_URL", "postgres://u:p@h/db"),
                (
                    "BUILD_ID",
                    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbmEifQ.c2lnbmF0dXJl",
                ),
                ("EDITOR", "Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q"),
            ]),
            &[
                String::from("JAVA_HOME"),
                String::from("GITHUB_TOKEN"),
                String::from("my_api_key"),
                String::from("DATABASE_URL"),
                String::from("BUILD_ID"),
            ],
            7,
        );
        assert_eq!(snapshot.cwd, "/w");
        assert_eq!(snapshot.captured_at, 7);
        let names: Vec<&str> = snapshot.env.keys().map(String::as_str).collect();
        assert_eq!(names, ["HOME", "JAVA_HOME", "PATH"]);
    }

    #[test]
    fn validation_reports_stale_items_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let ok = Snapshot {
            cwd: dir.path().to_string_lossy().into_owned(),
            env: BTreeMap::from([
                (String::from("PATH"), format!("{}::/usr/bin", bin.display())),
                (
                    String::from("VIRTUAL_ENV"),
                    bin.to_string_lossy().into_owned(),
                ),
            ]),
            captured_at: 0,
        };
        assert_eq!(validate_snapshot(&ok), vec![]);
        let gone = dir.path().join("gone");
        let stale = Snapshot {
            cwd: gone.to_string_lossy().into_owned(),
            env: BTreeMap::from([
                (
                    String::from("PATH"),
                    format!("/usr/bin:{}/bin:{}/bin", gone.display(), gone.display()),
                ),
                (
                    String::from("VIRTUAL_ENV"),
                    format!("{}/.venv", gone.display()),
                ),
            ]),
            captured_at: 0,
        };
        let kinds: Vec<(StaleKind, String)> = validate_snapshot(&stale)
            .into_iter()
            .map(|s| (s.kind, s.path))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (StaleKind::Cwd, gone.to_string_lossy().into_owned()),
                (StaleKind::VirtualEnv, format!("{}/.venv", gone.display())),
                (StaleKind::PathEntry, format!("{}/bin", gone.display())),
            ]
        );
    }
}
