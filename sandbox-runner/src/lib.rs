//! # wuhu-runner
//!
//! The native host for Wuhu environments. A runner dials the server's runner hub over one
//! WebSocket (so it works behind NAT), says `hello`, and then materialises environments and runs
//! coding tools on request. The protocol lives in [`wuhu_core::wire::runner`].
//!
//! ## Brief overview
//!
//! * [`config`]: settings from `~/.wuhu/runner.yml` and command-line flags (flags win).
//! * [`client`]: the connection loop: connect, `hello`, heartbeats, dispatch, reconnect with
//!   [`backoff`].
//! * [`environment`]: materialising `local`, `folder-template` and `worktree` environments,
//!   reading AGENTS.md, and detaching.
//! * [`snapshot`]: capturing the working context (cwd and whitelisted variables, never a
//!   secret-looking one) and validating it later.
//! * [`executor`]: builds each tool call's context (cwd and env from the snapshot, a per-call
//!   temp dir, cancellation, deadline) and dispatches to [`tools`]. Tools never reach back into
//!   a session: everything they need arrives with the call (seed 003).
//! * [`jobs`]: background jobs (`bash {background: true}`, `job_status`, `job_kill`): they
//!   belong to the runner process and outlive its connections.
//! * [`service`]: `wuhu-runner service install | uninstall | status` (a launchd agent or a
//!   systemd unit running `register`, the token in a 0600 file).
//! * [`store`]: cloud workspaces on S3-compatible storage (`--store`): hydrate on attach, save
//!   on detach, on an interval and before exit.
//! * [`tools`]: `bash`, `read`, `write`, `edit`, `ls`, `find`, `grep` with Wuhu semantics.
//! * [`cell`]: every call of a session runs confined to its environment (Linux: namespaces,
//!   Landlock, seccomp; macOS: Seatbelt), with the network its definition names.
//! * [`key`]: the runner's Ed25519 key, which its name is bound to at the hub.
//! * [`private_dir`]: the runner's own directories, private to its user.
//! * [`secrets`]: the runner's token and store keys: private files, wiped from its environment,
//!   out of every cell's reach.
//!
//! The runner keeps no per-session state: every request carries the environment context the
//! session stored at attach, so a restarted runner serves old sessions as long as their files
//! are still there.
#![warn(missing_docs, unreachable_pub)]

pub mod backoff;
pub mod blob_upload;
pub mod cell;
pub mod client;
pub mod config;
pub mod environment;
pub mod executor;
pub mod jobs;
pub mod key;
pub mod mcp_servers;
pub mod private_dir;
pub mod progress;
pub mod secrets;
pub mod service;
pub mod session_secrets;
pub mod snapshot;
pub mod store;
pub mod tools;

/// Current Unix time in seconds.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
