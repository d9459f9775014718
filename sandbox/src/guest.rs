//! The guest side of the [`protocol`](crate::protocol): [`run`](crate::run) as a state machine
//! that turns every host call and timer into a [`GuestRequest`] and waits to be resumed.
//!
//! The run's future is polled with a no-op waker: nothing inside the guest can make progress
//! on its own (it has no I/O and no timers), so the only moments worth polling are `start`
//! and each `resume`, when results have arrived.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use futures::future::{FutureExt, LocalBoxFuture};
use serde_json::Value;

use crate::{
    Clock, ErrorKind, Host, HostFuture, JsError, Limits, Outcome,
    protocol::{GuestInput, GuestRequest, GuestResult, GuestStep},
};

/// One script inside a guest: started once, resumed until [`GuestStep::Done`].
pub struct GuestSession {
    bridge: Rc<Bridge>,
    run: Option<LocalBoxFuture<'static, Outcome>>,
}

impl GuestSession {
    /// Starts `input`'s script; `now_ms` is the guest's clock (any origin, never backwards).
    pub fn start(input: GuestInput, now_ms: Box<dyn Fn() -> f64>) -> (GuestSession, GuestStep) {
        let bridge = Rc::new(Bridge::default());
        let host = BridgeHost {
            bridge: Rc::clone(&bridge),
            prelude: input.prelude,
        };
        let clock = Rc::new(BridgeClock {
            bridge: Rc::clone(&bridge),
            now_ms,
        });
        let limits = Limits::from(input.limits);
        let code = input.code;
        let run = async move { crate::run(&code, &limits, &host, clock).await }.boxed_local();
        let mut session = GuestSession {
            bridge,
            run: Some(run),
        };
        let step = session.poll();
        (session, step)
    }

    /// Delivers finished requests and runs on.
    pub fn resume(&mut self, results: Vec<GuestResult>) -> GuestStep {
        {
            let mut finished = self.bridge.finished.borrow_mut();
            for result in results {
                match result {
                    GuestResult::Host { id, result } => {
                        finished.insert(id, Finished::Host(result));
                    }
                    GuestResult::Timer { id } => {
                        finished.insert(id, Finished::Timer);
                    }
                }
            }
        }
        self.poll()
    }

    fn poll(&mut self) -> GuestStep {
        let Some(run) = self.run.as_mut() else {
            return GuestStep::Done {
                outcome: Outcome {
                    result: Err(JsError {
                        kind: ErrorKind::Internal,
                        message: "the guest was resumed after its run ended".into(),
                        stack: None,
                    }),
                    console: Vec::new(),
                    console_truncated: false,
                },
            };
        };
        match run.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(outcome) => {
                self.run = None;
                GuestStep::Done { outcome }
            }
            Poll::Pending => GuestStep::Pending {
                requests: std::mem::take(&mut *self.bridge.requests.borrow_mut()),
            },
        }
    }
}

/// Requests made and results delivered, shared by the session and the waiting futures.
#[derive(Default)]
struct Bridge {
    next_id: Cell<u64>,
    requests: RefCell<Vec<GuestRequest>>,
    finished: RefCell<HashMap<u64, Finished>>,
}

impl Bridge {
    /// Queues the request built from a fresh id and returns a future of its result.
    fn request(self: &Rc<Self>, make: impl FnOnce(u64) -> GuestRequest) -> Waiting {
        let id = self.next_id.get() + 1;
        self.next_id.set(id);
        self.requests.borrow_mut().push(make(id));
        Waiting {
            id,
            bridge: Rc::clone(self),
            done: false,
        }
    }
}

enum Finished {
    Host(Result<Value, String>),
    Timer,
}

/// The result of one request; dropping it unfinished cancels the request.
struct Waiting {
    id: u64,
    bridge: Rc<Bridge>,
    done: bool,
}

impl Future for Waiting {
    type Output = Finished;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Finished> {
        let finished = self.bridge.finished.borrow_mut().remove(&self.id);
        match finished {
            Some(finished) => {
                self.done = true;
                Poll::Ready(finished)
            }
            None => Poll::Pending,
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.done {
            self.bridge.finished.borrow_mut().remove(&self.id);
            self.bridge
                .requests
                .borrow_mut()
                .push(GuestRequest::Cancel { id: self.id });
        }
    }
}

struct BridgeHost {
    bridge: Rc<Bridge>,
    prelude: String,
}

impl Host for BridgeHost {
    fn call<'a>(&'a self, name: &str, arg: Value) -> HostFuture<'a> {
        let name = name.to_string();
        self.bridge
            .request(|id| GuestRequest::Host { id, name, arg })
            .map(|finished| match finished {
                Finished::Host(result) => result,
                Finished::Timer => Err("the embedder answered a host call as a timer".into()),
            })
            .boxed_local()
    }

    fn prelude(&self) -> &str {
        &self.prelude
    }
}

struct BridgeClock {
    bridge: Rc<Bridge>,
    now_ms: Box<dyn Fn() -> f64>,
}

impl Clock for BridgeClock {
    fn now_ms(&self) -> f64 {
        (self.now_ms)()
    }

    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()> {
        let ms = duration.as_secs_f64() * 1000.0;
        self.bridge
            .request(|id| GuestRequest::Sleep { id, ms })
            .map(drop)
            .boxed_local()
    }
}
