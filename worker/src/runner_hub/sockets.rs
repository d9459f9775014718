//! Runner WebSockets: accepting them, their per-socket state (an attachment that survives
//! hibernation), `hello`, frames and answers, closing, and the liveness sweep. The decisions are
//! `wuhu_core::hub`'s; this module gathers the facts and performs them.

mod hello;

use wasm_bindgen::{JsCast, JsValue};
use worker::{
    Request, Response, SqlStorage, State, WebSocket, WebSocketIncomingMessage, WebSocketPair,
};
use wuhu_core::hub::{
    self, DropReason, Hello, HelloDecision, KeyDecision, KnownRunner, Liveness, OpenConnection,
    SILENCE_LIMIT_MS,
};
use wuhu_core::wire::runner::{
    CLOSE_FRAME_TOO_LARGE, DEFAULT_HEARTBEAT_SECONDS, HEARTBEAT_ACK_FRAME, HELLO_NONCE_HEADER,
    JobEvent, JobReport, MAX_FRAME_BYTES, MAX_FRAME_BYTES_BEFORE_WELCOME, RunnerKind,
    RunnerMessage, ServerMessage, capabilities, codes, decode_frame_within, hello_signing_input,
    jobs,
};

use wuhu_core::authority::{self, Principal};

use super::discards;
use super::socket_state::{SocketInfo, SocketRunner, info_of, now_ms, save_info, send};
use super::store;
use super::waiters::Waiters;
use crate::http::{ApiError, ApiResult};

/// `WebSocket.readyState` of an open socket.
const OPEN: u16 = 1;

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

/// The open sockets as the hub rules see them; `last_seen` says when each was last heard
/// from (heartbeats answered by the runtime included).
fn connections<'a>(
    open: &'a [(WebSocket, SocketInfo)],
    last_seen: impl Fn(&WebSocket, &SocketInfo) -> i64,
) -> Vec<OpenConnection<'a>> {
    open.iter()
        .map(|(ws, info)| OpenConnection {
            epoch: info.epoch,
            owner: &info.owner,
            name: info.runner.as_ref().map(|r| r.name.as_str()),
            last_seen_ms: last_seen(ws, info),
        })
        .collect()
}

/// The hub's runner sockets, with what acting on them needs.
pub(super) struct Sockets<'a> {
    pub(super) state: &'a State,
    pub(super) env: &'a worker::Env,
    pub(super) sql: &'a SqlStorage,
    pub(super) waiters: &'a Waiters,
}

impl Sockets<'_> {
    /// `Connect`: accepts a runner's WebSocket for `sub` (the token's owner); `jti` is its
    /// token's, when revocable.
    pub(super) async fn accept(
        &self,
        req: &Request,
        sub: &str,
        jti: Option<String>,
    ) -> ApiResult<Response> {
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
        crate::http::require_websocket_upgrade(req)?;
        let open = self.open();
        hub::admit_socket(sub, open.iter().map(|(_, info)| info.owner.as_str()))
            .map_err(|message| ApiError::new(429, "too_many_runners", message))?;
        let epoch = store::next_epoch(self.sql)?;
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let pair = WebSocketPair::new()?;
        self.state.accept_web_socket(&pair.server);
        let now = now_ms();
        save_info(
            &pair.server,
            &SocketInfo {
                owner: sub.to_string(),
                tenant: req
                    .headers()
                    .get("x-wuhu-tenant")
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
                token_kind,
                epoch,
                connected_at_ms: now,
                last_seen_ms: now,
                persisted_ms: now,
                runner: None,
                closed: false,
                jti,
                nonce: nonce.clone(),
            },
        );
        // A socket that never says hello is dropped by the sweep.
        self.arm_alarm(now + hub::HELLO_DEADLINE_MS).await;
        let mut response = Response::from_websocket(pair.client)?;
        response.headers_mut().set(HELLO_NONCE_HEADER, &nonce)?;
        Ok(response)
    }

    /// Open sockets with their state (hibernation-safe: read from the runtime each time).
    pub(super) fn open(&self) -> Vec<(WebSocket, SocketInfo)> {
        self.state
            .get_websockets()
            .into_iter()
            .filter(|ws| ws.as_ref().ready_state() == OPEN)
            .filter_map(|ws| info_of(&ws).map(|info| (ws, info)))
            .filter(|(_, info)| !info.closed)
            .collect()
    }

    /// The newest open, welcomed socket of `owner`'s runner `name`.
    pub(super) fn find(&self, owner: &str, name: &str) -> Option<(WebSocket, SocketInfo)> {
        self.open()
            .into_iter()
            .filter(|(_, info)| info.serves(owner, name))
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

    /// When `ws` last sent anything, heartbeats answered by the runtime included (ms).
    pub(super) fn last_seen_ms(&self, ws: &WebSocket, info: &SocketInfo) -> i64 {
        self.auto_response_ms(ws)
            .map_or(info.last_seen_ms, |t| t.max(info.last_seen_ms))
    }

    /// A frame from a runner.
    pub(super) async fn on_frame(&self, ws: &WebSocket, message: WebSocketIncomingMessage) {
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
                store::touch_runner(self.sql, &info.owner, &runner.name, info.epoch, now)
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
                session_id: Some(session_id),
                data,
                ..
            } if name == jobs::FINISHED_EVENT => {
                self.forward_job_event(&info, &runner.name, &session_id, data)
                    .await;
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
            RunnerMessage::ToolProgress { id, stream, text } => {
                self.relay_progress(&info, &id, stream, text).await;
            }
            RunnerMessage::DiscardResult {
                session_id,
                outcome,
                ..
            } => discards::on_result(self.sql, ws, &info, &session_id, &outcome),
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
                if !self.waiters.deliver(info.epoch, &id, message) {
                    worker::console_log!(
                        "runner hub: answer {id} from {}/{} matches no waiting request (timed out or cancelled)",
                        info.owner,
                        runner.name
                    );
                }
            }
        }
    }

    /// Relays a `tool_progress` frame to the session whose call it is, while the call waits
    /// (a frame for any other id is dropped: a runner reaches only the sessions that called
    /// it). The first frame's handler forwards the call's frames in order until none is left
    /// (`wuhu_core::tool_output::RelayQueue`); a session that cannot be reached loses them (the
    /// call's result is the source of truth).
    async fn relay_progress(
        &self,
        info: &SocketInfo,
        id: &str,
        stream: wuhu_core::wire::runner::OutputStream,
        text: String,
    ) {
        let Some(session_id) = self.waiters.progress(info.epoch, id, stream, text) else {
            return;
        };
        let stub = match crate::session_client::stub(self.env, &info.tenant, &session_id) {
            Ok(stub) => stub,
            Err(e) => {
                worker::console_error!(
                    "runner hub: no stub for session {session_id}: {}",
                    e.message
                );
                while self.waiters.next_progress(info.epoch, id).is_some() {}
                return;
            }
        };
        let who = crate::identity::Identity::system(&info.tenant);
        while let Some((stream, text)) = self.waiters.next_progress(info.epoch, id) {
            let call =
                wuhu_core::calls::session::ToolOutput(wuhu_core::wire::runner::ToolOutputRelay {
                    runner_call_id: id.to_string(),
                    stream,
                    text,
                });
            if let Err(e) = crate::internal::call(&stub, &who, &call).await {
                worker::console_log!(
                    "runner hub: output of call {id} did not reach session {session_id} ({}): {}",
                    e.code,
                    e.message
                );
            }
        }
    }

    /// Hands a job's end to the session it names. A session that refuses it (not its job, or
    /// not from this runner) or cannot be reached is logged: the session's poll finds the
    /// job's end anyway.
    async fn forward_job_event(
        &self,
        info: &SocketInfo,
        runner: &str,
        session_id: &str,
        data: serde_json::Value,
    ) {
        let report: JobReport = match serde_json::from_value(data) {
            Ok(report) => report,
            Err(e) => {
                worker::console_log!(
                    "runner hub: a job event from {}/{runner} does not fit: {e}",
                    info.owner
                );
                return;
            }
        };
        let event = JobEvent {
            runner: runner.to_string(),
            runner_owner: info.owner.clone(),
            report,
        };
        let sent = async {
            let stub = crate::session_client::stub(self.env, &info.tenant, session_id)?;
            let who = crate::identity::Identity::system(&info.tenant);
            let call = wuhu_core::calls::session::JobEnded(event.clone());
            crate::internal::call(&stub, &who, &call).await
        }
        .await;
        if let Err(e) = sent {
            worker::console_log!(
                "runner hub: job {} of {}/{runner} did not reach session {session_id} ({}): {}",
                event.report.job_id,
                info.owner,
                e.code,
                e.message
            );
        }
    }

    /// The tenant's runner names after deleting those whose reservation expired
    /// ([`hub::expired_rows`]); `open` are the open sockets.
    pub(super) fn purge_expired(
        &self,
        now: i64,
        open: &[(WebSocket, SocketInfo)],
    ) -> ApiResult<Vec<store::NameRow>> {
        let mut rows = store::names(self.sql)?;
        let connections = connections(open, |ws, info| self.last_seen_ms(ws, info));
        let expired = {
            let known: Vec<KnownRunner<'_>> = rows.iter().map(store::NameRow::known).collect();
            hub::expired_rows(now, &known, &connections)
        };
        for &i in expired.iter().rev() {
            let row = rows.remove(i);
            worker::console_log!(
                "runner hub: name {:?} of {} expired (last seen {} days ago)",
                row.name,
                row.owner,
                (now - row.last_seen_ms) / 86_400_000
            );
            store::delete_runner(self.sql, &row.owner, &row.name)?;
        }
        Ok(rows)
    }

    /// `DELETE /runners/:owner/:name`: frees `owner`'s runner name. A live connection of it is
    /// refused for good ([`codes::RUNNER_REMOVED`]: the runner stops instead of reconnecting)
    /// and its calls fail. 404 when there is no such runner, 403 unless `who` is the owner or an
    /// admin ([`authority::may_free_runner_name`]).
    pub(super) fn free(&self, who: &Principal, owner: &str, name: &str) -> ApiResult<()> {
        let live: Vec<(WebSocket, SocketInfo)> = self
            .open()
            .into_iter()
            .filter(|(_, info)| info.serves(owner, name))
            .collect();
        if live.is_empty() && store::runner(self.sql, owner, name)?.is_none() {
            return Err(ApiError::not_found(format!(
                "no runner {name:?} of {owner:?}"
            )));
        }
        if !authority::may_free_runner_name(who, owner) {
            return Err(ApiError::new(
                403,
                "forbidden",
                format!(
                    "runner {name:?} is {owner:?}'s; only its owner or an admin may free its name"
                ),
            ));
        }
        let message = format!(
            "runner name {name:?} of {owner:?} was freed by {:?}; this runner no longer serves the tenant (start it again to register anew)",
            who.sub
        );
        for (ws, info) in live {
            worker::console_log!("runner hub: {message}");
            send(
                &ws,
                &ServerMessage::Refused {
                    code: codes::RUNNER_REMOVED.to_string(),
                    message: message.clone(),
                },
            );
            self.close_for_good(
                &ws,
                info,
                1008,
                &close_reason(&format!("{}: {message}", codes::RUNNER_REMOVED)),
            );
        }
        store::delete_runner(self.sql, owner, name)?;
        Ok(())
    }

    /// A socket closed or failed: fail its calls, mark its runner offline.
    pub(super) fn on_gone(&self, ws: &WebSocket, why: &str) {
        let Some(mut info) = info_of(ws) else {
            return;
        };
        let label = runner_label(&info);
        self.waiters.fail_epoch(
            info.epoch,
            format!("{label} {why} while the call was running"),
        );
        if let Some(runner) = &info.runner
            && let Err(e) =
                store::disconnect_runner(self.sql, &info.owner, &runner.name, info.epoch, now_ms())
        {
            worker::console_error!("runner hub: {}", e.message);
        }
        if !info.closed {
            info.closed = true;
            // The attachment of a closed socket may no longer be writable; that is fine.
            let _ = ws.serialize_attachment(&info);
        }
    }

    /// The tokens `jtis` were revoked: closes every open socket that connected with one (1008
    /// `token revoked`; the runner's reconnect is refused with 401) and fails what waits on
    /// them. Returns how many were closed.
    pub(super) fn revoked(&self, jtis: &[String]) -> usize {
        let jtis: std::collections::HashSet<&str> = jtis.iter().map(String::as_str).collect();
        let mut closed = 0;
        for (ws, info) in self.open() {
            if !info.jti.as_deref().is_some_and(|jti| jtis.contains(jti)) {
                continue;
            }
            worker::console_log!(
                "runner hub: closing {} of {}: its token was revoked",
                runner_label(&info),
                info.owner
            );
            send_error(&ws, None, codes::UNAUTHORIZED, "token revoked");
            self.close_for_good(&ws, info, 1008, "token revoked");
            closed += 1;
        }
        closed
    }

    /// Closes `ws` and fails what waits on it; the socket no longer counts as open.
    fn close_for_good(&self, ws: &WebSocket, mut info: SocketInfo, code: u16, reason: &str) {
        info.closed = true;
        save_info(ws, &info);
        close(ws, code, reason);
        self.on_gone(ws, "was closed by the server");
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
    pub(super) async fn sweep(&self) {
        let now = now_ms();
        let open = self.open();
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
        if let Err(e) = self.purge_expired(now, &open) {
            worker::console_error!("runner hub: expiring runner names failed: {}", e.message);
        }
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
                    store::touch_runner(self.sql, &info.owner, &runner.name, info.epoch, *last)
                {
                    worker::console_error!("runner hub: {}", e.message);
                }
                info.persisted_ms = *last;
                save_info(&ws, &info);
            }
            // Discards that failed on this connection (or wait beyond the in-flight bound).
            if info.runner.is_some()
                && let Err(e) = discards::send_waiting(self.sql, &ws, &info)
            {
                worker::console_error!(
                    "runner hub: reading the waiting discards failed: {}",
                    e.message
                );
            }
        }
        if let Some(at) = plan.next_alarm_ms {
            let offset = (at - now).max(0) + 1000;
            if let Err(e) = self.state.storage().set_alarm(offset).await {
                worker::console_error!("runner hub: setting the alarm failed: {e}");
            }
        }
    }
}
