//! Runs one LLM step: builds the context, streams the provider's reply, forwards text deltas to
//! followers, and hands the finished message (or the failure) back to the session.

use std::rc::Rc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{Either, select};
use worker::{AbortController, AbortSignal, Delay, Fetch, Headers, Method, Request, RequestInit};
use wuhu_core::archive::HOT_TAIL_KEEP;
use wuhu_core::context::{ContextWindow, build_request};
use wuhu_core::llm::retry::RetryPolicy;
use wuhu_core::llm::{
    AssistantBuilder, HttpProvider, LlmEvent, LlmFailure, LlmRequest, fake, models,
};
use wuhu_core::tools::catalogue;
use wuhu_core::wire::{AssistantMessage, Entry, Header, StreamEvent};

use super::{Actor, blob_io, now};

/// A provider that sends nothing for this long has failed.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs as an actor task (see `session_actor::tasks`): aborting the task drops this future,
/// and with it the provider request (see [`AbortOnDrop`]).
pub(crate) async fn run(actor: Rc<Actor>, step: u64) {
    let outcome = infer(&actor, step).await;
    if let Some(outcome) = outcome {
        actor.with_session(|s| s.handle_inference_done(now(), step, outcome));
        actor.pump();
    }
}

/// `None` when the step was cancelled (stop) while streaming.
async fn infer(actor: &Rc<Actor>, step: u64) -> Option<Result<AssistantMessage, LlmFailure>> {
    let Some((header, entries)) = actor.context_inputs().await else {
        return Some(Err(LlmFailure {
            status: None,
            message: "could not read the transcript for the llm context".into(),
            retryable: true,
            retry_after_ms: None,
        }));
    };
    let group_chat_since = actor
        .with_loaded(|l| l.session.group_chat_since())
        .flatten();
    let request = build_request(&header, &entries, group_chat_since, catalogue());
    let mut builder = AssistantBuilder::default();
    let result = match header.provider.as_str() {
        fake::PROVIDER => run_fake(actor, step, &request, &mut builder).await,
        other => match HttpProvider::named(other) {
            Some(provider) => run_http(actor, step, provider, &request, &mut builder).await,
            None => Err(LlmFailure {
                status: None,
                message: format!("unknown provider {other:?}"),
                retryable: false,
                retry_after_ms: None,
            }),
        },
    };
    match result {
        Ok(true) => {
            let mut message = builder.build(&header.provider, &header.model);
            if let Some(usage) = message.usage.as_mut() {
                usage.cost_usd = models::cost_usd(&header.model, usage);
            }
            Some(Ok(message))
        }
        Ok(false) => None,
        Err(failure) => Some(Err(failure)),
    }
}

/// Applies one event; returns false when the step is no longer current.
fn apply(actor: &Actor, step: u64, builder: &mut AssistantBuilder, event: LlmEvent) -> bool {
    if !actor.inference_current(step) {
        return false;
    }
    if let LlmEvent::TextDelta(delta) = &event {
        actor.broadcast(StreamEvent::AssistantTextDelta {
            delta: delta.clone(),
        });
    }
    builder.push(event);
    true
}

async fn run_fake(
    actor: &Rc<Actor>,
    step: u64,
    request: &LlmRequest,
    builder: &mut AssistantBuilder,
) -> Result<bool, LlmFailure> {
    let reply = fake::respond(request);
    let default_delay = actor
        .env
        .var("WUHU_FAKE_DELAY_MS")
        .ok()
        .and_then(|v| v.to_string().parse::<u64>().ok())
        .unwrap_or(0);
    let delay = if reply.chunk_delay_ms > 0 {
        reply.chunk_delay_ms
    } else {
        default_delay
    };
    let mut first_delta_sent = false;
    for event in reply.events {
        if delay > 0 {
            Delay::from(Duration::from_millis(delay)).await;
        }
        let is_delta = matches!(event, LlmEvent::TextDelta(_));
        if !apply(actor, step, builder, event) {
            return Ok(false);
        }
        // Without a delay the whole reply is computed at once; yield to the event loop after the
        // first delta so followers get it before the rest of the turn runs, as with a real provider.
        if is_delta && !first_delta_sent && delay == 0 {
            first_delta_sent = true;
            Delay::from(Duration::ZERO).await;
        }
    }
    match reply.failure {
        Some(failure) => Err(failure),
        None => Ok(actor.inference_current(step)),
    }
}

/// The retry rules: `WUHU_LLM_MAX_ATTEMPTS` (attempts per step, 1 to 10; default 3).
pub(crate) fn retry_policy(env: &worker::Env) -> RetryPolicy {
    let attempts = env.var("WUHU_LLM_MAX_ATTEMPTS").ok().map(|v| v.to_string());
    RetryPolicy::with_max_attempts_text(attempts.as_deref())
}

/// Streams one step from an HTTP provider (Chat Completions or Anthropic Messages).
async fn run_http(
    actor: &Rc<Actor>,
    step: u64,
    provider: HttpProvider,
    request: &LlmRequest,
    builder: &mut AssistantBuilder,
) -> Result<bool, LlmFailure> {
    let base_url = actor
        .env
        .var(provider.base_url_var)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| provider.default_base_url.to_string());
    let api_key = actor
        .env
        .secret(provider.api_key_var)
        .map(|v| v.to_string())
        .or_else(|_| actor.env.var(provider.api_key_var).map(|v| v.to_string()))
        .ok();
    let http = provider.build_http_request(&base_url, api_key.as_deref(), request);
    let headers = Headers::new();
    for (name, value) in &http.headers {
        let _ = headers.set(name, value);
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&http.body)));
    let outgoing = Request::new_with_init(&http.url, &init)
        .map_err(|e| LlmFailure::network(format!("could not build the provider request: {e}")))?;
    let fetch = Fetch::Request(outgoing);
    // Aborting the task drops this future: the controller then aborts the provider request and
    // its body stream, so a stopped step stops costing tokens.
    let abort = AbortOnDrop(Some(AbortController::default()));
    let signal = abort.signal();
    let send = fetch.send_with_signal(&signal);
    let mut response = match select(Box::pin(send), Delay::from(STREAM_IDLE_TIMEOUT)).await {
        Either::Left((result, _)) => {
            result.map_err(|e| LlmFailure::network(format!("provider unreachable: {e}")))?
        }
        Either::Right(_) => {
            return Err(LlmFailure::network(format!(
                "provider did not answer within {} s",
                STREAM_IDLE_TIMEOUT.as_secs()
            )));
        }
    };
    let status = response.status_code();
    if !(200..300).contains(&status) {
        let headers: Vec<(String, String)> = response.headers().entries().collect();
        let body = response.text().await.unwrap_or_default();
        return Err(LlmFailure::from_response(status, &headers, &body));
    }
    let mut stream = response
        .stream()
        .map_err(|e| LlmFailure::network(format!("provider response has no body: {e}")))?;
    let mut decoder = provider.decoder();
    loop {
        let timer = Delay::from(STREAM_IDLE_TIMEOUT);
        let chunk = match select(stream.next(), timer).await {
            Either::Left((chunk, _)) => chunk,
            Either::Right(_) => {
                return Err(LlmFailure::network(format!(
                    "provider sent nothing for {} s",
                    STREAM_IDLE_TIMEOUT.as_secs()
                )));
            }
        };
        let events = match chunk {
            Some(Ok(bytes)) => decoder.push(&bytes)?,
            Some(Err(e)) => return Err(LlmFailure::network(format!("provider stream broke: {e}"))),
            None => break,
        };
        for event in events {
            if !apply(actor, step, builder, event) {
                return Ok(false);
            }
        }
    }
    for event in decoder.finish()? {
        if !apply(actor, step, builder, event) {
            return Ok(false);
        }
    }
    Ok(actor.inference_current(step))
}

/// Aborts its controller when dropped (the request's future was dropped mid-flight).
struct AbortOnDrop(Option<AbortController>);

impl AbortOnDrop {
    fn signal(&self) -> AbortSignal {
        self.0
            .as_ref()
            .map(AbortController::signal)
            .unwrap_or_else(AbortSignal::abort)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(controller) = self.0.take() {
            controller.abort();
        }
    }
}

impl Actor {
    /// Context entries for the LLM: the context window, from memory (read from SQLite once, with
    /// out-of-line entries put back).
    async fn context_inputs(&self) -> Option<(Header, Vec<Entry>)> {
        let header = self.with_loaded(|l| l.meta.header.clone())?;
        while self.tail.borrow().is_none() {
            let commits = self.commits.get();
            let rows = self
                .store()
                .ok()?
                .newest_entries(HOT_TAIL_KEEP as usize)
                .ok()?;
            let entries = rows.into_iter().map(|(entry, _)| entry).collect();
            let entries = blob_io::resolve(&self.env, &self.tenant(), &self.session_id(), entries)
                .await
                .ok()?;
            // A commit during the reads pushed nothing (no tail yet): read again.
            if self.commits.get() != commits {
                continue;
            }
            let mut loaded = ContextWindow::default();
            for entry in entries {
                let bytes = serde_json::to_string(&entry).map_or(0, |j| j.len());
                loaded.push(entry, bytes);
            }
            *self.tail.borrow_mut() = Some(loaded);
        }
        let tail = self.tail.borrow();
        let entries = tail.as_ref()?.entries().cloned().collect();
        Some((header, entries))
    }
}
