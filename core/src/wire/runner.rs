//! The runner protocol: the frames a `wuhu-runner` and the runner hub exchange over one
//! WebSocket. **API Boundary**: this module is the single source of truth for both sides;
//! `docs/runner-protocol.md` shows one example of each message.
//!
//! # Brief overview
//!
//! * Transport: the runner dials `GET {server}`[`RUNNER_CONNECT_PATH`] (`http` → `ws`,
//!   `https` → `wss`) with `Authorization: Bearer <runner token>`. A bad token is an HTTP 401
//!   on the upgrade, not a frame.
//! * Framing: one JSON object per WebSocket **text** frame, at most [`MAX_FRAME_BYTES`],
//!   discriminated by `"type"` (snake_case); field names are camelCase. Binary frames are not
//!   used.
//! * Handshake: the runner sends [`RunnerMessage::Hello`] first; the server answers
//!   [`ServerMessage::Welcome`] or [`ServerMessage::Refused`] (then closes).
//! * Liveness: the runner sends [`RunnerMessage::Heartbeat`] every `heartbeatSeconds`; the server
//!   answers each with [`ServerMessage::HeartbeatAck`]. Both frames are byte-exact constants
//!   ([`HEARTBEAT_FRAME`], [`HEARTBEAT_ACK_FRAME`]) so a hibernating Durable Object can answer
//!   with an auto-response without waking up.
//! * Requests: the server sends `attach`, `detach`, `validate`, `tool_call` and `cancel`, each
//!   with an `id` chosen by the server and unique per connection; the runner answers with the
//!   matching `*_result` carrying the same `id`. Replies may arrive out of order.
//! * Stateless runner: `tool_call`, `detach` and `validate` carry the [`EnvironmentContext`]
//!   the session stored from `attach_result`, so a runner that restarts or reconnects needs no
//!   re-registration of sessions; it only needs the files to still be there.
//! * Errors: a frame that cannot be decoded (see [`decode_frame`]) is answered with an `error`
//!   frame (carrying the request `id` when one could be read) and the connection stays open.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::cell::CellSettings;

/// Version of this protocol, sent in `hello`. The server refuses other versions with code
/// [`codes::UNSUPPORTED_VERSION`].
pub const RUNNER_PROTOCOL_VERSION: u32 = 1;

/// Path of the WebSocket endpoint, relative to the server's base URL.
pub const RUNNER_CONNECT_PATH: &str = "/v1/runners/connect";

/// Largest frame either side accepts, in bytes of UTF-8 text: Cloudflare's limit on one
/// WebSocket message in production. The server closes a connection that sends more (code
/// [`CLOSE_FRAME_TOO_LARGE`]) without parsing the frame.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Largest frame the server accepts before it has welcomed the runner: room for a `hello`
/// (and `heartbeat`), nothing more, so an unauthenticated-in-spirit socket costs little.
pub const MAX_FRAME_BYTES_BEFORE_WELCOME: usize = 8 * 1024;

/// WebSocket close code the server uses for a frame over its limit (RFC 6455 "message too big").
pub const CLOSE_FRAME_TOO_LARGE: u16 = 1009;

/// Largest `tool_result.content` the server passes on to a session, in bytes. The runner keeps
/// at most [`crate::tools::MAX_OUTPUT_BYTES`] of output plus short notes; anything longer is cut
/// by [`RunnerMessage::bound_tool_result`].
pub const MAX_TOOL_RESULT_CONTENT_BYTES: usize = 64 * 1024;

/// Largest `tool_result.details`, as JSON, the server passes on; larger details are replaced by
/// `{"detailsDropped": <bytes>}`.
pub const MAX_TOOL_RESULT_DETAILS_BYTES: usize = 8 * 1024;

/// Largest `agentsMd` the runner sends; a longer AGENTS.md is cut at a char boundary and
/// `agentsMdTruncated` is set.
pub const AGENTS_MD_MAX_BYTES: usize = 64 * 1024;

/// The files an environment's root is read for, in order: the first that exists is its
/// agent instructions (`AGENTS.md`, else the `CLAUDE.md` many repositories keep instead).
pub const AGENTS_FILES: [&str; 2] = ["AGENTS.md", "CLAUDE.md"];

/// Most blobs one `tool_result` may refer to; more are dropped by
/// [`RunnerMessage::bound_tool_result`].
pub const MAX_BLOBS_PER_RESULT: usize = 1;

/// A short-lived permission to upload one blob straight to storage (`crate::blobs`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UploadSlot {
    /// The blob's id; its URI is `wuhu://blob/<blobId>`.
    pub blob_id: String,
    /// `PUT` the bytes here with `Content-Type` and `Content-Length`. Relative (`/v1/…`):
    /// resolve it against the server URL the runner connected to; absolute: a presigned
    /// S3 URL, used as it is.
    pub url: String,
    /// Largest body the URL accepts.
    pub max_bytes: u64,
    /// Unix milliseconds after which the URL is refused.
    pub expires_at_ms: u64,
}

/// Heartbeat period a server should offer in `welcome` unless it has a reason to differ.
pub const DEFAULT_HEARTBEAT_SECONDS: u32 = 15;

/// The exact text of every heartbeat frame the runner sends.
pub const HEARTBEAT_FRAME: &str = r#"{"type":"heartbeat"}"#;

/// The exact text of every heartbeat acknowledgement the server sends.
pub const HEARTBEAT_ACK_FRAME: &str = r#"{"type":"heartbeat_ack"}"#;

/// Capability strings a runner may list in `hello`: one per tool it executes, and one per
/// environment kind it can materialise.
pub mod capabilities {
    /// The `bash` tool.
    pub const BASH: &str = "bash";
    /// The `read` tool.
    pub const READ: &str = "read";
    /// The `write` tool.
    pub const WRITE: &str = "write";
    /// The `edit` tool.
    pub const EDIT: &str = "edit";
    /// The `ls` tool.
    pub const LS: &str = "ls";
    /// The `find` tool.
    pub const FIND: &str = "find";
    /// The `grep` tool.
    pub const GREP: &str = "grep";
    /// Can attach `local` environments.
    pub const ENV_LOCAL: &str = "environment:local";
    /// Can attach `folder-template` environments.
    pub const ENV_FOLDER_TEMPLATE: &str = "environment:folder-template";
    /// Can attach `worktree` environments.
    pub const ENV_WORKTREE: &str = "environment:worktree";
    /// The environment tools, in the order the runner lists them.
    pub const TOOLS: [&str; 7] = [BASH, READ, WRITE, EDIT, LS, FIND, GREP];
    /// Runs `bash {background: true}` as a job and answers `job_status` / `job_kill`
    /// (see [`super::jobs`]).
    pub const BACKGROUND_JOBS: &str = "bash:background";
    /// Runs every call of a session in a cell ([`crate::cell`]).
    pub const SANDBOX_ON: &str = "sandbox:on";
    /// Started with `--sandbox off`: calls run with the runner's own view of the machine.
    pub const SANDBOX_OFF: &str = "sandbox:off";
    /// Starts the stdio MCP servers an environment's definition lists and answers
    /// [`super::mcp::TOOL`] calls (see [`super::mcp`]).
    pub const MCP_STDIO: &str = "mcp:stdio";

    /// What a runner's capabilities say of its sandbox (`None` for runners older than cells).
    pub fn sandbox(capabilities: &[String]) -> Option<super::SandboxMode> {
        if capabilities.iter().any(|c| c == SANDBOX_OFF) {
            Some(super::SandboxMode::Off)
        } else if capabilities.iter().any(|c| c == SANDBOX_ON) {
            Some(super::SandboxMode::On)
        } else {
            None
        }
    }
}

pub mod mcp;

/// Background jobs: `bash {command, background: true}` answers at once with a job id; the
/// runner keeps the process (it outlives the connection, not the runner process) and sends an
/// `event` named [`jobs::FINISHED_EVENT`] with a [`JobReport`] when it ends. `job_status {id}`
/// and `job_kill {id}` arrive as `tool_call`s of those names. The rules the session applies to
/// what it hears are `crate::jobs`'.
pub mod jobs {
    /// The `event` name of a finished job; its `data` is a [`super::JobReport`].
    pub const FINISHED_EVENT: &str = "job_finished_v1";
    /// The `tool_call` tool that answers a job's state (`arguments: {id}`).
    pub const STATUS_TOOL: &str = "job_status";
    /// The `tool_call` tool that kills a job's process group (`arguments: {id}`).
    pub const KILL_TOOL: &str = "job_kill";
    /// Jobs running at once on one runner; a start beyond it is refused.
    pub const MAX_RUNNING_PER_RUNNER: usize = 32;
    /// Jobs running at once for one session on one runner; a start beyond it is refused.
    pub const MAX_RUNNING_PER_SESSION: usize = 8;
    /// Finished jobs a runner remembers (for `job_status` and redelivery); the oldest is
    /// forgotten first, with its output file.
    pub const MAX_FINISHED_KEPT: usize = 64;
    /// Lines of output a [`super::JobReport`]'s `outputTail` keeps at most.
    pub const TAIL_LINES: usize = 200;
    /// Bytes of output a [`super::JobReport`]'s `outputTail` keeps at most.
    pub const TAIL_BYTES: usize = 16 * 1024;
    /// Bytes a job's output file on the runner holds at most: when its output reaches this, the
    /// file is cut to its last [`LOG_KEEP_BYTES`] after a line saying how much was dropped.
    pub const MAX_LOG_BYTES: u64 = 16 * 1024 * 1024;
    /// Bytes of a job's output kept when its file is cut (see [`MAX_LOG_BYTES`]).
    pub const LOG_KEEP_BYTES: u64 = 8 * 1024 * 1024;
    /// `details.unknownJob` of a `job_status` / `job_kill` answer for a job this runner process
    /// does not know (it never ran it, or it restarted since, or forgot it).
    pub const UNKNOWN_JOB: &str = "unknownJob";
}

/// Between the runner hub and a session actor (`POST /job_event`, never from outside): a
/// runner reported the end of a job of that session. The session heeds it only for a job it
/// started on that very runner (`runner`, `runnerOwner`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct JobEvent {
    /// The reporting runner's name.
    pub runner: String,
    /// Its owner (from its token).
    pub runner_owner: String,
    /// What it reported.
    pub report: JobReport,
}

/// Between the runner hub and a session actor (`POST /tool_output`, never from outside): the
/// output of a call the session waits for, as its runner sent it in `tool_progress` frames
/// (`crate::tool_output`). The hub relays a call's frames in order, to the session that made
/// the call, and only while it waits for the call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ToolOutputRelay {
    /// The `tool_call`'s id (the session's runner call, not the model's tool call id).
    pub runner_call_id: String,
    /// Which output.
    pub stream: OutputStream,
    /// The text.
    pub text: String,
}

/// How a background job stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Its process runs.
    Running,
    /// It exited with code 0.
    Succeeded,
    /// It exited with another code, or was killed by a signal or its timeout; or (the
    /// session's conclusion, never a runner's) its runner went away: the runner process died
    /// or restarted, or stayed disconnected (`wuhu_core::jobs::observe`). Read from `lost`
    /// too, the name such an end had before.
    #[serde(alias = "lost")]
    Failed,
    /// `job_kill` killed it.
    Killed,
}

impl JobState {
    /// Whether the job is over.
    pub fn is_finished(self) -> bool {
        self != JobState::Running
    }

    /// The name on the wire (`running`, `succeeded`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Killed => "killed",
        }
    }
}

/// What a runner says about a job: the `data` of a [`jobs::FINISHED_EVENT`] event, and the
/// `details.job` of a `job_status` / `job_kill` answer (there without `outputTail`, which is
/// the answer's `content`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    /// The runner's id for it (`job-` and 16 hex digits).
    pub job_id: String,
    /// The command line, cut to 200 bytes.
    pub command: String,
    /// Where it stands.
    pub state: JobState,
    /// Exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Killed by its own `timeout`.
    #[serde(default)]
    pub timed_out: bool,
    /// Unix ms when it started.
    pub started_at_ms: u64,
    /// How long it ran (so far, while running), ms.
    pub duration_ms: u64,
    /// Lines of output in all.
    #[serde(default)]
    pub total_lines: u64,
    /// The tail of its output ([`jobs::TAIL_LINES`] lines / [`jobs::TAIL_BYTES`] at most).
    #[serde(default)]
    pub output_tail: String,
    /// Whether `outputTail` is only the tail; the whole output is in `fullOutputPath`, which
    /// the session's `read` pages.
    #[serde(default)]
    pub truncated: bool,
    /// The file with the whole output, on the runner, when it was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_output_path: Option<String>,
}

/// Error and refusal codes used in `error`, `refused` and failed results.
pub mod codes {
    /// The frame was not a JSON object with a string `type`.
    pub const MALFORMED_FRAME: &str = "malformed_frame";
    /// The frame's `type` is not one this side knows.
    pub const UNKNOWN_TYPE: &str = "unknown_type";
    /// The `type` is known but the fields do not fit it.
    pub const INVALID_MESSAGE: &str = "invalid_message";
    /// The frame is larger than [`super::MAX_FRAME_BYTES`].
    pub const FRAME_TOO_LARGE: &str = "frame_too_large";
    /// Binary frames are not part of the protocol.
    pub const BINARY_FRAME: &str = "binary_frame";
    /// Refusal: the `hello` version is not [`super::RUNNER_PROTOCOL_VERSION`]. Permanent.
    pub const UNSUPPORTED_VERSION: &str = "unsupported_version";
    /// Refusal: the token is not a runner token, or is expired. Permanent.
    pub const UNAUTHORIZED: &str = "unauthorized";
    /// Refusal: a live connection of the same owner already serves this runner name (a second
    /// runner, or one using a stolen token). Transient: the runner retries with backoff, so a
    /// runner whose old connection died unnoticed gets in once the hub drops it; `register
    /// --replace` takes over at once.
    pub const NAME_IN_USE: &str = "name_in_use";
    /// Refusal, on a live connection: another connection of the same owner and name took over
    /// with `register --replace`. Permanent: the runner prints it and stops.
    pub const REPLACED: &str = "replaced";
    /// Refusal: the runner name is bound to a key and this `hello` proves none (a copy of the
    /// token alone). Permanent.
    pub const KEY_REQUIRED: &str = "key_required";
    /// Refusal: the `hello`'s key is not the one the name is bound to, or its signature does not
    /// verify. Permanent.
    pub const KEY_MISMATCH: &str = "key_mismatch";
    /// Refusal: the runner name belongs to another user of the tenant (one of their runners is
    /// connected with it, or was seen recently). Permanent: start with another `--name`.
    pub const NAME_TAKEN: &str = "name_taken";
    /// Refusal: the runner would be one more name than its owner (64) or the tenant (1,024) may
    /// hold (`wuhu_core::hub::MAX_RUNNER_ROWS_PER_OWNER`). Permanent: reuse a name, or free
    /// one with `DELETE /v1/runners/:owner/:name`.
    pub const TOO_MANY_RUNNERS: &str = "too_many_runners";
    /// Refusal: the runner's owner or an admin freed its name (`DELETE
    /// /v1/runners/:owner/:name`) while it was connected. Permanent.
    pub const RUNNER_REMOVED: &str = "runner_removed";
    /// Refusal: the first frame was not `hello`. Permanent.
    pub const HELLO_REQUIRED: &str = "hello_required";
    /// Result error: a cloud workspace was not saved (or hydrated) because another runner has
    /// it; the runner keeps its local copy and names it in the message.
    pub const STORE_CONFLICT: &str = "store_conflict";
    /// Result error: the runner's workspace store (S3) failed; the message says what and where
    /// the local copy is.
    pub const STORE_FAILED: &str = "store_failed";
    /// Result error: the tool name is unknown to this runner.
    pub const UNKNOWN_TOOL: &str = "unknown_tool";
    /// Result error: the environment kind is not supported by this runner.
    pub const UNSUPPORTED_ENVIRONMENT: &str = "unsupported_environment";
    /// Result error: the spec or context cannot work as given (a template containing the
    /// workspaces root, a worktree context without `repoPath`).
    pub const INVALID_SPEC: &str = "invalid_spec";
    /// Result error: a path named by the spec does not exist or is not usable.
    pub const NOT_FOUND: &str = "not_found";
    /// Result error: a path named by the spec is outside the directories the runner offers
    /// (its `--env` directories and `--workspaces-root`); the runner's `--allow-any-path`
    /// lifts this.
    pub const PATH_NOT_ALLOWED: &str = "path_not_allowed";
    /// Result error: the folder-template startup script failed; the message has its output.
    pub const STARTUP_SCRIPT_FAILED: &str = "startup_script_failed";
    /// Result error: a `git` command failed; the message has its output.
    pub const GIT_FAILED: &str = "git_failed";
    /// Result error: anything else that went wrong on the runner.
    pub const INTERNAL: &str = "internal";

    /// Whether a runner should stop (rather than reconnect) after a `refused` with `code`.
    pub fn refusal_is_permanent(code: &str) -> bool {
        code != NAME_IN_USE
    }
}

/// Where a runner lives. The runner says it in `hello`, but the server registers the kind its
/// token allows (claim `runnerKind`, `local` unless `cloud`). Sessions choose runners by this
/// (`preference: local|cloud|any`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunnerKind {
    /// A person's own machine.
    #[default]
    Local,
    /// A machine in the cloud.
    Cloud,
}

impl RunnerKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerKind::Local => "local",
            RunnerKind::Cloud => "cloud",
        }
    }
}

/// The response header of the runner WebSocket upgrade that carries the hub's nonce for this
/// connection: the runner signs it with its key in `hello` (decision 0024).
pub const HELLO_NONCE_HEADER: &str = "x-wuhu-hello-nonce";

/// A runner's key in `hello`: its Ed25519 public key and its signature over
/// [`hello_signing_input`], both base64url without padding.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HelloKey {
    /// The raw 32-byte Ed25519 public key.
    pub public_key: String,
    /// The 64-byte Ed25519 signature.
    pub signature: String,
}

/// What a runner signs to say hello as `name` on the connection whose nonce is `nonce`: the
/// nonce is the hub's, new per connection, so a signature is good for one connection only.
pub fn hello_signing_input(nonce: &str, name: &str) -> String {
    format!("wuhu-runner-hello-v1\n{nonce}\n{name}")
}

/// Whether a runner confines each session's commands and file tools in a cell
/// ([`crate::cell`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Every call runs in a cell (the default).
    On,
    /// `--sandbox off`: calls run with the runner's own view of the machine.
    Off,
}

impl SandboxMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::On => "on",
            SandboxMode::Off => "off",
        }
    }
}

pub use super::environment_kind::EnvironmentKind;

/// An environment a runner offers by itself (`--env NAME=PATH`), listed in `hello`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OfferedEnvironment {
    /// Name chosen by the owner.
    pub name: String,
    /// Absolute path on the runner.
    pub path: String,
}

/// What to materialise: the resolved environment definition the server sends in `attach`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSpec {
    /// The environment's name within the session (what the `environment` tool argument names).
    pub name: String,
    /// Kind and kind-specific fields, flattened (`"kind": "worktree", "repoPath": ...`).
    #[serde(flatten)]
    pub source: EnvironmentSource,
    /// Variable names the definition adds to the snapshot whitelist. Secret-looking names are
    /// never captured even when listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_env_vars: Vec<String>,
    /// The definition's cell: network, read-only paths, resource limits
    /// ([`crate::cell`]).
    #[serde(default, skip_serializing_if = "CellSettings::is_default")]
    pub cell: CellSettings,
}

/// The kind-specific part of an [`EnvironmentSpec`], tagged by `kind`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum EnvironmentSource {
    /// An existing directory on the runner, used in place.
    Local {
        /// Absolute path; it must exist.
        path: String,
    },
    /// A template copied to `<workspaces root>/<sessionId>` (suffix `-N` when taken).
    FolderTemplate {
        /// Absolute path of the template directory on the runner.
        template_path: String,
        /// Run in the copy with `bash -c 'set -euo pipefail; <script>'`; failure fails the
        /// attach with the script's output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        startup_script: Option<String>,
    },
    /// `git worktree add -b wuhu/<session short id> <workspaces root>/<...> <baseRef>`.
    Worktree {
        /// Absolute path of a git repository on the runner.
        repo_path: String,
        /// Commit-ish to branch from; `HEAD` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_ref: Option<String>,
    },
}

impl EnvironmentSource {
    /// The kind of this source.
    pub fn kind(&self) -> EnvironmentKind {
        match self {
            EnvironmentSource::Local { .. } => EnvironmentKind::Local,
            EnvironmentSource::FolderTemplate { .. } => EnvironmentKind::FolderTemplate,
            EnvironmentSource::Worktree { .. } => EnvironmentKind::Worktree,
        }
    }
}

/// The working context captured at attach (seed 004): tools run with this cwd and exactly
/// these environment variables.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Absolute working directory for tools.
    pub cwd: String,
    /// Whitelisted variables of the runner's environment; never a secret-looking name.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Unix seconds.
    pub captured_at: i64,
}

/// Everything a runner needs to run a tool in an attached environment. The session stores it
/// from `attach_result` and sends it back with every `tool_call`, `detach` and `validate`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentContext {
    /// The environment's name within the session.
    pub name: String,
    /// Its kind; decides the path policy (absolute paths outside the root only for `local`).
    pub kind: EnvironmentKind,
    /// Absolute, canonical root directory on the runner.
    pub root: String,
    /// The captured working context.
    pub snapshot: Snapshot,
    /// `worktree` only: the repository the worktree belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_path: Option<String>,
    /// `worktree` only: the branch created for the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The cell the definition asked for at attach ([`crate::cell`]).
    #[serde(default, skip_serializing_if = "CellSettings::is_default")]
    pub cell: CellSettings,
}

/// A materialised environment, as `attach_result` reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AttachedEnvironment {
    /// The environment's name within the session.
    pub name: String,
    /// Its kind.
    pub kind: EnvironmentKind,
    /// Absolute, canonical root directory on the runner.
    pub root: String,
    /// Display name of the runner's OS (`macOS`, `Linux`, ...), for the transcript.
    pub os: String,
    /// `worktree` only: the repository the worktree belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_path: Option<String>,
    /// `worktree` only: the branch created for the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The captured working context.
    pub snapshot: Snapshot,
    /// Content of `AGENTS.md` at the root, if present, at most [`AGENTS_MD_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_md: Option<String>,
    /// Whether `agentsMd` was cut to [`AGENTS_MD_MAX_BYTES`].
    #[serde(default, skip_serializing_if = "is_false")]
    pub agents_md_truncated: bool,
    /// Which file `agentsMd` is ([`AGENTS_FILES`]: `CLAUDE.md` when the root has no
    /// `AGENTS.md`); absent means `AGENTS.md` (runners before this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_md_file: Option<String>,
    /// The cell the definition asked for ([`crate::cell`]); sent back with every call (boxed:
    /// attachments are moved around whole, and most cells are the default).
    #[serde(default, skip_serializing_if = "CellSettings::is_default")]
    pub cell: Box<CellSettings>,
}

impl AttachedEnvironment {
    /// The file its agent instructions came from (`AGENTS.md` or `CLAUDE.md`).
    pub fn agents_file(&self) -> &str {
        self.agents_md_file.as_deref().unwrap_or(AGENTS_FILES[0])
    }
}

impl AttachedEnvironment {
    /// The part a session sends back with later requests.
    pub fn context(&self) -> EnvironmentContext {
        EnvironmentContext {
            name: self.name.clone(),
            kind: self.kind,
            root: self.root.clone(),
            snapshot: self.snapshot.clone(),
            repo_path: self.repo_path.clone(),
            branch: self.branch.clone(),
            cell: (*self.cell).clone(),
        }
    }
}

/// `{code, message}`: a failure inside a result, or the body of `refused`/`error`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// One of [`codes`] (open set: unknown codes are treated as [`codes::INTERNAL`]).
    pub code: String,
    /// Human-readable, lowercase, no trailing period; may span lines (script output).
    pub message: String,
}

impl ErrorBody {
    /// Builds an error body.
    pub fn new(code: &str, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code: code.to_string(),
            message: message.into(),
        }
    }
}

/// Outcome of an `attach`: `"ok": {"environment": ...}` or `"error": {code, message}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AttachOutcome {
    /// Materialised.
    Ok {
        /// The environment.
        environment: AttachedEnvironment,
    },
    /// Not materialised; nothing is left behind on the runner.
    Error(ErrorBody),
}

/// Outcome of a `detach`: `"ok": {...}` or `"error": {code, message}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DetachOutcome {
    /// Detached.
    Ok {
        /// Whether the runner deleted the environment's directory (a worktree is removed; a
        /// local directory or a folder-template copy is kept).
        removed: bool,
        /// `worktree` only: the branch, which is kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<String>,
        /// `worktree` only: the commit the worktree was at when removed (its branch holds it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head: Option<String>,
    },
    /// Detaching failed (the session should still consider it detached).
    Error(ErrorBody),
}

/// A runner a session attached a `folder-template` environment on, as the hub answered the
/// session's attach (its owner's `sub` and its name): told to discard the session's workspaces
/// when the session is deleted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceHost {
    /// The runner's owner.
    pub owner: String,
    /// The runner's name.
    pub runner: String,
}

/// `POST /discard` on the runner hub (internal, from a session's deletion): keep a pending
/// discard of `sessionId` for each host, and send it to those connected.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiscardWorkspacesRequest {
    /// The deleted session.
    pub session_id: String,
    /// The runners it recorded.
    pub hosts: Vec<WorkspaceHost>,
}

/// Answer to [`DiscardWorkspacesRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiscardWorkspacesResponse {
    /// Pending discards kept (each until its runner answers `ok`).
    pub pending: usize,
    /// Of those, sent now (the runner was connected).
    pub sent: usize,
    /// Hosts that are no runner of the tenant any more (not told).
    pub unknown: Vec<WorkspaceHost>,
}

/// Outcome of a `discard_workspaces`: `"ok": {...}` or `"error": {code, message}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DiscardOutcome {
    /// Everything of the session is gone from this runner's store and disk (also when there
    /// was nothing).
    Ok {
        /// Objects deleted from the runner's store (manifests, leases and contents).
        objects: u64,
        /// Local copies (directories) deleted.
        local: u64,
    },
    /// Something is left; the server keeps the request and sends it again when the runner
    /// connects next (or at its next liveness sweep).
    Error(ErrorBody),
}

/// What became stale in a snapshot since it was captured.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum StaleKind {
    /// The working directory no longer exists.
    Cwd,
    /// `VIRTUAL_ENV` points at a directory that no longer exists.
    VirtualEnv,
    /// An entry of `PATH` no longer exists.
    PathEntry,
}

/// One stale item found by snapshot validation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StaleItem {
    /// What is stale.
    pub kind: StaleKind,
    /// The path that no longer exists.
    pub path: String,
}

impl StaleItem {
    /// A one-line description for a transcript notice.
    pub fn describe(&self) -> String {
        match self.kind {
            StaleKind::Cwd => format!("working directory {} no longer exists", self.path),
            StaleKind::VirtualEnv => format!("VIRTUAL_ENV {} no longer exists", self.path),
            StaleKind::PathEntry => format!("PATH entry {} no longer exists", self.path),
        }
    }
}

/// Frames the runner sends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum RunnerMessage {
    /// First frame on every connection. The server answers `welcome` or `refused`.
    Hello {
        /// [`RUNNER_PROTOCOL_VERSION`].
        version: u32,
        /// The runner's name, unique per owner (`--name`).
        name: String,
        /// `local` or `cloud`.
        kind: RunnerKind,
        /// Display name of the OS (`macOS`, `Linux`).
        os: String,
        /// CPU architecture (`aarch64`, `x86_64`).
        arch: String,
        /// See [`capabilities`].
        capabilities: Vec<String>,
        /// Environments the owner offers on this runner (`--env NAME=PATH`).
        environments: Vec<OfferedEnvironment>,
        /// Software version of the runner, for diagnostics.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runner_version: Option<String>,
        /// `wuhu-runner register --replace`: take the name over from a live connection of the
        /// same owner (without it, such a `hello` is refused `name_in_use`).
        #[serde(default, skip_serializing_if = "is_false")]
        replace: bool,
        /// The runner's key and its signature over [`hello_signing_input`] (the hub's nonce
        /// from the upgrade's [`HELLO_NONCE_HEADER`]): the name is bound to the key at its
        /// first registration, and later hellos must prove it (decision 0024).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<HelloKey>,
    },
    /// Sent every `heartbeatSeconds`; always exactly [`HEARTBEAT_FRAME`].
    Heartbeat {},
    /// Answer to `attach`.
    AttachResult {
        /// The `attach` id.
        id: String,
        /// Materialised environment or error.
        #[serde(flatten)]
        outcome: AttachOutcome,
    },
    /// Answer to `detach`.
    DetachResult {
        /// The `detach` id.
        id: String,
        /// Outcome.
        #[serde(flatten)]
        outcome: DetachOutcome,
    },
    /// Answer to `validate`: what is stale (empty when all is well).
    ValidateResult {
        /// The `validate` id.
        id: String,
        /// Stale items, in the order cwd, VIRTUAL_ENV, PATH entries.
        stale: Vec<StaleItem>,
    },
    /// Answer to `tool_call` (also after `cancel`, with `isError` and `details.cancelled`).
    ToolResult {
        /// The `tool_call` id.
        id: String,
        /// Text for the model, already truncated with a continuation hint.
        content: String,
        /// Whether the call failed (bad arguments, refused path, non-zero exit, timeout, ...).
        is_error: bool,
        /// Structured extras (`exitCode`, `timedOut`, `truncated`, `fullOutputPath`, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<serde_json::Value>,
        /// What the runner uploaded with the call's [`UploadSlot`] (at most
        /// [`MAX_BLOBS_PER_RESULT`]): the server checks each against storage before the
        /// transcript refers to it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        blobs: Vec<crate::wire::BlobRef>,
    },
    /// Answer to `discard_workspaces`: the server forgets the request once the outcome is `ok`.
    DiscardResult {
        /// The `discard_workspaces` id.
        id: String,
        /// The deleted session.
        session_id: String,
        /// Outcome.
        #[serde(flatten)]
        outcome: DiscardOutcome,
    },
    /// Output of a `tool_call` still running (`bash`): what it printed since the last frame,
    /// masked of the session's secrets, coalesced and bounded by the runner
    /// (`crate::tool_output`: at most one frame per [`crate::tool_output::PROGRESS_INTERVAL_MS`]
    /// per call, text of at most [`crate::tool_output::MAX_PROGRESS_TEXT_BYTES`], at most
    /// [`crate::tool_output::MAX_PROGRESS_BYTES_PER_CALL`] per call). Not an answer: the
    /// call's `tool_result` still comes, and is the source of truth. The server relays it to
    /// the session whose call it is, and drops one for a call nobody waits for.
    ToolProgress {
        /// The running `tool_call`'s id.
        id: String,
        /// Which output it is.
        stream: OutputStream,
        /// The text (whole UTF-8 characters; may begin with a marker of skipped bytes).
        text: String,
    },
    /// An asynchronous notification not tied to a request (reserved for async completions).
    Event {
        /// A versioned event name such as `log_v1`.
        name: String,
        /// The session it concerns, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
        /// The environment it concerns, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        environment: Option<String>,
        /// Free-form details.
        #[serde(default)]
        data: serde_json::Value,
    },
    /// A request or frame the runner could not handle (`id` when the frame carried one).
    Error {
        /// The offending request's id, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// See [`codes`].
        code: String,
        /// Human-readable.
        message: String,
    },
}

/// Which output of a running command a [`RunnerMessage::ToolProgress`] carries.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// Both, interleaved as the command wrote them (`bash` runs its command with stdout and
    /// stderr on one pipe, so their order is kept, as in its result).
    Combined,
}

/// Secret values a call's commands get as environment variables, by name. `Debug` shows the
/// names only, so a logged message never carries a value.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretEnv(pub BTreeMap<String, String>);

impl SecretEnv {
    /// Whether the call gets no secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Frames the server (runner hub) sends.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum ServerMessage {
    /// The `hello` was accepted.
    Welcome {
        /// Server-side id of this runner (stable across reconnects of the same name).
        runner_id: String,
        /// How often the runner sends `heartbeat`; the server may drop a runner silent for
        /// three periods.
        heartbeat_seconds: u32,
        /// The kind the server registered this runner as: its token's (`runnerKind` claim),
        /// never what `hello` said. Absent from servers older than this field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<RunnerKind>,
        /// Something the person running the runner should know, e.g. that `hello` said `cloud`
        /// but the token allows only `local`. The runner prints it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice: Option<String>,
        /// The runner's sandbox as registered (from its `hello` capabilities; `GET /v1/runners`
        /// shows it too).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<SandboxMode>,
        /// The server relays [`RunnerMessage::ToolProgress`]: the runner sends it only when
        /// this is set (an older server would answer each with an `unknown_type` error).
        #[serde(default, skip_serializing_if = "is_false")]
        tool_progress: bool,
    },
    /// The `hello` was refused; the server closes the connection after this frame.
    Refused {
        /// See [`codes`] and [`codes::refusal_is_permanent`].
        code: String,
        /// Human-readable reason, shown to the person running the runner.
        message: String,
    },
    /// Answer to every `heartbeat`; always exactly [`HEARTBEAT_ACK_FRAME`].
    HeartbeatAck {},
    /// Materialise an environment for a session; answered by `attach_result`.
    Attach {
        /// Request id.
        id: String,
        /// The session (a UUID); names the per-session workspace and branch.
        session_id: String,
        /// What to materialise.
        spec: EnvironmentSpec,
    },
    /// Release a session's environment; answered by `detach_result`.
    Detach {
        /// Request id.
        id: String,
        /// The session.
        session_id: String,
        /// The context from `attach_result`.
        environment: EnvironmentContext,
    },
    /// Check a stored snapshot (after a reconnect or resume); answered by `validate_result`.
    Validate {
        /// Request id.
        id: String,
        /// The session.
        session_id: String,
        /// The context from `attach_result`.
        environment: EnvironmentContext,
    },
    /// Run a tool; answered by `tool_result`.
    ToolCall {
        /// Request id (may be the LLM's tool call id).
        id: String,
        /// The session.
        session_id: String,
        /// The context from `attach_result`; the tool runs with its cwd, env and root.
        environment: EnvironmentContext,
        /// `bash`, `read`, `write`, `edit`, `ls`, `find` or `grep`.
        tool: String,
        /// The tool's arguments as the model gave them (minus `environment`).
        arguments: serde_json::Value,
        /// Hard deadline for the whole call; the runner kills it and answers with an error.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Where the runner may upload one blob of this call (output too long for the
        /// transcript, an image it read), instead of sending it over this socket.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upload: Option<UploadSlot>,
        /// Secrets this call's commands get as environment variables (the definition's
        /// `secrets`, chosen for whom the turn acts for): kept in memory for this call only,
        /// and masked in everything the call sends back.
        #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
        secret_env: SecretEnv,
    },
    /// Stop the `tool_call` with this id; its `tool_result` follows (or already went).
    Cancel {
        /// The `tool_call` id.
        id: String,
    },
    /// The session was deleted (decision 0017): delete everything this runner keeps of it, its
    /// stored workspaces (`<prefix>/workspaces/<sessionId>/`) and its local copies; answered by
    /// `discard_result`. Sent by the hub alone (never through a session's `/call`), to the
    /// runners the session attached a `folder-template` environment on, when they connect,
    /// until they answer `ok`.
    DiscardWorkspaces {
        /// Request id.
        id: String,
        /// The deleted session (a UUID).
        session_id: String,
    },
    /// A frame the server could not handle.
    Error {
        /// The offending frame's id, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// See [`codes`].
        code: String,
        /// Human-readable.
        message: String,
    },
}

/// A message type of one direction of the protocol.
pub trait Frame: Serialize + DeserializeOwned {
    /// Every `type` value of this direction.
    const TYPES: &'static [&'static str];
}

impl Frame for RunnerMessage {
    const TYPES: &'static [&'static str] = &[
        "hello",
        "heartbeat",
        "attach_result",
        "detach_result",
        "validate_result",
        "tool_result",
        "tool_progress",
        "discard_result",
        "event",
        "error",
    ];
}

impl Frame for ServerMessage {
    const TYPES: &'static [&'static str] = &[
        "welcome",
        "refused",
        "heartbeat_ack",
        "attach",
        "detach",
        "validate",
        "tool_call",
        "cancel",
        "discard_workspaces",
        "error",
    ];
}

/// Why a frame could not be decoded.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The frame is larger than [`MAX_FRAME_BYTES`].
    #[error("frame of {len} bytes exceeds the {max} byte limit")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not JSON, not an object, or no string `type`.
    #[error("malformed frame: {reason}")]
    Malformed {
        /// What was wrong.
        reason: String,
    },
    /// A `type` this side does not know.
    #[error("unknown message type {ty:?}")]
    UnknownType {
        /// The `type`.
        ty: String,
        /// The frame's `id`, if it had a string one.
        id: Option<String>,
    },
    /// A known `type` whose fields do not fit.
    #[error("invalid {ty} message: {reason}")]
    Invalid {
        /// The `type`.
        ty: String,
        /// The frame's `id`, if it had a string one.
        id: Option<String>,
        /// The decoder's complaint.
        reason: String,
    },
}

impl ProtocolError {
    /// The code for the `error` frame that answers this.
    pub fn code(&self) -> &'static str {
        match self {
            ProtocolError::TooLarge { .. } => codes::FRAME_TOO_LARGE,
            ProtocolError::Malformed { .. } => codes::MALFORMED_FRAME,
            ProtocolError::UnknownType { .. } => codes::UNKNOWN_TYPE,
            ProtocolError::Invalid { .. } => codes::INVALID_MESSAGE,
        }
    }

    /// The id of the request the bad frame carried, so the answer can be correlated.
    pub fn id(&self) -> Option<&str> {
        match self {
            ProtocolError::UnknownType { id, .. } | ProtocolError::Invalid { id, .. } => {
                id.as_deref()
            }
            _ => None,
        }
    }
}

/// Decodes one text frame of either direction (`decode_frame::<ServerMessage>(text)`).
///
/// Never panics, whatever the input (serde_json bounds nesting depth).
///
/// # Errors
///
/// [`ProtocolError`] when the frame is too large, not a JSON object with a string `type`, of an
/// unknown `type`, or of a known `type` with fields that do not fit.
pub fn decode_frame<M: Frame>(text: &str) -> Result<M, ProtocolError> {
    decode_frame_within(text, MAX_FRAME_BYTES)
}

/// Like [`decode_frame`], with a smaller limit (the server uses
/// [`MAX_FRAME_BYTES_BEFORE_WELCOME`] until it has welcomed the runner).
///
/// # Errors
///
/// As [`decode_frame`].
pub fn decode_frame_within<M: Frame>(text: &str, max: usize) -> Result<M, ProtocolError> {
    let max = max.min(MAX_FRAME_BYTES);
    if text.len() > max {
        return Err(ProtocolError::TooLarge {
            len: text.len(),
            max,
        });
    }
    // Straight into the typed message; only a frame that does not fit is looked at again, and
    // then only for its `type` and `id` (every other field is skipped, never built).
    let typed_error = match serde_json::from_str::<M>(text) {
        Ok(message) => return Ok(message),
        Err(e) => e,
    };
    let peek: Peek = serde_json::from_str(text).map_err(|e| ProtocolError::Malformed {
        reason: if e.is_data() {
            String::from("not a JSON object")
        } else {
            e.to_string()
        },
    })?;
    let Some(ty) = peek.ty.0 else {
        return Err(ProtocolError::Malformed {
            reason: String::from("missing string field \"type\""),
        });
    };
    let id = peek.id.0;
    if !M::TYPES.contains(&ty.as_str()) {
        return Err(ProtocolError::UnknownType { ty, id });
    }
    Err(ProtocolError::Invalid {
        ty,
        id,
        reason: typed_error.to_string(),
    })
}

/// The two fields an error answer needs; everything else in the frame is skipped.
#[derive(Deserialize)]
struct Peek {
    #[serde(rename = "type", default)]
    ty: StringOrSkip,
    #[serde(default)]
    id: StringOrSkip,
}

/// A JSON string, or `None` for any other value (skipped without being built).
#[derive(Default)]
struct StringOrSkip(Option<String>);

impl<'de> Deserialize<'de> for StringOrSkip {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct Skip;
        impl<'de> Visitor<'de> for Skip {
            type Value = StringOrSkip;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(Some(v.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(None))
            }
            fn visit_unit<E>(self) -> Result<StringOrSkip, E> {
                Ok(StringOrSkip(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StringOrSkip, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(StringOrSkip(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringOrSkip, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(StringOrSkip(None))
            }
        }
        deserializer.deserialize_any(Skip)
    }
}

impl RunnerMessage {
    /// Bounds a `tool_result` the way the server passes it on: `content` at most
    /// [`MAX_TOOL_RESULT_CONTENT_BYTES`] (cut at a char boundary, with a note saying so),
    /// `details` at most [`MAX_TOOL_RESULT_DETAILS_BYTES`] of JSON. Returns whether anything was
    /// cut. Other messages are left alone.
    pub fn bound_tool_result(&mut self) -> bool {
        let RunnerMessage::ToolResult {
            content,
            details,
            blobs,
            ..
        } = self
        else {
            return false;
        };
        let mut cut = false;
        if blobs.len() > MAX_BLOBS_PER_RESULT {
            blobs.truncate(MAX_BLOBS_PER_RESULT);
            cut = true;
        }
        for blob in blobs.iter_mut() {
            if let Some(preview) = &mut blob.preview
                && preview.len() > crate::blobs::PREVIEW_BYTES
            {
                *preview = crate::blobs::preview(preview);
                cut = true;
            }
        }
        if content.len() > MAX_TOOL_RESULT_CONTENT_BYTES {
            let total = content.len();
            let note = format!(
                "\n\n[The runner sent {total} bytes; the server keeps the first {} KB.]",
                MAX_TOOL_RESULT_CONTENT_BYTES / 1024
            );
            let mut end = MAX_TOOL_RESULT_CONTENT_BYTES - note.len();
            while !content.is_char_boundary(end) {
                end -= 1;
            }
            content.truncate(end);
            content.push_str(&note);
            cut = true;
        }
        if let Some(value) = details {
            let bytes = serde_json::to_string(value).map_or(usize::MAX, |t| t.len());
            if bytes > MAX_TOOL_RESULT_DETAILS_BYTES {
                *details = Some(serde_json::json!({ "detailsDropped": bytes }));
                cut = true;
            }
        }
        cut
    }
}

/// Encodes one frame as JSON text.
pub fn encode_frame<M: Frame>(message: &M) -> String {
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_string(message).unwrap_or_else(|_| String::from("{}"))
}

/// Display name of an OS as Rust's `std::env::consts::OS` spells it (`macos` → `macOS`).
pub fn os_display_name(os: &str) -> String {
    match os {
        "macos" => String::from("macOS"),
        "linux" => String::from("Linux"),
        "windows" => String::from("Windows"),
        "freebsd" => String::from("FreeBSD"),
        other => other.to_string(),
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot() -> Snapshot {
        Snapshot {
            cwd: String::from("/Users/ana/src/api"),
            env: BTreeMap::from([(String::from("PATH"), String::from("/usr/bin:/bin"))]),
            captured_at: 1_767_225_600,
        }
    }

    fn context() -> EnvironmentContext {
        EnvironmentContext {
            name: String::from("api"),
            kind: EnvironmentKind::Worktree,
            root: String::from("/Users/ana/.wuhu/workspaces/s1"),
            snapshot: snapshot(),
            repo_path: Some(String::from("/Users/ana/src/api")),
            branch: Some(String::from("wuhu/0f3c2a1b")),
            cell: crate::cell::CellSettings {
                network: Some(crate::cell::Network::Allow(vec![String::from(
                    "github.com",
                )])),
                read_only_paths: vec![String::from("/opt/rust")],
                limits: crate::cell::LimitOverrides {
                    processes: Some(256),
                    ..Default::default()
                },
            },
        }
    }

    fn attached() -> AttachedEnvironment {
        AttachedEnvironment {
            name: String::from("api"),
            kind: EnvironmentKind::Local,
            root: String::from("/Users/ana/src/api"),
            os: String::from("macOS"),
            repo_path: None,
            branch: None,
            snapshot: snapshot(),
            agents_md: Some(String::from("# Rules\n")),
            agents_md_truncated: false,
            agents_md_file: None,
            cell: Default::default(),
        }
    }

    fn runner_messages() -> Vec<RunnerMessage> {
        vec![
            RunnerMessage::Hello {
                version: RUNNER_PROTOCOL_VERSION,
                name: String::from("ana-mac"),
                kind: RunnerKind::Local,
                os: String::from("macOS"),
                arch: String::from("aarch64"),
                capabilities: vec![String::from("bash"), String::from("environment:local")],
                environments: vec![OfferedEnvironment {
                    name: String::from("api"),
                    path: String::from("/Users/ana/src/api"),
                }],
                runner_version: Some(String::from("0.1.0")),
                replace: true,
                key: Some(HelloKey {
                    public_key: String::from("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"),
                    signature: String::from("sig"),
                }),
            },
            RunnerMessage::Heartbeat {},
            RunnerMessage::AttachResult {
                id: String::from("a1"),
                outcome: AttachOutcome::Ok {
                    environment: attached(),
                },
            },
            RunnerMessage::AttachResult {
                id: String::from("a2"),
                outcome: AttachOutcome::Error(ErrorBody::new(
                    codes::STARTUP_SCRIPT_FAILED,
                    "startup script exited with code 1",
                )),
            },
            RunnerMessage::DetachResult {
                id: String::from("d1"),
                outcome: DetachOutcome::Ok {
                    removed: true,
                    branch: Some(String::from("wuhu/0f3c2a1b")),
                    head: Some(String::from("9f1c2e3d4b5a69788796a5b4c3d2e1f0a9b8c7d6")),
                },
            },
            RunnerMessage::DetachResult {
                id: String::from("d2"),
                outcome: DetachOutcome::Error(ErrorBody::new(codes::GIT_FAILED, "boom")),
            },
            RunnerMessage::ValidateResult {
                id: String::from("v1"),
                stale: vec![StaleItem {
                    kind: StaleKind::VirtualEnv,
                    path: String::from("/x/.venv"),
                }],
            },
            RunnerMessage::ToolResult {
                id: String::from("t1"),
                content: String::from("hi\n"),
                is_error: false,
                details: Some(json!({"exitCode": 0})),
                blobs: Vec::new(),
            },
            RunnerMessage::ToolResult {
                id: String::from("t2"),
                content: String::from("no"),
                is_error: true,
                details: None,
                blobs: Vec::new(),
            },
            RunnerMessage::Event {
                name: String::from("log_v1"),
                session_id: Some(String::from("s1")),
                environment: None,
                data: json!({"line": "x"}),
            },
            RunnerMessage::Error {
                id: None,
                code: String::from(codes::MALFORMED_FRAME),
                message: String::from("bad"),
            },
            RunnerMessage::DiscardResult {
                id: String::from("x1"),
                session_id: String::from("s1"),
                outcome: DiscardOutcome::Ok {
                    objects: 12,
                    local: 1,
                },
            },
            RunnerMessage::ToolProgress {
                id: String::from("t3"),
                stream: OutputStream::Combined,
                text: String::from("Compiling wuhu v0.1.0\n"),
            },
            RunnerMessage::DiscardResult {
                id: String::from("x2"),
                session_id: String::from("s1"),
                outcome: DiscardOutcome::Error(ErrorBody::new(codes::STORE_FAILED, "boom")),
            },
        ]
    }

    fn server_messages() -> Vec<ServerMessage> {
        vec![
            ServerMessage::Welcome {
                runner_id: String::from("r1"),
                heartbeat_seconds: 15,
                kind: Some(RunnerKind::Local),
                notice: Some(String::from(
                    "this runner said kind \"cloud\" but its token allows only \"local\"",
                )),
                sandbox: Some(SandboxMode::Off),
                tool_progress: true,
            },
            ServerMessage::Refused {
                code: String::from(codes::UNSUPPORTED_VERSION),
                message: String::from("protocol version 9 is not supported"),
            },
            ServerMessage::HeartbeatAck {},
            ServerMessage::Attach {
                id: String::from("a1"),
                session_id: String::from("s1"),
                spec: EnvironmentSpec {
                    name: String::from("api"),
                    source: EnvironmentSource::Local {
                        path: String::from("/Users/ana/src/api"),
                    },
                    extra_env_vars: vec![],
                    cell: Default::default(),
                },
            },
            ServerMessage::Attach {
                id: String::from("a2"),
                session_id: String::from("s1"),
                spec: EnvironmentSpec {
                    name: String::from("web"),
                    source: EnvironmentSource::FolderTemplate {
                        template_path: String::from("/srv/templates/web"),
                        startup_script: Some(String::from("npm ci")),
                    },
                    extra_env_vars: vec![String::from("JAVA_HOME")],
                    cell: crate::cell::CellSettings {
                        network: Some(crate::cell::Network::None),
                        ..Default::default()
                    },
                },
            },
            ServerMessage::Attach {
                id: String::from("a3"),
                session_id: String::from("s1"),
                spec: EnvironmentSpec {
                    name: String::from("repo"),
                    source: EnvironmentSource::Worktree {
                        repo_path: String::from("/srv/repo"),
                        base_ref: None,
                    },
                    extra_env_vars: vec![],
                    cell: Default::default(),
                },
            },
            ServerMessage::Detach {
                id: String::from("d1"),
                session_id: String::from("s1"),
                environment: context(),
            },
            ServerMessage::Validate {
                id: String::from("v1"),
                session_id: String::from("s1"),
                environment: context(),
            },
            ServerMessage::ToolCall {
                id: String::from("t1"),
                session_id: String::from("s1"),
                environment: context(),
                tool: String::from("bash"),
                arguments: json!({"command": "echo hi"}),
                timeout_ms: Some(60_000),
                upload: None,
                secret_env: SecretEnv::default(),
            },
            ServerMessage::ToolCall {
                id: String::from("t2"),
                session_id: String::from("s1"),
                environment: context(),
                tool: String::from("bash"),
                arguments: json!({"command": "git push"}),
                timeout_ms: None,
                upload: None,
                secret_env: SecretEnv(BTreeMap::from([(
                    String::from("GITHUB_TOKEN"),
                    String::from("ghp_value"),
                )])),
            },
            ServerMessage::Cancel {
                id: String::from("t1"),
            },
            ServerMessage::DiscardWorkspaces {
                id: String::from("x1"),
                session_id: String::from("s1"),
            },
            ServerMessage::Error {
                id: Some(String::from("x")),
                code: String::from(codes::UNKNOWN_TYPE),
                message: String::from("?"),
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for message in runner_messages() {
            let text = encode_frame(&message);
            assert_eq!(decode_frame::<RunnerMessage>(&text), Ok(message), "{text}");
        }
        for message in server_messages() {
            let text = encode_frame(&message);
            assert_eq!(decode_frame::<ServerMessage>(&text), Ok(message), "{text}");
        }
    }

    /// A call's secrets travel as `secretEnv` (absent when none) and never show in `Debug`.
    #[test]
    fn secret_values_travel_but_never_print() {
        let messages = server_messages();
        let with = messages
            .iter()
            .find(|m| matches!(m, ServerMessage::ToolCall { secret_env, .. } if !secret_env.is_empty()))
            .unwrap();
        let json = serde_json::to_value(with).unwrap();
        assert_eq!(json["secretEnv"], json!({"GITHUB_TOKEN": "ghp_value"}));
        let debug = format!("{with:?}");
        assert!(
            debug.contains("GITHUB_TOKEN") && !debug.contains("ghp_value"),
            "{debug}"
        );
        let without = serde_json::to_value(
            &messages[messages
                .iter()
                .position(|m| matches!(m, ServerMessage::ToolCall { .. }))
                .unwrap()],
        )
        .unwrap();
        assert!(without.get("secretEnv").is_none(), "{without}");
    }

    #[test]
    fn every_type_is_listed() {
        for message in runner_messages() {
            let value = serde_json::to_value(&message).unwrap();
            let ty = value["type"].as_str().unwrap().to_string();
            assert!(RunnerMessage::TYPES.contains(&ty.as_str()), "{ty}");
        }
        for message in server_messages() {
            let value = serde_json::to_value(&message).unwrap();
            let ty = value["type"].as_str().unwrap().to_string();
            assert!(ServerMessage::TYPES.contains(&ty.as_str()), "{ty}");
        }
    }

    #[test]
    fn wire_shapes_are_exact() {
        assert_eq!(encode_frame(&RunnerMessage::Heartbeat {}), HEARTBEAT_FRAME);
        assert_eq!(
            encode_frame(&ServerMessage::HeartbeatAck {}),
            HEARTBEAT_ACK_FRAME
        );
        let attach = serde_json::to_value(&server_messages()[4]).unwrap();
        assert_eq!(
            attach,
            json!({"type": "attach", "id": "a2", "sessionId": "s1", "spec": {
                "name": "web", "kind": "folder-template", "templatePath": "/srv/templates/web",
                "startupScript": "npm ci", "extraEnvVars": ["JAVA_HOME"],
                "cell": {"network": "none"}}})
        );
        let result = serde_json::to_value(&runner_messages()[3]).unwrap();
        assert_eq!(
            result,
            json!({"type": "attach_result", "id": "a2", "error": {
                "code": "startup_script_failed", "message": "startup script exited with code 1"}})
        );
        let ok = serde_json::to_value(&runner_messages()[2]).unwrap();
        assert_eq!(ok["ok"]["environment"]["agentsMd"], "# Rules\n");
        assert_eq!(
            ok["ok"]["environment"]["snapshot"]["capturedAt"],
            1_767_225_600
        );
        let tool = serde_json::to_value(&runner_messages()[7]).unwrap();
        assert_eq!(tool["isError"], false);
        let progress = runner_messages()
            .into_iter()
            .find(|m| matches!(m, RunnerMessage::ToolProgress { .. }))
            .map(|m| serde_json::to_value(m).unwrap());
        assert_eq!(
            progress,
            Some(
                json!({"type": "tool_progress", "id": "t3", "stream": "combined",
                "text": "Compiling wuhu v0.1.0\n"})
            )
        );
        // A welcome from a server older than progress frames asks for none.
        let old_welcome: ServerMessage =
            decode_frame(r#"{"type":"welcome","runnerId":"r1","heartbeatSeconds":15}"#).unwrap();
        assert!(matches!(
            old_welcome,
            ServerMessage::Welcome {
                tool_progress: false,
                ..
            }
        ));
        assert_eq!(
            serde_json::to_value(&server_messages()[0]).unwrap()["toolProgress"],
            true
        );
        let discard = serde_json::to_value(ServerMessage::DiscardWorkspaces {
            id: String::from("x1"),
            session_id: String::from("s1"),
        })
        .unwrap();
        assert_eq!(
            discard,
            json!({"type": "discard_workspaces", "id": "x1", "sessionId": "s1"})
        );
        let discarded = runner_messages()
            .into_iter()
            .filter(|m| matches!(m, RunnerMessage::DiscardResult { .. }))
            .map(|m| serde_json::to_value(m).unwrap())
            .collect::<Vec<_>>();
        assert_eq!(
            discarded,
            vec![
                json!({"type": "discard_result", "id": "x1", "sessionId": "s1",
                    "ok": {"objects": 12, "local": 1}}),
                json!({"type": "discard_result", "id": "x2", "sessionId": "s1",
                    "error": {"code": "store_failed", "message": "boom"}}),
            ]
        );
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("", codes::MALFORMED_FRAME, None),
            ("not json", codes::MALFORMED_FRAME, None),
            ("[1,2]", codes::MALFORMED_FRAME, None),
            ("{}", codes::MALFORMED_FRAME, None),
            (r#"{"type":3}"#, codes::MALFORMED_FRAME, None),
            (
                r#"{"type":"nope","id":"q"}"#,
                codes::UNKNOWN_TYPE,
                Some("q"),
            ),
            (r#"{"type":"hello"}"#, codes::UNKNOWN_TYPE, None),
            (
                r#"{"type":"tool_call","id":"t9"}"#,
                codes::INVALID_MESSAGE,
                Some("t9"),
            ),
            (r#"{"type":"cancel","id":5}"#, codes::INVALID_MESSAGE, None),
            (
                r#"{"type":"attach","id":"a","sessionId":"s","spec":{"name":"x","kind":"moon"}}"#,
                codes::INVALID_MESSAGE,
                Some("a"),
            ),
        ];
        for (text, code, id) in cases {
            let err = decode_frame::<ServerMessage>(text).unwrap_err();
            assert_eq!((err.code(), err.id()), (*code, *id), "{text}");
        }
        let deep = "[".repeat(100_000);
        assert_eq!(
            decode_frame::<ServerMessage>(&deep).unwrap_err().code(),
            codes::MALFORMED_FRAME
        );
        let big = format!(
            r#"{{"type":"cancel","id":"{}"}}"#,
            "x".repeat(MAX_FRAME_BYTES)
        );
        assert_eq!(
            decode_frame::<ServerMessage>(&big).unwrap_err().code(),
            codes::FRAME_TOO_LARGE
        );
        assert_eq!(
            decode_frame::<RunnerMessage>(
                r#"{"type":"welcome","runnerId":"r","heartbeatSeconds":1}"#
            )
            .unwrap_err()
            .code(),
            codes::UNKNOWN_TYPE
        );
    }

    #[test]
    fn unknown_fields_are_ignored_for_forward_compatibility() {
        let text = r#"{"type":"cancel","id":"t1","reason":"user"}"#;
        assert_eq!(
            decode_frame::<ServerMessage>(text),
            Ok(ServerMessage::Cancel {
                id: String::from("t1")
            })
        );
    }

    #[test]
    fn frames_are_bounded_at_exactly_the_limit() {
        for max in [MAX_FRAME_BYTES_BEFORE_WELCOME, MAX_FRAME_BYTES] {
            let frame = |len: usize| {
                let shell = r#"{"type":"heartbeat","pad":""}"#.len();
                format!(
                    r#"{{"type":"heartbeat","pad":"{}"}}"#,
                    "x".repeat(len - shell)
                )
            };
            assert_eq!(
                decode_frame_within::<RunnerMessage>(&frame(max), max),
                Ok(RunnerMessage::Heartbeat {})
            );
            let err = decode_frame_within::<RunnerMessage>(&frame(max + 1), max).unwrap_err();
            assert_eq!(err, ProtocolError::TooLarge { len: max + 1, max });
            assert_eq!(err.code(), codes::FRAME_TOO_LARGE);
        }
        // A limit above the protocol's is the protocol's.
        let huge = format!(
            r#"{{"type":"heartbeat","pad":"{}"}}"#,
            "x".repeat(MAX_FRAME_BYTES)
        );
        assert_eq!(
            decode_frame_within::<RunnerMessage>(&huge, usize::MAX)
                .unwrap_err()
                .code(),
            codes::FRAME_TOO_LARGE
        );
    }

    #[test]
    fn an_undecodable_frame_keeps_its_string_id_whatever_else_it_holds() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                r#"{"id":"x","type":"nope","p":[[[1]],{"a":[null]}]}"#,
                codes::UNKNOWN_TYPE,
                Some("x"),
            ),
            (
                r#"{"type":"tool_result","id":{"no":"string"}}"#,
                codes::INVALID_MESSAGE,
                None,
            ),
            (
                r#"{"type":["tool_result"],"id":"y"}"#,
                codes::MALFORMED_FRAME,
                None,
            ),
            (r#"{"type":null}"#, codes::MALFORMED_FRAME, None),
            (r#""just a string""#, codes::MALFORMED_FRAME, None),
            (
                r#"{"type":"tool_result","id":"z","content":7,"isError":false}"#,
                codes::INVALID_MESSAGE,
                Some("z"),
            ),
        ];
        for (text, code, id) in cases {
            let err = decode_frame::<RunnerMessage>(text).unwrap_err();
            assert_eq!((err.code(), err.id()), (*code, *id), "{text}: {err}");
        }
    }

    fn tool_result(content: String, details: Option<serde_json::Value>) -> RunnerMessage {
        RunnerMessage::ToolResult {
            id: String::from("t"),
            content,
            is_error: false,
            details,
            blobs: Vec::new(),
        }
    }

    #[test]
    fn tool_results_are_bounded_at_the_limit_and_cut_on_a_char_boundary() {
        for len in [
            0,
            MAX_TOOL_RESULT_CONTENT_BYTES - 1,
            MAX_TOOL_RESULT_CONTENT_BYTES,
            MAX_TOOL_RESULT_CONTENT_BYTES + 1,
            3 * MAX_TOOL_RESULT_CONTENT_BYTES,
        ] {
            // Three-byte characters, so most cut points fall inside one.
            for text in ["x".repeat(len), "€".repeat(len / 3 + 1)] {
                let original = text.clone();
                let mut message = tool_result(text, None);
                let cut = message.bound_tool_result();
                let RunnerMessage::ToolResult { content, .. } = &message else {
                    unreachable!()
                };
                assert!(content.len() <= MAX_TOOL_RESULT_CONTENT_BYTES, "{len}");
                assert_eq!(cut, original.len() > MAX_TOOL_RESULT_CONTENT_BYTES, "{len}");
                if cut {
                    let (kept, note) = content.split_once("\n\n[The runner sent").unwrap();
                    assert!(original.starts_with(kept));
                    assert!(note.contains(&original.len().to_string()), "{note}");
                } else {
                    assert_eq!(*content, original);
                }
            }
        }
        let small = serde_json::json!({"exitCode": 0, "pad": "x".repeat(100)});
        let mut message = tool_result(String::new(), Some(small.clone()));
        assert!(!message.bound_tool_result());
        assert_eq!(message, tool_result(String::new(), Some(small)));
        let big = serde_json::json!({"pad": "x".repeat(MAX_TOOL_RESULT_DETAILS_BYTES)});
        let bytes = serde_json::to_string(&big).unwrap().len();
        let mut message = tool_result(String::new(), Some(big));
        assert!(message.bound_tool_result());
        assert_eq!(
            message,
            tool_result(
                String::new(),
                Some(serde_json::json!({"detailsDropped": bytes}))
            )
        );
        let mut other = RunnerMessage::Heartbeat {};
        assert!(!other.bound_tool_result());
    }

    #[test]
    fn refusals_that_may_clear_up_are_retried() {
        assert!(!codes::refusal_is_permanent(codes::NAME_IN_USE));
        assert!(codes::refusal_is_permanent(codes::UNSUPPORTED_VERSION));
        assert!(codes::refusal_is_permanent(codes::UNAUTHORIZED));
    }
}
