//! The MCP server documents: `config/mcp.json` (the tenant's, admins) and `users/<sub>/mcp.json`
//! (a user's own), checked when written and when read.

use serde::{Deserialize, Serialize};
use wildmatch::WildMatch;

use crate::environments::Attachment;
use crate::wire::runner::mcp::StdioServer;

pub use super::documents::{
    MAX_NAME_CHARS, TENANT_MCP_PATH, is_mcp_document, mcp_user, user_mcp_path, valid_server_name,
};

/// Most servers in one document.
pub const MAX_SERVERS: usize = 32;
/// Most patterns in one `tools.allow` or `tools.deny`.
pub const MAX_TOOL_PATTERNS: usize = 64;
/// Longest tool pattern, in characters.
pub const MAX_TOOL_PATTERN_CHARS: usize = 128;
/// Longest server URL, in characters.
pub const MAX_URL_CHARS: usize = 2048;
/// How long one request to a server may take when its document says nothing (seconds).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 60;
/// The longest `timeoutSeconds` a document may set.
pub const MAX_TIMEOUT_SECONDS: u32 = 600;

/// How a server is reached.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Streamable HTTP (revision 2025-06-18): one `POST` per message.
    #[default]
    StreamableHttp,
    /// The legacy HTTP+SSE transport (revision 2024-11-05): the URL is the server's event
    /// stream, which names the endpoint messages are posted to (`super::legacy`).
    Sse,
}

/// The credential a request carries.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// None.
    #[default]
    None,
    /// `Authorization: Bearer <the secret's value>`: a secret of the vault (`crate::secrets`),
    /// sent only to the hosts the secret names and in turns the secret may serve.
    Bearer {
        /// The secret's name.
        secret: String,
    },
    /// OAuth 2.1: each person connects their own account through the browser
    /// (`POST /v1/mcp/servers/:name/connect`), and a turn that acts for that person alone
    /// carries their token (`crate::mcp_client::oauth`).
    Oauth,
}

/// Whether each call to a server waits for a person.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Calls run (the policy engine may still ask or refuse).
    #[default]
    Auto,
    /// Each call waits for the session's owner (a user's own server: for that user).
    Ask,
}

/// Which of a server's tools a session sees and may call.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ToolFilterDocument {
    /// Globs (`*`, `?`); empty: every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Globs; a tool one matches is hidden, whatever `allow` says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// One server as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerDocument {
    /// The name sessions call it by: 1 to [`MAX_NAME_CHARS`] of `a-z`, `0-9`, `-`, `_`,
    /// starting with a letter or digit.
    pub name: String,
    /// Its endpoint (`http` or `https`, no credentials in it).
    pub url: String,
    /// How it is reached.
    #[serde(default)]
    pub transport: Transport,
    /// The credential requests carry.
    #[serde(default)]
    pub auth: Auth,
    /// Which tools are offered.
    #[serde(default)]
    pub tools: ToolFilterDocument,
    /// Whether calls wait for a person.
    #[serde(default)]
    pub approval: Approval,
    /// Seconds one request may take (1 to [`MAX_TIMEOUT_SECONDS`], default
    /// [`DEFAULT_TIMEOUT_SECONDS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    servers: Vec<ServerDocument>,
}

/// Whose document a server is listed in.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "source", content = "user", rename_all = "snake_case")]
pub enum Source {
    /// `config/mcp.json`.
    Tenant,
    /// `users/<sub>/mcp.json`.
    User(String),
    /// The definition of the attached environment of this name (a stdio server its runner
    /// starts, named `<environment>/<server>`).
    Environment(String),
}

/// A server as a session uses it.
#[derive(Clone, Debug)]
pub struct Server {
    /// As written.
    pub doc: ServerDocument,
    /// Whose it is.
    pub source: Source,
    /// A stdio server of an environment: what its runner starts.
    pub stdio: Option<StdioServer>,
    allow: Vec<WildMatch>,
    deny: Vec<WildMatch>,
}

impl Server {
    /// Whether the session sees and may call `tool`: no `deny` pattern matches it, and `allow`
    /// is empty or one of its patterns does.
    pub fn offers(&self, tool: &str) -> bool {
        !self.deny.iter().any(|p| p.matches(tool))
            && (self.allow.is_empty() || self.allow.iter().any(|p| p.matches(tool)))
    }

    /// Seconds one request may take.
    pub fn timeout_seconds(&self) -> u32 {
        self.doc.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS)
    }

    /// A stdio server of the attached environment `environment`, as sessions use it: named
    /// `<environment>/<server>`, every tool offered, no approval of its own (its calls pass the
    /// gates of the environment's runner, as `bash` there does), the default timeout.
    pub fn in_environment(environment: &str, server: &StdioServer) -> Server {
        Server {
            doc: ServerDocument {
                name: crate::wire::runner::mcp::qualified_name(environment, &server.name),
                url: String::new(),
                transport: Transport::default(),
                auth: Auth::None,
                tools: ToolFilterDocument::default(),
                approval: Approval::Auto,
                timeout_seconds: None,
            },
            source: Source::Environment(environment.to_string()),
            stdio: Some(server.clone()),
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }

    /// Where it is: its URL's host, or a stdio server's command line (cut to 80 characters).
    pub fn location(&self) -> String {
        match &self.stdio {
            None => self.host(),
            Some(stdio) => {
                let line = std::iter::once(stdio.command.as_str())
                    .chain(stdio.args.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                let cut: String = line.chars().take(80).collect();
                let more = if cut.len() < line.len() { "…" } else { "" };
                format!("stdio: {cut}{more}")
            }
        }
    }

    /// The host of its URL (what the policy's `host` and a bearer secret's `hosts` see).
    pub fn host(&self) -> String {
        url::Url::parse(&self.doc.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// Why a document was refused: its path, the server's position and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct McpConfigError(pub String);

/// The servers of one document.
#[derive(Clone, Debug, Default)]
pub struct McpServers {
    /// In the document's order.
    pub servers: Vec<Server>,
}

impl McpServers {
    /// The servers `text` lists (`None`: no document, no servers), for the document at `path`
    /// (which says whose they are).
    ///
    /// # Errors
    /// [`McpConfigError`], naming the path, the server and the field.
    pub fn parse(path: &str, text: Option<&str>) -> Result<McpServers, McpConfigError> {
        let Some(text) = text else {
            return Ok(McpServers::default());
        };
        let source = match mcp_user(path) {
            Some(sub) => Source::User(sub.to_string()),
            None => Source::Tenant,
        };
        let fail = |what: String| McpConfigError(format!("{path}: {what}"));
        let doc: Document = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        if doc.servers.len() > MAX_SERVERS {
            return Err(fail(format!("at most {MAX_SERVERS} servers")));
        }
        let mut servers: Vec<Server> = Vec::with_capacity(doc.servers.len());
        for (i, server) in doc.servers.into_iter().enumerate() {
            let at = |what: String| fail(format!("server {}: {what}", i + 1));
            if !valid_server_name(&server.name) {
                return Err(at(format!(
                    "name {:?} must be 1 to {MAX_NAME_CHARS} of a-z, 0-9, '-' and '_', starting with a letter or digit",
                    server.name
                )));
            }
            if servers.iter().any(|s| s.doc.name == server.name) {
                return Err(at(format!(
                    "name {:?} is used by an earlier server",
                    server.name
                )));
            }
            check_url(&server.url).map_err(|e| at(format!("url: {e}")))?;
            match &server.auth {
                Auth::None => {}
                Auth::Bearer { secret } => {
                    crate::secrets::name::check_name(secret)
                        .map_err(|e| at(format!("auth.secret: {e}")))?;
                }
                Auth::Oauth => {}
            }
            if let Some(t) = server.timeout_seconds
                && !(1..=MAX_TIMEOUT_SECONDS).contains(&t)
            {
                return Err(at(format!(
                    "timeoutSeconds must be 1 to {MAX_TIMEOUT_SECONDS}"
                )));
            }
            let patterns = |field: &str, list: &[String]| {
                if list.len() > MAX_TOOL_PATTERNS {
                    return Err(at(format!(
                        "tools.{field} holds at most {MAX_TOOL_PATTERNS} patterns"
                    )));
                }
                list.iter()
                    .map(|p| {
                        if p.is_empty() || p.chars().count() > MAX_TOOL_PATTERN_CHARS {
                            Err(at(format!(
                                "tools.{field}: a pattern must be 1 to {MAX_TOOL_PATTERN_CHARS} characters"
                            )))
                        } else {
                            Ok(WildMatch::new(p))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()
            };
            let allow = patterns("allow", &server.tools.allow)?;
            let deny = patterns("deny", &server.tools.deny)?;
            servers.push(Server {
                doc: server,
                source: source.clone(),
                stdio: None,
                allow,
                deny,
            });
        }
        Ok(McpServers { servers })
    }

    /// The server named `name`.
    pub fn get(&self, name: &str) -> Option<&Server> {
        self.servers.iter().find(|s| s.doc.name == name)
    }
}

fn check_url(text: &str) -> Result<(), String> {
    if text.chars().count() > MAX_URL_CHARS {
        return Err(format!("at most {MAX_URL_CHARS} characters"));
    }
    let url = url::Url::parse(text).map_err(|e| format!("{e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme {:?}: http or https only", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "credentials do not belong in the URL: put them in a secret and name it in auth".into(),
        );
    }
    if url.fragment().is_some() {
        return Err("a fragment is not sent to a server: remove it".into());
    }
    Ok(())
}

/// The servers a turn sees: the tenant's, then the user's own whose names the tenant's do not
/// take (returned second: shadowed, for the listing to say so).
pub fn visible<'a>(
    tenant: &'a McpServers,
    user: Option<&'a McpServers>,
) -> (Vec<&'a Server>, Vec<&'a Server>) {
    let mut seen: Vec<&Server> = tenant.servers.iter().collect();
    let mut shadowed = Vec::new();
    for server in user.map(|u| u.servers.iter()).into_iter().flatten() {
        if tenant.get(&server.doc.name).is_some() {
            shadowed.push(server);
        } else {
            seen.push(server);
        }
    }
    (seen, shadowed)
}

/// The stdio servers of the session's attached environments, in their order (each
/// environment's in its definition's order), after the configured servers in listings. A turn
/// that may not use runners sees none.
pub fn environment_servers(attachments: &[Attachment]) -> Vec<Server> {
    attachments
        .iter()
        .flat_map(|a| {
            a.mcp_servers
                .iter()
                .map(|s| Server::in_environment(a.name(), s))
        })
        .collect()
}

/// A server as `GET /v1/mcp/servers` shows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServerView {
    /// Its name.
    pub name: String,
    /// Whose document lists it.
    pub source: SourceKind,
    /// Whose own it is (a user's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Its endpoint.
    pub url: String,
    /// How it is reached.
    pub transport: Transport,
    /// The credential requests carry.
    pub auth: AuthKind,
    /// The secret a bearer credential is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Whether calls wait for a person.
    pub approval: Approval,
    /// The tool patterns offered (empty: all).
    pub allow: Vec<String>,
    /// The tool patterns hidden.
    pub deny: Vec<String>,
    /// Seconds one request may take.
    pub timeout_seconds: u32,
    /// An OAuth server: whether the caller has connected their account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
}

/// Whose document lists a server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// `config/mcp.json`.
    Tenant,
    /// `users/<sub>/mcp.json`.
    User,
    /// An attached environment's definition (a stdio server).
    Environment,
}

/// The kind of credential a server's requests carry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AuthKind {
    /// None.
    None,
    /// A vault secret as a bearer token.
    Bearer,
    /// OAuth: each person connects their own account.
    Oauth,
}

impl Server {
    /// How the API shows it.
    pub fn view(&self) -> ServerView {
        let (source, user) = match &self.source {
            Source::Tenant => (SourceKind::Tenant, None),
            Source::User(sub) => (SourceKind::User, Some(sub.clone())),
            Source::Environment(_) => (SourceKind::Environment, None),
        };
        let (auth, secret) = match &self.doc.auth {
            Auth::None => (AuthKind::None, None),
            Auth::Bearer { secret } => (AuthKind::Bearer, Some(secret.clone())),
            Auth::Oauth => (AuthKind::Oauth, None),
        };
        ServerView {
            name: self.doc.name.clone(),
            source,
            user,
            url: self.doc.url.clone(),
            transport: self.doc.transport,
            auth,
            secret,
            approval: self.doc.approval,
            allow: self.doc.tools.allow.clone(),
            deny: self.doc.tools.deny.clone(),
            timeout_seconds: self.timeout_seconds(),
            connected: None,
        }
    }
}

/// `GET /v1/mcp/servers`: the servers the caller's own turns would see.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServerList {
    /// The tenant's, then the caller's own.
    pub servers: Vec<ServerView>,
    /// The caller's own that a tenant server's name hides.
    pub not_offered: Vec<ServerView>,
    /// Documents that cannot be used, and why (their servers are not offered).
    pub errors: Vec<String>,
}

/// One tool as `GET /v1/mcp/servers/{name}/tools` shows it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolView {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its arguments' JSON Schema.
    pub input_schema: serde_json::Value,
    /// Whether sessions are offered it (the entry's `tools` filter).
    pub offered: bool,
}

/// `GET /v1/mcp/servers/{name}/tools`: what the server lists, asked now.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolList {
    /// The server.
    pub server: ServerView,
    /// Its tools (at most 1 000).
    pub tools: Vec<ToolView>,
    /// Whether it listed more than were read.
    pub truncated: bool,
}
