//! A runner socket's own state (its attachment, which survives hibernation) and sending a frame
//! on it: what both the socket handling (`sockets`) and the pending discards (`discards`) use,
//! below both, so neither imports the other's caller.

use serde::{Deserialize, Serialize};
use worker::WebSocket;
use wuhu_core::wire::runner::{RunnerKind, ServerMessage, encode_frame};

/// Per-socket state, stored as the socket's attachment so it survives hibernation. Kept small:
/// what `hello` offered lives in SQLite.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(super) struct SocketInfo {
    pub(super) owner: String,
    /// The tenant (from the verified token); empty on sockets accepted before it was kept.
    #[serde(default)]
    pub(super) tenant: String,
    /// The kind the runner's token allows (its `runnerKind` claim): the kind it is registered as.
    #[serde(default)]
    pub(super) token_kind: RunnerKind,
    pub(super) epoch: u64,
    pub(super) connected_at_ms: i64,
    pub(super) last_seen_ms: i64,
    #[serde(default)]
    pub(super) persisted_ms: i64,
    #[serde(default)]
    pub(super) runner: Option<SocketRunner>,
    /// Set when the hub closed (or gave up on) the socket; it no longer counts as open.
    #[serde(default)]
    pub(super) closed: bool,
    /// The `jti` of the token the runner connected with, when it is revocable: revoking it
    /// closes this socket (`Sockets::revoked`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) jti: Option<String>,
    /// This connection's nonce, sent in the upgrade's `x-wuhu-hello-nonce` header: the runner
    /// signs it in `hello` with its key (decision 0024).
    #[serde(default)]
    pub(super) nonce: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub(super) struct SocketRunner {
    pub(super) name: String,
    pub(super) kind: RunnerKind,
    pub(super) os: String,
}

impl SocketInfo {
    /// Whether this socket carries `owner`'s welcomed runner `name`.
    pub(super) fn serves(&self, owner: &str, name: &str) -> bool {
        self.owner == owner && self.runner.as_ref().is_some_and(|r| r.name == name)
    }
}

pub(super) fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}

pub(super) fn info_of(ws: &WebSocket) -> Option<SocketInfo> {
    ws.deserialize_attachment::<SocketInfo>().ok().flatten()
}

pub(super) fn save_info(ws: &WebSocket, info: &SocketInfo) {
    if let Err(e) = ws.serialize_attachment(info) {
        worker::console_error!("runner hub: saving socket state failed: {e}");
    }
}

pub(super) fn send(ws: &WebSocket, message: &ServerMessage) -> bool {
    ws.send_with_str(encode_frame(message)).is_ok()
}
