//! Table tests of the follow stream and an exhaustive check of its invariant: live events
//! delivered at every possible point relative to the backfill pages.

use expect_test::{Expect, expect};

use super::*;
use crate::wire::EntryPayload;

fn entry(cursor: u64) -> Entry {
    Entry {
        cursor,
        id: format!("e{cursor}"),
        created_at: cursor as i64 * 10,
        payload: EntryPayload::Custom {
            custom_type: "test".into(),
            data: serde_json::Value::Null,
        },
    }
}

fn request(query: &str) -> FollowRequest {
    let get = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
    };
    FollowRequest::parse(
        get("lastEventId"),
        get("sinceCursor").map(|v| v.parse().unwrap()),
        get("sinceTime").map(|v| v.parse().unwrap()),
        get("stopAfterIdle"),
        get("timeoutSeconds").map(|v| v.parse().unwrap()),
    )
    .unwrap()
}

/// One frame as a short line.
fn render(frame: &Frame) -> String {
    let text = frame.as_str();
    if text == SSE_HEARTBEAT {
        return "heartbeat".into();
    }
    let data = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .expect("a data line");
    let event: StreamEvent = serde_json::from_str(data).expect("a stream event");
    if let StreamEvent::EntryAppended { entry } = &event {
        assert!(
            text.starts_with(&format!("id: {}\n", entry.cursor)),
            "{text}"
        );
    }
    match event {
        StreamEvent::EntryAppended { entry } => format!("entry {}", entry.cursor),
        StreamEvent::AssistantTextDelta { delta } => format!("delta {delta}"),
        StreamEvent::ThinkingDelta { delta } => format!("thinking {delta}"),
        StreamEvent::ToolCallDelta {
            call_id,
            arguments_delta,
            ..
        } => format!("call {call_id} {arguments_delta}"),
        StreamEvent::ToolOutputDelta { call_id, text, .. } => format!("output {call_id} {text}"),
        StreamEvent::QueueItemAdded { id, .. } => format!("queued {id}"),
        StreamEvent::QueueItemRemoved { id, reason } => format!("unqueued {id} {reason:?}"),
        StreamEvent::Status { status } => format!("status {}", status.as_str()),
        StreamEvent::Idle => "idle".into(),
        StreamEvent::ChildStatus { child } => format!("child {}", child.id),
        StreamEvent::Done => "done".into(),
        StreamEvent::Lagged { cursor } => format!("lagged {cursor}"),
        StreamEvent::Error { message } => format!("error {message}"),
    }
}

/// [`render`] from the SSE header lines only (the exhaustive test renders millions of frames).
fn render_quick(frame: &Frame) -> String {
    let text = frame.as_str();
    let first = text.lines().next().unwrap_or_default();
    if let Some(id) = first.strip_prefix("id: ") {
        return format!("entry {id}");
    }
    match first.strip_prefix("event: ") {
        Some("status") => {
            let data = text.lines().nth(1).unwrap_or_default();
            let status = ["running", "idle", "stopped"]
                .into_iter()
                .find(|s| data.contains(&format!("\"{s}\"")))
                .unwrap_or("?");
            format!("status {status}")
        }
        Some(name) => name.to_string(),
        None => "heartbeat".into(),
    }
}

/// `CALL:TEXT` as a `tool_output_delta`.
fn output_delta(spec: &str) -> StreamEvent {
    let (call_id, text) = spec.split_once(':').expect("CALL:TEXT");
    StreamEvent::ToolOutputDelta {
        call_id: call_id.into(),
        stream: crate::wire::runner::OutputStream::Combined,
        text: text.into(),
    }
}

fn live(event: StreamEvent) -> LiveEvent {
    LiveEvent::new(&event)
}

/// Drives a follower from a script and renders what came out, one line per output.
///
/// Script lines: `new QUERY LAST_CURSOR STATUS`; `store N` (entries 1..=N stored);
/// `entry N`, `delta T`, `status S`, `idle` (a live event); `page` (complete the read asked
/// for from the store); `fail MSG` (fail it); `poll` (until Wait or End, or a ReadPage or a
/// credential check); `at MS` (the clock); `revocable` (recheck the credential from now on);
/// `credential live|revoked|ERROR` (answer the check).
fn run(script: &str, expect: Expect) {
    let mut follow: Option<Follow> = None;
    let mut stored = 0u64;
    let mut read: Option<(u64, usize)> = None;
    let mut now = Millis(0);
    let mut log = Vec::new();
    macro_rules! f {
        () => {
            follow.as_mut().expect("new first")
        };
    }
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
        match op {
            "new" => {
                let parts: Vec<&str> = rest.split(' ').collect();
                let status = match parts[2] {
                    "running" => Status::Running,
                    "stopped" => Status::Stopped,
                    _ => Status::Idle,
                };
                follow = Some(Follow::new(
                    now,
                    &request(parts[0]),
                    Registration {
                        last_cursor: parts[1].parse().unwrap(),
                        status,
                    },
                ));
            }
            "store" => stored = rest.parse().unwrap(),
            "entry" => {
                let cursor = rest.parse().unwrap();
                stored = stored.max(cursor);
                f!().handle_live(live(StreamEvent::EntryAppended {
                    entry: entry(cursor),
                }));
            }
            "delta" => {
                f!().handle_live(live(StreamEvent::AssistantTextDelta { delta: rest.into() }))
            }
            "out" => f!().handle_live(live(output_delta(rest))),
            "tails" => {
                let tails = rest.split(',').map(output_delta).collect();
                follow = Some(follow.take().expect("new first").with_running_output(tails));
            }
            "status" => f!().handle_live(live(StreamEvent::Status {
                status: if rest == "running" {
                    Status::Running
                } else {
                    Status::Idle
                },
            })),
            "idle" => f!().handle_live(live(StreamEvent::Idle)),
            "page" => {
                let (since, limit) = read.take().expect("a read was asked for");
                let page = (since + 1..=stored).take(limit).map(entry).collect();
                f!().handle_page(Ok(page));
            }
            "fail" => {
                read.take().expect("a read was asked for");
                f!().handle_page(Err(rest.into()));
            }
            "at" => now = Millis(rest.parse().unwrap()),
            "revocable" => follow = Some(follow.take().expect("new first").recheck_credential(now)),
            "credential" => f!().handle_credential(
                now,
                match rest {
                    "live" => Ok(true),
                    "revoked" => Ok(false),
                    error => Err(error.to_string()),
                },
            ),
            "deleted" => f!().handle_deleted(),
            "poll" => loop {
                match f!().poll(now) {
                    Output::Frame(frame) => log.push(render(&frame)),
                    Output::ReadPage { since, limit } => {
                        log.push(format!("read {since} {limit}"));
                        read = Some((since, limit));
                        break;
                    }
                    Output::CheckCredential => {
                        log.push("check credential".into());
                        break;
                    }
                    Output::Wait => {
                        log.push(format!("wait until {:?}", f!().poll_deadline()));
                        break;
                    }
                    Output::End => {
                        log.push("end".into());
                        break;
                    }
                }
            },
            other => panic!("unknown script op {other}"),
        }
    }
    expect.assert_eq(&(compress(&log).join("\n") + "\n"));
}

/// Runs of consecutive entries as `entries A..=B`.
fn compress(log: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut run: Option<(u64, u64)> = None;
    let flush = |run: &mut Option<(u64, u64)>, out: &mut Vec<String>| match run.take() {
        Some((a, b)) if a == b => out.push(format!("entry {a}")),
        Some((a, b)) => out.push(format!("entries {a}..={b}")),
        None => {}
    };
    for line in log {
        match line
            .strip_prefix("entry ")
            .and_then(|c| c.parse::<u64>().ok())
        {
            Some(c) if run.is_some_and(|(_, b)| b + 1 == c) => run = run.map(|(a, _)| (a, c)),
            Some(c) => {
                flush(&mut run, &mut out);
                run = Some((c, c));
            }
            None => {
                flush(&mut run, &mut out);
                out.push(line.clone());
            }
        }
    }
    flush(&mut run, &mut out);
    out
}

#[test]
fn request_parsing() {
    /// (Last-Event-ID, sinceCursor, sinceTime, stopAfterIdle, timeoutSeconds, expected)
    type Case<'a> = (
        Option<&'a str>,
        Option<u64>,
        Option<u64>,
        Option<&'a str>,
        Option<u64>,
        &'a str,
    );
    let cases: &[Case] = &[
        (
            None,
            None,
            None,
            None,
            None,
            "since 0, time None, stop false, timeout None",
        ),
        (
            Some(" 7 "),
            Some(3),
            None,
            None,
            None,
            "since 7, time None, stop false, timeout None",
        ),
        (
            None,
            Some(3),
            Some(99),
            Some("1"),
            Some(5),
            "since 3, time Some(99), stop true, timeout Some(5)",
        ),
        (
            None,
            None,
            None,
            Some("true"),
            Some(86_400),
            "since 0, time None, stop true, timeout Some(86400)",
        ),
        (
            None,
            None,
            None,
            Some("yes"),
            None,
            "since 0, time None, stop false, timeout None",
        ),
        (
            Some("x"),
            None,
            None,
            None,
            None,
            "Last-Event-ID must be a cursor (integer)",
        ),
        (
            None,
            None,
            None,
            None,
            Some(0),
            "timeoutSeconds must be between 1 and 86400",
        ),
        (
            None,
            None,
            None,
            None,
            Some(86_401),
            "timeoutSeconds must be between 1 and 86400",
        ),
        (
            None,
            None,
            Some(u64::MAX),
            None,
            None,
            "sinceTime is too large",
        ),
    ];
    for (last, since, time, stop, timeout, want) in cases {
        let got = match FollowRequest::parse(*last, *since, *time, *stop, *timeout) {
            Ok(r) => format!(
                "since {}, time {:?}, stop {}, timeout {:?}",
                r.since_cursor, r.since_time, r.stop_after_idle, r.timeout_seconds
            ),
            Err(e) => e,
        };
        assert_eq!(
            &got, want,
            "{last:?} {since:?} {time:?} {stop:?} {timeout:?}"
        );
    }
}

#[test]
fn backfill_then_live_dedupes_by_cursor() {
    // Live entry 3 arrives while the page that also holds it is read: it is sent once.
    run(
        "
        store 3
        new sinceCursor=0 3 running
        poll
        entry 3
        entry 4
        delta hi
        page
        poll
        entry 5
        poll
        ",
        expect![[r#"
            read 0 3
            entries 1..=3
            status running
            entry 4
            delta hi
            wait until Some(Millis(15000))
            entry 5
            wait until Some(Millis(15000))
        "#]],
    );
}

#[test]
fn pages_stop_at_the_registration_cursor_and_resume_after_the_last_one_sent() {
    run(
        "
        store 2600
        new sinceCursor=200 2500 idle
        poll
        page
        poll
        page
        poll
        page
        poll
        entry 2501
        poll
        ",
        expect![[r#"
            read 200 1000
            entries 201..=1200
            read 1200 1000
            entries 1201..=2200
            read 2200 300
            entries 2201..=2500
            status idle
            wait until Some(Millis(15000))
            entry 2501
            wait until Some(Millis(15000))
        "#]],
    );
}

#[test]
fn stop_after_idle_at_rest_sends_buffered_events_first() {
    // The bug this module fixes: a whole turn ends while the backfill is read. Its entries and
    // its idle are buffered; they are sent before the stream ends at that idle.
    run(
        "
        store 1
        new sinceCursor=0&stopAfterIdle=1 1 running
        poll
        delta a
        entry 2
        status idle
        idle
        entry 3
        page
        poll
        poll
        ",
        expect![[r#"
            read 0 1
            entry 1
            status running
            delta a
            entry 2
            status idle
            idle
            done
            end
            end
        "#]],
    );
    // At rest with nothing buffered: idle and done at once.
    run(
        "
        store 2
        new sinceCursor=1&stopAfterIdle=1 2 stopped
        poll
        page
        poll
        ",
        expect![[r#"
            read 1 1
            entry 2
            status stopped
            idle
            done
            end
        "#]],
    );
    // Running: wait for the live idle.
    run(
        "
        new sinceCursor=0&stopAfterIdle=1 0 running
        poll
        entry 1
        poll
        status idle
        idle
        poll
        ",
        expect![[r#"
            status running
            wait until Some(Millis(15000))
            entry 1
            wait until Some(Millis(15000))
            status idle
            idle
            done
            end
        "#]],
    );
}

#[test]
fn since_time_skips_entries_but_advances_the_cursor() {
    run(
        "
        store 4
        new sinceCursor=0&sinceTime=20&stopAfterIdle=1 4 idle
        poll
        page
        poll
        ",
        expect![[r#"
            read 0 4
            entries 3..=4
            status idle
            idle
            done
            end
        "#]],
    );
}

#[test]
fn heartbeats_and_the_timeout() {
    run(
        "
        new timeoutSeconds=40 0 running
        poll
        at 15000
        poll
        at 39999
        poll
        at 40000
        poll
        ",
        expect![[r#"
            status running
            wait until Some(Millis(15000))
            heartbeat
            wait until Some(Millis(30000))
            heartbeat
            wait until Some(Millis(40000))
            done
            end
        "#]],
    );
}

/// A deleted session ends its streams with an `error`; what was buffered is not sent, and a
/// second deletion adds nothing.
#[test]
fn a_deletion_ends_the_stream() {
    run(
        "
        new sinceCursor=0 0 running
        entry 1
        poll
        entry 2
        delta secret
        deleted
        deleted
        poll
        entry 3
        poll
        ",
        expect![[r#"
            status running
            entry 1
            wait until Some(Millis(15000))
            error the session was deleted
            end
            end
        "#]],
    );
}

/// A stream opened with a revocable credential checks it every `CREDENTIAL_RECHECK_MS`, before
/// anything else it would send; a revoked credential or a failed check ends the stream with an
/// `error`, and what was buffered is not sent. Without a credential to check, none is asked for.
#[test]
fn a_revocable_credential_is_rechecked_on_a_bounded_interval() {
    const _: () = assert!(CREDENTIAL_RECHECK_MS < HEARTBEAT_MS);
    run(
        "
        new sinceCursor=0 0 running
        revocable
        poll
        at 4999
        entry 1
        poll
        at 5000
        entry 2
        poll
        credential live
        poll
        at 10000
        poll
        entry 3
        delta secret
        credential revoked
        poll
        entry 4
        poll
        ",
        expect![[r#"
            status running
            wait until Some(Millis(5000))
            entry 1
            wait until Some(Millis(5000))
            check credential
            entry 2
            wait until Some(Millis(10000))
            check credential
            error the credential of this stream was revoked (or expired)
            end
            end
        "#]],
    );
    // A failed check ends the stream too (the reconnect is authenticated afresh).
    run(
        "
        new sinceCursor=0 0 idle
        revocable
        at 5000
        poll
        credential registry unreachable
        poll
        ",
        expect![[r#"
            check credential
            error could not check this stream's credential (registry unreachable); reconnect to resume
            end
        "#]],
    );
    // The check comes before backfill pages, and a stream without a credential never asks.
    run(
        "
        store 3
        new sinceCursor=0 3 idle
        revocable
        at 6000
        poll
        credential live
        poll
        page
        poll
        at 20000
        poll
        ",
        expect![[r#"
            check credential
            read 0 3
            entries 1..=3
            status idle
            wait until Some(Millis(11000))
            check credential
        "#]],
    );
    run(
        "
        new sinceCursor=0 0 idle
        at 60000
        poll
        ",
        expect![[r#"
            status idle
            heartbeat
            wait until Some(Millis(75000))
        "#]],
    );
}

#[test]
fn a_failed_or_short_page_ends_the_stream_with_an_error() {
    run(
        "
        store 5
        new sinceCursor=0 5 idle
        poll
        fail storage is down
        poll
        ",
        expect![[r#"
            read 0 5
            error storage is down
            end
        "#]],
    );
    run(
        "
        store 0
        new sinceCursor=0 5 idle
        poll
        page
        poll
        ",
        expect![[r#"
            read 0 5
            error the transcript ended at cursor 0 before cursor 5
            end
        "#]],
    );
}

#[test]
fn a_follower_past_its_buffer_bound_is_lagged_and_closed() {
    let mut follow = Follow::new(
        Millis(0),
        &request("sinceCursor=0"),
        Registration {
            last_cursor: 0,
            status: Status::Running,
        },
    );
    let big = "x".repeat(100 * 1024);
    let delta = live(StreamEvent::AssistantTextDelta { delta: big });
    // Caught up: the status at registration, then the first entry goes out.
    follow.handle_live(live(StreamEvent::EntryAppended { entry: entry(1) }));
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
    let mut accepted = 0;
    while !follow.is_closed() {
        follow.handle_live(delta.clone());
        accepted += 1;
        assert!(follow.buffered_bytes() <= MAX_BUFFERED_BYTES);
    }
    assert_eq!(accepted - 1, MAX_BUFFERED_BYTES / delta.cost());
    let Output::Frame(frame) = follow.poll(Millis(0)) else {
        panic!("lagged frame expected")
    };
    assert_eq!(render(&frame), "lagged 1");
    assert!(matches!(follow.poll(Millis(0)), Output::End));
    // Closed followers take nothing more.
    follow.handle_live(delta.clone());
    assert_eq!(follow.buffered_bytes(), 0);

    // One event larger than the bound is accepted into an empty buffer.
    let mut follow = Follow::new(
        Millis(0),
        &request("sinceCursor=0"),
        Registration {
            last_cursor: 0,
            status: Status::Running,
        },
    );
    let huge = live(StreamEvent::AssistantTextDelta {
        delta: "y".repeat(MAX_BUFFERED_BYTES + 1),
    });
    follow.handle_live(huge);
    assert!(!follow.is_closed());
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
}

/// A host's own bound (a socket that does not acknowledge) lags a follower as an overflow does:
/// `lagged` with the last cursor sent, nothing queued after it, then the end.
#[test]
fn a_follower_lagged_by_its_host_ends_at_the_last_cursor_sent() {
    let mut follow = Follow::new(
        Millis(0),
        &request("sinceCursor=0"),
        Registration {
            last_cursor: 0,
            status: Status::Running,
        },
    );
    follow.handle_live(live(StreamEvent::EntryAppended { entry: entry(1) }));
    follow.handle_live(live(StreamEvent::EntryAppended { entry: entry(2) }));
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
    follow.lag();
    assert!(follow.is_closed());
    assert_eq!(follow.end_reason(), Some(EndReason::Lagged));
    let Output::Frame(frame) = follow.poll(Millis(0)) else {
        panic!("lagged frame expected")
    };
    assert_eq!(render(&frame), "lagged 1");
    assert!(matches!(follow.poll(Millis(0)), Output::End));
    // Twice is once.
    follow.lag();
    assert!(matches!(follow.poll(Millis(0)), Output::End));
}

/// Whichever bound a follower that does not read reaches first lags it: the event count for
/// small frames (a reply's deltas), the bytes for large ones. The events accepted before the
/// one that lags it, by delta length.
#[test]
fn a_follower_is_lagged_at_whichever_bound_it_reaches_first() {
    // (delta characters, events accepted, the bound reached)
    let cases: &[(usize, usize, &str)] = &[
        (1, MAX_BUFFERED_EVENTS, "events"),
        (5, MAX_BUFFERED_EVENTS, "events"),
        (400, MAX_BUFFERED_EVENTS, "events"),
        (450, 3971, "bytes"),
        (4 * 1024, 502, "bytes"),
        (100 * 1024, 20, "bytes"),
        (MAX_BUFFERED_BYTES, 1, "bytes"),
    ];
    for &(chars, expected, bound) in cases {
        let mut follow = Follow::new(
            Millis(0),
            &request("sinceCursor=0"),
            Registration {
                last_cursor: 0,
                status: Status::Running,
            },
        );
        assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)), "status");
        let delta = live(StreamEvent::AssistantTextDelta {
            delta: "x".repeat(chars),
        });
        let mut accepted = 0;
        loop {
            follow.handle_live(delta.clone());
            if follow.is_closed() {
                break;
            }
            accepted += 1;
            assert!(follow.buffered_events() <= MAX_BUFFERED_EVENTS);
            assert!(follow.buffered_bytes() <= MAX_BUFFERED_BYTES.max(delta.cost()));
        }
        assert_eq!(
            (accepted, bound),
            (
                expected,
                if accepted == MAX_BUFFERED_EVENTS {
                    "events"
                } else {
                    "bytes"
                }
            ),
            "a delta of {chars} characters ({} bytes framed)",
            delta.cost()
        );
        let Output::Frame(frame) = follow.poll(Millis(0)) else {
            panic!("lagged frame expected")
        };
        assert_eq!(render(&frame), "lagged 0");
        assert!(matches!(follow.poll(Millis(0)), Output::End));
    }
}

/// The session side of the exhaustive test: broadcast order of two turns.
fn timeline() -> Vec<StreamEvent> {
    let e = |cursor| StreamEvent::EntryAppended {
        entry: entry(cursor),
    };
    let status = |status| StreamEvent::Status { status };
    let delta = || StreamEvent::AssistantTextDelta { delta: "d".into() };
    vec![
        e(1),
        e(2),
        status(Status::Running),
        e(3),
        delta(),
        e(4),
        e(5),
        delta(),
        e(6),
        status(Status::Idle),
        StreamEvent::Idle,
        status(Status::Running),
        e(7),
        delta(),
        e(8),
        status(Status::Idle),
        StreamEvent::Idle,
    ]
}

/// Idle points of a timeline: `(events before it, last cursor)`. One after each `Idle` event
/// and one at every position where the session is at rest.
fn idle_points(timeline: &[StreamEvent]) -> Vec<(usize, u64)> {
    let mut points = Vec::new();
    let mut status = Status::Idle;
    let mut cursor = 0;
    for (i, event) in timeline.iter().enumerate() {
        if status != Status::Running {
            points.push((i, cursor));
        }
        match event {
            StreamEvent::EntryAppended { entry } => cursor = entry.cursor,
            StreamEvent::Status { status: s } => status = *s,
            StreamEvent::Idle => points.push((i + 1, cursor)),
            _ => {}
        }
    }
    if status != Status::Running {
        points.push((timeline.len(), cursor));
    }
    points
}

/// Calls `visit` with every way of placing `events` deliveries before host steps
/// `0..=steps` (non-decreasing: deliveries keep their order).
fn schedules(events: usize, steps: usize, visit: &mut impl FnMut(&[usize])) {
    fn go(slots: &mut Vec<usize>, events: usize, steps: usize, visit: &mut impl FnMut(&[usize])) {
        if slots.len() == events {
            visit(slots);
            return;
        }
        let from = slots.last().copied().unwrap_or(0);
        for slot in from..=steps {
            slots.push(slot);
            go(slots, events, steps, visit);
            slots.pop();
        }
    }
    go(&mut Vec::new(), events, steps, visit);
}

/// Runs one follower: registered after `registered` events of the timeline, pages of at most
/// `page_size`, live event `i` delivered before host step `slots[i]`. Returns the frames and
/// how many timeline events had been delivered when the stream ended.
fn simulate(
    timeline: &[StreamEvent],
    registered: usize,
    page_size: usize,
    stop_after_idle: bool,
    slots: &[usize],
) -> (Vec<String>, usize) {
    let cursor_at = |n: usize| cursor_of(timeline, n);
    let mut follow = Follow::new(
        Millis(0),
        &FollowRequest {
            since_cursor: 0,
            since_time: None,
            stop_after_idle,
            timeout_seconds: None,
        },
        Registration {
            last_cursor: cursor_at(registered),
            status: status_of(timeline, registered),
        },
    );
    let live: Vec<LiveEvent> = timeline.iter().map(LiveEvent::new).collect();
    let mut delivered = registered;
    let mut next_slot = 0;
    let mut read: Option<(u64, usize)> = None;
    let mut frames = Vec::new();
    let mut step = 0;
    loop {
        while next_slot < slots.len() && slots[next_slot] <= step {
            follow.handle_live(live[delivered].clone());
            delivered += 1;
            next_slot += 1;
        }
        // One host step: complete the read in flight, or poll once.
        if let Some((since, limit)) = read.take() {
            // The store holds what was appended so far (the actor writes before it
            // broadcasts); a page never reads past `limit`.
            let stored = cursor_at(delivered);
            let page = (since + 1..=stored).take(limit.min(page_size)).map(entry);
            follow.handle_page(Ok(page.collect()));
        } else {
            match follow.poll(Millis(0)) {
                Output::Frame(frame) => frames.push(render_quick(&frame)),
                Output::ReadPage { since, limit } => read = Some((since, limit)),
                Output::CheckCredential => unreachable!("no credential to check"),
                Output::Wait if next_slot == slots.len() => return (frames, delivered),
                Output::Wait => {}
                Output::End => return (frames, delivered),
            }
        }
        step += 1;
    }
}

/// The invariant, for every registration point, page size and placement of the live events
/// relative to the backfill reads and the polls.
#[test]
fn every_entry_before_idle_in_order_exactly_once_under_every_interleaving() {
    const WINDOW: usize = 5;
    const STEPS: usize = 9;
    let timeline = timeline();
    let points = idle_points(&timeline);
    let mut runs = 0;
    for registered in 0..=timeline.len() {
        let events = (timeline.len() - registered).min(WINDOW);
        for page_size in [1, 2, 1000] {
            for stop_after_idle in [true, false] {
                schedules(events, STEPS, &mut |slots| {
                    runs += 1;
                    let (frames, delivered) =
                        simulate(&timeline, registered, page_size, stop_after_idle, slots);
                    let case = || {
                        format!(
                            "registered after {registered} events, pages of {page_size}, \
                             stopAfterIdle {stop_after_idle}, slots {slots:?}: {frames:?}"
                        )
                    };
                    check(
                        &timeline,
                        &points,
                        registered,
                        delivered,
                        stop_after_idle,
                        &frames,
                        case,
                    );
                });
            }
        }
    }
    assert!(runs > 150_000, "{runs} runs");
}

fn check(
    timeline: &[StreamEvent],
    points: &[(usize, u64)],
    registered: usize,
    delivered: usize,
    stop_after_idle: bool,
    frames: &[String],
    case: impl Fn() -> String,
) {
    let cursors: Vec<u64> = frames
        .iter()
        .filter_map(|f| f.strip_prefix("entry ")?.parse().ok())
        .collect();
    let k = cursors.last().copied().unwrap_or(0);
    assert_eq!(
        cursors,
        (1..=k).collect::<Vec<_>>(),
        "in order, once: {}",
        case()
    );
    // Exactly one status frame before the first entry past the backfill, after every backfilled
    // entry; from it on, a client tracking status frames knows the session's status after each
    // entry it was sent.
    let backfilled = cursor_of(timeline, registered);
    let first_status = frames
        .iter()
        .position(|f| f.starts_with("status "))
        .unwrap_or_else(|| panic!("no status frame: {}", case()));
    assert!(
        frames[..first_status].iter().all(|f| f
            .strip_prefix("entry ")
            .is_some_and(|c| c.parse::<u64>().unwrap() <= backfilled)),
        "only backfilled entries before the first status: {}",
        case()
    );
    let mut tracked = None;
    for frame in &frames[first_status..] {
        if let Some(status) = frame.strip_prefix("status ") {
            tracked = Some(status.to_string());
        } else if let Some(cursor) = frame.strip_prefix("entry ") {
            let cursor: u64 = cursor.parse().unwrap();
            let truth = status_after_entry(timeline, cursor);
            assert_eq!(
                tracked.as_deref(),
                Some(truth.as_str()),
                "status after entry {cursor}: {}",
                case()
            );
        }
    }
    // Everything delivered is sent, unless the stream stopped at an idle point.
    let ended = frames.last().is_some_and(|f| f == "done");
    if !ended {
        let appended = timeline[..delivered]
            .iter()
            .filter(|e| matches!(e, StreamEvent::EntryAppended { .. }))
            .count() as u64;
        assert_eq!(k, appended, "everything delivered is sent: {}", case());
        // And the client knows the status as of everything delivered.
        let truth = status_of(timeline, delivered);
        assert_eq!(
            tracked.as_deref(),
            Some(truth.as_str()),
            "status after everything delivered: {}",
            case()
        );
        assert!(
            !frames.iter().any(|f| f == "idle") || !stop_after_idle,
            "{}",
            case()
        );
        return;
    }
    assert!(stop_after_idle, "done without a timeout: {}", case());
    let n = frames.len();
    assert!(
        n >= 2 && frames[n - 2] == "idle",
        "idle then done: {}",
        case()
    );
    assert_eq!(
        frames.iter().filter(|f| *f == "idle").count(),
        1,
        "one idle: {}",
        case()
    );
    // It stopped at an idle point at or after its registration, having sent every entry
    // appended before that point.
    assert!(
        points
            .iter()
            .any(|(at, cursor)| *at >= registered && *at <= delivered && *cursor == k),
        "stopped at cursor {k}, which is no idle point between event {registered} and {delivered}: {}",
        case()
    );
}

/// The highest cursor among the first `n` events of `timeline`.
fn cursor_of(timeline: &[StreamEvent], n: usize) -> u64 {
    timeline[..n]
        .iter()
        .filter_map(|e| match e {
            StreamEvent::EntryAppended { entry } => Some(entry.cursor),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The status after the first `n` events of `timeline` (idle before any).
fn status_of(timeline: &[StreamEvent], n: usize) -> Status {
    timeline[..n]
        .iter()
        .filter_map(|e| match e {
            StreamEvent::Status { status } => Some(*status),
            _ => None,
        })
        .next_back()
        .unwrap_or(Status::Idle)
}

/// The status right after entry `cursor` was appended.
fn status_after_entry(timeline: &[StreamEvent], cursor: u64) -> String {
    let at = timeline
        .iter()
        .position(|e| matches!(e, StreamEvent::EntryAppended { entry } if entry.cursor == cursor))
        .expect("an entry of the timeline");
    status_of(timeline, at + 1).as_str().to_string()
}

/// What a client WebSocket needs of a follower: each frame's `data` is the SSE frame's `data:`
/// JSON (a slice of it), no heartbeats and so no deadline without a credential to check, and the
/// reason the stream ended.
#[test]
fn socket_followers_get_the_sse_data_without_heartbeats() {
    let registration = Registration {
        last_cursor: 0,
        status: Status::Running,
    };
    let events = [
        StreamEvent::EntryAppended { entry: entry(1) },
        StreamEvent::AssistantTextDelta {
            delta: "a\nb \"data: \"".into(),
        },
        StreamEvent::Idle,
        StreamEvent::Lagged { cursor: 9 },
    ];
    for event in &events {
        let json = serde_json::to_string(event).unwrap();
        let live_frame = Frame::Live(live(event.clone()));
        assert_eq!(live_frame.data(), Some(json.as_str()));
        assert_eq!(Frame::Text(event.to_sse()).data(), Some(json.as_str()));
    }
    assert_eq!(Frame::Heartbeat.data(), None);

    let mut follow =
        Follow::new(Millis(0), &request("sinceCursor=0"), registration).without_heartbeats();
    assert!(matches!(follow.poll(Millis(0)), Output::Frame(_)));
    assert!(matches!(follow.poll(Millis(0)), Output::Wait));
    assert_eq!(follow.poll_deadline(), None);
    assert!(matches!(
        follow.poll(Millis(HEARTBEAT_MS * 3)),
        Output::Wait
    ));
    let mut follow = follow.recheck_credential(Millis(100));
    assert_eq!(
        follow.poll_deadline(),
        Some(Millis(100 + CREDENTIAL_RECHECK_MS))
    );
    assert!(matches!(
        follow.poll(Millis(100 + CREDENTIAL_RECHECK_MS)),
        Output::CheckCredential
    ));
    assert_eq!(follow.end_reason(), None);
    follow.handle_credential(Millis(6000), Ok(false));
    assert_eq!(follow.end_reason(), Some(EndReason::Revoked));

    let reasons = [
        ("deleted", EndReason::Deleted),
        ("failed", EndReason::Failed),
        ("lagged", EndReason::Lagged),
    ];
    for (what, reason) in reasons {
        let mut follow = Follow::new(Millis(0), &request("sinceCursor=0"), registration);
        match what {
            "deleted" => follow.handle_deleted(),
            "failed" => follow.handle_credential(Millis(0), Err("down".into())),
            _ => {
                let big = live(StreamEvent::AssistantTextDelta {
                    delta: "x".repeat(MAX_BUFFERED_BYTES / 2 + 1),
                });
                follow.handle_live(big.clone());
                follow.handle_live(big);
            }
        }
        assert_eq!(follow.end_reason(), Some(reason), "{what}");
    }
    let mut follow = Follow::new(Millis(0), &request("stopAfterIdle=1"), registration);
    follow.handle_live(live(StreamEvent::Idle));
    while !matches!(follow.poll(Millis(0)), Output::End) {}
    assert_eq!(follow.end_reason(), Some(EndReason::Done));
}

#[test]
fn a_late_joiner_gets_the_running_calls_tails_then_their_live_output() {
    // Output printed while the backfill is read waits behind the tails.
    run(
        "
        new sinceCursor=0 2 running
        tails c1:old1,c2:old2
        store 2
        poll
        out c1:new1
        page
        out c2:new2
        poll
        ",
        expect![[r#"
            read 0 2
            entries 1..=2
            status running
            output c1 old1
            output c2 old2
            output c1 new1
            output c2 new2
            wait until Some(Millis(15000))
        "#]],
    );
    // A follower that is lagged or ends never sends a tail.
    run(
        "
        new sinceCursor=0 0 running
        tails c1:old
        deleted
        poll
        ",
        expect![[r#"
            error the session was deleted
            end
        "#]],
    );
}

/// Every point at which live output can arrive relative to the backfill and the polls: the
/// stream sends the tails, then the live output, each once and in order, after the status.
#[test]
fn running_output_in_order_exactly_once_under_every_interleaving() {
    let live_outputs = ["c1:b", "c1:c", "c2:x"];
    // Each live output arrives after step k of the host loop (0..steps).
    let steps = 6;
    for a in 0..steps {
        for b in a..steps {
            for c in b..steps {
                let arrivals = [a, b, c];
                let mut follow = Follow::new(
                    Millis(0),
                    &request("sinceCursor=0"),
                    Registration {
                        last_cursor: 3,
                        status: Status::Running,
                    },
                )
                .with_running_output(vec![output_delta("c1:a")]);
                let mut sent = Vec::new();
                let mut next = 0;
                for step in 0..steps + 4 {
                    while next < 3 && arrivals[next] <= step {
                        follow.handle_live(live(output_delta(live_outputs[next])));
                        next += 1;
                    }
                    match follow.poll(Millis(0)) {
                        Output::Frame(frame) => sent.push(render(&frame)),
                        Output::ReadPage { since, limit } => {
                            let page = (since + 1..=3).take(limit.min(2)).map(entry).collect();
                            follow.handle_page(Ok(page));
                        }
                        Output::Wait | Output::End | Output::CheckCredential => {}
                    }
                }
                while let Output::Frame(frame) = follow.poll(Millis(0)) {
                    sent.push(render(&frame));
                }
                assert_eq!(
                    sent,
                    [
                        "entry 1",
                        "entry 2",
                        "entry 3",
                        "status running",
                        "output c1 a",
                        "output c1 b",
                        "output c1 c",
                        "output c2 x"
                    ],
                    "arrivals {arrivals:?}"
                );
            }
        }
    }
}
