//! The tools' names (a leaf: what counts a tool, `crate::llm::models`'s usage, names it
//! without the catalogue).

/// Lists the tenant's sessions.
pub const LIST_SESSIONS: &str = "list_sessions";
/// Reads another session's transcript.
pub const READ_SESSION: &str = "read_session";
/// Reads a file or a `wuhu://` document.
pub const READ: &str = "read";
/// Writes a file or a `wuhu://` document.
pub const WRITE: &str = "write";
/// Runs JavaScript in the session's QuickJS sandbox.
pub const JS: &str = "js";
/// Asks for an environment (a directory on a runner) to be attached.
pub const REQUEST_ENVIRONMENT: &str = "request_environment";
/// Detaches an environment.
pub const DETACH_ENVIRONMENT: &str = "detach_environment";
/// Runs a shell command in an environment.
pub const BASH: &str = "bash";
/// Replaces one exact text in a file of an environment.
pub const EDIT: &str = "edit";
/// Lists a directory of an environment.
pub const LS: &str = "ls";
/// Finds files by glob in an environment.
pub const FIND: &str = "find";
/// Searches file contents in an environment.
pub const GREP: &str = "grep";
/// Creates a child session with a task.
pub const SPAWN_SESSION: &str = "spawn_session";
/// Steers or follows up a child session.
pub const SEND_TO_SESSION: &str = "send_to_session";
/// Waits for child sessions to settle.
pub const WAIT_SESSIONS: &str = "wait_sessions";
/// Stops a child session.
pub const STOP_SESSION: &str = "stop_session";
/// Switches the session's provider and model.
pub const SET_MODEL: &str = "set_model";
/// Tells how a background job stands, with its output so far.
pub const JOB_STATUS: &str = "job_status";
/// Kills a background job's process group.
pub const JOB_KILL: &str = "job_kill";
/// The MCP servers a turn sees, and their tools (`crate::mcp_client`).
pub const MCP_TOOLS: &str = "mcp_tools";
/// Call a tool of an MCP server.
pub const MCP_CALL: &str = "mcp_call";
