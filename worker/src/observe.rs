//! Structured logs: one JSON line per request and one per turn, to the Worker's console (Workers
//! Logs / `wrangler tail` / the `wrangler dev` terminal). A line names who and what, never a
//! token, a message body or a tool's output.

use serde_json::json;

/// One line per HTTP request handled by the router.
pub(crate) struct RequestLine<'a> {
    pub(crate) request_id: &'a str,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) sub: Option<&'a str>,
    pub(crate) status: u16,
    /// An error's code, when the answer is an error.
    pub(crate) error_code: Option<&'a str>,
    /// Until the response head (SSE streams go on after it).
    pub(crate) duration_ms: u64,
}

impl RequestLine<'_> {
    pub(crate) fn emit(&self) {
        let line = json!({
            "event": "request",
            "requestId": self.request_id,
            "method": self.method,
            "path": self.path,
            "tenant": self.tenant,
            "sub": self.sub,
            "status": self.status,
            "error": self.error_code,
            "durationMs": self.duration_ms,
        });
        worker::console_log!("{line}");
    }
}

/// One line when a turn ends (the session leaves `running`).
pub(crate) struct TurnLine<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) session: &'a str,
    /// `idle` or `stopped`.
    pub(crate) status: &'a str,
    /// LLM steps taken by the session so far.
    pub(crate) step: u64,
    pub(crate) last_cursor: u64,
    /// Since the turn started in this isolate; `None` when it started before a restart.
    pub(crate) duration_ms: Option<u64>,
    /// Images the turn's requests found in the isolate's image cache.
    pub(crate) images_cached: u32,
    /// Images the turn's requests read from R2.
    pub(crate) images_read: u32,
    /// The bytes the isolate's image cache holds when the turn ends.
    pub(crate) image_cache_bytes: u64,
}

impl TurnLine<'_> {
    pub(crate) fn emit(&self) {
        let line = json!({
            "event": "turn",
            "tenant": self.tenant,
            "session": self.session,
            "status": self.status,
            "step": self.step,
            "lastCursor": self.last_cursor,
            "durationMs": self.duration_ms,
            "imagesCached": self.images_cached,
            "imagesRead": self.images_read,
            "imageCacheBytes": self.image_cache_bytes,
        });
        worker::console_log!("{line}");
    }
}
