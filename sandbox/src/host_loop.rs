//! The embedder's side of the [`protocol`](crate::protocol): drive one guest until its
//! script is done, performing its host calls and timers in between.

use std::{future::poll_fn, pin::pin, task::Poll, time::Duration};

use futures::future::{Either, FutureExt, LocalBoxFuture, select};

use crate::{
    Clock, ErrorKind, Host, JsError, Limits, Outcome,
    protocol::{GuestInput, GuestRequest, GuestResult, GuestResume, GuestStep},
};

/// The most host calls and timers one script may have outstanding at once.
///
/// Each one holds a future (and for timers a platform timer) in the embedder, outside the
/// guest's memory limit.
pub const MAX_PENDING_REQUESTS: usize = 10_000;

/// How long past [`Limits::time`] the embedder waits before giving up on a guest that should
/// have stopped itself (its own deadline timer is one of its requests).
const BACKSTOP_GRACE: Duration = Duration::from_secs(2);

/// One guest instance: the two entry points of the [`protocol`](crate::protocol), as JSON.
pub trait Guest {
    /// Calls `start` with a JSON [`GuestInput`]; answers a JSON [`GuestStep`].
    ///
    /// `Err` means the instance itself failed (a trap, a stack overflow, an exception thrown
    /// through it): its message describes the failure, and the guest is never called again.
    fn start(&mut self, input: &[u8]) -> Result<Vec<u8>, String>;

    /// Calls `resume` with a JSON [`GuestResume`]; answers a JSON [`GuestStep`].
    /// `Err` as for [`Guest::start`].
    fn resume(&mut self, input: &[u8]) -> Result<Vec<u8>, String>;
}

/// Runs `input` in `guest` to the end: performs its host calls on `host` and its timers on
/// `clock`, resumes it with their results, and returns its [`Outcome`].
///
/// Never panics: a failed instance, a malformed answer or a guest that outlives its time
/// limit becomes an error [`Outcome`] (see [`crashed`] for how instance failures read).
pub async fn drive_guest(
    guest: &mut dyn Guest,
    input: &GuestInput,
    host: &dyn Host,
    clock: &dyn Clock,
) -> Outcome {
    let limits = Limits::from(input.limits).normalized();
    let mut backstop = clock.sleep(limits.time + BACKSTOP_GRACE);
    let message = match serde_json::to_vec(input) {
        Ok(message) => message,
        Err(e) => {
            return failure(
                ErrorKind::Internal,
                format!("cannot encode the script: {e}"),
            );
        }
    };
    let mut answer = guest.start(&message);
    let mut pending: Vec<(u64, LocalBoxFuture<'_, GuestResult>)> = Vec::new();
    loop {
        let step = match answer {
            Err(message) => return crashed(&message),
            Ok(bytes) => match serde_json::from_slice::<GuestStep>(&bytes) {
                Ok(step) => step,
                Err(e) => {
                    return failure(
                        ErrorKind::Internal,
                        format!("the sandbox answered a malformed message: {e}"),
                    );
                }
            },
        };
        let requests = match step {
            GuestStep::Done { outcome } => return outcome,
            GuestStep::Pending { requests } => requests,
        };
        for request in requests {
            match request {
                GuestRequest::Host { id, name, arg } => pending.push((
                    id,
                    host.call(&name, arg)
                        .map(move |result| GuestResult::Host { id, result })
                        .boxed_local(),
                )),
                GuestRequest::Sleep { id, ms } => pending.push((
                    id,
                    clock
                        .sleep(sleep_duration(ms))
                        .map(move |()| GuestResult::Timer { id })
                        .boxed_local(),
                )),
                GuestRequest::Cancel { id } => pending.retain(|(pending_id, _)| *pending_id != id),
            }
        }
        if pending.len() > MAX_PENDING_REQUESTS {
            return failure(
                ErrorKind::Exception,
                format!(
                    "the script has more than {MAX_PENDING_REQUESTS} timers and host calls pending"
                ),
            );
        }
        if pending.is_empty() {
            return failure(
                ErrorKind::Internal,
                "the sandbox waits with nothing pending".into(),
            );
        }
        let ready = poll_fn(|cx| {
            let mut ready = Vec::new();
            let mut index = 0;
            while index < pending.len() {
                if let Poll::Ready(result) = pending[index].1.as_mut().poll(cx) {
                    drop(pending.swap_remove(index));
                    ready.push(result);
                } else {
                    index += 1;
                }
            }
            if ready.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(ready)
            }
        });
        let results = match select(pin!(ready), &mut backstop).await {
            Either::Left((results, _)) => results,
            Either::Right(((), _)) => {
                return failure(
                    ErrorKind::Timeout,
                    format!(
                        "script exceeded the {} ms time limit",
                        limits.time.as_millis()
                    ),
                );
            }
        };
        answer = match serde_json::to_vec(&GuestResume { results }) {
            Ok(message) => guest.resume(&message),
            Err(e) => {
                return failure(
                    ErrorKind::Internal,
                    format!("cannot encode host results: {e}"),
                );
            }
        };
    }
}

/// The outcome of a guest instance that failed: a host stack overflow (deep recursion in
/// QuickJS's C code that its own stack check cannot see) is [`ErrorKind::StackOverflow`];
/// anything else (a trap, memory exhausted outside QuickJS's heap) is [`ErrorKind::Internal`].
/// Console output of the failed instance is lost with it.
pub fn crashed(message: &str) -> Outcome {
    if message.contains("Maximum call stack size exceeded") {
        failure(
            ErrorKind::StackOverflow,
            format!("{message} (the script nests too deeply; its sandbox instance was discarded)"),
        )
    } else {
        failure(
            ErrorKind::Internal,
            format!("the script's sandbox instance failed and was discarded: {message}"),
        )
    }
}

fn failure(kind: ErrorKind, message: String) -> Outcome {
    Outcome {
        result: Err(JsError {
            kind,
            message,
            stack: None,
        }),
        console: Vec::new(),
        console_truncated: false,
    }
}

/// A guest's timer length: finite, non-negative, at most about 24 days.
fn sleep_duration(ms: f64) -> Duration {
    let ms = if ms.is_finite() {
        ms.clamp(0.0, 2_147_483_647.0)
    } else {
        0.0
    };
    Duration::from_secs_f64(ms / 1000.0)
}
