//! Which MCP servers a caller sees (decisions 0039, 0040): the server documents, read afresh at
//! each use, and a session's attached environments' stdio servers, for a session's turn or a
//! person through the API. Shared by the calls (`crate::mcp_client`) and the OAuth connections
//! (`crate::mcp_oauth`).

use wuhu_core::authority::TurnRights;
use wuhu_core::egress::EgressPolicy;
use wuhu_core::mcp_client::config::{self, McpServers, Server};
use wuhu_core::secrets::SealedSecret;

use crate::tool_context::ToolContext;

/// Who uses the servers, and with what: a session's tool call, or a person through the API
/// (`GET /v1/mcp/servers/:name/tools`).
pub(crate) struct Caller<'a> {
    pub(crate) env: &'a worker::Env,
    pub(crate) tenant: &'a str,
    /// What kept MCP sessions are scoped to: the session's id, or `api:<sub>`.
    pub(crate) scope: &'a str,
    pub(crate) acting_for: &'a [String],
    pub(crate) rights: &'a TurnRights,
    /// The tenant's sealed secrets (a bearer credential is one of them).
    pub(crate) secrets: &'a [SealedSecret],
    /// The session's tool call, when it is one: its attached environments' stdio servers are
    /// reached through their runners.
    pub(crate) ctx: Option<&'a ToolContext>,
}

impl<'a> Caller<'a> {
    /// A person through the API, acting for `acting_for` (themselves).
    pub(crate) fn person(
        env: &'a worker::Env,
        identity: &'a crate::auth::Identity,
        acting_for: &'a [String],
        scope: &'a str,
        secrets: &'a [SealedSecret],
    ) -> Caller<'a> {
        Caller {
            env,
            tenant: &identity.tenant,
            scope,
            acting_for,
            rights: &TurnRights::People,
            secrets,
            ctx: None,
        }
    }

    pub(crate) fn of(ctx: &'a ToolContext) -> Caller<'a> {
        Caller {
            env: &ctx.env,
            tenant: &ctx.session.tenant,
            scope: &ctx.session.session_id,
            acting_for: &ctx.acting_for,
            rights: &ctx.rights,
            secrets: &ctx.secrets,
            ctx: Some(ctx),
        }
    }
}

/// The server documents a turn reads.
pub(crate) struct Turn {
    pub(crate) tenant: McpServers,
    pub(crate) user: Option<McpServers>,
    /// Why the user's own servers are not offered, when they are not.
    pub(crate) user_note: Option<String>,
    /// The stdio servers of the session's attached environments (`<environment>/<server>`),
    /// listed after the configured ones; none in a turn that may not use runners.
    pub(crate) environments: Vec<Server>,
}

impl Turn {
    /// The servers the turn sees (the configured ones, then its environments'), and the user's
    /// own that a tenant server's name hides.
    pub(crate) fn visible(&self) -> (Vec<&Server>, Vec<&Server>) {
        let (mut seen, shadowed) = config::visible(&self.tenant, self.user.as_ref());
        seen.extend(self.environments.iter());
        (seen, shadowed)
    }

    pub(crate) fn server(&self, name: &str) -> Result<&Server, String> {
        let (seen, _) = self.visible();
        seen.into_iter()
            .find(|s| s.doc.name == name)
            .ok_or_else(|| {
                let (seen, _) = self.visible();
                let names: Vec<&str> = seen.iter().map(|s| s.doc.name.as_str()).collect();
                format!(
                    "No MCP server {name:?} for this turn. {}",
                    if names.is_empty() {
                        "None is configured (call mcp_tools to see why).".to_string()
                    } else {
                        format!("Servers: {}.", names.join(", "))
                    }
                )
            })
    }
}

async fn read_document(caller: &Caller<'_>, path: &str) -> Result<McpServers, String> {
    let doc = crate::workspace_io::read(caller.env, caller.tenant, path)
        .await
        .map_err(|e| format!("{path} could not be read: {}", e.message))?;
    McpServers::parse(path, doc.as_ref().map(|d| d.content.as_str())).map_err(|e| e.to_string())
}

/// The tenant's document, and the user's own when the turn may use it (read at once).
pub(crate) async fn documents(
    caller: &Caller<'_>,
) -> (
    Result<McpServers, String>,
    Option<(String, Result<McpServers, String>)>,
) {
    let user_path = wuhu_core::authority::sole_member(caller.acting_for).map(config::user_mcp_path);
    let user = async {
        match &user_path {
            Some(path) => Some(read_document(caller, path).await),
            None => None,
        }
    };
    let (tenant, user) = futures::join!(read_document(caller, config::TENANT_MCP_PATH), user);
    (tenant, user_path.zip(user))
}

pub(crate) async fn turn(caller: &Caller<'_>) -> Result<Turn, String> {
    caller.rights.may_use_mcp()?;
    let (tenant, user) = documents(caller).await;
    let tenant = tenant?;
    let (user, user_note) = match user {
        Some((_, Ok(servers))) => (Some(servers), None),
        Some((path, Err(e))) => (None, Some(format!("({path} is not used: {e})"))),
        None if caller.acting_for.is_empty() => (None, None),
        None => (
            None,
            Some(
                "(users' own servers are offered only in turns that act for that one person)"
                    .to_string(),
            ),
        ),
    };
    let environments = match caller.ctx {
        Some(ctx) if ctx.rights.may_use_runners().is_ok() => {
            config::environment_servers(&ctx.attachments)
        }
        _ => Vec::new(),
    };
    Ok(Turn {
        tenant,
        user,
        user_note,
        environments,
    })
}

/// The egress rules of js `fetch`, which every MCP request follows.
pub(crate) fn egress(env: &worker::Env) -> EgressPolicy {
    let allow = env
        .var("WUHU_SANDBOX_EGRESS_ALLOW")
        .map(|v| v.to_string())
        .unwrap_or_default();
    EgressPolicy::from_allowlist(&allow)
}
