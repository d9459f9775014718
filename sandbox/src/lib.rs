//! The QuickJS sandbox of Wuhu: run an untrusted script under limits and return its value.
//!
//! # Brief overview
//!
//! [`run`] evaluates one script in a fresh QuickJS runtime and returns an [`Outcome`]: the
//! script's completion value as JSON (or a [`JsError`]) plus everything it wrote to `console`.
//! [`Limits`] bound memory, time, stack depth and console output.
//! The embedder supplies two things:
//!
//! - a [`Host`]: the named async functions the script may call, and an optional JS prelude that
//!   shapes them into a friendly API;
//! - a [`Clock`]: the current time and a timer.
//!   The crate reads no clock of its own, because `std::time::Instant` panics on
//!   `wasm32-unknown-unknown`.
//!   [`StdClock`] is the native implementation.
//!
//! The crate knows nothing of Workers, sessions or HTTP.
//! It builds for native targets and for `wasm32-unknown-unknown`.
//!
//! ```
//! use std::rc::Rc;
//! use wuhu_sandbox::{run, Limits, NoHost, StdClock};
//!
//! let outcome = futures::executor::block_on(run(
//!     "console.log('hi'); [1, 2, 3].map((x) => x * 2)",
//!     &Limits::default(),
//!     &NoHost,
//!     Rc::new(StdClock::new()),
//! ));
//! assert_eq!(outcome.result, Ok(serde_json::json!([2, 4, 6])));
//! assert_eq!(outcome.console_text(), "hi\n");
//! ```
//!
//! # What a script sees
//!
//! - The standard ECMAScript library of QuickJS (`JSON`, `Math`, `Date`, `Promise`, `RegExp`,
//!   `Map`, typed arrays, `BigInt`, ...), but no I/O, no modules, no `require`, and no code
//!   generation from strings (`eval` and `new Function` throw; see "Stack and deep nesting").
//!   `Date` is UTC on wasm32.
//! - `console.log`, `info`, `warn`, `error`, `debug` (and `trace`, recorded as `debug`).
//!   Arguments are joined with spaces: strings raw, errors as `Name: message` plus stack, other
//!   values as JSON (with `[Circular]`, `123n` for BigInts and `[Function: f]`).
//! - `setTimeout(callback, ms, ...args)`, `clearTimeout(id)` and `queueMicrotask(callback)`.
//!   Timers use [`Clock::sleep`].
//! - `__host.call(name, arg)`: calls the host function `name` with `arg` (converted with
//!   `JSON.stringify`; `undefined` becomes `null`; a value JSON cannot encode, or nesting
//!   deeper than 128 levels, throws a `TypeError`) and returns a promise of its JSON result.
//!   A host error rejects the promise with an `Error` whose `message` is the host's message, so
//!   `try { await __host.call(...) } catch (e) { e.message }` works.
//! - Whatever [`Host::prelude`] defines on top, for example `fetch` from [`FETCH_PRELUDE`].
//!
//! # The completion value
//!
//! The script is evaluated as a classic, sloppy-mode global script with QuickJS's async-eval flag
//! (`JS_EVAL_FLAG_ASYNC`), so **top-level `await` works** and the result is the script's
//! *completion value*, the value of its last expression statement, as in a REPL or `eval`:
//! `1 + 1` gives `2`, `const x = 3; x * 2` gives `6`, `await fetch(url).then((r) => r.status)`
//! gives the status.
//! If that value is a promise it is awaited too, so `Promise.resolve(5)` gives `5`.
//! The value is returned as JSON via `JSON.stringify`: `undefined` (and a script without an
//! expression, such as a lone declaration) gives `null`; a value `JSON.stringify` cannot encode
//! (a function, a symbol, a BigInt, a cycle) gives its `String(value)` form.
//!
//! The run ends when the completion value has settled **and** no host call or timer is still
//! pending, like Node.js exiting when its event loop is empty.
//! So fire-and-forget calls such as `__host.call("log", x)` without `await` still complete.
//! If the script throws, or its completion promise rejects, the run ends at once and pending
//! work is dropped.
//! If the completion promise can never settle (nothing pending, nothing queued, for example
//! `await new Promise(() => {})`), the run ends with [`ErrorKind::Unsettled`].
//!
//! # Limits
//!
//! Every run gets a fresh runtime, so nothing leaks from one run to the next.
//! Exceeding a limit ends the run with an error [`Outcome`]; it never panics the host.
//!
//! | limit | default | enforced by | error |
//! |---|---|---|---|
//! | [`Limits::memory_bytes`] | 32 MiB | the runtime's allocator | [`ErrorKind::OutOfMemory`] |
//! | [`Limits::time`] | 5 s | [`Clock::now_ms`] in the interrupt handler; [`Clock::sleep`] while waiting for host calls and timers | [`ErrorKind::Timeout`] |
//! | [`Limits::max_steps`] | 1 000 | a count of interrupt-handler calls, independent of any clock | [`ErrorKind::Timeout`] |
//! | [`Limits::max_stack_bytes`] | 256 KiB | QuickJS's stack check | [`ErrorKind::StackOverflow`] |
//! | [`Limits::console_bytes`] | 64 KiB | the console buffer | [`Outcome::console_truncated`] |
//!
//! A zero in [`Limits`] means "use the default", never "unlimited".
//!
//! ## Time and steps
//!
//! QuickJS calls the interrupt handler about every 10 000 backward jumps and calls (and from
//! long regular-expression matches); when it returns true, QuickJS throws an **uncatchable**
//! error, so `try`/`catch`/`finally` in the script cannot swallow a timeout.
//!
//! **Time inside a deployed Cloudflare Worker is frozen while code runs**: `Date.now()` only
//! advances after I/O (<https://developers.cloudflare.com/workers/runtime-apis/performance>;
//! local `wrangler dev`/workerd does advance it).
//! So in production a busy loop never sees the clock move and [`Limits::time`] alone would
//! never stop it.
//! [`Limits::max_steps`] exists for this case: it counts work, not time.
//! The cost of a step depends on the work between interrupt checks; measured in workerd
//! (wasm, release build), per step:
//!
//! | loop body | per step | 1 000 steps |
//! |---|---|---|
//! | `while (true) {}` | 0.02 ms | 0.02 s |
//! | integer arithmetic | 0.55 ms | 0.55 s |
//! | pushing small objects | 2.1 ms | 2.1 s |
//! | `JSON.stringify` + `JSON.parse` of a small object | 12.5 ms | 12.5 s |
//!
//! The default of 1 000 steps keeps these far below a Durable Object's default 30 s CPU limit
//! while allowing about ten million simple loop iterations.
//! Built-ins that loop without polling the interrupt handler and without allocating
//! (`String.prototype.indexOf`, `Array.prototype.reverse`, typed arrays' `fill`, ...) would be
//! one tick however long they run; the base prelude wraps them and charges the budget before
//! they run, by the elements they may visit (a quarter of a million visits per step), and string
//! searches with needles longer than four units run in linear time in Rust instead of QuickJS's
//! naive search. What stays unbounded per step: operators on long strings (`===`, `<`, a long
//! string as a property or `Map` key), which QuickJS evaluates in one bytecode op each.
//!
//! Natively the clock works, so [`Limits::time`] is the effective bound there.
//! Awaiting I/O advances the clock even in production, so [`Limits::time`] still bounds a
//! script waiting on host calls or timers, through [`Clock::sleep`]; steps are only counted
//! while JavaScript runs.
//!
//! ## Memory
//!
//! Every allocation of the runtime goes through a counting allocator (Rust's global allocator
//! underneath) that refuses to exceed [`Limits::memory_bytes`], counting everything in the
//! runtime, preludes included.
//! QuickJS turns a refusal into a catchable `InternalError: out of memory`, or, when it cannot
//! even allocate that error, into `throw null`; the allocator records refusals so both are
//! reported as [`ErrorKind::OutOfMemory`].
//! A script that catches the error and recovers just continues.
//! Strings copied into Rust (console text, host-call arguments, the result) live outside the
//! limit: console text is cut in JavaScript before it is copied, so it costs at most a few
//! times [`Limits::console_bytes`]; host-call arguments and the result are bounded only by
//! the heap limit (the JSON text can be as large as the heap).
//!
//! ## Stack and deep nesting
//!
//! Runaway recursion in JavaScript throws a catchable
//! `RangeError: Maximum call stack size exceeded`, reported as [`ErrorKind::StackOverflow`] if
//! uncaught, and the next run works normally.
//! With 256 KiB a simple recursive function reaches about 900 frames in wasm (release), about
//! 400 natively (release) and only about 80 in a native debug build.
//! On wasm32 the limit must stay below the wasm shadow stack (1 MiB by default): QuickJS's own
//! default is larger, and 0 disables the check so that deep recursion traps the instance.
//!
//! **QuickJS's stack check does not see the host's stack on wasm32.**
//! It measures the shadow stack in linear memory, which recursive C code such as the parser,
//! `JSON.parse` and `JSON.stringify` barely uses, while V8 still spends real stack on every
//! wasm frame.
//! Measured in workerd: about 1 000 nested parentheses in source crash the parser, and
//! 4 000–8 000 levels of JSON crash `JSON.parse`/`JSON.stringify`, with a host
//! `RangeError: Maximum call stack size exceeded` thrown *through* the wasm instance (no Rust
//! destructor runs).
//! The sandbox therefore keeps that code away from deep input:
//!
//! - scripts nesting brackets more than 256 deep are rejected before parsing (a
//!   `SyntaxError` [`ErrorKind::Exception`]);
//! - code generation from strings is disabled, as in Workers themselves: `eval`, `Function`
//!   and the async/generator function constructors throw `EvalError`;
//! - `JSON.parse` rejects text nested more than 512 deep, and `JSON.stringify` values nested
//!   more than 512 deep, with a catchable `RangeError: JSON nested deeper than 512 levels`;
//!   the same guard covers host-call arguments, host results, the completion value (which
//!   then falls back to its string form) and `console` (which prints `"[Deep]"`);
//!   the guarded `JSON.stringify` calls a replacer per value, so it is a few times slower
//!   (2.4 MB of JSON takes about 0.2 s in workerd);
//! - `Array.prototype.flat` flattens at most 512 levels.
//!
//! These guards cover the recursive built-ins found by probing; other deep C recursion in
//! QuickJS, if any, is not guarded.
//!
//! # Wiring a host
//!
//! A host is one dispatch method plus an optional prelude.
//! The prelude is trusted JS evaluated as a global script before the user's script; it builds
//! the script-facing API from `__host.call`.
//!
//! ```
//! use futures::future::FutureExt;
//! use serde_json::{json, Value};
//! use wuhu_sandbox::{Host, HostFuture, FETCH_PRELUDE};
//!
//! struct MyHost {
//!     prelude: String,
//! }
//!
//! impl MyHost {
//!     fn new() -> Self {
//!         let own = r#"
//!             globalThis.wuhu = {
//!                 workspace: {
//!                     read: (path) => __host.call("workspace.read", { path }),
//!                     write: (path, text) => __host.call("workspace.write", { path, text }),
//!                 },
//!             };
//!         "#;
//!         MyHost { prelude: format!("{FETCH_PRELUDE}\n{own}") }
//!     }
//! }
//!
//! impl Host for MyHost {
//!     fn call<'a>(&'a self, name: &str, arg: Value) -> HostFuture<'a> {
//!         match name {
//!             "workspace.read" => async move {
//!                 let path = arg["path"].as_str().ok_or("path must be a string")?;
//!                 Ok(json!(format!("contents of {path}")))
//!             }
//!             .boxed_local(),
//!             // "fetch" => ... see FETCH_PRELUDE for the request and response shapes.
//!             other => {
//!                 let message = format!("unknown host function: {other}");
//!                 async move { Err(message) }.boxed_local()
//!             }
//!         }
//!     }
//!
//!     fn prelude(&self) -> &str {
//!         &self.prelude
//!     }
//! }
//! ```
//!
//! Host futures are `!Send` ([`futures::future::LocalBoxFuture`]) because wasm is
//! single-threaded, and may borrow the host for the duration of the run.
//! Each call's future is polled by [`run`] itself; no executor or spawner is needed.
//! A host call does not have to enforce its own timeout: [`run`] races pending calls against
//! [`Clock::sleep`] of the remaining time and drops them when the time limit passes.
//!
//! # Wiring the clock
//!
//! [`Clock::now_ms`] feeds the interrupt handler; [`Clock::sleep`] backs `setTimeout` and bounds
//! waiting. In a Worker:
//!
//! ```text
//! struct WorkerClock;
//! impl wuhu_sandbox::Clock for WorkerClock {
//!     fn now_ms(&self) -> f64 {
//!         js_sys::Date::now()
//!     }
//!     fn sleep(&self, duration: std::time::Duration) -> futures::future::LocalBoxFuture<'static, ()> {
//!         Box::pin(worker::Delay::from(duration))
//!     }
//! }
//! ```
//!
//! # Building for `wasm32-unknown-unknown`
//!
//! - `rquickjs-sys` compiles QuickJS with a C compiler for the target: install Debian's `clang`
//!   (`apt-get install clang`).
//! - On wasm32 the QuickJS shim imports one host function, `env.__rquickjs_host_now_us`
//!   (microseconds since the Unix epoch as `f64`; it backs `Date.now()` inside scripts).
//!   This crate deliberately does not define it, so that it depends on neither `worker` nor
//!   `js-sys`.
//!   The final wasm binary (the Worker crate) must define it, which removes the import:
//!
//! ```text
//! #[unsafe(no_mangle)]
//! pub extern "C" fn __rquickjs_host_now_us() -> f64 {
//!     js_sys::Date::now() * 1000.0
//! }
//! ```
//!
//! - The stack limit is set on every run ([`Limits::max_stack_bytes`], see above).

#![warn(missing_docs, unreachable_pub)]

mod console;
#[cfg(feature = "engine")]
mod engine;
#[cfg(feature = "engine")]
pub mod guest;
mod host_loop;
#[cfg(feature = "engine")]
mod memory;
#[cfg(feature = "engine")]
mod nesting;
pub mod protocol;
#[cfg(feature = "engine")]
mod search;

use std::{fmt, time::Duration};

use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};

pub use console::{ConsoleLevel, ConsoleLine};
pub use host_loop::{Guest, MAX_PENDING_REQUESTS, crashed, drive_guest};

/// A generic `fetch` prelude: defines `fetch`, `Headers` and `Response` on top of one host
/// function named `"fetch"`.
///
/// Include it in [`Host::prelude`] to give scripts the standard shape:
/// `const r = await fetch(url, {method, headers, body}); r.status; r.headers.get(name);
/// await r.text(); await r.json()`.
///
/// The host function receives
/// `{"url": string, "method": "GET" | ..., "headers": {name: value}, "body": string | null}`
/// (header names lower-cased; a non-string `body` is sent as JSON with
/// `content-type: application/json`) and must resolve to
/// `{"status": number, "statusText"?: string, "headers"?: {name: value} | [[name, value]],
/// "body"?: string, "url"?: string}`.
/// Bodies are text only. An error from the host rejects `fetch`, as a network error would.
pub const FETCH_PRELUDE: &str = include_str!("js/fetch.js");

/// Resource limits for one [`run`].
///
/// A zero in any field means "use the default".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The most memory the QuickJS heap may use, in bytes. Default 32 MiB.
    pub memory_bytes: usize,
    /// The wall-clock budget of the whole run, including time spent awaiting host calls and
    /// timers, as measured by the [`Clock`]. Default 5 s.
    pub time: Duration,
    /// The execution budget, counted in calls of QuickJS's interrupt handler (roughly one per
    /// 10 000 backward jumps or calls). Default 1 000.
    ///
    /// This bounds busy scripts where the clock does not move while code runs (Cloudflare
    /// Workers); see the crate docs.
    pub max_steps: u64,
    /// The most native stack QuickJS may use, in bytes. Default 256 KiB; at most 8 MiB.
    ///
    /// On wasm32 this must stay well below the wasm shadow stack (1 MiB by default).
    pub max_stack_bytes: usize,
    /// The most console output kept, in bytes of UTF-8 text (each line also counts one byte
    /// for its newline). Default 64 KiB.
    pub console_bytes: usize,
}

impl Limits {
    /// The default memory limit: 32 MiB.
    pub const DEFAULT_MEMORY_BYTES: usize = 32 * 1024 * 1024;
    /// The default time limit: 5 s.
    pub const DEFAULT_TIME: Duration = Duration::from_secs(5);
    /// The default execution budget: 1 000 interrupt steps.
    pub const DEFAULT_MAX_STEPS: u64 = 1_000;
    /// The default stack limit: 256 KiB.
    pub const DEFAULT_MAX_STACK_BYTES: usize = 256 * 1024;
    /// The largest accepted stack limit: 8 MiB.
    const MAX_STACK_BYTES_CAP: usize = 8 * 1024 * 1024;
    /// The default console cap: 64 KiB.
    pub const DEFAULT_CONSOLE_BYTES: usize = 64 * 1024;

    /// Replaces zeroes with defaults.
    fn normalized(&self) -> Limits {
        fn or<T: PartialEq + Default>(value: T, default: T) -> T {
            if value == T::default() {
                default
            } else {
                value
            }
        }
        Limits {
            memory_bytes: or(self.memory_bytes, Self::DEFAULT_MEMORY_BYTES),
            time: or(self.time, Self::DEFAULT_TIME),
            max_steps: or(self.max_steps, Self::DEFAULT_MAX_STEPS),
            // rquickjs treats more than 16 MiB as 0, which disables the check.
            max_stack_bytes: or(self.max_stack_bytes, Self::DEFAULT_MAX_STACK_BYTES)
                .min(Self::MAX_STACK_BYTES_CAP),
            console_bytes: or(self.console_bytes, Self::DEFAULT_CONSOLE_BYTES),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: Self::DEFAULT_MEMORY_BYTES,
            time: Self::DEFAULT_TIME,
            max_steps: Self::DEFAULT_MAX_STEPS,
            max_stack_bytes: Self::DEFAULT_MAX_STACK_BYTES,
            console_bytes: Self::DEFAULT_CONSOLE_BYTES,
        }
    }
}

/// The future of one host call: the JSON result, or an error message that becomes a rejected
/// promise (an `Error` with this message) in the script.
pub type HostFuture<'a> = LocalBoxFuture<'a, Result<serde_json::Value, String>>;

/// The embedder's side of the sandbox: the functions a script can call.
///
/// See the crate docs for an example.
pub trait Host {
    /// Starts the host function `name` with the JSON argument `arg`.
    ///
    /// Called when the script calls `__host.call(name, arg)`.
    /// Unknown names should resolve to an error such as `"unknown host function: x"`.
    /// The future is dropped unpolled-to-completion if the run ends first (time limit, script
    /// error).
    fn call<'a>(&'a self, name: &str, arg: serde_json::Value) -> HostFuture<'a>;

    /// Trusted JavaScript evaluated as a global script before the user's script, to define the
    /// script-facing API (for example [`FETCH_PRELUDE`] and a `wuhu` object).
    ///
    /// It runs under all limits, after the base prelude (`console`, timers, `__host`, the JSON
    /// guards) and before the user's script.
    /// An exception in it ends the run with [`ErrorKind::Internal`].
    fn prelude(&self) -> &str {
        ""
    }
}

/// A [`Host`] without functions: every call fails with "unknown host function".
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHost;

impl Host for NoHost {
    fn call<'a>(&'a self, name: &str, _arg: serde_json::Value) -> HostFuture<'a> {
        let message = format!("unknown host function: {name}");
        Box::pin(async move { Err(message) })
    }
}

/// Time, as the embedder sees it.
///
/// Injected because `std::time::Instant` panics on `wasm32-unknown-unknown`.
/// [`StdClock`] implements it natively; a Worker uses `Date.now()` and `worker::Delay`
/// (see the crate docs).
pub trait Clock {
    /// The current time in milliseconds, from any fixed origin. Must not go backwards.
    fn now_ms(&self) -> f64;

    /// A future that completes after `duration`.
    ///
    /// Used for `setTimeout` and to stop waiting on host calls when the time limit passes.
    /// If the embedder has no timer it may return a future that never completes; then
    /// pending host calls are bounded only by their own timeouts.
    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()>;
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub use std_clock::StdClock;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
mod std_clock {
    use std::{
        sync::{Arc, Mutex},
        task::{Poll, Waker},
        time::{Duration, Instant},
    };

    use futures::future::LocalBoxFuture;

    use crate::Clock;

    /// A native [`Clock`]: [`Instant`] for time and a sleeping thread per timer.
    ///
    /// Not available on `wasm32-unknown-unknown`.
    /// Needs no async runtime, so [`run`](crate::run) works under
    /// `futures::executor::block_on`.
    #[derive(Debug, Clone, Copy)]
    pub struct StdClock {
        origin: Instant,
    }

    impl StdClock {
        /// A clock whose origin is now.
        pub fn new() -> Self {
            StdClock {
                origin: Instant::now(),
            }
        }
    }

    impl Default for StdClock {
        fn default() -> Self {
            Self::new()
        }
    }

    #[derive(Default)]
    struct SleepState {
        done: bool,
        waker: Option<Waker>,
    }

    impl Clock for StdClock {
        fn now_ms(&self) -> f64 {
            self.origin.elapsed().as_secs_f64() * 1000.0
        }

        fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()> {
            let state = Arc::new(Mutex::new(SleepState::default()));
            let thread_state = Arc::clone(&state);
            let spawned = std::thread::Builder::new()
                .name("wuhu-sandbox-sleep".into())
                .spawn(move || {
                    std::thread::sleep(duration);
                    let mut state = thread_state.lock().unwrap_or_else(|e| e.into_inner());
                    state.done = true;
                    if let Some(waker) = state.waker.take() {
                        waker.wake();
                    }
                });
            if spawned.is_err() {
                // No thread, no timer: never complete (see `Clock::sleep`).
                return Box::pin(futures::future::pending());
            }
            Box::pin(std::future::poll_fn(move |cx| {
                let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                if state.done {
                    Poll::Ready(())
                } else {
                    state.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }))
        }
    }
}

/// The result of one [`run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The script's completion value as JSON, or why it failed.
    pub result: Result<serde_json::Value, JsError>,
    /// The console lines, in order, up to [`Limits::console_bytes`].
    pub console: Vec<ConsoleLine>,
    /// Whether console output was cut because it exceeded [`Limits::console_bytes`].
    pub console_truncated: bool,
}

impl Outcome {
    /// The console as text, one line per call: `log` lines as written, others prefixed with
    /// their level (`[warn] ...`), and a final `[console output truncated]` line if it was cut.
    pub fn console_text(&self) -> String {
        let mut text = String::new();
        for line in &self.console {
            if line.level != ConsoleLevel::Log {
                text.push('[');
                text.push_str(line.level.as_str());
                text.push_str("] ");
            }
            text.push_str(&line.text);
            text.push('\n');
        }
        if self.console_truncated {
            text.push_str("[console output truncated]\n");
        }
        text
    }
}

/// Why a script failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("{message}")]
pub struct JsError {
    /// The class of failure.
    pub kind: ErrorKind,
    /// A human-readable message, such as `TypeError: x is not a function` or
    /// `script exceeded the 5000 ms time limit`.
    pub message: String,
    /// The JavaScript stack trace, if the error carried one.
    pub stack: Option<String>,
}

/// The class of a [`JsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The script threw (or its completion promise rejected) and did not catch it; this
    /// includes syntax errors.
    Exception,
    /// The script exceeded [`Limits::time`] or [`Limits::max_steps`].
    Timeout,
    /// The script exceeded [`Limits::memory_bytes`].
    OutOfMemory,
    /// The script exceeded [`Limits::max_stack_bytes`] ("Maximum call stack size exceeded").
    StackOverflow,
    /// The completion promise can never settle: nothing is pending that could settle it.
    Unsettled,
    /// The sandbox itself failed (runtime creation, a broken prelude, an engine error).
    Internal,
}

impl ErrorKind {
    /// A short snake_case name, suitable for wire formats: `exception`, `timeout`,
    /// `out_of_memory`, `stack_overflow`, `unsettled`, `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Exception => "exception",
            ErrorKind::Timeout => "timeout",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::StackOverflow => "stack_overflow",
            ErrorKind::Unsettled => "unsettled",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Runs `code` in a fresh QuickJS runtime under `limits` and returns its completion value and
/// console output.
///
/// Host calls go to `host`; time comes from `clock`.
/// Never panics on any input: every failure, including exceeded limits, is an error
/// [`Outcome::result`].
/// The future is `!Send` and needs no particular executor.
///
/// See the crate docs for the completion-value and limit semantics.
#[cfg(feature = "engine")]
pub async fn run(
    code: &str,
    limits: &Limits,
    host: &dyn Host,
    clock: std::rc::Rc<dyn Clock>,
) -> Outcome {
    let limits = limits.normalized();
    let shared = std::rc::Rc::new(engine::Shared::new(&limits));
    let result = engine::drive(code, &limits, host, clock, &shared).await;
    let (console, console_truncated) = shared.take_console();
    Outcome {
        result,
        console,
        console_truncated,
    }
}
