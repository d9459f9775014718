//! `GET /socket`: a client WebSocket on the session (docs/api.md, "Session socket"). The frames
//! and their validation are `wuhu_core::socket`; the event stream is a follower of the actor's
//! [`super::follow::Followers`] list (the rules are `wuhu_core::follow`), written to the socket
//! instead of an SSE body; client frames run the same actions as the HTTP routes
//! ([`Actor::enqueue`], [`Actor::stop`], [`Actor::cancel`]) after the same checks.
//!
//! Sockets are accepted with the hibernation API: the runtime keeps them open while the actor is
//! evicted from memory. What a socket needs after a wake is its attachment ([`Attachment`]: who,
//! the credential's `jti`, the last cursor sent). The first event of a fresh isolate (a request,
//! a frame, a close, the alarm) re-registers every open socket from its attachment, resuming
//! after that cursor, so nothing is lost or sent twice. The cursor is written to the attachment
//! (in memory, no storage write) whenever the sink has sent everything it had and waits: the
//! actor can only be evicted while every sink waits, so the stored cursor is the one reached.
//!
//! Flow control (`wuhu_core::socket::AckWindow`): every frame sent (event or reply) is recorded
//! in the sink's window; an `ack` frame releases what the client has read. The sink sends an
//! event only while the window is open; otherwise it waits for an ack while its events queue
//! in its `Follow`, whose bound lags it. The window's numbering and what is unacknowledged are
//! saved in the attachment with the cursor (the client's count goes on across a hibernation).

use std::cell::RefCell;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use worker::{Request, Response, WebSocket, WebSocketIncomingMessage, WebSocketPair};
use wuhu_core::authority::{Role, SessionAction};
use wuhu_core::follow::{Follow, FollowRequest, Output};
use wuhu_core::socket::{
    AckWindow, CLOSE_LOST_STATE, ClientFrame, MessagePacker, ReplyFrame, close_code,
    parse_client_frame,
};

use super::follow::{self, Shared};
use super::{Actor, now};
use crate::http::{ApiError, ApiResult};
use crate::identity::Identity;
use crate::token_registry;

/// A socket's state that survives hibernation (kept small: the runtime bounds attachments).
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Attachment {
    /// Names the socket's sink in the followers list.
    id: String,
    sub: String,
    tenant: String,
    role: String,
    /// The `jti` of a revocable credential (re-checked while the socket is open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
    /// The last cursor sent (or the connect's `after`): where a re-registration resumes.
    cursor: u64,
    /// The sink ended and the socket was closed by the actor.
    #[serde(default)]
    closed: bool,
    /// The ack window (`AckWindow::saved`): frames sent, and frames and bytes unacknowledged.
    #[serde(default)]
    sent: u64,
    #[serde(default)]
    unacked: u64,
    #[serde(default)]
    unacked_bytes: u64,
}

impl Attachment {
    fn identity(&self) -> Identity {
        Identity {
            sub: self.sub.clone(),
            tenant: self.tenant.clone(),
            role: Role::parse(&self.role).unwrap_or_default(),
            runner_kind: None,
        }
    }
}

/// The attachment is stored as its JSON text (a string is all the runtime's structured clone
/// sees; no second serializer for this type in the Worker).
fn attachment(ws: &WebSocket) -> Option<Attachment> {
    let text = ws.deserialize_attachment::<String>().ok().flatten()?;
    serde_json::from_str(&text).ok()
}

fn save(ws: &WebSocket, attachment: &Attachment) {
    let text = serde_json::to_string(attachment).unwrap_or_default();
    if let Err(e) = ws.serialize_attachment(text) {
        worker::console_error!("session socket: saving its attachment failed: {e}");
    }
}

impl Actor {
    /// `GET /socket` (the router authenticated the upgrade, and the caller may read the
    /// session): registers the socket's sink, accepts the socket, starts sending.
    pub(super) async fn accept_socket(
        self: &Rc<Self>,
        req: &Request,
        call: &wuhu_core::calls::session::Socket,
        identity: &Identity,
    ) -> ApiResult<Response> {
        crate::http::require_websocket_upgrade(req)?;
        self.revive_sockets();
        let after = call.after;
        let jti = call.jti.clone();
        let attachment = Attachment {
            id: uuid::Uuid::new_v4().to_string(),
            sub: identity.sub.clone(),
            tenant: identity.tenant.clone(),
            role: identity.role.as_str().to_string(),
            jti,
            cursor: after,
            closed: false,
            sent: 0,
            unacked: 0,
            unacked_bytes: 0,
        };
        let pair = WebSocketPair::new()?;
        // Registered before it is accepted: a socket over the cap is refused (429) unopened.
        let shared = self.register_socket(&attachment)?;
        self.state.accept_web_socket(&pair.server);
        save(&pair.server, &attachment);
        drive(self.clone(), shared, pair.server, attachment);
        Ok(Response::from_websocket(pair.client)?)
    }

    /// A sink for `attachment`'s socket in the followers list, resuming after its cursor.
    fn register_socket(&self, attachment: &Attachment) -> ApiResult<Rc<RefCell<Shared>>> {
        let request = FollowRequest {
            since_cursor: attachment.cursor,
            since_time: None,
            stop_after_idle: false,
            timeout_seconds: None,
        };
        // As for `/follow`: the snapshot and the registration happen in one synchronous step.
        let registration = self.follow_registration()?;
        let mut follow = Follow::new(now(), &request, registration)
            .with_running_output(self.in_flight.runner_calls.output_tails())
            .without_heartbeats();
        let credential = match &attachment.jti {
            Some(jti) => {
                follow = follow.recheck_credential(now());
                Some((attachment.identity(), jti.clone()))
            }
            None => None,
        };
        let shared = self.clients.followers.borrow_mut().add(
            follow,
            credential,
            Some(attachment.id.clone()),
        )?;
        shared.borrow_mut().acks = AckWindow::restore(
            attachment.sent,
            attachment.unacked,
            attachment.unacked_bytes,
        );
        Ok(shared)
    }

    /// Sends a reply on `ws` and records it in the socket's ack window (and wakes its sink, which
    /// saves the window in the attachment).
    fn send_reply(&self, ws: &WebSocket, socket: &str, text: &str) {
        let _ = ws.send_with_str(text);
        if let Some(shared) = self.clients.followers.borrow().socket(socket) {
            let mut shared = shared.borrow_mut();
            shared.acks.record_sent(text.len());
            shared.wake();
        }
    }

    /// Re-registers every open socket of a fresh isolate (after hibernation) from its
    /// attachment, once. Cheap when there is none.
    pub(super) fn revive_sockets(self: &Rc<Self>) {
        if self.clients.sockets_revived.get() {
            return;
        }
        let sockets = self.state.get_websockets();
        if sockets.is_empty() {
            self.clients.sockets_revived.set(true);
            return;
        }
        if !matches!(self.ensure_loaded(), Ok(true)) {
            return;
        }
        self.clients.sockets_revived.set(true);
        let mut revived = 0;
        for ws in sockets {
            let Some(attachment) = attachment(&ws) else {
                let _ = ws.close(Some(CLOSE_LOST_STATE), Some("lost connection state"));
                continue;
            };
            if attachment.closed || self.clients.followers.borrow().has_socket(&attachment.id) {
                continue;
            }
            match self.register_socket(&attachment) {
                Ok(shared) => {
                    revived += 1;
                    drive(self.clone(), shared, ws, attachment);
                }
                Err(e) => {
                    let _ = ws.close(Some(CLOSE_LOST_STATE), Some(&truncate(&e.message)));
                }
            }
        }
        if revived > 0 {
            // One line per wake that found open sockets (hibernation is otherwise invisible).
            let line = serde_json::json!({
                "event": "sockets_revived",
                "session": self.session_id(),
                "sockets": revived,
            });
            worker::console_log!("{line}");
        }
    }

    /// A frame from a client socket: exactly one reply, whatever it holds.
    pub(super) async fn socket_frame(
        self: &Rc<Self>,
        ws: &WebSocket,
        message: WebSocketIncomingMessage,
    ) {
        self.revive_sockets();
        let Some(attachment) = attachment(ws) else {
            let _ = ws.close(Some(CLOSE_LOST_STATE), Some("lost connection state"));
            return;
        };
        if attachment.closed {
            return;
        }
        let frame = match &message {
            WebSocketIncomingMessage::String(text) => parse_client_frame(Some(text), 0),
            WebSocketIncomingMessage::Binary(bytes) => parse_client_frame(None, bytes.len()),
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                self.send_reply(ws, &attachment.id, &error.reply().encode());
                return;
            }
        };
        let sink = self.clients.followers.borrow().socket(&attachment.id);
        let Some(id) = frame.id().map(str::to_string) else {
            // An ack: no reply unless it cannot be taken.
            if let (ClientFrame::Ack { received }, Some(sink)) = (&frame, &sink) {
                let acked = {
                    let mut sink = sink.borrow_mut();
                    let acked = sink.acks.ack(*received);
                    sink.wake();
                    acked
                };
                if let Err(error) = acked {
                    self.send_reply(ws, &attachment.id, &error.reply().encode());
                }
            }
            return;
        };
        // A client that sends without reading: past twice the window, the socket ends as a
        // lagged one (the frame is not run).
        if let Some(sink) = &sink {
            let mut sink = sink.borrow_mut();
            if !sink.acks.may_reply() {
                sink.follow.lag();
                sink.wake();
                return;
            }
        }
        let reply = match self.socket_action(&attachment, &id, frame).await {
            Ok(reply) => reply,
            Err(e) => ReplyFrame::<()>::error(Some(&id), e.status, &e.code, e.message).encode(),
        };
        self.send_reply(ws, &attachment.id, &reply);
    }

    /// What the HTTP twin of `frame` does, after the checks it has: a revocable credential must
    /// still be live (as `authenticate` asks on every request), and the caller must be able to
    /// read the session (as every session route checks first).
    async fn socket_action(
        self: &Rc<Self>,
        attachment: &Attachment,
        id: &str,
        frame: ClientFrame,
    ) -> ApiResult<String> {
        let identity = attachment.identity();
        if let Some(jti) = &attachment.jti {
            let live = token_registry::still_live(&self.env, &identity, jti).await?;
            if !live {
                // The stream ends too, as the next periodic check would end it.
                self.clients
                    .followers
                    .borrow_mut()
                    .socket_revoked(&attachment.id);
                return Err(ApiError::unauthorized("token revoked"));
            }
        }
        if !self.ensure_loaded()? {
            return Err(ApiError::not_found("session not found"));
        }
        self.authorize(&identity.principal(), SessionAction::Read)?;
        Ok(match frame {
            ClientFrame::Enqueue { lane, body, .. } => {
                let lane = wuhu_core::calls::session::public_lane(lane.as_deref())
                    .map_err(crate::internal::call_error)?;
                let response = self.enqueue(&identity, lane, body, None).await?;
                ReplyFrame::ok(id, 200, response).encode()
            }
            ClientFrame::Stop { .. } => {
                ReplyFrame::ok(id, 200, self.stop(&identity).await?).encode()
            }
            ClientFrame::Cancel { body, .. } => {
                ReplyFrame::ok(id, 200, self.cancel(&identity, body).await?).encode()
            }
            // Taken before any action (it has no `id`).
            ClientFrame::Ack { .. } => return Err(ApiError::internal("an ack is not an action")),
        })
    }

    /// A client socket closed (or failed): its sink ends.
    pub(super) fn socket_closed(self: &Rc<Self>, ws: &WebSocket) {
        self.revive_sockets();
        // Completes the closing handshake (a no-op when the socket is closed already).
        let _ = ws.close(Some(1000), Some("closed"));
        if let Some(attachment) = attachment(ws) {
            self.clients
                .followers
                .borrow_mut()
                .socket_gone(&attachment.id);
        }
    }
}

fn truncate(text: &str) -> String {
    // A close reason is at most 123 bytes.
    let mut end = text.len().min(120);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Saves the cursor reached and the ack window in the attachment, when they changed (before
/// every wait: the actor may hibernate then).
fn checkpoint(ws: &WebSocket, shared: &RefCell<Shared>, attachment: &mut Attachment) {
    let shared = shared.borrow();
    let cursor = shared.follow.sent_cursor();
    let (sent, unacked, unacked_bytes) = shared.acks.saved();
    let now = (cursor, sent, unacked, unacked_bytes);
    let was = (
        attachment.cursor,
        attachment.sent,
        attachment.unacked,
        attachment.unacked_bytes,
    );
    if now != was {
        attachment.cursor = cursor;
        attachment.sent = sent;
        attachment.unacked = unacked;
        attachment.unacked_bytes = unacked_bytes;
        save(ws, attachment);
    }
}

/// Runs a socket's sink until it ends: the same loop as an SSE stream's (`follow`), packing the
/// frames it has ready (each frame's `data` JSON, while the ack window is open) into messages
/// (`wuhu_core::socket::MessagePacker`) sent before it waits for anything, saving the cursor
/// reached and the window whenever it waits, and closing the socket with the code of the reason
/// it ended.
fn drive(actor: Rc<Actor>, shared: Rc<RefCell<Shared>>, ws: WebSocket, mut attachment: Attachment) {
    wasm_bindgen_futures::spawn_local(async move {
        let mut packer = MessagePacker::default();
        let socket_id = attachment.id.clone();
        // Sends a message; false when the socket is gone.
        let send = |message: String| {
            if ws.send_with_str(&message).is_err() {
                actor.clients.followers.borrow_mut().socket_gone(&socket_id);
                return false;
            }
            true
        };
        loop {
            let output = {
                let mut shared = shared.borrow_mut();
                if shared.gone {
                    return;
                }
                shared.woken = false;
                // The window is full: nothing is sent (not even a credential check is due: a
                // paused socket sends nothing) until an ack, or a live event that lags it.
                (shared.follow.is_closed() || shared.acks.may_send_event())
                    .then(|| shared.follow.poll(now()))
            };
            // What is packed goes out before anything that may wait.
            if !matches!(output, Some(Output::Frame(_)))
                && let Some(message) = packer.take()
                && !send(message)
            {
                return;
            }
            let Some(output) = output else {
                checkpoint(&ws, &shared, &mut attachment);
                follow::wait(&shared, None).await;
                continue;
            };
            match output {
                Output::Frame(frame) => {
                    if let Some(data) = frame.data() {
                        if let Some(message) = packer.push(data)
                            && !send(message)
                        {
                            return;
                        }
                        shared.borrow_mut().acks.record_sent(data.len());
                    }
                }
                Output::ReadPage { since, limit } => {
                    follow::read_page(&actor, &shared, since, limit).await
                }
                Output::CheckCredential => follow::check_credential(&actor, &shared).await,
                Output::Wait => {
                    checkpoint(&ws, &shared, &mut attachment);
                    let deadline = shared.borrow().follow.poll_deadline();
                    follow::wait(&shared, deadline).await;
                }
                Output::End => {
                    let reason = shared.borrow().follow.end_reason();
                    checkpoint(&ws, &shared, &mut attachment);
                    attachment.closed = true;
                    save(&ws, &attachment);
                    let (code, why) = reason.map_or((1000, "done"), close_code);
                    let _ = ws.close(Some(code), Some(why));
                    return;
                }
            }
        }
    });
}
