//! Wuhu as an MCP client (issue 33, decision 0039): sessions use the tenant's MCP servers and
//! their users' own, through one stable pair of tools, `mcp_tools` and `mcp_call` (and js
//! `wuhu.mcp.*`, and `read` of `wuhu://mcp/<server>/<uri>`). The rules, sans-IO; the Worker's
//! `mcp_client.rs` performs them.
//!
//! * [`config`]: the server documents (`config/mcp.json`, `users/<sub>/mcp.json`), which servers
//!   a turn sees ([`config::visible`], with `crate::authority::sole_member`); [`documents`]:
//!   where they live (a leaf).
//! * [`exchange`]: one request over the streamable HTTP transport, as a machine the host
//!   drives (session opening, `Mcp-Session-Id`, expiry, event-stream answers, bounds).
//! * [`legacy`]: one request over the legacy HTTP+SSE transport (`"transport": "sse"`).
//! * [`present`]: what the model sees: tool listings, results with their blobs.
//! * [`oauth`]: OAuth 2.1 for servers that need it (discovery, registration, PKCE, tokens).

pub mod config;
pub mod documents;
pub mod exchange;
pub mod legacy;
pub mod oauth;
pub mod present;

#[cfg(test)]
mod tests;
