//! Cells: every `bash` call, background job, startup script and file tool of a session runs
//! confined to its environment (decision 0023). The rules are [`wuhu_core::cell`]'s; this module
//! gathers the facts (the runner's own paths, what `/etc` holds) and performs them:
//! [`linux`] with namespaces, Landlock and seccomp, [`macos`] with a Seatbelt profile, and
//! [`proxy`] for networks with an allow list.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use wuhu_core::cell::{
    CellFacts, CellPolicy, CellSettings, ListedEntry, Network, Os, Protected, cell_policy,
    etc_grants,
};
use wuhu_core::wire::runner::{EnvironmentKind, SandboxMode};

#[cfg(target_os = "linux")]
pub mod linux;
#[cfg(target_os = "macos")]
pub mod macos;
pub mod proxy;
pub mod uids;

/// The runner's cell machinery, shared by every call.
pub struct Cells {
    mode: SandboxMode,
    /// This binary (Linux: cells are `wuhu-runner cell-exec`; macOS runs `sandbox-exec`).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    exe: PathBuf,
    protected: Vec<Protected>,
    etc: Vec<String>,
    cloud_runner: AtomicBool,
    proxy: Option<Arc<proxy::Proxy>>,
    /// Each session as its own uid (`--isolate-uids`).
    uids: Option<uids::SessionUids>,
}

impl std::fmt::Debug for Cells {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cells")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// The OS cells are made for on this machine.
pub fn this_os() -> Os {
    if cfg!(target_os = "macos") {
        Os::MacOs
    } else {
        Os::Linux
    }
}

impl Cells {
    /// Cells for this runner: `protected` are its own paths, `run_dir` its private runtime
    /// directory (proxy sockets go there). With [`SandboxMode::On`] the machine is probed
    /// first.
    ///
    /// # Errors
    /// When this machine cannot make cells (the runner refuses to start, naming
    /// `--sandbox off`).
    pub fn new(
        mode: SandboxMode,
        protected: Vec<Protected>,
        run_dir: &Path,
        cloud_runner: bool,
    ) -> Result<Arc<Cells>, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        Cells::with_exe(exe, mode, protected, run_dir, cloud_runner)
    }

    /// As [`Cells::new`], with `exe` the `wuhu-runner` binary that makes cells (tests).
    ///
    /// # Errors
    /// As [`Cells::new`].
    pub fn with_exe(
        exe: PathBuf,
        mode: SandboxMode,
        protected: Vec<Protected>,
        run_dir: &Path,
        cloud_runner: bool,
    ) -> Result<Arc<Cells>, String> {
        let mut etc = Vec::new();
        let mut proxy = None;
        if mode == SandboxMode::On {
            #[cfg(target_os = "linux")]
            linux::probe(&exe)?;
            #[cfg(target_os = "macos")]
            macos::probe()?;
            #[cfg(not(any(target_os = "linux", target_os = "macos")))]
            return Err(String::from("cells exist on Linux and macOS only"));
            let listing = |dir: &str| list_dir(Path::new(dir));
            // Listed once, at start: only the directories on the way to a secret
            // (`etc_dirs_to_list`) are read below `/etc`.
            etc = etc_grants(this_os(), &listing, &protected);
            proxy = Some(proxy::Proxy::new(run_dir.join("proxy"))?);
        }
        Ok(Arc::new(Cells {
            mode,
            exe,
            protected,
            etc,
            cloud_runner: AtomicBool::new(cloud_runner),
            proxy,
            uids: None,
        }))
    }

    /// No cells (`--sandbox off`, and unit tests of the tools).
    pub fn off() -> Arc<Cells> {
        Arc::new(Cells {
            mode: SandboxMode::Off,
            exe: PathBuf::new(),
            protected: Vec::new(),
            etc: Vec::new(),
            cloud_runner: AtomicBool::new(false),
            proxy: None,
            uids: None,
        })
    }

    /// On or off.
    pub fn mode(&self) -> SandboxMode {
        self.mode
    }

    /// These cells with each session as its own uid from `uids`' range (a runner started as
    /// root on Linux, with cells on).
    ///
    /// # Errors
    /// When cells are off, this is not Linux, or the runner is not root.
    pub fn isolating_uids(self: Arc<Self>, uids: uids::SessionUids) -> Result<Arc<Cells>, String> {
        if self.mode == SandboxMode::Off {
            return Err(String::from(
                "--isolate-uids needs cells: it cannot go with --sandbox off",
            ));
        }
        if !cfg!(target_os = "linux") {
            return Err(String::from("--isolate-uids exists on Linux only"));
        }
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(String::from(
                "--isolate-uids needs a runner started as root (it gives each session's files to the session's uid)",
            ));
        }
        let mut cells =
            Arc::try_unwrap(self).map_err(|_| String::from("the cells are in use already"))?;
        cells.uids = Some(uids);
        Ok(Arc::new(cells))
    }

    /// The sessions' uids, when each session runs as its own.
    pub fn session_uids(&self) -> Option<&uids::SessionUids> {
        self.uids.as_ref()
    }

    /// Gives `session`'s uid back when its files are gone (a discard).
    pub fn release_session(&self, session: &str) {
        if let Some(uids) = &self.uids {
            uids.release(session);
        }
    }

    /// Refuses an environment kind that sessions with their own uids cannot have: only
    /// folder-template copies are made for (and given to) one session; a local directory or
    /// a worktree's repository is shared.
    ///
    /// # Errors
    /// The refusal, for the attach result.
    pub fn check_kind(&self, kind: EnvironmentKind) -> Result<(), String> {
        if self.uids.is_some() && kind != EnvironmentKind::FolderTemplate {
            return Err(format!(
                "this runner runs each session as its own uid (--isolate-uids): it offers folder-template environments only, not {}",
                match kind {
                    EnvironmentKind::Local => "local directories",
                    EnvironmentKind::Worktree => "git worktrees",
                    EnvironmentKind::FolderTemplate => "folder templates",
                }
            ));
        }
        Ok(())
    }

    /// The runner's own paths.
    pub fn protected(&self) -> &[Protected] {
        &self.protected
    }

    /// The server registered this runner as `cloud` (or not): decides default networks.
    pub fn set_cloud_runner(&self, cloud: bool) {
        self.cloud_runner.store(cloud, Ordering::Relaxed);
    }

    /// The cell of one call, or `None` with cells off.
    ///
    /// # Errors
    /// When the environment cannot be a cell (its root holds the runner's files) or the
    /// network's proxy cannot be opened: the call is refused, unrun.
    pub fn cell_for(
        self: &Arc<Self>,
        input: &CellInput<'_>,
    ) -> Result<Option<Arc<CallCell>>, String> {
        if self.mode == SandboxMode::Off {
            return Ok(None);
        }
        let run_as = match &self.uids {
            Some(uids) => {
                self.check_kind(input.kind)?;
                let uid = uids.uid_for(input.session_id)?;
                // The directories above the session's own may be passed through by its uid.
                for dir in [Some(input.temp_dir), input.home, input.session_logs]
                    .into_iter()
                    .flatten()
                {
                    if let Some(parent) = dir.parent() {
                        uids::create_passable_dir(parent)
                            .map_err(|e| format!("{}: {e}", parent.display()))?;
                    }
                }
                // The session's own directories become its uid's (at once when the runner just
                // made them; the copy's tree only the first time, or after a restore).
                uids::give_tree(input.root, uid)?;
                uids::give_dir(input.temp_dir, uid)?;
                for dir in [input.home, input.session_logs].into_iter().flatten() {
                    uids::give_dir(dir, uid)?;
                }
                Some(uid)
            }
            None => None,
        };
        let text = |p: &Path| p.to_string_lossy().into_owned();
        let root = text(input.root);
        let temp = text(input.temp_dir);
        let git_dir = input.git_dir.map(text);
        let logs = input.session_logs.map(text);
        let home = input.home.map(text);
        let policy = cell_policy(&CellFacts {
            os: this_os(),
            kind: input.kind,
            cloud_runner: self.cloud_runner.load(Ordering::Relaxed),
            root: &root,
            git_dir: git_dir.as_deref(),
            temp_dir: &temp,
            session_logs: logs.as_deref(),
            home: home.as_deref(),
            settings: input.settings,
            protected: &self.protected,
            etc: &self.etc,
        })?;
        let proxy = match (&policy.network, &self.proxy) {
            (Network::Allow(list), Some(proxy)) => Some(proxy.open_call(list)?),
            (Network::Allow(_), None) => {
                return Err(String::from("this runner has no proxy for an allow list"));
            }
            _ => None,
        };
        Ok(Some(Arc::new(CallCell {
            policy,
            cells: self.clone(),
            proxy,
            run_as,
        })))
    }
}

/// What a call's cell is made from.
#[derive(Clone, Copy, Debug)]
pub struct CellInput<'a> {
    /// The session the call is for.
    pub session_id: &'a str,
    /// The environment's kind.
    pub kind: EnvironmentKind,
    /// Its root (canonical).
    pub root: &'a Path,
    /// A worktree's git directory (canonical).
    pub git_dir: Option<&'a Path>,
    /// The call's temp dir (canonical).
    pub temp_dir: &'a Path,
    /// The session's logs (read-only in the cell).
    pub session_logs: Option<&'a Path>,
    /// The session's home on the runner (read-write; `HOME` in the cell).
    pub home: Option<&'a Path>,
    /// The definition's cell settings.
    pub settings: &'a CellSettings,
}

/// One call's cell.
pub struct CallCell {
    /// What it may reach.
    pub policy: CellPolicy,
    cells: Arc<Cells>,
    proxy: Option<proxy::CallProxy>,
    /// The session's own uid (and gid), when the runner isolates sessions by uid.
    pub run_as: Option<u32>,
}

impl std::fmt::Debug for CallCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallCell")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl CallCell {
    /// The command that runs `program args…` in this cell (the caller adds the arguments, the
    /// environment, the cwd and the pipes).
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        #[cfg(target_os = "linux")]
        {
            let spec = linux::CellExec {
                policy: self.policy.clone(),
                proxy_socket: self.proxy.as_ref().map(|p| p.socket().to_path_buf()),
                run_as: self.run_as,
            };
            let mut cmd = tokio::process::Command::new(&self.cells.exe);
            cmd.arg("cell-exec")
                .arg(serde_json::to_string(&spec).unwrap_or_default())
                .arg("--")
                .arg(program);
            cmd
        }
        #[cfg(target_os = "macos")]
        {
            macos::command(
                &self.policy,
                &self.cells.protected,
                self.proxy.as_ref().map(|p| p.port()),
                program,
            )
        }
        #[cfg(not(any(target_os = "linux", target_os = "macos")))]
        {
            tokio::process::Command::new(program)
        }
    }

    /// Variables the command gets for its network: the proxy for an `allow` list.
    pub fn env(&self) -> Vec<(String, String)> {
        let Some(proxy) = &self.proxy else {
            return Vec::new();
        };
        #[cfg(target_os = "linux")]
        let port = linux::PROXY_PORT;
        #[cfg(not(target_os = "linux"))]
        let port = proxy.port();
        let _ = proxy;
        let http = format!("http://127.0.0.1:{port}");
        let socks = format!("socks5h://127.0.0.1:{port}");
        let mut vars = Vec::new();
        for (name, value) in [
            ("HTTP_PROXY", &http),
            ("HTTPS_PROXY", &http),
            ("ALL_PROXY", &socks),
        ] {
            vars.push((name.to_string(), value.clone()));
            vars.push((name.to_ascii_lowercase(), value.clone()));
        }
        // No NO_PROXY: a host's loopback (a registry on the runner's machine) is reached
        // through the proxy too; the cell's own loopback is another one.
        vars
    }

    /// The lines for connections the proxy refused so far (`wuhu: blocked connect to …`), and
    /// how many there were in all.
    pub fn blocked(&self) -> (Vec<String>, u64) {
        self.proxy.as_ref().map(|p| p.blocked()).unwrap_or_default()
    }

    /// Confines the calling thread to this cell (Linux: Landlock; elsewhere the file tools'
    /// path checks alone).
    ///
    /// # Errors
    /// When the kernel refuses.
    pub fn restrict_thread(&self) -> Result<(), String> {
        #[cfg(target_os = "linux")]
        {
            linux::restrict_thread(&self.policy, self.run_as)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(())
        }
    }
}

/// Lists `dir` for [`etc_grants`]: names and, for symbolic links, their canonical targets.
fn list_dir(dir: &Path) -> Option<Vec<ListedEntry>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut out: Vec<ListedEntry> = entries
        .filter_map(Result::ok)
        .map(|entry| {
            let path = entry.path();
            let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
            ListedEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                link_target: is_link
                    .then(|| path.canonicalize().ok())
                    .flatten()
                    .map(|t| t.to_string_lossy().into_owned()),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Some(out)
}
