//! `RunnerHub`: one Durable Object per tenant (`id_from_name(tenant)`). It accepts runner
//! WebSockets with the hibernation API, keeps the tenant's runners and environment definitions
//! in SQLite, resolves `request_environment` specs, and routes requests from session actors to
//! runners and their answers back.
//!
//! Its calls are `wuhu_core::calls::hub::HubCall` (every one carries the caller's verified
//! identity): a runner's WebSocket (`Connect`, the identity is the runner's owner), the runner
//! list and freeing a name, environment definitions, `Resolve` (`request_environment`),
//! `CallRunner` (a request to a runner, answered with the runner's answer; 503
//! `runner_not_connected`, 502 `runner_disconnected`, 504 `timeout`), `Revoked` (from the token
//! registry: sockets of a revoked runner token close), `Discard` (a deleted session's
//! workspaces, sent to the runners that hosted them now or when they connect: `discards`).
//!
//! A runner's `job_finished_v1` event goes on to the session it names (`JobEnded` on
//! the session actor, with the runner's name and owner; the session heeds only jobs it started
//! on that runner).
//!
//! By job: `sockets` (accepting runners, `hello`, frames, the liveness sweep), `socket_state`
//! (the per-socket attachment and sending a frame, below `sockets` and `discards`, which
//! both use it), `discards` (pending discards of deleted sessions' workspaces), `waiters` (`CallRunner` calls waiting for an answer), `calls` (`CallRunner`), `definitions`
//! (listings, definitions, `Resolve`), `store` (SQLite). The rules they apply are
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
    DurableObject, Env, Request, Response, SqlStorage, State, WebSocket, WebSocketIncomingMessage,
    WebSocketRequestResponsePair, durable_object,
};
use wuhu_core::calls::Empty;
use wuhu_core::calls::hub::{Closed, HubCall};
use wuhu_core::wire::runner::{HEARTBEAT_ACK_FRAME, HEARTBEAT_FRAME};

use crate::auth::Identity;
use crate::http::ApiResult;
use crate::internal::{self, reply};
use sockets::Sockets;
use waiters::Waiters;

#[durable_object]
pub struct RunnerHub {
    state: State,
    env: Env,
    sql: SqlStorage,
    waiters: Waiters,
    /// Whether the schema migrated; every call answers its error otherwise.
    schema: Result<(), String>,
}

impl DurableObject for RunnerHub {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let schema = crate::schema::migrate(&sql, "runner_hub", store::MIGRATIONS);
        if let Err(e) = &schema {
            worker::console_error!("runner hub: {e}");
        }
        // Heartbeats are answered by the runtime, without waking the hub.
        if let Ok(pair) = WebSocketRequestResponsePair::new(HEARTBEAT_FRAME, HEARTBEAT_ACK_FRAME) {
            state.set_websocket_auto_response(&pair);
        }
        RunnerHub {
            state,
            env,
            sql,
            waiters: Waiters::new(),
            schema,
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
        if let Err(e) = &self.schema {
            return Err(crate::http::ApiError::new(500, "storage_failed", e.clone()));
        }
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = HubCall::decode(&name, &body).map_err(internal::call_error)?;
        // Set by the router or a session actor from a verified token; a missing role is member.
        let identity = Identity::from_headers(&req)?;
        let sub = identity.sub.as_str();
        let who = identity.principal();
        let sockets = self.sockets();
        match call {
            HubCall::Connect(c) => sockets.accept(&req, sub, c.jti).await,
            HubCall::ListRunners(c) => Ok(reply(&c, &definitions::list_runners(&sockets)?)),
            HubCall::FreeRunner(c) => {
                sockets.free(&who, &c.owner, &c.name)?;
                Ok(reply(&c, &Empty))
            }
            HubCall::ListEnvironments(c) => Ok(reply(&c, &definitions::list(&self.sql)?)),
            HubCall::CreateEnvironment(c) => {
                let created = definitions::create(&sockets, &who, c.0.clone())?;
                Ok(reply(&c, &created))
            }
            HubCall::GetEnvironment(c) => Ok(reply(&c, &definitions::find(&self.sql, &c.key)?)),
            HubCall::UpdateEnvironment(c) => {
                let updated = definitions::update(&sockets, &who, &c.key, c.request.clone())?;
                Ok(reply(&c, &updated))
            }
            HubCall::DeleteEnvironment(c) => {
                definitions::delete(&self.sql, &who, &c.key)?;
                Ok(reply(&c, &Empty))
            }
            HubCall::Resolve(c) => Ok(reply(&c, &definitions::resolve(&sockets, sub, &c.0)?)),
            HubCall::CallRunner(c) => {
                let answer = calls::call(&sockets, sub, c.0.clone()).await?;
                Ok(reply(&c, &answer))
            }
            HubCall::Discard(c) => {
                let answer =
                    discards::discard(sockets.sql, |owner, name| sockets.find(owner, name), &c.0)?;
                Ok(reply(&c, &answer))
            }
            HubCall::Revoked(c) => {
                let closed = sockets.revoked(&c.jtis);
                Ok(reply(&c, &Closed { closed }))
            }
        }
    }
}
