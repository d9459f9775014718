//! A client of the Worker's HTTP API v1, bound to one bearer token.
//!
//! Raw methods (`get`, `post`, `post_raw`, ...) return the [`Response`] whatever its status;
//! typed methods (`create_session`, `enqueue`, ...) panic with the response on anything but
//! success, so tests read as the flow they check.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{
    Entry, GetSessionResponse, ListSessionsResponse, SessionInfo, Status, StopResponse, ToolResult,
};

use crate::entries::{assistant, describe, fake_directive, position_of_user, tool_result};
use crate::http::{Request, Response};
use crate::sse::{FollowOpen, SseStream};

/// How long a follow stream may take to send its response head.
const FOLLOW_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// The page size `transcript` asks for.
const PAGE_LIMIT: usize = 1000;

/// An API client.
#[derive(Clone, Debug)]
pub struct Api {
    base: String,
    token: Option<String>,
}

impl Api {
    /// A client of the Worker at `base` (`http://127.0.0.1:PORT`).
    pub fn new(base: impl Into<String>, token: Option<String>) -> Api {
        Api {
            base: base.into(),
            token,
        }
    }

    /// The bearer token.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// An absolute URL for `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with the bearer token set.
    pub fn request(&self, method: &str, path: &str) -> Request {
        let request = Request::new(method, self.url(path));
        match &self.token {
            Some(token) => request.bearer(token),
            None => request,
        }
    }

    /// Sends a request; panics on transport errors (a test failure either way).
    #[track_caller]
    pub fn send(&self, request: Request) -> Response {
        let (method, url) = (request.method.clone(), request.url.clone());
        request
            .send()
            .unwrap_or_else(|err| panic!("{method} {url}: {err}"))
    }

    /// `GET path`.
    #[track_caller]
    pub fn get(&self, path: &str) -> Response {
        self.send(self.request("GET", path))
    }

    /// `POST path` with a JSON body.
    #[track_caller]
    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.send(self.request("POST", path).json(body))
    }

    /// `PATCH path` with a JSON body.
    #[track_caller]
    pub fn patch(&self, path: &str, body: &Value) -> Response {
        self.send(self.request("PATCH", path).json(body))
    }

    /// `method path` with a raw body sent as `application/json`.
    #[track_caller]
    pub fn send_raw(&self, method: &str, path: &str, body: impl Into<Vec<u8>>) -> Response {
        self.send(
            self.request(method, path)
                .header("Content-Type", "application/json")
                .body(body),
        )
    }

    /// `POST /v1/sessions`.
    #[track_caller]
    pub fn create_session(&self, body: Value) -> SessionInfo {
        let response = self.post("/v1/sessions", &body);
        expect_success(&response);
        response.parse()
    }

    /// `POST /v1/sessions {}` (fake provider).
    #[track_caller]
    pub fn create_fake_session(&self) -> SessionInfo {
        self.create_session(json!({}))
    }

    /// `GET /v1/sessions?query`.
    #[track_caller]
    pub fn list_sessions(&self, query: &str) -> ListSessionsResponse {
        let response = self.get(&format!("/v1/sessions{}", with_q(query)));
        expect_success(&response);
        response.parse()
    }

    /// `GET /v1/sessions/:id?query`.
    #[track_caller]
    pub fn session_page(&self, id: &str, query: &str) -> GetSessionResponse {
        let response = self.get(&format!("/v1/sessions/{id}{}", with_q(query)));
        expect_success(&response);
        response.parse()
    }

    /// Session info and queue (a one-entry transcript page).
    #[track_caller]
    pub fn session(&self, id: &str) -> GetSessionResponse {
        self.session_page(id, "limit=1")
    }

    /// The whole transcript, paged through `nextCursor`.
    #[track_caller]
    pub fn transcript(&self, id: &str) -> Vec<Entry> {
        let mut entries = Vec::new();
        let mut since = 0u64;
        loop {
            let page = self.session_page(id, &format!("sinceCursor={since}&limit={PAGE_LIMIT}"));
            entries.extend(page.transcript);
            match page.next_cursor {
                Some(next) if next > since => since = next,
                Some(next) => panic!("nextCursor {next} does not advance past {since}"),
                None => return entries,
            }
        }
    }

    /// `POST /v1/sessions/:id/enqueue?lane=` → the queue item id.
    #[track_caller]
    pub fn enqueue(&self, id: &str, lane: &str, content: &str) -> String {
        let response = self.enqueue_raw(id, lane, content);
        expect_success(&response);
        let value = response.json();
        value["id"]
            .as_str()
            .unwrap_or_else(|| panic!("enqueue answered without id: {response}"))
            .to_string()
    }

    /// The enqueue request, whatever its answer.
    #[track_caller]
    pub fn enqueue_raw(&self, id: &str, lane: &str, content: &str) -> Response {
        self.post(
            &format!("/v1/sessions/{id}/enqueue?lane={lane}"),
            &json!({"content": content}),
        )
    }

    /// `POST /v1/sessions/:id/cancel {id}`, whatever its answer.
    #[track_caller]
    pub fn cancel(&self, id: &str, item_id: &str) -> Response {
        self.post(
            &format!("/v1/sessions/{id}/cancel"),
            &json!({"id": item_id}),
        )
    }

    /// `POST /v1/sessions/:id/stop`.
    #[track_caller]
    pub fn stop(&self, id: &str) -> StopResponse {
        let response = self.send(self.request("POST", &format!("/v1/sessions/{id}/stop")));
        expect_success(&response);
        response.parse()
    }

    /// Polls until the session is idle with an empty queue.
    #[track_caller]
    pub fn wait_idle(&self, id: &str, timeout: Duration) -> GetSessionResponse {
        self.wait_status(id, Status::Idle, timeout)
    }

    /// Polls until the session has `status` and an empty queue.
    #[track_caller]
    pub fn wait_status(&self, id: &str, status: Status, timeout: Duration) -> GetSessionResponse {
        let mut last = None;
        let found = crate::util::wait_until(timeout, || {
            let page = self.session(id);
            let done = page.session.status == status && page.queue.is_empty();
            last = Some(page.clone());
            done.then_some(page)
        });
        found.unwrap_or_else(|_| {
            panic!(
                "session {id} not {status:?} with an empty queue after {timeout:?}; last: {last:?}\ntranscript:\n{}",
                describe(&self.transcript(id))
            )
        })
    }

    /// Polls the transcript until `done` holds; returns it.
    #[track_caller]
    pub fn wait_transcript(
        &self,
        id: &str,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Entry]) -> bool,
    ) -> Vec<Entry> {
        let mut last = Vec::new();
        let found = crate::util::wait_until(timeout, || {
            let entries = self.transcript(id);
            let ok = done(&entries);
            last = entries.clone();
            ok.then_some(entries)
        });
        found.unwrap_or_else(|_| {
            panic!(
                "timed out after {timeout:?} waiting for {what}; transcript:\n{}",
                describe(&last)
            )
        })
    }

    /// Runs one turn of a fake-provider session whose reply calls `calls` (name, arguments),
    /// waits for the step after the tool results, and returns the results in call order.
    #[track_caller]
    pub fn run_tool_calls(
        &self,
        id: &str,
        calls: &[(&str, Value)],
        timeout: Duration,
    ) -> Vec<ToolResult> {
        let marker = format!("tool calls done {}", crate::util::random_hex(6));
        let calls_json: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
            .collect();
        let content = fake_directive(&json!({"toolCalls": calls_json, "afterTools": marker}));
        self.enqueue(id, "followUp", &content);
        let entries = self.wait_transcript(id, "the step after the tool results", timeout, |e| {
            e.iter()
                .any(|e| assistant(e).is_some_and(|m| m.text() == marker))
        });
        let text = describe(&entries);
        let start = position_of_user(&entries, &content)
            .unwrap_or_else(|| panic!("the tool-call message is not in the transcript:\n{text}"));
        let ids: Vec<String> = entries[start + 1..]
            .iter()
            .find_map(assistant)
            .map(|m| m.tool_calls().map(|c| c.id.clone()).collect())
            .unwrap_or_default();
        assert_eq!(ids.len(), calls.len(), "tool calls made:\n{text}");
        ids.iter()
            .map(|call_id| {
                entries[start..]
                    .iter()
                    .filter_map(tool_result)
                    .find(|r| r.tool_call_id == *call_id)
                    .cloned()
                    .unwrap_or_else(|| panic!("no result for tool call {call_id}:\n{text}"))
            })
            .collect()
    }

    /// [`Api::run_tool_calls`] with one call.
    #[track_caller]
    pub fn run_tool(
        &self,
        id: &str,
        name: &str,
        arguments: Value,
        timeout: Duration,
    ) -> ToolResult {
        self.run_tool_calls(id, &[(name, arguments)], timeout)
            .pop()
            .expect("one result")
    }

    /// Waits until session `parent` has at least `count` children; returns them in spawn order.
    #[track_caller]
    pub fn wait_children(
        &self,
        parent: &str,
        count: usize,
        timeout: Duration,
    ) -> Vec<wuhu_core::wire::ChildStatus> {
        crate::util::wait_for(&format!("{count} child(ren)"), timeout, || {
            let children = self.session(parent).children;
            (children.len() >= count).then_some(children)
        })
    }

    /// `GET /v1/workspace/docs/{path}`, whatever its answer. `path` goes into the URL as given
    /// (percent-encode odd paths yourself).
    #[track_caller]
    pub fn get_doc(&self, path: &str) -> Response {
        self.get(&format!("/v1/workspace/docs/{path}"))
    }

    /// `PUT /v1/workspace/docs/{path}` with a raw body, whatever its answer.
    #[track_caller]
    pub fn put_doc(&self, path: &str, content: impl Into<Vec<u8>>) -> Response {
        self.send(
            self.request("PUT", &format!("/v1/workspace/docs/{path}"))
                .header("Content-Type", "text/markdown; charset=utf-8")
                .body(content),
        )
    }

    /// `DELETE /v1/workspace/docs/{path}`, whatever its answer.
    #[track_caller]
    pub fn delete_doc(&self, path: &str) -> Response {
        self.send(self.request("DELETE", &format!("/v1/workspace/docs/{path}")))
    }

    /// `GET /v1/workspace/docs?query` → `{docs, cursor}`; panics unless 200.
    #[track_caller]
    pub fn list_docs(&self, query: &str) -> Value {
        let response = self.get(&format!("/v1/workspace/docs{}", with_q(query)));
        expect_success(&response);
        response.json()
    }

    /// Opens `GET /v1/sessions/:id/follow?query`, optionally with `Last-Event-ID`.
    ///
    /// # Errors
    /// Transport errors.
    pub fn follow_open(
        &self,
        id: &str,
        query: &str,
        last_event_id: Option<u64>,
    ) -> std::io::Result<FollowOpen> {
        let mut request =
            self.request("GET", &format!("/v1/sessions/{id}/follow{}", with_q(query)));
        request = request.header("Accept", "text/event-stream");
        if let Some(last) = last_event_id {
            request = request.header("Last-Event-ID", last.to_string());
        }
        SseStream::open(&request, FOLLOW_CONNECT_TIMEOUT)
    }

    /// A follow stream; panics unless it opened.
    #[track_caller]
    pub fn follow(&self, id: &str, query: &str) -> SseStream {
        self.follow_from(id, query, None)
    }

    /// A follow stream resuming after `last_event_id`; panics unless it opened.
    #[track_caller]
    pub fn follow_from(&self, id: &str, query: &str, last_event_id: Option<u64>) -> SseStream {
        self.follow_open(id, query, last_event_id)
            .unwrap_or_else(|err| panic!("open follow stream of {id}: {err}"))
            .expect_stream()
    }
}

/// Panics unless the status is 2xx.
#[track_caller]
pub fn expect_success(response: &Response) {
    assert!(
        (200..300).contains(&response.status),
        "expected success, got {response}"
    );
}

fn with_q(query: &str) -> String {
    if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.trim_start_matches('?'))
    }
}
