//! A session with 100,000 entries keeps its actor's storage bounded: SQLite holds only the hot
//! tail (unarchived entries plus `HOT_TAIL_KEEP` archived ones) and the segment list, and the
//! newest entries are still served.
//!
//! Entries are made cheaply: a scripted turn calls a tool that does not exist 1000 times, and
//! the session answers each call with an error result without any I/O.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::archive::{FLUSH_ENTRIES, HOT_TAIL_KEEP};
use wuhu_e2e::entries::fake_directive;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions};

const TARGET_ENTRIES: u64 = 100_000;
const CALLS_PER_TURN: usize = 1000;

#[test]
fn storage_stays_bounded_at_one_hundred_thousand_entries() {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let _guard = stack.guard();
    let api = stack.client("alice", &unique_name("bounded"));
    let session = api.create_fake_session();
    let id = session.id.as_str();
    let calls: Vec<Value> = (0..CALLS_PER_TURN)
        .map(|_| json!({"name": "no_such_tool"}))
        .collect();
    let content = fake_directive(&json!({"toolCalls": calls, "afterTools": "done"}));

    let started = Instant::now();
    let mut last_cursor = session.last_cursor;
    let mut samples = Vec::new();
    while last_cursor < TARGET_ENTRIES {
        api.enqueue(id, "followUp", &content);
        last_cursor = api
            .wait_idle(id, Duration::from_secs(120))
            .session
            .last_cursor;
        let stats = stats(&api, id);
        samples.push((
            last_cursor,
            stats["databaseBytes"].as_u64().unwrap_or(0),
            stats["hotEntries"].as_u64().unwrap_or(0),
        ));
    }
    eprintln!("{last_cursor} entries in {:?}", started.elapsed());

    // The hot tail never holds more than the unarchived entries plus HOT_TAIL_KEEP archived ones;
    // the threshold flush keeps the unarchived ones under one segment (an idle session's rest is
    // archived a moment later), so it is at most HOT_TAIL_KEEP + one segment.
    let bound = HOT_TAIL_KEEP + FLUSH_ENTRIES;
    for (cursor, bytes, hot) in &samples {
        assert!(
            *hot <= bound,
            "at {cursor} entries the actor holds {hot} entries in SQLite (bound {bound})"
        );
        let _ = bytes;
    }
    // SQLite size at 100k entries is no larger than at 10k (plus slack for the segment list,
    // which grows by one small row per 512 entries).
    let at = |n: u64| {
        samples
            .iter()
            .find(|(c, _, _)| *c >= n)
            .map(|s| s.1)
            .unwrap_or(0)
    };
    let (early, late) = (at(10_000), at(TARGET_ENTRIES));
    eprintln!("database bytes: {early} at 10k entries, {late} at {last_cursor} entries");
    assert!(
        late <= early * 2 + 256 * 1024,
        "SQLite grew from {early} to {late} bytes"
    );

    // The newest and the oldest entries are both still readable.
    let page = api.session_page(id, &format!("sinceCursor={}&limit=10", last_cursor - 10));
    assert_eq!(page.transcript.last().map(|e| e.cursor), Some(last_cursor));
    let first = api.session_page(id, "sinceCursor=0&limit=5");
    assert_eq!(first.transcript.first().map(|e| e.cursor), Some(1));
}

fn stats(api: &wuhu_e2e::Api, id: &str) -> Value {
    let response = api.get(&format!("/v1/sessions/{id}/stats"));
    assert_eq!(response.status, 200, "stats: {:?}", response.text());
    response.json()
}
