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

/// Static credentials and where they came from.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    /// `aws_access_key_id`.
    pub access_key_id: String,
    /// `aws_secret_access_key`.
    pub secret_access_key: String,
    /// `aws_session_token`, for temporary credentials.
    pub session_token: Option<String>,
    /// Where they were found (for the start-up line; never the values).
    pub source: String,
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Where a runner's S3 credentials come from.
#[derive(Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// Keys from the environment or a profile.
    Static(AwsCredentials),
    /// A profile's `credential_process`: a command printing AWS's JSON (`Version` 1,
    /// `AccessKeyId`, `SecretAccessKey`, optional `SessionToken` and `Expiration`), run with
    /// `sh -c` at start and again before the credentials expire ([`needs_refresh`]).
    Process {
        /// The command line.
        command: String,
        /// Where it was found (for the start-up line; never the command, which may hold
        /// arguments that are secrets).
        source: String,
    },
}

impl CredentialSource {
    /// Where the credentials come from, for the start-up line.
    pub fn source(&self) -> &str {
        match self {
            CredentialSource::Static(c) => &c.source,
            CredentialSource::Process { source, .. } => source,
        }
    }
}

impl fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::Static(c) => f.debug_tuple("Static").field(c).finish(),
            CredentialSource::Process { source, .. } => f
                .debug_struct("Process")
                .field("source", source)
                .finish_non_exhaustive(),
        }
    }
}

/// Credentials from a `credential_process`, and when they expire (unix seconds; `None`: never).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessCredentials {
    /// The keys.
    pub credentials: AwsCredentials,
    /// `Expiration`, in unix seconds.
    pub expires_at: Option<i64>,
}

/// Process credentials are fetched again this long before they expire.
pub const REFRESH_BEFORE_EXPIRY_SECONDS: i64 = 300;
/// ... but at most once per this many seconds while they are still valid (credentials that are
/// issued already inside the refresh window would otherwise run the process for every request).
pub const MIN_REFRESH_INTERVAL_SECONDS: i64 = 60;
/// How long a `credential_process` may run.
pub const CREDENTIAL_PROCESS_TIMEOUT_SECONDS: u64 = 60;
/// The most output of a `credential_process` that is read.
pub const CREDENTIAL_PROCESS_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// Reads a `credential_process`'s output (AWS's documented format, `Version` 1). `now` is unix
/// seconds: credentials that have expired already are refused.
///
/// # Errors
///
/// A message without the output (which holds secrets): not JSON, another version, a missing or
/// empty key, an `Expiration` that is not an RFC 3339 time or is past.
pub fn parse_process_output(
    output: &str,
    source: &str,
    now: i64,
) -> Result<ProcessCredentials, String> {
    let value: serde_json::Value = serde_json::from_str(output.trim())
        .map_err(|e| format!("{source}: the output is not JSON ({e})"))?;
    if value.get("Version").and_then(serde_json::Value::as_u64) != Some(1) {
        return Err(format!("{source}: the output's Version is not 1"));
    }
    let text = |name: &str| {
        value
            .get(name)
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (Some(access_key_id), Some(secret_access_key)) =
        (text("AccessKeyId"), text("SecretAccessKey"))
    else {
        return Err(format!(
            "{source}: the output lacks AccessKeyId or SecretAccessKey"
        ));
    };
    let expires_at = match text("Expiration") {
        None => None,
        Some(time) => {
            let at: jiff::Timestamp = time.parse().map_err(|e| {
                format!("{source}: Expiration {time:?} is not an RFC 3339 time ({e})")
            })?;
            Some(at.as_second())
        }
    };
    if let Some(at) = expires_at
        && at <= now
    {
        return Err(format!(
            "{source}: the credentials expired {} s ago",
            now - at
        ));
    }
    Ok(ProcessCredentials {
        credentials: AwsCredentials {
            access_key_id,
            secret_access_key,
            session_token: text("SessionToken"),
            source: source.to_string(),
        },
        expires_at,
    })
}

/// Whether process credentials fetched at `fetched_at` and expiring at `expires_at` (unix
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

/// The standard AWS settings as read from the environment and the shared files.
#[derive(Clone, Debug, Default)]
pub struct AwsSources {
    /// Environment variables (`AWS_*`, `HOME`).
    pub vars: BTreeMap<String, String>,
    /// The shared credentials file's text (`AWS_SHARED_CREDENTIALS_FILE`, else
    /// `~/.aws/credentials`), when readable.
    pub credentials_file: Option<String>,
    /// The shared config file's text (`AWS_CONFIG_FILE`, else `~/.aws/config`), when readable.
    pub config_file: Option<String>,
}

impl AwsSources {
    fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn profile(&self) -> &str {
        self.var("AWS_PROFILE").unwrap_or("default")
    }
}

/// Resolves credentials like the AWS SDKs' default chain does for static and process
/// credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`), else the
/// profile (`AWS_PROFILE`, default `default`) in the shared credentials file, else in the shared
/// config file (`[profile NAME]`, or `[default]`); in a profile, static keys before
/// `credential_process`.
///
/// # Errors
///
/// A message naming what was looked at when nothing holds both keys or a process. SSO, role
/// assumption and instance metadata are not read.
pub fn resolve_credentials(sources: &AwsSources) -> Result<CredentialSource, String> {
    if let (Some(id), Some(secret)) = (
        sources.var("AWS_ACCESS_KEY_ID"),
        sources.var("AWS_SECRET_ACCESS_KEY"),
    ) {
        return Ok(CredentialSource::Static(AwsCredentials {
            access_key_id: id.to_string(),
            secret_access_key: secret.to_string(),
            session_token: sources.var("AWS_SESSION_TOKEN").map(str::to_string),
            source: String::from("environment"),
        }));
    }
    let profile = sources.profile();
    let config_section = if profile == "default" {
        String::from("default")
    } else {
        format!("profile {profile}")
    };
    let files = [
        (
            &sources.credentials_file,
            profile.to_string(),
            "credentials",
        ),
        (&sources.config_file, config_section, "config"),
    ];
    for (text, section, file) in files {
        let Some(text) = text else { continue };
        let ini = parse_ini(text);
        let Some(values) = ini.get(&section) else {
            continue;
        };
        if let (Some(id), Some(secret)) = (
            values.get("aws_access_key_id"),
            values.get("aws_secret_access_key"),
        ) {
            return Ok(CredentialSource::Static(AwsCredentials {
                access_key_id: id.clone(),
                secret_access_key: secret.clone(),
                session_token: values.get("aws_session_token").cloned(),
                source: format!("profile {profile} of the shared {file} file"),
            }));
        }
        if let Some(command) = values.get("credential_process").filter(|c| !c.is_empty()) {
            return Ok(CredentialSource::Process {
                command: command.clone(),
                source: format!(
                    "credential_process of profile {profile} in the shared {file} file"
                ),
            });
        }
    }
    Err(format!(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile {profile:?} aws_access_key_id and aws_secret_access_key, or credential_process, in the shared credentials file (~/.aws/credentials or AWS_SHARED_CREDENTIALS_FILE) or config file (SSO, role assumption and instance metadata are not supported)"
    ))
}

/// The region: `--store-region`, else `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's
/// `region` in the shared config file, else `us-east-1`.
pub fn resolve_region(flag: Option<&str>, sources: &AwsSources) -> String {
    if let Some(region) = flag.filter(|r| !r.is_empty()) {
        return region.to_string();
    }
    if let Some(region) = sources
        .var("AWS_REGION")
        .or_else(|| sources.var("AWS_DEFAULT_REGION"))
    {
        return region.to_string();
    }
    let profile = sources.profile();
    let section = if profile == "default" {
        String::from("default")
    } else {
        format!("profile {profile}")
    };
    sources
        .config_file
        .as_deref()
        .map(parse_ini)
        .and_then(|ini| ini.get(&section).and_then(|s| s.get("region")).cloned())
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| String::from("us-east-1"))
}

/// Parses the AWS shared-file INI dialect: `[section]`, `key = value`, `#` and `;` comments.
/// Keys are lower-cased; later values win.
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let (Some(section), Some((key, value))) = (&current, line.split_once('=')) {
            sections
                .entry(section.clone())
                .or_default()
                .insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    sections
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

    fn sources(
        vars: &[(&str, &str)],
        credentials: Option<&str>,
        config: Option<&str>,
    ) -> AwsSources {
        AwsSources {
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            credentials_file: credentials.map(str::to_string),
            config_file: config.map(str::to_string),
        }
    }

    fn keys(source: CredentialSource) -> AwsCredentials {
        match source {
            CredentialSource::Static(c) => c,
            other => panic!("not static: {other:?}"),
        }
    }

    #[test]
    fn credential_process_is_found_after_static_keys_and_its_output_is_checked() {
        let config = "[profile proc]\ncredential_process = /opt/bin/creds --profile \"x=y\"\nregion = eu-west-1\n[profile both]\naws_access_key_id = STATIC\naws_secret_access_key = s\ncredential_process = /opt/bin/creds\n[profile empty]\ncredential_process =\n";
        let creds = "[cred]\ncredential_process = /opt/bin/other\n";
        // (profile, the command or the static key id, or an error fragment)
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("proc", Ok("process:/opt/bin/creds --profile \"x=y\"")),
            ("both", Ok("static:STATIC")),
            ("cred", Ok("process:/opt/bin/other")),
            ("empty", Err("no S3 credentials")),
        ];
        for (profile, want) in cases {
            let got = resolve_credentials(&sources(
                &[("AWS_PROFILE", profile)],
                Some(creds),
                Some(config),
            ))
            .map(|c| match c {
                CredentialSource::Static(c) => format!("static:{}", c.access_key_id),
                CredentialSource::Process { command, .. } => format!("process:{command}"),
            });
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(g, w, "{profile}"),
                (Err(f), Err(m)) => assert!(m.contains(f), "{profile}: {m}"),
                _ => panic!("{profile}: got {got:?}, want {want:?}"),
            }
        }
        let process =
            resolve_credentials(&sources(&[("AWS_PROFILE", "proc")], None, Some(config))).unwrap();
        assert_eq!(
            process.source(),
            "credential_process of profile proc in the shared config file"
        );
        // The command is never shown (it may carry a secret argument).
        assert!(!format!("{process:?}").contains("/opt/bin"));

        let now = 1_800_000_000; // 2027-01-15T08:00:00Z
        // (output, key id and expiry, or an error fragment)
        type Case<'a> = (&'a str, Result<(&'a str, Option<i64>), &'a str>);
        let cases: Vec<Case> = vec![
            (
                r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","SessionToken":"T","Expiration":"2027-01-15T09:00:00Z"}"#,
                Ok(("AK", Some(now + 3600))),
            ),
            (
                r#"{"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "SK"}"#,
                Ok(("AK", None)),
            ),
            (
                r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","Expiration":"2027-01-15T10:00:00+01:00"}"#,
                Ok(("AK", Some(now + 3600))),
            ),
            (
                r#"{"Version":2,"AccessKeyId":"AK","SecretAccessKey":"SK"}"#,
                Err("Version is not 1"),
            ),
            (
                r#"{"AccessKeyId":"AK","SecretAccessKey":"SK"}"#,
                Err("Version is not 1"),
            ),
            (
                r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":""}"#,
                Err("lacks AccessKeyId or SecretAccessKey"),
            ),
            (
                r#"{"Version":1,"SecretAccessKey":"SK"}"#,
                Err("lacks AccessKeyId or SecretAccessKey"),
            ),
            (
                r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","Expiration":"tomorrow"}"#,
                Err("not an RFC 3339 time"),
            ),
            (
                r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","Expiration":"2027-01-15T07:59:00Z"}"#,
                Err("expired 60 s ago"),
            ),
            ("AK SK", Err("not JSON")),
            ("", Err("not JSON")),
        ];
        for (output, want) in cases {
            let got = parse_process_output(output, "p", now);
            match (&want, &got) {
                (Ok((id, expires)), Ok(c)) => {
                    assert_eq!(
                        (c.credentials.access_key_id.as_str(), c.expires_at),
                        (*id, *expires),
                        "{output}"
                    );
                }
                (Err(fragment), Err(message)) => {
                    assert!(message.contains(fragment), "{output}: {message}");
                    // Never the output's secrets.
                    assert!(!message.contains("SK"), "{message}");
                }
                _ => panic!("{output}: got {got:?}, want {want:?}"),
            }
        }
        let full = parse_process_output(cases_token(), "p", now).unwrap();
        assert_eq!(full.credentials.session_token.as_deref(), Some("T"));

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

    fn cases_token() -> &'static str {
        r#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","SessionToken":"T"}"#
    }

    #[test]
    fn credentials_follow_the_standard_order() {
        let creds_file = "[default]\naws_access_key_id = FILEDEF\naws_secret_access_key = s1\n\n[dev]\n# comment\naws_access_key_id=FILEDEV\naws_secret_access_key=s2\naws_session_token = t2\n";
        let config_file = "[default]\nregion = eu-west-1\n[profile ops]\nregion = ap-south-1\naws_access_key_id = CONFOPS\naws_secret_access_key = s3\n";
        // (vars, credentials file, config file, key id or error fragment, source)
        type Case<'a> = (
            Vec<(&'a str, &'a str)>,
            Option<&'a str>,
            Option<&'a str>,
            Result<(&'a str, &'a str), &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                vec![("AWS_ACCESS_KEY_ID", "ENV"), ("AWS_SECRET_ACCESS_KEY", "x")],
                Some(creds_file),
                None,
                Ok(("ENV", "environment")),
            ),
            // A half-set environment falls through to the files.
            (
                vec![("AWS_ACCESS_KEY_ID", "ENV")],
                Some(creds_file),
                None,
                Ok(("FILEDEF", "profile default of the shared credentials file")),
            ),
            (
                vec![("AWS_PROFILE", "dev")],
                Some(creds_file),
                None,
                Ok(("FILEDEV", "profile dev of the shared credentials file")),
            ),
            (
                vec![("AWS_PROFILE", "ops")],
                Some(creds_file),
                Some(config_file),
                Ok(("CONFOPS", "profile ops of the shared config file")),
            ),
            (vec![], None, Some(config_file), Err("no S3 credentials")),
            (
                vec![("AWS_PROFILE", "nope")],
                Some(creds_file),
                None,
                Err("\"nope\""),
            ),
        ];
        for (vars, credentials, config, want) in cases {
            let got = resolve_credentials(&sources(&vars, credentials, config)).map(keys);
            match (&want, &got) {
                (Ok((id, source)), Ok(c)) => {
                    assert_eq!(
                        (c.access_key_id.as_str(), c.source.as_str()),
                        (*id, *source)
                    );
                }
                (Err(fragment), Err(message)) => assert!(message.contains(fragment), "{message}"),
                _ => panic!("{vars:?}: got {got:?}, want {want:?}"),
            }
        }
        let dev = resolve_credentials(&sources(&[("AWS_PROFILE", "dev")], Some(creds_file), None));
        assert_eq!(keys(dev.unwrap()).session_token.as_deref(), Some("t2"));
        // Debug output never shows the secret.
        let shown = format!(
            "{:?}",
            keys(resolve_credentials(&sources(&[], Some(creds_file), None)).unwrap())
        );
        assert!(
            !shown.contains("s1") && !shown.contains("FILEDEF"),
            "{shown}"
        );

        // Regions: flag, AWS_REGION, AWS_DEFAULT_REGION, the profile's config, us-east-1.
        type RegionCase<'a> = (
            Option<&'a str>,
            Vec<(&'a str, &'a str)>,
            Option<&'a str>,
            &'a str,
        );
        let region_cases: Vec<RegionCase> = vec![
            (
                Some("auto"),
                vec![("AWS_REGION", "x")],
                Some(config_file),
                "auto",
            ),
            (
                None,
                vec![("AWS_REGION", "r1"), ("AWS_DEFAULT_REGION", "r2")],
                None,
                "r1",
            ),
            (
                None,
                vec![("AWS_DEFAULT_REGION", "r2")],
                Some(config_file),
                "r2",
            ),
            (None, vec![], Some(config_file), "eu-west-1"),
            (
                None,
                vec![("AWS_PROFILE", "ops")],
                Some(config_file),
                "ap-south-1",
            ),
            (None, vec![], None, "us-east-1"),
        ];
        for (flag, vars, config, want) in region_cases {
            assert_eq!(resolve_region(flag, &sources(&vars, None, config)), want);
        }
    }
}
