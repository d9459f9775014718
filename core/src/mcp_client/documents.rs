//! Where MCP server documents live and what may name a server: a leaf, so the rules that only
//! need to recognise the documents (who may write them, `crate::authority`; `wuhu://mcp/` URLs,
//! `crate::workspace`) do not depend on reading them (`super::config`).

/// The tenant's MCP servers (admins write it; see `crate::authority::is_tenant_config`).
pub const TENANT_MCP_PATH: &str = "config/mcp.json";

/// Longest server name, in characters.
pub const MAX_NAME_CHARS: usize = 32;

/// Where `sub`'s own MCP servers are listed.
pub fn user_mcp_path(sub: &str) -> String {
    format!("users/{sub}/mcp.json")
}

/// Whether `path` (normalised) lists MCP servers: the tenant's document or a user's. A session's
/// tools never write one (an agent must not point its own calls, and the credentials they
/// carry, at another server). Sessions read them afresh at each use.
pub fn is_mcp_document(path: &str) -> bool {
    path == TENANT_MCP_PATH || mcp_user(path).is_some()
}

/// The user whose MCP document `path` is (`users/<sub>/mcp.json`).
pub fn mcp_user(path: &str) -> Option<&str> {
    let sub = path.strip_prefix("users/")?.strip_suffix("/mcp.json")?;
    (!sub.is_empty() && !sub.contains('/')).then_some(sub)
}

/// Whether `name` may name a server.
pub fn valid_server_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= MAX_NAME_CHARS
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}
