//! One run: a fresh runtime, the natives behind the base prelude, and the loop that drives
//! QuickJS jobs, host calls and timers until the completion value settles.
//!
//! JavaScript never touches a Rust future.
//! Natives only queue a [`Request`] and park the promise's resolve/reject functions in
//! [`Shared::resolvers`]; [`drive`] starts the futures, polls them, and settles the promises.
//! So host futures may borrow the host, and no executor or spawner is needed.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::poll_fn,
    pin::pin,
    rc::Rc,
    task::Poll,
    time::Duration,
};

use futures::{
    FutureExt,
    future::{Either, LocalBoxFuture, select},
};
use rquickjs::{
    Context, Ctx, Exception, FromJs, Function, Object, Persistent, Promise, Runtime, Value,
    context::EvalOptions, convert::Coerced, function::Opt, promise::PromiseState,
};

use crate::{
    Clock, ErrorKind, Host, JsError, Limits,
    console::{ConsoleBuffer, ConsoleLine},
    memory::{LimitedAllocator, MemoryState},
    nesting::{MAX_JSON_DEPTH, MAX_SOURCE_DEPTH, json_depth_exceeds, source_depth},
    search::{Direction, find_utf16},
};

const BASE_PRELUDE: &str = include_str!("js/base.js");

/// State shared by the natives (owned by QuickJS function objects), the interrupt handler and
/// the driver.
pub(crate) struct Shared {
    console: RefCell<ConsoleBuffer>,
    console_limit: usize,
    requests: RefCell<Vec<Request>>,
    resolvers: RefCell<HashMap<u64, Resolvers>>,
    next_id: Cell<u64>,
    stop: Cell<Option<Stop>>,
    memory: Rc<MemoryState>,
    /// The base prelude's depth-guarded `JSON.stringify`.
    stringify: RefCell<Option<Persistent<Function<'static>>>>,
}

impl Shared {
    pub(crate) fn new(limits: &Limits) -> Self {
        let console_bytes = limits.console_bytes;
        Shared {
            console: RefCell::new(ConsoleBuffer::new(console_bytes)),
            console_limit: console_bytes,
            requests: RefCell::new(Vec::new()),
            resolvers: RefCell::new(HashMap::new()),
            next_id: Cell::new(1),
            stop: Cell::new(None),
            memory: Rc::new(MemoryState::new(limits.memory_bytes, limits.max_steps)),
            stringify: RefCell::new(None),
        }
    }

    /// Why the script must stop, if it must: the interrupt handler's verdict, or a work
    /// budget spent by allocation (the allocator refuses from then on).
    fn stop(&self) -> Option<Stop> {
        self.stop
            .get()
            .or_else(|| self.memory.work_spent().then_some(Stop::Steps))
    }

    pub(crate) fn take_console(&self) -> (Vec<ConsoleLine>, bool) {
        self.console.borrow_mut().take()
    }

    /// A promise settled later by the driver: registers its resolvers and queues `request`
    /// (built from the new id).
    fn pending_promise<'js>(
        &self,
        ctx: &Ctx<'js>,
        request: impl FnOnce(u64) -> Request,
    ) -> rquickjs::Result<(u64, Promise<'js>)> {
        let (promise, resolve, reject) = ctx.promise()?;
        let id = self.next_id();
        self.resolvers.borrow_mut().insert(
            id,
            Resolvers {
                resolve: Persistent::save(ctx, resolve),
                reject: Persistent::save(ctx, reject),
            },
        );
        self.requests.borrow_mut().push(request(id));
        Ok((id, promise))
    }

    fn next_id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id.wrapping_add(1));
        id
    }
}

/// Why the interrupt handler stopped the script.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Deadline,
    Steps,
}

struct Resolvers {
    resolve: Persistent<Function<'static>>,
    reject: Persistent<Function<'static>>,
}

enum Request {
    Host {
        id: u64,
        name: String,
        arg: serde_json::Value,
    },
    Sleep {
        id: u64,
        duration: Duration,
    },
    Cancel {
        id: u64,
    },
}

enum OpResult {
    Host(Result<serde_json::Value, String>),
    Timer,
}

struct PendingOp<'h> {
    id: u64,
    future: LocalBoxFuture<'h, OpResult>,
}

/// What the driver waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The promise returned by the async eval; it resolves to `{value}`.
    Eval,
    /// The completion value, which was itself a promise.
    Completion,
}

/// Runs `code` to completion; see the crate docs for the semantics.
pub(crate) async fn drive(
    code: &str,
    limits: &Limits,
    host: &dyn Host,
    clock: Rc<dyn Clock>,
    shared: &Rc<Shared>,
) -> Result<serde_json::Value, JsError> {
    let mut deadline_timer = clock.sleep(limits.time);
    let deadline_ms = clock.now_ms() + limits.time.as_secs_f64() * 1000.0;
    let mut engine = Engine::new(limits, Rc::clone(shared), Rc::clone(&clock), deadline_ms)?;
    engine.eval_prelude(host.prelude())?;
    engine.start(code)?;

    let mut phase = Phase::Eval;
    let mut settled: Option<serde_json::Value> = None;
    let mut pending: Vec<PendingOp<'_>> = Vec::new();
    loop {
        engine.run_jobs()?;
        if settled.is_none() {
            settled = engine.poll_target(&mut phase)?;
            if engine.runtime.is_job_pending() {
                continue;
            }
        }

        let requests = std::mem::take(&mut *shared.requests.borrow_mut());
        for request in requests {
            match request {
                Request::Host { id, name, arg } => pending.push(PendingOp {
                    id,
                    future: host.call(&name, arg).map(OpResult::Host).boxed_local(),
                }),
                Request::Sleep { id, duration } => pending.push(PendingOp {
                    id,
                    future: clock
                        .sleep(duration)
                        .map(|()| OpResult::Timer)
                        .boxed_local(),
                }),
                Request::Cancel { id } => pending.retain(|op| op.id != id),
            }
        }

        if pending.is_empty() {
            return match settled {
                Some(value) => Ok(value),
                None => Err(JsError {
                    kind: ErrorKind::Unsettled,
                    message: "the script's promise never settled: it awaits something that \
                              nothing pending can resolve"
                        .into(),
                    stack: None,
                }),
            };
        }

        let next = poll_fn(|cx| {
            for (index, op) in pending.iter_mut().enumerate() {
                if let Poll::Ready(result) = op.future.as_mut().poll(cx) {
                    return Poll::Ready((index, result));
                }
            }
            Poll::Pending
        });
        let ready = match select(pin!(next), &mut deadline_timer).await {
            Either::Left((ready, _)) => Some(ready),
            Either::Right(((), _)) => None,
        };
        let Some((index, result)) = ready else {
            return Err(engine.stop_error(Stop::Deadline));
        };
        if clock.now_ms() >= deadline_ms {
            return Err(engine.stop_error(Stop::Deadline));
        }
        let op = pending.swap_remove(index);
        engine.deliver(op.id, result)?;
    }
}

/// The QuickJS side of one run.
///
/// Field order matters: JS values held from Rust must be freed before the context and the
/// runtime, or QuickJS aborts on the leak when the runtime is freed.
struct Engine {
    target: Option<Persistent<Promise<'static>>>,
    shared: Rc<Shared>,
    limits: Limits,
    context: Context,
    runtime: Runtime,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The natives own `shared`, and `shared` owns resolve/reject functions: a cycle
        // through Rust that QuickJS's collector cannot see. Break it before the runtime goes.
        self.target = None;
        self.shared.resolvers.borrow_mut().clear();
        self.shared.requests.borrow_mut().clear();
        self.shared.stringify.borrow_mut().take();
    }
}

impl Engine {
    fn new(
        limits: &Limits,
        shared: Rc<Shared>,
        clock: Rc<dyn Clock>,
        deadline_ms: f64,
    ) -> Result<Engine, JsError> {
        let allocator = LimitedAllocator::new(Rc::clone(&shared.memory));
        let runtime = Runtime::new_with_alloc(allocator).map_err(|e| match e {
            rquickjs::Error::Allocation => out_of_memory(limits),
            e => internal(format!("cannot create a runtime: {e}")),
        })?;
        runtime.set_max_stack_size(limits.max_stack_bytes);
        let handler_shared = Rc::clone(&shared);
        runtime.set_interrupt_handler(Some(Box::new(move || {
            if handler_shared.stop().is_some() {
                handler_shared.stop.set(handler_shared.stop());
                return true;
            }
            let stop = if !handler_shared.memory.step() {
                Some(Stop::Steps)
            } else if clock.now_ms() >= deadline_ms {
                Some(Stop::Deadline)
            } else {
                None
            };
            handler_shared.stop.set(stop);
            stop.is_some()
        })));
        let context = Context::full(&runtime).map_err(|e| match e {
            rquickjs::Error::Allocation => out_of_memory(limits),
            e => internal(format!("cannot create a context: {e}")),
        })?;
        let engine = Engine {
            target: None,
            shared,
            limits: limits.clone(),
            context,
            runtime,
        };
        engine.context.with(|ctx| {
            install_natives(&ctx, &engine.shared)
                .map_err(|e| engine.error_from(&ctx, e, "cannot install the base prelude"))
        })?;
        Ok(engine)
    }

    /// Evaluates the host's prelude as a global script.
    fn eval_prelude(&self, prelude: &str) -> Result<(), JsError> {
        if prelude.trim().is_empty() {
            return Ok(());
        }
        self.context.with(|ctx| {
            let mut options = EvalOptions::default();
            options.strict = false;
            options.filename = Some("<prelude>".into());
            ctx.eval_with_options::<Value<'_>, _>(prelude, options)
                .map(drop)
                .map_err(|e| {
                    let mut error = self.error_from(&ctx, e, "invalid prelude");
                    if error.kind == ErrorKind::Exception {
                        error.kind = ErrorKind::Internal;
                        error.message = format!("the host prelude failed: {}", error.message);
                    }
                    error
                })
        })?;
        self.run_jobs()
    }

    /// Starts the user's script; its async-eval promise becomes the target.
    fn start(&mut self, code: &str) -> Result<(), JsError> {
        if source_depth(code) > MAX_SOURCE_DEPTH {
            return Err(JsError {
                kind: ErrorKind::Exception,
                message: format!(
                    "SyntaxError: the script nests brackets more than {MAX_SOURCE_DEPTH} levels deep"
                ),
                stack: None,
            });
        }
        let target = &mut self.target;
        self.context.with(|ctx| {
            let mut options = EvalOptions::default();
            options.strict = false;
            options.promise = true;
            options.backtrace_barrier = true;
            options.filename = Some("<script>".into());
            match ctx.eval_with_options::<Value<'_>, _>(code.as_bytes().to_vec(), options) {
                Ok(value) => match value.into_promise() {
                    Some(promise) => {
                        *target = Some(Persistent::save(&ctx, promise));
                        Ok(())
                    }
                    None => Err(internal("async eval did not return a promise".into())),
                },
                Err(rquickjs::Error::InvalidString(_)) => Err(JsError {
                    kind: ErrorKind::Exception,
                    message: "SyntaxError: the script contains a NUL character".into(),
                    stack: None,
                }),
                Err(e) => Err(classify_error(&ctx, e, &self.shared, &self.limits, "eval")),
            }
        })
    }

    /// Runs queued promise jobs until none is left.
    fn run_jobs(&self) -> Result<(), JsError> {
        loop {
            if let Some(stop) = self.shared.stop() {
                return Err(self.stop_error(stop));
            }
            match self.runtime.execute_pending_job() {
                Ok(true) => {}
                Ok(false) => return Ok(()),
                Err(job) => {
                    let error = job.0.with(|ctx| {
                        let value = ctx.catch();
                        classify_value(&ctx, value, &self.shared, &self.limits)
                    });
                    return Err(self.refine(error));
                }
            }
        }
    }

    /// Checks the target promise; returns the completion value once it has settled.
    fn poll_target(&mut self, phase: &mut Phase) -> Result<Option<serde_json::Value>, JsError> {
        loop {
            let Some(target) = self.target.clone() else {
                return Ok(None);
            };
            let mut next_target = None;
            let result = self.context.with(|ctx| {
                let promise = target
                    .restore(&ctx)
                    .map_err(|e| internal(format!("cannot restore the script's promise: {e}")))?;
                match promise.state() {
                    PromiseState::Pending => Ok(None),
                    PromiseState::Resolved => {
                        let value = match promise.result::<Value<'_>>() {
                            Some(Ok(value)) => value,
                            Some(Err(e)) => return Err(self.error_from(&ctx, e, "result")),
                            None => return Ok(None),
                        };
                        let value = if *phase == Phase::Eval {
                            // The async eval resolves to `{value: <completion value>}`.
                            match value.as_object() {
                                Some(object) => object
                                    .get::<_, Value<'_>>("value")
                                    .map_err(|e| self.error_from(&ctx, e, "result"))?,
                                None => value,
                            }
                        } else {
                            value
                        };
                        if *phase == Phase::Eval
                            && let Some(inner) = value.as_promise()
                        {
                            next_target = Some(Persistent::save(&ctx, inner.clone()));
                            return Ok(None);
                        }
                        to_json(&ctx, value, &self.shared, &self.limits).map(Some)
                    }
                    PromiseState::Rejected => match promise.result::<Value<'_>>() {
                        Some(Err(e)) => Err(self.error_from(&ctx, e, "result")),
                        _ => Err(internal("a rejected promise has no reason".into())),
                    },
                }
            });
            let result = result.map_err(|e| self.refine(e));
            match next_target {
                Some(next) => {
                    self.target = Some(next);
                    *phase = Phase::Completion;
                }
                None => {
                    if !matches!(result, Ok(None)) {
                        self.target = None;
                    }
                    return result;
                }
            }
        }
    }

    /// Settles the promise of a finished host call or timer.
    fn deliver(&self, id: u64, result: OpResult) -> Result<(), JsError> {
        let Some(resolvers) = self.shared.resolvers.borrow_mut().remove(&id) else {
            // Cancelled.
            return Ok(());
        };
        self.context
            .with(|ctx| {
                let settle = || -> rquickjs::Result<()> {
                    let resolve = resolvers.resolve.restore(&ctx)?;
                    let reject = resolvers.reject.restore(&ctx)?;
                    match result {
                        OpResult::Timer => resolve.call::<_, ()>(()),
                        OpResult::Host(Ok(value)) => match json_to_js(&ctx, &value) {
                            Ok(None) => reject.call::<_, ()>((Exception::from_message(
                                ctx.clone(),
                                &format!("host result nested deeper than {MAX_JSON_DEPTH} levels"),
                            )?,)),
                            Ok(Some(value)) => resolve.call::<_, ()>((value,)),
                            Err(rquickjs::Error::Exception) => reject.call::<_, ()>((ctx.catch(),)),
                            Err(e) => reject.call::<_, ()>((Exception::from_message(
                                ctx.clone(),
                                &format!("cannot convert the host result: {e}"),
                            )?,)),
                        },
                        OpResult::Host(Err(message)) => {
                            reject.call::<_, ()>((Exception::from_message(ctx.clone(), &message)?,))
                        }
                    }
                };
                settle().map_err(|e| self.error_from(&ctx, e, "settling a host call"))
            })
            .map_err(|e| self.refine(e))
    }

    fn error_from(&self, ctx: &Ctx<'_>, error: rquickjs::Error, what: &str) -> JsError {
        classify_error(ctx, error, &self.shared, &self.limits, what)
    }

    fn stop_error(&self, stop: Stop) -> JsError {
        stop_error(stop, &self.limits)
    }

    /// Reclassifies an engine failure as out-of-memory once an allocation has been refused.
    fn refine(&self, error: JsError) -> JsError {
        if error.kind == ErrorKind::Internal && self.shared.memory.refused() {
            return out_of_memory(&self.limits);
        }
        error
    }
}

/// Defines the natives and runs the base prelude with them.
fn install_natives<'js>(ctx: &Ctx<'js>, shared: &Rc<Shared>) -> rquickjs::Result<()> {
    let native = Object::new(ctx.clone())?;
    native.set("consoleLimit", shared.console_limit as f64)?;
    native.set("maxJsonDepth", MAX_JSON_DEPTH as f64)?;
    native.set(
        "jsonDepthOk",
        Function::new(ctx.clone(), |text: String| {
            !json_depth_exceeds(&text, MAX_JSON_DEPTH)
        })?,
    )?;

    let s = Rc::clone(shared);
    native.set(
        "console",
        Function::new(ctx.clone(), move |level: String, text: String| {
            s.console.borrow_mut().push(&level, text);
        })?,
    )?;

    let s = Rc::clone(shared);
    native.set(
        "call",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, name: String, json: String| -> rquickjs::Result<Promise<'js>> {
                let arg = serde_json::from_str(&json).map_err(|e| {
                    Exception::throw_type(
                        &ctx,
                        &format!("host call argument cannot be converted to JSON: {e}"),
                    )
                })?;
                let (_, promise) = s.pending_promise(&ctx, |id| Request::Host { id, name, arg })?;
                Ok(promise)
            },
        )?,
    )?;

    let s = Rc::clone(shared);
    native.set(
        "sleep",
        Function::new(
            ctx.clone(),
            move |ctx: Ctx<'js>, ms: Opt<f64>| -> rquickjs::Result<Object<'js>> {
                let ms = ms.0.unwrap_or(0.0);
                // Finite, non-negative and at most about 24 days, so the conversion is exact.
                let ms = if ms.is_finite() {
                    ms.clamp(0.0, 2_147_483_647.0)
                } else {
                    0.0
                };
                let duration = Duration::from_secs_f64(ms / 1000.0);
                let (id, promise) =
                    s.pending_promise(&ctx, |id| Request::Sleep { id, duration })?;
                let timer = Object::new(ctx.clone())?;
                timer.set("id", id as f64)?;
                timer.set("promise", promise)?;
                Ok(timer)
            },
        )?,
    )?;

    // Charges the work budget for a scanning built-in before the base prelude lets it run.
    let s = Rc::clone(shared);
    native.set(
        "work",
        Function::new(ctx.clone(), move |visits: f64| {
            // NaN and negatives charge nothing; anything past u64 saturates.
            let visits = if visits > 0.0 {
                visits.ceil() as u64
            } else {
                0
            };
            let allowed = s.memory.charge_visits(visits);
            if !allowed {
                s.stop.set(Some(Stop::Steps));
            }
            allowed
        })?,
    )?;

    // Linear-time string search in UTF-16 units (see search.rs); -2 when a string is not
    // valid UTF-16 and the prelude must fall back to QuickJS's own search.
    native.set(
        "search",
        Function::new(
            ctx.clone(),
            |text: rquickjs::String<'js>,
             needle: rquickjs::String<'js>,
             position: f64,
             backward: bool| {
                let (Ok(text), Ok(needle)) = (text.to_string(), needle.to_string()) else {
                    return -2.0;
                };
                let direction = if backward {
                    Direction::Backward
                } else {
                    Direction::Forward
                };
                find_utf16(&text, &needle, position, direction).map_or(-1.0, |at| at as f64)
            },
        )?,
    )?;

    let s = Rc::clone(shared);
    native.set(
        "cancel",
        Function::new(ctx.clone(), move |id: f64| {
            if id.is_finite() && id >= 1.0 && id.fract() == 0.0 {
                let id = id as u64;
                // Only timers are cancellable; a host call's id is never handed to JS.
                let removed = s.resolvers.borrow_mut().remove(&id);
                if removed.is_some() {
                    s.requests.borrow_mut().push(Request::Cancel { id });
                }
            }
        })?,
    )?;

    let mut options = EvalOptions::default();
    options.filename = Some("<wuhu-base>".into());
    let prelude: Function<'js> = ctx.eval_with_options(BASE_PRELUDE, options)?;
    let internals: Object<'js> = prelude.call((native,))?;
    let stringify: Function<'js> = internals.get("stringify")?;
    *shared.stringify.borrow_mut() = Some(Persistent::save(ctx, stringify));
    Ok(())
}

/// `JSON.stringify` with the base prelude's depth guard.
fn stringify<'js>(
    ctx: &Ctx<'js>,
    shared: &Shared,
    value: Value<'js>,
) -> rquickjs::Result<Option<String>> {
    let Some(function) = shared.stringify.borrow().clone() else {
        return Ok(None);
    };
    let result: Value<'js> = function.restore(ctx)?.call((value,))?;
    match result.as_string() {
        Some(json) => json.to_string().map(Some),
        None => Ok(None),
    }
}

/// Converts a host result to a JS value with `JSON.parse`; `None` if it nests too deeply.
fn json_to_js<'js>(
    ctx: &Ctx<'js>,
    value: &serde_json::Value,
) -> rquickjs::Result<Option<Value<'js>>> {
    let json = serde_json::to_string(value).map_err(|e| rquickjs::Error::IntoJs {
        from: "serde_json::Value",
        to: "Value",
        message: Some(e.to_string()),
    })?;
    if json_depth_exceeds(&json, MAX_JSON_DEPTH) {
        return Ok(None);
    }
    ctx.json_parse(json).map(Some)
}

/// Converts the completion value to JSON; see the crate docs.
fn to_json<'js>(
    ctx: &Ctx<'js>,
    value: Value<'js>,
    shared: &Shared,
    limits: &Limits,
) -> Result<serde_json::Value, JsError> {
    if value.is_undefined() {
        return Ok(serde_json::Value::Null);
    }
    match stringify(ctx, shared, value.clone()) {
        Ok(Some(json)) => {
            // serde_json stops at 128 levels of nesting; keep deeper values as JSON text.
            Ok(serde_json::from_str(&json).unwrap_or(serde_json::Value::String(json)))
        }
        Ok(None) => Ok(serde_json::Value::String(display_value(ctx, value))),
        Err(rquickjs::Error::Exception) => {
            let thrown = ctx.catch();
            let error = classify_value(ctx, thrown, shared, limits);
            match error.kind {
                ErrorKind::Exception | ErrorKind::StackOverflow => {
                    Ok(serde_json::Value::String(display_value(ctx, value)))
                }
                _ => Err(error),
            }
        }
        Err(e) => Err(classify_error(ctx, e, shared, limits, "result")),
    }
}

/// `String(value)`, or a placeholder; never fails.
fn display_value<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> String {
    if let Some(string) = value.as_string()
        && let Ok(string) = string.to_string()
    {
        return string;
    }
    if value.is_symbol() || value.is_object() {
        // `String(symbol)` works where ToString throws; objects may override `toString`.
        if let Ok(string_fn) = ctx.globals().get::<_, Function<'js>>("String") {
            if let Ok(string) = string_fn.call::<_, String>((value.clone(),)) {
                return string;
            }
            let _ = ctx.catch();
        }
    }
    match Coerced::<String>::from_js(ctx, value) {
        Ok(Coerced(string)) => string,
        Err(_) => {
            let _ = ctx.catch();
            "<value>".into()
        }
    }
}

fn classify_error(
    ctx: &Ctx<'_>,
    error: rquickjs::Error,
    shared: &Shared,
    limits: &Limits,
    what: &str,
) -> JsError {
    if let Some(stop) = shared.stop() {
        return stop_error(stop, limits);
    }
    match error {
        rquickjs::Error::Exception => {
            let value = ctx.catch();
            classify_value(ctx, value, shared, limits)
        }
        rquickjs::Error::Allocation => out_of_memory(limits),
        other => internal(format!("{what}: {other}")),
    }
}

/// Classifies a thrown value.
fn classify_value<'js>(
    ctx: &Ctx<'js>,
    value: Value<'js>,
    shared: &Shared,
    limits: &Limits,
) -> JsError {
    if let Some(stop) = shared.stop() {
        return stop_error(stop, limits);
    }
    if let Some(exception) = value.as_exception() {
        let object = exception.as_object();
        let name = object
            .get::<_, Option<Coerced<String>>>("name")
            .ok()
            .flatten()
            .map(|c| c.0);
        let message = object
            .get::<_, Option<Coerced<String>>>("message")
            .ok()
            .flatten()
            .map(|c| c.0);
        let stack = object
            .get::<_, Option<Coerced<String>>>("stack")
            .ok()
            .flatten()
            .map(|c| c.0)
            .filter(|s| !s.trim().is_empty());
        let _ = ctx.catch();
        let name = name.unwrap_or_else(|| "Error".into());
        let message = message.unwrap_or_default();
        if name == "InternalError" && message == "out of memory" {
            return out_of_memory(limits);
        }
        let kind = if name == "RangeError" && message.contains("Maximum call stack size exceeded") {
            ErrorKind::StackOverflow
        } else {
            ErrorKind::Exception
        };
        let message = if message.is_empty() {
            name
        } else {
            format!("{name}: {message}")
        };
        return JsError {
            kind,
            message,
            stack,
        };
    }
    if (value.is_null() || value.type_of() == rquickjs::Type::Uninitialized)
        && shared.memory.refused()
    {
        // QuickJS throws `null` when it cannot even allocate the `InternalError`.
        return out_of_memory(limits);
    }
    if value.type_of() == rquickjs::Type::Uninitialized {
        return internal("the engine failed without an exception".into());
    }
    JsError {
        kind: ErrorKind::Exception,
        message: format!("Uncaught {}", display_thrown(ctx, shared, value)),
        stack: None,
    }
}

/// A thrown non-`Error` value: strings quoted, objects as JSON.
fn display_thrown<'js>(ctx: &Ctx<'js>, shared: &Shared, value: Value<'js>) -> String {
    if value.is_string() || value.is_object() {
        if let Ok(Some(json)) = stringify(ctx, shared, value.clone()) {
            return json;
        }
        let _ = ctx.catch();
    }
    display_value(ctx, value)
}

fn stop_error(stop: Stop, limits: &Limits) -> JsError {
    let message = match stop {
        Stop::Deadline => {
            format!(
                "script exceeded the {} ms time limit",
                limits.time.as_millis()
            )
        }
        Stop::Steps => format!(
            "script exceeded its execution budget of {} steps (a long or endless loop?)",
            limits.max_steps
        ),
    };
    JsError {
        kind: ErrorKind::Timeout,
        message,
        stack: None,
    }
}

fn out_of_memory(limits: &Limits) -> JsError {
    const MIB: usize = 1024 * 1024;
    let limit = if limits.memory_bytes.is_multiple_of(MIB) {
        format!("{} MiB", limits.memory_bytes / MIB)
    } else {
        format!("{} byte", limits.memory_bytes)
    };
    JsError {
        kind: ErrorKind::OutOfMemory,
        message: format!("script exceeded the {limit} memory limit (out of memory)"),
        stack: None,
    }
}

fn internal(message: String) -> JsError {
    JsError {
        kind: ErrorKind::Internal,
        message,
        stack: None,
    }
}
