//! The OpenAPI 3.1 document of the HTTP API, `docs/openapi.json`.
//!
//! [`ROUTES`] is the route table: every route the Worker's router answers (method, path, who may
//! call it, parameters, request body, answer and error statuses). Bodies are named by their wire
//! types, whose JSON Schemas `schemars` derives (only in this crate's tests: the derives are
//! `cfg_attr(test, …)`, so the Worker never links schemars). The test at the end generates the
//! document and compares it with the committed file; `UPDATE_EXPECT=1 cargo test -p wuhu-core
//! openapi` rewrites it. The Worker serves the committed file at `GET /v1/openapi.json`, and the
//! e2e test `tests/tests/contract.rs` checks that every documented route is routed.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::channels::members::Members;
use crate::channels::{
    ChannelView, CreateChannelRequest, ListChannelsResponse, PatchChannelRequest,
};
use crate::wire::*;

/// Builds one schema (and registers the definitions it refers to).
type SchemaFn = fn(&mut SchemaGenerator) -> schemars::Schema;

fn of<T: JsonSchema>(generator: &mut SchemaGenerator) -> schemars::Schema {
    generator.subschema_for::<T>()
}

/// Who may call a route.
#[derive(Clone, Copy, PartialEq)]
enum Auth {
    /// Nobody needs a credential.
    Public,
    /// A user credential: bearer token, the session cookie or Cloudflare Access.
    User,
    /// A user credential with `role: admin`.
    Admin,
    /// A runner token (`typ: runner`), bearer only.
    Runner,
    /// The chat platform's signature (see `docs/channels.md`).
    Platform,
    /// The URL's own signature: a blob upload URL issued with a runner's tool call.
    UploadSignature,
    /// An OAuth sign-in's `state` (the MCP callback): single use, issued to a person.
    OAuthState,
}

/// A request or answer body.
#[derive(Clone, Copy)]
enum Body {
    /// `application/json` of this type.
    Json(SchemaFn),
    /// `application/json`, any value (the platform's own format, or this document).
    AnyJson,
    /// The raw UTF-8 document.
    Text,
    /// Server-sent events whose `data:` is a [`StreamEvent`].
    Events,
    /// Bytes of any media type (a blob).
    Bytes,
    /// No body.
    Empty,
    /// A WebSocket upgrade (`101 Switching Protocols`).
    Upgrade,
}

/// A query or header parameter; path parameters come from the path's `{name}`s.
struct Param {
    name: &'static str,
    location: &'static str,
    /// JSON Schema, as JSON text.
    schema: &'static str,
    description: &'static str,
}

/// One operation.
struct Route {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    auth: Auth,
    params: &'static [Param],
    /// The request body; `(body, required)`.
    request: Option<(Body, bool)>,
    /// The success status and its body.
    ok: (u16, Body),
    /// Error statuses besides those every route of its [`Auth`] has.
    errors: &'static [u16],
}

const LIMIT_SESSIONS: Param = Param {
    name: "limit",
    location: "query",
    schema: r#"{"type":"integer","minimum":1,"maximum":200,"default":50}"#,
    description: "Sessions per page.",
};
const SINCE_CURSOR: Param = Param {
    name: "sinceCursor",
    location: "query",
    schema: r#"{"type":"integer","minimum":0}"#,
    description: "Only entries with a larger cursor.",
};
const SINCE_TIME: Param = Param {
    name: "sinceTime",
    location: "query",
    schema: r#"{"type":"integer","minimum":0}"#,
    description: "Only entries created after this (unix seconds).",
};

/// Every route of the API, in the order of `docs/api.md`.
const ROUTES: &[Route] = &[
    Route {
        method: "get",
        path: "/healthz",
        id: "healthz",
        tag: "meta",
        summary: "Liveness: `{\"ok\":true}`",
        auth: Auth::Public,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<OkResponse>)),
        errors: &[],
    },
    Route {
        method: "get",
        path: "/v1/openapi.json",
        id: "getOpenApi",
        tag: "meta",
        summary: "This document (the same as `docs/openapi.json`)",
        auth: Auth::Public,
        params: &[],
        request: None,
        ok: (200, Body::AnyJson),
        errors: &[],
    },
    // Sessions.
    Route {
        method: "post",
        path: "/v1/sessions",
        id: "createSession",
        tag: "sessions",
        summary: "Create a session (an empty body takes every default)",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<CreateSessionRequest>), false)),
        ok: (201, Body::Json(of::<SessionInfo>)),
        errors: &[400, 413, 429],
    },
    Route {
        method: "get",
        path: "/v1/sessions",
        id: "listSessions",
        tag: "sessions",
        summary: "Sessions the caller may read, newest first",
        auth: Auth::User,
        params: &[
            LIMIT_SESSIONS,
            Param {
                name: "before",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "`nextBefore` of the previous page.",
            },
            Param {
                name: "parentId",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "Only the children of this session.",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<ListSessionsResponse>)),
        errors: &[400],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}",
        id: "getSession",
        tag: "sessions",
        summary: "A session and a transcript page",
        auth: Auth::User,
        params: &[
            SINCE_CURSOR,
            SINCE_TIME,
            Param {
                name: "limit",
                location: "query",
                schema: r#"{"type":"integer","minimum":1,"maximum":1000,"default":1000}"#,
                description: "Entries per page (a page also stops at 4 MiB of entry JSON).",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<GetSessionResponse>)),
        errors: &[400, 404, 503],
    },
    Route {
        method: "patch",
        path: "/v1/sessions/{id}",
        id: "patchSession",
        tag: "sessions",
        summary: "Rename, change access, switch the model, set a budget",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<PatchSessionRequest>), true)),
        ok: (200, Body::Json(of::<SessionInfo>)),
        errors: &[400, 403, 404, 413],
    },
    Route {
        method: "delete",
        path: "/v1/sessions/{id}",
        id: "deleteSession",
        tag: "sessions",
        summary: "Delete a session with its children, transcript, blobs and request logs (its owner or an admin)",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (204, Body::Empty),
        errors: &[403, 404, 409],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/enqueue",
        id: "enqueue",
        tag: "sessions",
        summary: "Queue a message on a lane; answered once it is stored",
        auth: Auth::User,
        params: &[Param {
            name: "lane",
            location: "query",
            schema: r#"{"type":"string","enum":["steer","followUp"],"default":"followUp"}"#,
            description: "`steer`: at the next step boundary; `followUp`: when the agent would stop.",
        }],
        request: Some((Body::Json(of::<EnqueueRequest>), true)),
        ok: (200, Body::Json(of::<EnqueueResponse>)),
        errors: &[400, 402, 403, 404, 413, 429],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/cancel",
        id: "cancel",
        tag: "sessions",
        summary: "Cancel a queued item not yet delivered",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<CancelRequest>), true)),
        ok: (200, Body::Json(of::<CancelResponse>)),
        errors: &[400, 403, 404, 409, 413],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/stop",
        id: "stop",
        tag: "sessions",
        summary: "End the turn (and the turns of its attached children)",
        auth: Auth::User,
        params: &[],
        request: Some((Body::AnyJson, false)),
        ok: (200, Body::Json(of::<StopResponse>)),
        errors: &[400, 403, 404, 413],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/compact",
        id: "compact",
        tag: "sessions",
        summary: "Compact the context now",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<CompactRequest>), false)),
        ok: (200, Body::Json(of::<CompactResponse>)),
        errors: &[400, 403, 404, 409, 413, 502],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/fork",
        id: "forkSession",
        tag: "sessions",
        summary: "A new session whose history is this one's first `atCursor` entries",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<ForkRequest>), true)),
        ok: (201, Body::Json(of::<SessionInfo>)),
        errors: &[400, 404, 413, 429],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}/follow",
        id: "follow",
        tag: "sessions",
        summary: "Server-sent events: backfill, then live entries, deltas and idle points",
        auth: Auth::User,
        params: &[
            SINCE_CURSOR,
            SINCE_TIME,
            Param {
                name: "stopAfterIdle",
                location: "query",
                schema: r#"{"type":"string","enum":["0","1"]}"#,
                description: "`1`: end with `idle` and `done` at the first idle point after the backfill.",
            },
            Param {
                name: "timeoutSeconds",
                location: "query",
                schema: r#"{"type":"integer","minimum":1,"maximum":86400}"#,
                description: "Send `done` and close after this long.",
            },
            Param {
                name: "Last-Event-ID",
                location: "header",
                schema: r#"{"type":"string","pattern":"^[0-9]+$"}"#,
                description: "The last entry cursor received; takes precedence over `sinceCursor`.",
            },
        ],
        request: None,
        ok: (200, Body::Events),
        errors: &[400, 404, 429],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}/socket",
        id: "sessionSocket",
        tag: "sessions",
        summary: "A WebSocket: the follow stream's events, and enqueue, stop and cancel frames (docs/api.md, wuhu_core::socket)",
        auth: Auth::User,
        params: &[Param {
            name: "after",
            location: "query",
            schema: r#"{"type":"integer","minimum":0}"#,
            description: "Send entries with a larger cursor (as `Last-Event-ID`); default 0.",
        }],
        request: None,
        ok: (101, Body::Upgrade),
        errors: &[400, 404, 426, 429],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}/stats",
        id: "sessionStats",
        tag: "sessions",
        summary: "Storage use of the session's actor",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<SessionStats>)),
        errors: &[404],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}/usage",
        id: "sessionUsage",
        tag: "sessions",
        summary: "Tokens and cost, per model, and the budget",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<UsageResponse>)),
        errors: &[404, 503],
    },
    Route {
        method: "get",
        path: "/v1/sessions/{id}/jobs",
        id: "sessionJobs",
        tag: "sessions",
        summary: "The session's background jobs, newest first, as it last learnt of them",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<JobsResponse>)),
        errors: &[404],
    },
    Route {
        method: "get",
        path: "/v1/usage",
        id: "tenantUsage",
        tag: "usage",
        summary: "Tokens and cost of the tenant's sessions, grouped by session, user or model (members: their own sessions)",
        auth: Auth::User,
        params: &[
            Param {
                name: "from",
                location: "query",
                schema: r#"{"type":"integer","minimum":0}"#,
                description: "Start (unix seconds, inclusive: the hours starting at or after it count); default 0.",
            },
            Param {
                name: "to",
                location: "query",
                schema: r#"{"type":"integer","minimum":0}"#,
                description: "End (unix seconds, exclusive); default: an hour from now.",
            },
            Param {
                name: "by",
                location: "query",
                schema: r#"{"type":"string","enum":["session","user","model"],"default":"model"}"#,
                description: "How the hours are grouped.",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<crate::tenant_usage::TenantUsage>)),
        errors: &[400, 503],
    },
    Route {
        method: "get",
        path: "/v1/budget",
        id: "getTenantBudget",
        tag: "usage",
        summary: "The tenant's budget and what its sessions spent",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<crate::tenant_usage::TenantBudget>)),
        errors: &[503],
    },
    Route {
        method: "get",
        path: "/v1/llm-logs",
        id: "listLlmLogs",
        tag: "usage",
        summary: "The tenant's provider request logs (with `llmRequestLogs: true` in `config/tenant.json`), oldest session first",
        auth: Auth::Admin,
        params: &[
            Param {
                name: "session",
                location: "query",
                schema: r#"{"type":"string","minLength":1}"#,
                description: "Only this session's records.",
            },
            Param {
                name: "after",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The `nextAfter` of the previous page.",
            },
            Param {
                name: "limit",
                location: "query",
                schema: r#"{"type":"integer","minimum":1,"maximum":1000,"default":100}"#,
                description: "Records per page.",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<crate::llm::request_log::List>)),
        errors: &[400, 409],
    },
    Route {
        method: "get",
        path: "/v1/llm-logs/{id}/{record}",
        id: "getLlmLog",
        tag: "usage",
        summary: "One provider request and its response, credentials redacted",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<crate::llm::request_log::Record>)),
        errors: &[400, 404, 409],
    },
    Route {
        method: "get",
        path: "/v1/policy/check",
        id: "checkPolicy",
        tag: "policy",
        summary: "Dry run: what the tenant's policy (and a runner owner's own) would decide on a call",
        auth: Auth::User,
        params: &[
            Param {
                name: "tool",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The tool: `bash`, `write`, `edit`, `read`, `js_fetch` (a script's fetch), `request_environment`, `spawn_session`, …",
            },
            Param {
                name: "environment",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The environment's name in the session (or the definition asked for).",
            },
            Param {
                name: "runner",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The runner's name.",
            },
            Param {
                name: "runnerOwner",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The runner's owner: their own `users/<sub>/policy.json` is read too.",
            },
            Param {
                name: "command",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "A `bash` command (matched per simple command).",
            },
            Param {
                name: "path",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "A file path.",
            },
            Param {
                name: "host",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "A fetch's host.",
            },
            Param {
                name: "mcp",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "An MCP tool, as `<server>/<tool>` (tool `mcp_call`).",
            },
            Param {
                name: "costUsd",
                location: "query",
                schema: r#"{"type":"number","minimum":0}"#,
                description: "The call's cost estimate in US dollars.",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<crate::policy::CheckResponse>)),
        errors: &[400, 409],
    },
    Route {
        method: "get",
        path: "/v1/mcp/servers",
        id: "listMcpServers",
        tag: "mcp",
        summary: "The MCP servers your own turns would use: the tenant's (`config/mcp.json`) and yours (`users/<you>/mcp.json`), with documents that cannot be used",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<crate::mcp_client::config::ServerList>)),
        errors: &[503],
    },
    Route {
        method: "get",
        path: "/v1/mcp/servers/{name}/tools",
        id: "listMcpServerTools",
        tag: "mcp",
        summary: "Asks an MCP server for its tools now, as your own turn would (502 with the server's failure)",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<crate::mcp_client::config::ToolList>)),
        errors: &[400, 404, 409, 502, 503],
    },
    Route {
        method: "post",
        path: "/v1/mcp/servers/{name}/connect",
        id: "connectMcpServer",
        tag: "mcp",
        summary: "Starts your OAuth sign-in to an MCP server (`auth: oauth`): discovery, client registration, PKCE; answers the address your browser goes to",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (
            200,
            Body::Json(of::<crate::mcp_client::oauth::ConnectResponse>),
        ),
        errors: &[400, 404, 409, 502, 503],
    },
    Route {
        method: "delete",
        path: "/v1/mcp/servers/{name}/connection",
        id: "disconnectMcpServer",
        tag: "mcp",
        summary: "Forgets your OAuth connection to an MCP server",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (
            200,
            Body::Json(of::<crate::mcp_client::oauth::DisconnectResponse>),
        ),
        errors: &[400, 404, 409, 503],
    },
    Route {
        method: "get",
        path: "/v1/mcp/callback",
        id: "mcpOAuthCallback",
        tag: "mcp",
        summary: "Where an MCP server's authorization server sends the browser back: keeps the code, then redirects to the web app's page that finishes the sign-in",
        auth: Auth::OAuthState,
        params: &[
            Param {
                name: "state",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The sign-in's state.",
            },
            Param {
                name: "code",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "The authorization code.",
            },
        ],
        request: None,
        ok: (302, Body::Empty),
        errors: &[400],
    },
    Route {
        method: "post",
        path: "/v1/mcp/finish",
        id: "finishMcpConnection",
        tag: "mcp",
        summary: "Finishes your OAuth sign-in to an MCP server (the page the callback sent your browser to): the code becomes your connection; only who began it may",
        auth: Auth::User,
        params: &[],
        request: Some((
            Body::Json(of::<crate::mcp_client::oauth::FinishRequest>),
            true,
        )),
        ok: (
            200,
            Body::Json(of::<crate::mcp_client::oauth::FinishResponse>),
        ),
        errors: &[400, 403, 409, 413, 502],
    },
    Route {
        method: "get",
        path: "/v1/secrets",
        id: "listSecrets",
        tag: "secrets",
        summary: "The tenant's secrets and your own: names, scopes and where they may go, never values",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<crate::secrets::SecretList>)),
        errors: &[503],
    },
    Route {
        method: "put",
        path: "/v1/secrets/{name}",
        id: "putSecret",
        tag: "secrets",
        summary: "Set a secret (a user's own, or the tenant's as an admin); the value is sealed and never returned",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<crate::secrets::PutSecretRequest>), true)),
        ok: (200, Body::Json(of::<crate::secrets::SecretInfo>)),
        errors: &[400, 403, 409, 413, 503],
    },
    Route {
        method: "delete",
        path: "/v1/secrets/{name}",
        id: "deleteSecret",
        tag: "secrets",
        summary: "Delete a secret",
        auth: Auth::User,
        params: &[Param {
            name: "scope",
            location: "query",
            schema: r#"{"type":"string","enum":["user","tenant"],"default":"user"}"#,
            description: "Whose: your own (`user`) or the tenant's (`tenant`, admins).",
        }],
        request: None,
        ok: (200, Body::Json(of::<crate::calls::Empty>)),
        errors: &[400, 403, 404, 503],
    },
    Route {
        method: "put",
        path: "/v1/budget",
        id: "putTenantBudget",
        tag: "usage",
        summary: "Set the tenant's budget (`{}` removes it)",
        auth: Auth::Admin,
        params: &[],
        request: Some((Body::Json(of::<Budget>), true)),
        ok: (200, Body::Json(of::<crate::tenant_usage::TenantBudget>)),
        errors: &[400, 413, 503],
    },
    Route {
        method: "post",
        path: "/v1/sessions/{id}/approvals/{approvalId}",
        id: "answerApproval",
        tag: "sessions",
        summary: "Answer a tool call's approval request",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<AnswerApprovalRequest>), true)),
        ok: (200, Body::Json(of::<AnswerApprovalResponse>)),
        errors: &[400, 403, 404, 409, 413],
    },
    // Sign-in.
    Route {
        method: "post",
        path: "/v1/tokens",
        id: "mintToken",
        tag: "sign-in",
        summary: "Mint a revocable user or runner token (shown once); a child of the caller's token, never from a cookie session, from Access only right after a sign-in",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<MintTokenRequest>), true)),
        ok: (201, Body::Json(of::<MintTokenResponse>)),
        errors: &[400, 403, 413, 429],
    },
    Route {
        method: "get",
        path: "/v1/tokens",
        id: "listTokens",
        tag: "sign-in",
        summary: "Registered tokens and cookie sessions (never the tokens themselves)",
        auth: Auth::User,
        params: &[
            Param {
                name: "sub",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "Another user's tokens (admins only).",
            },
            Param {
                name: "all",
                location: "query",
                schema: r#"{"type":"string","enum":["1"]}"#,
                description: "The whole tenant's tokens (admins only).",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<ListTokensResponse>)),
        errors: &[400, 403],
    },
    Route {
        method: "delete",
        path: "/v1/tokens/{jti}",
        id: "revokeToken",
        tag: "sign-in",
        summary: "Revoke a token or cookie session at once, everywhere, with everything made from it",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<RevokeTokenResponse>)),
        errors: &[404],
    },
    Route {
        method: "post",
        path: "/v1/tokens/revoke-all",
        id: "revokeAllTokens",
        tag: "sign-in",
        summary: "End every registered credential of the caller (an admin: of `sub`): tokens, cookie sessions, what was made from them; open runner sockets, follow streams and session sockets close",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<RevokeAllRequest>), false)),
        ok: (200, Body::Json(of::<RevokeAllResponse>)),
        errors: &[400, 403, 413],
    },
    Route {
        method: "post",
        path: "/v1/auth/session",
        id: "createCookieSession",
        tag: "sign-in",
        summary: "Exchange a bearer token or an Access identity for the `wuhu_session` cookie",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<WhoAmI>)),
        errors: &[400, 429],
    },
    Route {
        method: "post",
        path: "/v1/auth/logout",
        id: "logout",
        tag: "sign-in",
        summary: "End the cookie session (revoked) and clear the cookie",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<OkResponse>)),
        errors: &[400],
    },
    Route {
        method: "get",
        path: "/v1/auth/me",
        id: "whoAmI",
        tag: "sign-in",
        summary: "Who the caller is and how they signed in",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<WhoAmI>)),
        errors: &[],
    },
    // Runners and environments.
    Route {
        method: "get",
        path: "/v1/runners",
        id: "listRunners",
        tag: "runners",
        summary: "Runners of the tenant, connected or seen before",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<ListRunnersResponse>)),
        errors: &[],
    },
    Route {
        method: "delete",
        path: "/v1/runners/{owner}/{name}",
        id: "deleteRunner",
        tag: "runners",
        summary: "Free a runner's name (its owner or an admin); a live runner is disconnected",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (204, Body::Empty),
        errors: &[400, 403, 404],
    },
    Route {
        method: "get",
        path: "/v1/runners/connect",
        id: "connectRunner",
        tag: "runners",
        summary: "A runner's WebSocket (docs/runner-protocol.md)",
        auth: Auth::Runner,
        params: &[],
        request: None,
        ok: (101, Body::Upgrade),
        errors: &[426, 429],
    },
    Route {
        method: "get",
        path: "/v1/environments",
        id: "listEnvironments",
        tag: "runners",
        summary: "Environment definitions, by name",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<ListEnvironmentsResponse>)),
        errors: &[],
    },
    Route {
        method: "post",
        path: "/v1/environments",
        id: "createEnvironment",
        tag: "runners",
        summary: "Define an environment",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<CreateEnvironmentRequest>), true)),
        ok: (201, Body::Json(of::<EnvironmentDefinition>)),
        errors: &[400, 403, 409, 413],
    },
    Route {
        method: "get",
        path: "/v1/environments/{idOrName}",
        id: "getEnvironment",
        tag: "runners",
        summary: "One environment definition",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<EnvironmentDefinition>)),
        errors: &[404],
    },
    Route {
        method: "patch",
        path: "/v1/environments/{idOrName}",
        id: "patchEnvironment",
        tag: "runners",
        summary: "Change a definition (its owner or an admin)",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Json(of::<UpdateEnvironmentRequest>), true)),
        ok: (200, Body::Json(of::<EnvironmentDefinition>)),
        errors: &[400, 403, 404, 409, 413],
    },
    Route {
        method: "delete",
        path: "/v1/environments/{idOrName}",
        id: "deleteEnvironment",
        tag: "runners",
        summary: "Delete a definition (its owner or an admin)",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (204, Body::Empty),
        errors: &[403, 404],
    },
    // Workspace.
    Route {
        method: "get",
        path: "/v1/workspace/docs",
        id: "listDocs",
        tag: "workspace",
        summary: "Workspace documents by path",
        auth: Auth::User,
        params: &[
            Param {
                name: "prefix",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "Only paths that start with this.",
            },
            Param {
                name: "limit",
                location: "query",
                schema: r#"{"type":"integer","minimum":1,"maximum":1000,"default":1000}"#,
                description: "Documents per page.",
            },
            Param {
                name: "cursor",
                location: "query",
                schema: r#"{"type":"string"}"#,
                description: "`cursor` of the previous page.",
            },
        ],
        request: None,
        ok: (200, Body::Json(of::<DocList>)),
        errors: &[400],
    },
    Route {
        method: "get",
        path: "/v1/workspace/docs/{path}",
        id: "getDoc",
        tag: "workspace",
        summary: "A document",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<Doc>)),
        errors: &[400, 404],
    },
    Route {
        method: "put",
        path: "/v1/workspace/docs/{path}",
        id: "putDoc",
        tag: "workspace",
        summary: "Write a document (YAML frontmatter allowed)",
        auth: Auth::User,
        params: &[],
        request: Some((Body::Text, true)),
        ok: (200, Body::Json(of::<DocSummary>)),
        errors: &[400, 403, 413],
    },
    Route {
        method: "delete",
        path: "/v1/workspace/docs/{path}",
        id: "deleteDoc",
        tag: "workspace",
        summary: "Delete a document",
        auth: Auth::User,
        params: &[],
        request: None,
        ok: (204, Body::Empty),
        errors: &[400, 403, 404],
    },
    // Blobs.
    Route {
        method: "get",
        path: "/v1/blobs/{id}",
        id: "getBlob",
        tag: "blobs",
        summary: "A blob (`wuhu://blob/<id>`) to whoever may read its session: whole, or one `Range: bytes=` range (206)",
        auth: Auth::User,
        params: &[Param {
            name: "range",
            location: "header",
            schema: r#"{"type":"string"}"#,
            description: "One `bytes=first-last`, `bytes=first-` or `bytes=-suffix` range.",
        }],
        request: None,
        ok: (200, Body::Bytes),
        errors: &[404, 416],
    },
    Route {
        method: "put",
        path: "/v1/blobs/upload",
        id: "uploadBlob",
        tag: "blobs",
        summary: "Store a blob with an upload URL issued to a runner (`tool_call.upload`); at most 32 MiB",
        auth: Auth::UploadSignature,
        params: &[],
        request: Some((Body::Bytes, true)),
        ok: (200, Body::AnyJson),
        errors: &[400, 403, 413],
    },
    // Channels.
    Route {
        method: "get",
        path: "/v1/channels",
        id: "listChannels",
        tag: "channels",
        summary: "Chat platform bindings, oldest first",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<ListChannelsResponse>)),
        errors: &[],
    },
    Route {
        method: "post",
        path: "/v1/channels",
        id: "createChannel",
        tag: "channels",
        summary: "Bind a chat platform",
        auth: Auth::Admin,
        params: &[],
        request: Some((Body::Json(of::<CreateChannelRequest>), true)),
        ok: (201, Body::Json(of::<ChannelView>)),
        errors: &[400, 409, 413],
    },
    Route {
        method: "get",
        path: "/v1/channels/{id}",
        id: "getChannel",
        tag: "channels",
        summary: "One binding (credentials masked)",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<ChannelView>)),
        errors: &[404],
    },
    Route {
        method: "patch",
        path: "/v1/channels/{id}",
        id: "patchChannel",
        tag: "channels",
        summary: "Change a binding",
        auth: Auth::Admin,
        params: &[],
        request: Some((Body::Json(of::<PatchChannelRequest>), true)),
        ok: (200, Body::Json(of::<ChannelView>)),
        errors: &[400, 404, 413],
    },
    Route {
        method: "delete",
        path: "/v1/channels/{id}",
        id: "deleteChannel",
        tag: "channels",
        summary: "Delete a binding (its hook then answers 401)",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (204, Body::Empty),
        errors: &[404],
    },
    Route {
        method: "get",
        path: "/v1/channels/{id}/members",
        id: "getChannelMembers",
        tag: "channels",
        summary: "Platform users mapped to Wuhu users",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<Members>)),
        errors: &[404],
    },
    Route {
        method: "put",
        path: "/v1/channels/{id}/members",
        id: "putChannelMembers",
        tag: "channels",
        summary: "Replace the member mapping",
        auth: Auth::Admin,
        params: &[],
        request: Some((Body::Json(of::<Members>), true)),
        ok: (200, Body::Json(of::<Members>)),
        errors: &[400, 404, 413],
    },
    Route {
        method: "delete",
        path: "/v1/channels/{id}/members",
        id: "deleteChannelMembers",
        tag: "channels",
        summary: "Clear the member mapping",
        auth: Auth::Admin,
        params: &[],
        request: None,
        ok: (200, Body::Json(of::<Members>)),
        errors: &[404],
    },
    Route {
        method: "post",
        path: "/hooks/{platform}/{id}",
        id: "channelHook",
        tag: "channels",
        summary: "A chat platform's webhook (the answer is in the platform's format)",
        auth: Auth::Platform,
        params: &[],
        request: Some((Body::AnyJson, true)),
        ok: (200, Body::AnyJson),
        errors: &[400, 401, 404, 413],
    },
    Route {
        method: "post",
        path: "/mcp",
        id: "mcp",
        tag: "mcp",
        summary: "Wuhu as an MCP server (streamable HTTP, revision 2025-06-18): one JSON-RPC message, one JSON answer; its tools are this API's routes, for the caller (docs/mcp.md)",
        auth: Auth::User,
        params: &[],
        request: Some((Body::AnyJson, true)),
        ok: (200, Body::AnyJson),
        errors: &[400, 403, 413],
    },
];

/// OpenAPI links: which answer names the resource other operations take, so a client (and
/// schemathesis' stateful phase) can chain them. `(from operation, its success status, to
/// operations, the parameter, the expression)`. The follow stream is left out: it is a stream
/// that stays open.
const LINKS: &[(&str, u16, &[&str], &str, &str)] = &[
    (
        "createSession",
        201,
        &[
            "getSession",
            "patchSession",
            "enqueue",
            "stop",
            "compact",
            "sessionStats",
            "sessionUsage",
            "forkSession",
        ],
        "path.id",
        "$response.body#/id",
    ),
    (
        "createEnvironment",
        201,
        &["getEnvironment", "patchEnvironment", "deleteEnvironment"],
        "path.idOrName",
        "$response.body#/id",
    ),
    (
        "mintToken",
        201,
        &["revokeToken"],
        "path.jti",
        "$response.body#/jti",
    ),
    (
        "putDoc",
        200,
        &["getDoc", "deleteDoc"],
        "path.path",
        "$response.body#/path",
    ),
    (
        "createChannel",
        201,
        &[
            "getChannel",
            "patchChannel",
            "deleteChannel",
            "getChannelMembers",
            "putChannelMembers",
            "deleteChannelMembers",
        ],
        "path.id",
        "$response.body#/id",
    ),
];

/// What a path parameter is.
fn path_param(name: &str) -> (Value, &'static str) {
    let text = json!({"type": "string", "minLength": 1});
    let description = match name {
        "id" => "The session's (or binding's) id.",
        "approvalId" => "The `approvalId` of a `wuhu_approval_request_v1` entry.",
        "record" => {
            "A request log's file name, `{step}-{startedAtMs}.json` (the `name` a listing gives, after the session)."
        }
        "jti" => "The token's id.",
        "owner" => "The runner owner's `sub`.",
        "name" => "The runner's name.",
        "idOrName" => "The definition's UUID or its unique name.",
        "path" => {
            "The document's relative path; its `/`s are part of the URL path (`users/ana/context.md`)."
        }
        "platform" => {
            return (
                json!({"type": "string", "enum": ["slack", "telegram", "discord", "generic"]}),
                "The binding's platform.",
            );
        }
        _ => "",
    };
    (text, description)
}

/// What an error status means (the codes are in `docs/api.md`, Errors).
fn error_description(status: u16) -> &'static str {
    match status {
        400 => {
            "`bad_request`: malformed JSON, unknown fields, bad parameters; `unpriced_model`: a model without a price while a USD budget applies; `fake_provider_disabled`, `provider_required`: the `fake` provider needs `WUHU_ENABLE_FAKE_PROVIDER=1`"
        }
        401 => "`unauthorized`: no credential, or a bad, expired or revoked one",
        402 => "`budget_exceeded`: the session's budget is spent",
        403 => "`forbidden`: the caller may see this but not do it, or a cross-site request",
        404 => "`not_found`: no such thing in the caller's tenant (or not visible to them)",
        409 => {
            "a conflict: `already_delivered`, `already_decided`, `expired`, `withdrawn`, `conflict`, `nothing_to_compact`, `too_many_channels`"
        }
        413 => "`payload_too_large`: a body over 1 MiB",
        426 => "`upgrade_required`: not a WebSocket upgrade",
        429 => {
            "a bound: `queue_full`, `too_many_followers`, `too_many_tokens`, `too_many_runners`, or `rate_limited` (with `Retry-After`)"
        }
        500 => {
            "`server_misconfigured` (a missing or malformed setting), `storage_failed`, `internal`"
        }
        502 => "`llm_error`: the summary request failed",
        503 => "`unavailable`: retry",
        _ => "an error",
    }
}

/// The statuses every route of `auth` may answer besides its own.
fn common_errors(auth: Auth) -> &'static [u16] {
    match auth {
        Auth::Public | Auth::Platform | Auth::UploadSignature | Auth::OAuthState => &[500],
        Auth::User | Auth::Runner => &[401, 500, 503],
        Auth::Admin => &[401, 403, 500, 503],
    }
}

fn content(generator: &mut SchemaGenerator, body: Body) -> Option<Value> {
    let (media, schema) = match body {
        Body::Json(schema) => ("application/json", schema(generator).to_value()),
        Body::AnyJson => ("application/json", json!({})),
        Body::Text => (
            "text/plain",
            json!({"type": "string", "description": "The whole document, UTF-8."}),
        ),
        Body::Events => ("text/event-stream", event_schema(generator)),
        Body::Bytes => (
            "*/*",
            json!({"type": "string", "description": "The blob's bytes, as its media type says."}),
        ),
        Body::Empty | Body::Upgrade => return None,
    };
    Some(json!({ media: { "schema": schema } }))
}

/// One server-sent event of the follow stream (OpenAPI 3.1 reads the `schema` of an event stream
/// as the schema of each event): `event` is the type, `data` a [`StreamEvent`] of that type,
/// `id` the entry's cursor (on `entry_appended` only).
fn event_schema(generator: &mut SchemaGenerator) -> Value {
    let data = of::<StreamEvent>(generator).to_value();
    let names: Vec<Value> = generator.definitions()["StreamEvent"]["oneOf"]
        .as_array()
        .expect("StreamEvent is a oneOf")
        .iter()
        .map(|variant| variant["properties"]["type"]["const"].clone())
        .collect();
    assert!(
        names.iter().all(Value::is_string),
        "a StreamEvent variant without a type"
    );
    json!({
        "type": "object",
        "description": "One server-sent event: `event: <type>`, `data: <StreamEvent JSON>`, and \
            `id: <cursor>` on `entry_appended`. A `: heartbeat` comment comes every 15 s.",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "enum": names},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            },
        },
    })
}

fn security(auth: Auth) -> Value {
    match auth {
        Auth::Public | Auth::Platform | Auth::UploadSignature | Auth::OAuthState => json!([]),
        Auth::User | Auth::Admin => json!([{"bearer": []}, {"cookie": []}, {"access": []}]),
        Auth::Runner => json!([{"bearer": []}]),
    }
}

fn operation(generator: &mut SchemaGenerator, route: &Route) -> Value {
    let mut parameters = Vec::new();
    for segment in route.path.split('/') {
        if let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let (schema, description) = path_param(name);
            parameters.push(json!({
                "name": name, "in": "path", "required": true,
                "description": description, "schema": schema,
            }));
        }
    }
    for param in route.params {
        let schema: Value = serde_json::from_str(param.schema).expect("parameter schema");
        parameters.push(json!({
            "name": param.name, "in": param.location, "required": false,
            "description": param.description, "schema": schema,
        }));
    }
    let mut responses = Map::new();
    let (ok_status, ok_body) = route.ok;
    let mut ok = json!({"description": match ok_body {
        Body::Empty => "Done; no body.",
        Body::Upgrade => "The WebSocket is open.",
        _ => "Success.",
    }});
    if let Some(content) = content(generator, ok_body) {
        ok["content"] = content;
    }
    if route.id == "createCookieSession" {
        ok["headers"] = json!({"Set-Cookie": {
            "description": "`wuhu_session=<jwt>; Path=/; Max-Age=<s>; HttpOnly; Secure; SameSite=Strict`",
            "schema": {"type": "string"},
        }});
    }
    for (from, status, targets, parameter, expression) in LINKS {
        if *from == route.id && *status == ok_status {
            let links: Map<String, Value> = targets
                .iter()
                .map(|target| {
                    let link =
                        json!({"operationId": target, "parameters": {*parameter: expression}});
                    (target.to_string(), link)
                })
                .collect();
            ok["links"] = Value::Object(links);
        }
    }
    responses.insert(ok_status.to_string(), ok);
    if route.id == "deleteSession" {
        responses.insert(
            "202".into(),
            json!({"description": "Hidden and marked for deletion, but a step failed: the session's alarm finishes it. `DELETE` again answers 202 until it is done, then 404."}),
        );
    }
    if route.id == "mcp" {
        responses.insert(
            "202".into(),
            json!({"description": "A notification or a response: accepted, no body."}),
        );
    }
    let mut errors: Vec<u16> = route
        .errors
        .iter()
        .chain(common_errors(route.auth))
        .copied()
        .collect();
    errors.sort_unstable();
    errors.dedup();
    for status in errors {
        responses.insert(
            status.to_string(),
            json!({
                "description": error_description(status),
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
            }),
        );
    }
    if route.id == "mcp" {
        responses.insert(
            "400".into(),
            json!({
                "description": "A message that could not be read (not JSON, not JSON-RPC 2.0, a batch, an unsupported `MCP-Protocol-Version`): a JSON-RPC error with no id.",
                "content": {"application/json": {"schema": {}}},
            }),
        );
    }
    let mut op = json!({
        "operationId": route.id,
        "tags": [route.tag],
        "summary": route.summary,
        "security": security(route.auth),
        "responses": responses,
    });
    if route.auth == Auth::Admin {
        op["description"] = json!("Admins only (`role: admin`): a member gets 403.");
    }
    if route.auth == Auth::UploadSignature {
        op["description"] = json!(
            "Authenticated by the URL's signature (HMAC over tenant, blob id, size limit and expiry), no token: the session issues the URL to a runner with a tool call."
        );
    }
    if route.auth == Auth::OAuthState {
        op["description"] = json!(
            "Authenticated by the sign-in's `state` alone (256 random bits, single use, 10 minutes), issued to a person by `POST /v1/mcp/servers/{name}/connect`; the browser comes back here from the authorization server."
        );
    }
    if route.auth == Auth::Platform {
        op["description"] = json!(
            "Authenticated by the platform's signature headers (docs/channels.md), no token."
        );
    }
    if !parameters.is_empty() {
        op["parameters"] = Value::Array(parameters);
    }
    if let Some((body, required)) = route.request
        && let Some(content) = content(generator, body)
    {
        op["requestBody"] = json!({"required": required, "content": content});
    }
    op
}

/// The whole document.
fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    // The error body is referred to by name from every error response.
    let _ = of::<ErrorBody>(&mut generator);
    let mut paths = Map::new();
    for route in ROUTES {
        let op = operation(&mut generator, route);
        let item = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        item[route.method] = op;
    }
    let schemas: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Wuhu HTTP API",
            "version": "1",
            "description": "Sessions of LLM agents, their transcripts and follow streams, runners and environments, \
                the workspace, sign-in and chat channels. Prose, bounds and semantics: docs/api.md. \
                Every error is `{\"error\":{\"code\",\"message\"}}`. Generated from the wire types in \
                wuhu-core (core/src/openapi.rs); do not edit by hand.",
        },
        "servers": [{"url": "/"}],
        "tags": [
            {"name": "meta"}, {"name": "sessions"}, {"name": "sign-in"}, {"name": "runners"},
            {"name": "workspace"}, {"name": "channels"}, {"name": "usage"}, {"name": "secrets"}, {"name": "policy"}, {"name": "mcp"},
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                    "description": "A user token (HS256, docs/api.md), or a runner token on /v1/runners/connect."},
                "cookie": {"type": "apiKey", "in": "cookie", "name": "wuhu_session",
                    "description": "The web app's cookie session (POST /v1/auth/session); state-changing requests pass a cross-site check."},
                "access": {"type": "apiKey", "in": "header", "name": "Cf-Access-Jwt-Assertion",
                    "description": "Cloudflare Access, when configured (or its CF_Authorization cookie)."},
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed document is what the code generates. `UPDATE_EXPECT=1` rewrites it.
    #[test]
    fn docs_openapi_json_is_generated_from_the_wire_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let generated = serde_json::to_string_pretty(&document()).expect("document") + "\n";
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(path, &generated).expect("write docs/openapi.json");
            return;
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json differs from what core/src/openapi.rs generates; \
             run `UPDATE_EXPECT=1 cargo test -p wuhu-core openapi` and commit the result"
        );
    }

    /// Every `$ref` names a schema the document has, and every operation id is unique.
    #[test]
    fn references_resolve_and_operation_ids_are_unique() {
        let document = document();
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        let mut refs = Vec::new();
        collect_refs(&document, &mut refs);
        assert!(!refs.is_empty());
        for reference in refs {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected $ref {reference}"));
            assert!(schemas.contains_key(name), "$ref to missing schema {name}");
        }
        for (from, _, targets, _, _) in LINKS {
            for id in std::iter::once(from).chain(targets.iter()) {
                assert!(ROUTES.iter().any(|r| r.id == *id), "link names {id}");
            }
        }
        let mut ids: Vec<&str> = ROUTES.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate operationId");
    }

    /// A field whose description says it takes one of a set ("`user` or `runner`") is an enum
    /// in the document, so a generated client knows the values (issue 31).
    #[test]
    fn fields_documented_as_a_set_are_enums() {
        let document = document();
        let mut found = Vec::new();
        collect_free_sets(&document["components"]["schemas"], "", &mut found);
        assert!(
            found.is_empty(),
            "string fields documented as one of a set, without an enum: {found:#?}"
        );
        // The rule sees what it should.
        for (text, set) in [
            ("`user` or `runner`.", true),
            ("`member` (default) or `admin` (admins only).", true),
            ("`approve`, `approve_session` or `deny`.", true),
            ("Switch to this provider (one of `a`, `b`).", true),
            ("The `jti` of the token.", false),
            ("A label for the list.", false),
        ] {
            assert_eq!(documents_a_set(text), set, "{text}");
        }
    }

    /// Whether `description` lists the values a string takes: its first clause is only
    /// backticked words joined by commas and "or" (parenthesised remarks aside), or it says
    /// "one of `".
    fn documents_a_set(description: &str) -> bool {
        if description.contains("one of `") {
            return true;
        }
        let clause = description
            .split(['.', ';', '\n'])
            .next()
            .unwrap_or_default();
        let mut plain = String::new();
        let mut depth = 0usize;
        for c in clause.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        let words: Vec<&str> = plain.split('`').collect();
        // Odd pieces are inside backticks; even ones must be separators only.
        words.len() >= 5
            && words.len() % 2 == 1
            && words.iter().step_by(2).enumerate().all(|(i, sep)| {
                let sep = sep.trim();
                let last = i == words.len() / 2;
                (i == 0 || last) && sep.is_empty() || matches!(sep, "," | "or" | ", or")
            })
    }

    fn collect_free_sets(value: &Value, path: &str, out: &mut Vec<String>) {
        let Value::Object(map) = value else {
            if let Value::Array(items) = value {
                for (i, item) in items.iter().enumerate() {
                    collect_free_sets(item, &format!("{path}[{i}]"), out);
                }
            }
            return;
        };
        let is_string = match map.get("type") {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
            _ => false,
        };
        let constrained = ["enum", "const", "$ref", "oneOf", "anyOf"]
            .iter()
            .any(|k| map.contains_key(*k));
        if is_string
            && !constrained
            && map
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(documents_a_set)
        {
            out.push(format!("{path}: {}", map["description"]));
        }
        for (key, child) in map {
            collect_free_sets(child, &format!("{path}.{key}"), out);
        }
    }

    fn collect_refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("$ref", Value::String(r)) => out.push(r.clone()),
                        _ => collect_refs(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
