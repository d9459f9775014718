//! `RunnerHub`: one Durable Object per tenant (`id_from_name(tenant)`). It accepts runner
//! WebSockets with the hibernation API, keeps the tenant's runners and environment definitions
//! in SQLite, resolves `request_environment` specs, and routes requests from session actors to
//! runners and their answers back.
//!
//! Internal routes (every request carries `x-wuhu-tenant` and `x-wuhu-sub`, already verified):
//! * `GET /connect`: WebSocket upgrade from a runner (`x-wuhu-sub` is the runner's owner).
//! * `GET /runners`: [`ListRunnersResponse`].
//! * `GET|POST /environments`, `GET|PATCH|DELETE /environments/:idOrName`: definitions.
//! * `POST /resolve`: [`ResolveEnvironmentRequest`] → [`ResolveEnvironmentResponse`].
//! * `POST /call`: [`RunnerCallRequest`] → [`RunnerCallResponse`]; 503 `runner_not_connected`,
//!   502 `runner_disconnected`, 504 `timeout`.
//!
//! State: per socket, a small attachment ([`SocketInfo`]: owner, connection epoch, times, the
//! runner's name/kind/os after `hello`) that survives hibernation; per runner, a SQLite row with
//! what `hello` said. Heartbeats are answered by the runtime's auto-response (the hub does not
//! wake for them); liveness reads the auto-response timestamp. Requests waiting for a runner's
//! answer live in memory, keyed by (epoch, id): a DO with an in-flight request does not
//! hibernate, and a closing socket fails exactly its own requests.

mod store;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use futures::channel::oneshot;
use futures::future::{Either, select};
use serde::{Deserialize, Serialize};
use wasm_bindgen::{JsCast, JsValue};
use worker::{
    Delay, DurableObject, Env, Method, Request, Response, SqlStorage, State, WebSocket,
    WebSocketIncomingMessage, WebSocketPair, WebSocketRequestResponsePair, durable_object,
};
use wuhu_core::authority::{self, Principal};
use wuhu_core::hub::{
    self, DropReason, Hello, HelloDecision, KnownRunner, Liveness, OpenConnection, SILENCE_LIMIT_MS,
};
use wuhu_core::resolve::{self, ResolveError, RunnerView};
use wuhu_core::wire::runner::{
    AttachOutcome, CLOSE_FRAME_TOO_LARGE, DEFAULT_HEARTBEAT_SECONDS, HEARTBEAT_ACK_FRAME,
    HEARTBEAT_FRAME, MAX_FRAME_BYTES, MAX_FRAME_BYTES_BEFORE_WELCOME, RunnerKind, RunnerMessage,
    ServerMessage, codes, decode_frame_within, encode_frame,
};
use wuhu_core::wire::{
    CreateEnvironmentRequest, EnvironmentDefinition, ListEnvironmentsResponse, ListRunnersResponse,
    ResolveEnvironmentRequest, RunnerCallRequest, RunnerCallResponse, RunnerEnvironmentInfo,
    RunnerInfo, UpdateEnvironmentRequest,
};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, json_response, parse_json, read_body};

/// Default and largest `/call` timeout.
const DEFAULT_CALL_TIMEOUT_MS: u64 = 120_000;
const MAX_CALL_TIMEOUT_MS: u64 = 3_600_000;
/// Most open runner sockets per hub (tenant) and per owner; one more is refused with 429.
const MAX_SOCKETS_PER_HUB: usize = 512;
const MAX_SOCKETS_PER_OWNER: usize = 32;
/// `WebSocket.readyState` of an open socket.
const OPEN: u16 = 1;

/// What a runner's answer (or the loss of its connection) delivers to a waiting `/call`.
type Outcome = Result<RunnerMessage, ApiError>;

#[durable_object]
pub struct RunnerHub {
    state: State,
    sql: SqlStorage,
    /// `/call`s waiting for an answer, by (connection epoch, request id).
    pending: RefCell<HashMap<(u64, String), Waiter>>,
    /// Tells waiters apart, so a finished `/call` never removes a newer one's entry.
    next_token: Cell<u64>,
}

/// A `/call` waiting for its answer.
struct Waiter {
    token: u64,
    tx: oneshot::Sender<Outcome>,
}

/// Removes its waiter when the `/call` ends, however it ends (answer, timeout, or the caller
/// going away and dropping the future).
struct WaiterGuard<'a> {
    pending: &'a RefCell<HashMap<(u64, String), Waiter>>,
    key: (u64, String),
    token: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.try_borrow_mut()
            && pending
                .get(&self.key)
                .is_some_and(|w| w.token == self.token)
        {
            pending.remove(&self.key);
        }
    }
}

/// Per-socket state, stored as the socket's attachment so it survives hibernation. Kept small:
/// what `hello` offered lives in SQLite.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct SocketInfo {
    owner: String,
    /// The kind the runner's token allows (its `runnerKind` claim): the kind it is registered as.
    #[serde(default)]
    token_kind: RunnerKind,
    epoch: u64,
    connected_at_ms: i64,
    last_seen_ms: i64,
    #[serde(default)]
    persisted_ms: i64,
    #[serde(default)]
    runner: Option<SocketRunner>,
    /// Set when the hub closed (or gave up on) the socket; it no longer counts as open.
    #[serde(default)]
    closed: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct SocketRunner {
    name: String,
    kind: RunnerKind,
    os: String,
}

impl DurableObject for RunnerHub {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        store::migrate(&sql);
        // Heartbeats are answered by the runtime, without waking the hub.
        if let Ok(pair) = WebSocketRequestResponsePair::new(HEARTBEAT_FRAME, HEARTBEAT_ACK_FRAME) {
            state.set_websocket_auto_response(&pair);
        }
        RunnerHub {
            state,
            sql,
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(1),
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
        self.on_frame(&ws, message).await;
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
        self.on_gone(&ws, "disconnected");
        Ok(())
    }

    async fn websocket_error(&self, ws: WebSocket, error: worker::Error) -> worker::Result<()> {
        worker::console_log!("runner hub: websocket error: {error}");
        let _ = ws.close(Some(1011), Some("websocket error"));
        self.on_gone(&ws, "disconnected");
        Ok(())
    }

    async fn alarm(&self) -> worker::Result<Response> {
        self.sweep().await;
        Response::ok("")
    }
}

fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

fn header(req: &Request, name: &str) -> ApiResult<String> {
    req.headers()
        .get(name)
        .ok()
        .flatten()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("missing {name} header")))
}

fn info_of(ws: &WebSocket) -> Option<SocketInfo> {
    ws.deserialize_attachment::<SocketInfo>().ok().flatten()
}

fn save_info(ws: &WebSocket, info: &SocketInfo) {
    if let Err(e) = ws.serialize_attachment(info) {
        worker::console_error!("runner hub: saving socket state failed: {e}");
    }
}

fn send(ws: &WebSocket, message: &ServerMessage) -> bool {
    ws.send_with_str(encode_frame(message)).is_ok()
}

fn send_error(ws: &WebSocket, id: Option<&str>, code: &str, message: impl Into<String>) {
    send(
        ws,
        &ServerMessage::Error {
            id: id.map(str::to_string),
            code: code.to_string(),
            message: message.into(),
        },
    );
}

/// Closes with `code`, falling back to 1000 if the runtime refuses the code.
fn close(ws: &WebSocket, code: u16, reason: &str) {
    if ws.close(Some(code), Some(reason)).is_err() {
        let _ = ws.close(Some(1000), Some(reason));
    }
}

/// A WebSocket close reason: at most 123 bytes, cut at a char boundary.
fn close_reason(text: &str) -> String {
    const MAX: usize = 123;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

fn runner_label(info: &SocketInfo) -> String {
    info.runner
        .as_ref()
        .map(|r| format!("runner {:?}", r.name))
        .unwrap_or_else(|| String::from("runner"))
}

impl RunnerHub {
    async fn route(&self, mut req: Request) -> ApiResult<Response> {
        let path = req.path();
        let method = req.method();
        let sub = header(&req, "x-wuhu-sub")?;
        // Set by the router or a session actor from a verified token; a missing role is member.
        let who = Identity::from_headers(&req)?.principal();
        match (method, path.as_str()) {
            (Method::Get, "/connect") => self.accept_runner(&req, &sub).await,
            (Method::Get, "/runners") => self.list_runners(),
            (Method::Get, "/environments") => Ok(json_response(
                200,
                &ListEnvironmentsResponse {
                    environments: store::definitions(&self.sql)?,
                },
            )),
            (Method::Post, "/environments") => {
                let body = read_body(&mut req).await?;
                self.create_environment(&who, &body)
            }
            (method, p) if p.starts_with("/environments/") => {
                let raw = &p["/environments/".len()..];
                let key = js_sys::decode_uri_component(raw)
                    .ok()
                    .and_then(|v| v.as_string())
                    .unwrap_or_else(|| raw.to_string());
                match method {
                    Method::Get => {
                        let definition = self.find_definition(&key)?;
                        Ok(json_response(200, &definition))
                    }
                    Method::Patch => {
                        let body = read_body(&mut req).await?;
                        self.update_environment(&who, &key, &body)
                    }
                    Method::Delete => {
                        let definition = self.find_definition(&key)?;
                        check_may_edit(&who, &definition)?;
                        store::delete_definition(&self.sql, &definition.id)?;
                        Ok(Response::empty()?.with_status(204))
                    }
                    _ => Err(method_not_allowed()),
                }
            }
            (Method::Post, "/resolve") => {
                let body = read_body(&mut req).await?;
                let request: ResolveEnvironmentRequest = parse_json(&body)?;
                let definitions = store::definitions(&self.sql)?;
                let runners = self.runner_views()?;
                let resolved = resolve::resolve(&sub, &request, &definitions, &runners)
                    .map_err(resolve_error)?;
                Ok(json_response(200, &resolved))
            }
            (Method::Post, "/call") => {
                let body = read_body(&mut req).await?;
                let request: RunnerCallRequest = parse_json(&body)?;
                self.call(&sub, request).await
            }
            (_, "/connect" | "/runners" | "/environments" | "/resolve" | "/call") => {
                Err(method_not_allowed())
            }
            _ => Err(ApiError::not_found("no such route")),
        }
    }

    // ---- sockets -------------------------------------------------------------------------

    async fn accept_runner(&self, req: &Request, sub: &str) -> ApiResult<Response> {
        // Set by the router from the verified token; a runner token without the claim is local.
        let token_kind = match req
            .headers()
            .get("x-wuhu-runner-kind")
            .ok()
            .flatten()
            .as_deref()
        {
            Some("cloud") => RunnerKind::Cloud,
            _ => RunnerKind::Local,
        };
        let upgrade = req.headers().get("upgrade").ok().flatten();
        if !upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
            return Err(ApiError::new(
                426,
                "upgrade_required",
                "this endpoint takes a WebSocket upgrade",
            ));
        }
        let open = self.open_sockets();
        if open.len() >= MAX_SOCKETS_PER_HUB {
            return Err(ApiError::new(
                429,
                "too_many_runners",
                format!("this tenant already has {MAX_SOCKETS_PER_HUB} runner connections"),
            ));
        }
        if open.iter().filter(|(_, info)| info.owner == sub).count() >= MAX_SOCKETS_PER_OWNER {
            return Err(ApiError::new(
                429,
                "too_many_runners",
                format!("{sub} already has {MAX_SOCKETS_PER_OWNER} runner connections"),
            ));
        }
        let epoch = store::next_epoch(&self.sql)?;
        let pair = WebSocketPair::new()?;
        self.state.accept_web_socket(&pair.server);
        let now = now_ms();
        save_info(
            &pair.server,
            &SocketInfo {
                owner: sub.to_string(),
                token_kind,
                epoch,
                connected_at_ms: now,
                last_seen_ms: now,
                persisted_ms: now,
                runner: None,
                closed: false,
            },
        );
        // A socket that never says hello is dropped by the sweep.
        self.arm_alarm(now + hub::HELLO_DEADLINE_MS).await;
        Ok(Response::from_websocket(pair.client)?)
    }

    /// Open sockets with their state (hibernation-safe: read from the runtime each time).
    fn open_sockets(&self) -> Vec<(WebSocket, SocketInfo)> {
        self.state
            .get_websockets()
            .into_iter()
            .filter(|ws| ws.as_ref().ready_state() == OPEN)
            .filter_map(|ws| info_of(&ws).map(|info| (ws, info)))
            .filter(|(_, info)| !info.closed)
            .collect()
    }

    /// The newest open, welcomed socket of `owner`'s runner `name`.
    fn find_socket(&self, owner: &str, name: &str) -> Option<(WebSocket, SocketInfo)> {
        self.open_sockets()
            .into_iter()
            .filter(|(_, info)| {
                info.owner == owner && info.runner.as_ref().is_some_and(|r| r.name == name)
            })
            .max_by_key(|(_, info)| info.epoch)
    }

    /// When the runtime last answered a heartbeat on `ws` (ms), if ever.
    fn auto_response_ms(&self, ws: &WebSocket) -> Option<i64> {
        let raw: &JsValue = self.state.as_raw();
        let function =
            js_sys::Reflect::get(raw, &JsValue::from_str("getWebSocketAutoResponseTimestamp"))
                .ok()?
                .dyn_into::<js_sys::Function>()
                .ok()?;
        let value = function.call1(raw, ws.as_ref()).ok()?;
        let date = value.dyn_into::<js_sys::Date>().ok()?;
        let ms = date.get_time();
        ms.is_finite().then_some(ms as i64)
    }

    fn last_seen_ms(&self, ws: &WebSocket, info: &SocketInfo) -> i64 {
        self.auto_response_ms(ws)
            .map_or(info.last_seen_ms, |t| t.max(info.last_seen_ms))
    }

    async fn on_frame(&self, ws: &WebSocket, message: WebSocketIncomingMessage) {
        let Some(mut info) = info_of(ws) else {
            worker::console_error!("runner hub: frame on a socket without state; closing it");
            close(ws, 1011, "lost connection state");
            return;
        };
        if info.closed {
            return;
        }
        let now = now_ms();
        info.last_seen_ms = now;
        let text = match message {
            WebSocketIncomingMessage::String(text) => text,
            WebSocketIncomingMessage::Binary(_) => {
                save_info(ws, &info);
                send_error(
                    ws,
                    None,
                    codes::BINARY_FRAME,
                    "binary frames are not part of the protocol; send JSON text frames",
                );
                return;
            }
        };
        // Bounded before anything is parsed: a frame over the limit closes the connection
        // (the limit is small until the runner is welcomed).
        let welcomed = info.runner.is_some();
        let limit = if welcomed {
            MAX_FRAME_BYTES
        } else {
            MAX_FRAME_BYTES_BEFORE_WELCOME
        };
        if text.len() > limit {
            worker::console_log!(
                "runner hub: closing a connection of {} that sent a frame of {} bytes (limit {limit})",
                info.owner,
                text.len()
            );
            send_error(
                ws,
                None,
                codes::FRAME_TOO_LARGE,
                format!(
                    "frame of {} bytes exceeds the {limit} byte limit{}",
                    text.len(),
                    if welcomed { "" } else { " before welcome" }
                ),
            );
            self.close_for_good(ws, info, CLOSE_FRAME_TOO_LARGE, "frame too large");
            return;
        }
        let message = match decode_frame_within::<RunnerMessage>(&text, limit) {
            Ok(message) => message,
            Err(error) => {
                save_info(ws, &info);
                send_error(ws, error.id(), error.code(), error.to_string());
                return;
            }
        };
        if let RunnerMessage::Hello { .. } = &message {
            if info.runner.is_some() {
                save_info(ws, &info);
                send_error(
                    ws,
                    None,
                    codes::INVALID_MESSAGE,
                    "hello was already received on this connection",
                );
            } else {
                self.on_hello(ws, info, message).await;
            }
            return;
        }
        let Some(runner) = info.runner.clone() else {
            if let RunnerMessage::Heartbeat {} = message {
                // Answered, but it does not keep an unwelcomed socket alive (see the sweep).
                save_info(ws, &info);
                let _ = ws.send_with_str(HEARTBEAT_ACK_FRAME);
                return;
            }
            send(
                ws,
                &ServerMessage::Refused {
                    code: codes::HELLO_REQUIRED.to_string(),
                    message: String::from("the first frame must be hello"),
                },
            );
            self.close_for_good(ws, info, 1008, "hello required");
            return;
        };
        if hub::should_persist(now, info.persisted_ms) {
            info.persisted_ms = now;
            if let Err(e) =
                store::touch_runner(&self.sql, &info.owner, &runner.name, info.epoch, now)
            {
                worker::console_error!("runner hub: {}", e.message);
            }
        }
        save_info(ws, &info);
        match message {
            RunnerMessage::Hello { .. } => {}
            RunnerMessage::Heartbeat {} => {
                let _ = ws.send_with_str(HEARTBEAT_ACK_FRAME);
            }
            RunnerMessage::Event {
                name,
                session_id,
                environment,
                data,
            } => {
                worker::console_log!(
                    "runner hub: event {name} from {}/{} (session {session_id:?}, environment {environment:?}): {data}",
                    info.owner,
                    runner.name
                );
            }
            RunnerMessage::Error {
                id: None,
                code,
                message,
            } => {
                worker::console_log!(
                    "runner hub: error from {}/{}: {code}: {message}",
                    info.owner,
                    runner.name
                );
            }
            message => {
                let Some(id) = hub::answer_id(&message).map(str::to_string) else {
                    return;
                };
                let waiting = self.pending.borrow_mut().remove(&(info.epoch, id.clone()));
                match waiting {
                    Some(waiter) => {
                        let _ = waiter.tx.send(Ok(message));
                    }
                    None => worker::console_log!(
                        "runner hub: answer {id} from {}/{} matches no waiting request (timed out or cancelled)",
                        info.owner,
                        runner.name
                    ),
                }
            }
        }
    }

    async fn on_hello(&self, ws: &WebSocket, mut info: SocketInfo, message: RunnerMessage) {
        let Some(hello) = Hello::from_message(message) else {
            return;
        };
        let now = now_ms();
        let open = self.open_sockets();
        let connections: Vec<OpenConnection<'_>> = open
            .iter()
            .map(|(_, other)| OpenConnection {
                epoch: other.epoch,
                owner: &other.owner,
                name: other.runner.as_ref().map(|r| r.name.as_str()),
            })
            .collect();
        let rows = match store::runners_named(&self.sql, &hello.name) {
            Ok(rows) => rows,
            Err(e) => {
                worker::console_error!("runner hub: reading runners failed: {}", e.message);
                Vec::new()
            }
        };
        let known: Vec<KnownRunner<'_>> = rows
            .iter()
            .map(|row| KnownRunner {
                owner: &row.owner,
                name: &row.name,
                last_seen_ms: row.last_seen_ms,
            })
            .collect();
        let decision = hub::on_hello(
            &info.owner,
            info.epoch,
            info.token_kind,
            &hello,
            &connections,
            &known,
            now,
        );
        let (kind, notice, replace) = match decision {
            HelloDecision::Refuse { code, message } => {
                worker::console_log!(
                    "runner hub: refused runner {:?} of {}: {code}: {message}",
                    hello.name,
                    info.owner
                );
                send(
                    ws,
                    &ServerMessage::Refused {
                        code: code.to_string(),
                        message: message.clone(),
                    },
                );
                info.closed = true;
                save_info(ws, &info);
                close(ws, 1008, &close_reason(&format!("{code}: {message}")));
                return;
            }
            HelloDecision::Welcome {
                kind,
                notice,
                replace,
            } => (kind, notice, replace),
        };
        let name = hello.name.clone();
        if let Some(notice) = &notice {
            worker::console_log!("runner hub: runner {name:?} of {}: {notice}", info.owner);
        }
        // A runner that comes back replaces its old connection (which may not have noticed
        // that it is dead yet).
        for (old, mut old_info) in open {
            if replace.contains(&old_info.epoch) {
                old_info.closed = true;
                save_info(&old, &old_info);
                close(&old, 1012, "replaced by a new connection");
                self.fail_pending(
                    old_info.epoch,
                    format!("runner {name:?} reconnected (a new connection replaced the old one) while the call was running"),
                );
            }
        }
        let row = store::Hello {
            owner: &info.owner,
            name: &name,
            kind,
            os: &hello.os,
            arch: &hello.arch,
            capabilities: &hello.capabilities,
            environments: &hello.environments,
            version: hello.runner_version.as_deref(),
        };
        if let Err(e) = store::upsert_runner(&self.sql, &row, info.epoch, now) {
            worker::console_error!("runner hub: recording runner failed: {}", e.message);
        }
        info.runner = Some(SocketRunner {
            name: name.clone(),
            kind,
            os: hello.os,
        });
        info.persisted_ms = now;
        save_info(ws, &info);
        send(
            ws,
            &ServerMessage::Welcome {
                runner_id: format!("{}/{name}", info.owner),
                heartbeat_seconds: DEFAULT_HEARTBEAT_SECONDS,
                kind: Some(kind),
                notice,
            },
        );
        self.arm_alarm(now + SILENCE_LIMIT_MS).await;
    }

    /// A socket closed or failed: fail its calls, mark its runner offline.
    fn on_gone(&self, ws: &WebSocket, why: &str) {
        let Some(mut info) = info_of(ws) else {
            return;
        };
        let label = runner_label(&info);
        self.fail_pending(
            info.epoch,
            format!("{label} {why} while the call was running"),
        );
        if let Some(runner) = &info.runner
            && let Err(e) =
                store::disconnect_runner(&self.sql, &info.owner, &runner.name, info.epoch, now_ms())
        {
            worker::console_error!("runner hub: {}", e.message);
        }
        if !info.closed {
            info.closed = true;
            // The attachment of a closed socket may no longer be writable; that is fine.
            let _ = ws.serialize_attachment(&info);
        }
    }

    /// Closes `ws` and fails what waits on it; the socket no longer counts as open.
    fn close_for_good(&self, ws: &WebSocket, mut info: SocketInfo, code: u16, reason: &str) {
        info.closed = true;
        save_info(ws, &info);
        close(ws, code, reason);
        self.on_gone(ws, "was closed by the server");
    }

    fn fail_pending(&self, epoch: u64, message: String) {
        let failed: Vec<Waiter> = {
            let mut pending = self.pending.borrow_mut();
            let keys: Vec<(u64, String)> = pending
                .keys()
                .filter(|(e, _)| *e == epoch)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| pending.remove(k)).collect()
        };
        for waiter in failed {
            let _ = waiter.tx.send(Err(ApiError::new(
                502,
                "runner_disconnected",
                message.clone(),
            )));
        }
    }

    /// Makes sure an alarm fires no later than `at_ms`.
    async fn arm_alarm(&self, at_ms: i64) {
        let storage = self.state.storage();
        let current = storage.get_alarm().await.ok().flatten();
        if current.is_some_and(|t| t <= at_ms) {
            return;
        }
        let offset = (at_ms - now_ms()).max(0) + 1000;
        if let Err(e) = storage.set_alarm(offset).await {
            worker::console_error!("runner hub: setting the alarm failed: {e}");
        }
    }

    /// Drops sockets silent for three heartbeat periods (or without `hello` past its deadline),
    /// refreshes `last_seen` in SQLite, and re-arms itself while sockets remain
    /// ([`hub::sweep`] decides).
    async fn sweep(&self) {
        let now = now_ms();
        let open = self.open_sockets();
        let facts: Vec<Liveness> = open
            .iter()
            .map(|(ws, info)| Liveness {
                epoch: info.epoch,
                connected_at_ms: info.connected_at_ms,
                last_seen_ms: self.last_seen_ms(ws, info),
                persisted_ms: info.persisted_ms,
                welcomed: info.runner.is_some(),
            })
            .collect();
        let plan = hub::sweep(now, &facts);
        for (ws, mut info) in open {
            if let Some((_, reason)) = plan.drop.iter().find(|(e, _)| *e == info.epoch) {
                let last = self.last_seen_ms(&ws, &info);
                worker::console_log!(
                    "runner hub: dropping {} of {} ({}, silent for {} s)",
                    runner_label(&info),
                    info.owner,
                    reason.close_reason(),
                    (now - last) / 1000
                );
                close(&ws, 1001, reason.close_reason());
                let why = match reason {
                    DropReason::Silent => "stopped sending heartbeats",
                    DropReason::NoHello => "never said hello",
                };
                self.on_gone(&ws, why);
                continue;
            }
            if let Some((_, last)) = plan.persist.iter().find(|(e, _)| *e == info.epoch)
                && let Some(runner) = &info.runner
            {
                if let Err(e) =
                    store::touch_runner(&self.sql, &info.owner, &runner.name, info.epoch, *last)
                {
                    worker::console_error!("runner hub: {}", e.message);
                }
                info.persisted_ms = *last;
                save_info(&ws, &info);
            }
        }
        if let Some(at) = plan.next_alarm_ms {
            let offset = (at - now).max(0) + 1000;
            if let Err(e) = self.state.storage().set_alarm(offset).await {
                worker::console_error!("runner hub: setting the alarm failed: {e}");
            }
        }
    }

    // ---- calls ---------------------------------------------------------------------------

    async fn call(&self, sub: &str, request: RunnerCallRequest) -> ApiResult<Response> {
        let RunnerCallRequest {
            runner,
            owner,
            message,
            timeout_ms,
        } = request;
        // A runner answers attach with the environment it made; its name is the requested
        // one whatever the runner says (a runner must not rename or shadow environments).
        let attach_name = match &message {
            ServerMessage::Attach { spec, .. } => Some(spec.name.clone()),
            _ => None,
        };
        let (id, is_tool_call, is_cancel) = match &message {
            ServerMessage::Attach { id, .. }
            | ServerMessage::Detach { id, .. }
            | ServerMessage::Validate { id, .. } => (id.clone(), false, false),
            ServerMessage::ToolCall { id, .. } => (id.clone(), true, false),
            ServerMessage::Cancel { id } => (id.clone(), false, true),
            _ => {
                return Err(ApiError::bad_request(
                    "message must be attach, detach, validate, tool_call or cancel",
                ));
            }
        };
        if id.is_empty() {
            return Err(ApiError::bad_request("message id must not be empty"));
        }
        let Some((ws, info)) = self.find_socket(&owner, &runner) else {
            return Err(ApiError::new(
                503,
                "runner_not_connected",
                format!("runner {runner:?} is not connected"),
            ));
        };
        let kind = info.runner.as_ref().map_or(RunnerKind::Local, |r| r.kind);
        if info.owner != sub && kind != RunnerKind::Cloud {
            return Err(ApiError::new(
                403,
                "forbidden",
                format!("runner {runner:?} is another user's local runner"),
            ));
        }
        let epoch = info.epoch;
        let frame = encode_frame(&message);
        if frame.len() > MAX_FRAME_BYTES {
            return Err(ApiError::new(
                413,
                codes::FRAME_TOO_LARGE,
                format!(
                    "the request is {} bytes; a runner frame holds at most {MAX_FRAME_BYTES}",
                    frame.len()
                ),
            ));
        }
        if is_cancel {
            if ws.send_with_str(&frame).is_err() {
                return Err(disconnected(&runner));
            }
            return Ok(json_response(
                200,
                &RunnerCallResponse {
                    epoch,
                    response: None,
                },
            ));
        }
        let timeout = timeout_ms
            .unwrap_or(DEFAULT_CALL_TIMEOUT_MS)
            .clamp(1, MAX_CALL_TIMEOUT_MS);
        let key = (epoch, id.clone());
        let (tx, rx) = oneshot::channel::<Outcome>();
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        {
            let mut pending = self.pending.borrow_mut();
            if pending.contains_key(&key) {
                return Err(ApiError::new(
                    409,
                    "conflict",
                    format!("a request with id {id:?} is already waiting on runner {runner:?}"),
                ));
            }
            pending.insert(key.clone(), Waiter { token, tx });
        }
        let _guard = WaiterGuard {
            pending: &self.pending,
            key,
            token,
        };
        if ws.send_with_str(&frame).is_err() {
            return Err(disconnected(&runner));
        }
        let timer = Delay::from(Duration::from_millis(timeout));
        match select(rx, timer).await {
            Either::Left((Ok(Ok(mut response)), _)) => {
                // What reaches a session is bounded whatever the runner sent.
                if response.bound_tool_result() {
                    worker::console_log!(
                        "runner hub: cut an oversized tool_result {id} from runner {runner:?}"
                    );
                }
                if let (
                    Some(name),
                    RunnerMessage::AttachResult {
                        outcome: AttachOutcome::Ok { environment },
                        ..
                    },
                ) = (attach_name, &mut response)
                    && environment.name != name
                {
                    worker::console_log!(
                        "runner hub: runner {runner:?} of {owner} answered attach of {name:?} as {:?}; keeping {name:?}",
                        environment.name
                    );
                    environment.name = name;
                }
                Ok(json_response(
                    200,
                    &RunnerCallResponse {
                        epoch,
                        response: Some(response),
                    },
                ))
            }
            Either::Left((Ok(Err(error)), _)) => Err(error),
            Either::Left((Err(_), _)) => Err(disconnected(&runner)),
            Either::Right(_) => {
                if is_tool_call {
                    send(&ws, &ServerMessage::Cancel { id: id.clone() });
                }
                Err(ApiError::new(
                    504,
                    "timeout",
                    format!("runner {runner:?} did not answer {id:?} within {timeout} ms"),
                ))
            }
        }
    }

    // ---- listings and definitions --------------------------------------------------------

    fn runner_views(&self) -> ApiResult<Vec<RunnerView>> {
        let open = self.open_sockets();
        Ok(store::runners(&self.sql)?
            .into_iter()
            .map(|row| {
                let connected = open.iter().any(|(_, info)| {
                    info.owner == row.owner
                        && info.runner.as_ref().is_some_and(|r| r.name == row.name)
                });
                RunnerView {
                    kind: row.kind(),
                    environments: row.environments(),
                    capabilities: row.capabilities(),
                    owner: row.owner,
                    name: row.name,
                    os: row.os,
                    connected,
                }
            })
            .collect())
    }

    fn list_runners(&self) -> ApiResult<Response> {
        let open = self.open_sockets();
        let runners = store::runners(&self.sql)?
            .into_iter()
            .map(|row| {
                let live = open
                    .iter()
                    .filter(|(_, info)| {
                        info.owner == row.owner
                            && info.runner.as_ref().is_some_and(|r| r.name == row.name)
                    })
                    .max_by_key(|(_, info)| info.epoch);
                let last_seen_ms = live.map_or(row.last_seen_ms, |(ws, info)| {
                    self.last_seen_ms(ws, info).max(row.last_seen_ms)
                });
                RunnerInfo {
                    kind: row.kind(),
                    capabilities: row.capabilities(),
                    environments: row
                        .environments()
                        .into_iter()
                        .map(|e| RunnerEnvironmentInfo {
                            name: e.name,
                            path: e.path,
                        })
                        .collect(),
                    connected: live.is_some(),
                    last_seen: last_seen_ms / 1000,
                    connected_at: live.map(|(_, info)| info.connected_at_ms / 1000),
                    version: row.version.clone(),
                    name: row.name.clone(),
                    owner: row.owner.clone(),
                    os: row.os.clone(),
                    arch: row.arch.clone(),
                }
            })
            .collect();
        Ok(json_response(200, &ListRunnersResponse { runners }))
    }

    fn find_definition(&self, key: &str) -> ApiResult<wuhu_core::wire::EnvironmentDefinition> {
        store::definition(&self.sql, key)?
            .ok_or_else(|| ApiError::not_found(format!("no environment {key:?}")))
    }

    fn create_environment(&self, who: &Principal, body: &[u8]) -> ApiResult<Response> {
        let request: CreateEnvironmentRequest = parse_json(body)?;
        let id = uuid::Uuid::new_v4().to_string();
        let mut definition = request
            .into_definition(id, now_ms() / 1000)
            .map_err(ApiError::bad_request)?;
        definition.owner = Some(who.sub.clone());
        resolve::bind_runner(who, &mut definition, &self.runner_views()?).map_err(resolve_error)?;
        if store::name_taken(&self.sql, &definition.name, &definition.id)? {
            return Err(name_conflict(&definition.name));
        }
        store::put_definition(&self.sql, &definition)?;
        Ok(json_response(201, &definition))
    }

    fn update_environment(&self, who: &Principal, key: &str, body: &[u8]) -> ApiResult<Response> {
        let current = self.find_definition(key)?;
        check_may_edit(who, &current)?;
        let update: UpdateEnvironmentRequest = parse_json(body)?;
        let mut next = current
            .apply(update, now_ms() / 1000)
            .map_err(ApiError::bad_request)?;
        resolve::bind_runner(who, &mut next, &self.runner_views()?).map_err(resolve_error)?;
        if store::name_taken(&self.sql, &next.name, &next.id)? {
            return Err(name_conflict(&next.name));
        }
        store::put_definition(&self.sql, &next)?;
        Ok(json_response(200, &next))
    }
}

/// 403 unless `who` owns the definition or is an admin (a definition without an owner, stored
/// before owners existed, is editable only by admins).
fn check_may_edit(who: &Principal, definition: &EnvironmentDefinition) -> ApiResult<()> {
    let owner = definition.owner.as_deref().unwrap_or_default();
    if authority::may_edit_definition(who, owner) {
        return Ok(());
    }
    let whose = match definition.owner.as_deref() {
        Some(owner) => format!("{owner:?}'s"),
        None => String::from("an unowned (legacy)"),
    };
    Err(ApiError::new(
        403,
        "forbidden",
        format!(
            "environment {:?} is {whose} definition; only its owner or an admin may change or delete it",
            definition.name
        ),
    ))
}

fn resolve_error(error: ResolveError) -> ApiError {
    ApiError::new(error.status(), error.code(), error.message)
}

fn disconnected(runner: &str) -> ApiError {
    ApiError::new(
        502,
        "runner_disconnected",
        format!("runner {runner:?} disconnected while the call was running"),
    )
}

fn name_conflict(name: &str) -> ApiError {
    ApiError::new(
        409,
        "conflict",
        format!("an environment named {name:?} already exists"),
    )
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
