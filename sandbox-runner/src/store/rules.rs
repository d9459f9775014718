//! The sync rules of cloud workspaces, without I/O: where a workspace lives in the bucket, what
//! is saved, what a save uploads, what the lease allows, and where credentials come from.
//! [`super::sync`] performs the effects these rules decide.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Directory names never saved (at any depth) unless the definition asks for them: they are
/// rebuilt by the startup script (`npm ci`, `cargo build`, `uv sync`). `.git` is saved.
pub const DEFAULT_SKIPPED_DIRS: [&str; 3] = ["node_modules", "target", ".venv"];

/// Files larger than this are uploaded in parts of [`PART_BYTES`].
pub const MULTIPART_THRESHOLD_BYTES: u64 = 8 * 1024 * 1024;

/// The size of one part of a multipart upload (S3's minimum is 5 MiB).
pub const PART_BYTES: u64 = 8 * 1024 * 1024;

/// The manifest format this runner writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

/// `s3://BUCKET/PREFIX` parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreLocation {
    /// The bucket.
    pub bucket: String,
    /// Key prefix without leading or trailing `/`; may be empty.
    pub prefix: String,
}

/// Parses `--store s3://BUCKET/PREFIX` (the prefix is optional).
///
/// # Errors
///
/// A message when the scheme is not `s3://`, the bucket is empty or not a valid bucket name, or
/// the prefix has an empty, `.` or `..` segment.
pub fn parse_store_url(text: &str) -> Result<StoreLocation, String> {
    let rest = text
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{text:?} is not s3://BUCKET/PREFIX"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !bucket.starts_with(['-', '.'])
        && !bucket.ends_with(['-', '.']);
    if !bucket_ok {
        return Err(format!(
            "{text:?}: the bucket must be 3-63 characters of a-z, 0-9, '-' and '.'"
        ));
    }
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty()
        && prefix
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "{text:?}: the prefix has an empty, '.' or '..' segment"
        ));
    }
    Ok(StoreLocation {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    })
}

/// The keys of one session's workspace (one environment of one session):
///
/// ```text
/// <prefix>/workspaces/<session id>/<environment name>/manifest.json   what the workspace holds
/// <prefix>/workspaces/<session id>/<environment name>/lease.json      which runner may save it
/// <prefix>/workspaces/<session id>/<environment name>/objects/<sha256> file contents, by hash
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceKeys {
    base: String,
}

impl WorkspaceKeys {
    /// The keys for `session_id`'s environment `environment`.
    ///
    /// # Errors
    ///
    /// A message when either is empty or has a character outside `[A-Za-z0-9_.-]` (or is `.`
    /// or `..`): they become key segments.
    pub fn new(
        location: &StoreLocation,
        session_id: &str,
        environment: &str,
    ) -> Result<WorkspaceKeys, String> {
        for (what, segment) in [
            ("session id", session_id),
            ("environment name", environment),
        ] {
            let ok = !segment.is_empty()
                && segment.len() <= 128
                && segment != "."
                && segment != ".."
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !ok {
                return Err(format!("{what} {segment:?} cannot name a stored workspace"));
            }
        }
        let base = if location.prefix.is_empty() {
            format!("workspaces/{session_id}/{environment}")
        } else {
            format!("{}/workspaces/{session_id}/{environment}", location.prefix)
        };
        Ok(WorkspaceKeys { base })
    }

    /// `…/manifest.json`.
    pub fn manifest(&self) -> String {
        format!("{}/manifest.json", self.base)
    }

    /// `…/lease.json`.
    pub fn lease(&self) -> String {
        format!("{}/lease.json", self.base)
    }

    /// `…/objects/<sha256>`.
    pub fn object(&self, sha256: &str) -> String {
        format!("{}/objects/{sha256}", self.base)
    }

    /// `<session id>/<environment>`, for log lines.
    pub fn label(&self) -> &str {
        let mut parts = self.base.rsplitn(3, '/');
        let _env = parts.next();
        let _session = parts.next();
        match parts.next() {
            Some(rest) => &self.base[rest.len() + 1..],
            None => &self.base,
        }
    }
}

/// The key prefix of every stored workspace of a deleted session:
/// `<prefix>/workspaces/<session id>/` (with the slash, so it never reaches another session's).
///
/// # Errors
///
/// A message when `session_id` is not a session id (a UUID,
/// [`wuhu_core::deletion::is_session_id`]): a discard never names anything wider.
pub fn session_prefix(location: &StoreLocation, session_id: &str) -> Result<String, String> {
    if !wuhu_core::deletion::is_session_id(session_id) {
        return Err(format!(
            "{session_id:?} is not a session id; nothing is discarded"
        ));
    }
    Ok(if location.prefix.is_empty() {
        format!("workspaces/{session_id}/")
    } else {
        format!("{}/workspaces/{session_id}/", location.prefix)
    })
}

/// Whether the directory `name` (directly under the workspaces root) is one of the session's
/// local copies: `<session id>` or `<session id>-N` (N from 1 to 999, as the attach names them
/// when the first is taken). Only for a session id ([`wuhu_core::deletion::is_session_id`]):
/// UUIDs have one length, so no session's copy is named like another's.
pub fn is_session_copy(name: &str, session_id: &str) -> bool {
    if !wuhu_core::deletion::is_session_id(session_id) {
        return false;
    }
    let Some(rest) = name.strip_prefix(session_id) else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    rest.strip_prefix('-').is_some_and(|n| {
        (1..=3).contains(&n.len()) && !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// What is saved: everything but directories named in the skip list (at any depth).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkipRules {
    skipped: BTreeSet<String>,
}

impl SkipRules {
    /// [`DEFAULT_SKIPPED_DIRS`] minus the names the definition asks to save.
    pub fn new(save_also: &[String]) -> SkipRules {
        SkipRules {
            skipped: DEFAULT_SKIPPED_DIRS
                .iter()
                .filter(|d| !save_also.iter().any(|s| s == *d))
                .map(|d| d.to_string())
                .collect(),
        }
    }

    /// Whether a directory with this name is left out (with everything below it).
    pub fn skips_dir(&self, name: &str) -> bool {
        self.skipped.contains(name)
    }

    /// The skipped names, sorted, for the save report.
    pub fn skipped(&self) -> Vec<String> {
        self.skipped.iter().cloned().collect()
    }
}

/// What a stored workspace holds: every saved path (`/`-separated, relative to the root).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// Path → entry.
    pub files: BTreeMap<String, ManifestEntry>,
    /// Directory names that were not saved (the skip rules of the save).
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The runner that wrote it.
    #[serde(default)]
    pub saved_by: String,
    /// Unix milliseconds of the save.
    #[serde(default)]
    pub saved_at_ms: i64,
}

/// One saved path.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum ManifestEntry {
    /// A regular file, its content at `objects/<sha256>`.
    File {
        /// Hex SHA-256 of the content.
        sha256: String,
        /// Bytes.
        size: u64,
        /// Whether the owner may execute it.
        #[serde(default)]
        executable: bool,
    },
    /// A symbolic link, recreated as one.
    Symlink {
        /// The link's target, as read.
        target: String,
    },
    /// An empty directory (directories with saved content are implied).
    Dir,
}

impl Manifest {
    /// An empty manifest of the current version.
    pub fn empty() -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            ..Manifest::default()
        }
    }

    /// Whether both hold the same paths with the same contents (who saved it and when aside).
    pub fn same_content(&self, other: &Manifest) -> bool {
        self.files == other.files
    }
}

/// Checks a manifest read from storage before hydrating from it: every path must stay inside
/// the root, and no path may lie below a symlink of the manifest (hydrating would write through
/// the link).
///
/// # Errors
///
/// A message naming the first bad path, or an unknown version.
pub fn check_manifest(manifest: &Manifest) -> Result<(), String> {
    if manifest.version != MANIFEST_VERSION {
        return Err(format!(
            "manifest version {} is not {MANIFEST_VERSION}",
            manifest.version
        ));
    }
    for (path, entry) in &manifest.files {
        if !is_safe_relative_path(path) {
            return Err(format!(
                "manifest path {path:?} is not a plain relative path"
            ));
        }
        if let ManifestEntry::File { sha256, .. } = entry
            && !(sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(format!("manifest path {path:?} has a bad sha256"));
        }
        let mut parent = path.as_str();
        while let Some((up, _)) = parent.rsplit_once('/') {
            if matches!(
                manifest.files.get(up),
                Some(ManifestEntry::Symlink { .. } | ManifestEntry::File { .. })
            ) {
                return Err(format!(
                    "manifest path {path:?} lies below {up:?}, which is not a directory"
                ));
            }
            parent = up;
        }
    }
    Ok(())
}

/// A `/`-separated relative path without empty, `.` or `..` segments, backslashes or NUL.
pub fn is_safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains(['\\', '\0'])
        && path
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != "..")
}

/// What a save does, decided from the last saved manifest and the one just scanned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavePlan {
    /// Contents to upload: `(sha256, a path holding it, size)`, one per new hash, by path.
    pub uploads: Vec<(String, String, u64)>,
    /// Paths added or changed.
    pub changed: usize,
    /// Paths gone since the last save.
    pub removed: usize,
    /// Paths as they were.
    pub unchanged: usize,
}

impl SavePlan {
    /// Whether the manifest needs no new version.
    pub fn is_noop(&self) -> bool {
        self.changed == 0 && self.removed == 0
    }
}

/// Plans a save: a content is uploaded only when no path of the last saved manifest had it
/// (objects are content-addressed, so a renamed or copied file uploads nothing).
pub fn plan_save(base: &Manifest, local: &Manifest) -> SavePlan {
    let stored = referenced_objects(base);
    let mut planned = BTreeSet::new();
    let mut uploads = Vec::new();
    let (mut changed, mut unchanged) = (0, 0);
    for (path, entry) in &local.files {
        if base.files.get(path) == Some(entry) {
            unchanged += 1;
        } else {
            changed += 1;
        }
        if let ManifestEntry::File { sha256, size, .. } = entry
            && !stored.contains(sha256.as_str())
            && planned.insert(sha256.clone())
        {
            uploads.push((sha256.clone(), path.clone(), *size));
        }
    }
    let removed = base
        .files
        .keys()
        .filter(|p| !local.files.contains_key(*p))
        .count();
    SavePlan {
        uploads,
        changed,
        removed,
        unchanged,
    }
}

/// How many object hashes a workspace keeps for a later delete when deleting them failed
/// (the rest are left in the bucket, said in the log).
pub const MAX_PENDING_DELETES: usize = 10_000;

/// The hashes of the manifest's files.
pub fn referenced_objects(manifest: &Manifest) -> BTreeSet<&str> {
    manifest
        .files
        .values()
        .filter_map(|e| match e {
            ManifestEntry::File { sha256, .. } => Some(sha256.as_str()),
            _ => None,
        })
        .collect()
}

/// The objects to delete once `written` is the stored manifest (never before: until its write
/// succeeds, `previous` is what a hydrate reads): every object `previous` referenced, and every
/// one an earlier delete failed on (`pending`), that `written` does not reference. Sorted,
/// without duplicates.
pub fn unreferenced_objects(
    previous: &Manifest,
    written: &Manifest,
    pending: &[String],
) -> Vec<String> {
    let keep = referenced_objects(written);
    let mut delete: BTreeSet<&str> = referenced_objects(previous);
    delete.extend(pending.iter().map(String::as_str));
    delete
        .into_iter()
        .filter(|sha| !keep.contains(sha))
        .map(str::to_string)
        .collect()
}

/// The lease object: which attach of which runner may save the workspace. Written on attach
/// (taking the workspace over from any earlier holder), deleted on a clean detach.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Unique per attach: `<runner name>/<random>`.
    pub holder: String,
    /// The runner's name, for messages.
    pub runner: String,
    /// Unix milliseconds of the attach.
    pub acquired_at_ms: i64,
}

/// Why a save was refused: another runner has (or had) the workspace. The loser keeps its
/// local copy and stops saving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Another attach took the lease.
    TakenOver {
        /// The runner that holds it now.
        runner: String,
        /// When it took it (unix ms).
        at_ms: i64,
    },
    /// The lease is gone: the workspace was detached elsewhere after this runner loaded it.
    Released,
    /// The manifest changed since this runner loaded it (its `If-Match` failed).
    ManifestChanged,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::TakenOver { runner, at_ms } => write!(
                f,
                "runner {runner:?} took the workspace over (its lease dates from unix ms {at_ms})"
            ),
            Lost::Released => write!(
                f,
                "the workspace was released by another runner since this one loaded it"
            ),
            Lost::ManifestChanged => write!(
                f,
                "another runner saved the workspace since this one loaded it"
            ),
        }
    }
}

/// May the attach `holder` save? Only while the stored lease is its own.
///
/// # Errors
///
/// [`Lost::TakenOver`] when another attach holds it, [`Lost::Released`] when there is none.
pub fn check_lease(current: Option<&Lease>, holder: &str) -> Result<(), Lost> {
    match current {
        Some(lease) if lease.holder == holder => Ok(()),
        Some(lease) => Err(Lost::TakenOver {
            runner: lease.runner.clone(),
            at_ms: lease.acquired_at_ms,
        }),
        None => Err(Lost::Released),
    }
}

/// What an attach does about the lease it finds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachLease {
    /// No lease: create one with `If-None-Match: *`.
    Create,
    /// Another attach holds it: replace it (`If-Match` its ETag). The session decided where its
    /// environment runs; the earlier holder's next save is refused ([`Lost::TakenOver`]).
    TakeOver {
        /// The earlier holder's runner.
        from_runner: String,
    },
}

/// Decides an attach's lease step from the lease found (its ETag is the caller's business).
pub fn attach_lease(current: Option<&Lease>) -> AttachLease {
    match current {
        None => AttachLease::Create,
        Some(lease) => AttachLease::TakeOver {
            from_runner: lease.runner.clone(),
        },
    }
}

/// Expiring credentials (from STS, SSO, IMDS, a container endpoint or a `credential_process`)
/// are fetched again this long before they expire.
pub const REFRESH_BEFORE_EXPIRY_SECONDS: i64 = 300;
/// ... but at most once per this many seconds while they are still valid (credentials that are
/// issued already inside the refresh window would otherwise run the process for every request).
pub const MIN_REFRESH_INTERVAL_SECONDS: i64 = 60;

/// Whether credentials fetched at `fetched_at` and expiring at `expires_at` (unix
/// seconds) must be fetched again at `now`: always once expired; within
/// [`REFRESH_BEFORE_EXPIRY_SECONDS`] of expiry when the last fetch is at least
/// [`MIN_REFRESH_INTERVAL_SECONDS`] old; never when they do not expire.
pub fn needs_refresh(expires_at: Option<i64>, fetched_at: i64, now: i64) -> bool {
    match expires_at {
        None => false,
        Some(at) if now >= at => true,
        Some(at) => {
            now >= at - REFRESH_BEFORE_EXPIRY_SECONDS
                && now - fetched_at >= MIN_REFRESH_INTERVAL_SECONDS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha: char, size: u64) -> ManifestEntry {
        ManifestEntry::File {
            sha256: sha.to_string().repeat(64),
            size,
            executable: false,
        }
    }

    fn manifest(entries: &[(&str, ManifestEntry)]) -> Manifest {
        Manifest {
            files: entries
                .iter()
                .map(|(p, e)| (p.to_string(), e.clone()))
                .collect(),
            ..Manifest::empty()
        }
    }

    #[test]
    fn store_urls() {
        type Case<'a> = (&'a str, Result<(&'a str, &'a str), &'a str>);
        let cases: &[Case] = &[
            ("s3://bucket", Ok(("bucket", ""))),
            ("s3://bucket/", Ok(("bucket", ""))),
            ("s3://my-bucket/wuhu/prod/", Ok(("my-bucket", "wuhu/prod"))),
            ("s3://b.c.d/p", Ok(("b.c.d", "p"))),
            ("https://bucket/p", Err("is not s3://")),
            ("s3://", Err("the bucket must be")),
            ("s3://Bucket/p", Err("the bucket must be")),
            ("s3://-bucket", Err("the bucket must be")),
            ("s3://bucket/a//b", Err("empty, '.' or '..'")),
            ("s3://bucket/a/../b", Err("empty, '.' or '..'")),
        ];
        for (text, want) in cases {
            let got = parse_store_url(text);
            match (want, &got) {
                (Ok((bucket, prefix)), Ok(location)) => {
                    assert_eq!(
                        (location.bucket.as_str(), location.prefix.as_str()),
                        (*bucket, *prefix),
                        "{text}"
                    );
                }
                (Err(fragment), Err(message)) => {
                    assert!(message.contains(fragment), "{text}: {message}");
                }
                _ => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn workspace_keys() {
        let at = |prefix: &str| StoreLocation {
            bucket: String::from("b"),
            prefix: prefix.to_string(),
        };
        let keys = WorkspaceKeys::new(&at("wuhu/prod"), "0f3c-5d1e", "web").unwrap();
        assert_eq!(
            keys.manifest(),
            "wuhu/prod/workspaces/0f3c-5d1e/web/manifest.json"
        );
        assert_eq!(
            keys.lease(),
            "wuhu/prod/workspaces/0f3c-5d1e/web/lease.json"
        );
        assert_eq!(
            keys.object("ab12"),
            "wuhu/prod/workspaces/0f3c-5d1e/web/objects/ab12"
        );
        assert_eq!(keys.label(), "0f3c-5d1e/web");
        let bare = WorkspaceKeys::new(&at(""), "s", "e").unwrap();
        assert_eq!(bare.manifest(), "workspaces/s/e/manifest.json");
        assert_eq!(bare.label(), "s/e");
        for (session, env) in [
            ("", "e"),
            ("s", ""),
            ("a/b", "e"),
            ("s", ".."),
            ("s", "a b"),
        ] {
            assert!(
                WorkspaceKeys::new(&at("p"), session, env).is_err(),
                "{session:?} {env:?}"
            );
        }
    }

    #[test]
    fn a_discard_reaches_only_its_sessions_keys_and_copies() {
        let at = |prefix: &str| StoreLocation {
            bucket: String::from("b"),
            prefix: prefix.to_string(),
        };
        let s1 = "11111111-2222-3333-4444-555555555555";
        let s2 = "11111111-2222-3333-4444-555555555556";
        assert_eq!(
            session_prefix(&at("wuhu/prod"), s1).unwrap(),
            format!("wuhu/prod/workspaces/{s1}/")
        );
        assert_eq!(
            session_prefix(&at(""), s1).unwrap(),
            format!("workspaces/{s1}/")
        );
        // Every key of every environment of the session is under it; none of another's.
        let prefix = session_prefix(&at("p"), s1).unwrap();
        for env in ["web", "api"] {
            let keys = WorkspaceKeys::new(&at("p"), s1, env).unwrap();
            for key in [keys.manifest(), keys.lease(), keys.object("ab")] {
                assert!(key.starts_with(&prefix), "{key}");
            }
            let other = WorkspaceKeys::new(&at("p"), s2, env).unwrap();
            assert!(!other.manifest().starts_with(&prefix));
        }
        // Nothing wider than one session is ever named.
        for bad in [
            "",
            "s",
            "..",
            "*",
            "11111111-2222-3333-4444-55555555555",
            "a/b",
        ] {
            assert!(session_prefix(&at("p"), bad).is_err(), "{bad:?}");
        }
        // (directory name, one of s1's copies?)
        let cases = [
            (s1.to_string(), true),
            (format!("{s1}-1"), true),
            (format!("{s1}-999"), true),
            (format!("{s1}-1000"), false),
            (format!("{s1}-01"), false),
            (format!("{s1}-"), false),
            (format!("{s1}-x"), false),
            (format!("{s1}x"), false),
            (s2.to_string(), false),
            (format!("{s2}-1"), false),
            (String::from(".wuhu-store"), false),
        ];
        for (name, want) in cases {
            assert_eq!(is_session_copy(&name, s1), want, "{name}");
        }
        assert!(!is_session_copy("", ""));
        assert!(!is_session_copy("x-1", "x"));
    }

    #[test]
    fn skip_rules() {
        // (save_also, directory name, skipped?)
        let cases: &[(&[&str], &str, bool)] = &[
            (&[], "node_modules", true),
            (&[], "target", true),
            (&[], ".venv", true),
            (&[], ".git", false),
            (&[], "src", false),
            (&[], "venv", false),
            (&["node_modules"], "node_modules", false),
            (&["node_modules"], "target", true),
            (&[".git"], ".git", false),
        ];
        for (save_also, name, skipped) in cases {
            let also: Vec<String> = save_also.iter().map(|s| s.to_string()).collect();
            assert_eq!(
                SkipRules::new(&also).skips_dir(name),
                *skipped,
                "{save_also:?} {name}"
            );
        }
        assert_eq!(
            SkipRules::new(&[]).skipped(),
            vec![".venv", "node_modules", "target"]
        );
    }

    #[test]
    fn save_plans_upload_only_new_contents() {
        let base = manifest(&[
            ("a", file('a', 1)),
            ("b", file('b', 2)),
            ("gone", file('g', 3)),
        ]);
        // (local manifest, uploads by path, changed, removed, unchanged)
        type Case<'a> = (
            Vec<(&'a str, ManifestEntry)>,
            Vec<&'a str>,
            usize,
            usize,
            usize,
        );
        let cases: Vec<Case> = vec![
            // Nothing changed but a deletion.
            (
                vec![("a", file('a', 1)), ("b", file('b', 2))],
                vec![],
                0,
                1,
                2,
            ),
            // One file changed: one upload.
            (
                vec![
                    ("a", file('c', 5)),
                    ("b", file('b', 2)),
                    ("gone", file('g', 3)),
                ],
                vec!["a"],
                1,
                0,
                2,
            ),
            // A rename or copy of stored content uploads nothing.
            (
                vec![
                    ("a", file('a', 1)),
                    ("b2", file('b', 2)),
                    ("gone", file('g', 3)),
                ],
                vec![],
                1,
                1,
                2,
            ),
            // Two new paths with one new content: one upload (the first path).
            (
                vec![
                    ("a", file('a', 1)),
                    ("x", file('x', 9)),
                    ("y", file('x', 9)),
                ],
                vec!["x"],
                2,
                2,
                1,
            ),
            // A mode change is a change without an upload.
            (
                vec![
                    (
                        "a",
                        ManifestEntry::File {
                            sha256: "a".repeat(64),
                            size: 1,
                            executable: true,
                        },
                    ),
                    ("b", file('b', 2)),
                    ("gone", file('g', 3)),
                ],
                vec![],
                1,
                0,
                2,
            ),
            // Links and empty directories are changes, never uploads.
            (
                vec![
                    ("a", file('a', 1)),
                    ("b", file('b', 2)),
                    ("gone", file('g', 3)),
                    (
                        "l",
                        ManifestEntry::Symlink {
                            target: String::from("a"),
                        },
                    ),
                    ("d", ManifestEntry::Dir),
                ],
                vec![],
                2,
                0,
                3,
            ),
        ];
        for (i, (local, uploads, changed, removed, unchanged)) in cases.into_iter().enumerate() {
            let plan = plan_save(&base, &manifest(&local));
            let paths: Vec<&str> = plan.uploads.iter().map(|(_, p, _)| p.as_str()).collect();
            assert_eq!(paths, uploads, "case {i}");
            assert_eq!(
                (plan.changed, plan.removed, plan.unchanged),
                (changed, removed, unchanged),
                "case {i}"
            );
        }
        assert!(plan_save(&base, &base).is_noop());
        let first = plan_save(&Manifest::empty(), &base);
        assert_eq!(first.uploads.len(), 3);
    }

    #[test]
    fn a_save_deletes_only_objects_no_longer_referenced() {
        let sha = |c: char| c.to_string().repeat(64);
        let previous = manifest(&[
            ("a", file('a', 1)),
            ("b", file('b', 2)),
            ("c", file('c', 3)),
            ("dup1", file('d', 4)),
            ("dup2", file('d', 4)),
        ]);
        // (written manifest, pending from an earlier failed delete, hashes to delete)
        type Case<'a> = (Vec<(&'a str, ManifestEntry)>, Vec<char>, Vec<char>);
        let cases: Vec<Case> = vec![
            // Nothing changed: nothing to delete.
            (
                vec![
                    ("a", file('a', 1)),
                    ("b", file('b', 2)),
                    ("c", file('c', 3)),
                    ("dup1", file('d', 4)),
                    ("dup2", file('d', 4)),
                ],
                vec![],
                vec![],
            ),
            // `a` changed: its old content goes; `b` renamed: its content stays; one of two
            // paths sharing `d` removed: `d` stays.
            (
                vec![
                    ("a", file('x', 1)),
                    ("b-renamed", file('b', 2)),
                    ("c", file('c', 3)),
                    ("dup2", file('d', 4)),
                ],
                vec![],
                vec!['a'],
            ),
            // A content moved to a new path while its old path now holds another: kept.
            (
                vec![("a", file('b', 2)), ("b", file('a', 1))],
                vec![],
                vec!['c', 'd'],
            ),
            // Everything removed, links and directories left.
            (
                vec![
                    ("l", ManifestEntry::Symlink { target: sha('a') }),
                    ("d", ManifestEntry::Dir),
                ],
                vec![],
                vec!['a', 'b', 'c', 'd'],
            ),
            // Pending deletes are retried, unless the new manifest references them again.
            (
                vec![
                    ("a", file('a', 1)),
                    ("b", file('b', 2)),
                    ("c", file('c', 3)),
                    ("dup1", file('d', 4)),
                    ("p2", file('q', 4)),
                ],
                vec!['p', 'q', 'p'],
                vec!['p'],
            ),
        ];
        for (i, (written, pending, want)) in cases.into_iter().enumerate() {
            let pending: Vec<String> = pending.into_iter().map(sha).collect();
            let want: Vec<String> = want.into_iter().map(sha).collect();
            let written = manifest(&written);
            let got = unreferenced_objects(&previous, &written, &pending);
            assert_eq!(got, want, "case {i}");
            // The invariant: nothing the written manifest references is ever deleted.
            let keep = referenced_objects(&written);
            assert!(got.iter().all(|h| !keep.contains(h.as_str())), "case {i}");
        }
        assert!(unreferenced_objects(&Manifest::empty(), &previous, &[]).is_empty());
    }

    #[test]
    fn manifests_that_would_escape_the_root_are_refused() {
        let link = |t: &str| ManifestEntry::Symlink {
            target: t.to_string(),
        };
        type Case<'a> = (Vec<(&'a str, ManifestEntry)>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (vec![("a/b", file('a', 1)), ("l", link("/etc"))], None),
            (
                vec![("../x", file('a', 1))],
                Some("not a plain relative path"),
            ),
            (
                vec![("/etc/passwd", file('a', 1))],
                Some("not a plain relative path"),
            ),
            (
                vec![("a//b", file('a', 1))],
                Some("not a plain relative path"),
            ),
            (
                vec![("a/./b", file('a', 1))],
                Some("not a plain relative path"),
            ),
            (
                vec![("l", link("/etc")), ("l/passwd", file('a', 1))],
                Some("lies below \"l\""),
            ),
            (
                vec![("f", file('a', 1)), ("f/x/y", file('b', 1))],
                Some("lies below \"f\""),
            ),
            (
                vec![(
                    "bad",
                    ManifestEntry::File {
                        sha256: String::from("../../x"),
                        size: 1,
                        executable: false,
                    },
                )],
                Some("bad sha256"),
            ),
        ];
        for (entries, want) in cases {
            let got = check_manifest(&manifest(&entries));
            match (want, &got) {
                (None, Ok(())) => {}
                (Some(fragment), Err(message)) if message.contains(fragment) => {}
                _ => panic!("{entries:?}: got {got:?}, want {want:?}"),
            }
        }
        let future = Manifest {
            version: 2,
            ..Manifest::empty()
        };
        assert!(check_manifest(&future).is_err());
    }

    #[test]
    fn leases() {
        let lease = |holder: &str| Lease {
            holder: holder.to_string(),
            runner: holder.split('/').next().unwrap_or_default().to_string(),
            acquired_at_ms: 7,
        };
        // (stored lease, saving holder, verdict)
        let cases: Vec<(Option<Lease>, &str, Result<(), Lost>)> = vec![
            (Some(lease("a/1")), "a/1", Ok(())),
            (
                Some(lease("b/2")),
                "a/1",
                Err(Lost::TakenOver {
                    runner: String::from("b"),
                    at_ms: 7,
                }),
            ),
            // The same runner, another attach (it re-attached after a restart): not the same.
            (
                Some(lease("a/3")),
                "a/1",
                Err(Lost::TakenOver {
                    runner: String::from("a"),
                    at_ms: 7,
                }),
            ),
            (None, "a/1", Err(Lost::Released)),
        ];
        for (stored, holder, want) in cases {
            assert_eq!(
                check_lease(stored.as_ref(), holder),
                want,
                "{stored:?} {holder}"
            );
        }
        assert_eq!(attach_lease(None), AttachLease::Create);
        assert_eq!(
            attach_lease(Some(&lease("b/2"))),
            AttachLease::TakeOver {
                from_runner: String::from("b")
            }
        );
    }

    #[test]
    fn expiring_credentials_are_fetched_again_inside_the_window_at_most_once_a_minute() {
        let now = 1_800_000_000;
        // (expires at, fetched at, now, refresh?)
        let refresh_cases = [
            (None, 0, now, false),
            (Some(now + 3600), now - 10, now, false),
            // Inside the window, fetched long enough ago.
            (Some(now + 299), now - 3000, now, true),
            (Some(now + 300), now - 3000, now, true),
            (Some(now + 301), now - 3000, now, false),
            // Inside the window, but fetched a moment ago: not yet.
            (Some(now + 100), now - 59, now, false),
            (Some(now + 100), now - 60, now, true),
            // Expired: always.
            (Some(now), now, now, true),
            (Some(now - 1), now - 1, now, true),
        ];
        for (expires, fetched, at, want) in refresh_cases {
            assert_eq!(
                needs_refresh(expires, fetched, at),
                want,
                "{expires:?} {fetched} {at}"
            );
        }
    }
}
