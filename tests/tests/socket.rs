//! The session socket (`GET /v1/sessions/:id/socket`): the follow stream's events and cursors,
//! lossless and once, and the HTTP routes' actions with their answers and their authority.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::socket::{
    CLOSE_LAGGED, CLOSE_REVOKED, ClientFrame, MAX_CLIENT_FRAME_BYTES, MAX_UNACKED_BYTES,
    MAX_UNACKED_FRAMES,
};
use wuhu_core::wire::{CancelRequest, EnqueueRequest, Entry, Status};
use wuhu_e2e::entries::{assert_contiguous, describe, fake_directive, user_content};
use wuhu_e2e::http::Request;
use wuhu_e2e::socket::{SessionSocket, SocketAuth, SocketRead};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, Stack, wait_for};

const TURN: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

fn connect(api: &Api, id: &str, query: &str) -> Result<SessionSocket, (u16, String)> {
    let auth = match api.token() {
        Some(token) => SocketAuth::Bearer(token.to_string()),
        None => SocketAuth::None,
    };
    SessionSocket::connect(&stack().base_url(), id, query, &auth)
}

#[track_caller]
fn open(api: &Api, id: &str, query: &str) -> SessionSocket {
    connect(api, id, query).unwrap_or_else(|e| panic!("the socket upgrade was refused: {e:?}"))
}

fn enqueue_frame(id: &str, lane: Option<&str>, content: &str) -> ClientFrame {
    ClientFrame::Enqueue {
        id: id.to_string(),
        lane: lane.map(str::to_string),
        body: EnqueueRequest {
            content: content.to_string(),
            key: None,
            reasoning: None,
        },
    }
}

/// Reads a socket up to its idle point: a live `idle` event, or the status sent after the
/// backfill (the first `status`) when it is not `running` (the socket registered at rest, so
/// the backfill held everything). The frames read, idle point included.
fn read_to_idle(socket: &mut SessionSocket, timeout: Duration) -> Result<Vec<Value>, String> {
    let deadline = Instant::now() + timeout;
    let mut frames: Vec<Value> = Vec::new();
    let mut seen_status = false;
    loop {
        match socket.read(deadline) {
            SocketRead::Frame(frame) => {
                let kind = frame["type"].as_str().unwrap_or_default().to_string();
                let first_status = kind == "status" && !seen_status;
                seen_status |= kind == "status";
                let at_rest = first_status && frame["status"] != "running";
                frames.push(frame);
                if kind == "idle" || at_rest {
                    return Ok(frames);
                }
            }
            other => return Err(format!("{other:?} before an idle point; read {frames:?}")),
        }
    }
}

/// Reads the backfill up to the status sent after it: the socket is registered.
#[track_caller]
fn registered(socket: &mut SessionSocket) {
    for _ in 0..1000 {
        if socket.next_frame(WAIT)["type"] == "status" {
            return;
        }
    }
    panic!("no status after the backfill");
}

fn cursors(frames: &[Value]) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| f["type"] == "entry_appended")
        .map(|f| f["entry"]["cursor"].as_u64().expect("an entry's cursor"))
        .collect()
}

/// Each socket's entries are exactly the transcript's after its `after` cursor, in order, once.
fn check(frames: &[Value], transcript: &[Entry], after: u64) -> Result<(), String> {
    let want: Vec<u64> = transcript
        .iter()
        .filter(|e| e.cursor > after)
        .map(|e| e.cursor)
        .collect();
    let got = cursors(frames);
    if got != want {
        return Err(format!("entries {got:?}, want {want:?}"));
    }
    // The entries are the transcript's, byte for byte.
    for frame in frames.iter().filter(|f| f["type"] == "entry_appended") {
        let entry: Entry =
            serde_json::from_value(frame["entry"].clone()).map_err(|e| e.to_string())?;
        let stored = transcript.iter().find(|e| e.cursor == entry.cursor);
        if stored != Some(&entry) {
            return Err(format!(
                "entry {} differs from the transcript",
                entry.cursor
            ));
        }
    }
    Ok(())
}

/// Sockets opened before a turn, at many moments during it, and resuming with `?after=` at
/// every cursor of the session: each gets exactly the transcript's entries after its cursor, in
/// order, once, then an idle point; the socket opened before the turn gets exactly the events
/// (deltas and statuses included) of an SSE follower opened at the same moment.
#[test]
fn sockets_get_the_follow_streams_events_exactly_once() {
    const TURNS: usize = 4;
    const OPENERS: usize = 3;
    const PER_OPENER: usize = 12;
    let _guard = stack().guard();
    let api = stack().client("sam", &unique_name("socket"));
    let model = unique_name("gpt-socket");
    let session = api.create_session(
        json!({"provider": "openai-compatible", "model": model, "systemPrompt": "be brief"}),
    );
    let id = session.id.as_str();
    let mut failures = Vec::new();
    let mut checked = 0;
    for turn in 0..TURNS {
        let reply = format!("Turn {turn}: a reply streamed in many small chunks to the socket.");
        let delay = Duration::from_millis(15 + 10 * turn as u64);
        stack()
            .openai()
            .script(&model, [Reply::text(reply.clone()).with_delay(delay)]);
        let before = api.session(id).session.last_cursor;
        let mut sse = api.follow(id, &format!("sinceCursor={before}&timeoutSeconds=60"));
        let mut reference = open(&api, id, &format!("?after={before}"));
        // The reference socket has registered once it sent its status after the backfill.
        let first = reference.next_frame(WAIT);
        assert_eq!(first, json!({"type": "status", "status": "idle"}));
        api.enqueue(id, "followUp", &format!("turn {turn}"));
        let turn_over = AtomicBool::new(false);
        let mut opened: Vec<(String, u64, SessionSocket)> = Vec::new();
        std::thread::scope(|scope| {
            let openers: Vec<_> = (0..OPENERS)
                .map(|opener| {
                    let (api, turn_over) = (&api, &turn_over);
                    scope.spawn(move || {
                        let mut sockets = Vec::new();
                        let mut n = 0u64;
                        while !turn_over.load(Ordering::Relaxed) && sockets.len() < PER_OPENER {
                            // Openers 1 and 2 resume at every cursor of the session so far.
                            let after = match opener {
                                0 => before,
                                _ => (n * 2 + opener as u64 - 1) % (before + 1),
                            };
                            n += 1;
                            let socket = open(api, id, &format!("?after={after}"));
                            sockets.push((format!("opener {opener} after={after}"), after, socket));
                        }
                        sockets
                    })
                })
                .collect();
            wait_for("the turn to end", TURN, || {
                let page = api.session(id);
                (page.session.status != Status::Running && page.queue.is_empty()).then_some(())
            });
            turn_over.store(true, Ordering::Relaxed);
            for opener in openers {
                opened.extend(opener.join().expect("opener"));
            }
        });
        let transcript = api.transcript(id);
        assert_contiguous(&transcript);
        let mut reference_frames = vec![first];
        match read_to_idle(&mut reference, TURN) {
            Ok(frames) => reference_frames.extend(frames),
            Err(e) => panic!("turn {turn}: the reference socket: {e}"),
        }
        // The same events as the SSE follower's, in the same order.
        let sse_events: Vec<Value> = sse
            .collect_until(TURN, |e| e.event == "idle")
            .into_iter()
            .map(|e| e.data)
            .collect();
        assert_eq!(
            reference_frames, sse_events,
            "turn {turn}: the socket's events differ from the SSE stream's"
        );
        assert!(
            reference_frames
                .iter()
                .any(|f| f["type"] == "assistant_text_delta"),
            "turn {turn}: no delta reached the socket"
        );
        if let Err(e) = check(&reference_frames, &transcript, before) {
            failures.push(format!("turn {turn}, reference: {e}"));
        }
        for (name, after, mut socket) in opened {
            checked += 1;
            match read_to_idle(&mut socket, TURN) {
                Ok(frames) => {
                    if let Err(e) = check(&frames, &transcript, after) {
                        failures.push(format!("turn {turn}, {name}: {e}"));
                    }
                }
                Err(e) => failures.push(format!("turn {turn}, {name}: {e}")),
            }
            // Nothing more comes after the idle point: no duplicate, no late entry.
            match socket.read(Instant::now() + Duration::from_millis(200)) {
                SocketRead::Timeout => {}
                other => failures.push(format!("turn {turn}, {name}: after idle: {other:?}")),
            }
            socket.close();
        }
        reference.close();
        if !failures.is_empty() {
            eprintln!("{}", describe(&transcript));
        }
    }
    eprintln!("{checked} sockets checked");
    assert!(
        failures.is_empty(),
        "{} failures; first: {}",
        failures.len(),
        failures[0]
    );
    assert!(checked >= TURNS * 3, "only {checked} sockets opened");
}

/// `enqueue`, `stop` and `cancel` frames answer what the HTTP routes answer; each frame gets
/// exactly one reply; every message enqueued over the socket is in the transcript once.
#[test]
fn socket_actions_answer_as_the_http_routes() {
    let _guard = stack().guard();
    let api = stack().client("ada", &unique_name("socket-actions"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let mut socket = open(&api, id, "");
    let mut events = Vec::new();

    // One enqueue: the reply's body has the HTTP answer's shape ({"id"}).
    socket.send(&enqueue_frame("one", None, "socket message one"));
    let reply = socket.reply("one", WAIT, &mut events);
    assert_eq!(reply["status"], 200, "{reply}");
    let http = api.enqueue_raw(id, "followUp", "http message").json();
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys(&reply["body"]), keys(&http), "{reply} vs {http}");
    api.wait_idle(id, TURN);

    // A burst on one socket: one reply each, each message once in the transcript.
    const BURST: usize = 20;
    for i in 0..BURST {
        let lane = if i % 2 == 0 { Some("steer") } else { None };
        socket.send(&enqueue_frame(
            &format!("b{i}"),
            lane,
            &format!("burst {i}"),
        ));
    }
    let deadline = Instant::now() + TURN;
    let mut replies = std::collections::BTreeMap::new();
    while replies.len() < BURST {
        match socket.read(deadline) {
            SocketRead::Frame(frame) if frame["type"] == "reply" => {
                let key = frame["id"].as_str().expect("an id").to_string();
                assert!(
                    replies.insert(key, frame.clone()).is_none(),
                    "two replies: {frame}"
                );
            }
            SocketRead::Frame(_) => {}
            other => panic!("{} of {BURST} replies, then {other:?}", replies.len()),
        }
    }
    let item_ids: std::collections::BTreeSet<_> = replies
        .values()
        .map(|r| {
            assert_eq!(r["status"], 200, "{r}");
            r["body"]["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(item_ids.len(), BURST, "distinct queue item ids");
    api.wait_idle(id, TURN);
    let transcript = api.transcript(id);
    let user_texts: Vec<String> = transcript
        .iter()
        .filter_map(|e| serde_json::to_value(&e.payload).ok())
        .filter(|p| p["message"]["role"] == "user")
        .map(|p| p.to_string())
        .collect();
    for text in (0..BURST)
        .map(|i| format!("burst {i}"))
        .chain(["socket message one".to_string()])
    {
        let found = user_texts
            .iter()
            .filter(|t| t.contains(&format!("\"{text}\"")))
            .count();
        assert_eq!(
            found,
            1,
            "{text:?} in the transcript:\n{}",
            describe(&transcript)
        );
    }

    // stop: the HTTP answer's JSON.
    socket.send(&ClientFrame::Stop { id: "halt".into() });
    let reply = socket.reply("halt", WAIT, &mut events);
    let http = api.stop(id);
    assert_eq!(reply["status"], 200, "{reply}");
    assert_eq!(reply["body"], serde_json::to_value(&http).unwrap());

    // Errors are the HTTP errors: status, code and message.
    let cases: [(ClientFrame, wuhu_e2e::http::Response); 3] = [
        (
            ClientFrame::Cancel {
                id: "c".into(),
                body: CancelRequest { id: "nope".into() },
            },
            api.cancel(id, "nope"),
        ),
        (
            enqueue_frame("lane", Some("system"), "x"),
            api.enqueue_raw(id, "system", "x"),
        ),
        (
            enqueue_frame("empty", None, "  "),
            api.enqueue_raw(id, "followUp", "  "),
        ),
    ];
    for (frame, http) in cases {
        let frame_id = frame.id().expect("an id").to_string();
        socket.send(&frame);
        let reply = socket.reply(&frame_id, WAIT, &mut events);
        assert!(http.status >= 400, "{http}");
        assert_eq!(reply["status"], http.status, "{reply} vs {http}");
        assert_eq!(reply["error"], http.json()["error"], "{reply} vs {http}");
    }
}

/// Frames that cannot be read get an error reply; the socket and the actor go on working.
#[test]
fn bad_frames_get_an_error_and_the_socket_goes_on() {
    let _guard = stack().guard();
    let api = stack().client("bea", &unique_name("socket-bad"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let mut socket = open(&api, id, "");
    let mut events = Vec::new();
    let oversize = format!(
        r#"{{"type":"enqueue","id":"big","body":{{"content":"{}"}}}}"#,
        "a".repeat(MAX_CLIENT_FRAME_BYTES)
    );
    let cases: [(&str, Option<&str>, u16, &str); 5] = [
        ("not json", None, 400, "invalid json frame"),
        (
            r#"{"type":"launch","id":"u"}"#,
            Some("u"),
            400,
            "unknown frame type",
        ),
        (r#"{"type":"stop"}"#, None, 400, "needs an \"id\""),
        (
            r#"{"type":"enqueue","id":"f","body":{}}"#,
            Some("f"),
            400,
            "missing field",
        ),
        (oversize.as_str(), None, 413, "exceeds"),
    ];
    for (text, want_id, status, fragment) in cases {
        socket.send_text(text);
        let reply = loop {
            let frame = socket.next_frame(WAIT);
            if frame["type"] == "reply" {
                break frame;
            }
            events.push(frame);
        };
        let shown: String = text.chars().take(60).collect();
        assert_eq!(reply["id"].as_str(), want_id, "{shown}: {reply}");
        assert_eq!(reply["status"], status, "{shown}: {reply}");
        assert!(
            reply["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(fragment),
            "{shown}: {reply}"
        );
    }
    socket.send_binary(b"\x00\x01");
    let reply = socket.next_frame(WAIT);
    assert_eq!(
        (reply["type"].clone(), reply["status"].clone()),
        (json!("reply"), json!(400)),
        "{reply}"
    );
    // Still working: an enqueue is answered and its turn streams to the same socket.
    socket.send(&enqueue_frame("ok", None, "still here"));
    let reply = socket.reply("ok", WAIT, &mut events);
    assert_eq!(reply["status"], 200, "{reply}");
    let deadline = Instant::now() + TURN;
    while !events.iter().any(|f| f["type"] == "idle") {
        match socket.read(deadline) {
            SocketRead::Frame(frame) => events.push(frame),
            other => panic!("no idle after the enqueue: {other:?}; {events:?}"),
        }
    }
    assert!(api.get(&format!("/v1/sessions/{id}")).status == 200);
}

/// Who may open a socket and act on it is who may follow and act over HTTP
/// (tests/tests/session_authority.rs): hidden sessions answer 404 at the upgrade, a member of a
/// tenant session may read and prompt but not stop, another tenant sees nothing.
#[test]
fn the_socket_has_the_authority_of_its_http_twins() {
    let _guard = stack().guard();
    let tenant = unique_name("socket-authz");
    let alice = stack().client("alice", &tenant);
    let bob = stack().client("bob", &tenant);
    let root = stack().admin_client("root", &tenant);
    let mallory = stack().client("alice", &unique_name("other"));
    let nobody = stack().client_with_token(None);
    let session = alice.create_fake_session();
    let id = session.id.as_str();
    // Alice prompts first: she owns it (a member who prompted first would own it).
    alice.enqueue(id, "followUp", "mine");
    alice.wait_idle(id, TURN);

    let refused = |api: &Api, want: u16, who: &str| match connect(api, id, "") {
        Ok(_) => panic!("{who}: the upgrade was accepted, want {want}"),
        Err((status, body)) => assert_eq!(status, want, "{who}: {body}"),
    };
    refused(&nobody, 401, "no credential");
    refused(&mallory, 404, "another tenant");
    refused(&bob, 404, "a member, private session");
    assert_eq!(
        bob.get(&format!("/v1/sessions/{id}/follow?timeoutSeconds=1"))
            .status,
        404,
        "the SSE twin agrees"
    );
    // Not an upgrade: 426.
    let plain = alice.get(&format!("/v1/sessions/{id}/socket"));
    assert_eq!(plain.status, 426, "{plain}");

    let opened = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(opened.status, 200, "{opened}");
    let mut events = Vec::new();
    let mut bob_socket = open(&bob, id, "");
    bob_socket.send(&enqueue_frame("p", None, "bob prompts"));
    let reply = bob_socket.reply("p", WAIT, &mut events);
    assert_eq!(
        reply["status"], 200,
        "bob prompts a tenant session: {reply}"
    );
    bob_socket.send(&ClientFrame::Stop { id: "s".into() });
    let reply = bob_socket.reply("s", WAIT, &mut events);
    let http = bob.post(&format!("/v1/sessions/{id}/stop"), &json!({}));
    assert_eq!(
        (reply["status"].clone(), http.status),
        (json!(403), 403),
        "{reply}"
    );
    assert_eq!(reply["error"], http.json()["error"]);
    let mut root_socket = open(&root, id, "");
    root_socket.send(&ClientFrame::Stop { id: "s".into() });
    assert_eq!(root_socket.reply("s", WAIT, &mut events)["status"], 200);

    // Made private again, bob's open socket may no longer act (404, as over HTTP).
    let closed = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "private"}));
    assert_eq!(closed.status, 200, "{closed}");
    bob_socket.send(&enqueue_frame("p2", None, "bob again"));
    let reply = bob_socket.reply("p2", WAIT, &mut events);
    assert_eq!(reply["status"], 404, "{reply}");
    // Even where the action itself would not ask (cancelling an unknown item): the session is
    // hidden from him, with the HTTP twin's answer.
    bob_socket.send(&ClientFrame::Cancel {
        id: "c2".into(),
        body: CancelRequest { id: "nope".into() },
    });
    let reply = bob_socket.reply("c2", WAIT, &mut events);
    let http = bob.cancel(id, "nope");
    assert_eq!(
        (reply["status"].clone(), http.status),
        (json!(404), 404),
        "{reply}"
    );
    assert_eq!(reply["error"], http.json()["error"], "{reply} vs {http}");
}

/// A socket opened with a minted token closes (4401) once the token is revoked; a cookie
/// upgrade from a foreign origin is refused (403), from this origin it works.
#[test]
fn revoked_credentials_close_the_socket_and_foreign_origins_are_refused() {
    let _guard = stack().guard();
    let tenant = unique_name("socket-revoke");
    let alice = stack().client("alice", &tenant);
    let minted = alice.post(
        "/v1/tokens",
        &json!({"name": "socket", "kind": "user", "ttlDays": 1}),
    );
    assert_eq!(minted.status, 201, "{minted}");
    let token = minted.json()["token"].as_str().unwrap().to_string();
    let jti = minted.json()["jti"].as_str().unwrap().to_string();
    let laptop = stack().client_with_token(Some(token.clone()));
    let session = laptop.create_fake_session();
    let id = session.id.clone();

    // The cookie session: this origin works, a foreign one is refused at the upgrade.
    let signed_in = Request::new("POST", stack().url("/v1/auth/session"))
        .bearer(&token)
        .header("Origin", stack().base_url())
        .send()
        .expect("sign in");
    assert_eq!(signed_in.status, 200, "{signed_in}");
    let cookie = signed_in
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .and_then(|(_, v)| v.split(';').next().map(str::to_string))
        .expect("a session cookie");
    let base = stack().base_url();
    let foreign = SessionSocket::connect(
        &base,
        &id,
        "",
        &SocketAuth::Cookie(cookie.clone(), Some("https://evil.example".into())),
    );
    assert_eq!(
        foreign.err().map(|e| e.0),
        Some(403),
        "a foreign origin's upgrade"
    );
    let mut cookie_socket = SessionSocket::connect(
        &base,
        &id,
        "",
        &SocketAuth::Cookie(cookie.clone(), Some(base.clone())),
    )
    .expect("a cookie upgrade from this origin");
    let mut events = Vec::new();
    cookie_socket.send(&enqueue_frame("c", None, "from the cookie socket"));
    assert_eq!(cookie_socket.reply("c", WAIT, &mut events)["status"], 200);

    let mut socket = open(&laptop, &id, "");
    registered(&mut socket);
    let revoked = alice.send(alice.request("DELETE", &format!("/v1/tokens/{jti}")));
    assert_eq!(revoked.status, 200, "{revoked}");
    let started = Instant::now();
    // Within the recheck interval (5 s) plus a registry round trip, without any frame sent.
    for (name, s) in [("bearer", &mut socket), ("cookie", &mut cookie_socket)] {
        let (frames, close) = s
            .wait_closed(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            close.map(|c| c.0),
            Some(CLOSE_REVOKED),
            "{name}: {frames:?}"
        );
        assert!(
            frames.iter().any(|f| f["type"] == "error"),
            "{name}: an error event before the close: {frames:?}"
        );
    }
    eprintln!(
        "revoked sockets closed {:?} after the revoke",
        started.elapsed()
    );
    assert_eq!(connect(&laptop, &id, "").err().map(|e| e.0), Some(401));
}

/// Sockets count against the session's follower cap and are forgotten when they close.
#[test]
fn closed_sockets_are_forgotten() {
    let _guard = stack().guard();
    let api = stack().client("cy", &unique_name("socket-count"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let followers = || api.get(&format!("/v1/sessions/{id}/stats")).json()["followers"].as_u64();
    let mut sockets: Vec<SessionSocket> = (0..5).map(|_| open(&api, id, "")).collect();
    for s in &mut sockets {
        registered(s);
    }
    assert_eq!(followers(), Some(5));
    for s in sockets {
        s.close();
    }
    wait_for("closed sockets to be forgotten", WAIT, || {
        (followers() == Some(0)).then_some(())
    });
}

/// The actor is evicted from memory while a socket stays open (the hibernation API), and the
/// next turn reaches the socket through its attachment: every entry once, in order, twice in a
/// row (so the second wake resumes from the cursor the first one's turn reached). Eviction needs
/// the actor idle for a while (about 10 s under `wrangler dev`), so each round waits idle first,
/// then starts a turn, until the Worker has logged two wakes that re-registered the socket.
#[test]
fn sockets_are_registered_again_after_the_actor_hibernates() {
    let _guard = stack().guard();
    let api = stack().client("hal", &unique_name("socket-hibernate"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let mut after = api.session(id).session.last_cursor;
    let mut socket = open(&api, id, &format!("?after={after}"));
    registered(&mut socket);
    let revived = || {
        stack()
            .log_events()
            .iter()
            .filter(|e| e["event"] == "sockets_revived" && e["session"] == id)
            .count()
    };
    let started = Instant::now();
    for round in 0..8 {
        // Idle time for the runtime to evict the actor: not a synchronisation.
        std::thread::sleep(Duration::from_secs(12));
        api.enqueue(id, "followUp", &format!("after a nap {round}"));
        let frames =
            read_live_idle(&mut socket, TURN).unwrap_or_else(|e| panic!("round {round}: {e}"));
        api.wait_idle(id, TURN);
        let transcript = api.transcript(id);
        check(&frames, &transcript, after).unwrap_or_else(|e| panic!("round {round}: {e}"));
        after = transcript.last().map_or(after, |e| e.cursor);
        // The ack window's count went on across the wake: an ack of every frame received is
        // taken silently (one of more frames than the server counts would get an error reply
        // with `id: null`, which `reply` refuses), and the next frame gets its own reply.
        socket.ack();
        socket.send(&ClientFrame::Cancel {
            id: format!("c{round}"),
            body: CancelRequest { id: "none".into() },
        });
        let reply = socket.reply(&format!("c{round}"), WAIT, &mut Vec::new());
        assert_eq!(reply["status"], 404, "round {round}: {reply}");
        if revived() >= 2 {
            eprintln!(
                "re-registered after {:?} (round {round})",
                started.elapsed()
            );
            return;
        }
    }
    panic!(
        "the actor was evicted {} times with its socket open, not twice",
        revived()
    );
}

/// Reads up to a live `idle` event (statuses sent by a re-registration included).
fn read_live_idle(socket: &mut SessionSocket, timeout: Duration) -> Result<Vec<Value>, String> {
    let deadline = Instant::now() + timeout;
    let mut frames = Vec::new();
    loop {
        match socket.read(deadline) {
            SocketRead::Frame(frame) => {
                let idle = frame["type"] == "idle";
                frames.push(frame);
                if idle {
                    return Ok(frames);
                }
            }
            other => return Err(format!("{other:?} before idle; read {frames:?}")),
        }
    }
}

/// Deleting the session ends its sockets: the follow stream's `error` event, then close code
/// 4404; a reconnect is a 404.
#[test]
fn deleting_the_session_closes_its_sockets() {
    let _guard = stack().guard();
    let api = stack().client("dee", &unique_name("socket-delete"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let mut socket = open(&api, id, "");
    registered(&mut socket);
    let deleted = api.send(api.request("DELETE", &format!("/v1/sessions/{id}")));
    assert!(deleted.status < 300, "{deleted}");
    let (frames, close) = socket.wait_closed(WAIT).expect("closed");
    assert_eq!(
        close.map(|c| c.0),
        Some(wuhu_core::socket::CLOSE_DELETED),
        "{frames:?}"
    );
    assert_eq!(
        frames.last().map(|f| f["type"].clone()),
        Some(json!("error")),
        "{frames:?}"
    );
    assert_eq!(connect(&api, id, "").err().map(|e| e.0), Some(404));
}

/// Sockets and follow streams share the per-session cap (`MAX_FOLLOWERS`): with it reached by
/// sockets, one more socket and one more follow stream are both refused with 429; a closed
/// socket frees its place.
#[test]
fn sockets_and_follow_streams_share_the_follower_cap() {
    use wuhu_core::follow::MAX_FOLLOWERS;
    let _guard = stack().guard();
    let api = stack().client("cap", &unique_name("socket-cap"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let last = api.session(id).session.last_cursor;
    let mut sockets: Vec<SessionSocket> = (0..MAX_FOLLOWERS)
        .map(|_| open(&api, id, &format!("?after={last}")))
        .collect();
    for s in &mut sockets {
        registered(s);
    }
    assert_eq!(
        connect(&api, id, "").err().map(|e| e.0),
        Some(429),
        "one socket over the cap"
    );
    let follow = api.send(
        api.request("GET", &format!("/v1/sessions/{id}/follow?timeoutSeconds=1"))
            .timeout(WAIT),
    );
    assert_eq!(follow.status, 429, "a follow stream over the cap: {follow}");
    sockets.pop().expect("a socket").close();
    wait_for("a closed socket to free its place", WAIT, || {
        connect(&api, id, &format!("?after={last}")).ok()
    });
}

/// A client that reads but never acknowledges is held to its window (`MAX_UNACKED_FRAMES`,
/// `MAX_UNACKED_BYTES`, one frame over): the server stops sending to it, its events queue in
/// its follow buffer, and once that overflows during long replies it gets `lagged` (the last
/// cursor sent) and close 4429. Another socket on the same session, which acks as the helper
/// does, gets every entry once; a reconnect with `?after=<lagged cursor>` gets the rest, with
/// nothing lost or repeated.
#[test]
fn a_socket_that_does_not_ack_is_lagged_and_resumes_losslessly() {
    const TURNS: usize = 8;
    const ENTRY_BYTES: usize = 200 * 1024;
    let _guard = stack().guard();
    let api = stack().client("ack", &unique_name("socket-acks"));
    let id = api.create_fake_session().id;
    let mut silent = open(&api, &id, "").without_acks();
    let mut acking = open(&api, &id, "");
    // Each reads its backfill up to the status after it: both are registered before the turns.
    let backfill = |socket: &mut SessionSocket| -> Vec<Value> {
        let mut frames = Vec::new();
        while frames.last().is_none_or(|f: &Value| f["type"] != "status") {
            frames.push(socket.next_frame(WAIT));
        }
        frames
    };
    let silent_backfill = backfill(&mut silent);
    let acking_backfill = backfill(&mut acking);
    let acking_frames = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let deadline = Instant::now() + TURN * 2;
            let mut frames = acking_backfill;
            while frames
                .iter()
                .filter(|f: &&Value| f["type"] == "idle")
                .count()
                < TURNS
            {
                match acking.read(deadline) {
                    SocketRead::Frame(frame) => frames.push(frame),
                    other => {
                        return Err(format!(
                            "the acking socket: {other:?} after {} frames",
                            frames.len()
                        ));
                    }
                }
            }
            Ok(frames)
        });
        for turn in 0..TURNS {
            let reply = format!("{turn}:{}", "y".repeat(ENTRY_BYTES));
            let content = fake_directive(&json!({"reply": reply, "chunks": 8, "delayMs": 0}));
            api.enqueue(&id, "followUp", &content);
            api.wait_idle(&id, TURN);
        }
        reader.join().expect("reader")
    });
    let acking_frames = acking_frames.unwrap_or_else(|e| panic!("{e}"));
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let last = transcript.last().expect("entries").cursor;

    // The socket that acks got everything, once, and was never lagged.
    check(&acking_frames, &transcript, 0).unwrap_or_else(|e| panic!("the acking socket: {e}"));
    assert!(
        !acking_frames.iter().any(|f| f["type"] == "lagged"),
        "the acking socket was lagged"
    );

    // The silent one: what it was sent stayed within the window, then `lagged` and 4429.
    let (rest, close) = silent.wait_closed(WAIT).unwrap_or_else(|e| {
        let e: String = e.chars().take(300).collect();
        panic!("the silent socket was not cut (read everything): {e}")
    });
    let frames: Vec<Value> = silent_backfill.into_iter().chain(rest).collect();
    assert_eq!(
        close.as_ref().map(|c| c.0),
        Some(CLOSE_LAGGED),
        "close {close:?}"
    );
    let lagged = frames.last().expect("frames");
    assert_eq!(lagged["type"], "lagged", "the last frame: {lagged}");
    let cursor = lagged["cursor"].as_u64().expect("lagged carries a cursor");
    let before: Vec<Value> = frames[..frames.len() - 1].to_vec();
    let sent = silent.received() - 1;
    let lagged_bytes = serde_json::to_string(lagged).expect("json").len() as u64;
    let largest = (ENTRY_BYTES + 4096) as u64;
    eprintln!(
        "silent socket: {sent} frames, {} bytes, then lagged at cursor {cursor} of {last}",
        silent.received_bytes() - lagged_bytes
    );
    assert!(
        sent <= MAX_UNACKED_FRAMES
            && silent.received_bytes() - lagged_bytes < MAX_UNACKED_BYTES + largest,
        "the silent socket was sent {sent} frames and {} bytes unacknowledged",
        silent.received_bytes()
    );
    assert!(cursor < last, "the silent socket was cut before the end");
    assert_eq!(
        cursors(&before).last().copied().unwrap_or(0),
        cursor,
        "lagged names the last cursor sent"
    );
    let upto: Vec<Entry> = transcript
        .iter()
        .filter(|e| e.cursor <= cursor)
        .cloned()
        .collect();
    check(&before, &upto, 0).unwrap_or_else(|e| panic!("the silent socket: {e}"));

    // Resuming from the lagged cursor: the rest, once.
    let mut resumed = open(&api, &id, &format!("?after={cursor}"));
    let rest = read_to_idle(&mut resumed, TURN).unwrap_or_else(|e| panic!("resumed: {e}"));
    check(&rest, &transcript, cursor).unwrap_or_else(|e| panic!("resumed: {e}"));
    let mut all = cursors(&before);
    all.extend(cursors(&rest));
    assert_eq!(all, (1..=last).collect::<Vec<_>>(), "lossless and once");
    resumed.close();
    acking.close();
}

/// A client that sends requests and never acknowledges what it is sent (a hostile script)
/// cannot make the actor pile up replies: once twice the window is unacknowledged, its next frame
/// is not run and the socket ends as a lagged one (`lagged`, 4429). Requests after the cut change
/// nothing.
#[test]
fn a_client_that_never_acks_its_replies_is_cut_at_twice_the_window() {
    // More requests than twice the window allows, with room for the few that may already be
    // running when the window fills (each waits for a credential check).
    const SLACK: u64 = 64;
    let window = 2 * MAX_UNACKED_FRAMES;
    let _guard = stack().guard();
    let api = stack().client("ack", &unique_name("socket-reply-window"));
    let id = api.create_fake_session().id;
    let mut socket = open(&api, &id, "").without_acks();
    let mut frames = Vec::new();
    while frames.last().is_none_or(|f: &Value| f["type"] != "status") {
        frames.push(socket.next_frame(WAIT));
    }
    let backfill = frames.len() as u64;
    let requests = window + SLACK;
    for n in 0..requests {
        let cancel = ClientFrame::Cancel {
            id: format!("c{n}"),
            body: CancelRequest {
                id: format!("no-such-item-{n}"),
            },
        };
        if socket.try_send(&cancel).is_err() {
            break;
        }
    }
    // Sent after the cut: never run.
    for n in 0..4 {
        let _ = socket.try_send(&enqueue_frame(&format!("e{n}"), None, "after the cut"));
    }
    let (rest, close) = socket.wait_closed(TURN).unwrap_or_else(|e| {
        panic!(
            "the socket was not cut: {}",
            e.chars().take(300).collect::<String>()
        )
    });
    assert_eq!(
        close.as_ref().map(|c| c.0),
        Some(CLOSE_LAGGED),
        "close {close:?}"
    );
    let (lagged, replies) = rest.split_last().expect("frames after the backfill");
    assert_eq!(lagged["type"], "lagged", "the last frame: {lagged}");
    for (n, reply) in replies.iter().enumerate() {
        assert_eq!(reply["type"], "reply", "frame {n}: {reply}");
        assert_eq!(reply["id"], format!("c{n}"), "replies in order: {reply}");
        assert_eq!(reply["status"], 404, "an unknown queue item: {reply}");
    }
    let sent = backfill + replies.len() as u64;
    eprintln!(
        "answered {} of {requests} requests; {sent} frames unacknowledged at the cut",
        replies.len()
    );
    assert!(
        sent >= window && sent < window + SLACK,
        "the server sent {sent} frames unacknowledged before the cut (window {window})"
    );
    // Frames are run in the order they arrive; those after the cut found the socket ended.
    let transcript = api.transcript(&id);
    assert!(
        !describe(&transcript).contains("after the cut"),
        "a request sent after the cut was run: {}",
        describe(&transcript)
    );
}

/// A message named by a key (`EnqueueRequest::key`) is queued once however often, and through
/// whichever door, its author sends it: every answer is the first one's (the same item id),
/// while it waits and after it was delivered, so a client that lost a reply may send again.
/// Another author's same key names another message; bad keys are refused.
#[test]
fn a_message_sent_again_with_its_key_is_queued_once() {
    const SENDERS: usize = 12;
    let _guard = stack().guard();
    let tenant = unique_name("socket-keys");
    let alice = stack().client("alice", &tenant);
    let bob = stack().client("bob", &tenant);
    let id = alice.create_fake_session().id;
    let shared = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(shared.status, 200, "{}", shared.text());
    let enqueue = |api: &Api, body: Value| {
        api.post(&format!("/v1/sessions/{id}/enqueue?lane=followUp"), &body)
    };
    // A slow first turn: what follows waits in the queue.
    let slow = fake_directive(&json!({"reply": "slow", "chunks": 8, "delayMs": 250}));
    alice.enqueue(&id, "followUp", &slow);

    // The same key from many senders at once, half over HTTP, half over sockets.
    let answers: Vec<String> = std::thread::scope(|scope| {
        let senders: Vec<_> = (0..SENDERS)
            .map(|n| {
                let (alice, id) = (&alice, &id);
                scope.spawn(move || {
                    let body = EnqueueRequest {
                        content: "keyed once".into(),
                        key: Some("msg-1".into()),
                        reasoning: None,
                    };
                    if n % 2 == 0 {
                        let answer = enqueue(alice, serde_json::to_value(&body).expect("json"));
                        assert_eq!(answer.status, 200, "sender {n}: {}", answer.text());
                        answer.json()["id"].as_str().expect("an id").to_string()
                    } else {
                        let mut socket = open(alice, id, "");
                        socket.send(&ClientFrame::Enqueue {
                            id: format!("s{n}"),
                            lane: None,
                            body,
                        });
                        let reply = socket.reply(&format!("s{n}"), WAIT, &mut Vec::new());
                        assert_eq!(reply["status"], 200, "sender {n}: {reply}");
                        socket.close();
                        reply["body"]["id"].as_str().expect("an id").to_string()
                    }
                })
            })
            .collect();
        senders
            .into_iter()
            .map(|s| s.join().expect("sender"))
            .collect()
    });
    let item = answers[0].clone();
    assert!(
        answers.iter().all(|a| *a == item),
        "every sender got the first answer: {answers:?}"
    );

    // Sent again with other text: the first message stands.
    let again = enqueue(&alice, json!({"content": "other text", "key": "msg-1"}));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["id"], item.as_str());
    let queue = alice.session(&id).queue;
    let waiting: Vec<&str> = queue
        .iter()
        .filter(|q| q.content == "keyed once" || q.content == "other text")
        .map(|q| q.id.as_str())
        .collect();
    assert_eq!(waiting, [item.as_str()], "queued once: {queue:?}");

    // Bob's key of the same name is his own message.
    let bobs = enqueue(&bob, json!({"content": "bob's", "key": "msg-1"}));
    assert_eq!(bobs.status, 200, "{}", bobs.text());
    assert_ne!(bobs.json()["id"], item.as_str());

    // Keys a client cannot repeat exactly are refused, and queue nothing.
    let too_long = "k".repeat(wuhu_core::session::MAX_ITEM_KEY_CHARS + 1);
    for key in ["", "two words", too_long.as_str()] {
        let refused = enqueue(&alice, json!({"content": "refused", "key": key}));
        assert_eq!(refused.status, 400, "key {key:?}: {}", refused.text());
        assert_eq!(refused.json()["error"]["code"], "bad_request");
    }

    // Delivered: sent again, it is answered as before and not queued again.
    alice.wait_idle(&id, TURN);
    let after = enqueue(&alice, json!({"content": "keyed once", "key": "msg-1"}));
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(after.json()["id"], item.as_str());
    let session = alice.session(&id);
    assert_eq!(session.session.status, Status::Idle, "no new turn");
    let transcript = alice.transcript(&id);
    let users: Vec<&str> = transcript.iter().filter_map(user_content).collect();
    assert_eq!(
        users.iter().filter(|c| **c == "keyed once").count(),
        1,
        "delivered once: {users:?}"
    );
    assert_eq!(users.iter().filter(|c| **c == "bob's").count(), 1);
    assert!(!users.iter().any(|c| *c == "other text" || *c == "refused"));
}

/// The frames a socket has ready go out packed, several to a message (`\n` between them, at most
/// `MESSAGE_BYTES` a message), as an SSE stream packs its chunks: a backfill of a few turns is a
/// handful of messages, not one per event, and splits back into the same frames.
#[test]
fn ready_frames_are_packed_into_few_messages() {
    let _guard = stack().guard();
    let api = stack().client("pack", &unique_name("socket-pack"));
    let id = api.create_fake_session().id;
    for turn in 0..4 {
        let content =
            fake_directive(&json!({"reply": format!("reply {turn} in a few words"), "chunks": 4}));
        api.enqueue(&id, "followUp", &content);
        api.wait_idle(&id, TURN);
    }
    let transcript = api.transcript(&id);
    let mut socket = open(&api, &id, "");
    let frames = read_to_idle(&mut socket, WAIT).unwrap_or_else(|e| panic!("{e}"));
    check(&frames, &transcript, 0).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{} frames in {} messages",
        socket.received(),
        socket.messages()
    );
    assert!(
        socket.received() > transcript.len() as u64,
        "every entry and the status: {} frames",
        socket.received()
    );
    assert!(
        socket.messages() * 4 <= socket.received(),
        "{} frames came in {} messages: the backfill was not packed",
        socket.received(),
        socket.messages()
    );
    socket.close();
}
