//! # wuhu-client
//!
//! A typed client of the Wuhu HTTP API v1 (`docs/api.md`) for Rust programs, on `reqwest` and
//! `tokio`. The request and response bodies are `wuhu_core::wire` types, the same ones the
//! server serialises, so client and server cannot drift apart.
//!
//! * [`Client`]: one server and one bearer token; a method per route.
//! * [`Error`]: what a call can fail with. [`Error::Api`] carries the server's status and its
//!   stable `code` (`not_found`, `unauthorized`, `queue_full`, ...).
//! * [`Follow`]: the follow stream of one session. It reconnects by itself after a dropped
//!   connection, a `lagged` or `error` event or a server restart, resuming with
//!   `Last-Event-ID` from the last entry it yielded, with exponential back-off; it never yields
//!   an entry twice and never skips one.
//!
//! ```no_run
//! use wuhu_client::{Client, FollowEvent, FollowOptions};
//! use wuhu_core::wire::{Lane, StreamEvent};
//!
//! # async fn run() -> Result<(), wuhu_client::Error> {
//! let client = Client::new("http://127.0.0.1:8787", Some("eyJ…".to_string()))?;
//! let session = client.create_session(&Default::default()).await?;
//! client.enqueue(&session.id, Lane::FollowUp, "hello").await?;
//! let mut follow = client.follow(&session.id, FollowOptions::until_idle());
//! while let Some(event) = follow.next().await {
//!     match event? {
//!         FollowEvent::Event(StreamEvent::AssistantTextDelta { delta }) => print!("{delta}"),
//!         FollowEvent::Event(StreamEvent::EntryAppended { entry }) => {
//!             eprintln!("entry {}", entry.cursor)
//!         }
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs, unreachable_pub)]

mod follow;

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use wuhu_core::secrets::{PutSecretRequest, SecretInfo, SecretList, SecretScope};
use wuhu_core::wire::{
    AnswerApprovalRequest, AnswerApprovalResponse, CancelRequest, CancelResponse,
    CreateEnvironmentRequest, CreateSessionRequest, Doc, DocList, DocSummary, EnqueueRequest,
    EnqueueResponse, Entry, EnvironmentDefinition, ErrorBody, GetSessionResponse, Lane,
    ListEnvironmentsResponse, ListRunnersResponse, ListSessionsResponse, ListTokensResponse,
    MintTokenRequest, MintTokenResponse, PatchSessionRequest, RevokeAllRequest, RevokeAllResponse,
    SessionInfo, StopResponse, UpdateEnvironmentRequest,
};

pub use follow::{Backoff, Follow, FollowEvent, FollowOptions, MAX_FRAME_BYTES, SILENCE_TIMEOUT};

/// How long an ordinary request may take, head and body (follow streams have no such limit).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most transcript entries one page asks for (the server's maximum).
pub const TRANSCRIPT_PAGE_LIMIT: u32 = 1000;
/// How many times [`Client::enqueue`] sends one message whose answer was lost.
pub const ENQUEUE_ATTEMPTS: u32 = 3;
/// The wait before [`Client::enqueue`]'s second attempt; the third waits twice as long.
pub const ENQUEUE_RETRY_DELAY: Duration = Duration::from_millis(250);

/// What a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error body: `status` and its stable `code`.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's machine code, such as `not_found` or `unauthorized`.
        code: String,
        /// The server's human message.
        message: String,
    },
    /// The request did not reach the server, or its answer did not arrive whole.
    #[error("cannot reach the server: {0}")]
    Transport(#[source] reqwest::Error),
    /// The server answered something this client does not understand.
    #[error("unexpected answer (HTTP {status}): {message}")]
    Decode {
        /// HTTP status.
        status: u16,
        /// What did not parse.
        message: String,
    },
    /// The server URL cannot be used.
    #[error("invalid server url {url:?}: {message}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why.
        message: String,
    },
    /// The follow stream gave up: too many failed reconnects in a row, or a frame over the bound.
    #[error("follow stream ended: {0}")]
    Follow(String),
}

impl Error {
    /// The server's error code, for [`Error::Api`].
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } | Error::Decode { status, .. } => Some(*status),
            Error::Transport(error) => error.status().map(|s| s.as_u16()),
            Error::InvalidUrl { .. } | Error::Follow(_) => None,
        }
    }

    /// Whether trying again later may succeed: the server was unreachable, or answered 429,
    /// 502, 503 or 504.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport(_) => true,
            Error::Api { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            Error::Decode { status, .. } => *status >= 500,
            Error::InvalidUrl { .. } | Error::Follow(_) => false,
        }
    }
}

/// Query of `GET /v1/sessions/:id`.
#[derive(Clone, Copy, Debug, Default)]
pub struct TranscriptQuery {
    /// Entries after this cursor.
    pub since_cursor: Option<u64>,
    /// Entries created after this unix second.
    pub since_time: Option<i64>,
    /// At most this many entries (1–1000).
    pub limit: Option<u32>,
}

/// A client of one server, bound to one bearer token. Cheap to clone (the connection pool is
/// shared).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `base` (`https://wuhu.example.com`, `http://127.0.0.1:8787`).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when `base` is not an `http` or `https` URL.
    pub fn new(base: &str, token: Option<String>) -> Result<Client, Error> {
        let invalid = |message: &str| Error::InvalidUrl {
            url: base.to_string(),
            message: message.to_string(),
        };
        let mut url = Url::parse(base).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(invalid("must be an http or https url"));
        }
        // Routes are appended as segments: a base path keeps its segments, without a trailing
        // empty one.
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty();
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("wuhu-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| invalid(&e.to_string()))?;
        Ok(Client {
            http,
            base: url,
            token,
        })
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// The bearer token, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The URL of a route given as path segments (each one percent-encoded as needed).
    pub fn url<'a>(&self, segments: impl IntoIterator<Item = &'a str>) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.extend(segments);
        }
        url
    }

    /// A request with the bearer token set, for routes this client has no method for.
    pub fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// `GET /healthz`: whether the server answers `{"ok":true}`.
    ///
    /// # Errors
    /// As every call: [`Error::Transport`], [`Error::Api`], [`Error::Decode`].
    pub async fn healthz(&self) -> Result<bool, Error> {
        let value: serde_json::Value = self.get(self.url(["healthz"])).await?;
        Ok(value["ok"] == true)
    }

    /// `POST /v1/sessions`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn create_session(&self, body: &CreateSessionRequest) -> Result<SessionInfo, Error> {
        self.send_json(Method::POST, self.url(["v1", "sessions"]), body)
            .await
    }

    /// `GET /v1/sessions?limit=&before=`: one page, newest first.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_sessions(
        &self,
        limit: Option<u32>,
        before: Option<&str>,
    ) -> Result<ListSessionsResponse, Error> {
        let mut url = self.url(["v1", "sessions"]);
        {
            let mut query = url.query_pairs_mut();
            if let Some(limit) = limit {
                query.append_pair("limit", &limit.to_string());
            }
            if let Some(before) = before {
                query.append_pair("before", before);
            }
        }
        strip_empty_query(&mut url);
        self.get(url).await
    }

    /// `GET /v1/sessions/:id`: the session, one transcript page and the queue.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn session(
        &self,
        id: &str,
        query: TranscriptQuery,
    ) -> Result<GetSessionResponse, Error> {
        let mut url = self.url(["v1", "sessions", id]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(cursor) = query.since_cursor {
                pairs.append_pair("sinceCursor", &cursor.to_string());
            }
            if let Some(time) = query.since_time {
                pairs.append_pair("sinceTime", &time.to_string());
            }
            if let Some(limit) = query.limit {
                pairs.append_pair("limit", &limit.to_string());
            }
        }
        strip_empty_query(&mut url);
        self.get(url).await
    }

    /// The whole transcript after `since_cursor`, paging until `nextCursor` is null; the
    /// session and queue are those of the last page.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn transcript(
        &self,
        id: &str,
        since_cursor: u64,
    ) -> Result<GetSessionResponse, Error> {
        let mut cursor = since_cursor;
        let mut entries: Vec<Entry> = Vec::new();
        loop {
            let mut page = self
                .session(
                    id,
                    TranscriptQuery {
                        since_cursor: Some(cursor),
                        since_time: None,
                        limit: Some(TRANSCRIPT_PAGE_LIMIT),
                    },
                )
                .await?;
            entries.append(&mut page.transcript);
            match page.next_cursor {
                // A page always holds at least one entry, so this advances.
                Some(next) if next > cursor => cursor = next,
                _ => {
                    page.transcript = entries;
                    page.next_cursor = None;
                    return Ok(page);
                }
            }
        }
    }

    /// `POST /v1/sessions/:id/enqueue?lane=`: queues a message; a session at rest starts a turn.
    ///
    /// The message is sent with a fresh idempotency key, and sent again with the same key when
    /// its answer is lost (the connection failed, or a gateway answered 502, 503 or 504): at
    /// most [`ENQUEUE_ATTEMPTS`] times. The server queues a key once, so a message whose first
    /// answer was lost on the way back is queued once, and the retry gets the first answer.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for [`Lane::System`] (internal).
    pub async fn enqueue(
        &self,
        id: &str,
        lane: Lane,
        content: &str,
    ) -> Result<EnqueueResponse, Error> {
        self.enqueue_reasoning(id, lane, content, None).await
    }

    /// [`Client::enqueue`] with a reasoning setting for the message's turn (`None`: the
    /// session's).
    ///
    /// # Errors
    /// As [`Client::enqueue`]; `400 invalid_reasoning` for a setting the model cannot take.
    pub async fn enqueue_reasoning(
        &self,
        id: &str,
        lane: Lane,
        content: &str,
        reasoning: Option<wuhu_core::llm::reasoning::Reasoning>,
    ) -> Result<EnqueueResponse, Error> {
        let key = format!("wuhu-client-{}", uuid::Uuid::new_v4());
        let mut attempt = 1;
        loop {
            let body = EnqueueRequest {
                content: content.to_string(),
                key: Some(key.clone()),
                reasoning,
            };
            match self.enqueue_body(id, lane, &body).await {
                Err(error) if attempt < ENQUEUE_ATTEMPTS && answer_may_be_lost(&error) => {
                    tokio::time::sleep(ENQUEUE_RETRY_DELAY * attempt).await;
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// [`Client::enqueue`] once, with the caller's idempotency key (1 to 128 printable ASCII
    /// characters): sending the same key again to the same session queues nothing more and
    /// answers the first item.
    ///
    /// # Errors
    /// As [`Client::enqueue`]; `400` for a key that is not 1 to 128 printable ASCII characters.
    pub async fn enqueue_with_key(
        &self,
        id: &str,
        lane: Lane,
        content: &str,
        key: &str,
    ) -> Result<EnqueueResponse, Error> {
        let body = EnqueueRequest {
            content: content.to_string(),
            key: Some(key.to_string()),
            reasoning: None,
        };
        self.enqueue_body(id, lane, &body).await
    }

    /// `POST /v1/sessions/:id/enqueue?lane=` with `body`, once.
    async fn enqueue_body(
        &self,
        id: &str,
        lane: Lane,
        body: &EnqueueRequest,
    ) -> Result<EnqueueResponse, Error> {
        let mut url = self.url(["v1", "sessions", id, "enqueue"]);
        let lane = match lane {
            Lane::Steer => "steer",
            Lane::FollowUp => "followUp",
            Lane::System => "system",
        };
        url.query_pairs_mut().append_pair("lane", lane);
        self.send_json(Method::POST, url, body).await
    }

    /// `POST /v1/sessions/:id/cancel`: withdraws a queued item not yet delivered.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `409 already_delivered` when it is in the transcript already.
    pub async fn cancel(&self, id: &str, item_id: &str) -> Result<CancelResponse, Error> {
        let body = CancelRequest {
            id: item_id.to_string(),
        };
        self.send_json(
            Method::POST,
            self.url(["v1", "sessions", id, "cancel"]),
            &body,
        )
        .await
    }

    /// `POST /v1/sessions/:id/stop`: ends the current turn.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn stop(&self, id: &str) -> Result<StopResponse, Error> {
        self.send_json(
            Method::POST,
            self.url(["v1", "sessions", id, "stop"]),
            &serde_json::json!({}),
        )
        .await
    }

    /// `PATCH /v1/sessions/:id`: title and/or access.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn patch_session(
        &self,
        id: &str,
        body: &PatchSessionRequest,
    ) -> Result<SessionInfo, Error> {
        self.send_json(Method::PATCH, self.url(["v1", "sessions", id]), body)
            .await
    }

    /// `DELETE /v1/sessions/:id`: deletes the session, its children and everything stored for
    /// it (its owner or an admin). `true` when the deletion is finished (`204`), `false` when it
    /// finishes in the background (`202`: `DELETE` again answers `404` once it is done).
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403`, `404`.
    pub async fn delete_session(&self, id: &str) -> Result<bool, Error> {
        let request = self.request(Method::DELETE, self.url(["v1", "sessions", id]));
        let (status, _) = self.exchange(request).await?;
        Ok(status != 202)
    }

    /// `GET /v1/sessions/:id/stats`: storage use of the session's actor.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn stats(&self, id: &str) -> Result<serde_json::Value, Error> {
        self.get(self.url(["v1", "sessions", id, "stats"])).await
    }

    /// `POST /v1/sessions/:id/fork`: a new session whose history is this one's first
    /// `at_cursor` entries.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a cursor past the session's last, `404`.
    pub async fn fork_session(
        &self,
        id: &str,
        request: &wuhu_core::wire::ForkRequest,
    ) -> Result<wuhu_core::wire::SessionInfo, Error> {
        let url = self.url(["v1", "sessions", id, "fork"]);
        self.send_json(Method::POST, url, request).await
    }

    /// `POST /v1/sessions/:id/compact`: compacts the context now.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `409 nothing_to_compact`, `502 llm_error`.
    pub async fn compact(
        &self,
        id: &str,
        request: &wuhu_core::wire::CompactRequest,
    ) -> Result<wuhu_core::wire::CompactResponse, Error> {
        let url = self.url(["v1", "sessions", id, "compact"]);
        self.send_json(Method::POST, url, request).await
    }

    /// `GET /v1/sessions/:id/usage`: tokens, cost, policy decisions and MCP calls.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn session_usage(&self, id: &str) -> Result<wuhu_core::wire::UsageResponse, Error> {
        self.get(self.url(["v1", "sessions", id, "usage"])).await
    }

    /// `GET /v1/sessions/:id/jobs`: the session's background jobs, newest first.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` for a session the caller cannot read.
    pub async fn session_jobs(&self, id: &str) -> Result<wuhu_core::wire::JobsResponse, Error> {
        self.get(self.url(["v1", "sessions", id, "jobs"])).await
    }

    /// `GET /v1/channels` (admins).
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403` for a member.
    pub async fn list_channels(&self) -> Result<wuhu_core::channels::ListChannelsResponse, Error> {
        self.get(self.url(["v1", "channels"])).await
    }

    /// `GET /v1/channels/:id` (admins).
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn channel(&self, id: &str) -> Result<wuhu_core::channels::ChannelView, Error> {
        self.get(self.url(["v1", "channels", id])).await
    }

    /// `POST /v1/channels` (admins): `body` is the binding as the API takes it, credentials and
    /// all.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` naming a bad field (never its value).
    pub async fn create_channel(
        &self,
        body: &serde_json::Value,
    ) -> Result<wuhu_core::channels::ChannelView, Error> {
        self.send_json(Method::POST, self.url(["v1", "channels"]), body)
            .await
    }

    /// `DELETE /v1/channels/:id` (admins).
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn delete_channel(&self, id: &str) -> Result<(), Error> {
        let url = self.url(["v1", "channels", id]);
        self.send_empty(self.request(Method::DELETE, url)).await
    }

    /// `GET /v1/channels/:id/members` (admins).
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn channel_members(
        &self,
        id: &str,
    ) -> Result<wuhu_core::channels::members::Members, Error> {
        self.get(self.url(["v1", "channels", id, "members"])).await
    }

    /// `PUT /v1/channels/:id/members` (admins): replaces the whole list.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a user or sub of the wrong shape.
    pub async fn set_channel_members(
        &self,
        id: &str,
        members: &wuhu_core::channels::members::Members,
    ) -> Result<wuhu_core::channels::members::Members, Error> {
        let url = self.url(["v1", "channels", id, "members"]);
        self.send_json(Method::PUT, url, members).await
    }

    /// `GET /v1/usage?by=&from=&to=`: the tenant's usage (a member's own sessions).
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a bad range or grouping.
    pub async fn tenant_usage(
        &self,
        by: Option<&str>,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<wuhu_core::tenant_usage::TenantUsage, Error> {
        let mut url = self.url(["v1", "usage"]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(by) = by {
                pairs.append_pair("by", by);
            }
            if let Some(from) = from {
                pairs.append_pair("from", &from.to_string());
            }
            if let Some(to) = to {
                pairs.append_pair("to", &to.to_string());
            }
        }
        self.get(url).await
    }

    /// `GET /v1/budget`: the tenant's budget and what it spent.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn budget(&self) -> Result<wuhu_core::tenant_usage::TenantBudget, Error> {
        self.get(self.url(["v1", "budget"])).await
    }

    /// `PUT /v1/budget` (admins): sets the tenant's budget (`Budget::default()` removes it).
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403` for a member, `400` for a negative limit.
    pub async fn set_budget(
        &self,
        budget: &wuhu_core::wire::Budget,
    ) -> Result<wuhu_core::tenant_usage::TenantBudget, Error> {
        self.send_json(Method::PUT, self.url(["v1", "budget"]), budget)
            .await
    }

    /// `POST /v1/sessions/:id/approvals/:approvalId` with `approve`, `approve_session` or
    /// `deny`.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403`, `404`, `409 already_decided|expired|withdrawn`.
    pub async fn answer_approval(
        &self,
        id: &str,
        approval_id: &str,
        decision: wuhu_core::approvals::Answer,
    ) -> Result<AnswerApprovalResponse, Error> {
        let body = AnswerApprovalRequest { decision };
        let url = self.url(["v1", "sessions", id, "approvals", approval_id]);
        self.send_json(Method::POST, url, &body).await
    }

    /// `GET /v1/environments`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_environments(&self) -> Result<ListEnvironmentsResponse, Error> {
        self.get(self.url(["v1", "environments"])).await
    }

    /// `GET /v1/environments/:idOrName`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn environment(&self, id_or_name: &str) -> Result<EnvironmentDefinition, Error> {
        self.get(self.url(["v1", "environments", id_or_name])).await
    }

    /// `POST /v1/environments`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn create_environment(
        &self,
        body: &CreateEnvironmentRequest,
    ) -> Result<EnvironmentDefinition, Error> {
        self.send_json(Method::POST, self.url(["v1", "environments"]), body)
            .await
    }

    /// `PATCH /v1/environments/:idOrName`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn update_environment(
        &self,
        id_or_name: &str,
        body: &UpdateEnvironmentRequest,
    ) -> Result<EnvironmentDefinition, Error> {
        let url = self.url(["v1", "environments", id_or_name]);
        self.send_json(Method::PATCH, url, body).await
    }

    /// `DELETE /v1/environments/:idOrName`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn delete_environment(&self, id_or_name: &str) -> Result<(), Error> {
        let url = self.url(["v1", "environments", id_or_name]);
        self.send_empty(self.request(Method::DELETE, url)).await
    }

    /// `GET /v1/runners`.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_runners(&self) -> Result<ListRunnersResponse, Error> {
        self.get(self.url(["v1", "runners"])).await
    }

    /// `GET /v1/workspace/docs?prefix=&limit=&cursor=`: one page.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_docs(
        &self,
        prefix: &str,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<DocList, Error> {
        let mut url = self.url(["v1", "workspace", "docs"]);
        {
            let mut query = url.query_pairs_mut();
            if !prefix.is_empty() {
                query.append_pair("prefix", prefix);
            }
            if let Some(limit) = limit {
                query.append_pair("limit", &limit.to_string());
            }
            if let Some(cursor) = cursor {
                query.append_pair("cursor", cursor);
            }
        }
        strip_empty_query(&mut url);
        self.get(url).await
    }

    /// `GET /v1/workspace/docs/{path}`.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` when absent.
    pub async fn doc(&self, path: &str) -> Result<Doc, Error> {
        self.get(self.doc_url(path)).await
    }

    /// `PUT /v1/workspace/docs/{path}` with the raw text.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for invalid frontmatter, `413` over 1 MiB.
    pub async fn put_doc(&self, path: &str, content: &str) -> Result<DocSummary, Error> {
        let request = self
            .request(Method::PUT, self.doc_url(path))
            .header("content-type", "text/markdown; charset=utf-8")
            .body(content.to_string());
        self.send(request).await
    }

    /// `DELETE /v1/workspace/docs/{path}`.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` when absent.
    pub async fn delete_doc(&self, path: &str) -> Result<(), Error> {
        self.send_empty(self.request(Method::DELETE, self.doc_url(path)))
            .await
    }

    /// `POST /v1/tokens`: a named, revocable token; the answer holds the token, shown this once.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403` for what only admins may mint, `429 too_many_tokens`.
    pub async fn mint_token(&self, body: &MintTokenRequest) -> Result<MintTokenResponse, Error> {
        self.send_json(Method::POST, self.url(["v1", "tokens"]), body)
            .await
    }

    /// `POST /v1/tokens/revoke-all`: ends every registered credential of the caller, or (for
    /// an admin) of `sub`, and everything made from them.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `403` for a member naming someone else.
    pub async fn revoke_all_tokens(&self, sub: Option<&str>) -> Result<RevokeAllResponse, Error> {
        let body = RevokeAllRequest {
            sub: sub.map(str::to_string),
        };
        self.send_json(
            Method::POST,
            self.url(["v1", "tokens", "revoke-all"]),
            &body,
        )
        .await
    }

    /// `GET /v1/tokens`: the caller's registered tokens and cookie sessions, newest first.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_tokens(&self) -> Result<ListTokensResponse, Error> {
        self.get(self.url(["v1", "tokens"])).await
    }

    /// `DELETE /v1/tokens/{jti}`: revoke a token at once.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` for an unknown, revoked or (for members) another user's token.
    pub async fn revoke_token(&self, jti: &str) -> Result<serde_json::Value, Error> {
        self.send(self.request(Method::DELETE, self.url(["v1", "tokens", jti])))
            .await
    }

    /// `GET /v1/secrets`: the tenant's secrets and the caller's own (names, never values).
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn list_secrets(&self) -> Result<SecretList, Error> {
        self.get(self.url(["v1", "secrets"])).await
    }

    /// `PUT /v1/secrets/:name`.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a bad name or value, `403` for a tenant secret set by a
    /// member, `409 too_many_secrets`.
    pub async fn put_secret(
        &self,
        name: &str,
        body: &PutSecretRequest,
    ) -> Result<SecretInfo, Error> {
        self.send_json(Method::PUT, self.url(["v1", "secrets", name]), body)
            .await
    }

    /// `DELETE /v1/secrets/:name?scope=`.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` when there is no such secret.
    pub async fn delete_secret(&self, name: &str, scope: SecretScope) -> Result<(), Error> {
        let mut url = self.url(["v1", "secrets", name]);
        url.query_pairs_mut().append_pair("scope", scope.as_str());
        self.send_empty(self.request(Method::DELETE, url)).await
    }

    /// `GET /v1/policy/check`: what the policies would decide on a call (a dry run).
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a bad query, `409 invalid_policy` for a stored policy
    /// that does not parse.
    pub async fn check_policy(
        &self,
        query: &wuhu_core::policy::CheckQuery,
    ) -> Result<wuhu_core::policy::CheckResponse, Error> {
        let mut url = self.url(["v1", "policy", "check"]);
        {
            let mut pairs = url.query_pairs_mut();
            pairs.append_pair("tool", &query.tool);
            let optional = [
                ("environment", &query.environment),
                ("runner", &query.runner),
                ("runnerOwner", &query.runner_owner),
                ("command", &query.command),
                ("path", &query.path),
                ("host", &query.host),
                ("mcp", &query.mcp),
            ];
            for (name, value) in optional {
                if let Some(value) = value {
                    pairs.append_pair(name, value);
                }
            }
            if let Some(cost) = query.cost_usd {
                pairs.append_pair("costUsd", &cost.to_string());
            }
        }
        self.get(url).await
    }

    /// `GET /v1/mcp/servers`: the MCP servers your own turns would use.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn mcp_servers(&self) -> Result<wuhu_core::mcp_client::config::ServerList, Error> {
        self.get(self.url(["v1", "mcp", "servers"])).await
    }

    /// `GET /v1/mcp/servers/:name/tools`: asks the server for its tools now.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `404` for a server your turns do not see, `502
    /// mcp_server_failed` with the server's failure.
    pub async fn mcp_tools(
        &self,
        name: &str,
    ) -> Result<wuhu_core::mcp_client::config::ToolList, Error> {
        self.get(self.url(["v1", "mcp", "servers", name, "tools"]))
            .await
    }

    /// `POST /v1/mcp/servers/:name/connect`: starts your OAuth sign-in to a server.
    ///
    /// # Errors
    /// As [`Client::healthz`]; `400` for a server that does not sign in with OAuth, `502
    /// mcp_server_failed` when its discovery or registration fails.
    pub async fn mcp_connect(
        &self,
        name: &str,
    ) -> Result<wuhu_core::mcp_client::oauth::ConnectResponse, Error> {
        let url = self.url(["v1", "mcp", "servers", name, "connect"]);
        self.send_json(Method::POST, url, &serde_json::json!({}))
            .await
    }

    /// `DELETE /v1/mcp/servers/:name/connection`: forgets your OAuth connection.
    ///
    /// # Errors
    /// As [`Client::healthz`].
    pub async fn mcp_disconnect(
        &self,
        name: &str,
    ) -> Result<wuhu_core::mcp_client::oauth::DisconnectResponse, Error> {
        let url = self.url(["v1", "mcp", "servers", name, "connection"]);
        self.send(self.request(Method::DELETE, url)).await
    }

    /// The follow stream of session `id` (see [`Follow`]).
    pub fn follow(&self, id: &str, options: FollowOptions) -> Follow {
        Follow::new(self.clone(), id.to_string(), options)
    }

    fn doc_url(&self, path: &str) -> Url {
        let mut segments = vec!["v1", "workspace", "docs"];
        segments.extend(path.split('/'));
        self.url(segments)
    }

    async fn get<T: DeserializeOwned>(&self, url: Url) -> Result<T, Error> {
        self.send(self.request(Method::GET, url)).await
    }

    async fn send_json<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: &B,
    ) -> Result<T, Error> {
        self.send(self.request(method, url).json(body)).await
    }

    async fn send<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, Error> {
        let (status, bytes) = self.exchange(request).await?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode {
            status,
            message: e.to_string(),
        })
    }

    async fn send_empty(&self, request: RequestBuilder) -> Result<(), Error> {
        self.exchange(request).await.map(|_| ())
    }

    /// Sends `request` with the client's deadline: a 2xx answer's status and body, else the
    /// API's error.
    async fn exchange(&self, request: RequestBuilder) -> Result<(u16, Vec<u8>), Error> {
        let response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(Error::Transport)?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(Error::Transport)?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &bytes));
        }
        Ok((status, bytes.to_vec()))
    }
}

/// Whether the server may have acted on a request whose answer is `error`, or never got it:
/// the connection failed, or a gateway in front of the server answered instead of it. Sending
/// again is safe only for a request the server deduplicates (an enqueue with its key).
fn answer_may_be_lost(error: &Error) -> bool {
    match error {
        Error::Transport(_) => true,
        Error::Api { status, .. } => matches!(status, 502..=504),
        _ => false,
    }
}

/// The error a non-2xx answer stands for: its `{error:{code,message}}` body, or, when the body
/// is something else (a proxy's page), a code made from the status.
pub(crate) fn api_error(status: u16, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(body) => Error::Api {
            status,
            code: body.error.code,
            message: body.error.message,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text: String = text.trim().chars().take(200).collect();
            Error::Api {
                status,
                code: format!("http_{status}"),
                message: if text.is_empty() {
                    format!("the server answered HTTP {status}")
                } else {
                    text
                },
            }
        }
    }
}

/// `Url::query_pairs_mut` leaves a bare `?` when nothing was appended.
fn strip_empty_query(url: &mut Url) {
    if url.query() == Some("") {
        url.set_query(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_appended_as_encoded_segments() {
        let client = Client::new("http://127.0.0.1:9/base/", None).unwrap();
        assert_eq!(
            client.url(["v1", "sessions", "a b/c"]).as_str(),
            "http://127.0.0.1:9/base/v1/sessions/a%20b%2Fc"
        );
        assert_eq!(
            client.doc_url("notes/ideas #1.md").as_str(),
            "http://127.0.0.1:9/base/v1/workspace/docs/notes/ideas%20%231.md"
        );
        assert!(Client::new("ftp://x", None).is_err());
        assert!(Client::new("not a url", None).is_err());
    }

    #[test]
    fn error_bodies_keep_the_server_code() {
        let error = api_error(
            404,
            br#"{"error":{"code":"not_found","message":"no session"}}"#,
        );
        assert_eq!(error.code(), Some("not_found"));
        assert_eq!(error.status(), Some(404));
        assert!(!error.is_transient());
        let error = api_error(502, b"<html>bad gateway</html>");
        assert_eq!(error.code(), Some("http_502"));
        assert!(error.is_transient());
        assert_eq!(
            api_error(503, b"").to_string(),
            "the server answered HTTP 503 (http_503, HTTP 503)"
        );
    }
}
