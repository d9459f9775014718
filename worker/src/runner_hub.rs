//! `RunnerHub`: one Durable Object per tenant (`id_from_name(tenant)`). It accepts runner
//! WebSockets with the hibernation API, keeps the tenant's runners and environment definitions
//! in SQLite, resolves `request_environment` specs, and routes requests from session actors to
//! runners and their answers back.
//!
//! Internal routes (every request carries `x-wuhu-tenant` and `x-wuhu-sub`, already verified):
//! * `GET /connect`: WebSocket upgrade from a runner (`x-wuhu-sub` is the runner's owner).
//! * `GET /runners`: [`wuhu_core::wire::ListRunnersResponse`].
//! * `DELETE /runners/:owner/:name`: frees a runner name (204; 403, 404).
//! * `GET|POST /environments`, `GET|PATCH|DELETE /environments/:idOrName`: definitions.
//! * `POST /resolve`: [`wuhu_core::wire::ResolveEnvironmentRequest`] →
//!   [`wuhu_core::wire::ResolveEnvironmentResponse`].
//! * `POST /call`: [`RunnerCallRequest`] → [`wuhu_core::wire::RunnerCallResponse`]; 503
//!   `runner_not_connected`, 502 `runner_disconnected`, 504 `timeout`.
//! * `POST /revoked` `{"jti"}`: from the token registry when a runner token is revoked; closes
//!   the sockets that connected with it → `{"closed": n}`.
//! * `POST /discard`: [`wuhu_core::wire::runner::DiscardWorkspacesRequest`] from a session's
//!   deletion → [`wuhu_core::wire::runner::DiscardWorkspacesResponse`]: pending discards of its
//!   workspaces, sent to the runners that hosted them now or when they connect (`discards`).
//!
//! A runner's `job_finished_v1` event goes on to the session it names (`POST /job_event` on
//! the session actor, with the runner's name and owner; the session heeds only jobs it started
//! on that runner).
//!
//! By job: `sockets` (accepting runners, `hello`, frames, the liveness sweep), `socket_state`
//! (the per-socket attachment and sending a frame, below `sockets` and `discards`, which
//! both use it), `discards` (pending discards of deleted sessions' workspaces), `waiters` (`/call`s waiting for an answer), `calls` (`/call`), `definitions`
//! (listings, definitions, `/resolve`), `store` (SQLite). The rules they apply are
//! `wuhu_core::hub`'s and `wuhu_core::resolve`'s. Heartbeats are answered by the runtime's
//! auto-response (the hub does not wake for them); liveness reads the auto-response timestamp.

mod calls;
mod definitions;
mod discards;
mod socket_state;
mod sockets;
mod store;
mod waiters;

use worker::{
    DurableObject, Env, Method, Request, Response, SqlStorage, State, WebSocket,
    WebSocketIncomingMessage, WebSocketRequestResponsePair, durable_object,
};
use wuhu_core::wire::RunnerCallRequest;
use wuhu_core::wire::runner::{HEARTBEAT_ACK_FRAME, HEARTBEAT_FRAME};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, parse_json, read_body};
use sockets::Sockets;
use waiters::Waiters;

#[durable_object]
pub struct RunnerHub {
    state: State,
    env: Env,
    sql: SqlStorage,
    waiters: Waiters,
}

impl DurableObject for RunnerHub {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        store::migrate(&sql);
        // Heartbeats are answered by the runtime, without waking the hub.
        if let Ok(pair) = WebSocketRequestResponsePair::new(HEARTBEAT_FRAME, HEARTBEAT_ACK_FRAME) {
            state.set_websocket_auto_response(&pair);
        }
        RunnerHub {
            state,
            env,
            sql,
            waiters: Waiters::new(),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    async fn websocket_message(
        &self,
        ws: WebSocket,
        message: WebSocketIncomingMessage,
    ) -> worker::Result<()> {
        self.sockets().on_frame(&ws, message).await;
        Ok(())
    }

    async fn websocket_close(
        &self,
        ws: WebSocket,
        _code: usize,
        _reason: String,
        _was_clean: bool,
    ) -> worker::Result<()> {
        // Complete the closing handshake (a no-op when the socket is already closed).
        let _ = ws.close(Some(1000), Some("closed"));
        self.sockets().on_gone(&ws, "disconnected");
        Ok(())
    }

    async fn websocket_error(&self, ws: WebSocket, error: worker::Error) -> worker::Result<()> {
        worker::console_log!("runner hub: websocket error: {error}");
        let _ = ws.close(Some(1011), Some("websocket error"));
        self.sockets().on_gone(&ws, "disconnected");
        Ok(())
    }

    async fn alarm(&self) -> worker::Result<Response> {
        self.sockets().sweep().await;
        Response::ok("")
    }
}

fn header(req: &Request, name: &str) -> ApiResult<String> {
    req.headers()
        .get(name)
        .ok()
        .flatten()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("missing {name} header")))
}

impl RunnerHub {
    fn sockets(&self) -> Sockets<'_> {
        Sockets {
            state: &self.state,
            env: &self.env,
            sql: &self.sql,
            waiters: &self.waiters,
        }
    }

    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        let path = req.path();
        let method = req.method();
        let sub = header(&req, "x-wuhu-sub")?;
        // Set by the router or a session actor from a verified token; a missing role is member.
        let who = Identity::from_headers(&req)?.principal();
        let sockets = self.sockets();
        match (method, path.as_str()) {
            (Method::Get, "/connect") => sockets.accept(&req, &sub).await,
            (Method::Get, "/runners") => definitions::list_runners(&sockets),
            (Method::Delete, p) if p.starts_with("/runners/") => {
                let rest: Vec<String> = p["/runners/".len()..].split('/').map(decode).collect();
                match rest.as_slice() {
                    [owner, name] => sockets.free(&who, owner, name),
                    _ => Err(ApiError::not_found("no such route")),
                }
            }
            (Method::Get, "/environments") => definitions::list(&self.sql),
            (Method::Post, "/environments") => {
                let body = read_body(&mut req).await?;
                definitions::create(&sockets, &who, &body)
            }
            (method, p) if p.starts_with("/environments/") => {
                let key = decode(&p["/environments/".len()..]);
                match method {
                    Method::Get => Ok(crate::http::json_response(
                        200,
                        &definitions::find(&self.sql, &key)?,
                    )),
                    Method::Patch => {
                        let body = read_body(&mut req).await?;
                        definitions::update(&sockets, &who, &key, &body)
                    }
                    Method::Delete => definitions::delete(&self.sql, &who, &key),
                    _ => Err(method_not_allowed()),
                }
            }
            (Method::Post, "/resolve") => {
                let body = read_body(&mut req).await?;
                definitions::resolve(&sockets, &sub, &body)
            }
            (Method::Post, "/call") => {
                let body = read_body(&mut req).await?;
                let request: RunnerCallRequest = parse_json(&body)?;
                calls::call(&sockets, &sub, request).await
            }
            (Method::Post, "/discard") => {
                let body = read_body(&mut req).await?;
                discards::discard(sockets.sql, |owner, name| sockets.find(owner, name), &body)
            }
            (Method::Post, "/revoked") => {
                #[derive(serde::Deserialize)]
                struct Revoked {
                    jti: String,
                }
                let body = read_body(&mut req).await?;
                let revoked: Revoked = parse_json(&body)?;
                let closed = sockets.revoked(&revoked.jti);
                Ok(crate::http::json_response(
                    200,
                    &serde_json::json!({ "closed": closed }),
                ))
            }
            (
                _,
                "/connect" | "/runners" | "/environments" | "/resolve" | "/call" | "/revoked"
                | "/discard",
            ) => Err(method_not_allowed()),
            _ => Err(ApiError::not_found("no such route")),
        }
    }
}

/// A path segment, percent-decoded (as given when it does not decode).
fn decode(raw: &str) -> String {
    js_sys::decode_uri_component(raw)
        .ok()
        .and_then(|v| v.as_string())
        .unwrap_or_else(|| raw.to_string())
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
