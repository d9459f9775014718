//! # wuhu-sandbox-guest
//!
//! The `js` sandbox (`wuhu-sandbox`'s QuickJS) as a WebAssembly module of its own. The Worker
//! instantiates it once per script, so a trap or a stack overflow inside QuickJS ends that
//! instance, and that script with a tool error, and nothing else: the Worker's own instance
//! (and every Durable Object sharing it) never runs QuickJS.
//!
//! The interface is a tiny C ABI around `wuhu_sandbox::guest::GuestSession` (see
//! `wuhu_sandbox::protocol` for the messages, all JSON):
//!
//! | export | does |
//! |---|---|
//! | `memory` | the instance's linear memory |
//! | `wuhu_alloc(len) -> ptr` | a buffer of `len` bytes for the next message; `start`/`resume` take it over |
//! | `wuhu_start(ptr, len) -> out_len` | starts a script (`GuestInput`); answers a `GuestStep` |
//! | `wuhu_resume(ptr, len) -> out_len` | delivers results (`GuestResume`); answers a `GuestStep` |
//! | `wuhu_output() -> ptr` | where the last answer's `out_len` bytes are |
//!
//! It imports one function, `wuhu.now_ms() -> f64` (milliseconds since the epoch, for the
//! script's `Date.now()` and the sandbox's time limit; `Date.now` itself will do).
//! An instance runs one script; the embedder throws it away afterwards, whatever happened.

use std::cell::RefCell;

use wuhu_sandbox::{
    ErrorKind, JsError, Outcome,
    guest::GuestSession,
    protocol::{GuestInput, GuestResume, GuestStep},
};

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wuhu")]
unsafe extern "C" {
    #[link_name = "now_ms"]
    fn host_now_ms() -> f64;
}

/// The guest's clock.
#[cfg(target_arch = "wasm32")]
fn now_ms() -> f64 {
    // SAFETY: an imported function without arguments or memory access.
    unsafe { host_now_ms() }
}

#[cfg(not(target_arch = "wasm32"))]
fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// QuickJS's wasm shim reads the time through this symbol (microseconds since the epoch).
#[unsafe(no_mangle)]
pub extern "C" fn __rquickjs_host_now_us() -> f64 {
    now_ms() * 1000.0
}

#[derive(Default)]
struct State {
    session: Option<GuestSession>,
    output: Vec<u8>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Allocates a `len`-byte buffer for the next message to `wuhu_start` or `wuhu_resume`.
#[unsafe(no_mangle)]
pub extern "C" fn wuhu_alloc(len: u32) -> *mut u8 {
    let buffer = vec![0u8; len as usize].into_boxed_slice();
    Box::into_raw(buffer).cast::<u8>()
}

/// Where the last answer is (its length was the return value of `wuhu_start`/`wuhu_resume`).
#[unsafe(no_mangle)]
pub extern "C" fn wuhu_output() -> *const u8 {
    STATE.with(|state| state.borrow().output.as_ptr())
}

/// Starts a script from the JSON `GuestInput` in the buffer; returns the answer's length.
///
/// # Safety
/// `ptr` and `len` must be a buffer from `wuhu_alloc(len)`, not used since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wuhu_start(ptr: *mut u8, len: u32) -> u32 {
    // SAFETY: the caller's contract.
    let message = unsafe { take_buffer(ptr, len) };
    let step = match serde_json::from_slice::<GuestInput>(&message) {
        Ok(input) => {
            let (session, step) = GuestSession::start(input, Box::new(now_ms));
            STATE.with(|state| state.borrow_mut().session = Some(session));
            step
        }
        Err(e) => failed(format!("malformed start message: {e}")),
    };
    answer(&step)
}

/// Delivers the JSON `GuestResume` in the buffer and runs on; returns the answer's length.
///
/// # Safety
/// As for `wuhu_start`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wuhu_resume(ptr: *mut u8, len: u32) -> u32 {
    // SAFETY: the caller's contract.
    let message = unsafe { take_buffer(ptr, len) };
    let step = match serde_json::from_slice::<GuestResume>(&message) {
        Ok(resume) => {
            // Out of the cell while the script runs, so nothing it calls can find it borrowed.
            let session = STATE.with(|state| state.borrow_mut().session.take());
            match session {
                Some(mut session) => {
                    let step = session.resume(resume.results);
                    if matches!(step, GuestStep::Pending { .. }) {
                        STATE.with(|state| state.borrow_mut().session = Some(session));
                    }
                    step
                }
                None => failed("resumed without a running script".into()),
            }
        }
        Err(e) => failed(format!("malformed resume message: {e}")),
    };
    answer(&step)
}

/// # Safety
/// `ptr`/`len` from `wuhu_alloc`, used once.
unsafe fn take_buffer(ptr: *mut u8, len: u32) -> Box<[u8]> {
    // SAFETY: `wuhu_alloc` made exactly this boxed slice.
    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len as usize)) }
}

fn failed(message: String) -> GuestStep {
    GuestStep::Done {
        outcome: Outcome {
            result: Err(JsError {
                kind: ErrorKind::Internal,
                message,
                stack: None,
            }),
            console: Vec::new(),
            console_truncated: false,
        },
    }
}

fn answer(step: &GuestStep) -> u32 {
    let bytes = serde_json::to_vec(step).unwrap_or_else(|e| {
        serde_json::to_vec(&failed(format!("cannot encode the answer: {e}"))).unwrap_or_default()
    });
    let len = u32::try_from(bytes.len()).unwrap_or(0);
    STATE.with(|state| state.borrow_mut().output = bytes);
    len
}
