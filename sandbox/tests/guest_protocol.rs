//! The guest protocol, natively: a script driven through `drive_guest` and an in-process
//! `GuestSession` (JSON both ways, as with the wasm guest) behaves exactly like `run`; a guest
//! instance that fails becomes a tool error and is never called again.

use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    time::{Duration, Instant},
};

use futures::{FutureExt, executor::block_on};
use serde_json::{Value, json};
use wuhu_sandbox::{
    Clock, ErrorKind, Guest, Host, HostFuture, Limits, MAX_PENDING_REQUESTS, Outcome, StdClock,
    drive_guest,
    guest::GuestSession,
    protocol::{GuestInput, GuestLimits, GuestResume},
    run,
};

/// Host functions with real waiting, recording every call.
struct TestHost {
    calls: RefCell<Vec<String>>,
    clock: StdClock,
}

impl TestHost {
    fn new() -> Self {
        TestHost {
            calls: RefCell::new(Vec::new()),
            clock: StdClock::new(),
        }
    }
}

impl Host for TestHost {
    fn call<'a>(&'a self, name: &str, arg: Value) -> HostFuture<'a> {
        self.calls.borrow_mut().push(name.to_string());
        match name {
            "echo" => async move { Ok(arg) }.boxed_local(),
            "fail" => async move { Err("boom from host".to_string()) }.boxed_local(),
            "never" => futures::future::pending().boxed_local(),
            "slow" => {
                let sleep = self.clock.sleep(Duration::from_millis(30));
                async move {
                    sleep.await;
                    Ok(json!({"slept": arg}))
                }
                .boxed_local()
            }
            other => {
                let message = format!("unknown host function: {other}");
                async move { Err(message) }.boxed_local()
            }
        }
    }

    fn prelude(&self) -> &str {
        "globalThis.echo = (x) => __host.call('echo', x);"
    }
}

/// A guest in this process, behind the same JSON messages as the wasm guest.
#[derive(Default)]
struct InProcess {
    session: Option<GuestSession>,
    calls: usize,
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

impl Guest for InProcess {
    fn start(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.calls += 1;
        let input: GuestInput = serde_json::from_slice(input).map_err(|e| e.to_string())?;
        let (session, step) = GuestSession::start(input, Box::new(now_ms));
        self.session = Some(session);
        serde_json::to_vec(&step).map_err(|e| e.to_string())
    }

    fn resume(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.calls += 1;
        let resume: GuestResume = serde_json::from_slice(input).map_err(|e| e.to_string())?;
        let step = self
            .session
            .as_mut()
            .expect("started")
            .resume(resume.results);
        serde_json::to_vec(&step).map_err(|e| e.to_string())
    }
}

fn input(code: &str, host: &TestHost, limits: &Limits) -> GuestInput {
    GuestInput {
        code: code.to_string(),
        prelude: host.prelude().to_string(),
        limits: GuestLimits::from(limits),
    }
}

fn through_guest(code: &str, limits: &Limits) -> (Outcome, usize) {
    let host = TestHost::new();
    let mut guest = InProcess::default();
    let outcome = block_on(drive_guest(
        &mut guest,
        &input(code, &host, limits),
        &host,
        &StdClock::new(),
    ));
    (outcome, guest.calls)
}

fn directly(code: &str, limits: &Limits) -> Outcome {
    let host = TestHost::new();
    block_on(run(code, limits, &host, Rc::new(StdClock::new())))
}

#[test]
fn a_guest_run_equals_a_direct_run() {
    let scripts = [
        "1 + 1",
        "console.log('hi'); console.warn({a: 1}); [1, 2, 3].map((x) => x * 2)",
        "await echo({x: [1, 2]})",
        "const [a, b] = await Promise.all([__host.call('slow', 1), echo(2)]); [a, b]",
        "try { await __host.call('fail') } catch (e) { 'caught ' + e.message }",
        "await __host.call('fail')",
        "__host.call('slow', 'late').then((r) => console.log(r.slept)); 'first'",
        "await new Promise((r) => setTimeout(() => r('timer'), 20))",
        "const t = setTimeout(() => console.log('never'), 60000); clearTimeout(t); await __host.call('slow', 2)",
        "setTimeout(() => { throw new Error('in timer') }, 0); 1",
        "await new Promise(() => {})",
        "throw new TypeError('bad')",
        "function f(n) { return f(n + 1) + 1 } f(0)",
        "syntax error here",
        "for (;;) {}",
    ];
    let limits = Limits {
        time: Duration::from_millis(800),
        ..Limits::default()
    };
    for code in scripts {
        let want = directly(code, &limits);
        let (got, _) = through_guest(code, &limits);
        assert_eq!(got, want, "{code}");
    }
}

#[test]
fn a_host_call_that_never_ends_times_out_in_the_guest() {
    let limits = Limits {
        time: Duration::from_millis(200),
        ..Limits::default()
    };
    let started = Instant::now();
    let (outcome, _) = through_guest("await __host.call('never')", &limits);
    assert_eq!(outcome.result.unwrap_err().kind, ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[test]
fn a_cancelled_timer_is_not_waited_for() {
    // If the embedder kept the cancelled 60 s timer, the run would still end on the host call,
    // but the guest would be resumed for a timer it dropped; the run's length shows neither.
    let started = Instant::now();
    let (outcome, calls) = through_guest(
        "const t = setTimeout(() => {}, 60000); clearTimeout(t); await __host.call('slow', 1)",
        &Limits::default(),
    );
    assert_eq!(outcome.result, Ok(json!({"slept": 1})));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(calls, 2, "start, then one resume with the host result");
}

#[test]
fn too_many_pending_requests_end_the_run() {
    let code = format!(
        "for (let i = 0; i <= {MAX_PENDING_REQUESTS}; i++) setTimeout(() => {{}}, 1000); 1"
    );
    let (outcome, _) = through_guest(&code, &Limits::default());
    let error = outcome.result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Exception);
    assert!(error.message.contains("pending"), "{}", error.message);
    // The guest's own deadline timer is one of the pending requests.
    let (outcome, _) = through_guest(
        &format!("for (let i = 1; i < {MAX_PENDING_REQUESTS}; i++) setTimeout(() => {{}}, 0); 1"),
        &Limits::default(),
    );
    assert_eq!(outcome.result, Ok(json!(1)));
}

/// A guest whose instance fails at a chosen call.
struct Failing {
    inner: InProcess,
    fail_at: usize,
    message: &'static str,
    calls_after_failure: Rc<Cell<usize>>,
    failed: bool,
}

impl Failing {
    fn call(
        &mut self,
        f: impl FnOnce(&mut InProcess) -> Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>, String> {
        if self.failed {
            self.calls_after_failure
                .set(self.calls_after_failure.get() + 1);
        }
        if self.inner.calls + 1 == self.fail_at {
            self.failed = true;
            self.inner.calls += 1;
            return Err(self.message.to_string());
        }
        f(&mut self.inner)
    }
}

impl Guest for Failing {
    fn start(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.call(|g| g.start(input))
    }
    fn resume(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.call(|g| g.resume(input))
    }
}

#[test]
fn a_failed_instance_is_a_tool_error_and_is_not_called_again() {
    let cases = [
        (
            1,
            "RangeError: Maximum call stack size exceeded",
            ErrorKind::StackOverflow,
        ),
        (
            2,
            "RangeError: Maximum call stack size exceeded",
            ErrorKind::StackOverflow,
        ),
        (2, "RuntimeError: unreachable", ErrorKind::Internal),
    ];
    for (fail_at, message, kind) in cases {
        let host = TestHost::new();
        let after = Rc::new(Cell::new(0));
        let mut guest = Failing {
            inner: InProcess::default(),
            fail_at,
            message,
            calls_after_failure: Rc::clone(&after),
            failed: false,
        };
        let outcome = block_on(drive_guest(
            &mut guest,
            &input("await echo(1); await echo(2); 3", &host, &Limits::default()),
            &host,
            &StdClock::new(),
        ));
        let error = outcome.result.unwrap_err();
        assert_eq!(error.kind, kind, "{error:?}");
        assert!(error.message.contains(message), "{}", error.message);
        assert_eq!(after.get(), 0, "the failed instance was called again");
    }
}

#[test]
fn a_malformed_answer_is_an_internal_error() {
    struct Garbage;
    impl Guest for Garbage {
        fn start(&mut self, _: &[u8]) -> Result<Vec<u8>, String> {
            Ok(b"{\"state\": \"sideways\"}".to_vec())
        }
        fn resume(&mut self, _: &[u8]) -> Result<Vec<u8>, String> {
            unreachable!()
        }
    }
    let host = TestHost::new();
    let outcome = block_on(drive_guest(
        &mut Garbage,
        &input("1", &host, &Limits::default()),
        &host,
        &StdClock::new(),
    ));
    assert_eq!(outcome.result.unwrap_err().kind, ErrorKind::Internal);
}
