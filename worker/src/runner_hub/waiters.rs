//! `CallRunner` calls waiting for a runner's answer. They live in memory, keyed by (connection epoch,
//! request id): a Durable Object with an in-flight request does not hibernate, and a closing
//! socket fails exactly its own requests.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use futures::channel::oneshot;
use wuhu_core::tool_output::RelayQueue;
use wuhu_core::wire::runner::{OutputStream, RunnerMessage};

use crate::http::ApiError;
use crate::internal::codes;

/// What a runner's answer (or the loss of its connection) delivers to a waiting `CallRunner`.
pub(super) type Outcome = Result<RunnerMessage, ApiError>;

/// The hub's waiting `CallRunner` calls.
pub(super) struct Waiters {
    /// By (connection epoch, request id).
    pending: RefCell<HashMap<(u64, String), Waiter>>,
    /// Tells waiters apart, so a finished `CallRunner` never removes a newer one's entry.
    next_token: Cell<u64>,
}

/// A `CallRunner` waiting for its answer.
struct Waiter {
    token: u64,
    tx: oneshot::Sender<Outcome>,
    /// The session whose `tool_call` this is: where its `tool_progress` frames go.
    session: Option<String>,
    /// Its frames on their way there.
    progress: RelayQueue,
}

/// Removes its waiter when the `CallRunner` ends, however it ends (answer, timeout, or the caller
/// going away and dropping the future).
pub(super) struct WaiterGuard<'a> {
    waiters: &'a Waiters,
    key: (u64, String),
    token: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.waiters.pending.try_borrow_mut()
            && pending
                .get(&self.key)
                .is_some_and(|w| w.token == self.token)
        {
            pending.remove(&self.key);
        }
    }
}

impl Waiters {
    pub(super) fn new() -> Waiters {
        Waiters {
            pending: RefCell::new(HashMap::new()),
            next_token: Cell::new(1),
        }
    }

    /// Registers a wait for the answer `id` on connection `epoch` (a `tool_call` of `session`,
    /// whose output frames go there); `None` when a call with that id already waits there.
    /// Keep the guard for as long as the call waits.
    pub(super) fn wait(
        &self,
        epoch: u64,
        id: &str,
        session: Option<&str>,
    ) -> Option<(oneshot::Receiver<Outcome>, WaiterGuard<'_>)> {
        let key = (epoch, id.to_string());
        let (tx, rx) = oneshot::channel::<Outcome>();
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        {
            let mut pending = self.pending.borrow_mut();
            if pending.contains_key(&key) {
                return None;
            }
            pending.insert(
                key.clone(),
                Waiter {
                    token,
                    tx,
                    session: session.map(str::to_string),
                    progress: RelayQueue::default(),
                },
            );
        }
        Some((
            rx,
            WaiterGuard {
                waiters: self,
                key,
                token,
            },
        ))
    }

    /// Hands `answer` to the call waiting for `id` on `epoch`; false when none waits (it timed
    /// out or was cancelled).
    pub(super) fn deliver(&self, epoch: u64, id: &str, answer: RunnerMessage) -> bool {
        let waiting = self.pending.borrow_mut().remove(&(epoch, id.to_string()));
        match waiting {
            Some(waiter) => {
                let _ = waiter.tx.send(Ok(answer));
                true
            }
            None => false,
        }
    }

    /// Queues a `tool_progress` frame of call `id` on `epoch`. The session to forward to, when
    /// the caller is to forward the call's queue ([`Waiters::next_progress`] until `None`);
    /// `None` when no call of a session waits for it (it ended, or another forwards).
    pub(super) fn progress(
        &self,
        epoch: u64,
        id: &str,
        stream: OutputStream,
        text: String,
    ) -> Option<String> {
        let mut pending = self.pending.borrow_mut();
        let waiter = pending.get_mut(&(epoch, id.to_string()))?;
        let session = waiter.session.clone()?;
        waiter.progress.push(stream, text).then_some(session)
    }

    /// The next frame of call `id` on `epoch` to forward; `None` when there is none left or the
    /// call no longer waits.
    pub(super) fn next_progress(&self, epoch: u64, id: &str) -> Option<(OutputStream, String)> {
        self.pending
            .borrow_mut()
            .get_mut(&(epoch, id.to_string()))?
            .progress
            .pop()
    }

    /// Fails every call waiting on connection `epoch` with `502 runner_disconnected`.
    pub(super) fn fail_epoch(&self, epoch: u64, message: String) {
        let failed: Vec<Waiter> = {
            let mut pending = self.pending.borrow_mut();
            let keys: Vec<(u64, String)> = pending
                .keys()
                .filter(|(e, _)| *e == epoch)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| pending.remove(k)).collect()
        };
        for waiter in failed {
            let _ = waiter.tx.send(Err(ApiError::new(
                502,
                codes::RUNNER_DISCONNECTED,
                message.clone(),
            )));
        }
    }
}
