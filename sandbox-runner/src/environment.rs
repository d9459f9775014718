//! Materialising environments (`local`, `folder-template`, `worktree`), reading AGENTS.md,
//! capturing the snapshot, and detaching.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wuhu_core::cell::check_root;
use wuhu_core::wire::runner::{
    AGENTS_FILES, AGENTS_MD_MAX_BYTES, AttachedEnvironment, EnvironmentContext, EnvironmentKind,
    EnvironmentSource, EnvironmentSpec, ErrorBody, SandboxMode, Snapshot, codes, os_display_name,
};

use crate::cell::Cells;
use crate::executor::RunnerDirs;
use crate::snapshot::capture_snapshot;
use crate::store::Store;
use crate::tools::{CancelSignal, ToolContext};
use wuhu_core::tools::truncate_tail_with;

/// What materialising needs from the runner.
#[derive(Clone, Debug)]
pub struct EnvironmentHost {
    /// Where per-session copies and worktrees go.
    pub workspaces_root: PathBuf,
    /// The runner's own environment variables, the source of snapshots.
    pub vars: Vec<(String, String)>,
    /// Limit for a folder-template startup script.
    pub startup_timeout: Duration,
    /// Temp and log directories.
    pub dirs: RunnerDirs,
    /// Directories attach paths must be inside (the `--env` directories and the workspaces
    /// root); `None` accepts any existing directory (`--allow-any-path`).
    pub allowed_roots: Option<Vec<PathBuf>>,
    /// The workspace store (`--store`): folder-template environments are hydrated from it on
    /// attach and saved to it (then deleted here) on detach.
    pub store: Option<Arc<Store>>,
    /// The runner's cells (off unless the runner turns them on).
    pub cells: Arc<Cells>,
    /// The secrets each session's calls were given (memory only), to mask its answers.
    pub session_secrets: Arc<crate::session_secrets::SessionSecrets>,
    /// The stdio MCP servers of attached environments ([`crate::mcp_servers`]).
    pub mcp: Arc<crate::mcp_servers::McpServers>,
}

/// Default limit for a startup script.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);

/// Lines of a failing script's or git's output kept in the error message.
const ERROR_OUTPUT_LINES: usize = 60;
/// Bytes of a failing script's or git's output kept in the error message.
const ERROR_OUTPUT_BYTES: usize = 8 * 1024;

/// What a detach did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detached {
    /// Whether the directory was deleted.
    pub removed: bool,
    /// The kept branch of a worktree.
    pub branch: Option<String>,
    /// The commit the worktree was at when it was removed (what its kept branch holds).
    pub head: Option<String>,
}

impl EnvironmentHost {
    /// A host using the runner process's environment and the system temp dir, accepting attach
    /// paths only inside the workspaces root (see [`EnvironmentHost::allow_paths_in`]).
    pub fn for_process(workspaces_root: PathBuf) -> EnvironmentHost {
        EnvironmentHost {
            allowed_roots: Some(vec![canonical(&workspaces_root)]),
            workspaces_root,
            vars: std::env::vars().collect(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            dirs: RunnerDirs::in_system_temp(),
            store: None,
            cells: Cells::off(),
            session_secrets: Default::default(),
            mcp: Default::default(),
        }
    }

    /// Accepts attach paths inside `roots` (besides the workspaces root); `None` accepts any
    /// path (`--allow-any-path`).
    pub fn allow_paths_in(&mut self, roots: Option<Vec<PathBuf>>) {
        self.allowed_roots = roots.map(|roots| {
            let mut all: Vec<PathBuf> = roots.iter().map(|r| canonical(r)).collect();
            all.push(canonical(&self.workspaces_root));
            all
        });
    }

    /// Refuses a (canonical) attach path outside the allowed roots, naming the flags that
    /// would allow it: the server chooses attach paths, the runner's owner chooses what it
    /// may reach.
    fn check_allowed(&self, path: &Path, what: &str) -> Result<(), ErrorBody> {
        let Some(roots) = &self.allowed_roots else {
            return Ok(());
        };
        if roots.iter().any(|root| path.starts_with(root)) {
            return Ok(());
        }
        Err(ErrorBody::new(
            codes::PATH_NOT_ALLOWED,
            format!(
                "{what} {} is outside the directories this runner offers (its --env directories and --workspaces-root {}); offer it with --env NAME={}, or start the runner with --allow-any-path",
                path.display(),
                self.workspaces_root.display(),
                path.display()
            ),
        ))
    }

    /// Refuses a call whose context (sent by the server with every `tool_call` and `detach`)
    /// has its `root` or snapshot `cwd` outside the allowed roots: the same policy as attach,
    /// so a server cannot point a call anywhere the runner does not offer (security review
    /// M11). A path that exists is checked after resolving symlinks; one that does not, after
    /// resolving `..` and the part of it that exists.
    ///
    /// # Errors
    /// [`codes::PATH_NOT_ALLOWED`], naming `--env` and `--allow-any-path`.
    pub fn check_call_context(&self, context: &EnvironmentContext) -> Result<(), ErrorBody> {
        if self.allowed_roots.is_none() {
            return Ok(());
        }
        let paths = [("root", &context.root), ("cwd", &context.snapshot.cwd)];
        for (what, raw) in paths {
            if what == "cwd" && raw.is_empty() {
                continue; // The root.
            }
            let what = format!("environment {:?}'s {what}", context.name);
            let path = Path::new(raw);
            if !path.is_absolute() {
                return Err(ErrorBody::new(
                    codes::PATH_NOT_ALLOWED,
                    format!("{what} {raw} is not an absolute path"),
                ));
            }
            let resolved = path.canonicalize().unwrap_or_else(|_| {
                crate::tools::path::resolve_existing_prefix(
                    &crate::tools::path::normalize_lexically(path),
                )
            });
            self.check_allowed(&resolved, &what)?;
        }
        Ok(())
    }

    /// Materialises `spec` for `session_id`. On failure nothing is left behind.
    ///
    /// # Errors
    ///
    /// An [`ErrorBody`] for the `attach_result`: [`codes::NOT_FOUND`],
    /// [`codes::STARTUP_SCRIPT_FAILED`], [`codes::GIT_FAILED`] or [`codes::INTERNAL`].
    pub async fn attach(
        &self,
        session_id: &str,
        spec: &EnvironmentSpec,
    ) -> Result<AttachedEnvironment, ErrorBody> {
        self.cells
            .check_kind(spec.source.kind())
            .map_err(|e| ErrorBody::new(codes::PATH_NOT_ALLOWED, e))?;
        let (root, repo_path, branch) = match &spec.source {
            EnvironmentSource::Local { path } => {
                let dir = existing_dir(path, "path")?;
                self.check_allowed(&dir, "path")?;
                (dir, None, None)
            }
            EnvironmentSource::FolderTemplate {
                template_path,
                startup_script,
            } => {
                let template = existing_dir(template_path, "template")?;
                self.check_allowed(&template, "template")?;
                let root = self
                    .folder_template(session_id, spec, &template, startup_script.as_deref())
                    .await?;
                (root, None, None)
            }
            EnvironmentSource::Worktree {
                repo_path,
                base_ref,
            } => {
                let (root, repo, branch) = self
                    .worktree(session_id, repo_path, base_ref.as_deref())
                    .await?;
                (root, Some(repo), Some(branch))
            }
        };
        // A root that holds the runner's own files (its config, a home directory) cannot be a
        // cell: refused now rather than at every call.
        if self.cells.mode() == SandboxMode::On
            && let Err(e) = check_root(&root.to_string_lossy(), self.cells.protected())
        {
            return Err(ErrorBody::new(codes::PATH_NOT_ALLOWED, e));
        }
        let (agents_md, agents_md_truncated, agents_md_file) = read_agents_md(&root);
        let snapshot = capture_snapshot(
            &root,
            self.vars.iter().cloned(),
            &spec.extra_env_vars,
            crate::unix_now(),
        );
        Ok(AttachedEnvironment {
            name: spec.name.clone(),
            kind: spec.source.kind(),
            root: root.to_string_lossy().into_owned(),
            os: os_display_name(std::env::consts::OS),
            repo_path: repo_path.map(|p: PathBuf| p.to_string_lossy().into_owned()),
            branch,
            snapshot,
            agents_md,
            agents_md_truncated,
            agents_md_file,
            cell: Box::new(spec.cell.clone()),
        })
    }

    /// Releases an environment: a worktree is removed (`git worktree remove --force`) and its
    /// branch kept; local directories and folder-template copies are left in place.
    ///
    /// # Errors
    ///
    /// [`codes::GIT_FAILED`] when git refuses to remove the worktree.
    pub async fn detach(&self, environment: &EnvironmentContext) -> Result<Detached, ErrorBody> {
        self.check_call_context(environment)?;
        match environment.kind {
            EnvironmentKind::FolderTemplate if self.store.is_some() => {
                let store = self.store.as_ref().expect("checked");
                let removed = store.detach(Path::new(&environment.root)).await?;
                Ok(Detached {
                    removed,
                    branch: None,
                    head: None,
                })
            }
            EnvironmentKind::Local | EnvironmentKind::FolderTemplate => Ok(Detached {
                removed: false,
                branch: None,
                head: None,
            }),
            EnvironmentKind::Worktree => {
                let repo = environment.repo_path.as_deref().ok_or_else(|| {
                    ErrorBody::new(codes::INVALID_SPEC, "worktree context without repoPath")
                })?;
                let mut head = None;
                if Path::new(&environment.root).exists() {
                    head = git(Path::new(&environment.root), &["rev-parse", "HEAD"])
                        .await
                        .ok()
                        .map(|h| h.trim().to_string())
                        .filter(|h| !h.is_empty());
                    git(
                        Path::new(repo),
                        &["worktree", "remove", "--force", &environment.root],
                    )
                    .await
                    .map_err(|out| {
                        ErrorBody::new(
                            codes::GIT_FAILED,
                            format!("git worktree remove failed:\n{out}"),
                        )
                    })?;
                } else {
                    let _ = git(Path::new(repo), &["worktree", "prune"]).await;
                }
                Ok(Detached {
                    removed: true,
                    branch: environment.branch.clone(),
                    head,
                })
            }
        }
    }

    /// The session was deleted: deletes its stored workspaces (with a store) and its local
    /// copies, the directories `<workspaces root>/<session id>` and `<session id>-N`
    /// ([`crate::store::rules::is_session_copy`]); its git worktrees among them (a `.git`
    /// file) are removed through their repository (`git worktree remove --force`), so their
    /// branches stay. Returns `(objects deleted, local copies and worktrees deleted)`.
    ///
    /// # Errors
    ///
    /// [`codes::INVALID_MESSAGE`] for an id that is not a session id; the store's errors
    /// ([`codes::STORE_FAILED`]) and [`codes::INTERNAL`] for a copy that could not be deleted.
    /// Local copies are deleted even when the store failed.
    pub async fn discard(&self, session_id: &str) -> Result<(u64, u64), ErrorBody> {
        if !wuhu_core::deletion::is_session_id(session_id) {
            return Err(ErrorBody::new(
                codes::INVALID_MESSAGE,
                format!("{session_id:?} is not a session id; nothing is discarded"),
            ));
        }
        // The store first: it stops saving the session's workspaces before their copies go.
        let stored = match &self.store {
            Some(store) => store.discard(session_id).await,
            None => Ok(0),
        };
        let root = self.workspaces_root.clone();
        let session = session_id.to_string();
        // Its home on this runner goes with it.
        let _ = std::fs::remove_dir_all(crate::executor::session_home(&self.dirs, session_id));
        // Its git worktrees first (through their repositories, branches kept), then the
        // copies (which skip worktrees: one whose removal failed is left for the next ask).
        let worktrees = remove_session_worktrees(&root, &session).await;
        let local = tokio::task::spawn_blocking(move || remove_session_copies(&root, &session))
            .await
            .map_err(|e| ErrorBody::new(codes::INTERNAL, e.to_string()))?;
        let objects = stored?;
        let local = local? + worktrees?;
        // Its files are gone: its uid may be given again (after the rest of the range).
        self.cells.release_session(session_id);
        Ok((objects, local))
    }

    async fn folder_template(
        &self,
        session_id: &str,
        spec: &EnvironmentSpec,
        template: &Path,
        startup_script: Option<&str>,
    ) -> Result<PathBuf, ErrorBody> {
        let workspaces = self
            .workspaces_root
            .canonicalize()
            .unwrap_or(self.workspaces_root.clone());
        if workspaces.starts_with(template) {
            return Err(ErrorBody::new(
                codes::INVALID_SPEC,
                format!(
                    "template {} contains the workspaces root {}; it cannot be copied into itself",
                    template.display(),
                    workspaces.display()
                ),
            ));
        }
        let dest = claim_dir(&self.workspaces_root, session_id)?;
        let root = dest.canonicalize().unwrap_or(dest.clone());
        // A store restores the session's saved workspace; the template seeds a new one.
        let restored = match &self.store {
            Some(store) => match store.hydrate(session_id, &spec.name, &root, &[]).await {
                Ok(restored) => restored,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dest);
                    return Err(e);
                }
            },
            None => false,
        };
        let fail = async |e: ErrorBody| {
            if let Some(store) = &self.store {
                store.abandon(&root).await;
            }
            let _ = std::fs::remove_dir_all(&dest);
            Err(e)
        };
        if !restored {
            let (from, to) = (template.to_path_buf(), dest.clone());
            let copied = tokio::task::spawn_blocking(move || copy_tree(&from, &to))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            if let Err(e) = copied {
                return fail(ErrorBody::new(
                    codes::INTERNAL,
                    format!("copying {} failed: {e}", template.display()),
                ))
                .await;
            }
        }
        // Also after a restore: what the skip rules left out (node_modules, ...) comes back
        // from the startup script, which must therefore be safe to run again.
        if let Some(script) = startup_script.filter(|s| !s.trim().is_empty())
            && let Err(e) = self
                .run_startup_script(session_id, &root, spec, script)
                .await
        {
            return fail(e).await;
        }
        Ok(root)
    }

    async fn run_startup_script(
        &self,
        session_id: &str,
        root: &Path,
        spec: &EnvironmentSpec,
        script: &str,
    ) -> Result<(), ErrorBody> {
        let snapshot = capture_snapshot(root, self.vars.iter().cloned(), &spec.extra_env_vars, 0);
        let temp_dir = self.dirs.temp_root.join(format!(
            "startup-{}",
            root.file_name().unwrap_or_default().to_string_lossy()
        ));
        let _ = std::fs::create_dir_all(&temp_dir);
        // The script is the definition's, run for the session: in the session's cell.
        let context = EnvironmentContext {
            name: spec.name.clone(),
            kind: EnvironmentKind::FolderTemplate,
            root: root.to_string_lossy().into_owned(),
            snapshot: Snapshot::default(),
            repo_path: None,
            branch: None,
            cell: spec.cell.clone(),
        };
        // The session's own logs: no other session's startup cell reads them.
        let session_logs = crate::jobs::session_log_dir(&self.dirs.log_dir, session_id);
        let _ = crate::private_dir::create(&session_logs);
        let on = self.cells.mode() == SandboxMode::On;
        let home = crate::executor::session_home(&self.dirs, session_id);
        let cell = crate::executor::call_cell(
            on.then_some(&self.cells),
            session_id,
            &context,
            root,
            &temp_dir,
            &session_logs,
            Some(&home),
        );
        let cell = match cell {
            Ok(cell) => cell,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&temp_dir);
                return Err(ErrorBody::new(codes::PATH_NOT_ALLOWED, e));
            }
        };
        let mut env = snapshot.env;
        if on {
            env.insert(String::from("HOME"), home.to_string_lossy().into_owned());
        }
        let ctx = ToolContext {
            call_id: String::from("startup"),
            root: root.to_path_buf(),
            kind: EnvironmentKind::FolderTemplate,
            cwd: root.to_path_buf(),
            env,
            temp_dir: temp_dir.clone(),
            log_dir: session_logs,
            job_logs: None,
            cancel: CancelSignal::never(),
            cell,
            progress: None,
        };
        let command = format!("set -euo pipefail\n{script}");
        let run = crate::tools::bash::run_command(&ctx, &command, Some(self.startup_timeout)).await;
        let _ = std::fs::remove_dir_all(&temp_dir);
        let run = run.map_err(|e| ErrorBody::new(codes::INTERNAL, e))?;
        let failure = if run.timed_out {
            Some(format!(
                "startup script timed out after {} s",
                self.startup_timeout.as_secs()
            ))
        } else if let Some(signal) = run.signal {
            Some(format!("startup script was killed by signal {signal}"))
        } else {
            match run.exit_code {
                Some(0) => None,
                Some(code) => Some(format!("startup script exited with code {code}")),
                None => Some(String::from("startup script failed")),
            }
        };
        match failure {
            None => Ok(()),
            Some(what) => Err(ErrorBody::new(
                codes::STARTUP_SCRIPT_FAILED,
                format!("{what}; output:\n{}", output_tail(&run.output)),
            )),
        }
    }

    async fn worktree(
        &self,
        session_id: &str,
        repo_path: &str,
        base_ref: Option<&str>,
    ) -> Result<(PathBuf, PathBuf, String), ErrorBody> {
        let repo = existing_dir(repo_path, "repository")?;
        self.check_allowed(&repo, "repository")?;
        let top = git(&repo, &["rev-parse", "--show-toplevel"])
            .await
            .map_err(|_| {
                ErrorBody::new(
                    codes::NOT_FOUND,
                    format!("{} is not a git repository", repo.display()),
                )
            })?;
        let top = PathBuf::from(top.trim());
        let top = top.canonicalize().unwrap_or(top);
        // The repository's top may be above the offered directory.
        self.check_allowed(&top, "repository")?;
        let short = short_id(session_id);
        let mut branch = format!("wuhu/{short}");
        for n in 2.. {
            let probe = format!("refs/heads/{branch}");
            if git(&top, &["rev-parse", "--verify", "--quiet", &probe])
                .await
                .is_err()
            {
                break;
            }
            if n > 999 {
                return Err(ErrorBody::new(
                    codes::INTERNAL,
                    format!("no free branch name for wuhu/{short}"),
                ));
            }
            branch = format!("wuhu/{short}-{n}");
        }
        let dest = claim_dir(&self.workspaces_root, session_id)?;
        let dest_text = dest.to_string_lossy().into_owned();
        let base = base_ref.unwrap_or("HEAD");
        if let Err(out) = git(&top, &["worktree", "add", "-b", &branch, &dest_text, base]).await {
            let _ = std::fs::remove_dir_all(&dest);
            return Err(ErrorBody::new(
                codes::GIT_FAILED,
                format!("git worktree add failed:\n{}", output_tail(&out)),
            ));
        }
        let root = dest.canonicalize().unwrap_or(dest);
        Ok((root, top, branch))
    }
}

/// The first 8 letters or digits of a session id (`wuhu/<short>` branches).
pub fn short_id(session_id: &str) -> String {
    let short: String = session_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    if short.is_empty() {
        String::from("session")
    } else {
        short
    }
}

/// A directory name safe on every OS for a session id.
fn dir_name(session_id: &str) -> String {
    let name: String = session_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if name.is_empty() {
        String::from("session")
    } else {
        name
    }
}

/// Creates `<root>/<session>` or, when taken, `<root>/<session>-1` ... `-999`.
fn claim_dir(root: &Path, session_id: &str) -> Result<PathBuf, ErrorBody> {
    std::fs::create_dir_all(root).map_err(|e| {
        ErrorBody::new(
            codes::INTERNAL,
            format!("cannot create workspaces root {}: {e}", root.display()),
        )
    })?;
    let base = dir_name(session_id);
    for n in 0..1000 {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let path = root.join(name);
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(ErrorBody::new(
                    codes::INTERNAL,
                    format!("cannot create {}: {e}", path.display()),
                ));
            }
        }
    }
    Err(ErrorBody::new(
        codes::INTERNAL,
        format!("no free workspace name for {base} in {}", root.display()),
    ))
}

/// Removes `session_id`'s git worktrees under `root` (its copies' directories that hold a
/// `.git` file) through their repositories, keeping their branches: `git worktree remove
/// --force` from the repository's common directory. A worktree whose repository is gone has
/// no branch left to keep: its directory is deleted. Returns how many went.
async fn remove_session_worktrees(root: &Path, session_id: &str) -> Result<u64, ErrorBody> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(0);
    };
    let worktrees: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            crate::store::rules::is_session_copy(&name, session_id)
                && entry.path().join(".git").is_file()
        })
        .map(|entry| entry.path())
        .collect();
    let mut removed = 0;
    let mut failed = Vec::new();
    for path in worktrees {
        let text = path.to_string_lossy().into_owned();
        let gone = match git(&path, &["rev-parse", "--git-common-dir"]).await {
            Ok(common) => {
                let common = path.join(common.trim());
                match git(&common, &["worktree", "remove", "--force", &text]).await {
                    Ok(_) => Ok(()),
                    Err(out) => Err(format!("git worktree remove failed: {}", output_tail(&out))),
                }
            }
            // Its repository is gone (or the `.git` file is broken): nothing to keep.
            Err(_) => std::fs::remove_dir_all(&path).map_err(|e| e.to_string()),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => failed.push(format!("{}: {e}", path.display())),
        }
    }
    if failed.is_empty() {
        Ok(removed)
    } else {
        Err(ErrorBody::new(
            codes::INTERNAL,
            format!("could not remove worktree {}", failed.join("; ")),
        ))
    }
}

/// Deletes `session_id`'s local copies under `root` (not worktrees); returns how many.
fn remove_session_copies(root: &Path, session_id: &str) -> Result<u64, ErrorBody> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Ok(0);
    };
    let mut removed = 0;
    let mut failed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if !is_dir
            || !crate::store::rules::is_session_copy(&name, session_id)
            || path.join(".git").is_file()
        {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            Err(e) => failed.push(format!("{}: {e}", path.display())),
        }
    }
    if failed.is_empty() {
        Ok(removed)
    } else {
        Err(ErrorBody::new(
            codes::INTERNAL,
            format!("could not delete {}", failed.join("; ")),
        ))
    }
}

/// `path` canonicalized, or as given when it does not exist (yet)./// `path` canonicalized, or as given when it does not exist (yet).
fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn existing_dir(path: &str, what: &str) -> Result<PathBuf, ErrorBody> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(ErrorBody::new(
            codes::NOT_FOUND,
            format!("{what} {path} is not an absolute path"),
        ));
    }
    match p.canonicalize() {
        Ok(c) if c.is_dir() => Ok(c),
        Ok(_) => Err(ErrorBody::new(
            codes::NOT_FOUND,
            format!("{what} {path} is not a directory"),
        )),
        Err(_) => Err(ErrorBody::new(
            codes::NOT_FOUND,
            format!("{what} {path} does not exist on this runner"),
        )),
    }
}

/// Copies a directory tree; symlinks are recreated as symlinks, permissions kept.
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The agent instructions at `root`: the first of [`AGENTS_FILES`] that is a file (`AGENTS.md`,
/// else `CLAUDE.md`), cut to [`AGENTS_MD_MAX_BYTES`] at a char boundary. Returns the text,
/// whether it was cut, and which file it is.
pub fn read_agents_md(root: &Path) -> (Option<String>, bool, Option<String>) {
    let Some((file, path)) = AGENTS_FILES
        .iter()
        .map(|file| (*file, root.join(file)))
        .find(|(_, path)| path.is_file())
    else {
        return (None, false, None);
    };
    let Ok(bytes) = std::fs::read(&path) else {
        return (None, false, None);
    };
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let file = Some(file.to_string());
    if text.len() <= AGENTS_MD_MAX_BYTES {
        return (Some(text), false, file);
    }
    let mut cut = AGENTS_MD_MAX_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    (Some(text[..cut].to_string()), true, file)
}

fn output_tail(output: &str) -> String {
    let tail = truncate_tail_with(output, ERROR_OUTPUT_LINES, ERROR_OUTPUT_BYTES);
    if tail.truncated {
        format!("[...]\n{}", tail.text)
    } else {
        tail.text
    }
}

/// Runs `git -C dir args...`; stdout on success, combined output on failure.
async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let output = tokio::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn host(base: &Path) -> EnvironmentHost {
        EnvironmentHost {
            workspaces_root: base.join("workspaces"),
            vars: vec![
                (String::from("PATH"), std::env::var("PATH").unwrap()),
                (String::from("HOME"), base.to_string_lossy().into_owned()),
                (String::from("MY_API_KEY"), String::from("s3cret")),
                (String::from("EXTRA_ONE"), String::from("1")),
            ],
            startup_timeout: Duration::from_secs(20),
            dirs: RunnerDirs {
                temp_root: base.join("calls"),
                log_dir: base.join("logs"),
            },
            allowed_roots: None,
            store: None,
            cells: Cells::off(),
            session_secrets: Default::default(),
            mcp: Default::default(),
        }
    }

    #[tokio::test]
    async fn attach_paths_stay_inside_offered_directories() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let offered = base_path.join("offered");
        let outside = base_path.join("outside");
        std::fs::create_dir_all(offered.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // A symlink inside the offered directory that leads out of it.
        std::os::unix::fs::symlink(&outside, offered.join("escape")).unwrap();
        std::fs::create_dir_all(base_path.join("workspaces/kept")).unwrap();
        let mut host = host(&base_path);
        host.allow_paths_in(Some(vec![offered.clone()]));
        let local = |path: &Path| {
            spec(EnvironmentSource::Local {
                path: path.to_string_lossy().into_owned(),
            })
        };
        // (path, allowed)
        let cases = [
            (offered.clone(), true),
            (offered.join("sub"), true),
            (base_path.join("workspaces/kept"), true),
            (outside.clone(), false),
            (offered.join("escape"), false),
            (offered.join("sub/../../outside"), false),
            (base_path.clone(), false),
        ];
        for (path, allowed) in cases {
            let result = host.attach("s1", &local(&path)).await;
            match (allowed, result) {
                (true, Ok(_)) => {}
                (false, Err(e)) => {
                    assert_eq!(e.code, codes::PATH_NOT_ALLOWED, "{}", path.display());
                    assert!(e.message.contains("--allow-any-path"), "{}", e.message);
                    assert!(e.message.contains("--env"), "{}", e.message);
                }
                (allowed, result) => panic!("{} allowed={allowed}: {result:?}", path.display()),
            }
        }
        let template = spec(EnvironmentSource::FolderTemplate {
            template_path: outside.to_string_lossy().into_owned(),
            startup_script: None,
        });
        let refused = host.attach("s2", &template).await.unwrap_err();
        assert_eq!(refused.code, codes::PATH_NOT_ALLOWED);
        // --allow-any-path: anything existing.
        host.allow_paths_in(None);
        assert!(host.attach("s3", &local(&outside)).await.is_ok());
    }

    #[tokio::test]
    async fn call_contexts_stay_inside_offered_directories() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let offered = base_path.join("offered");
        let outside = base_path.join("outside");
        std::fs::create_dir_all(offered.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, offered.join("escape")).unwrap();
        std::fs::create_dir_all(base_path.join("workspaces/s1")).unwrap();
        let mut host = host(&base_path);
        host.allow_paths_in(Some(vec![offered.clone()]));
        let text = |p: &Path| p.to_string_lossy().into_owned();
        let context = |root: String, cwd: String| EnvironmentContext {
            name: String::from("api"),
            kind: EnvironmentKind::Local,
            root,
            repo_path: None,
            branch: None,
            snapshot: wuhu_core::wire::runner::Snapshot {
                cwd,
                env: Default::default(),
                captured_at: 1,
            },
            cell: Default::default(),
        };
        // (root, cwd) → allowed
        let cases = [
            (text(&offered), String::new(), true),
            (text(&offered), text(&offered.join("sub")), true),
            (
                text(&offered.join("sub")),
                text(&offered.join("missing/deeper")),
                true,
            ),
            (text(&base_path.join("workspaces/s1")), String::new(), true),
            (text(&outside), String::new(), false),
            (text(&outside), text(&offered), false),
            (text(&offered), text(&outside), false),
            (text(&offered), text(&offered.join("escape")), false),
            (text(&offered.join("escape")), String::new(), false),
            (
                text(&offered),
                text(&offered.join("sub/../../outside")),
                false,
            ),
            (
                text(&offered),
                text(&offered.join("missing/../../outside/x")),
                false,
            ),
            (text(&offered), String::from("/"), false),
            (text(&offered), String::from("sub"), false),
            (String::from("relative"), String::new(), false),
            (text(&base_path), String::new(), false),
        ];
        for (root, cwd, allowed) in cases {
            let got = host.check_call_context(&context(root.clone(), cwd.clone()));
            match (allowed, got) {
                (true, Ok(())) => {}
                (false, Err(e)) => {
                    assert_eq!(e.code, codes::PATH_NOT_ALLOWED, "{root} {cwd}");
                    assert!(e.message.contains("\"api\""), "{}", e.message);
                }
                (allowed, got) => panic!("root {root} cwd {cwd} allowed={allowed}: {got:?}"),
            }
        }
        // A detach with such a context is refused the same way.
        let refused = host
            .detach(&context(text(&outside), String::new()))
            .await
            .unwrap_err();
        assert_eq!(refused.code, codes::PATH_NOT_ALLOWED);
        // --allow-any-path: anything.
        host.allow_paths_in(None);
        assert!(
            host.check_call_context(&context(text(&outside), String::from("/")))
                .is_ok()
        );
    }

    fn spec(source: EnvironmentSource) -> EnvironmentSpec {
        EnvironmentSpec {
            name: String::from("env"),
            source,
            extra_env_vars: vec![String::from("EXTRA_ONE"), String::from("MY_API_KEY")],
            cell: Default::default(),
        }
    }

    #[tokio::test]
    async fn local_needs_an_existing_directory_and_reads_agents_md() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let host = host(&base_path);
        std::fs::write(base_path.join("AGENTS.md"), "# Be nice\n").unwrap();
        let attached = host
            .attach(
                "s1",
                &spec(EnvironmentSource::Local {
                    path: base_path.to_string_lossy().into_owned(),
                }),
            )
            .await
            .unwrap();
        assert_eq!(attached.kind, EnvironmentKind::Local);
        assert_eq!(attached.root, base_path.to_string_lossy());
        assert_eq!(attached.snapshot.cwd, attached.root);
        assert_eq!(attached.agents_md.as_deref(), Some("# Be nice\n"));
        assert!(!attached.agents_md_truncated);
        let names: Vec<&str> = attached.snapshot.env.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["EXTRA_ONE", "HOME", "PATH"],
            "secret never captured"
        );
        let missing = host
            .attach(
                "s1",
                &spec(EnvironmentSource::Local {
                    path: base_path.join("nope").to_string_lossy().into_owned(),
                }),
            )
            .await
            .unwrap_err();
        assert_eq!(missing.code, codes::NOT_FOUND);
        let detached = host.detach(&attached.context()).await.unwrap();
        assert!(!detached.removed);
        assert!(base_path.exists());
    }

    #[tokio::test]
    async fn agents_md_is_capped() {
        let base = tempfile::tempdir().unwrap();
        std::fs::write(
            base.path().join("AGENTS.md"),
            "é".repeat(AGENTS_MD_MAX_BYTES),
        )
        .unwrap();
        let (text, truncated, file) = read_agents_md(base.path());
        let text = text.unwrap();
        assert!(truncated);
        assert_eq!(file.as_deref(), Some("AGENTS.md"));
        assert!(text.len() <= AGENTS_MD_MAX_BYTES && text.len() > AGENTS_MD_MAX_BYTES - 4);
    }

    #[test]
    fn claude_md_stands_in_for_a_missing_agents_md() {
        let base = tempfile::tempdir().unwrap();
        assert_eq!(read_agents_md(base.path()), (None, false, None));
        std::fs::write(base.path().join("CLAUDE.md"), "claude rules").unwrap();
        assert_eq!(
            read_agents_md(base.path()),
            (Some("claude rules".into()), false, Some("CLAUDE.md".into()))
        );
        // AGENTS.md wins when both are there; a directory of that name is not a file.
        std::fs::write(base.path().join("AGENTS.md"), "agents rules").unwrap();
        assert_eq!(
            read_agents_md(base.path()),
            (Some("agents rules".into()), false, Some("AGENTS.md".into()))
        );
        std::fs::remove_file(base.path().join("AGENTS.md")).unwrap();
        std::fs::create_dir(base.path().join("AGENTS.md")).unwrap();
        assert_eq!(read_agents_md(base.path()).2.as_deref(), Some("CLAUDE.md"));
    }

    #[tokio::test]
    async fn folder_template_copies_and_runs_the_startup_script() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let template = base_path.join("template");
        std::fs::create_dir_all(template.join("src")).unwrap();
        std::fs::write(template.join("src/app.txt"), "app").unwrap();
        std::fs::write(template.join("AGENTS.md"), "template rules").unwrap();
        std::os::unix::fs::symlink("src/app.txt", template.join("link")).unwrap();
        let host = host(&base_path);
        let source = EnvironmentSource::FolderTemplate {
            template_path: template.to_string_lossy().into_owned(),
            startup_script: Some(String::from("echo setup > marker\ntest \"$CI\" = 1")),
        };
        let first = host.attach("sess-1", &spec(source.clone())).await.unwrap();
        let root = PathBuf::from(&first.root);
        assert_eq!(root, base_path.join("workspaces/sess-1"));
        assert_eq!(
            std::fs::read_to_string(root.join("src/app.txt")).unwrap(),
            "app"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("marker")).unwrap(),
            "setup\n"
        );
        assert_eq!(
            std::fs::read_link(root.join("link")).unwrap(),
            PathBuf::from("src/app.txt")
        );
        assert_eq!(first.agents_md.as_deref(), Some("template rules"));
        assert!(!template.join("marker").exists());
        let second = host.attach("sess-1", &spec(source)).await.unwrap();
        assert_eq!(
            PathBuf::from(&second.root),
            base_path.join("workspaces/sess-1-1")
        );
        let detached = host.detach(&second.context()).await.unwrap();
        assert!(!detached.removed && Path::new(&second.root).exists());
    }

    #[tokio::test]
    async fn folder_template_failing_script_reports_its_output_and_cleans_up() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let template = base_path.join("template");
        std::fs::create_dir_all(&template).unwrap();
        let host = host(&base_path);
        let source = EnvironmentSource::FolderTemplate {
            template_path: template.to_string_lossy().into_owned(),
            startup_script: Some(String::from("echo installing\nfalse\necho never")),
        };
        let err = host.attach("s2", &spec(source)).await.unwrap_err();
        let inside = EnvironmentSource::FolderTemplate {
            template_path: base_path.to_string_lossy().into_owned(),
            startup_script: None,
        };
        let refused = host.attach("s4", &spec(inside)).await.unwrap_err();
        assert!(
            refused.message.contains("cannot be copied into itself"),
            "{}",
            refused.message
        );
        assert_eq!(err.code, codes::STARTUP_SCRIPT_FAILED);
        assert_eq!(
            err.message,
            "startup script exited with code 1; output:\ninstalling\n"
        );
        assert!(!base_path.join("workspaces/s2").exists());
        let source = EnvironmentSource::FolderTemplate {
            template_path: template.to_string_lossy().into_owned(),
            startup_script: Some(String::from("echo $UNSET_VARIABLE_X")),
        };
        let err = host.attach("s3", &spec(source)).await.unwrap_err();
        assert!(
            err.message.contains("unbound variable"),
            "set -u: {}",
            err.message
        );
    }

    fn git_cmd(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[tokio::test]
    async fn worktree_creates_a_branch_and_detach_keeps_it() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let repo = base_path.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git_cmd(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("README.md"), "hello\n").unwrap();
        std::fs::write(repo.join("AGENTS.md"), "repo rules\n").unwrap();
        git_cmd(&repo, &["add", "."]);
        git_cmd(&repo, &["commit", "-q", "-m", "init"]);
        let host = host(&base_path);
        let source = EnvironmentSource::Worktree {
            repo_path: repo.to_string_lossy().into_owned(),
            base_ref: None,
        };
        let session = "0f3c2a1b-aaaa-bbbb-cccc-dddddddddddd";
        let attached = host.attach(session, &spec(source.clone())).await.unwrap();
        assert_eq!(attached.kind, EnvironmentKind::Worktree);
        assert_eq!(attached.branch.as_deref(), Some("wuhu/0f3c2a1b"));
        assert_eq!(
            attached.repo_path.as_deref(),
            Some(&*repo.to_string_lossy())
        );
        let root = PathBuf::from(&attached.root);
        assert_eq!(
            std::fs::read_to_string(root.join("README.md")).unwrap(),
            "hello\n"
        );
        assert_eq!(attached.agents_md.as_deref(), Some("repo rules\n"));
        let head = git_cmd(&root, &["rev-parse", "--abbrev-ref", "HEAD"]);
        assert_eq!(head.trim(), "wuhu/0f3c2a1b");
        // A second attach for the same session gets its own branch and directory.
        let again = host.attach(session, &spec(source)).await.unwrap();
        assert_eq!(again.branch.as_deref(), Some("wuhu/0f3c2a1b-2"));
        assert_ne!(again.root, attached.root);

        std::fs::write(root.join("work.txt"), "uncommitted").unwrap();
        let detached = host.detach(&attached.context()).await.unwrap();
        assert_eq!(
            detached,
            Detached {
                removed: true,
                branch: Some(String::from("wuhu/0f3c2a1b")),
                head: Some(git_cmd(&repo, &["rev-parse", "main"]).trim().to_string()),
            }
        );
        assert!(!root.exists());
        let branches = git_cmd(&repo, &["branch", "--list", "wuhu/*"]);
        assert!(branches.contains("wuhu/0f3c2a1b\n"), "{branches}");

        let bad = host
            .attach(
                session,
                &spec(EnvironmentSource::Worktree {
                    repo_path: repo.to_string_lossy().into_owned(),
                    base_ref: Some(String::from("no-such-ref")),
                }),
            )
            .await
            .unwrap_err();
        assert_eq!(bad.code, codes::GIT_FAILED);
        let not_repo = host
            .attach(
                session,
                &spec(EnvironmentSource::Worktree {
                    repo_path: base_path.join("workspaces").to_string_lossy().into_owned(),
                    base_ref: None,
                }),
            )
            .await
            .unwrap_err();
        assert_eq!(not_repo.code, codes::NOT_FOUND);
    }

    /// A deleted session's worktrees go with it (through git: the repository forgets them),
    /// their branches stay; another session's worktree stays; a worktree whose repository is
    /// gone is deleted as a directory.
    #[tokio::test]
    async fn discard_removes_the_sessions_worktrees_and_keeps_their_branches() {
        let base = tempfile::tempdir().unwrap();
        let base_path = base.path().canonicalize().unwrap();
        let repo = base_path.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git_cmd(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("README.md"), "hello\n").unwrap();
        git_cmd(&repo, &["add", "."]);
        git_cmd(&repo, &["commit", "-q", "-m", "init"]);
        let host = host(&base_path);
        let source = EnvironmentSource::Worktree {
            repo_path: repo.to_string_lossy().into_owned(),
            base_ref: None,
        };
        let session = "0f3c2a1b-aaaa-bbbb-cccc-dddddddddddd";
        let other = "1a2b3c4d-aaaa-bbbb-cccc-dddddddddddd";
        let first = host.attach(session, &spec(source.clone())).await.unwrap();
        let second = host.attach(session, &spec(source.clone())).await.unwrap();
        let others = host.attach(other, &spec(source)).await.unwrap();
        std::fs::write(PathBuf::from(&first.root).join("work.txt"), "uncommitted").unwrap();

        let (_, local) = host.discard(session).await.unwrap();
        assert_eq!(local, 2);
        assert!(!Path::new(&first.root).exists());
        assert!(!Path::new(&second.root).exists());
        assert!(Path::new(&others.root).exists());
        let listed = git_cmd(&repo, &["worktree", "list", "--porcelain"]);
        assert!(!listed.contains(&first.root), "{listed}");
        assert!(listed.contains(&others.root), "{listed}");
        let branches = git_cmd(&repo, &["branch", "--list", "wuhu/*"]);
        for branch in ["wuhu/0f3c2a1b", "wuhu/0f3c2a1b-2", "wuhu/1a2b3c4d"] {
            assert!(branches.contains(branch), "{branch}: {branches}");
        }
        // Asked again (the hub repeats until `ok`): nothing left, nothing fails.
        assert_eq!(host.discard(session).await.unwrap(), (0, 0));

        // Its repository gone: the directory is deleted all the same.
        std::fs::remove_dir_all(&repo).unwrap();
        assert_eq!(host.discard(other).await.unwrap(), (0, 1));
        assert!(!Path::new(&others.root).exists());
    }

    #[test]
    fn short_ids_and_dir_names() {
        assert_eq!(short_id("0f3c2a1b-aaaa"), "0f3c2a1b");
        assert_eq!(short_id("a-b"), "ab");
        assert_eq!(short_id("---"), "session");
        assert_eq!(dir_name("../x y"), "___x_y");
    }
}
