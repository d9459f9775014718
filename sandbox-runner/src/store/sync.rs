//! The effects of cloud workspaces: hydrate on attach, save (on detach, on an interval, before
//! exit), release and clean up. [`super::rules`] decides; this module reads the disk, talks to
//! the bucket and logs.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use wuhu_core::wire::runner::{ErrorBody, codes};

use super::rules::{
    self, AttachLease, Lease, Lost, MULTIPART_THRESHOLD_BYTES, Manifest, ManifestEntry, PART_BYTES,
    SkipRules, StoreLocation, WorkspaceKeys,
};
use super::s3::{Condition, Put, S3, S3Error};

/// How a runner reaches its store (`--store`, `--store-endpoint`, `--store-region`,
/// `--store-save-interval`).
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `--store s3://BUCKET/PREFIX`.
    pub location: StoreLocation,
    /// `--store-endpoint`: path-style addressing at this URL.
    pub endpoint: Option<String>,
    /// `--store-region`.
    pub region: Option<String>,
    /// How often held workspaces are saved.
    pub save_interval: Duration,
}

/// A workspace this runner process attached and saves.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct Held {
    session_id: String,
    environment: String,
    root: PathBuf,
    /// This attach's lease holder id.
    holder: String,
    /// The manifest last loaded or saved, and its ETag.
    base: Manifest,
    base_etag: Option<String>,
    save_also: Vec<String>,
    /// Objects no saved manifest references whose delete failed: retried at the next save (at
    /// most [`rules::MAX_PENDING_DELETES`]).
    #[serde(default)]
    pending_deletes: Vec<String>,
}

impl Held {
    fn keys(&self, location: &StoreLocation) -> Result<WorkspaceKeys, String> {
        WorkspaceKeys::new(location, &self.session_id, &self.environment)
    }
}

/// Why a save did not happen.
#[derive(thiserror::Error, Debug)]
pub enum SaveError {
    /// Another runner has the workspace: this one stops saving it and keeps its copy.
    #[error("{0}")]
    Lost(Lost),
    /// Storage or the disk failed; the next save tries again.
    #[error("{0}")]
    Failed(String),
}

impl From<S3Error> for SaveError {
    fn from(e: S3Error) -> SaveError {
        SaveError::Failed(e.to_string())
    }
}

/// What a save did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveReport {
    /// `<session>/<environment>`.
    pub label: String,
    /// Paths saved.
    pub files: usize,
    /// Paths added or changed since the last save.
    pub changed: usize,
    /// Paths removed since the last save.
    pub removed: usize,
    /// Contents uploaded.
    pub uploaded: usize,
    /// Bytes uploaded.
    pub uploaded_bytes: u64,
    /// PUT requests sent (objects, parts, the manifest).
    pub puts: u64,
    /// Objects deleted after the manifest write: no manifest references them any more.
    pub deleted: usize,
    /// Unreferenced objects whose delete failed or was not tried (kept for the next save).
    pub delete_failed: usize,
    /// Directories left out by the skip rules, as `path/` (at most 20 named).
    pub skipped: Vec<String>,
}

impl std::fmt::Display for SaveReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "saved workspace {}: {} paths ({} changed, {} removed), uploaded {} objects ({} bytes), puts={}, deleted {} unreferenced objects{}; not saved: {}",
            self.label,
            self.files,
            self.changed,
            self.removed,
            self.uploaded,
            self.uploaded_bytes,
            self.puts,
            self.deleted,
            if self.delete_failed > 0 {
                format!(
                    " ({} not deleted: retried at the next save)",
                    self.delete_failed
                )
            } else {
                String::new()
            },
            if self.skipped.is_empty() {
                String::from("nothing")
            } else {
                self.skipped.join(", ")
            }
        )
    }
}

/// The runner's store: the bucket, and the workspaces this process holds (also kept as small
/// JSON files under `<workspaces root>/.wuhu-store/`, so a restarted runner saves them again).
pub struct Store {
    s3: S3,
    location: StoreLocation,
    runner: String,
    state_dir: PathBuf,
    held: Mutex<BTreeMap<PathBuf, Held>>,
    /// One store operation at a time: a save never races a hydrate or another save.
    busy: tokio::sync::Mutex<()>,
    /// How often held workspaces are saved.
    pub save_interval: Duration,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("s3", &self.s3)
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

fn log(line: &str) {
    eprintln!("wuhu-runner: store: {line}");
}

impl Store {
    /// Opens the store: resolves the region, fetches credentials through the AWS credentials
    /// chain ([`credentials`](super::credentials)), and adopts the workspaces an earlier process
    /// of this runner left held.
    ///
    /// # Errors
    ///
    /// A message for missing credentials (with the chain's reasons) or a bad endpoint.
    pub async fn open(
        config: &StoreConfig,
        runner: &str,
        workspaces_root: &Path,
    ) -> Result<Store, String> {
        let (region, sts_region) =
            super::credentials::resolve_regions(config.region.as_deref()).await;
        let http = reqwest::Client::builder()
            .timeout(super::s3::REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let chain = super::credentials::default_chain(&sts_region, http.clone()).await;
        let keys = super::credentials::CredentialCache::new(chain)
            .await
            .map_err(|e| format!("no S3 credentials from the AWS credentials chain: {e}"))?;
        let s3 = S3::new(
            &config.location,
            config.endpoint.as_deref(),
            &region,
            keys,
            http,
        )?;
        let credentials_source = s3.credentials_source();
        let state_dir = workspaces_root.join(".wuhu-store");
        let store = Store {
            s3,
            location: config.location.clone(),
            runner: runner.to_string(),
            held: Mutex::new(adopt(&state_dir)),
            state_dir,
            busy: tokio::sync::Mutex::new(()),
            save_interval: config.save_interval,
        };
        let adopted = store.held.lock().map(|h| h.len()).unwrap_or(0);
        log(&format!(
            "s3://{}/{} ({}region {region}, credentials from {}); saving every {} s, on detach and before exit; {adopted} workspace(s) adopted; not saved: {} (unless the definition asks), sockets and other special files",
            config.location.bucket,
            config.location.prefix,
            config
                .endpoint
                .as_deref()
                .map(|e| format!("endpoint {e}, path-style, "))
                .unwrap_or_default(),
            credentials_source,
            config.save_interval.as_secs(),
            rules::DEFAULT_SKIPPED_DIRS.join(", "),
        ));
        Ok(store)
    }

    /// PUT requests sent so far.
    pub fn puts(&self) -> u64 {
        self.s3.puts()
    }

    /// Takes the workspace of `session_id`'s `environment` (lease) and fills `root` from its
    /// stored manifest. Returns whether a snapshot was restored (else the caller copies the
    /// folder template). On failure `root` may hold partial files: the caller removes it.
    ///
    /// # Errors
    ///
    /// [`codes::STORE_FAILED`] when storage fails or the manifest is unusable,
    /// [`codes::STORE_CONFLICT`] when other attaches keep racing for the lease.
    pub async fn hydrate(
        &self,
        session_id: &str,
        environment: &str,
        root: &Path,
        save_also: &[String],
    ) -> Result<bool, ErrorBody> {
        let _busy = self.busy.lock().await;
        let failed = |e: String| ErrorBody::new(codes::STORE_FAILED, e);
        let keys = WorkspaceKeys::new(&self.location, session_id, environment).map_err(failed)?;
        let holder = format!("{}/{}", self.runner, random_hex());
        let mut took_over = None;
        let mut acquired = false;
        for _ in 0..3 {
            let current = self
                .s3
                .get(&keys.lease())
                .await
                .map_err(|e| failed(e.to_string()))?;
            let (lease, etag) = match current {
                Some((body, etag)) => (serde_json::from_slice::<Lease>(&body).ok(), etag),
                None => (None, None),
            };
            let condition = match rules::attach_lease(lease.as_ref()) {
                AttachLease::Create => Condition::IfNoneMatch,
                AttachLease::TakeOver { from_runner } => {
                    took_over = Some(from_runner);
                    etag.map(Condition::IfMatch).unwrap_or(Condition::None)
                }
            };
            let lease = Lease {
                holder: holder.clone(),
                runner: self.runner.clone(),
                acquired_at_ms: now_ms(),
            };
            let body = serde_json::to_vec(&lease).unwrap_or_default();
            match self.s3.put(&keys.lease(), body, &condition).await {
                Ok(Put::Done(_)) => {
                    acquired = true;
                    break;
                }
                Ok(Put::PreconditionFailed) => continue,
                Err(e) => return Err(failed(e.to_string())),
            }
        }
        if !acquired {
            return Err(ErrorBody::new(
                codes::STORE_CONFLICT,
                format!(
                    "workspace {} is being attached by another runner at the same moment",
                    keys.label()
                ),
            ));
        }
        if let Some(from) = took_over {
            log(&format!(
                "took workspace {} over from runner {from:?}; its later saves are refused",
                keys.label()
            ));
        }
        let stored = self
            .s3
            .get(&keys.manifest())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (base, base_etag, restored) = match stored {
            Some((body, etag)) => {
                let manifest: Manifest = serde_json::from_slice(&body)
                    .map_err(|e| failed(format!("manifest of {}: {e}", keys.label())))?;
                rules::check_manifest(&manifest)
                    .map_err(|e| failed(format!("manifest of {}: {e}", keys.label())))?;
                self.download(&keys, &manifest, root)
                    .await
                    .map_err(failed)?;
                (manifest, etag, true)
            }
            None => (Manifest::empty(), None, false),
        };
        if restored {
            log(&format!(
                "hydrated workspace {} into {} from its snapshot ({} paths, saved by {})",
                keys.label(),
                root.display(),
                base.files.len(),
                base.saved_by
            ));
        } else {
            log(&format!(
                "workspace {} has no snapshot yet: starting from the folder template",
                keys.label()
            ));
        }
        let held = Held {
            session_id: session_id.to_string(),
            environment: environment.to_string(),
            root: root.to_path_buf(),
            holder,
            base,
            base_etag,
            save_also: save_also.to_vec(),
            pending_deletes: Vec::new(),
        };
        self.remember(held);
        Ok(restored)
    }

    /// Saves the workspace at `root` if this process holds it (`None` otherwise).
    ///
    /// # Errors
    ///
    /// [`SaveError::Lost`] (then this runner no longer holds it, and keeps its copy) or
    /// [`SaveError::Failed`].
    pub async fn save(&self, root: &Path) -> Result<Option<SaveReport>, SaveError> {
        let _busy = self.busy.lock().await;
        self.save_locked(root).await
    }

    async fn save_locked(&self, root: &Path) -> Result<Option<SaveReport>, SaveError> {
        let Some(held) = self.held_at(root) else {
            return Ok(None);
        };
        let result = self.save_held(&held).await;
        match &result {
            Ok(saved) => {
                if saved.written.is_some() || saved.pending_deletes != held.pending_deletes {
                    let mut next = held.clone();
                    if let Some((manifest, etag)) = &saved.written {
                        next.base = manifest.clone();
                        next.base_etag = etag.clone();
                    }
                    next.pending_deletes = saved.pending_deletes.clone();
                    self.remember(next);
                }
                log(&saved.report.to_string());
            }
            Err(SaveError::Lost(lost)) => {
                log(&format!(
                    "NOT saved workspace {}/{}: {lost}; this runner stops saving it and keeps its copy at {}",
                    held.session_id,
                    held.environment,
                    root.display()
                ));
                self.forget(root);
            }
            Err(SaveError::Failed(e)) => log(&format!(
                "saving workspace {}/{} failed (the next save tries again): {e}",
                held.session_id, held.environment
            )),
        }
        result.map(|saved| Some(saved.report))
    }

    /// Saves every held workspace (`why`: `interval` or `exit`).
    pub async fn save_all(&self, why: &str) {
        let roots: Vec<PathBuf> = self
            .held
            .lock()
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default();
        if roots.is_empty() {
            return;
        }
        log(&format!("saving {} workspace(s) ({why})", roots.len()));
        for root in roots {
            let _busy = self.busy.lock().await;
            let _ = self.save_locked(&root).await;
        }
    }

    /// Detach: saves the workspace at `root`, releases its lease and deletes the local copy.
    /// `Ok(false)` when this process does not hold it (nothing done).
    ///
    /// # Errors
    ///
    /// [`codes::STORE_CONFLICT`] when another runner has it, [`codes::STORE_FAILED`] when
    /// saving failed; both keep the local copy (named in the message).
    pub async fn detach(&self, root: &Path) -> Result<bool, ErrorBody> {
        let _busy = self.busy.lock().await;
        let Some(held) = self.held_at(root) else {
            return Ok(false);
        };
        let label = format!("{}/{}", held.session_id, held.environment);
        match self.save_locked(root).await {
            Ok(_) => {}
            Err(SaveError::Lost(lost)) => {
                return Err(ErrorBody::new(
                    codes::STORE_CONFLICT,
                    format!(
                        "workspace {label} was not saved: {lost}; the copy stays on runner {:?} at {}",
                        self.runner,
                        root.display()
                    ),
                ));
            }
            Err(SaveError::Failed(e)) => {
                return Err(ErrorBody::new(
                    codes::STORE_FAILED,
                    format!(
                        "workspace {label} was not saved ({e}); the copy stays on runner {:?} at {} and is saved again on the runner's interval",
                        self.runner,
                        root.display()
                    ),
                ));
            }
        }
        self.release(&held).await;
        self.forget(root);
        let removed = std::fs::remove_dir_all(root);
        log(&format!(
            "released workspace {label}; local copy {} {}",
            root.display(),
            if removed.is_ok() {
                "deleted"
            } else {
                "could not be deleted"
            }
        ));
        Ok(true)
    }

    /// The session was deleted (`discard_workspaces`): stops saving its workspaces (forgets
    /// them; the caller deletes the local copies) and deletes every object under
    /// `<prefix>/workspaces/<session id>/`: manifests, leases and contents of all its
    /// environments. Returns how many objects were deleted.
    ///
    /// # Errors
    ///
    /// [`codes::INVALID_MESSAGE`] when `session_id` is not a session id,
    /// [`codes::STORE_FAILED`] when storage fails or more than [`MAX_DISCARD_PAGES`] pages of
    /// objects remain (the hub sends the discard again later).
    pub async fn discard(&self, session_id: &str) -> Result<u64, ErrorBody> {
        let prefix = rules::session_prefix(&self.location, session_id)
            .map_err(|e| ErrorBody::new(codes::INVALID_MESSAGE, e))?;
        let _busy = self.busy.lock().await;
        let held: Vec<PathBuf> = self
            .held
            .lock()
            .map(|h| {
                h.values()
                    .filter(|w| w.session_id == session_id)
                    .map(|w| w.root.clone())
                    .collect()
            })
            .unwrap_or_default();
        for root in &held {
            self.forget(root);
        }
        let failed = |e: S3Error| {
            ErrorBody::new(
                codes::STORE_FAILED,
                format!("discarding the workspaces of session {session_id}: {e}"),
            )
        };
        let mut objects = 0u64;
        // Always the first page: what was listed is deleted before the next listing.
        for _ in 0..MAX_DISCARD_PAGES {
            let (keys, _) = self.s3.list(&prefix, None).await.map_err(failed)?;
            if keys.is_empty() {
                log(&format!(
                    "discarded the workspaces of deleted session {session_id}: {objects} objects deleted under {prefix}, {} held workspace(s) forgotten",
                    held.len()
                ));
                return Ok(objects);
            }
            self.s3.delete_many(&keys).await.map_err(failed)?;
            objects += keys.len() as u64;
        }
        Err(ErrorBody::new(
            codes::STORE_FAILED,
            format!(
                "discarding the workspaces of session {session_id}: {objects} objects deleted, more remain under {prefix} (the rest next time)"
            ),
        ))
    }

    /// Gives up a workspace whose attach failed after [`Store::hydrate`]: releases the lease.
    pub async fn abandon(&self, root: &Path) {
        let _busy = self.busy.lock().await;
        if let Some(held) = self.held_at(root) {
            self.release(&held).await;
            self.forget(root);
        }
    }

    /// Deletes the lease if it is still this attach's.
    async fn release(&self, held: &Held) {
        let Ok(keys) = held.keys(&self.location) else {
            return;
        };
        if let Ok(Some((body, _))) = self.s3.get(&keys.lease()).await {
            let lease = serde_json::from_slice::<Lease>(&body).ok();
            if rules::check_lease(lease.as_ref(), &held.holder).is_ok() {
                let _ = self.s3.delete(&keys.lease()).await;
            }
        }
    }

    async fn save_held(&self, held: &Held) -> Result<Saved, SaveError> {
        let keys = held.keys(&self.location).map_err(SaveError::Failed)?;
        let puts_before = self.s3.puts();
        let rules_ = SkipRules::new(&held.save_also);
        let root = held.root.clone();
        let (mut local, skipped) = tokio::task::spawn_blocking(move || scan(&root, &rules_))
            .await
            .map_err(|e| SaveError::Failed(e.to_string()))?
            .map_err(|e| SaveError::Failed(format!("reading {}: {e}", held.root.display())))?;
        local.skipped = SkipRules::new(&held.save_also).skipped();
        local.saved_by = self.runner.clone();
        local.saved_at_ms = now_ms();
        let plan = rules::plan_save(&held.base, &local);
        let mut report = SaveReport {
            label: keys.label().to_string(),
            files: local.files.len(),
            changed: plan.changed,
            removed: plan.removed,
            uploaded: 0,
            uploaded_bytes: 0,
            puts: 0,
            deleted: 0,
            delete_failed: 0,
            skipped,
        };
        // The lease first: a runner that lost the workspace uploads nothing.
        let lease = self.s3.get(&keys.lease()).await?;
        let lease = lease.and_then(|(body, _)| serde_json::from_slice::<Lease>(&body).ok());
        rules::check_lease(lease.as_ref(), &held.holder).map_err(SaveError::Lost)?;
        if plan.is_noop() && held.base_etag.is_some() {
            // Nothing to write; deletes an earlier save could not do are tried again.
            let garbage =
                rules::unreferenced_objects(&held.base, &held.base, &held.pending_deletes);
            let pending_deletes = self
                .delete_unreferenced(&keys, held, garbage, &mut report)
                .await;
            return Ok(Saved {
                report,
                written: None,
                pending_deletes,
            });
        }
        let total: u64 = plan.uploads.iter().map(|(_, _, size)| size).sum();
        for (sha256, path, size) in &plan.uploads {
            self.upload(&keys, &held.root.join(path), sha256, *size)
                .await?;
            report.uploaded += 1;
            report.uploaded_bytes += size;
            if plan.uploads.len() > 20 && report.uploaded.is_multiple_of(20) {
                log(&format!(
                    "saving workspace {}: {} of {} objects, {} of {total} bytes",
                    report.label,
                    report.uploaded,
                    plan.uploads.len(),
                    report.uploaded_bytes
                ));
            }
        }
        let body = serde_json::to_vec(&local).map_err(|e| SaveError::Failed(e.to_string()))?;
        let condition = match &held.base_etag {
            Some(etag) => Condition::IfMatch(etag.clone()),
            None => Condition::IfNoneMatch,
        };
        let etag = match self.s3.put(&keys.manifest(), body, &condition).await? {
            Put::Done(etag) => etag,
            Put::PreconditionFailed => return Err(SaveError::Lost(Lost::ManifestChanged)),
        };
        report.puts = self.s3.puts() - puts_before;
        // Only now, with the new manifest stored, may what it no longer references go.
        let garbage = rules::unreferenced_objects(&held.base, &local, &held.pending_deletes);
        let pending_deletes = self
            .delete_unreferenced(&keys, held, garbage, &mut report)
            .await;
        Ok(Saved {
            report,
            written: Some((local, etag)),
            pending_deletes,
        })
    }

    /// Deletes `garbage` (objects the stored manifest does not reference) while the lease is
    /// still this attach's; returns the hashes left for the next save (failed deletes, or all of
    /// them when the lease could not be confirmed), at most [`rules::MAX_PENDING_DELETES`].
    async fn delete_unreferenced(
        &self,
        keys: &WorkspaceKeys,
        held: &Held,
        garbage: Vec<String>,
        report: &mut SaveReport,
    ) -> Vec<String> {
        if garbage.is_empty() {
            return Vec::new();
        }
        // Read the lease again: a runner that took the workspace over since the save began may
        // have uploaded one of these contents for its own manifest.
        let lease = match self.s3.get(&keys.lease()).await {
            Ok(found) => found.and_then(|(body, _)| serde_json::from_slice::<Lease>(&body).ok()),
            Err(e) => {
                log(&format!(
                    "workspace {}: not deleting {} unreferenced objects now (reading the lease failed: {e})",
                    keys.label(),
                    garbage.len()
                ));
                return keep_pending(garbage, report);
            }
        };
        if let Err(lost) = rules::check_lease(lease.as_ref(), &held.holder) {
            log(&format!(
                "workspace {}: not deleting {} unreferenced objects: {lost}",
                keys.label(),
                garbage.len()
            ));
            return keep_pending(garbage, report);
        }
        let mut failed = Vec::new();
        for sha256 in garbage {
            match self.s3.delete(&keys.object(&sha256)).await {
                Ok(()) => report.deleted += 1,
                Err(e) => {
                    log(&format!(
                        "workspace {}: deleting unreferenced object {sha256} failed (retried at the next save): {e}",
                        keys.label()
                    ));
                    failed.push(sha256);
                }
            }
        }
        keep_pending(failed, report)
    }

    /// Uploads one file as `objects/<sha256>`, in parts above the threshold; fails when the file
    /// changed since it was hashed (the next save picks the new content up).
    async fn upload(
        &self,
        keys: &WorkspaceKeys,
        path: &Path,
        sha256: &str,
        size: u64,
    ) -> Result<(), SaveError> {
        let key = keys.object(sha256);
        let io = |e: std::io::Error| SaveError::Failed(format!("reading {}: {e}", path.display()));
        let changed = || SaveError::Failed(format!("{} changed during the save", path.display()));
        if size <= MULTIPART_THRESHOLD_BYTES {
            let body = tokio::fs::read(path).await.map_err(io)?;
            if hex(&Sha256::digest(&body)) != sha256 {
                return Err(changed());
            }
            self.s3.put(&key, body, &Condition::None).await?;
            return Ok(());
        }
        let upload_id = self.s3.start_multipart(&key).await?;
        let parts = size.div_ceil(PART_BYTES);
        let result = async {
            let mut file = tokio::fs::File::open(path).await.map_err(io)?;
            let mut hasher = Sha256::new();
            let mut etags = Vec::new();
            for number in 1..=parts {
                let mut part = Vec::with_capacity(PART_BYTES as usize);
                (&mut file)
                    .take(PART_BYTES)
                    .read_to_end(&mut part)
                    .await
                    .map_err(io)?;
                hasher.update(&part);
                let number16 = u16::try_from(number)
                    .map_err(|_| SaveError::Failed(format!("{} is too large", path.display())))?;
                let sent = part.len() as u64;
                etags.push(
                    self.s3
                        .upload_part(&key, &upload_id, number16, part)
                        .await?,
                );
                log(&format!(
                    "uploading {} ({} of {size} bytes, part {number} of {parts})",
                    path.display(),
                    ((number - 1) * PART_BYTES + sent).min(size)
                ));
            }
            if hex(&hasher.finalize()) != sha256 {
                return Err(changed());
            }
            self.s3.complete_multipart(&key, &upload_id, &etags).await?;
            Ok(())
        }
        .await;
        if result.is_err() {
            self.s3.abort_multipart(&key, &upload_id).await;
        }
        result
    }

    /// Writes every path of `manifest` under `root`: directories, files (checked against their
    /// hash), then symlinks (last, so no file is written through one).
    async fn download(
        &self,
        keys: &WorkspaceKeys,
        manifest: &Manifest,
        root: &Path,
    ) -> Result<(), String> {
        let total = manifest.files.len();
        let mut done = 0usize;
        for (path, entry) in &manifest.files {
            let target = root.join(path);
            match entry {
                ManifestEntry::Dir => {
                    std::fs::create_dir_all(&target).map_err(|e| format!("{path}: {e}"))?;
                }
                ManifestEntry::File {
                    sha256, executable, ..
                } => {
                    if let Some(parent) = target.parent() {
                        std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
                    }
                    let (body, _) = self
                        .s3
                        .get(&keys.object(sha256))
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or_else(|| format!("{path}: object {sha256} is missing"))?;
                    if hex(&Sha256::digest(&body)) != *sha256 {
                        return Err(format!("{path}: object {sha256} does not match its hash"));
                    }
                    std::fs::write(&target, &body).map_err(|e| format!("{path}: {e}"))?;
                    let mode = if *executable { 0o755 } else { 0o644 };
                    let _ =
                        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode));
                }
                ManifestEntry::Symlink { .. } => continue,
            }
            done += 1;
            if total > 50 && done.is_multiple_of(50) {
                log(&format!(
                    "hydrating workspace {}: {done} of {total} paths",
                    keys.label()
                ));
            }
        }
        for (path, entry) in &manifest.files {
            if let ManifestEntry::Symlink { target } = entry {
                let link = root.join(path);
                if let Some(parent) = link.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
                }
                std::os::unix::fs::symlink(target, &link).map_err(|e| format!("{path}: {e}"))?;
            }
        }
        Ok(())
    }

    fn held_at(&self, root: &Path) -> Option<Held> {
        self.held.lock().ok()?.get(root).cloned()
    }

    fn remember(&self, held: Held) {
        let _ = std::fs::create_dir_all(&self.state_dir);
        if let Ok(text) = serde_json::to_vec(&held) {
            let path = self.sidecar(&held.root);
            let tmp = path.with_extension("json.tmp");
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        if let Ok(mut map) = self.held.lock() {
            map.insert(held.root.clone(), held);
        }
    }

    fn forget(&self, root: &Path) {
        let _ = std::fs::remove_file(self.sidecar(root));
        if let Ok(mut map) = self.held.lock() {
            map.remove(root);
        }
    }

    fn sidecar(&self, root: &Path) -> PathBuf {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| String::from("workspace"));
        self.state_dir.join(format!("{name}.json"))
    }
}

/// Most listing pages (1,000 keys each) one discard deletes; the rest wait for the next time
/// the hub sends it.
pub const MAX_DISCARD_PAGES: usize = 100;

/// What a save did and what it leaves for the next one.
struct Saved {
    report: SaveReport,
    /// The manifest written and its ETag (`None` when nothing changed).
    written: Option<(Manifest, Option<String>)>,
    /// Unreferenced objects not deleted yet.
    pending_deletes: Vec<String>,
}

/// Counts `left` as not deleted and keeps at most [`rules::MAX_PENDING_DELETES`] of them.
fn keep_pending(mut left: Vec<String>, report: &mut SaveReport) -> Vec<String> {
    report.delete_failed += left.len();
    if left.len() > rules::MAX_PENDING_DELETES {
        log(&format!(
            "workspace {}: {} unreferenced objects are left in the bucket for good (more than {} to retry)",
            report.label,
            left.len() - rules::MAX_PENDING_DELETES,
            rules::MAX_PENDING_DELETES
        ));
        left.truncate(rules::MAX_PENDING_DELETES);
    }
    left
}

/// Saves held workspaces every `store.save_interval` until the process ends.
pub fn spawn_interval_saves(store: Arc<Store>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(store.save_interval.max(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            store.save_all("interval").await;
        }
    })
}

/// The held workspaces an earlier process left (sidecars whose root still exists).
fn adopt(state_dir: &Path) -> BTreeMap<PathBuf, Held> {
    let mut held = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(state_dir) else {
        return held;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Held>(&b).ok())
        {
            Some(h) if h.root.is_dir() => {
                held.insert(h.root.clone(), h);
            }
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    held
}

/// Reads the tree under `root` into a manifest, by the skip rules; also returns the skipped
/// directories (`path/`, at most 20, then a count).
fn scan(root: &Path, skip: &SkipRules) -> std::io::Result<(Manifest, Vec<String>)> {
    let mut manifest = Manifest::empty();
    let mut skipped = Vec::new();
    let mut n_skipped = 0usize;
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let mut n_children = 0usize;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let meta = std::fs::symlink_metadata(&path)?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if skip.skips_dir(&name) {
                    n_skipped += 1;
                    if skipped.len() < 20 {
                        skipped.push(format!("{child}/"));
                    }
                    continue;
                }
                stack.push((path, child));
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path)?;
                manifest.files.insert(
                    child,
                    ManifestEntry::Symlink {
                        target: target.to_string_lossy().into_owned(),
                    },
                );
            } else if kind.is_file() {
                let mut file = std::fs::File::open(&path)?;
                let mut hasher = Sha256::new();
                let mut buf = vec![0u8; 64 * 1024];
                let mut size = 0u64;
                loop {
                    let n = file.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    size += n as u64;
                    hasher.update(&buf[..n]);
                }
                manifest.files.insert(
                    child,
                    ManifestEntry::File {
                        sha256: hex(&hasher.finalize()),
                        size,
                        executable: meta.permissions().mode() & 0o100 != 0,
                    },
                );
            } else {
                continue; // Sockets, FIFOs, devices.
            }
            n_children += 1;
        }
        if n_children == 0 && !rel.is_empty() {
            manifest.files.insert(rel, ManifestEntry::Dir);
        }
    }
    skipped.sort();
    if n_skipped > skipped.len() {
        skipped.push(format!("and {} more", n_skipped - skipped.len()));
    }
    Ok((manifest, skipped))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}{nanos:08x}", hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_follows_the_skip_rules_and_keeps_git_links_modes_and_empty_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, body) in [
            ("a.txt", "a"),
            ("src/main.rs", "fn main() {}"),
            (".git/HEAD", "ref: refs/heads/main\n"),
            ("node_modules/x/index.js", "x"),
            ("web/node_modules/y.js", "y"),
            ("target/debug/bin", "b"),
            (".venv/bin/python", "p"),
        ] {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        std::fs::set_permissions(root.join("a.txt"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
        let (manifest, skipped) = scan(root, &SkipRules::new(&[])).unwrap();
        let paths: Vec<&str> = manifest.files.keys().map(String::as_str).collect();
        // `web` holds only a skipped directory: it is kept as an empty one.
        assert_eq!(
            paths,
            vec![".git/HEAD", "a.txt", "empty", "link", "src/main.rs", "web"]
        );
        assert_eq!(manifest.files["web"], ManifestEntry::Dir);
        assert_eq!(
            skipped,
            vec![".venv/", "node_modules/", "target/", "web/node_modules/"]
        );
        assert!(matches!(
            manifest.files["a.txt"],
            ManifestEntry::File {
                executable: true,
                size: 1,
                ..
            }
        ));
        assert_eq!(
            manifest.files["link"],
            ManifestEntry::Symlink {
                target: String::from("a.txt")
            }
        );
        let (with_modules, _) =
            scan(root, &SkipRules::new(&[String::from("node_modules")])).unwrap();
        assert!(with_modules.files.contains_key("node_modules/x/index.js"));
        assert!(with_modules.files.contains_key("web/node_modules/y.js"));
        assert!(!with_modules.files.contains_key("target/debug/bin"));
    }
}
