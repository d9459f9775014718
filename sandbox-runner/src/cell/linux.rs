//! A cell on Linux (decision 0023). The runner starts its own binary as `wuhu-runner
//! cell-exec SPEC -- PROGRAM ARGS…` in the call's process group; that process, single-threaded
//! and holding nothing of the runner's (no token, no credentials: a fresh exec with the
//! command's environment only):
//!
//! 1. makes a user namespace (the same uid and gid inside; none when the session runs as its
//!    own uid, `run_as`: the process is root then and becomes that uid last), a mount namespace, a PID namespace,
//!    and a network namespace unless the network is `open`; with one, brings `lo` up and, for an
//!    `allow` network, listens on [`PROXY_PORT`] there and relays every connection to the
//!    runner's proxy through a Unix socket (the namespace has no other way out);
//! 2. forks the command's first process, PID 1 of the new PID namespace: it mounts a `/proc` of
//!    that namespace (the runner and other cells are not in it), the call's temp dir on `/tmp`
//!    and an empty tmpfs on `/dev/shm`, sets the resource limits, drops every capability (and
//!    becomes the session's uid and group, without other groups, with `run_as`), sets
//!    `NO_NEW_PRIVS`, applies Landlock (files, abstract Unix sockets, signals) and a seccomp
//!    filter, and runs the program;
//! 3. waits for it and ends as it ended. When PID 1 ends, the kernel kills whatever else is
//!    left in its namespace, so a cell's processes never outlive its call.
//!
//! The file tools run in the runner itself, on a thread of their own that applies the same
//! Landlock rules ([`restrict_thread`]) before it touches a path.

use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};
use serde::{Deserialize, Serialize};
use wuhu_core::cell::{CellPolicy, Network};

/// The port the cell's relay to the runner's proxy listens on, on the cell's own loopback.
pub const PROXY_PORT: u16 = 3128;

/// The Landlock ABI cells need: 6 (signals and abstract Unix sockets scoped); older kernels are
/// refused at start unless `--sandbox off`.
pub const LANDLOCK_ABI: ABI = ABI::V6;

/// What `cell-exec` is told (as JSON in its first argument).
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct CellExec {
    /// What the cell may reach.
    pub policy: CellPolicy,
    /// The runner's proxy for this call (an `allow` network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_socket: Option<PathBuf>,
    /// The session's own uid and gid (`--isolate-uids`; the process is root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<u32>,
}

/// Whether this kernel can make cells: Landlock at [`LANDLOCK_ABI`] or newer, and user
/// namespaces.
///
/// # Errors
/// What is missing, for the runner's refusal to start.
pub fn probe(exe: &Path) -> Result<(), String> {
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(LANDLOCK_ABI))
        .and_then(|r| r.scope(Scope::from_all(LANDLOCK_ABI)))
        .and_then(|r| r.create());
    if let Err(e) = status {
        return Err(format!(
            "this kernel has no Landlock ABI {} or newer ({e}); cells need Linux 6.12 or newer",
            LANDLOCK_ABI as i32
        ));
    }
    // A user namespace in a child: unshare(2) is refused in a multithreaded process.
    let probe = std::process::Command::new(exe)
        .arg("cell-probe")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match probe {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "this machine refuses user namespaces ({}); cells need them (on Ubuntu, kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for wuhu-runner)",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot start the namespace probe: {e}")),
    }
}

/// `wuhu-runner cell-probe`: whether unsharing a user, mount and PID namespace works here.
pub fn probe_main() -> i32 {
    // SAFETY: unshare(2) in a single-threaded process.
    let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET;
    if unsafe { libc::unshare(flags) } != 0 {
        eprintln!("unshare: {}", std::io::Error::last_os_error());
        return 1;
    }
    0
}

/// The Landlock rules of `policy`, for a cell (`with_proc`: its own `/proc`, read-only) or a
/// file tool's thread.
fn ruleset(policy: &CellPolicy, with_proc: bool) -> Result<landlock::RulesetCreated, String> {
    let abi = LANDLOCK_ABI;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let mut read_only: Vec<&str> = policy.read_only.iter().map(String::as_str).collect();
    if with_proc {
        read_only.push("/proc");
    }
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(&read_only, read)))
        .and_then(|r| r.add_rules(path_beneath_rules(&policy.read_write, all)))
        .and_then(|r| r.add_rules(path_beneath_rules(&policy.devices, all)))
        .map_err(|e| format!("landlock: {e}"))
}

/// Confines the calling thread (only it: Landlock is per thread) to `policy`'s paths, and with
/// `run_as` makes it touch files as the session's uid and group (its file-system ids, also per
/// thread; no other groups). The file tools call this on a thread made for the call, before
/// they touch a path.
///
/// # Errors
/// When Landlock or the kernel refuses; the tool then refuses to run.
pub fn restrict_thread(policy: &CellPolicy, run_as: Option<u32>) -> Result<(), String> {
    if let Some(id) = run_as {
        // Raw system calls: libc's setgroups changes every thread of the process.
        // SAFETY: setgroups(0, NULL), setfsgid and setfsuid act on the calling thread only.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
                return Err(format!("setgroups: {}", std::io::Error::last_os_error()));
            }
            libc::setfsgid(id);
            libc::setfsuid(id);
            // Each returns the ids before the call: asking again tells whether they took.
            if libc::setfsgid(id) != id as i32 || libc::setfsuid(id) != id as i32 {
                return Err(format!("could not touch files as uid {id} on this thread"));
            }
        }
    }
    let status = ruleset(policy, false)?
        .restrict_self()
        .map_err(|e| format!("landlock: {e}"))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(String::from(
            "landlock is not fully enforced on this thread",
        ));
    }
    Ok(())
}

/// `wuhu-runner cell-exec SPEC -- PROGRAM ARGS…`: runs PROGRAM in the cell SPEC describes;
/// returns the exit code (or ends by the signal that ended PROGRAM).
pub fn cell_exec_main(args: &[OsString]) -> i32 {
    match cell_exec(args) {
        Ok(code) => code,
        Err(e) => {
            // The output pipe is the call's: the message reaches the model.
            eprintln!("wuhu: cannot make the cell: {e}");
            125
        }
    }
}

fn cell_exec(args: &[OsString]) -> Result<i32, String> {
    let (spec, rest) = args
        .split_first()
        .ok_or_else(|| String::from("no cell spec"))?;
    let exec: CellExec =
        serde_json::from_slice(spec.as_bytes()).map_err(|e| format!("bad cell spec: {e}"))?;
    let program = match rest {
        [dashes, program, ..] if dashes == "--" => program,
        _ => return Err(String::from("usage: cell-exec SPEC -- PROGRAM ARGS…")),
    };
    let argv: Vec<CString> = rest[1..]
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| String::from("argument with NUL")))
        .collect::<Result<_, _>>()?;
    let program = CString::new(program.as_bytes()).map_err(|_| String::from("program with NUL"))?;
    let policy = &exec.policy;
    let own_net = policy.network != Network::Open;

    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    if exec.run_as.is_some() && uid != 0 {
        return Err(String::from(
            "a cell with its own uid needs a runner started as root",
        ));
    }
    // The kernel exempts uid 0 from RLIMIT_NPROC: a runner started as root bounds its cells'
    // processes with a pids cgroup instead (while this process lives, it removes it after).
    let cgroup = if uid == 0 {
        PidsCgroup::join(policy.limits.processes)
    } else {
        None
    };
    // A session with its own uid needs no user namespace: this process is root in the
    // machine's, and PID 1 becomes that uid once the mounts are made.
    let mut flags = if exec.run_as.is_some() {
        libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS
    };
    if own_net {
        flags |= libc::CLONE_NEWNET;
    }
    // SAFETY: unshare(2) in this single-threaded process (a fresh exec; no thread started yet).
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    if exec.run_as.is_none() {
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
        write_file("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    }
    // The relay of an `allow` network: ended when the command ends (it would die with this
    // process anyway, but while it lives the pids cgroup below cannot be removed).
    let mut relay: Option<libc::pid_t> = None;
    if own_net {
        loopback_up()?;
        if let (Network::Allow(_), Some(socket)) = (&policy.network, &exec.proxy_socket) {
            let listener = std::net::TcpListener::bind(("127.0.0.1", PROXY_PORT))
                .map_err(|e| format!("proxy relay: {e}"))?;
            // The relay is a process of its own, in the cell's network namespace but not in
            // its PID namespace: a process that unshared a PID namespace cannot start threads.
            // SAFETY: fork(2) in this single-threaded process.
            match unsafe { libc::fork() } {
                -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
                0 => {
                    // SAFETY: prctl in the child; it dies with this process.
                    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
                    relay_connections(listener, socket.clone());
                    // SAFETY: _exit in the forked child.
                    unsafe { libc::_exit(0) };
                }
                pid => {
                    relay = Some(pid);
                    drop(listener);
                }
            }
        }
    }
    // SAFETY: unshare(2) in this single-threaded process: its next child is PID 1 of a new
    // PID namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fork(2) in a single-threaded process; the child only makes system calls and
    // allocates before exec (no lock can be held by another thread: there is none).
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        let e = enter_and_exec(policy, exec.run_as, &program, &argv);
        eprintln!("wuhu: cannot make the cell: {e}");
        // SAFETY: _exit in the forked child.
        unsafe { libc::_exit(125) };
    }
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
        }
    }
    if let Some(relay) = relay {
        // SAFETY: kill and waitpid on our own child.
        unsafe {
            libc::kill(relay, libc::SIGKILL);
            libc::waitpid(relay, std::ptr::null_mut(), 0);
        }
    }
    if let Some(cgroup) = cgroup {
        cgroup.leave();
    }
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        // End the same way, without a core file of this process.
        // SAFETY: plain signal and rlimit calls on ourselves.
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
        }
        return Ok(128 + signal);
    }
    Ok(libc::WEXITSTATUS(status))
}

/// In PID 1 of the cell: mounts, limits, capabilities, Landlock, seccomp, exec. Returns only on
/// failure.
fn enter_and_exec(
    policy: &CellPolicy,
    run_as: Option<u32>,
    program: &CString,
    argv: &[CString],
) -> String {
    let run = || -> Result<(), String> {
        mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
        mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        )?;
        // `/tmp` becomes the call's temp dir, unless a path of the cell lies below `/tmp`
        // (it would be hidden under the mount; then programs use `TMPDIR`).
        let under_tmp = |p: &String| wuhu_core::cell::is_within(p, "/tmp");
        let bind_tmp = Path::new("/tmp").is_dir()
            && !policy.read_write.iter().any(under_tmp)
            && !policy.read_only.iter().any(under_tmp);
        if bind_tmp {
            mount(
                Some(&policy.temp_dir),
                "/tmp",
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )?;
        }
        if Path::new("/dev/shm").is_dir() {
            mount(
                Some("tmpfs"),
                "/dev/shm",
                Some("tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some("size=67108864,mode=1777"),
            )?;
        }
        set_limits(policy)?;
        drop_capabilities(run_as)?;
        let mut policy = policy.clone();
        if bind_tmp {
            // `/tmp` is the temp dir now, at its own path too.
            policy.read_write.push(String::from("/tmp"));
        }
        policy.read_write.push(String::from("/dev/shm"));
        let status = ruleset(&policy, true)?
            .restrict_self()
            .map_err(|e| format!("landlock: {e}"))?;
        if status.ruleset != RulesetStatus::FullyEnforced {
            return Err(String::from("landlock is not fully enforced"));
        }
        apply_seccomp()?;
        Ok(())
    };
    if let Err(e) = run() {
        return e;
    }
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // SAFETY: execv with NUL-terminated strings and a NULL-terminated array; the environment
    // is this process's (the command's, as the runner set it).
    unsafe { libc::execv(program.as_ptr(), pointers.as_ptr()) };
    format!(
        "cannot run {}: {}",
        program.to_string_lossy(),
        std::io::Error::last_os_error()
    )
}

/// A cgroup of the pids controller that this process (and so its cell) joined.
struct PidsCgroup {
    base: PathBuf,
    dir: PathBuf,
}

/// The prefix of cells' cgroups: `wuhu-cell-<runner pid>-<cell pid>`.
pub const CGROUP_PREFIX: &str = "wuhu-cell-";

/// The pids controller's hierarchy: cgroup v1's `/sys/fs/cgroup/pids`, or cgroup v2's root
/// when it hands `pids` to its children.
pub fn pids_hierarchy() -> Option<PathBuf> {
    let v1 = Path::new("/sys/fs/cgroup/pids");
    if v1.join("cgroup.procs").exists() {
        return Some(v1.to_path_buf());
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let has = |file: &str| {
        std::fs::read_to_string(v2.join(file))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == "pids"))
    };
    (has("cgroup.controllers") && has("cgroup.subtree_control")).then(|| v2.to_path_buf())
}

impl PidsCgroup {
    fn join(max: u64) -> Option<PidsCgroup> {
        let base = pids_hierarchy()?;
        // SAFETY: getppid/getpid cannot fail.
        let (runner, me) = unsafe { (libc::getppid(), libc::getpid()) };
        let dir = base.join(format!("{CGROUP_PREFIX}{runner}-{me}"));
        std::fs::create_dir(&dir).ok()?;
        let joined = std::fs::write(dir.join("pids.max"), max.to_string())
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), me.to_string()));
        if joined.is_err() {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(PidsCgroup { base, dir })
    }

    /// Moves this process back to the hierarchy's root and removes the cgroup (empty now: the
    /// cell's PID 1 has ended, and the kernel killed the rest of its namespace).
    fn leave(self) {
        // SAFETY: getpid cannot fail.
        let me = unsafe { libc::getpid() };
        let _ = std::fs::write(self.base.join("cgroup.procs"), me.to_string());
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Removes the (empty) cgroups of cells of the runner process `runner` that were killed before
/// they could remove their own.
pub fn remove_cell_cgroups(runner: u32) {
    let Some(base) = pids_hierarchy() else {
        return;
    };
    let prefix = format!("{CGROUP_PREFIX}{runner}-");
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

fn write_file(path: &str, text: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{path}: {e}"))
}

fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s}: NUL in a path"));
    let source = source.map(c).transpose()?;
    let target_c = c(target)?;
    let fstype = fstype.map(c).transpose()?;
    let data = data.map(c).transpose()?;
    let ptr = |o: &Option<CString>| o.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: mount(2) with valid C strings or NULL.
    let r = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if r != 0 {
        return Err(format!(
            "mount {target}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn set_limits(policy: &CellPolicy) -> Result<(), String> {
    let limits = [
        (libc::RLIMIT_NPROC, policy.limits.processes, "processes"),
        (libc::RLIMIT_NOFILE, policy.limits.open_files, "open files"),
        (
            libc::RLIMIT_FSIZE,
            policy.limits.file_size_bytes,
            "file size",
        ),
        (libc::RLIMIT_CPU, policy.limits.cpu_seconds, "cpu time"),
    ];
    for (resource, value, what) in limits {
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit with a valid struct.
        unsafe { libc::getrlimit(resource, &mut current) };
        // Never above what the runner itself may (raising a hard limit needs a capability).
        let value = value.min(current.rlim_max);
        let limit = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(format!("limit {what}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Empties every capability set (a runner started as root runs cells as root in their user
/// namespace, which would otherwise hold every capability there), becomes `run_as` (uid and
/// gid, no other groups) when given, and sets `NO_NEW_PRIVS`.
fn drop_capabilities(run_as: Option<u32>) -> Result<(), String> {
    // SAFETY: prctl, setgroups, setresgid, setresuid and capset with valid arguments, in the
    // single-threaded PID 1 of the cell.
    unsafe {
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        // After the bounding set (dropping it needs CAP_SETPCAP) and before the capability
        // sets are emptied (changing ids needs CAP_SETUID/CAP_SETGID): leaving uid 0 empties
        // the permitted and effective sets too.
        if let Some(id) = run_as {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(id, id, id) != 0
                || libc::setresuid(id, id, id) != 0
            {
                return Err(format!(
                    "becoming uid {id}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            if libc::getuid() != id || libc::geteuid() != id || libc::getegid() != id {
                return Err(format!("still not uid {id}"));
            }
        }
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = Header {
            version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
            pid: 0,
        };
        let data = [
            Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
            Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
            return Err(format!("capset: {}", std::io::Error::last_os_error()));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// System calls a cell never needs and that reach past it: other processes' memory
/// (`ptrace`, `process_vm_*`), the kernel's keyrings, BPF, perf, userfaultfd, io_uring,
/// modules, kexec, swap, reboot, accounting, mounts and new or other namespaces. Each fails with
/// `EPERM`.
fn denied_syscalls() -> Vec<i64> {
    vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
    ]
}

fn apply_seccomp() -> Result<(), String> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};
    let rules = denied_syscalls().into_iter().map(|n| (n, vec![])).collect();
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp: {e:?}"))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    let program: BpfProgram = filter.try_into().map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))
}

/// Brings the namespace's loopback up (`ip link set lo up`).
fn loopback_up() -> Result<(), String> {
    // SAFETY: a datagram socket and SIOCGIFFLAGS/SIOCSIFFLAGS on `lo` with a zeroed ifreq.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if r == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            r = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if r != 0 {
            return Err(format!("loopback up: {e}"));
        }
    }
    Ok(())
}

/// Relays each connection to the cell's `127.0.0.1:PROXY_PORT` to the runner's proxy socket.
fn relay_connections(listener: std::net::TcpListener, socket: PathBuf) {
    for stream in listener.incoming() {
        let Ok(tcp) = stream else { continue };
        let socket = socket.clone();
        std::thread::spawn(move || {
            let Ok(unix) = std::os::unix::net::UnixStream::connect(&socket) else {
                return;
            };
            let (Ok(mut tcp_in), Ok(mut unix_out)) = (tcp.try_clone(), unix.try_clone()) else {
                return;
            };
            let up = std::thread::spawn(move || {
                copy_until_eof(&mut tcp_in, &mut unix_out);
                let _ = unix_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut unix_in, mut tcp_out) = (unix, tcp);
            copy_until_eof(&mut unix_in, &mut tcp_out);
            let _ = tcp_out.shutdown(std::net::Shutdown::Write);
            let _ = up.join();
        });
    }
}

fn copy_until_eof(from: &mut impl Read, to: &mut impl Write) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
