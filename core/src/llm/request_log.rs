//! Request logs: what a tenant with `llmRequestLogs: true` (`crate::tenant_config`) keeps of
//! each provider request, with credentials taken out.
//!
//! The host hands over what it sent and received ([`Exchange`]); [`record`] redacts it and
//! bounds it, [`object_key`] says where it goes in R2, and [`is_expired`] when it goes away.
//! Redaction has three rules, applied everywhere in a record:
//!
//! * a header or JSON field whose *name* is credential-shaped ([`is_secret_name`]:
//!   `authorization`, `x-api-key`, `api_key`, `*secret*`, `access_token`, `password`, …; but
//!   not `max_tokens` or `input_tokens`, which are counts) has its value replaced;
//! * a credential-shaped *word* inside any text ([`redact_text`], with the detector all masking
//!   shares, [`crate::masking::detect`]: `Bearer …`, `sk-…`, a JWT, `AKIA…`, `ghp_…`, `xox?-…`, a
//!   private-key block, a URL's password, a high-entropy word) is replaced;
//! * every occurrence of a secret the host knows is replaced, whatever its shape
//!   ([`KnownSecrets`]): its provider keys by [`REDACTED`], the tenant's own secrets and their
//!   encodings by `[secret:NAME]` ([`crate::masking::Masker::mask_known`]). In a streamed
//!   response (an event stream) a value the provider split over several deltas is masked too
//!   ([`mask_event_stream`]).

use serde::Serialize;
use serde_json::Value;

use crate::masking::Masker;

/// The secrets a host knows, which no record may hold.
#[derive(Clone, Copy, Debug)]
pub struct KnownSecrets<'a> {
    /// The host's provider keys (empty ones are ignored): replaced by [`REDACTED`].
    pub provider_keys: &'a [&'a str],
    /// The tenant's secrets: replaced by `[secret:NAME]`, with their encodings.
    pub tenant: &'a Masker,
}

impl KnownSecrets<'_> {
    /// Provider keys only (no tenant secrets).
    pub fn provider_keys<'a>(keys: &'a [&'a str]) -> KnownSecrets<'a> {
        static NONE: std::sync::OnceLock<Masker> = std::sync::OnceLock::new();
        KnownSecrets {
            provider_keys: keys,
            tenant: NONE.get_or_init(Masker::default),
        }
    }
}

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// Most bytes of a request or response body a record keeps (the rest is cut, and the record
/// says how long the body was).
pub const MAX_LOGGED_BODY_BYTES: usize = 1024 * 1024;

/// Most records one listing returns.
pub const MAX_LIST: usize = 1000;

/// Milliseconds in a day.
pub const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// Why a request was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum RequestPurpose {
    /// A step of a turn.
    #[default]
    Step,
    /// A compaction's summary.
    Summary,
    /// A request a tool call made to an MCP server (`provider` is `mcp`, `model` the server's
    /// name; the request body is the JSON-RPC method and params, the response body its result
    /// or error).
    Mcp,
}

/// What the host sent to and received from a provider for one request.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// Provider id.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Why it was made.
    pub purpose: RequestPurpose,
    /// Request URL.
    pub url: String,
    /// Request headers (hold the API key).
    pub request_headers: Vec<(String, String)>,
    /// Request body (JSON).
    pub request_body: String,
    /// Response status, if one arrived.
    pub status: Option<u16>,
    /// Response headers.
    pub response_headers: Vec<(String, String)>,
    /// Response body as received (an event stream or an error body): its first bytes, at
    /// least [`MAX_LOGGED_BODY_BYTES`] + 1 of it when it was longer (the host stops collecting
    /// there).
    pub response_body: Vec<u8>,
    /// Bytes of the response body in all (when the host stopped collecting; 0: its length).
    pub response_body_total: usize,
    /// Why the request failed, if it did.
    pub error: Option<String>,
    /// Unix milliseconds when the request started.
    pub started_at_ms: u64,
    /// How long it took to the end of the response.
    pub duration_ms: u64,
}

/// One stored record (`GET /v1/llm-logs/…`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The session.
    pub session: String,
    /// Its step.
    pub step: u64,
    /// Provider id.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Why it was made.
    pub purpose: RequestPurpose,
    /// Unix milliseconds when the request started.
    pub started_at_ms: u64,
    /// Milliseconds to the end of the response.
    pub duration_ms: u64,
    /// What was sent.
    pub request: Message,
    /// What came back (`status` is absent when nothing did).
    pub response: Message,
    /// Why the request failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A request or a response in a [`Record`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Request URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Response status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Headers, credentials redacted.
    pub headers: Vec<(String, String)>,
    /// The body: JSON when it parsed as JSON, else text; redacted and cut to
    /// [`MAX_LOGGED_BODY_BYTES`].
    pub body: Value,
    /// Bytes of the body before it was cut.
    pub body_bytes: usize,
    /// Whether the body was cut.
    pub truncated: bool,
}

/// The record of `exchange`, redacted: `known_secrets` never appear in it.
pub fn record(
    session: &str,
    step: u64,
    exchange: &Exchange,
    known_secrets: KnownSecrets,
) -> Record {
    Record {
        session: session.to_string(),
        step,
        provider: exchange.provider.clone(),
        model: exchange.model.clone(),
        purpose: exchange.purpose,
        started_at_ms: exchange.started_at_ms,
        duration_ms: exchange.duration_ms,
        request: message(
            Some(redact_text(&exchange.url, known_secrets)),
            None,
            &exchange.request_headers,
            exchange.request_body.as_bytes(),
            known_secrets,
        ),
        response: Message {
            body_bytes: exchange
                .response_body_total
                .max(exchange.response_body.len()),
            ..message(
                None,
                exchange.status,
                &exchange.response_headers,
                &exchange.response_body,
                known_secrets,
            )
        },
        error: exchange
            .error
            .as_deref()
            .map(|e| redact_text(e, known_secrets)),
    }
}

fn message(
    url: Option<String>,
    status: Option<u16>,
    headers: &[(String, String)],
    body: &[u8],
    known: KnownSecrets,
) -> Message {
    let truncated = body.len() > MAX_LOGGED_BODY_BYTES;
    let kept = &body[..body.len().min(MAX_LOGGED_BODY_BYTES)];
    let text = String::from_utf8_lossy(kept);
    let body_value = match serde_json::from_str::<Value>(&text) {
        Ok(mut json) if !truncated => {
            redact_json(&mut json, known);
            json
        }
        _ => {
            let joined = mask_event_stream(&text, known.tenant);
            Value::String(redact_text(joined.as_deref().unwrap_or(&text), known))
        }
    };
    Message {
        url,
        status,
        headers: redact_headers(headers, known),
        body: body_value,
        body_bytes: body.len(),
        truncated,
    }
}

/// Whether a header or field name is credential-shaped: its words (split at `-`, `_`, `.`,
/// spaces and lower-to-upper case changes) include `authorization`, `auth`, `key`, `apikey`,
/// `secret`, `token`, `password`, `passwd`, `credential(s)`, `cookie`, `bearer` or
/// `signature`. Plural `tokens` is a count, not a credential.
pub fn is_secret_name(name: &str) -> bool {
    const SECRET_WORDS: [&str; 13] = [
        "authorization",
        "auth",
        "key",
        "apikey",
        "secret",
        "token",
        "password",
        "passwd",
        "credential",
        "credentials",
        "cookie",
        "bearer",
        "signature",
    ];
    words(name).any(|w| SECRET_WORDS.contains(&w.as_str()))
}

fn words(name: &str) -> impl Iterator<Item = String> + '_ {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if !c.is_ascii_alphanumeric() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_ascii_uppercase() && previous_lower && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        current.push(c.to_ascii_lowercase());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out.into_iter()
}

/// `headers` with the values of credential-shaped names replaced, and known secrets and
/// credential-shaped words taken out of the others.
pub fn redact_headers(headers: &[(String, String)], known: KnownSecrets) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = if is_secret_name(name) {
                REDACTED.to_string()
            } else {
                redact_text(value, known)
            };
            (name.clone(), value)
        })
        .collect()
}

/// Redacts `value` in place: fields with credential-shaped names lose their value, strings
/// lose credential-shaped words and known secrets.
pub fn redact_json(value: &mut Value, known: KnownSecrets) {
    match value {
        Value::Object(map) => {
            for (name, field) in map.iter_mut() {
                if is_secret_name(name) && !matches!(field, Value::Null | Value::Bool(_)) {
                    *field = Value::String(REDACTED.to_string());
                } else {
                    redact_json(field, known);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact_json(item, known)),
        Value::String(text) => *text = redact_text(text, known),
        _ => {}
    }
}

/// `text` with the tenant's secrets and their encodings replaced by `[secret:NAME]`, then every
/// provider key (4 bytes or longer) and everything the shared detector finds
/// ([`crate::masking::detect`]: private-key blocks, `Bearer <token>`, provider tokens such as
/// `sk-…`, `AKIA…`, `ghp_…`, `xoxb-…`, JWTs, URL passwords, high-entropy words) by
/// [`REDACTED`].
pub fn redact_text(text: &str, known: KnownSecrets) -> String {
    let mut out = known.tenant.mask_known(text).into_owned();
    for secret in known.provider_keys.iter().filter(|s| s.len() >= 4) {
        if out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
    }
    match crate::masking::mask_generic_with(&out, REDACTED) {
        std::borrow::Cow::Borrowed(_) => out,
        std::borrow::Cow::Owned(masked) => masked,
    }
}

/// Fields of a streamed event whose strings are pieces of one text the provider split over
/// several events: Anthropic's `text`, `thinking` and `partial_json` deltas, Chat Completions'
/// `content`, `reasoning_content` and tool-call `arguments`, the Responses API's `delta`.
const DELTA_FIELDS: [&str; 7] = [
    "text",
    "thinking",
    "partial_json",
    "content",
    "reasoning_content",
    "arguments",
    "delta",
];

/// An event stream's text (`data:` lines of JSON) with the tenant's secrets masked across its
/// events: the strings of [`DELTA_FIELDS`], joined in order, are masked as one text, and a
/// secret found across several of them becomes `[secret:NAME]` in the first and is taken out
/// of the others (those lines are written again). `None` when nothing changed (or `masker`
/// knows no secret). A value split between the text of different blocks is masked too (its
/// pieces are joined); the pieces of a secret in a line that is not JSON, or in other fields,
/// are not.
pub fn mask_event_stream(text: &str, masker: &Masker) -> Option<String> {
    if masker.is_empty() || !text.contains("data:") {
        return None;
    }
    // Each data line's JSON, and the pieces: (line, JSON pointer, start in `joined`).
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut events: Vec<Option<Value>> = vec![None; lines.len()];
    let mut pieces: Vec<(usize, String, usize)> = Vec::new();
    let mut joined = String::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        let mut found = Vec::new();
        delta_strings(&event, String::new(), &mut found);
        for (pointer, piece) in found {
            pieces.push((i, pointer, joined.len()));
            joined.push_str(&piece);
        }
        events[i] = Some(event);
    }
    let regions = masker.known_regions(&joined);
    if regions.is_empty() {
        return None;
    }
    let mut touched = vec![false; lines.len()];
    // Each piece, masked: its part of each region it meets is taken out; the first piece of a
    // region gets its placeholder.
    for (n, (line, pointer, start)) in pieces.iter().enumerate() {
        let end = pieces.get(n + 1).map_or(joined.len(), |p| p.2);
        let meets = regions
            .iter()
            .filter(|(r, _)| r.start < end && r.end > *start);
        let mut out = String::new();
        let mut at = *start;
        let mut changed = false;
        for (region, placeholder) in meets {
            changed = true;
            out.push_str(&joined[at..region.start.max(at)]);
            if region.start >= *start {
                out.push_str(placeholder);
            }
            at = region.end.min(end);
        }
        if !changed {
            continue;
        }
        out.push_str(&joined[at..end]);
        if let Some(slot) = events[*line].as_mut().and_then(|e| e.pointer_mut(pointer)) {
            *slot = Value::String(out);
            touched[*line] = true;
        }
    }
    let mut masked = String::with_capacity(text.len());
    for (i, line) in lines.iter().enumerate() {
        match (&events[i], touched[i]) {
            (Some(event), true) => {
                masked.push_str("data: ");
                masked.push_str(&event.to_string());
                if line.ends_with('\n') {
                    masked.push('\n');
                }
            }
            _ => masked.push_str(line),
        }
    }
    Some(masked)
}

/// The strings of [`DELTA_FIELDS`] in `value`, in order, with their JSON pointers.
fn delta_strings(value: &Value, pointer: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (name, field) in map {
                let at = format!("{pointer}/{}", name.replace('~', "~0").replace('/', "~1"));
                match field {
                    Value::String(piece) if DELTA_FIELDS.contains(&name.as_str()) => {
                        out.push((at, piece.clone()))
                    }
                    _ => delta_strings(field, at, out),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                delta_strings(item, format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Where the records of `session` live: `{tenant}/llm-logs/{session}/`.
pub fn session_prefix(tenant: &str, session: &str) -> String {
    format!("{tenant}/llm-logs/{session}/")
}

/// Where the records of the tenant live: `{tenant}/llm-logs/`.
pub fn tenant_prefix(tenant: &str) -> String {
    format!("{tenant}/llm-logs/")
}

/// The key of one record: `{tenant}/llm-logs/{session}/{step:010}-{started_at_ms:013}.json`
/// (a step may make several requests: retries, a compaction's summary). Keys sort by step, then
/// time.
pub fn object_key(tenant: &str, session: &str, step: u64, started_at_ms: u64) -> String {
    format!(
        "{}{step:010}-{started_at_ms:013}.json",
        session_prefix(tenant, session)
    )
}

/// Whether `name` (what follows the tenant's prefix) is a record's: `{session}/{step}-{ms}.json`
/// with a session id of letters, digits and `-`.
pub fn valid_record_name(name: &str) -> bool {
    let Some((session, file)) = name.split_once('/') else {
        return false;
    };
    let Some(stem) = file.strip_suffix(".json") else {
        return false;
    };
    let Some((step, ms)) = stem.split_once('-') else {
        return false;
    };
    !session.is_empty()
        && session.len() <= 64
        && session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
        && step.len() == 10
        && ms.len() == 13
        && step.chars().chain(ms.chars()).all(|c| c.is_ascii_digit())
}

/// One record in a listing (`GET /v1/llm-logs`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `{session}/{step}-{startedAtMs}.json`: `GET /v1/llm-logs/{name}` reads it.
    pub name: String,
    /// The session.
    pub session: String,
    /// Its step.
    pub step: u64,
    /// Unix milliseconds when the request started.
    pub started_at_ms: u64,
    /// Bytes stored.
    pub size: u64,
}

impl Summary {
    /// The summary of the record named `name` (see [`valid_record_name`]).
    pub fn of(name: &str, size: u64) -> Option<Summary> {
        if !valid_record_name(name) {
            return None;
        }
        let (session, file) = name.split_once('/')?;
        let (step, ms) = file.strip_suffix(".json")?.split_once('-')?;
        Some(Summary {
            name: name.to_string(),
            session: session.to_string(),
            step: step.parse().ok()?,
            started_at_ms: ms.parse().ok()?,
            size,
        })
    }
}

/// `GET /v1/llm-logs`: records in key order (session, step, time).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct List {
    /// At most `limit` records.
    pub records: Vec<Summary>,
    /// Pass as `after` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// Whether a record stored at `uploaded_ms` is past a retention of `days` at `now_ms`.
pub fn is_expired(uploaded_ms: u64, now_ms: u64, days: u32) -> bool {
    now_ms.saturating_sub(uploaded_ms) >= u64::from(days) * DAY_MS
}

/// Listing pages one run of the tenant's sweep reads at most (then it continues after
/// [`SWEEP_CONTINUE_MS`]).
pub const SWEEP_PAGES_PER_RUN: usize = 5;

/// Wait before a sweep that stopped mid-listing continues.
pub const SWEEP_CONTINUE_MS: u64 = 60 * 1000;

/// Where the tenant's sweep of expired records stands between runs (the tenant index's alarm).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sweep {
    /// The tenant swept.
    pub tenant: String,
    /// Where the listing continues (an R2 cursor), while a pass is under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// The earliest time (unix ms) a record kept by this pass expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_expiry_ms: Option<u64>,
}

impl Sweep {
    /// Takes one listing page (`(key, uploaded unix ms)`; `truncated`: more follow at
    /// `cursor`): returns the keys to delete. The next page, if any, is read in this run
    /// while it has pages left, else after [`SWEEP_CONTINUE_MS`] ([`Sweep::next_run_ms`]).
    pub fn page(
        &mut self,
        objects: &[(String, u64)],
        cursor: Option<String>,
        now_ms: u64,
        days: u32,
    ) -> Vec<String> {
        let mut expired = Vec::new();
        for (key, uploaded) in objects {
            if is_expired(*uploaded, now_ms, days) {
                expired.push(key.clone());
            } else {
                let expiry = uploaded.saturating_add(u64::from(days) * DAY_MS);
                self.next_expiry_ms = Some(self.next_expiry_ms.map_or(expiry, |e| e.min(expiry)));
            }
        }
        self.cursor = cursor;
        expired
    }

    /// When the alarm should run next (unix ms), after a run ended: soon when the pass stopped
    /// mid-listing, at the earliest expiry it saw when it finished (a new pass starts then),
    /// never when nothing is left. A finished pass forgets its expiry for the next one.
    pub fn next_run_ms(&mut self, now_ms: u64) -> Option<u64> {
        if self.cursor.is_some() {
            return Some(now_ms + SWEEP_CONTINUE_MS);
        }
        self.next_expiry_ms.take().map(|e| e.max(now_ms + 1000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_credentials_not_counts() {
        let cases = [
            ("authorization", true),
            ("Authorization", true),
            ("x-api-key", true),
            ("api_key", true),
            ("apiKey", true),
            ("OPENAI_API_KEY", true),
            ("client_secret", true),
            ("access_token", true),
            ("refreshToken", true),
            ("password", true),
            ("proxy-authorization", true),
            ("cookie", true),
            ("set-cookie", true),
            ("x-goog-api-key", true),
            ("signature", true),
            ("max_tokens", false),
            ("input_tokens", false),
            ("maxOutputTokens", false),
            ("cache_read_input_tokens", false),
            ("content-type", false),
            ("anthropic-version", false),
            ("model", false),
            ("keyboard", false),
            ("monkey", false),
            ("tokenizer", false),
        ];
        for (name, secret) in cases {
            assert_eq!(is_secret_name(name), secret, "{name}");
        }
    }

    #[test]
    fn texts_lose_credential_shaped_words_and_known_secrets() {
        let known = ["hunter2-provider-key", ""];
        let cases = [
            ("plain text stays", "plain text stays"),
            ("Bearer abc.def", "Bearer [redacted]"),
            (
                "authorization: bearer xyz",
                "authorization: bearer [redacted]",
            ),
            (
                "key sk-ant-api03-0123456789abcdef end",
                "key [redacted] end",
            ),
            ("sk-short", "sk-short"),
            ("AKIAIOSFODNN7EXAMPLE1", "[redacted]"),
            ("token=ghp_0123456789abcdefghij", "token=[redacted]"),
            ("xoxb-1234-5678-abcdefghijkl", "[redacted]"),
            (
                "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl!",
                "jwt [redacted]!",
            ),
            ("the key is hunter2-provider-key.", "the key is [redacted]."),
            (
                "a -----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY----- b",
                "a [redacted] b",
            ),
            ("-----BEGIN PUBLIC KEY-----", "-----BEGIN PUBLIC KEY-----"),
            ("eyJ alone", "eyJ alone"),
            // From the shared detector (crate::masking): URL passwords, more token shapes,
            // random words; hex and ordinary words stay.
            (
                "proxy https://u:pw1234@h/x",
                "proxy https://u:[redacted]@h/x",
            ),
            ("glpat-xYz12AbC-dEf34GhI56jK", "[redacted]"),
            ("id Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3", "id [redacted]"),
            (
                "sha 3f9a1c7e5b2d8f0a4c6e1b3d5f7a9c0e2b4d6f8a",
                "sha 3f9a1c7e5b2d8f0a4c6e1b3d5f7a9c0e2b4d6f8a",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(
                redact_text(text, KnownSecrets::provider_keys(&known)),
                want,
                "{text}"
            );
        }
    }

    #[test]
    fn a_record_keeps_the_conversation_and_drops_the_credentials() {
        let exchange = Exchange {
            provider: "anthropic".into(),
            model: "claude-test".into(),
            purpose: RequestPurpose::Step,
            url: "https://api.example.com/v1/messages?key=sk-proj-0123456789abcdef".into(),
            request_headers: vec![
                ("x-api-key".into(), "the-real-key-123".into()),
                ("authorization".into(), "Bearer the-real-key-123".into()),
                ("content-type".into(), "application/json".into()),
            ],
            request_body: r#"{"model":"claude-test","max_tokens":100,"messages":[{"role":"user","content":"my key is the-real-key-123, and a token: sk-ant-0123456789abcdef"}],"metadata":{"api_key":"x","user_id":"u1"},"stream":true}"#.into(),
            status: Some(200),
            response_headers: vec![("set-cookie".into(), "s=1".into()), ("request-id".into(), "r1".into())],
            response_body: b"event: message_start\ndata: {\"usage\":{\"input_tokens\":3}}\n\n".to_vec(),
            response_body_total: 0,
            error: None,
            started_at_ms: 1_000,
            duration_ms: 20,
        };
        let logged = record(
            "s1",
            2,
            &exchange,
            KnownSecrets::provider_keys(&["the-real-key-123"]),
        );
        let json = serde_json::to_value(&logged).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "session": "s1", "step": 2, "provider": "anthropic", "model": "claude-test",
                "purpose": "step", "startedAtMs": 1000, "durationMs": 20,
                "request": {
                    "url": "https://api.example.com/v1/messages?key=[redacted]",
                    "headers": [["x-api-key", "[redacted]"], ["authorization", "[redacted]"], ["content-type", "application/json"]],
                    "body": {"model": "claude-test", "max_tokens": 100, "messages": [{"role": "user", "content": "my key is [redacted], and a token: [redacted]"}], "metadata": {"api_key": "[redacted]", "user_id": "u1"}, "stream": true},
                    "bodyBytes": exchange.request_body.len(), "truncated": false,
                },
                "response": {
                    "status": 200,
                    "headers": [["set-cookie", "[redacted]"], ["request-id", "r1"]],
                    "body": "event: message_start\ndata: {\"usage\":{\"input_tokens\":3}}\n\n",
                    "bodyBytes": exchange.response_body.len(), "truncated": false,
                },
            })
        );
        assert!(!json.to_string().contains("the-real-key-123"));
        // A body past the bound is cut (and kept as text).
        let long = Exchange {
            response_body: vec![b'a'; MAX_LOGGED_BODY_BYTES + 1],
            response_body_total: 5 * MAX_LOGGED_BODY_BYTES,
            ..exchange
        };
        let cut = record("s1", 2, &long, KnownSecrets::provider_keys(&[]));
        assert!(cut.response.truncated);
        assert_eq!(cut.response.body_bytes, 5 * MAX_LOGGED_BODY_BYTES);
        assert_eq!(
            cut.response.body.as_str().map(str::len),
            Some(MAX_LOGGED_BODY_BYTES)
        );
    }

    #[test]
    fn the_tenants_secrets_are_masked_even_when_split_across_stream_events() {
        let value = "tenant-Secret/Value+42";
        let masker = Masker::new([("DEPLOY", value)]);
        let known = KnownSecrets {
            provider_keys: &["the-real-key-123"],
            tenant: &masker,
        };
        let delta = |text: &str| {
            let event = serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}});
            format!("event: content_block_delta\ndata: {event}\n\n")
        };
        let chat = |text: &str| {
            let event = serde_json::json!({"choices": [{"index": 0, "delta": {"content": text}}]});
            format!("data: {event}\n\n")
        };
        // Split at every byte, in Anthropic's and Chat Completions' shapes; whole in a request.
        for cut in 1..value.len() {
            for shape in [delta, chat] {
                let body = format!(
                    "{}{}{}{}data: [DONE]\n\n",
                    shape("the key: "),
                    shape(&value[..cut]),
                    shape(&value[cut..]),
                    shape(" ok")
                );
                let exchange = Exchange {
                    request_headers: vec![("x-api-key".into(), "the-real-key-123".into())],
                    request_body: serde_json::json!({"messages": [{"role": "user",
                        "content": format!("use {value} and {}", hex::encode(value))}]})
                    .to_string(),
                    response_body: body.into_bytes(),
                    ..Exchange::default()
                };
                let json = serde_json::to_string(&record("s", 1, &exchange, known)).unwrap();
                for gone in [
                    value,
                    &value[..cut.max(value.len() - cut)],
                    "the-real-key-123",
                ] {
                    assert!(!json.contains(gone), "{cut}: {gone} in {json}");
                }
                assert_eq!(json.matches("[secret:DEPLOY]").count(), 3, "{cut}: {json}");
                // What the stream said, read back from the log, is the masked text.
                let body = serde_json::from_str::<Value>(&json).unwrap()["response"]["body"]
                    .as_str()
                    .unwrap()
                    .to_string();
                let said: String = body
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .filter_map(|e| {
                        e.pointer("/delta/text")
                            .or(e.pointer("/choices/0/delta/content"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect();
                assert_eq!(said, "the key: [secret:DEPLOY] ok", "{cut}");
            }
        }
        // No secrets, or none in the stream: the body is kept as it came.
        assert_eq!(mask_event_stream(&delta("plain"), &Masker::default()), None);
        assert_eq!(mask_event_stream(&delta("plain"), &masker), None);
    }

    #[test]
    fn keys_sort_by_step_and_time_and_names_are_checked() {
        let key = object_key("t", "s-1", 12, 1_700_000_000_000);
        assert_eq!(key, "t/llm-logs/s-1/0000000012-1700000000000.json");
        assert!(valid_record_name("s-1/0000000012-1700000000000.json"));
        for bad in [
            "s-1/12-1700000000000.json",
            "../x/0000000012-1700000000000.json",
            "s-1/0000000012-1700000000000.txt",
            "s-1",
            "/0000000012-1700000000000.json",
            "s 1/0000000012-1700000000000.json",
        ] {
            assert!(!valid_record_name(bad), "{bad}");
        }
        assert!(object_key("t", "s", 2, 5) > object_key("t", "s", 1, 9_999_999_999_999));
        assert_eq!(
            Summary::of("s-1/0000000012-1700000000000.json", 7),
            Some(Summary {
                name: "s-1/0000000012-1700000000000.json".into(),
                session: "s-1".into(),
                step: 12,
                started_at_ms: 1_700_000_000_000,
                size: 7
            })
        );
        assert_eq!(Summary::of("s-1/x.json", 7), None);
    }

    #[test]
    fn records_expire_after_their_days() {
        let cases = [
            (0, DAY_MS - 1, 1, false),
            (0, DAY_MS, 1, true),
            (5, 14 * DAY_MS + 4, 14, false),
            (5, 14 * DAY_MS + 5, 14, true),
            (10, 0, 1, false),
        ];
        for (uploaded, now, days, expired) in cases {
            assert_eq!(
                is_expired(uploaded, now, days),
                expired,
                "{uploaded} {now} {days}"
            );
        }
    }

    #[test]
    fn the_tenant_sweep_deletes_what_expired_and_wakes_when_the_next_one_does() {
        let day = DAY_MS;
        let mut sweep = Sweep {
            tenant: "t".into(),
            ..Sweep::default()
        };
        let now = 10 * day;
        // First page: one expired, one expiring in half a day; more pages follow.
        let page = [
            ("a".to_string(), 8 * day),
            ("b".to_string(), 9 * day + day / 2),
        ];
        assert_eq!(
            sweep.page(&page, Some("c1".into()), now, 2),
            vec!["a".to_string()]
        );
        assert_eq!(sweep.next_run_ms(now), Some(now + SWEEP_CONTINUE_MS));
        // Last page: one expiring sooner (in an hour), one expired.
        let page = [
            ("c".to_string(), 8 * day + day / 24),
            ("d".to_string(), 7 * day),
        ];
        assert_eq!(sweep.page(&page, None, now, 2), vec!["d".to_string()]);
        assert_eq!(sweep.next_run_ms(now), Some(now + day / 24));
        // The pass is over; nothing left to wait for.
        assert_eq!(sweep.next_run_ms(now), None);
        assert_eq!(sweep.page(&[], None, now, 2), Vec::<String>::new());
        assert_eq!(sweep.next_run_ms(now), None);
        // An expiry in the past (clock skew) still waits a second.
        sweep.next_expiry_ms = Some(now - 5);
        assert_eq!(sweep.next_run_ms(now), Some(now + 1000));
    }
}
