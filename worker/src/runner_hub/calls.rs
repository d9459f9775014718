//! `CallRunner`: sends a session's request to a runner and waits for the answer with the same
//! id. Which messages may be sent, the timeout and who may use which runner are
//! `wuhu_core::hub`'s rules.

use std::time::Duration;

use futures::future::{Either, select};
use worker::Delay;
use wuhu_core::hub::{self, CallKind};
use wuhu_core::wire::runner::{MAX_FRAME_BYTES, RunnerKind, ServerMessage, codes, encode_frame};
use wuhu_core::wire::{RunnerCallRequest, RunnerCallResponse};

use super::socket_state::send;
use super::sockets::Sockets;
use crate::http::{ApiError, ApiResult};
use crate::internal::codes as call_codes;

/// Sends `request.message` to `request.owner`'s runner `request.runner` for a session acting
/// for `sub`, and answers with the runner's answer (none for `cancel`).
pub(super) async fn call(
    sockets: &Sockets<'_>,
    sub: &str,
    request: RunnerCallRequest,
) -> ApiResult<RunnerCallResponse> {
    let RunnerCallRequest {
        runner,
        owner,
        message,
        timeout_ms,
    } = request;
    let planned = hub::plan_call(&message).map_err(ApiError::bad_request)?;
    let id = planned.id.to_string();
    let Some((ws, info)) = sockets.find(&owner, &runner) else {
        return Err(ApiError::new(
            503,
            call_codes::RUNNER_NOT_CONNECTED,
            format!("runner {runner:?} is not connected"),
        ));
    };
    let kind = info.runner.as_ref().map_or(RunnerKind::Local, |r| r.kind);
    if !hub::may_call(sub, &info.owner, kind) {
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
    if planned.kind == CallKind::Cancel {
        if ws.send_with_str(&frame).is_err() {
            return Err(disconnected(&runner));
        }
        return Ok(RunnerCallResponse {
            epoch,
            response: None,
        });
    }
    let timeout = hub::call_timeout_ms(timeout_ms);
    let session = match &message {
        ServerMessage::ToolCall { session_id, .. } => Some(session_id.as_str()),
        _ => None,
    };
    let Some((rx, _guard)) = sockets.waiters.wait(epoch, &id, session) else {
        return Err(ApiError::new(
            409,
            "conflict",
            format!("a request with id {id:?} is already waiting on runner {runner:?}"),
        ));
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
            if let Some(said) = hub::keep_requested_name(planned.attach_name, &mut response) {
                worker::console_log!(
                    "runner hub: runner {runner:?} of {owner} answered attach of {:?} as {said:?}; keeping {:?}",
                    planned.attach_name.unwrap_or_default(),
                    planned.attach_name.unwrap_or_default()
                );
            }
            Ok(RunnerCallResponse {
                epoch,
                response: Some(response),
            })
        }
        Either::Left((Ok(Err(error)), _)) => Err(error),
        Either::Left((Err(_), _)) => Err(disconnected(&runner)),
        Either::Right(_) => {
            if planned.kind == CallKind::ToolCall {
                send(&ws, &ServerMessage::Cancel { id: id.clone() });
            }
            Err(ApiError::new(
                504,
                call_codes::TIMEOUT,
                format!("runner {runner:?} did not answer {id:?} within {timeout} ms"),
            ))
        }
    }
}

fn disconnected(runner: &str) -> ApiError {
    ApiError::new(
        502,
        call_codes::RUNNER_DISCONNECTED,
        format!("runner {runner:?} disconnected while the call was running"),
    )
}
