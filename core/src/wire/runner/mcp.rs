//! Stdio MCP servers in an environment (issue 33): a definition lists them
//! (`"mcpServers": [{name, command, args, env}]`), the session's `mcp_*` tools reach each as
//! `<environment>/<server>`, and one MCP request travels to the runner as a `tool_call` of the
//! tool [`TOOL`] whose arguments are a [`McpRequest`]; the runner answers a `tool_result` whose
//! `details` is a [`McpResponse`] (or `isError` with the failure as `content`).
//!
//! The runner starts a server on its first request (in the environment's cell, with its
//! working directory and variables), keeps it for the attachment, restarts one that exited at
//! most [`MAX_RESTARTS`] times, and stops each (its whole process group) on `detach` and when
//! the runner exits (decision 0040).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The `tool_call` tool that carries one MCP request to a stdio server.
pub const TOOL: &str = "mcp_request";
/// Servers one definition may list.
pub const MAX_SERVERS: usize = 8;
/// Arguments one server's command may take.
pub const MAX_ARGS: usize = 64;
/// Variables one server's entry may set.
pub const MAX_ENV: usize = 64;
/// Most vault secrets one server may name.
pub const MAX_SECRETS: usize = 16;
/// Longest command, argument or variable value, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Longest JSON-RPC message read from a server (one line of its stdout); a longer one fails
/// the request it answers (as the HTTP client's answers, `crate::mcp_client::exchange`).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest result relayed to the session: a `tool_result` frame must stay within
/// [`super::MAX_FRAME_BYTES`], with room for the frame around it.
pub const MAX_RELAYED_RESULT_BYTES: usize = super::MAX_FRAME_BYTES - 16 * 1024;
/// Times a server that exited is started again for one attachment; after that its requests
/// fail until the environment is attached again.
pub const MAX_RESTARTS: u32 = 3;
/// Bytes of a server's stderr the runner keeps (the last ones), shown when it fails.
pub const STDERR_TAIL_BYTES: usize = 4 * 1024;
/// Seconds a request may take unless the call says otherwise.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 60;
/// A server no request used for this long is stopped by its runner (the next request starts it
/// again, counted as no restart).
pub const IDLE_STOP: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// Seconds `initialize` may take when a server starts.
pub const START_TIMEOUT_SECONDS: u32 = 60;

/// One stdio server of a definition, as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StdioServer {
    /// What sessions call it after the environment's name (`<environment>/<name>`): 1 to 32 of
    /// `a-z`, `0-9`, `-`, `_`, like a configured server's name.
    pub name: String,
    /// The program, found in the environment's `PATH` (or a path).
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables it gets besides the environment's snapshot (plain values: not for secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Vault secrets it gets as variables of their names, chosen by the rules a `bash` call's
    /// secrets pass (the definition, the runner's owner, the turn's acting-for set) on the
    /// request that starts it; the runner keeps their values only in the process's environment
    /// and masks them in everything the server answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// The `arguments` of a [`TOOL`] call: one request to one server of the environment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpRequest {
    /// The server, as the definition lists it (the runner keeps no definitions: it starts what
    /// the session sends, and starts it again when the entry changed).
    pub server: StdioServer,
    /// The JSON-RPC method (`tools/list`, `tools/call`, `resources/read`, ...).
    pub method: String,
    /// Its params.
    #[serde(default)]
    pub params: serde_json::Value,
    /// Seconds the request may take (the server's start not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

/// The `details` of a successful [`TOOL`] call's `tool_result`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpResponse {
    /// The JSON-RPC `result`.
    #[serde(default)]
    pub result: serde_json::Value,
    /// The JSON-RPC error, when the server answered one (`result` is then `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

/// A JSON-RPC error a server answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    /// Its code.
    pub code: i64,
    /// Its message.
    pub message: String,
}

/// Checks a definition's `mcpServers`.
///
/// # Errors
///
/// The first broken rule, naming the server and the field, as a message for a 400.
pub fn check_servers(servers: &[StdioServer]) -> Result<(), String> {
    if servers.len() > MAX_SERVERS {
        return Err(format!("mcpServers may list at most {MAX_SERVERS} servers"));
    }
    for (i, server) in servers.iter().enumerate() {
        let at = format!("mcpServers[{i}]");
        if !crate::mcp_client::documents::valid_server_name(&server.name) {
            return Err(format!(
                "{at}.name {:?} must be 1 to {} of a-z, 0-9, '-', '_', starting with a letter or digit",
                server.name,
                crate::mcp_client::documents::MAX_NAME_CHARS
            ));
        }
        if servers[..i].iter().any(|s| s.name == server.name) {
            return Err(format!("mcpServers lists {:?} twice", server.name));
        }
        let at = format!("mcpServers[{i}] ({:?})", server.name);
        check_text(&format!("{at}.command"), &server.command)?;
        if server.command.trim().is_empty() {
            return Err(format!("{at}.command must not be empty"));
        }
        if server.args.len() > MAX_ARGS {
            return Err(format!("{at}.args may list at most {MAX_ARGS} arguments"));
        }
        for arg in &server.args {
            check_text(&format!("{at}.args"), arg)?;
        }
        if server.env.len() > MAX_ENV {
            return Err(format!("{at}.env may set at most {MAX_ENV} variables"));
        }
        for (name, value) in &server.env {
            let mut bytes = name.bytes();
            let valid = name.len() <= 128
                && bytes
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(format!(
                    "{at}.env: {name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
                ));
            }
            check_text(&format!("{at}.env.{name}"), value)?;
        }
        if server.secrets.len() > MAX_SECRETS {
            return Err(format!(
                "{at}.secrets may name at most {MAX_SECRETS} secrets"
            ));
        }
        for (j, name) in server.secrets.iter().enumerate() {
            crate::secrets::name::check_name(name).map_err(|e| format!("{at}.secrets: {e}"))?;
            if server.secrets[..j].contains(name) {
                return Err(format!("{at}.secrets names {name:?} twice"));
            }
            if server.env.contains_key(name) {
                return Err(format!(
                    "{at}: {name:?} is both a plain variable (env) and a secret"
                ));
            }
        }
    }
    Ok(())
}

fn check_text(field: &str, text: &str) -> Result<(), String> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(format!("{field} exceeds {MAX_TEXT_BYTES} bytes"));
    }
    if text.contains('\0') {
        return Err(format!("{field} must not contain NUL"));
    }
    Ok(())
}

/// The name sessions call a stdio server by: `<environment>/<server>`.
pub fn qualified_name(environment: &str, server: &str) -> String {
    format!("{environment}/{server}")
}

/// Splits `<environment>/<server>` (`None` for a configured server's name, which has no `/`).
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let (environment, server) = name.split_once('/')?;
    (!environment.is_empty() && !server.is_empty() && !server.contains('/'))
        .then_some((environment, server))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn servers(value: serde_json::Value) -> Result<Vec<StdioServer>, String> {
        let servers: Vec<StdioServer> = serde_json::from_value(value).map_err(|e| e.to_string())?;
        check_servers(&servers)?;
        Ok(servers)
    }

    #[test]
    fn a_server_is_a_name_a_command_its_args_and_env() {
        let parsed = servers(json!([
            {"name": "every", "command": "node", "args": ["index.js", "stdio"], "env": {"DEBUG": "1"}},
            {"name": "git_2", "command": "/usr/bin/mcp-git"}
        ]))
        .unwrap();
        assert_eq!(parsed[0].args, ["index.js", "stdio"]);
        assert_eq!(parsed[0].env["DEBUG"], "1");
        assert!(parsed[1].args.is_empty() && parsed[1].env.is_empty());
        // Written back without the empty fields.
        assert_eq!(
            serde_json::to_value(&parsed[1]).unwrap(),
            json!({"name": "git_2", "command": "/usr/bin/mcp-git"})
        );
    }

    #[test]
    fn every_rule_and_bound() {
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let fits = "x".repeat(MAX_TEXT_BYTES);
        let nine: Vec<_> = (0..9)
            .map(|i| json!({"name": format!("s{i}"), "command": "x"}))
            .collect();
        let eight = nine[..8].to_vec();
        let cases: Vec<(serde_json::Value, Option<&str>)> = vec![
            (json!(nine), Some("at most 8 servers")),
            (json!(eight), None),
            (
                json!([{"name": "Every", "command": "x"}]),
                Some("mcpServers[0].name \"Every\" must be 1 to 32"),
            ),
            (
                json!([{"name": "a/b", "command": "x"}]),
                Some("must be 1 to 32"),
            ),
            (
                json!([{"name": "", "command": "x"}]),
                Some("must be 1 to 32"),
            ),
            (
                json!([{"name": "x".repeat(33), "command": "x"}]),
                Some("must be 1 to 32"),
            ),
            (json!([{"name": "x".repeat(32), "command": "x"}]), None),
            (
                json!([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]),
                Some("lists \"a\" twice"),
            ),
            (
                json!([{"name": "a", "command": " "}]),
                Some("command must not be empty"),
            ),
            (
                json!([{"name": "a", "command": long}]),
                Some("command exceeds 4096 bytes"),
            ),
            (json!([{"name": "a", "command": fits}]), None),
            (
                json!([{"name": "a", "command": "x\u{0}"}]),
                Some("command must not contain NUL"),
            ),
            (
                json!([{"name": "a", "command": "x", "args": vec!["a"; 65]}]),
                Some("at most 64 arguments"),
            ),
            (
                json!([{"name": "a", "command": "x", "args": vec!["a"; 64]}]),
                None,
            ),
            (
                json!([{"name": "a", "command": "x", "args": [long]}]),
                Some("args exceeds 4096 bytes"),
            ),
            (
                json!([{"name": "a", "command": "x", "env": {"1X": "y"}}]),
                Some("\"1X\" is not a variable name"),
            ),
            (
                json!([{"name": "a", "command": "x", "env": {"X": "a\u{0}"}}]),
                Some("env.X must not contain NUL"),
            ),
            (
                json!([{"name": "a", "command": "x", "env": (0..65).map(|i| (format!("V{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}]),
                Some("at most 64 variables"),
            ),
            (
                json!([{"name": "a", "command": "x", "cwd": "/"}]),
                Some("unknown field `cwd`"),
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": ["GITHUB_TOKEN"]}]),
                None,
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": ["github_token"]}]),
                Some(
                    "mcpServers[0] (\"a\").secrets: a secret's name is an environment variable name",
                ),
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": ["WUHU_TOKEN"]}]),
                Some("are the runner's own"),
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": ["T", "T"]}]),
                Some("names \"T\" twice"),
            ),
            (
                json!([{"name": "a", "command": "x", "env": {"T": "plain"}, "secrets": ["T"]}]),
                Some("\"T\" is both a plain variable (env) and a secret"),
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": (0..17).map(|i| format!("S{i}")).collect::<Vec<_>>()}]),
                Some("at most 16 secrets"),
            ),
            (
                json!([{"name": "a", "command": "x", "secrets": (0..16).map(|i| format!("S{i}")).collect::<Vec<_>>()}]),
                None,
            ),
        ];
        for (value, expected) in cases {
            let got = servers(value.clone());
            match expected {
                None => assert!(got.is_ok(), "{value}: {got:?}"),
                Some(message) => {
                    let error = got.expect_err(&value.to_string());
                    assert!(error.contains(message), "{value}: {error}");
                }
            }
        }
    }

    #[test]
    fn names_are_environment_slash_server() {
        assert_eq!(qualified_name("api", "every"), "api/every");
        assert_eq!(split_name("api/every"), Some(("api", "every")));
        assert_eq!(split_name("my.env-1/every"), Some(("my.env-1", "every")));
        for not in ["every", "/every", "api/", "api/a/b", ""] {
            assert_eq!(split_name(not), None, "{not}");
        }
    }

    #[test]
    fn a_request_round_trips() {
        let request = McpRequest {
            server: StdioServer {
                name: "every".into(),
                command: "node".into(),
                args: vec!["i.js".into()],
                env: BTreeMap::new(),
                secrets: Vec::new(),
            },
            method: "tools/call".into(),
            params: json!({"name": "echo", "arguments": {"message": "hi"}}),
            timeout_seconds: Some(5),
        };
        let value = serde_json::to_value(&request).unwrap();
        assert_eq!(value["server"]["command"], "node");
        assert_eq!(value["timeoutSeconds"], 5);
        assert_eq!(
            serde_json::from_value::<McpRequest>(value).unwrap(),
            request
        );
    }
}
