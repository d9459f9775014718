//! The Discord Gateway connection of a binding's actor (decision 0018): the socket, the timers
//! and the storage of `wuhu_core::channels::gateway::Gateway`, which decides everything.
//!
//! One task per connection generation runs [`Actor::run_gateway`]: it opens the socket the
//! machine asks for, feeds it frames, closes and timer expiries, and performs its actions. A
//! message is stored in the binding's inbox (deduplicated by message id, as a hook's is) and
//! delivered in order by one inbox task. The alarm is the watchdog ([`Actor::gateway_watchdog`]):
//! a connection that is not running (a fresh instance, a task that ended) is started, resuming
//! the stored session. Deleting the binding stops it; creating or patching starts it afresh.

use std::rc::Rc;

use futures::StreamExt;
use futures::future::{Either, select};
use serde_json::Value;
use worker::{WebSocket, WebsocketEvent};
use wuhu_core::channels::gateway::{
    self, Action, Gateway, GatewayState, GatewayStatus, Input, Saved,
};
use wuhu_core::channels::outbox::HttpCall;
use wuhu_core::channels::{ChannelBinding, Credentials, Delivery, Platform};

use super::{Actor, BodyRow, Stored, now_ms, send_call};

/// The in-memory side of the connection: which generation may run, and its socket (closed from
/// outside when the binding is deleted or patched).
#[derive(Default)]
pub(super) struct GatewayHandle {
    generation: u64,
    running: bool,
    /// When the running task last went round its loop: a task silent for longer than
    /// [`STALL_MS`] is taken for stuck and replaced by the watchdog.
    alive_at: u64,
    socket: Option<WebSocket>,
}

/// Longest wait in one go: the task looks at its generation at least this often.
const MAX_SLEEP_MS: u64 = 5_000;
/// A running task that has not gone round its loop for this long is replaced.
const STALL_MS: u64 = 3 * gateway::MAX_HEARTBEAT_MS;

impl Actor {
    /// What is stored of the connection (default: never connected).
    pub(super) fn gateway_saved(&self) -> Saved {
        self.sql
            .exec("SELECT saved AS body FROM gateway WHERE k = 1", None)
            .and_then(|c| c.to_array::<BodyRow>())
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|row| serde_json::from_str(&row.body).ok())
            .unwrap_or_default()
    }

    fn gateway_save(&self, saved: &Saved) {
        if let Ok(text) = serde_json::to_string(saved)
            && let Err(e) = self.sql.exec(
                "INSERT OR REPLACE INTO gateway (k, saved) VALUES (1, ?)",
                vec![text.into()],
            )
        {
            worker::console_error!("storing the gateway state failed: {e}");
        }
    }

    /// The connection's status, for a Discord binding.
    pub(super) fn gateway_status(&self) -> GatewayStatus {
        self.gateway_saved().status
    }

    /// Whether the alarm should keep watching the connection: a Discord binding whose
    /// connection has not given up.
    pub(super) fn gateway_wanted(&self) -> bool {
        let platform = self
            .sql
            .exec("SELECT body FROM binding WHERE k = 1", None)
            .and_then(|c| c.to_array::<BodyRow>())
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|row| serde_json::from_str::<Value>(&row.body).ok())
            .and_then(|b| b["platform"].as_str().and_then(Platform::parse));
        platform == Some(Platform::Discord)
            && self.gateway_saved().status.state != GatewayState::Stopped
    }

    /// Ends the running connection (its task sees the new generation and returns).
    pub(super) fn gateway_stop(&self) {
        let mut handle = self.gateway.borrow_mut();
        handle.generation += 1;
        handle.running = false;
        if let Some(socket) = handle.socket.take() {
            let _ = socket.close(Some(gateway::CLOSE_NORMAL), Some("binding changed"));
        }
    }

    /// After a create or patch: a new session from scratch (the token may be new), started now.
    pub(super) fn gateway_restart(self: &Rc<Self>, binding: &ChannelBinding) {
        self.gateway_stop();
        let _ = self.sql.exec("DELETE FROM gateway", None);
        self.gateway_watchdog(binding);
    }

    /// The watchdog (each alarm, a verified hook, a create or patch): starts the connection of
    /// a Discord binding when none is running, unless it gave up. True when it started one.
    pub(super) fn gateway_watchdog(self: &Rc<Self>, binding: &ChannelBinding) -> bool {
        if binding.platform != Platform::Discord {
            return false;
        }
        {
            let handle = self.gateway.borrow();
            if handle.running && now_ms().saturating_sub(handle.alive_at) < STALL_MS {
                return false;
            }
        }
        if self.gateway_saved().status.state == GatewayState::Stopped {
            return false;
        }
        let generation = {
            let mut handle = self.gateway.borrow_mut();
            if handle.running {
                worker::console_error!(
                    "channel {}: the gateway task stalled; replaced",
                    binding.id
                );
            }
            handle.generation += 1;
            handle.running = true;
            handle.alive_at = now_ms();
            if let Some(socket) = handle.socket.take() {
                let _ = socket.close(Some(gateway::CLOSE_TO_RESUME), Some("replaced"));
            }
            handle.generation
        };
        let actor = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            actor.run_gateway(generation).await;
            let mut handle = actor.gateway.borrow_mut();
            if handle.generation == generation {
                handle.running = false;
                handle.socket = None;
            }
        });
        true
    }

    fn current(&self, generation: u64) -> bool {
        let mut handle = self.gateway.borrow_mut();
        handle.alive_at = now_ms();
        handle.generation == generation
    }

    /// Stores the machine's state, unless this generation was replaced (a deleted binding
    /// keeps no row).
    fn save_if_current(&self, generation: u64, machine: &Gateway) {
        if self.current(generation) {
            self.gateway_save(machine.saved());
        }
    }

    /// One generation of the connection: connects, resumes, reconnects with backoff, until the
    /// machine stops or the generation is replaced.
    async fn run_gateway(self: &Rc<Self>, generation: u64) {
        let Ok(Some((binding, Credentials::Discord { bot_token, .. }))) = self.load_binding()
        else {
            return;
        };
        let mut machine = Gateway::new(bot_token.clone(), self.gateway_saved());
        loop {
            if !self.current(generation) || machine.is_stopped() {
                return;
            }
            let Some(at) = machine.poll_deadline() else {
                return;
            };
            let now = now_ms();
            if at > now {
                sleep(at.min(now + MAX_SLEEP_MS) - now).await;
                continue;
            }
            machine.handle(now, js_sys::Math::random(), Input::Timeout);
            while let Some(action) = machine.poll_action() {
                match action {
                    Action::Connect { url } => {
                        match open(&binding.api_base_url, &bot_token, url).await {
                            Ok(socket) => {
                                if !self.current(generation) {
                                    let _ =
                                        socket.close(Some(gateway::CLOSE_NORMAL), Some("stopped"));
                                    return;
                                }
                                self.connection(generation, &binding, &socket, &mut machine)
                                    .await;
                            }
                            Err((error, fatal, retry_after_ms)) => machine.handle(
                                now_ms(),
                                js_sys::Math::random(),
                                Input::ConnectFailed {
                                    error,
                                    fatal,
                                    retry_after_ms,
                                },
                            ),
                        }
                    }
                    Action::Save => self.save_if_current(generation, &machine),
                    // No socket: nothing to send or close.
                    Action::Send(_) | Action::Close(_) | Action::Message(_) => {}
                }
            }
        }
    }

    /// Runs one open socket until it closes (or the machine closes it).
    async fn connection(
        self: &Rc<Self>,
        generation: u64,
        binding: &ChannelBinding,
        socket: &WebSocket,
        machine: &mut Gateway,
    ) {
        let Ok(mut events) = socket.events() else {
            return;
        };
        if socket.accept().is_err() {
            return;
        }
        self.gateway.borrow_mut().socket = Some(socket.clone());
        machine.handle(now_ms(), js_sys::Math::random(), Input::Opened);
        loop {
            let mut closed = false;
            while let Some(action) = machine.poll_action() {
                match action {
                    Action::Send(frame) => {
                        if socket.send_with_str(&frame).is_err() {
                            worker::console_error!("channel {}: a gateway send failed", binding.id);
                        }
                    }
                    Action::Close(code) => {
                        let _ = socket.close(Some(code), Some("reconnecting"));
                        closed = true;
                    }
                    Action::Message(d) => self.gateway_message(binding, &d, machine),
                    Action::Save => self.save_if_current(generation, machine),
                    Action::Connect { .. } => {}
                }
            }
            if closed || !self.current(generation) {
                let _ = socket.close(Some(gateway::CLOSE_TO_RESUME), Some("closing"));
                self.gateway.borrow_mut().socket = None;
                return;
            }
            let now = now_ms();
            if machine.poll_deadline().is_some_and(|at| at <= now) {
                // Due before the next frame is read: a stream of frames never delays a
                // heartbeat.
                machine.handle(now, js_sys::Math::random(), Input::Timeout);
                continue;
            }
            let wait = machine
                .poll_deadline()
                .map_or(MAX_SLEEP_MS, |at| at.saturating_sub(now))
                .min(MAX_SLEEP_MS);
            let input = match select(events.next(), Box::pin(sleep(wait))).await {
                Either::Left((Some(Ok(WebsocketEvent::Message(message))), _)) => {
                    match message.text() {
                        Some(text) if text.len() <= gateway::MAX_FRAME_BYTES => {
                            machine.handle(now_ms(), js_sys::Math::random(), Input::Frame(&text));
                        }
                        Some(text) => worker::console_error!(
                            "channel {}: skipped a gateway frame of {} bytes",
                            binding.id,
                            text.len()
                        ),
                        None => {}
                    }
                    continue;
                }
                Either::Left((Some(Ok(WebsocketEvent::Close(close))), _)) => Input::Closed {
                    code: close.code(),
                    reason: close.reason(),
                },
                // An error event; the close event follows.
                Either::Left((Some(Err(_)), _)) => continue,
                Either::Left((None, _)) => Input::Closed {
                    code: 1006,
                    reason: String::new(),
                },
                Either::Right(_) => {
                    if machine.poll_deadline().is_some_and(|at| at <= now_ms()) {
                        Input::Timeout
                    } else {
                        continue;
                    }
                }
            };
            let ended = matches!(input, Input::Closed { .. });
            machine.handle(now_ms(), js_sys::Math::random(), input);
            if ended {
                while let Some(action) = machine.poll_action() {
                    if let Action::Save = action {
                        self.save_if_current(generation, machine);
                    }
                }
                self.gateway.borrow_mut().socket = None;
                return;
            }
        }
    }

    /// A `MESSAGE_CREATE`: stored in the inbox like a hook's message (the message id dedupes a
    /// replay after a resume), then delivered in order. A plain message in a channel without a
    /// session is not stored at all (most of a busy server's traffic).
    fn gateway_message(self: &Rc<Self>, binding: &ChannelBinding, d: &Value, machine: &Gateway) {
        let Delivery::Message(inbound) = gateway::message(d, machine.saved().user_id.as_deref())
        else {
            return;
        };
        let origin = gateway::origin(d);
        let bound = inbound.may_start
            || self.creating.borrow().contains_key(&inbound.thread_key)
            || self.thread(&inbound.thread_key).ok().flatten().is_some()
            || self.inbox_len() > 0;
        if !bound {
            return;
        }
        match self.store_inbound(binding, &inbound, &origin, now_ms()) {
            Ok(Stored::Inbox(_)) => self.kick_inbox(binding),
            Ok(Stored::Duplicate) => {}
            Ok(Stored::Refused(_)) => {
                // A refusal may have been queued: the alarm posts it.
                let actor = self.clone();
                self.state
                    .wait_until(async move { actor.arm_by(now_ms() + 50).await });
            }
            Err(e) => worker::console_error!(
                "channel {}: a gateway message was not stored: {}",
                binding.id,
                e.message
            ),
        }
    }

    /// Delivers the inbox's due rows, oldest first, in one task at a time.
    fn kick_inbox(self: &Rc<Self>, binding: &ChannelBinding) {
        if self.draining.replace(true) {
            return;
        }
        let actor = self.clone();
        let binding = binding.clone();
        self.state.wait_until(async move {
            for _ in 0..100 {
                let _ = actor.drain_inbox(&binding).await;
                if !actor.inbox_due_now() {
                    break;
                }
            }
            actor.draining.set(false);
        });
    }
}

/// Sleeps `ms` milliseconds.
async fn sleep(ms: u64) {
    worker::Delay::from(std::time::Duration::from_millis(ms)).await;
}

/// Opens the Gateway socket: at `resume_url`, else at the URL `GET /gateway/bot` names.
async fn open(
    api_base_url: &str,
    bot_token: &str,
    resume_url: Option<String>,
) -> Result<WebSocket, (String, bool, Option<u64>)> {
    let url = match resume_url {
        Some(url) => url,
        None => {
            let call = HttpCall {
                method: "GET".into(),
                url: format!("{}/gateway/bot", api_base_url.trim_end_matches('/')),
                headers: vec![("authorization".into(), format!("Bot {bot_token}"))],
                body: String::new(),
            };
            let Some((status, _, body)) = send_call(&call).await else {
                return Err(("GET /gateway/bot: no answer".into(), false, None));
            };
            gateway::with_query(&gateway::read_gateway_bot(status, &body)?)
        }
    };
    let parsed: worker::Url = url
        .parse()
        .map_err(|_| ("the gateway URL does not parse".to_string(), false, None))?;
    WebSocket::connect(parsed)
        .await
        .map_err(|e| (format!("connecting the gateway: {e}"), false, None))
}
