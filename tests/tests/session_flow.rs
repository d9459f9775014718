//! The session loop through the real Worker: create → enqueue → follow, steer, followUp,
//! cancel, stop, and lossless SSE reconnects. One `wrangler dev` for the file; every test uses
//! its own tenant.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::wire::{Entry, EntryPayload, Lane, Message, Status, StopReason, custom_types};
use wuhu_e2e::entries::{
    assert_contiguous, assistant, assistants, customs, describe, fake_directive, position_of_user,
    tool_result, user_content,
};
use wuhu_e2e::sse::summarize;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, SseEvent, Stack, wait_for};

const TURN: Duration = Duration::from_secs(60);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

fn alice() -> Api {
    stack().client("alice", &unique_name("flow"))
}

fn deltas(events: &[SseEvent]) -> String {
    events.iter().filter_map(SseEvent::delta).collect()
}

fn entries_of(events: &[SseEvent]) -> Vec<Entry> {
    events.iter().filter_map(SseEvent::entry).collect()
}

#[test]
fn create_enqueue_follow_streams_deltas_entries_idle_and_done() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_session(json!({"title": "first flow"}));
    assert_eq!(session.provider, "fake");
    assert_eq!(session.status, Status::Idle);
    assert_eq!(session.created_by, "alice");
    assert_eq!(session.title.as_deref(), Some("first flow"));
    assert_eq!(session.last_cursor, 1, "a new session holds its header");

    let mut follow = api.follow(&session.id, "sinceCursor=0&timeoutSeconds=10");
    let header = follow.collect_until(TURN, |e| e.event == "entry_appended");
    let header_entry = header[0].entry().expect("entry");
    assert_eq!(header[0].id, Some(1));
    assert!(
        matches!(header_entry.payload, EntryPayload::Header(_)),
        "{header:?}"
    );

    let reply = "Hello, follower! This reply arrives in pieces.";
    let content = format!(
        "hi there\n{}",
        fake_directive(&json!({"reply": reply, "chunks": 4, "delayMs": 40}))
    );
    let item_id = api.enqueue(&session.id, "followUp", &content);
    let events = follow.collect_until(TURN, |e| e.event == "idle");

    for event in &events {
        assert_eq!(
            event.data_type(),
            Some(event.event.as_str()),
            "data.type mirrors event: {event:?}"
        );
        match event.entry() {
            Some(entry) => assert_eq!(event.id, Some(entry.cursor), "id: is the cursor"),
            None => assert_eq!(event.id, None, "only entries carry an id: {event:?}"),
        }
    }
    let position = |pred: &dyn Fn(&SseEvent) -> bool| {
        events
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("missing event; got {}", summarize(&events)))
    };
    let user_at = position(&|e| {
        e.entry()
            .is_some_and(|entry| user_content(&entry) == Some(content.as_str()))
    });
    let running_at = position(&|e| e.event == "status" && e.data["status"] == "running");
    let first_delta_at = position(&|e| e.event == "assistant_text_delta");
    let assistant_at = position(&|e| e.entry().is_some_and(|entry| assistant(&entry).is_some()));
    let idle_at = events.len() - 1;
    assert!(
        user_at < first_delta_at && running_at < first_delta_at,
        "{}",
        summarize(&events)
    );
    assert!(
        first_delta_at < assistant_at && assistant_at < idle_at,
        "{}",
        summarize(&events)
    );
    assert!(
        events.iter().filter(|e| e.delta().is_some()).count() >= 2,
        "streamed in pieces: {}",
        summarize(&events)
    );
    assert_eq!(deltas(&events), reply);

    let user = events[user_at].entry().unwrap();
    let EntryPayload::Message {
        message:
            Message::User {
                author,
                queue_item_id,
                lane,
                ..
            },
    } = &user.payload
    else {
        unreachable!()
    };
    assert_eq!(
        (author.as_str(), queue_item_id.as_deref(), *lane),
        ("alice", Some(item_id.as_str()), Some(Lane::FollowUp))
    );
    let assistant_entry = events[assistant_at].entry().unwrap();
    let message = assistant(&assistant_entry).unwrap();
    assert_eq!(message.text(), reply);
    assert_eq!(message.stop_reason, StopReason::Stop);
    assert_eq!(message.provider, "fake");

    // timeoutSeconds ends the stream with `done`, then the connection closes.
    let rest = follow.collect_to_end(Duration::from_secs(40));
    assert_eq!(
        rest.last().map(|e| e.event.as_str()),
        Some("done"),
        "{}",
        summarize(&rest)
    );

    // A replay from the start with stopAfterIdle: every entry once, then idle and done.
    let transcript = api.transcript(&session.id);
    assert_contiguous(&transcript);
    let mut replay = api.follow(&session.id, "sinceCursor=0&stopAfterIdle=1");
    let replayed = replay.collect_to_end(TURN);
    let names: Vec<&str> = replayed.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        &names[names.len() - 2..],
        ["idle", "done"],
        "{}",
        summarize(&replayed)
    );
    assert_eq!(entries_of(&replayed), transcript);

    // sinceCursor skips what the client has.
    let mut tail = api.follow(&session.id, "sinceCursor=2&stopAfterIdle=1");
    let cursors: Vec<u64> = entries_of(&tail.collect_to_end(TURN))
        .iter()
        .map(|e| e.cursor)
        .collect();
    assert_eq!(cursors, (3..=transcript.len() as u64).collect::<Vec<_>>());
}

#[test]
fn steer_mid_turn_skips_the_remaining_tool_calls_and_is_answered_next() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let mut follow = api.follow(&session.id, "sinceCursor=0&timeoutSeconds=60");
    let first = fake_directive(&json!({
        "reply": "let me look at your sessions first",
        "chunks": 10,
        "delayMs": 300,
        "toolCalls": [{"name": "list_sessions", "arguments": {}}, {"name": "list_sessions", "arguments": {"limit": 1}}],
        "afterTools": "this must never be said",
    }));
    api.enqueue(&session.id, "followUp", &first);
    follow.collect_until(TURN, |e| e.event == "assistant_text_delta");
    let steer_id = api.enqueue(&session.id, "steer", "change of plans");
    // Still queued: the assistant message is streaming.
    let queue = api.session(&session.id).queue;
    assert!(
        queue
            .iter()
            .any(|item| item.id == steer_id && item.lane == Lane::Steer),
        "{queue:?}"
    );
    api.wait_idle(&session.id, TURN);

    let transcript = api.transcript(&session.id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let first_at = position_of_user(&transcript, &first).unwrap_or_else(|| panic!("{text}"));
    let steer_at =
        position_of_user(&transcript, "change of plans").unwrap_or_else(|| panic!("{text}"));
    let calls: Vec<_> = assistant(&transcript[first_at + 1])
        .expect("assistant after the first message")
        .tool_calls()
        .cloned()
        .collect();
    assert_eq!(calls.len(), 2, "{text}");
    let results: Vec<_> = transcript[first_at + 2..steer_at]
        .iter()
        .filter_map(tool_result)
        .collect();
    assert_eq!(results.len(), 2, "every call has a result: {text}");
    for call in &calls {
        let result = results
            .iter()
            .find(|r| r.tool_call_id == call.id)
            .unwrap_or_else(|| panic!("no result for {}: {text}", call.id));
        assert!(
            result.is_error && result.content.to_lowercase().contains("skipped"),
            "call {} not skipped: {text}",
            call.id
        );
    }
    let EntryPayload::Message {
        message: Message::User { lane, .. },
    } = &transcript[steer_at].payload
    else {
        unreachable!()
    };
    assert_eq!(*lane, Some(Lane::Steer));
    let after: Vec<String> = transcript[steer_at + 1..]
        .iter()
        .filter_map(assistant)
        .map(|m| m.text())
        .collect();
    assert_eq!(after, ["echo: change of plans"], "{text}");
    assert!(
        assistants(&transcript)
            .iter()
            .all(|m| m.text() != "this must never be said"),
        "{text}"
    );
}

#[test]
fn follow_up_is_delivered_only_when_the_running_turn_would_stop() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let first = fake_directive(&json!({
        "reply": "checking",
        "chunks": 4,
        "delayMs": 250,
        "toolCalls": [{"name": "list_sessions", "arguments": {}}],
        "afterTools": "first turn done",
    }));
    api.enqueue(&session.id, "followUp", &first);
    let second_id = api.enqueue(&session.id, "followUp", "second message");
    let page = api.session(&session.id);
    assert_eq!(page.session.status, Status::Running);
    assert!(
        page.queue
            .iter()
            .any(|item| item.id == second_id && item.lane == Lane::FollowUp),
        "{page:?}"
    );
    api.wait_idle(&session.id, TURN);

    let transcript = api.transcript(&session.id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let second_at =
        position_of_user(&transcript, "second message").unwrap_or_else(|| panic!("{text}"));
    let done_at = transcript
        .iter()
        .position(|e| assistant(e).is_some_and(|m| m.text() == "first turn done"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        done_at < second_at,
        "followUp delivered before the first turn ended: {text}"
    );
    let result = transcript
        .iter()
        .find_map(tool_result)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!result.is_error, "list_sessions ran: {text}");
    assert_eq!(
        assistants(&transcript).last().unwrap().text(),
        "echo: second message",
        "{text}"
    );
}

#[test]
fn cancel_removes_a_queued_item_and_refuses_delivered_or_unknown_ones() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let slow = fake_directive(&json!({"reply": "slow first turn", "chunks": 6, "delayMs": 250}));
    let first_id = api.enqueue(&session.id, "followUp", &slow);
    let cancelled_id = api.enqueue(&session.id, "followUp", "never delivered");
    let kept_id = api.enqueue(&session.id, "followUp", "delivered later");

    let response = api.cancel(&session.id, &cancelled_id);
    response.expect_status(200);
    let queue = api.session(&session.id).queue;
    let ids: Vec<&str> = queue.iter().map(|item| item.id.as_str()).collect();
    assert_eq!(ids, [kept_id.as_str()], "{queue:?}");

    let delivered = api.cancel(&session.id, &first_id).expect_error(409);
    assert_eq!(delivered.code, "already_delivered");
    api.cancel(&session.id, "no-such-item").expect_error(404);
    api.cancel(&session.id, &cancelled_id).expect_error(404);

    api.wait_idle(&session.id, TURN);
    let transcript = api.transcript(&session.id);
    let text = describe(&transcript);
    assert!(
        position_of_user(&transcript, "never delivered").is_none(),
        "{text}"
    );
    assert!(
        position_of_user(&transcript, "delivered later").is_some(),
        "{text}"
    );
    assert!(!text.contains("never delivered"), "{text}");
    api.cancel(&session.id, &kept_id).expect_error(409);
}

#[test]
fn stop_mid_turn_records_the_stop_and_the_next_enqueue_resumes() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let mut follow = api.follow(&session.id, "sinceCursor=0&timeoutSeconds=60");
    let long = fake_directive(
        &json!({"reply": "a long answer that is stopped halfway through", "chunks": 20, "delayMs": 300}),
    );
    api.enqueue(&session.id, "followUp", &long);
    follow.collect_until(TURN, |e| e.event == "assistant_text_delta");

    let stopped = api.stop(&session.id);
    assert_eq!(stopped.status, Status::Stopped);
    assert_eq!(stopped.stopped_tool_calls, 0);
    let events = follow.collect_until(TURN, |e| {
        e.event == "status" && e.data["status"] == "stopped"
    });
    let stop_entry = events
        .iter()
        .filter_map(SseEvent::entry)
        .find(|e| customs(std::slice::from_ref(e), custom_types::EXECUTION_STOPPED).len() == 1)
        .unwrap_or_else(|| panic!("no stop entry streamed; {}", summarize(&events)));
    let data = &customs(
        std::slice::from_ref(&stop_entry),
        custom_types::EXECUTION_STOPPED,
    )[0];
    assert_eq!(data["by"], "alice");
    assert_eq!(api.session(&session.id).session.status, Status::Stopped);

    api.enqueue(&session.id, "followUp", "resume please");
    api.wait_idle(&session.id, TURN);
    let transcript = api.transcript(&session.id);
    assert_contiguous(&transcript);
    let text = describe(&transcript);
    let texts: Vec<String> = assistants(&transcript).iter().map(|m| m.text()).collect();
    assert_eq!(
        texts,
        ["echo: resume please"],
        "the stopped inference is discarded: {text}"
    );
    let stop_at = transcript
        .iter()
        .position(|e| e.id == stop_entry.id)
        .unwrap();
    assert!(
        stop_at < position_of_user(&transcript, "resume please").unwrap(),
        "{text}"
    );
}

#[test]
fn sse_reconnect_with_last_event_id_sees_every_entry_exactly_once() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let turn = |n: u32| {
        fake_directive(&json!({
            "reply": format!("turn {n} says hello in several chunks"),
            "chunks": 5,
            "delayMs": 120,
            "toolCalls": [{"name": "list_sessions", "arguments": {}}, {"name": "list_sessions", "arguments": {}}],
            "afterTools": format!("turn {n} finished after tools"),
        }))
    };
    let mut first = api.follow(&session.id, "sinceCursor=0");
    api.enqueue(&session.id, "followUp", &turn(1));
    api.enqueue(&session.id, "followUp", &turn(2));
    api.enqueue(&session.id, "followUp", &turn(3));
    let mut seen: Vec<Entry> = Vec::new();
    let deadline = Instant::now() + TURN;
    while seen.len() < 4 {
        let event = first
            .next_event(deadline)
            .expect("read follow")
            .expect("stream open");
        seen.extend(event.entry());
    }
    let last = first.last_event_id().expect("an id was seen");
    assert_eq!(last, seen.last().unwrap().cursor);
    first.close();

    // Entries keep coming while nobody follows.
    wait_for("entries appended while disconnected", TURN, || {
        (api.session(&session.id).session.last_cursor > last + 2).then_some(())
    });
    let mut second = api.follow_from(&session.id, "stopAfterIdle=1", Some(last));
    let events = second.collect_to_end(Duration::from_secs(90));
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("done"),
        "{}",
        summarize(&events)
    );
    seen.extend(entries_of(&events));

    api.wait_idle(&session.id, TURN);
    let transcript = api.transcript(&session.id);
    assert_contiguous(&transcript);
    let cursors: Vec<u64> = seen.iter().map(|e| e.cursor).collect();
    let unique: HashSet<u64> = cursors.iter().copied().collect();
    assert_eq!(
        unique.len(),
        cursors.len(),
        "duplicate cursors across connections: {cursors:?}"
    );
    assert_eq!(
        seen, transcript,
        "two connections together must equal the transcript"
    );

    // Last-Event-ID wins over sinceCursor (what a browser EventSource sends on reconnect).
    let n = transcript.len() as u64;
    let mut third = api.follow_from(&session.id, "sinceCursor=0&stopAfterIdle=1", Some(n - 2));
    let cursors: Vec<u64> = entries_of(&third.collect_to_end(TURN))
        .iter()
        .map(|e| e.cursor)
        .collect();
    assert_eq!(cursors, [n - 1, n]);
}

#[test]
fn sessions_list_newest_first_with_pages_and_titles_can_be_changed() {
    let _guard = stack().guard();
    let tenant = unique_name("list");
    let api = stack().client("alice", &tenant);
    // Created back to back, so several share a `createdAt` second: the order must still be
    // newest first.
    let ids: Vec<String> = (0..5)
        .map(|i| api.create_session(json!({"title": format!("s{i}")})).id)
        .collect();
    let newest_first: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    let mut listed: Vec<String> = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..5 {
        let query = match &before {
            Some(before) => format!("limit=2&before={before}"),
            None => "limit=2".to_string(),
        };
        let page = api.list_sessions(&query);
        assert!(page.sessions.len() <= 2);
        listed.extend(page.sessions.into_iter().map(|s| s.id));
        before = page.next_before;
        if before.is_none() {
            break;
        }
    }
    let unique: HashSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "pages overlap: {listed:?}");
    let mut sorted = listed.clone();
    sorted.sort();
    let mut want: Vec<String> = ids.clone();
    want.sort();
    assert_eq!(sorted, want, "pages must list every session once");

    let patched = api.patch(
        &format!("/v1/sessions/{}", ids[0]),
        &json!({"title": "renamed"}),
    );
    patched.expect_status(200);
    assert_eq!(
        api.session(&ids[0]).session.title.as_deref(),
        Some("renamed")
    );
    wait_for("the index to show the new title", TURN, || {
        api.list_sessions("limit=10")
            .sessions
            .iter()
            .any(|s| s.title.as_deref() == Some("renamed"))
            .then_some(())
    });
    assert!(
        stack()
            .client("alice", &unique_name("other"))
            .list_sessions("")
            .sessions
            .is_empty()
    );
    assert_eq!(
        listed, newest_first,
        "newest first, also within one createdAt second"
    );
}

#[test]
fn since_time_filters_reads_and_replays() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    api.enqueue(&session.id, "followUp", "what time is it?");
    api.wait_idle(&session.id, TURN);
    let transcript = api.transcript(&session.id);
    let first_time = transcript[0].created_at;
    let all = api.session_page(&session.id, &format!("sinceTime={}", first_time - 1));
    assert_eq!(all.transcript, transcript);
    let future = wuhu_e2e::util::unix_now() + 3600;
    let none = api.session_page(&session.id, &format!("sinceTime={future}"));
    assert!(none.transcript.is_empty(), "{:?}", none.transcript);
    let mut follow = api.follow(
        &session.id,
        &format!("sinceCursor=0&sinceTime={future}&stopAfterIdle=1"),
    );
    let events = follow.collect_to_end(TURN);
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["status", "idle", "done"], "{}", summarize(&events));
    assert_eq!(events[0].data["status"], "idle");
}

#[test]
fn an_idle_follow_stream_sends_heartbeat_comments() {
    let _guard = stack().guard();
    let api = alice();
    let session = api.create_fake_session();
    let mut follow = api.follow(&session.id, "sinceCursor=1&timeoutSeconds=40");
    let deadline = Instant::now() + Duration::from_secs(30);
    // The first event says the session is at rest (nothing to replay); then, on a quiet
    // session, the next item must be a heartbeat.
    match follow.next_item(deadline) {
        Ok(Some(wuhu_e2e::SseItem::Event(event))) => {
            assert_eq!(event.event, "status", "{event:?}");
            assert_eq!(event.data["status"], "idle", "{event:?}");
        }
        other => panic!("expected the status at registration first: {other:?}"),
    }
    match follow.next_item(deadline) {
        Ok(Some(wuhu_e2e::SseItem::Comment(comment))) => assert_eq!(comment, "heartbeat"),
        Ok(Some(wuhu_e2e::SseItem::Event(event))) => {
            panic!("unexpected event on an idle session: {event:?}")
        }
        Ok(None) => panic!("the stream ended before a heartbeat"),
        Err(err) => panic!("no heartbeat within 30 s: {err}"),
    }
}
