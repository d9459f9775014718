//! OAuth 2.1 for MCP servers that need it (the MCP authorization spec, revision 2025-06-18):
//! protected-resource metadata (RFC 9728) names the authorization server, its metadata (RFC
//! 8414, or OpenID discovery) names the endpoints, the client registers itself (RFC 7591), and a
//! person signs in through the browser: authorization code with PKCE (S256) and the `resource`
//! indicator (RFC 8707). The tokens are kept sealed per person and server, refreshed when they
//! expire. Pure: the host fetches, stores and redirects.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::jwt::base64url_encode;

/// How long a sign-in may take, from `connect` to the callback (milliseconds).
pub const PENDING_TTL_MS: u64 = 10 * 60 * 1000;
/// A token this close to its expiry is refreshed before use (milliseconds).
pub const REFRESH_MARGIN_MS: u64 = 60 * 1000;
/// The most bytes of a metadata or token answer read.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;
/// The callback route (on the API's origin).
pub const CALLBACK_PATH: &str = "/v1/mcp/callback";

/// Where a server's protected-resource metadata may be, in order (RFC 9728 §3.1: the path
/// inserted after the well-known prefix, then the origin's own).
pub fn resource_metadata_urls(server_url: &str) -> Vec<String> {
    let Ok(url) = url::Url::parse(server_url) else {
        return Vec::new();
    };
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    let mut urls = Vec::new();
    if !path.is_empty() {
        urls.push(format!(
            "{origin}/.well-known/oauth-protected-resource{path}"
        ));
    }
    urls.push(format!("{origin}/.well-known/oauth-protected-resource"));
    urls
}

/// The `resource_metadata` URL of a `WWW-Authenticate: Bearer …` challenge (RFC 9728 §5.1).
pub fn resource_metadata_from_challenge(header: &str) -> Option<String> {
    let at = header.find("resource_metadata=")?;
    let rest = &header[at + "resource_metadata=".len()..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split([',', ' ']).next()?,
    };
    (!value.is_empty()).then(|| value.to_string())
}

/// What a server's protected-resource metadata says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceMetadata {
    /// The resource's identifier (what tokens are asked for).
    pub resource: String,
    /// Its authorization server (the first listed).
    pub authorization_server: String,
    /// The scopes it names (asked for, when it names any).
    pub scopes: Vec<String>,
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn string(value: &Value, key: &str) -> Option<String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Reads protected-resource metadata; `server_url` is the resource when it names none.
///
/// # Errors
/// What is missing.
pub fn parse_resource_metadata(body: &Value, server_url: &str) -> Result<ResourceMetadata, String> {
    let authorization_server = strings(body, "authorization_servers")
        .into_iter()
        .next()
        .ok_or("its protected-resource metadata names no authorization server")?;
    Ok(ResourceMetadata {
        resource: string(body, "resource").unwrap_or_else(|| canonical_resource(server_url)),
        authorization_server,
        scopes: strings(body, "scopes_supported"),
    })
}

/// A server's canonical URI as a `resource` parameter (RFC 8707; the MCP spec: scheme and host
/// lowercase, no fragment).
pub fn canonical_resource(server_url: &str) -> String {
    match url::Url::parse(server_url) {
        Ok(mut url) => {
            url.set_fragment(None);
            url.to_string()
        }
        Err(_) => server_url.to_string(),
    }
}

/// Where an authorization server's metadata may be, in order (RFC 8414 §3.1 with the issuer's
/// path inserted, then OpenID discovery both ways).
pub fn authorization_metadata_urls(issuer: &str) -> Vec<String> {
    let Ok(url) = url::Url::parse(issuer) else {
        return Vec::new();
    };
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    }
}

/// The endpoints of an authorization server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationServer {
    /// Where the person signs in.
    pub authorization_endpoint: String,
    /// Where codes and refresh tokens become tokens.
    pub token_endpoint: String,
    /// Where a client registers itself (none: this client cannot sign in there).
    pub registration_endpoint: Option<String>,
}

/// Reads authorization-server metadata.
///
/// # Errors
/// What is missing, or PKCE with S256 not offered.
pub fn parse_authorization_metadata(body: &Value) -> Result<AuthorizationServer, String> {
    let endpoint = |key: &str| {
        string(body, key).ok_or_else(|| format!("its authorization server names no {key}"))
    };
    let methods = strings(body, "code_challenge_methods_supported");
    // The MCP spec: a server that does not list S256 does not support PKCE; this client needs it.
    if !methods.iter().any(|m| m == "S256") {
        return Err(
            "its authorization server does not offer PKCE with S256 (code_challenge_methods_supported)"
                .into(),
        );
    }
    Ok(AuthorizationServer {
        authorization_endpoint: endpoint("authorization_endpoint")?,
        token_endpoint: endpoint("token_endpoint")?,
        registration_endpoint: string(body, "registration_endpoint"),
    })
}

/// The dynamic client registration request (RFC 7591): a public client with PKCE.
pub fn registration_request(redirect_uri: &str) -> Value {
    json!({
        "client_name": "Wuhu",
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })
}

/// The client a registration made.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Client {
    /// Its id.
    pub client_id: String,
    /// Its secret, when the server gave one (then sent to the token endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
}

/// Reads a registration's answer.
///
/// # Errors
/// No `client_id`.
pub fn parse_registration(body: &Value) -> Result<Client, String> {
    Ok(Client {
        client_id: string(body, "client_id").ok_or("its registration answered no client_id")?,
        client_secret: string(body, "client_secret"),
    })
}

/// A PKCE pair from 32 random bytes: the verifier (43 characters) and its S256 challenge.
pub fn pkce(random: [u8; 32]) -> (String, String) {
    let verifier = base64url_encode(&random);
    let challenge = base64url_encode(&Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// A sign-in on its way: what the callback needs, kept (sealed) under the state's hash.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    /// Whose.
    pub tenant: String,
    /// Who signs in.
    pub sub: String,
    /// Where the server is listed: `tenant` or `user`.
    pub source: String,
    /// The server's name.
    pub server: String,
    /// Its URL when the sign-in began (a connection holds only for it).
    pub url: String,
    /// The resource asked for.
    pub resource: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// The registered client.
    pub client: Client,
    /// Where the code becomes tokens.
    pub token_endpoint: String,
    /// The redirect URI the code was sent to.
    pub redirect_uri: String,
    /// When it ends (milliseconds).
    pub expires_at_ms: u64,
    /// The code the authorization server sent back (the callback keeps it; the person who
    /// began the sign-in finishes it, `POST /v1/mcp/finish`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// Who may finish a sign-in: only the person who began it, in their tenant. The callback is
/// reached by whatever browser the authorization server sends back, so a sign-in someone began
/// and another completed in their own browser (their account at the server) must not become
/// the first one's connection (the login CSRF of OAuth): the second person's finish is refused.
///
/// # Errors
/// The refusal, for a 403.
pub fn may_finish(pending: &Pending, tenant: &str, sub: &str) -> Result<(), String> {
    if pending.tenant == tenant && pending.sub == sub {
        Ok(())
    } else {
        Err(format!(
            "this sign-in to {:?} was begun by another person; only they finish it",
            pending.server
        ))
    }
}

/// The web app's page that finishes a sign-in: the callback sends the browser there.
pub fn finish_location(state: &str) -> String {
    format!("/#/mcp/finish/{state}")
}

/// The address the person's browser goes to.
pub fn authorization_url(
    server: &AuthorizationServer,
    pending: &Pending,
    challenge: &str,
    state: &str,
    scopes: &[String],
) -> Result<String, String> {
    let mut url = url::Url::parse(&server.authorization_endpoint)
        .map_err(|e| format!("its authorization endpoint is not a URL: {e}"))?;
    {
        let mut query = url.query_pairs_mut();
        query
            .append_pair("response_type", "code")
            .append_pair("client_id", &pending.client.client_id)
            .append_pair("redirect_uri", &pending.redirect_uri)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", state)
            .append_pair("resource", &pending.resource);
        if !scopes.is_empty() {
            query.append_pair("scope", &scopes.join(" "));
        }
    }
    Ok(url.to_string())
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The token request for the code the callback got (`application/x-www-form-urlencoded`).
pub fn code_request(pending: &Pending, code: &str) -> String {
    let mut pairs = vec![
        ("grant_type", "authorization_code"),
        ("code", code),
        ("redirect_uri", pending.redirect_uri.as_str()),
        ("client_id", pending.client.client_id.as_str()),
        ("code_verifier", pending.verifier.as_str()),
        ("resource", pending.resource.as_str()),
    ];
    if let Some(secret) = &pending.client.client_secret {
        pairs.push(("client_secret", secret));
    }
    form(&pairs)
}

/// A person's connection to a server: kept sealed, used by their turns.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    /// The server's URL it was made for.
    pub url: String,
    /// The access token.
    pub access_token: String,
    /// The refresh token, when the server gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// When the access token ends (milliseconds; none: the server did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The client it was issued to.
    pub client: Client,
    /// Where it is refreshed.
    pub token_endpoint: String,
    /// The resource it is for.
    pub resource: String,
    /// When it was made (milliseconds).
    pub connected_at_ms: u64,
}

impl Connection {
    /// Whether the access token should be refreshed before use at `now_ms`.
    pub fn stale(&self, now_ms: u64) -> bool {
        self.expires_at_ms
            .is_some_and(|at| now_ms.saturating_add(REFRESH_MARGIN_MS) >= at)
    }

    /// The refresh request, when it can be refreshed.
    pub fn refresh_request(&self) -> Option<String> {
        let refresh = self.refresh_token.as_deref()?;
        let mut pairs = vec![
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh),
            ("client_id", self.client.client_id.as_str()),
            ("resource", self.resource.as_str()),
        ];
        if let Some(secret) = &self.client.client_secret {
            pairs.push(("client_secret", secret));
        }
        Some(form(&pairs))
    }
}

/// Reads a token answer into the connection it makes (a refresh keeps the old refresh token
/// when the server sends none).
///
/// # Errors
/// An OAuth error answer (`error`, `error_description`), or no `access_token`.
pub fn parse_tokens(
    body: &Value,
    now_ms: u64,
    previous_refresh: Option<&str>,
) -> Result<(String, Option<String>, Option<u64>), String> {
    if let Some(error) = string(body, "error") {
        let detail = string(body, "error_description")
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        return Err(format!("the authorization server refused: {error}{detail}"));
    }
    let access = string(body, "access_token").ok_or("the token answer holds no access_token")?;
    if let Some(kind) = string(body, "token_type")
        && !kind.eq_ignore_ascii_case("bearer")
    {
        return Err(format!("the token is of type {kind:?}, not bearer"));
    }
    let refresh = string(body, "refresh_token").or_else(|| previous_refresh.map(str::to_string));
    let expires = body
        .get("expires_in")
        .and_then(Value::as_u64)
        .map(|secs| now_ms.saturating_add(secs.saturating_mul(1000)));
    Ok((access, refresh, expires))
}

/// The hex SHA-256 of a state (what pending sign-ins are kept under: the state itself is never
/// stored).
pub fn state_key(state: &str) -> String {
    hex::encode(Sha256::digest(state.as_bytes()))
}

/// Whether `state` can be one this client made (43 base64url characters).
pub fn valid_state(state: &str) -> bool {
    state.len() == 43
        && state
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `POST /v1/mcp/servers/{name}/connect`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ConnectResponse {
    /// Where the person's browser goes to sign in.
    pub authorization_url: String,
    /// When the sign-in must be finished (Unix seconds).
    pub expires_at: u64,
}

/// `POST /v1/mcp/finish`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FinishRequest {
    /// The sign-in's state (from the page the callback sent the browser to).
    pub state: String,
}

/// The answer of `POST /v1/mcp/finish`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FinishResponse {
    /// The server now connected.
    pub server: String,
}

/// `DELETE /v1/mcp/servers/{name}/connection`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DisconnectResponse {
    /// Whether there was a connection to forget.
    pub disconnected: bool,
}
