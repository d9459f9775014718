//! The store's AWS credentials: the chain the AWS SDKs use (`aws-config`'s default chain),
//! cached and refreshed before they expire.
//!
//! The chain, in order: the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`); the shared files (`~/.aws/credentials`, `~/.aws/config`, moved by
//! `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`) for the profile `AWS_PROFILE` (default
//! `default`) with static keys, `credential_process`, SSO (`sso_session`, after `aws sso
//! login`), `role_arn` with `source_profile` or `credential_source`, or `web_identity_token_file`;
//! a web identity token (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, as EKS and other
//! OIDC-federated platforms set them); ECS and other container credentials
//! (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` / `_FULL_URI`); EC2 instance metadata (IMDSv2: a
//! session token first, then the role's credentials; `AWS_EC2_METADATA_SERVICE_ENDPOINT` moves
//! it, `AWS_EC2_METADATA_DISABLED=true` turns it off). Endpoints of the services the chain calls
//! follow the SDKs' variables (`AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`).
//!
//! The chain's HTTP requests (STS, SSO, IMDS, ECS) go through the runner's own reqwest client
//! ([`reqwest_http_client`]), the one the S3 calls use, so no second HTTP and TLS stack is built.
//!
//! [`CredentialCache`] fetches once at start (no credentials stops the runner with the chain's
//! reasons) and again before the credentials expire, by the rule in
//! [`rules::needs_refresh`](super::rules::needs_refresh).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::meta::region::RegionProviderChain;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector, http_client_fn,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::http::{Response as SdkResponse, StatusCode};
use aws_smithy_types::body::SdkBody;

use super::rules;

/// How long one fetch through the chain may take (a `credential_process`, an STS call with its
/// retries, IMDS).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// The most a credentials endpoint's answer may hold (they are a few KB).
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The region the S3 requests are signed for: `--store-region`, else `AWS_REGION`,
/// `AWS_DEFAULT_REGION`, the profile's `region`, else `us-east-1`. Also returns the region for
/// the chain's own STS calls, which ignores the flag (R2's `auto` is no STS region).
pub async fn resolve_regions(flag: Option<&str>) -> (String, String) {
    let configured = RegionProviderChain::first_try(
        aws_config::environment::region::EnvironmentVariableRegionProvider::new(),
    )
    .or_else(aws_config::profile::ProfileFileRegionProvider::builder().build())
    .region()
    .await
    .map(|r| r.to_string())
    .filter(|r| !r.is_empty());
    let sts = configured
        .clone()
        .unwrap_or_else(|| String::from("us-east-1"));
    let signing = flag
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .or(configured)
        .unwrap_or_else(|| String::from("us-east-1"));
    (signing, sts)
}

/// The SDKs' default credentials chain, its requests sent by `http`.
pub async fn default_chain(sts_region: &str, http: reqwest::Client) -> SharedCredentialsProvider {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(sts_region.to_string()))
        .http_client(reqwest_http_client(http))
        .load()
        .await;
    config
        .credentials_provider()
        .unwrap_or_else(|| SharedCredentialsProvider::new(NoCredentials))
}

/// Stands in when the loader built no chain (it always does with the default features).
#[derive(Debug)]
struct NoCredentials;

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no credentials chain",
            ),
        ))
    }
}

/// Keys as the signer wants them, where they came from and when they expire.
#[derive(Clone)]
struct Current {
    keys: Arc<rusty_s3::Credentials>,
    /// Unix seconds; `None`: they do not expire.
    expires_at: Option<i64>,
    fetched_at: i64,
    source: String,
}

/// The credentials in use and how to get new ones.
pub struct CredentialCache {
    provider: SharedCredentialsProvider,
    current: std::sync::Mutex<Current>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for CredentialCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialCache")
            .field("source", &self.source())
            .finish_non_exhaustive()
    }
}

fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// One fetch through `provider`, bounded by [`FETCH_TIMEOUT`]. The message never holds a key.
async fn fetch(provider: &SharedCredentialsProvider, now: i64) -> Result<Current, String> {
    let fetched = tokio::time::timeout(FETCH_TIMEOUT, provider.provide_credentials())
        .await
        .map_err(|_| {
            format!(
                "no answer from the credentials chain within {} s",
                FETCH_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| error_chain(&e))?;
    let keys = match fetched.session_token() {
        Some(token) => rusty_s3::Credentials::new_with_token(
            fetched.access_key_id(),
            fetched.secret_access_key(),
            token,
        ),
        None => rusty_s3::Credentials::new(fetched.access_key_id(), fetched.secret_access_key()),
    };
    Ok(Current {
        keys: Arc::new(keys),
        expires_at: fetched.expiry().map(unix_seconds),
        fetched_at: now,
        source: provider_label(&fetched),
    })
}

/// Where credentials came from, in the chain's words (`Environment`, `ProfileFile`,
/// `CredentialProcess`, `Sso`, `AssumeRoleProvider`, `WebIdentityToken`, `EcsContainer`,
/// `IMDSv2`…).
fn provider_label(credentials: &aws_credential_types::Credentials) -> String {
    format!("{:?}", credentials)
        .split("provider_name: \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_string)
        .unwrap_or_else(|| String::from("the AWS credentials chain"))
}

/// The error with its causes (the chain's error names each provider it tried).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

impl CredentialCache {
    /// Fetches the first credentials from `provider`.
    ///
    /// # Errors
    ///
    /// The chain's reasons when no provider had credentials.
    pub async fn new(provider: SharedCredentialsProvider) -> Result<CredentialCache, String> {
        let current = fetch(&provider, crate::unix_now()).await?;
        Ok(CredentialCache {
            provider,
            current: std::sync::Mutex::new(current),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// Where the credentials in use came from, and when they expire.
    pub fn source(&self) -> String {
        let current = self.current();
        match current.expires_at {
            None => current.source,
            Some(at) => format!(
                "{}, expiring in {} s",
                current.source,
                at - crate::unix_now()
            ),
        }
    }

    fn current(&self) -> Current {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The keys to sign with now.
    ///
    /// # Errors
    ///
    /// The chain's reasons when the keys expired and could not be fetched again.
    pub async fn keys(&self) -> Result<Arc<rusty_s3::Credentials>, String> {
        self.keys_at(crate::unix_now()).await
    }

    /// The keys to sign with at `now` (unix seconds): fetched again when
    /// [`rules::needs_refresh`] says so; a failed refresh keeps the old keys while they are
    /// valid (logged) and fails once they expired.
    ///
    /// # Errors
    ///
    /// As [`CredentialCache::keys`].
    pub async fn keys_at(&self, now: i64) -> Result<Arc<rusty_s3::Credentials>, String> {
        let current = self.current();
        if !rules::needs_refresh(current.expires_at, current.fetched_at, now) {
            return Ok(current.keys);
        }
        let _one = self.refreshing.lock().await;
        let current = self.current();
        if !rules::needs_refresh(current.expires_at, current.fetched_at, now) {
            return Ok(current.keys);
        }
        match fetch(&self.provider, now).await {
            Ok(next) => {
                eprintln!(
                    "wuhu-runner: store: credentials refreshed from {}{}",
                    next.source,
                    next.expires_at
                        .map(|at| format!(", expiring in {} s", at - now))
                        .unwrap_or_default()
                );
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
                Ok(next.keys)
            }
            Err(e) => {
                let still_valid = current.expires_at.is_none_or(|at| now < at);
                let mut kept = current.clone();
                kept.fetched_at = now;
                *self.current.lock().unwrap_or_else(|p| p.into_inner()) = kept;
                eprintln!(
                    "wuhu-runner: store: refreshing the credentials ({}) failed{}: {e}",
                    current.source,
                    if still_valid {
                        "; the current ones are used until they expire"
                    } else {
                        ""
                    }
                );
                if still_valid {
                    Ok(current.keys)
                } else {
                    Err(format!("the store's credentials expired: {e}"))
                }
            }
        }
    }
}

/// The credentials chain's HTTP client: the runner's reqwest client (proxies from `HTTPS_PROXY`
/// and `NO_PROXY`, as for the S3 calls), with the chain's connect and read timeouts per request.
/// Bodies are small and buffered (at most [`MAX_RESPONSE_BYTES`]).
pub fn reqwest_http_client(http: reqwest::Client) -> SharedHttpClient {
    http_client_fn(move |settings: &HttpConnectorSettings, _components| {
        SharedHttpConnector::new(Connector {
            http: http.clone(),
            timeout: settings
                .read_timeout()
                .zip(settings.connect_timeout())
                .map(|(read, connect)| read + connect),
        })
    })
}

#[derive(Clone, Debug)]
struct Connector {
    http: reqwest::Client,
    timeout: Option<Duration>,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let http = self.http.clone();
        let timeout = self.timeout;
        HttpConnectorFuture::new(async move { send(http, timeout, request).await })
    }
}

async fn send(
    http: reqwest::Client,
    timeout: Option<Duration>,
    request: HttpRequest,
) -> Result<SdkResponse<SdkBody>, ConnectorError> {
    let method = reqwest::Method::from_bytes(request.method().as_bytes())
        .map_err(|e| ConnectorError::user(Box::new(e)))?;
    let url: reqwest::Url = request
        .uri()
        .parse()
        .map_err(|e: url::ParseError| ConnectorError::user(Box::new(e)))?;
    let body = request
        .body()
        .bytes()
        .map(<[u8]>::to_vec)
        .ok_or_else(|| ConnectorError::user("a streaming request body".into()))?;
    let mut builder = http.request(method, url).body(body);
    for (name, value) in request.headers() {
        builder = builder.header(name, value);
    }
    if let Some(timeout) = timeout {
        builder = builder.timeout(timeout);
    }
    let response = builder.send().await.map_err(|e| {
        if e.is_timeout() {
            ConnectorError::timeout(Box::new(e))
        } else {
            ConnectorError::io(Box::new(e))
        }
    })?;
    let status = StatusCode::try_from(response.status().as_u16())
        .map_err(|e| ConnectorError::other(Box::new(e), None))?;
    let headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ConnectorError::io(Box::new(e)))?
    {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(ConnectorError::other(
                format!("a credentials answer over {MAX_RESPONSE_BYTES} bytes").into(),
                None,
            ));
        }
        body.extend_from_slice(&chunk);
    }
    let mut out = SdkResponse::new(status, SdkBody::from(body));
    for (name, value) in headers {
        out.headers_mut().append(name, value);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
