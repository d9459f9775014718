//! `CallRunner` calls waiting for a runner's answer. They live in memory, keyed by (connection epoch,
//! request id): a Durable Object with an in-flight request does not hibernate, and a closing
//! socket fails exactly its own requests.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use futures::channel::oneshot;
use wuhu_core::wire::runner::RunnerMessage;

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

    /// Registers a wait for the answer `id` on connection `epoch`; `None` when a call with that
    /// id already waits there. Keep the guard for as long as the call waits.
    pub(super) fn wait(
        &self,
        epoch: u64,
        id: &str,
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
            pending.insert(key.clone(), Waiter { token, tx });
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
