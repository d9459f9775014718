//! `wrangler dev` SIGKILLed in the middle of turns and started again on the same state: the
//! turns finish, nothing is lost and nothing is written twice.

use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::wire::{Entry, Status};
use wuhu_e2e::entries::{
    assert_contiguous, assistant, assistants, describe, fake_directive, tool_result, user_content,
};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, wait_for};

/// Long enough for the watchdog alarm (30 s after the turn started) plus the retried step.
const RESUME: Duration = Duration::from_secs(150);

#[test]
fn killed_mid_turn_the_turns_finish_after_restart_without_loss_or_duplicates() {
    let mut stack = Stack::start();
    let tenant = unique_name("restart");
    let api = stack.client("alice", &tenant);

    // A: killed while its only assistant message streams. Nobody touches it after the restart:
    // only the alarm can resume it.
    let a = api.create_fake_session();
    let a_reply = "this reply streams slowly and is cut by a SIGKILL, then retried whole";
    let a_content = fake_directive(&json!({"reply": a_reply, "chunks": 12, "delayMs": 400}));
    // B: killed while the step after its tool results streams; polled after the restart.
    let b = api.create_fake_session();
    let b_content = fake_directive(&json!({
        "toolCalls": [{"name": "list_sessions", "arguments": {}}, {"name": "list_sessions", "arguments": {"limit": 1}}],
        "afterTools": "the reply after the tools survives a restart",
        "chunks": 12,
        "delayMs": 400,
    }));

    let mut follow_a = api.follow(&a.id, "sinceCursor=0&timeoutSeconds=120");
    api.enqueue(&a.id, "followUp", &a_content);
    api.enqueue(&b.id, "followUp", &b_content);
    follow_a.collect_until(Duration::from_secs(30), |e| {
        e.event == "assistant_text_delta"
    });
    let b_before = api.wait_transcript(
        &b.id,
        "B's tool results",
        Duration::from_secs(60),
        |entries| entries.iter().filter(|e| tool_result(e).is_some()).count() == 2,
    );
    let a_before = api.transcript(&a.id);
    assert_eq!(api.session(&a.id).session.status, Status::Running);
    assert_eq!(api.session(&b.id).session.status, Status::Running);
    assert!(
        assistants(&a_before).is_empty(),
        "A must still be streaming: {}",
        describe(&a_before)
    );
    assert_eq!(
        assistants(&b_before).len(),
        1,
        "B must be streaming its second step: {}",
        describe(&b_before)
    );

    stack.restart_killed();
    drop(follow_a);
    let api = stack.client("alice", &tenant);

    // B is resumed by the request that loads it.
    let b_after = api.wait_transcript(&b.id, "B's final reply", RESUME, |entries| {
        entries
            .iter()
            .filter_map(assistant)
            .any(|m| m.text() == "the reply after the tools survives a restart")
    });
    // A is resumed by its alarm: watch it through the tenant index only.
    let started = Instant::now();
    wait_for(
        "A to finish through its alarm (seen in the session list)",
        RESUME,
        || {
            let list = api.list_sessions("limit=10");
            let info = list.sessions.iter().find(|s| s.id == a.id)?;
            (info.status == Status::Idle && info.last_cursor > a_before.last().unwrap().cursor)
                .then_some(())
        },
    );
    eprintln!("A resumed without requests after {:?}", started.elapsed());
    let a_after = api.transcript(&a.id);
    api.wait_idle(&b.id, RESUME);

    check_resumed(&a_before, &a_after, &a_content);
    check_resumed(&b_before, &b_after, &b_content);
    let a_replies: Vec<String> = assistants(&a_after).iter().map(|m| m.text()).collect();
    assert_eq!(a_replies, [a_reply], "{}", describe(&a_after));
    let b_replies: Vec<String> = assistants(&b_after).iter().map(|m| m.text()).collect();
    assert_eq!(
        b_replies,
        ["", "the reply after the tools survives a restart"],
        "{}",
        describe(&b_after)
    );
    assert_eq!(
        b_after.iter().filter(|e| tool_result(e).is_some()).count(),
        2,
        "{}",
        describe(&b_after)
    );

    // The follow stream of the restarted Worker replays the same entries.
    let mut replay = api.follow(&a.id, "sinceCursor=0&stopAfterIdle=1");
    let replayed: Vec<Entry> = replay
        .collect_to_end(Duration::from_secs(30))
        .iter()
        .filter_map(|e| e.entry())
        .collect();
    assert_eq!(replayed, a_after);
}

/// Entries from before the kill are unchanged, cursors are contiguous, ids unique, and the
/// user message was delivered once.
fn check_resumed(before: &[Entry], after: &[Entry], content: &str) {
    assert_contiguous(after);
    assert_eq!(
        &after[..before.len()],
        before,
        "entries from before the kill changed:\n{}",
        describe(after)
    );
    let users = after
        .iter()
        .filter(|e| user_content(e) == Some(content))
        .count();
    assert_eq!(users, 1, "{}", describe(after));
}
