//! `GET /follow`: the I/O half of the follow stream. The rules (backfill and live merge,
//! dedupe by cursor, `sinceTime`, idle points, the buffer bound, heartbeats and the timeout,
//! re-checking a revocable credential) live in `wuhu_core::follow`; this file registers
//! followers, reads pages, asks the token registry, runs timers and writes frames.
//!
//! A follower is one of two kinds of sink: an SSE stream (this file) or a client WebSocket
//! (`socket`). Both are in one [`Followers`] list, under one cap, fed the same shared events.

use std::cell::RefCell;
use std::pin::pin;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use futures::future::{poll_fn, select};
use worker::{Delay, Headers, Response};
use wuhu_core::follow::{Follow, Frame, LiveEvent, MAX_FOLLOWERS, Output, Registration};
use wuhu_core::session::Millis;
use wuhu_core::socket::AckWindow;
use wuhu_core::wire::StreamEvent;

use super::archive;
use super::{Actor, now};
use crate::http::{ApiError, ApiResult};
use crate::identity::Identity;
use crate::token_registry;

/// Frames are written in chunks of at most this many bytes; a frame that does not fit is written
/// in pieces from its shared text. Each follower holds at most the chunk being built and the
/// copy the runtime has not written yet, so this is part of the per-follower memory bound
/// (docs/api.md, follow bounds) however large an entry is.
const CHUNK_BYTES: usize = 16 * 1024;

/// One follower, shared by its stream and the actor's list.
pub(super) struct Shared {
    pub(super) follow: Follow,
    /// Who follows, and the `jti` of their revocable credential (re-checked by the stream).
    pub(super) credential: Option<(Identity, String)>,
    /// A client WebSocket's id (its attachment's); `None` for an SSE stream.
    pub(super) socket: Option<String>,
    /// The socket closed: its sink ends.
    pub(super) gone: bool,
    /// A client WebSocket's frames sent and not acknowledged (`wuhu_core::socket::AckWindow`);
    /// unused for an SSE stream.
    pub(super) acks: AckWindow,
    /// A frame partly written (it did not fit in the last chunk), and the bytes of it written.
    pending: Option<(Frame, usize)>,
    /// A live event arrived since the stream last polled.
    pub(super) woken: bool,
    waker: Option<Waker>,
}

/// Live subscribers of one session. The list holds weak references: a stream that ends or
/// whose client goes away drops its follower, and the list forgets it.
#[derive(Default)]
pub(crate) struct Followers {
    list: Vec<Weak<RefCell<Shared>>>,
}

impl Shared {
    /// Wakes its sink (a live event, an ack, a reply to record, an end).
    pub(super) fn wake(&mut self) {
        self.woken = true;
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

impl Actor {
    /// Where a new follower starts: the committed cursor (not the one in memory: a drain
    /// waiting for an out-of-line write is neither in storage nor broadcast yet) and the status.
    /// Taken in the same synchronous step as the registration.
    pub(super) fn follow_registration(&self) -> ApiResult<Registration> {
        let committed = self.committed_cursor();
        self.with_loaded(|l| Registration {
            last_cursor: committed,
            status: l.session.status(),
        })
        .ok_or_else(|| ApiError::internal("session not loaded"))
    }
}

impl Followers {
    pub(super) fn add(
        &mut self,
        follow: Follow,
        credential: Option<(Identity, String)>,
        socket: Option<String>,
    ) -> ApiResult<Rc<RefCell<Shared>>> {
        self.list
            .retain(|w| w.upgrade().is_some_and(|s| !s.borrow().follow.is_closed()));
        if self.list.len() >= MAX_FOLLOWERS {
            return Err(ApiError::new(
                429,
                "too_many_followers",
                format!("this session already has {MAX_FOLLOWERS} followers"),
            ));
        }
        let shared = Rc::new(RefCell::new(Shared {
            follow,
            credential,
            socket,
            gone: false,
            acks: AckWindow::default(),
            pending: None,
            woken: false,
            waker: None,
        }));
        self.list.push(Rc::downgrade(&shared));
        Ok(shared)
    }

    /// Hands `event` (encoded once, shared) to every follower and wakes its stream; forgets
    /// followers that closed (lagged ones are woken first, to send `lagged`).
    pub(crate) fn send(&mut self, event: &StreamEvent) {
        if self.list.is_empty() {
            return;
        }
        let live = LiveEvent::new(event);
        self.list.retain(|w| {
            let Some(shared) = w.upgrade() else {
                return false;
            };
            let mut shared = shared.borrow_mut();
            shared.follow.handle_live(live.clone());
            shared.woken = true;
            if let Some(waker) = shared.waker.take() {
                waker.wake();
            }
            !shared.follow.is_closed()
        });
    }

    /// The session was deleted: every stream ends with an `error` (and is forgotten).
    pub(crate) fn end_deleted(&mut self) {
        for shared in self.list.drain(..).filter_map(|w| w.upgrade()) {
            let mut shared = shared.borrow_mut();
            shared.follow.handle_deleted();
            shared.woken = true;
            if let Some(waker) = shared.waker.take() {
                waker.wake();
            }
        }
    }

    /// Whether the client WebSocket `id` has a live sink here.
    pub(super) fn has_socket(&self, id: &str) -> bool {
        self.list.iter().filter_map(Weak::upgrade).any(|s| {
            let s = s.borrow();
            s.socket.as_deref() == Some(id) && !s.gone
        })
    }

    /// The live sink of the client WebSocket `id`.
    pub(super) fn socket(&self, id: &str) -> Option<Rc<RefCell<Shared>>> {
        self.list.iter().filter_map(Weak::upgrade).find(|s| {
            let s = s.borrow();
            s.socket.as_deref() == Some(id) && !s.gone
        })
    }

    /// The client WebSocket `id` closed: its sink ends (and is forgotten).
    pub(super) fn socket_gone(&mut self, id: &str) {
        for shared in self.list.iter().filter_map(Weak::upgrade) {
            let mut shared = shared.borrow_mut();
            if shared.socket.as_deref() == Some(id) {
                shared.gone = true;
                shared.woken = true;
                if let Some(waker) = shared.waker.take() {
                    waker.wake();
                }
            }
        }
        self.list
            .retain(|w| w.upgrade().is_some_and(|s| !s.borrow().gone));
    }

    /// The credential of the client WebSocket `id` is no longer live: its sink ends as a
    /// failed periodic check would end it.
    pub(super) fn socket_revoked(&mut self, id: &str) {
        for shared in self.list.iter().filter_map(Weak::upgrade) {
            let mut shared = shared.borrow_mut();
            if shared.socket.as_deref() == Some(id) {
                shared.follow.handle_credential(now(), Ok(false));
                shared.woken = true;
                if let Some(waker) = shared.waker.take() {
                    waker.wake();
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.list.iter().filter(|w| w.strong_count() > 0).count()
    }
}

/// `Follow`: the SSE stream of `identity`.
pub(crate) async fn handle(
    actor: Rc<Actor>,
    call: &wuhu_core::calls::session::Follow,
    identity: &Identity,
) -> ApiResult<Response> {
    let request = &call.request;
    // The snapshot and the registration happen in one synchronous step, so every event after
    // the snapshot reaches the follower live.
    let registration = actor.follow_registration()?;
    // Set by the router from the verified credential: a revocable one is re-checked while the
    // stream is open, so a revoke or logout ends it (decision 0007).
    let mut follow = Follow::new(now(), request, registration)
        .with_running_output(actor.in_flight.runner_calls.output_tails());
    let credential = match &call.jti {
        Some(jti) => {
            follow = follow.recheck_credential(now());
            Some((identity.clone(), jti.clone()))
        }
        None => None,
    };
    let shared = actor
        .clients
        .followers
        .borrow_mut()
        .add(follow, credential, None)?;
    let stream = futures::stream::unfold((actor, shared), |(actor, shared)| async move {
        let chunk = next_chunk(&actor, &shared).await?;
        Some((Ok::<Vec<u8>, worker::Error>(chunk), (actor, shared)))
    });
    let headers = Headers::new();
    let _ = headers.set("content-type", "text/event-stream");
    let _ = headers.set("cache-control", "no-cache");
    let _ = headers.set("x-accel-buffering", "no");
    Ok(Response::from_stream(stream)?.with_headers(headers))
}

/// The next chunk of SSE text to write (at most [`CHUNK_BYTES`]), or `None` to end the stream.
async fn next_chunk(actor: &Rc<Actor>, shared: &Rc<RefCell<Shared>>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let output = {
            let mut shared = shared.borrow_mut();
            if let Some((frame, written)) = shared.pending.take() {
                let rest = &frame.as_str().as_bytes()[written..];
                let take = rest.len().min(CHUNK_BYTES - out.len());
                out.extend_from_slice(&rest[..take]);
                if take < rest.len() {
                    shared.pending = Some((frame, written + take));
                    return Some(out);
                }
                continue;
            }
            shared.woken = false;
            shared.follow.poll(now())
        };
        match output {
            Output::Frame(frame) => {
                if out.len() + frame.as_str().len() <= CHUNK_BYTES {
                    out.extend_from_slice(frame.as_str().as_bytes());
                } else {
                    // Written from the frame's own (for live events, shared) text, a piece
                    // per chunk: never copied whole for one follower.
                    shared.borrow_mut().pending = Some((frame, 0));
                }
            }
            Output::ReadPage { since, limit } => read_page(actor, shared, since, limit).await,
            Output::CheckCredential => check_credential(actor, shared).await,
            Output::Wait => {
                if !out.is_empty() {
                    return Some(out);
                }
                let deadline = shared.borrow().follow.poll_deadline();
                wait(shared, deadline).await;
            }
            Output::End => return (!out.is_empty()).then_some(out),
        }
    }
}

/// [`Output::ReadPage`] for either kind of sink.
pub(super) async fn read_page(
    actor: &Rc<Actor>,
    shared: &Rc<RefCell<Shared>>,
    since: u64,
    limit: usize,
) {
    let page = archive::read_page(actor, since, limit)
        .await
        .map(|(entries, _)| entries)
        .map_err(|e| e.message);
    shared.borrow_mut().follow.handle_page(page);
}

/// [`Output::CheckCredential`] for either kind of sink.
pub(super) async fn check_credential(actor: &Rc<Actor>, shared: &Rc<RefCell<Shared>>) {
    let credential = shared.borrow().credential.clone();
    let live = match &credential {
        Some((who, jti)) => token_registry::still_live(&actor.env, who, jti)
            .await
            .map_err(|e| e.message),
        None => Ok(true),
    };
    shared.borrow_mut().follow.handle_credential(now(), live);
}

/// Until a live event arrives or `deadline` passes.
pub(super) async fn wait(shared: &Rc<RefCell<Shared>>, deadline: Option<Millis>) {
    let woken = poll_fn(|cx| {
        let mut shared = shared.borrow_mut();
        if shared.woken {
            Poll::Ready(())
        } else {
            shared.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    });
    match deadline {
        Some(deadline) => {
            let ms = deadline.0.saturating_sub(now().0).max(1);
            let timer = Delay::from(Duration::from_millis(ms));
            let _ = select(pin!(woken), timer).await;
        }
        None => woken.await,
    }
}
