//! Rate limits (issue 29): creating sessions, enqueueing and the js tool's `fetch` are limited per
//! person and per tenant with Cloudflare's Rate Limiting bindings (`wrangler.toml`,
//! `wuhu_core::rate_limits`); a refusal is `429 rate_limited` with `Retry-After`, and another
//! person of the tenant, or another tenant, is not held back by it.
//!
//! The stack keeps the limits on (the harness turns them off for every other test). `wrangler
//! dev` counts in fixed windows of the limit's period (10 s here); a burst that a window's end
//! cut in two is run again with fresh names, so no test depends on where in a window it starts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Response, Stack, StackOptions};

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(|| StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_RATE_LIMITS".into(), "on".into())],
        ..StackOptions::default()
    })
}

/// The limits of `wrangler.toml` this file drives (the core test checks the names and periods).
const CREATES_PER_PERSON: usize = 60;
const ENQUEUES_PER_PERSON: usize = 300;
const PERIOD: Duration = Duration::from_secs(10);

/// The number of the fixed window `now` falls in.
fn window() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        / PERIOD.as_secs()
}

/// Runs `burst` (which makes `n` allowed calls and then one more) until one run stays inside a
/// single window; returns that run's extra answer. At most three runs.
#[track_caller]
fn within_one_window(mut burst: impl FnMut(&str) -> Response) -> Response {
    for attempt in 0..3 {
        let start = window();
        let answer = burst(&unique_name(&format!("rl{attempt}")));
        if window() == start {
            return answer;
        }
    }
    panic!("three bursts each crossed a rate-limit window");
}

#[track_caller]
fn assert_limited(response: &Response) {
    let error = response.expect_error(429);
    assert_eq!(error.code, "rate_limited", "{response}");
    assert!(
        error.message.contains("try again in 10 seconds"),
        "{response}"
    );
    assert_eq!(response.header("retry-after"), Some("10"), "{response}");
}

/// alice's 61st session in a window is refused; bob of the same tenant and alice of another
/// tenant still create theirs.
#[test]
fn creating_sessions_is_limited_per_person() {
    let stack = stack();
    let _guard = stack.guard();
    let mut others: Option<(Api, Api)> = None;
    let extra = within_one_window(|tenant| {
        let alice = stack.client("alice", tenant);
        for i in 0..CREATES_PER_PERSON {
            let created = alice.post("/v1/sessions", &json!({"provider": "fake"}));
            assert_eq!(created.status, 201, "session {i}: {created}");
        }
        others = Some((
            stack.client("bob", tenant),
            stack.client("alice", &unique_name("rl-other")),
        ));
        alice.post("/v1/sessions", &json!({"provider": "fake"}))
    });
    assert_limited(&extra);
    let (bob, elsewhere) = others.expect("the burst ran");
    for api in [&bob, &elsewhere] {
        let created = api.post("/v1/sessions", &json!({"provider": "fake"}));
        assert_eq!(created.status, 201, "{created}");
    }
}

/// alice's 301st message in a window is refused with nothing queued; bob's goes through.
#[test]
fn enqueueing_is_limited_per_person() {
    let stack = stack();
    let _guard = stack.guard();
    let mut rest: Option<(Api, String)> = None;
    let extra = within_one_window(|tenant| {
        let alice = stack.client("alice", tenant);
        let session = alice.create_fake_session().id;
        let shared = alice.patch(
            &format!("/v1/sessions/{session}"),
            &json!({"access": "tenant"}),
        );
        assert_eq!(shared.status, 200, "{shared}");
        for i in 0..ENQUEUES_PER_PERSON {
            let sent = alice.enqueue_raw(&session, "steer", &format!("message {i}"));
            assert_eq!(sent.status, 200, "message {i}: {sent}");
        }
        rest = Some((stack.client("bob", tenant), session.clone()));
        alice.enqueue_raw(&session, "steer", "one too many")
    });
    assert_limited(&extra);
    let (bob, session) = rest.expect("the burst ran");
    let sent = bob.enqueue_raw(&session, "followUp", "bob is not held back");
    assert_eq!(sent.status, 200, "{sent}");
}
