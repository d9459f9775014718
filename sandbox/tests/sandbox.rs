//! Behaviour of `wuhu_sandbox::run` on the native target.

use std::{
    cell::RefCell,
    rc::Rc,
    time::{Duration, Instant},
};

use futures::{FutureExt, executor::block_on};
use serde_json::{Value, json};
use wuhu_sandbox::{
    Clock, ConsoleLevel, ConsoleLine, ErrorKind, FETCH_PRELUDE, Host, HostFuture, JsError, Limits,
    NoHost, Outcome, StdClock, run,
};

/// A host with a few test functions; records the calls it receives.
struct TestHost {
    prelude: String,
    calls: RefCell<Vec<(String, Value)>>,
    clock: StdClock,
}

impl TestHost {
    fn new() -> Self {
        Self::with_prelude("")
    }

    fn with_prelude(prelude: &str) -> Self {
        TestHost {
            prelude: prelude.to_string(),
            calls: RefCell::new(Vec::new()),
            clock: StdClock::new(),
        }
    }
}

impl Host for TestHost {
    fn call<'a>(&'a self, name: &str, arg: Value) -> HostFuture<'a> {
        self.calls
            .borrow_mut()
            .push((name.to_string(), arg.clone()));
        match name {
            "echo" => async move { Ok(arg) }.boxed_local(),
            "fail" => async move { Err("boom from host".to_string()) }.boxed_local(),
            "never" => futures::future::pending().boxed_local(),
            "slow" => {
                let sleep = self.clock.sleep(Duration::from_millis(30));
                async move {
                    sleep.await;
                    Ok(json!({"slept": true, "arg": arg}))
                }
                .boxed_local()
            }
            "fetch" => async move {
                Ok(json!({
                    "status": 201,
                    "statusText": "Created",
                    "headers": {"Content-Type": "application/json"},
                    "body": serde_json::to_string(&json!({"request": arg})).unwrap(),
                }))
            }
            .boxed_local(),
            other => {
                let message = format!("unknown host function: {other}");
                async move { Err(message) }.boxed_local()
            }
        }
    }

    fn prelude(&self) -> &str {
        &self.prelude
    }
}

fn run_with(code: &str, limits: &Limits, host: &dyn Host) -> Outcome {
    block_on(run(code, limits, host, Rc::new(StdClock::new())))
}

fn eval(code: &str) -> Outcome {
    run_with(code, &Limits::default(), &TestHost::new())
}

fn value(code: &str) -> Value {
    let outcome = eval(code);
    match outcome.result {
        Ok(value) => value,
        Err(ref error) => panic!(
            "{code:?} failed: {error:?}\nconsole: {}",
            outcome.console_text()
        ),
    }
}

fn failure(code: &str, limits: &Limits) -> JsError {
    match run_with(code, limits, &TestHost::new()).result {
        Ok(value) => panic!("{code:?} succeeded with {value}"),
        Err(error) => error,
    }
}

fn line(level: ConsoleLevel, text: &str) -> ConsoleLine {
    ConsoleLine {
        level,
        text: text.to_string(),
    }
}

#[test]
fn completion_values() {
    assert_eq!(value("1+1"), json!(2));
    assert_eq!(value("const x = 3; x * 2"), json!(6));
    assert_eq!(value("let s = 'a'; s += 'b'; s"), json!("ab"));
    assert_eq!(
        value("({a: 1, b: [true, null, 'x'], c: {d: 1.5}})"),
        json!({"a": 1, "b": [true, null, "x"], "c": {"d": 1.5}})
    );
    assert_eq!(value("if (true) { 'then' } else { 'else' }"), json!("then"));
    assert_eq!(value("var declared = 1"), Value::Null);
    assert_eq!(value("undefined"), Value::Null);
    assert_eq!(value(""), Value::Null);
    assert_eq!(
        value("new Date(0).toISOString()"),
        json!("1970-01-01T00:00:00.000Z")
    );
}

#[test]
fn values_json_cannot_encode_become_strings() {
    assert_eq!(value("(function named() {})"), json!("function named() {}"));
    assert_eq!(value("Symbol('s')"), json!("Symbol(s)"));
    assert_eq!(value("10n"), json!("10"));
    assert_eq!(
        value("const o = {}; o.self = o; o"),
        json!("[object Object]")
    );
    assert_eq!(value("NaN"), Value::Null);
}

#[test]
fn promises_and_top_level_await() {
    assert_eq!(value("Promise.resolve(5)"), json!(5));
    assert_eq!(
        value("const v = await Promise.resolve(41); v + 1"),
        json!(42)
    );
    assert_eq!(
        value("async function f(x) { await null; return x * 2 } await f(21)"),
        json!(42)
    );
    assert_eq!(value("(async () => ({ok: true}))()"), json!({"ok": true}));
    assert_eq!(
        value("await new Promise((resolve) => setTimeout(resolve, 20, 'timer'))"),
        json!("timer")
    );
}

#[test]
fn console_capture_and_formatting() {
    let outcome = eval(
        "console.log('plain', 1, {a: [1, 'x']}, null, undefined);
         console.info('info');
         console.warn('warn', true);
         console.error(new TypeError('bad'));
         console.debug(10n, Symbol('s'), function f() {});
         const c = {name: 'c'}; c.self = c; console.log(c, new Map([['k', 1]]), new Set([1]));
         'done'",
    );
    assert_eq!(outcome.result, Ok(json!("done")));
    assert!(!outcome.console_truncated);
    assert_eq!(outcome.console.len(), 6, "{:#?}", outcome.console);
    assert_eq!(
        outcome.console[0],
        line(ConsoleLevel::Log, r#"plain 1 {"a":[1,"x"]} null undefined"#)
    );
    assert_eq!(outcome.console[1], line(ConsoleLevel::Info, "info"));
    assert_eq!(outcome.console[2], line(ConsoleLevel::Warn, "warn true"));
    assert_eq!(outcome.console[3].level, ConsoleLevel::Error);
    assert!(
        outcome.console[3].text.starts_with("TypeError: bad\n"),
        "{:?}",
        outcome.console[3]
    );
    assert_eq!(
        outcome.console[4],
        line(ConsoleLevel::Debug, "10n Symbol(s) [Function: f]")
    );
    assert_eq!(
        outcome.console[5],
        line(
            ConsoleLevel::Log,
            r#"{"name":"c","self":"[Circular]"} {"k":1} [1]"#
        )
    );
    assert!(outcome.console_text().starts_with("plain 1"));
    assert!(outcome.console_text().contains("\n[warn] warn true\n"));
}

#[test]
fn console_is_capped() {
    let limits = Limits {
        console_bytes: 100,
        ..Limits::default()
    };
    let outcome = run_with(
        "for (let i = 0; i < 1000; i++) console.log('line', i); console.log('x'.repeat(1e6)); 'ok'",
        &limits,
        &NoHost,
    );
    assert_eq!(outcome.result, Ok(json!("ok")));
    assert!(outcome.console_truncated);
    let total: usize = outcome.console.iter().map(|l| l.text.len() + 1).sum();
    assert!(total <= 100, "{total}");
    assert_eq!(outcome.console[0], line(ConsoleLevel::Log, "line 0"));
    assert!(
        outcome
            .console_text()
            .ends_with("[console output truncated]\n")
    );

    // One huge line is cut, not dropped.
    let outcome = run_with("console.log('y'.repeat(1e6))", &limits, &NoHost);
    assert!(outcome.console_truncated);
    assert_eq!(
        outcome.console,
        vec![line(ConsoleLevel::Log, &"y".repeat(99))]
    );
}

#[test]
fn an_infinite_loop_times_out_promptly() {
    let limits = Limits {
        time: Duration::from_millis(200),
        max_steps: u64::MAX,
        ..Limits::default()
    };
    let started = Instant::now();
    let error = failure("while (true) {}", &limits);
    let elapsed = started.elapsed();
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert_eq!(error.message, "script exceeded the 200 ms time limit");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
}

#[test]
fn default_limits_stop_a_busy_loop_by_steps() {
    let started = Instant::now();
    let error = failure(
        "let i = 0; while (true) { i = (i * 31 + 7) % 1000003 }",
        &Limits::default(),
    );
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(
        error.message.contains("execution budget of 1000 steps"),
        "{}",
        error.message
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_timeout_cannot_be_caught() {
    let limits = Limits {
        time: Duration::from_millis(100),
        ..Limits::default()
    };
    let error = failure(
        "let n = 0;
         for (;;) { try { while (true) {} } catch (e) { n++ } finally { n++ } }",
        &limits,
    );
    assert_eq!(error.kind, ErrorKind::Timeout);
}

#[test]
fn an_async_loop_times_out() {
    let limits = Limits {
        time: Duration::from_millis(100),
        ..Limits::default()
    };
    let error = failure("while (true) { await null }", &limits);
    assert_eq!(error.kind, ErrorKind::Timeout);
}

#[test]
fn the_step_budget_stops_a_loop_even_if_the_clock_stands_still() {
    let limits = Limits {
        max_steps: 50,
        ..Limits::default()
    };
    let started = Instant::now();
    let outcome = block_on(run(
        "while (true) {}",
        &limits,
        &NoHost,
        Rc::new(FrozenClock),
    ));
    let error = outcome.result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(
        error.message.contains("execution budget of 50 steps"),
        "{}",
        error.message
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// A clock frozen while code runs, like `Date.now()` inside a Cloudflare Worker.
struct FrozenClock;

impl Clock for FrozenClock {
    fn now_ms(&self) -> f64 {
        0.0
    }
    fn sleep(&self, _: Duration) -> futures::future::LocalBoxFuture<'static, ()> {
        futures::future::pending().boxed_local()
    }
}

#[test]
fn allocation_counts_against_the_work_budget() {
    // Each iteration is one cheap tick but allocates and fills a megabyte: without charging
    // allocation, 1 000 steps of this would be ten million megabytes of work.
    let scripts = [
        "for (;;) 'x'.repeat(1000000).length",
        "const a = new Array(100000).fill('abc'); for (;;) a.join(',').length",
        // Catching the refusals does not help: the next interrupt check ends the run.
        "for (;;) { try { 'x'.repeat(1000000) } catch (e) {} }",
    ];
    let limits = Limits {
        max_steps: 1000,
        ..Limits::default()
    };
    for code in scripts {
        let started = Instant::now();
        let outcome = block_on(run(code, &limits, &NoHost, Rc::new(FrozenClock)));
        let error = outcome.result.unwrap_err();
        assert_eq!(error.kind, ErrorKind::Timeout, "{code}: {error:?}");
        assert!(
            error.message.contains("execution budget of 1000 steps"),
            "{code}: {}",
            error.message
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{code}: {:?}",
            started.elapsed()
        );
    }
    // Ordinary scripts that allocate a few megabytes are far from the budget.
    let outcome = block_on(run(
        "const rows = []; for (let i = 0; i < 20000; i++) rows.push({i, s: 'row ' + i}); JSON.stringify(rows).length",
        &limits,
        &NoHost,
        Rc::new(FrozenClock),
    ));
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
}

/// A clock that moves, with a limit far above what these scripts may take, so a script that
/// escapes the work budget fails the test by its deadline instead of hanging it.
fn budget_failure(code: &str) -> (JsError, Duration) {
    let limits = Limits {
        max_steps: 200,
        time: Duration::from_secs(60),
        ..Limits::default()
    };
    let started = Instant::now();
    let outcome = block_on(run(code, &limits, &NoHost, Rc::new(StdClock::new())));
    let error = outcome.result.unwrap_err();
    (error, started.elapsed())
}

#[test]
fn scanning_built_ins_count_against_the_work_budget() {
    // Each is one interrupt tick per call however long the scan: without charging, a loop of
    // them runs for minutes inside a handful of steps.
    let scripts = [
        "const s = 'a'.repeat(1 << 20); for (;;) s.indexOf('b')",
        "const s = 'a'.repeat(1 << 20); for (;;) s.lastIndexOf('b', 1e9)",
        "const s = 'a'.repeat(1 << 20); for (;;) s.includes('b')",
        "const s = 'a'.repeat(1 << 20); for (;;) s.split('b').length",
        "const s = 'a'.repeat(1 << 20); for (;;) s.replaceAll('b', 'c').length",
        "const s = 'a'.repeat(1 << 20); for (;;) s.isWellFormed()",
        // The naive search's worst case, and a lone surrogate forcing the fallback.
        "const s = 'a'.repeat(1 << 18); const n = 'a'.repeat(1 << 16) + 'b'; for (;;) s.indexOf(n)",
        "const s = '\\ud800' + 'a'.repeat(1 << 18); const n = 'a'.repeat(1 << 16) + 'b'; for (;;) s.indexOf(n)",
        "const a = new Array(1 << 20).fill(0); for (;;) a.reverse()",
        "const a = []; a.length = 2 ** 32 - 1; a.reverse()",
        "const a = []; a.length = 2 ** 32 - 1; a.join('').length",
        "const a = []; a.length = 2 ** 32 - 1; [].concat(a).length",
        "const a = new Array(1 << 20).fill(0); for (;;) { a.unshift(1); a.shift() }",
        "const u = new Uint8Array(1 << 24); for (;;) u.indexOf(1)",
        "const u = new Uint8Array(1 << 24); for (;;) u.fill(1)",
        "const u = new Uint8Array(1 << 22); for (;;) u.sort()",
        "const u = new Uint8Array(1 << 23); const v = new Uint8Array(1 << 23); for (;;) u.set(v)",
        // Replacing what the wrappers use does not make them cheaper.
        "Math.max = () => 0; Math.trunc = () => 0; Reflect.apply = (f, t, a) => 0; const s = 'a'.repeat(1 << 20); for (;;) s.indexOf('b')",
        "const s = 'a'.repeat(1 << 20); const indexOf = String.prototype.indexOf; for (;;) indexOf.call(s, 'b')",
    ];
    for code in scripts {
        let (error, elapsed) = budget_failure(code);
        assert_eq!(error.kind, ErrorKind::Timeout, "{code}: {error:?}");
        assert!(
            error.message.contains("execution budget of 200 steps"),
            "{code}: {}",
            error.message
        );
        assert!(elapsed < Duration::from_secs(10), "{code}: {elapsed:?}");
    }
}

#[test]
fn wrapped_built_ins_keep_their_meaning() {
    let cases = [
        ("'hello'.indexOf('l')", json!(2)),
        ("'hello'.indexOf('l', 3)", json!(3)),
        ("'hello'.indexOf('l', {valueOf() { return 4 }})", json!(-1)),
        ("'hello'.indexOf('')", json!(0)),
        ("'hello'.indexOf('', 99)", json!(5)),
        ("'hello'.lastIndexOf('l')", json!(3)),
        ("'hello'.lastIndexOf('l', 2)", json!(2)),
        ("'hello'.lastIndexOf('l', NaN)", json!(3)),
        ("'hello'.lastIndexOf('l', undefined)", json!(3)),
        ("'a😀b😀c'.indexOf('😀', 2)", json!(4)),
        ("'a😀b😀c'.lastIndexOf('😀', 3)", json!(1)),
        ("'\\ud800abc'.indexOf('b')", json!(2)),
        ("'\\ud800abc'.lastIndexOf('\\ud800')", json!(0)),
        // Needles longer than four units take the linear search.
        ("'xx hello world hello'.indexOf('hello', 4)", json!(15)),
        ("'xx hello world hello'.lastIndexOf('hello', 14)", json!(3)),
        ("'xx hello world hello'.lastIndexOf('hello')", json!(15)),
        ("'a😀😀😀b😀😀😀'.indexOf('😀😀😀', 2)", json!(8)),
        ("'a😀😀😀b😀😀😀'.lastIndexOf('😀😀😀', 7)", json!(1)),
        ("'xx hello'.includes('hello', -5)", json!(true)),
        ("'\\ud800 hello'.indexOf('hello')", json!(2)),
        ("'hello'.includes('ell')", json!(true)),
        ("'hello'.includes('ell', 2)", json!(false)),
        (
            "try { 'a'.includes(/a/) } catch (e) { e.name }",
            json!("TypeError"),
        ),
        ("String.prototype.indexOf.call(12345, 34)", json!(2)),
        (
            "try { String.prototype.indexOf.call(null, 'a') } catch (e) { e.name }",
            json!("TypeError"),
        ),
        ("'a,b,c'.split(',')", json!(["a", "b", "c"])),
        ("'a1b2'.split(/\\d/)", json!(["a", "b", ""])),
        ("'aaa'.replace('a', 'b')", json!("baa")),
        ("'aaa'.replaceAll('a', (m, i) => i)", json!("012")),
        ("'a-b'.replace(/-/, '+')", json!("a+b")),
        ("[1, 2, 3].reverse()", json!([3, 2, 1])),
        ("[1, 2, 3].join('-')", json!("1-2-3")),
        ("String([1, [2, 3]])", json!("1,2,3")),
        ("[1, 2, 3, 4].slice(-2)", json!([3, 4])),
        ("const a = [1, 2, 3]; a.splice(1, 1); a", json!([1, 3])),
        (
            "const a = [1, 2]; a.unshift(0); a.shift(); a",
            json!([1, 2]),
        ),
        ("[1].concat([2], 3)", json!([1, 2, 3])),
        ("new Array(3).fill(7)", json!([7, 7, 7])),
        ("[1, 2, 3, 4, 5].copyWithin(0, 3)", json!([4, 5, 3, 4, 5])),
        (
            "Array.from(new Uint8Array([3, 1, 2]).sort())",
            json!([1, 2, 3]),
        ),
        ("new Uint8Array([1, 2, 3]).indexOf(2)", json!(1)),
        ("new Uint8Array([1, 2, 3]).includes(4)", json!(false)),
        (
            "const u = new Uint8Array(4); u.set([1, 2], 1); Array.from(u)",
            json!([0, 1, 2, 0]),
        ),
        (
            "try { Uint8Array.prototype.fill.call([], 1) } catch (e) { e.name }",
            json!("TypeError"),
        ),
        (
            "String.prototype.indexOf.name + String.prototype.indexOf.length",
            json!("indexOf1"),
        ),
    ];
    for (code, expected) in cases {
        assert_eq!(value(code), expected, "{code}");
    }
}

/// Ordinary scripts over a few megabytes of text stay far inside the budget.
#[test]
fn ordinary_searches_are_cheap() {
    let limits = Limits {
        max_steps: 1000,
        ..Limits::default()
    };
    let code = "const text = ('lorem ipsum dolor sit amet ' + 'x'.repeat(70) + '\\n').repeat(10000); \
        let hits = 0; \
        for (let i = 0; i < 50; i++) hits += text.indexOf('dolor sit amet consectetur') >= 0 ? 1 : 0; \
        for (const line of text.split('\\n').slice(0, 2000)) if (line.includes('ipsum')) hits++; \
        hits";
    let outcome = block_on(run(code, &limits, &NoHost, Rc::new(FrozenClock)));
    assert_eq!(outcome.result.map_err(|e| e.message), Ok(json!(2000)));
}

#[test]
fn a_memory_bomb_runs_out_of_memory() {
    let limits = Limits {
        memory_bytes: 4 * 1024 * 1024,
        ..Limits::default()
    };
    let error = failure(
        "const a = []; while (true) a.push('x'.repeat(1000) + a.length)",
        &limits,
    );
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{error:?}");
    assert_eq!(
        error.message,
        "script exceeded the 4 MiB memory limit (out of memory)"
    );

    let error = failure(
        "const b = []; while (true) b.push(new Uint8Array(1 << 20))",
        &limits,
    );
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{error:?}");

    let error = failure(
        "await null; const a = []; while (true) a.push({i: a.length})",
        &limits,
    );
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{error:?}");

    // The default limit applies too.
    let error = failure(
        "const a = []; while (true) a.push(new Array(10000).fill(1))",
        &Limits::default(),
    );
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{error:?}");
}

#[test]
fn a_caught_out_of_memory_error_does_not_fail_the_run() {
    let limits = Limits {
        memory_bytes: 4 * 1024 * 1024,
        ..Limits::default()
    };
    let outcome = run_with(
        "let a = []; try { while (true) a.push('x'.repeat(1000)) } catch (e) { a = null; 'recovered' }",
        &limits,
        &NoHost,
    );
    assert_eq!(outcome.result, Ok(json!("recovered")));
}

#[test]
fn runaway_recursion_is_a_stack_overflow_and_the_next_run_works() {
    let error = failure("function f() { return f() } f()", &Limits::default());
    assert_eq!(error.kind, ErrorKind::StackOverflow);
    assert_eq!(
        error.message,
        "RangeError: Maximum call stack size exceeded"
    );

    // Catchable inside the script.
    assert_eq!(
        value(
            "function g(n) { return g(n + 1) + 1 } try { g(0) } catch (e) { e instanceof RangeError }"
        ),
        json!(true)
    );
    assert_eq!(value("1+1"), json!(2));
    // Moderate recursion is fine. With 256 KiB a simple function recurses about 400 deep in a
    // release build, but only about 80 deep in a debug build (QuickJS at -O0 has big frames).
    assert_eq!(
        value("function depth(n) { return n === 0 ? 0 : 1 + depth(n - 1) } depth(50)"),
        json!(50)
    );
}

#[test]
fn thrown_errors_carry_message_and_stack() {
    let error = failure(
        "function inner() { throw new Error('boom') }\nfunction outer() { inner() }\nouter()",
        &Limits::default(),
    );
    assert_eq!(error.kind, ErrorKind::Exception);
    assert_eq!(error.message, "Error: boom");
    let stack = error.stack.expect("a stack");
    assert!(stack.contains("inner"), "{stack}");
    assert!(stack.contains("outer"), "{stack}");
    assert!(stack.contains("<script>:1"), "{stack}");

    let error = failure("null.x", &Limits::default());
    assert_eq!(error.kind, ErrorKind::Exception);
    assert!(
        error.message.starts_with("TypeError: "),
        "{}",
        error.message
    );

    let error = failure(
        "await Promise.reject(new RangeError('later'))",
        &Limits::default(),
    );
    assert_eq!(error.message, "RangeError: later");

    let error = failure("throw 'a string'", &Limits::default());
    assert_eq!(error.message, r#"Uncaught "a string""#);
    let error = failure("throw {code: 7}", &Limits::default());
    assert_eq!(error.message, r#"Uncaught {"code":7}"#);
    let error = failure("Promise.reject(undefined)", &Limits::default());
    assert_eq!(error.message, "Uncaught undefined");
}

#[test]
fn syntax_errors_are_exceptions() {
    let error = failure("let = ;", &Limits::default());
    assert_eq!(error.kind, ErrorKind::Exception);
    assert!(
        error.message.starts_with("SyntaxError"),
        "{}",
        error.message
    );

    let error = failure("1\0", &Limits::default());
    assert_eq!(error.kind, ErrorKind::Exception);
    assert!(
        error.message.starts_with("SyntaxError"),
        "{}",
        error.message
    );
}

#[test]
fn async_host_calls() {
    let host = TestHost::new();
    let outcome = run_with(
        "const a = await __host.call('echo', {x: [1, 2]});
         const b = await __host.call('slow', 'arg');
         const [c, d] = await Promise.all([__host.call('echo', 1), __host.call('echo')]);
         ({a, b, c, d})",
        &Limits::default(),
        &host,
    );
    assert_eq!(
        outcome.result,
        Ok(json!({"a": {"x": [1, 2]}, "b": {"slept": true, "arg": "arg"}, "c": 1, "d": null}))
    );
    assert_eq!(host.calls.borrow().len(), 4);
}

#[test]
fn host_errors_are_catchable_exceptions() {
    assert_eq!(
        value(
            "try { await __host.call('fail', {}); 'no error' }
             catch (e) { [e instanceof Error, e.message] }"
        ),
        json!([true, "boom from host"])
    );
    assert_eq!(
        value("await __host.call('fail').catch((e) => 'caught: ' + e.message)"),
        json!("caught: boom from host")
    );
    let error = failure("await __host.call('nope')", &Limits::default());
    assert_eq!(error.kind, ErrorKind::Exception);
    assert_eq!(error.message, "Error: unknown host function: nope");

    // An argument JSON cannot encode is a TypeError in the script.
    let error = failure("__host.call('echo', 1n)", &Limits::default());
    assert!(error.message.starts_with("TypeError"), "{}", error.message);
}

#[test]
fn a_never_ending_host_call_times_out() {
    let limits = Limits {
        time: Duration::from_millis(200),
        ..Limits::default()
    };
    let started = Instant::now();
    let error = failure("await __host.call('never')", &limits);
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[test]
fn pending_work_is_drained_after_the_value_settles() {
    let host = TestHost::new();
    let outcome = run_with(
        "__host.call('slow', 1).then((r) => console.log('late', r.slept));
         setTimeout(() => console.log('timer'), 10);
         const cancelled = setTimeout(() => console.log('cancelled'), 10);
         clearTimeout(cancelled);
         'first'",
        &Limits::default(),
        &host,
    );
    assert_eq!(outcome.result, Ok(json!("first")));
    // Both ran (and the cleared timer did not). Their order is the clock's: the 10 ms timer
    // usually fires before the 30 ms host call resolves, but a loaded machine can run the
    // timer's turn late (seen on a 2-core CI run), so the order is not asserted.
    let mut console = outcome.console;
    console.sort_by(|a, b| a.text.cmp(&b.text));
    assert_eq!(
        console,
        vec![
            line(ConsoleLevel::Log, "late true"),
            line(ConsoleLevel::Log, "timer")
        ]
    );
}

#[test]
fn an_error_in_a_timer_callback_is_logged() {
    let outcome = eval("setTimeout(() => { throw new Error('in timer') }, 0); 1");
    assert_eq!(outcome.result, Ok(json!(1)));
    assert_eq!(outcome.console.len(), 1);
    assert_eq!(outcome.console[0].level, ConsoleLevel::Error);
    assert!(
        outcome.console[0]
            .text
            .starts_with("Uncaught (in setTimeout callback) Error: in timer")
    );
}

#[test]
fn a_promise_that_can_never_settle_is_reported() {
    let error = failure("await new Promise(() => {})", &Limits::default());
    assert_eq!(error.kind, ErrorKind::Unsettled);
}

#[test]
fn the_fetch_prelude() {
    let host = TestHost::with_prelude(FETCH_PRELUDE);
    let outcome = run_with(
        "const r = await fetch('https://example.com/x', {method: 'post', headers: {'X-A': '1'}, body: {k: 'v'}});
         const j = await r.json();
         ({status: r.status, ok: r.ok, type: r.headers.get('content-type'), j})",
        &Limits::default(),
        &host,
    );
    assert_eq!(
        outcome.result,
        Ok(json!({
            "status": 201,
            "ok": true,
            "type": "application/json",
            "j": {"request": {
                "url": "https://example.com/x",
                "method": "POST",
                "headers": {"x-a": "1", "content-type": "application/json"},
                "body": "{\"k\":\"v\"}",
            }},
        }))
    );
}

#[test]
fn a_broken_prelude_is_an_internal_error() {
    let host = TestHost::with_prelude("throw new Error('bad prelude')");
    let error = run_with("1", &Limits::default(), &host).result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Internal);
    assert_eq!(error.message, "the host prelude failed: Error: bad prelude");
}

#[test]
fn runs_are_isolated() {
    assert_eq!(value("globalThis.leak = 1; 1"), json!(1));
    assert_eq!(value("typeof leak"), json!("undefined"));
}

#[test]
fn zero_limits_mean_defaults() {
    let limits = Limits {
        memory_bytes: 0,
        time: Duration::ZERO,
        max_steps: 0,
        max_stack_bytes: 0,
        console_bytes: 0,
    };
    let outcome = run_with("console.log('hi'); 1", &limits, &NoHost);
    assert_eq!(outcome.result, Ok(json!(1)));
    assert_eq!(outcome.console, vec![line(ConsoleLevel::Log, "hi")]);
}

#[test]
fn code_generation_from_strings_is_disabled() {
    for code in [
        "eval('1 + 1')",
        "new Function('return 1')",
        "Function('return 1')",
        "(() => {}).constructor('return 1')",
        "(async () => {}).constructor('return 1')",
        "(function* () {}).constructor('yield 1')",
        "(async function* () {}).constructor('yield 1')",
    ] {
        let error = failure(code, &Limits::default());
        assert_eq!(error.kind, ErrorKind::Exception, "{code}");
        assert!(
            error.message.starts_with("EvalError: "),
            "{code}: {}",
            error.message
        );
        assert!(
            error
                .message
                .contains("code generation from strings is disabled"),
            "{code}"
        );
    }
    assert_eq!(
        value("[(() => 1) instanceof Function, typeof Function, (function () {}).call.name]"),
        json!([true, "function", "call"])
    );
}

#[test]
fn deeply_nested_source_is_rejected_before_parsing() {
    let code = format!("{}1{}", "(".repeat(1000), ")".repeat(1000));
    let error = failure(&code, &Limits::default());
    assert_eq!(error.kind, ErrorKind::Exception);
    assert_eq!(
        error.message,
        "SyntaxError: the script nests brackets more than 256 levels deep"
    );
    // Nesting inside strings does not count.
    assert_eq!(value("'('.repeat(1000).length"), json!(1000));
}

#[test]
fn recursive_builtins_are_depth_guarded() {
    // JSON.parse and JSON.stringify throw a catchable RangeError instead of recursing deeply.
    assert_eq!(
        value("try { JSON.parse('['.repeat(600) + ']'.repeat(600)) } catch (e) { String(e) }"),
        json!("RangeError: JSON nested deeper than 512 levels")
    );
    assert_eq!(
        value(
            "let o = {}; for (let i = 0; i < 600; i++) o = {o}; try { JSON.stringify(o) } catch (e) { String(e) }"
        ),
        json!("RangeError: JSON nested deeper than 512 levels")
    );
    assert_eq!(value("JSON.parse('[[1]]', (k, v) => v)"), json!([[1]]));
    assert_eq!(
        value("JSON.stringify({b: 1, a: [1, {a: 2, c: 3}], c: 4}, ['c', 'a'])"),
        json!(r#"{"c":4,"a":[1,{"c":3,"a":2}]}"#)
    );
    assert_eq!(
        value("JSON.stringify({a: 1, b: 'x'}, (k, v) => typeof v === 'number' ? v * 10 : v, 1)"),
        json!("{\n \"a\": 10,\n \"b\": \"x\"\n}")
    );
    assert_eq!(
        value("JSON.stringify(new Date(0))"),
        json!("\"1970-01-01T00:00:00.000Z\"")
    );
    assert_eq!(
        value("[1, [2, [3, [4]]]].flat(Infinity)"),
        json!([1, 2, 3, 4])
    );
    assert_eq!(value("[1, [2, [3]]].flat()"), json!([1, 2, [3]]));

    // A deep completion value falls back to its string form; console output is cut.
    assert_eq!(
        value("let o = {}; for (let i = 0; i < 600; i++) o = {o}; o"),
        json!("[object Object]")
    );
    let outcome = eval("let o = {}; for (let i = 0; i < 600; i++) o = {o}; console.log(o)");
    assert!(
        outcome.console[0].text.contains("\"[Deep]\""),
        "{:?}",
        outcome.console
    );

    // Host-call arguments go through the same guard.
    let error = failure(
        "let o = {}; for (let i = 0; i < 600; i++) o = {o}; await __host.call('echo', o)",
        &Limits::default(),
    );
    assert_eq!(
        error.message,
        "RangeError: JSON nested deeper than 512 levels"
    );
}
