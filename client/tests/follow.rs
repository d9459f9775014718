//! The follow stream against a scripted local SSE server that cuts connections in every way
//! (mid-frame, after `lagged`, after `error`, with a 503, silently), replays entries the client
//! already has, and records what the client asked for. Invariant: every entry once, in order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use wuhu_client::{Backoff, Client, FollowEvent, FollowOptions};
use wuhu_core::wire::StreamEvent;

const N_ENTRIES: u64 = 40;

/// How connection number `n` ends.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Answers 503 before any frame.
    Unavailable,
    /// Sends `count` entries, then half a frame, then closes.
    MidFrame(u64),
    /// Sends `count` entries, then `lagged`.
    Lagged(u64),
    /// Sends `count` entries, then an `error` event.
    ErrorEvent(u64),
    /// Sends `count` entries and closes cleanly without `done`.
    Eof(u64),
    /// Sends the rest, `idle` and `done`.
    Finish,
}

const SCRIPT: &[Cut] = &[
    Cut::Unavailable,
    Cut::MidFrame(7),
    Cut::Lagged(5),
    Cut::Unavailable,
    Cut::Unavailable,
    Cut::ErrorEvent(9),
    Cut::Eof(3),
    Cut::MidFrame(0),
    Cut::Finish,
];

fn frame(cursor: u64) -> String {
    let data = format!(
        r#"{{"type":"entry_appended","entry":{{"cursor":{cursor},"id":"e{cursor}","createdAt":0,"type":"custom","custom_type":"t","data":{{}}}}}}"#
    );
    format!("id: {cursor}\nevent: entry_appended\ndata: {data}\n\n")
}

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

fn since_cursor(head: &str) -> u64 {
    let target = head.split_whitespace().nth(1).unwrap_or("");
    target
        .split(['?', '&'])
        .find_map(|p| p.strip_prefix("sinceCursor="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Serves the script; records `(Last-Event-ID, sinceCursor)` of each request.
/// `(Last-Event-ID, sinceCursor)` of each request, in order.
type Seen = Arc<Mutex<Vec<(Option<String>, u64)>>>;

async fn serve(listener: TcpListener, seen: Seen) {
    for cut in SCRIPT {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await;
        let last_id = header(&head, "last-event-id");
        let since = since_cursor(&head);
        seen.lock().unwrap().push((last_id.clone(), since));
        let after = last_id.and_then(|v| v.parse().ok()).unwrap_or(since);
        if let Cut::Unavailable = cut {
            let body = r#"{"error":{"code":"unavailable","message":"try again"}}"#;
            let reply = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
            continue;
        }
        let mut out = String::from(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n: heartbeat\n\n",
        );
        // Replays two entries the client already has: it must drop them.
        let first = after.saturating_sub(2) + 1;
        let count = match cut {
            Cut::MidFrame(n) | Cut::Lagged(n) | Cut::ErrorEvent(n) | Cut::Eof(n) => *n + 2,
            Cut::Finish => N_ENTRIES,
            Cut::Unavailable => 0,
        };
        let last = (first + count - 1).min(N_ENTRIES);
        for cursor in first..=last {
            out.push_str(&frame(cursor));
            out.push_str("event: assistant_text_delta\ndata: {\"type\":\"assistant_text_delta\",\"delta\":\"x\"}\n\n");
        }
        match cut {
            Cut::MidFrame(_) => {
                let next = frame(last + 1);
                out.push_str(&next[..next.len() / 2]);
            }
            Cut::Lagged(_) => out.push_str(&format!(
                "event: lagged\ndata: {{\"type\":\"lagged\",\"cursor\":{last}}}\n\n"
            )),
            Cut::ErrorEvent(_) => {
                out.push_str("event: error\ndata: {\"type\":\"error\",\"message\":\"read failed\"}\n\n")
            }
            Cut::Eof(_) | Cut::Unavailable => {}
            Cut::Finish => out.push_str(
                "event: idle\ndata: {\"type\":\"idle\"}\n\nevent: done\ndata: {\"type\":\"done\"}\n\n",
            ),
        }
        // Written in small pieces so frames straddle reads.
        for piece in out.as_bytes().chunks(37) {
            if stream.write_all(piece).await.is_err() {
                break;
            }
        }
        let _ = stream.shutdown().await;
    }
}

fn fast_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(40),
        max_failures: Some(10),
    }
}

#[tokio::test]
async fn every_entry_once_in_order_across_every_kind_of_cut() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = tokio::spawn(serve(listener, seen.clone()));

    let client = Client::new(&base, Some("t".into())).unwrap();
    let mut follow = client.follow(
        "s1",
        FollowOptions {
            stop_after_idle: true,
            backoff: fast_backoff(),
            ..FollowOptions::default()
        },
    );
    let mut cursors = Vec::new();
    let mut notices = Vec::new();
    let mut done = false;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), follow.next())
        .await
        .expect("the follow stream stalled")
    {
        match event.expect("no error") {
            FollowEvent::Event(StreamEvent::EntryAppended { entry }) => cursors.push(entry.cursor),
            FollowEvent::Event(StreamEvent::Done) => done = true,
            FollowEvent::Event(StreamEvent::Lagged { .. } | StreamEvent::Error { .. }) => {
                panic!("lagged and error are handled inside")
            }
            FollowEvent::Event(_) => {}
            FollowEvent::Disconnected { .. } => notices.push('D'),
            FollowEvent::Resumed { .. } => notices.push('R'),
        }
    }
    server.await.unwrap();
    assert!(done);
    assert_eq!(cursors, (1..=N_ENTRIES).collect::<Vec<_>>());
    // Outages: the first 503, the mid-frame cut, two 503s in a row (one outage), the error
    // event, the clean EOF, the second mid-frame cut. A `lagged` is a reconnect, not an outage.
    assert_eq!(notices.iter().collect::<String>(), "DRDRDRDRDRDR");
    // Each request resumed from the last entry the client had yielded.
    let seen = seen.lock().unwrap().clone();
    let resumed_from: Vec<u64> = seen.iter().map(|(_, since)| *since).collect();
    assert_eq!(resumed_from, [0, 0, 9, 14, 14, 14, 23, 26, 26]);
    for (last_id, since) in &seen {
        match last_id {
            Some(id) => assert_eq!(id, &since.to_string()),
            None => assert_eq!(*since, 0),
        }
    }
}

#[tokio::test]
async fn a_refused_stream_is_a_typed_error_not_a_retry_loop() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await;
        let body = r#"{"error":{"code":"not_found","message":"no such session"}}"#;
        let reply = format!(
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(reply.as_bytes()).await.unwrap();
    });
    let client = Client::new(&base, Some("t".into())).unwrap();
    let mut follow = client.follow("nope", FollowOptions::until_idle());
    let error = follow.next().await.unwrap().unwrap_err();
    assert_eq!(error.code(), Some("not_found"));
    assert_eq!(error.status(), Some(404));
    assert!(follow.next().await.is_none());
    server.await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_gives_up_after_the_budget() {
    // Bind then drop: nothing listens on this port.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("http://127.0.0.1:{port}"), None).unwrap();
    let mut follow = client.follow(
        "s",
        FollowOptions {
            backoff: Backoff {
                max_failures: Some(3),
                ..fast_backoff()
            },
            ..FollowOptions::default()
        },
    );
    let mut disconnected = 0;
    let error = loop {
        match follow.next().await.expect("ends with an error") {
            Ok(FollowEvent::Disconnected { .. }) => disconnected += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(error) => break error,
        }
    };
    assert_eq!(disconnected, 1, "said once per outage");
    assert!(matches!(error, wuhu_client::Error::Follow(_)), "{error}");
    assert!(follow.next().await.is_none());
}
