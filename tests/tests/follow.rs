//! The follow stream is lossless, consistent and bounded.
//!
//! The main invariant: every follower sees every entry of a turn before that turn's `idle`,
//! in cursor order, exactly once, whenever it connected.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::archive;
use wuhu_core::follow::MAX_FOLLOWERS;
use wuhu_core::wire::{Entry, Status};
use wuhu_e2e::entries::{assert_contiguous, assistant, describe, fake_directive};
use wuhu_e2e::sse::summarize;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{FollowOpen, Gate, Reply, SseEvent, SseStream, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(60);
/// Every follower of the invariant test stops at the first idle it reaches.
const FOLLOW_TO_IDLE: &str = "sinceCursor=0&stopAfterIdle=1&timeoutSeconds=120";

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

/// When a follower of the invariant test connected, relative to its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moment {
    /// Before the enqueue was sent: the session was at rest.
    BeforeEnqueue,
    /// After the enqueue was acknowledged: the turn had started.
    DuringTurn,
}

struct Follower {
    moment: Moment,
    opened_after: Duration,
    stream: SseStream,
}

/// Live followers opened at many moments of a turn that calls a tool (`js` `1+1`) and then
/// streams a text reply: each stops at an idle, and what it received before that idle is
/// exactly the transcript up to that idle, final assistant message included.
#[test]
fn live_followers_see_every_entry_of_a_turn_before_its_idle() {
    const TURNS: usize = 12;
    /// Threads opening followers during a turn, and followers each opens at most (all of a
    /// turn's followers stay under the per-session cap).
    const OPENERS: usize = 3;
    const PER_OPENER: usize = 20;
    let _guard = stack().guard();
    let api = stack().client("fiona", &unique_name("follow"));
    let model = unique_name("gpt-follow");
    let session = api.create_session(
        json!({"provider": "openai-compatible", "model": model, "systemPrompt": "be brief"}),
    );
    let id = session.id.as_str();
    let mut checked = 0;
    let mut failures = Vec::new();
    for turn in 0..TURNS {
        let reply = format!("Turn {turn}: one plus one is two, computed by the js tool.");
        // Chunk delays stretch both streams over a few hundred milliseconds; they vary per turn
        // so the follower openings fall at different points of each stream.
        let delay = Duration::from_millis(10 + 7 * turn as u64);
        stack().openai().script(
            &model,
            [
                Reply::tool_calls([("js", json!({"code": "1+1"}))]).with_delay(delay),
                Reply::text(reply.clone()).with_delay(delay),
            ],
        );
        let before = api.session(id).session.last_cursor;
        let started = Instant::now();
        let mut followers = vec![Follower {
            moment: Moment::BeforeEnqueue,
            opened_after: Duration::ZERO,
            stream: api.follow(id, FOLLOW_TO_IDLE),
        }];
        api.enqueue(id, "followUp", &format!("turn {turn}: what is 1+1?"));
        // Several openers, each opening followers back to back (each open is a round trip)
        // until the turn is over, so that followers connect at every stage of the turn.
        let turn_over = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    let (api, turn_over) = (&api, &turn_over);
                    scope.spawn(move || {
                        let mut opened = Vec::new();
                        while !turn_over.load(Ordering::Relaxed) && opened.len() < PER_OPENER {
                            opened.push(Follower {
                                moment: Moment::DuringTurn,
                                opened_after: started.elapsed(),
                                stream: api.follow(id, FOLLOW_TO_IDLE),
                            });
                        }
                        opened
                    })
                })
                .collect();
            wait_for("the turn to end", TURN, || {
                let page = api.session(id);
                (page.session.status != Status::Running && page.queue.is_empty()).then_some(())
            });
            turn_over.store(true, Ordering::Relaxed);
            for opener in openers {
                followers.extend(opener.join().expect("opener"));
            }
        });
        let transcript = api.transcript(id);
        assert_contiguous(&transcript);
        let after = transcript.last().map_or(0, |e| e.cursor);
        let last = transcript.last().and_then(assistant);
        assert_eq!(
            last.map(|m| m.text()),
            Some(reply.clone()),
            "turn {turn} ends with the text reply:\n{}",
            describe(&transcript)
        );
        for follower in &mut followers {
            checked += 1;
            let events = follower.stream.collect_to_end(TURN);
            if let Err(problem) =
                check_follower(&events, &transcript, before, after, follower.moment)
            {
                failures.push(format!(
                    "turn {turn}, follower opened {:?} after the enqueue ({:?}): {problem}\n{}",
                    follower.opened_after,
                    follower.moment,
                    summarize(&events)
                ));
            }
        }
    }
    eprintln!(
        "{checked} followers checked, {} missed or misordered entries",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} followers broke the invariant; first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// Followers of the many-followers test, by how they connect (200 in all: the figure).
const BEFORE_TURN: usize = 60;
/// Connecting during the reply, `RESUMING` of them with `Last-Event-ID` (every 14 followers, 5).
const DURING_TURN: usize = 90;
const RESUMING: usize = 50;
/// Deltas of the followed reply, one token each.
const DELTAS: usize = 1000;

/// The `i`th token of the many-followers reply: fixed width, so each of the fake provider's
/// `DELTAS` even chunks is exactly one token.
fn token(i: usize) -> String {
    format!("{i:04}|")
}

/// How many deltas the reference follower (opened before the turn) has seen; `None` once the
/// turn's `idle` arrived.
#[derive(Default)]
struct Progress {
    seen: Mutex<Option<usize>>,
    changed: Condvar,
}

impl Progress {
    fn set(&self, seen: Option<usize>) {
        *self.seen.lock().unwrap() = seen;
        self.changed.notify_all();
    }

    /// Waits until the reference follower has seen `n` deltas; panics at `deadline` or when the
    /// turn ended first.
    fn wait_for(&self, n: usize, deadline: Instant) {
        let mut seen = self.seen.lock().unwrap();
        while seen.is_some_and(|s| s < n) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the reference follower saw {seen:?} of {n}"
            );
            seen = self.changed.wait_timeout(seen, left).unwrap().0;
        }
        assert!(seen.is_some(), "the turn ended before delta {n}");
    }
}

/// What one follower of the many-followers test received.
struct Received {
    kind: &'static str,
    /// Entries after this cursor are due to it.
    since: u64,
    /// Deltas broadcast before it connected (all later ones are due to it).
    missed: usize,
    events: Vec<SseEvent>,
}

/// 200 followers on one session during a reply of 1,000 deltas: opened before the turn, at 20
/// moments of the reply, and resuming from cursors of the transcript with `Last-Event-ID`. The
/// provider's stream is held between bursts until the followers of that moment are connected,
/// so each follower knows which deltas are due to it: every one broadcast after it connected
/// (all 1,000 when it connected before the turn), in order, exactly once; then every entry after
/// its cursor exactly once in cursor order, the final message whole, and the turn's `idle`. Not
/// timed: each wait has a deadline, nothing sleeps.
#[test]
fn two_hundred_followers_of_a_long_reply_miss_nothing() {
    /// Deltas per provider write (the first write also carries the role frame, so it has one
    /// delta less). Not one delta per write: under `wrangler dev` every chunk written to every
    /// follow stream costs a loopback request from wrangler's inspector proxy, and 200 followers
    /// × 1,000 writes exhaust its file descriptors.
    const BURST: usize = 25;
    /// Moments followers connect at during the reply, every second write.
    const MOMENTS: usize = 20;
    // A stack of its own: wrangler's dev proxy is the bottleneck of 200 streams, and the other
    // tests of this file (the cap test opens 256) would share it.
    let stack = Stack::start();
    let _guard = stack.guard();
    let api = stack.client("many", &unique_name("many"));
    let model = unique_name("gpt-many");
    let id = api
        .create_session(json!({"provider": "openai-compatible", "model": model}))
        .id;
    let reply: String = (0..DELTAS).map(token).collect();
    let gate = Gate::new();
    stack.openai().script(
        &model,
        [
            Reply::text("a first turn"),
            Reply::text(reply.clone())
                .with_text_parts(DELTAS)
                .with_frames_per_write(BURST)
                .with_gate(&gate),
        ],
    );
    // A first turn, so that resuming followers have entries to backfill.
    api.enqueue(&id, "followUp", "hello");
    let before = api.wait_idle(&id, TURN).session.last_cursor;
    let deadline = Instant::now() + Duration::from_secs(90);
    let progress = Progress::default();
    progress.set(Some(0));
    let received: Vec<Received> = std::thread::scope(|scope| {
        let mut readers = Vec::new();
        // Before the turn: opened (so registered) before the enqueue, read until the turn's idle.
        let query = format!("sinceCursor={before}&timeoutSeconds=120");
        let opened: Vec<SseStream> = (0..BEFORE_TURN).map(|_| api.follow(&id, &query)).collect();
        for (n, mut stream) in opened.into_iter().enumerate() {
            let progress = &progress;
            readers.push(scope.spawn(move || {
                let mut events = Vec::new();
                let mut deltas = 0;
                while let Ok(Some(event)) = stream.next_event(deadline) {
                    let idle = event.event == "idle";
                    deltas += usize::from(event.event == "assistant_text_delta");
                    events.push(event);
                    if n == 0 {
                        progress.set((!idle).then_some(deltas));
                    }
                    if idle {
                        break;
                    }
                }
                if n == 0 {
                    progress.set(None);
                }
                Received {
                    kind: "before the turn",
                    since: before,
                    missed: 0,
                    events,
                }
            }));
        }
        api.enqueue(&id, "followUp", "a long reply, please");
        // During the turn: at moment m, once the reference follower has seen every delta of
        // the writes let out so far, a share of the followers connect; then two more writes.
        // A failed wait below must not leave the reply held (and every reader to its deadline).
        struct LetOut<'a>(&'a Gate);
        impl Drop for LetOut<'_> {
            fn drop(&mut self) {
                self.0.open(DELTAS);
            }
        }
        let _let_out = LetOut(&gate);
        let (opened_tx, opened_rx) = std::sync::mpsc::channel::<()>();
        let during = DURING_TURN + RESUMING;
        for moment in 0..MOMENTS {
            let write = 2 * moment;
            let missed = (BURST * (write + 1) - 1).min(DELTAS);
            progress.wait_for(missed, deadline);
            let these = (during * moment / MOMENTS)..(during * (moment + 1) / MOMENTS);
            for n in these.clone() {
                let (api, id, opened_tx) = (&api, id.as_str(), opened_tx.clone());
                readers.push(scope.spawn(move || {
                    let (kind, since, last_event_id) = if n % 14 < 5 {
                        // Resuming: from a cursor of the first turn, or the turn's first entry.
                        let since = n as u64 % (before + 2);
                        ("resuming", since, Some(since))
                    } else {
                        ("during the turn", before, None)
                    };
                    let query = match last_event_id {
                        Some(_) => "stopAfterIdle=1&timeoutSeconds=120".to_string(),
                        None => format!("sinceCursor={before}&stopAfterIdle=1&timeoutSeconds=120"),
                    };
                    let mut stream = api.follow_from(id, &query, last_event_id);
                    let _ = opened_tx.send(());
                    let mut events = Vec::new();
                    while let Ok(Some(event)) = stream.next_event(deadline) {
                        events.push(event);
                    }
                    Received {
                        kind,
                        since,
                        missed,
                        events,
                    }
                }));
            }
            for _ in these {
                let left = deadline.saturating_duration_since(Instant::now());
                opened_rx
                    .recv_timeout(left)
                    .expect("the followers of this moment connect");
            }
            gate.open(2);
        }
        drop(_let_out);
        readers
            .into_iter()
            .map(|r| r.join().expect("reader"))
            .collect()
    });
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    assert_eq!(
        transcript.last().and_then(assistant).map(|m| m.text()),
        Some(reply.clone()),
        "the turn ends with the whole reply:\n{}",
        describe(&transcript)
    );
    let tokens: Vec<String> = (0..DELTAS).map(token).collect();
    let mut failures = Vec::new();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for r in &received {
        *counts.entry(r.kind).or_default() += 1;
        let deltas: Vec<&str> = r.events.iter().filter_map(SseEvent::delta).collect();
        if let Err(problem) = check_many(r, &deltas, &tokens, &transcript) {
            failures.push(format!(
                "a follower {} (since {}): {problem}\n{}",
                r.kind,
                r.since,
                summarize(&r.events[r.events.len().saturating_sub(8)..])
            ));
        }
    }
    eprintln!(
        "{} followers {counts:?}, {} broke the invariant",
        received.len(),
        failures.len()
    );
    assert_eq!(received.len(), BEFORE_TURN + DURING_TURN + RESUMING);
    assert_eq!(counts.get("resuming"), Some(&RESUMING));
    assert!(
        failures.is_empty(),
        "{} of {} followers broke the invariant; first:\n{}",
        failures.len(),
        received.len(),
        failures[0]
    );
}

/// A follower of the many-followers test: its deltas are the reply's tokens after the ones
/// broadcast before it connected, its entries are the transcript after its cursor, and it ends
/// at the turn's `idle` (then `done` when it asked to stop there).
fn check_many(
    r: &Received,
    deltas: &[&str],
    tokens: &[String],
    transcript: &[Entry],
) -> Result<(), String> {
    let first = r.missed;
    if deltas.len() + first != tokens.len() {
        return Err(format!(
            "{} deltas; the {} after the {first} broadcast before it connected were due",
            deltas.len(),
            tokens.len() - first
        ));
    }
    if let Some(i) = deltas
        .iter()
        .zip(&tokens[first..])
        .position(|(d, t)| d != t)
    {
        return Err(format!(
            "deltas are not the reply's last {} tokens in order: the {i}th is {:?}, expected {:?}",
            deltas.len(),
            deltas[i],
            tokens[first + i]
        ));
    }
    let names: Vec<&str> = r.events.iter().map(|e| e.event.as_str()).collect();
    let ending: &[&str] = if r.kind == "before the turn" {
        &["idle"]
    } else {
        &["idle", "done"]
    };
    if !names.ends_with(ending) || names.iter().filter(|n| **n == "idle").count() != 1 {
        return Err(format!("does not end with one {ending:?}"));
    }
    let entries: Vec<Entry> = r.events.iter().filter_map(SseEvent::entry).collect();
    let due = &transcript[r.since.min(transcript.len() as u64) as usize..];
    if entries[..] != due[..] {
        let cursors: Vec<u64> = entries.iter().map(|e| e.cursor).collect();
        return Err(format!(
            "entries {cursors:?}, expected the transcript after cursor {}",
            r.since
        ));
    }
    Ok(())
}

/// What a follower of `FOLLOW_TO_IDLE` must have received: entries `1..=k` in order exactly
/// once, then `idle`, then `done`, where `k` is the last cursor at the idle it stopped at
/// (`before`, the idle before the turn, only when it connected before the enqueue).
fn check_follower(
    events: &[SseEvent],
    transcript: &[Entry],
    before: u64,
    after: u64,
    moment: Moment,
) -> Result<(), String> {
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    if !names.ends_with(&["idle", "done"]) {
        return Err("does not end with idle, done".into());
    }
    if names.iter().filter(|n| **n == "idle").count() != 1 {
        return Err("more than one idle".into());
    }
    let entries: Vec<Entry> = events.iter().filter_map(SseEvent::entry).collect();
    let cursors: Vec<u64> = entries.iter().map(|e| e.cursor).collect();
    let k = cursors.last().copied().unwrap_or(0);
    let allowed = match moment {
        Moment::BeforeEnqueue => vec![before, after],
        Moment::DuringTurn => vec![after],
    };
    if !allowed.contains(&k) {
        return Err(format!(
            "stopped at cursor {k}, expected one of {allowed:?} (cursors {cursors:?})"
        ));
    }
    if cursors != (1..=k).collect::<Vec<_>>() {
        return Err(format!("cursors are not 1..={k}: {cursors:?}"));
    }
    if entries[..] != transcript[..k as usize] {
        return Err("entries differ from the transcript".into());
    }
    Ok(())
}

/// A `@fake` message whose user entry and reply are each about `bytes` long.
fn big_turn(bytes: usize, tag: usize) -> String {
    let reply = format!("{tag}:{}", "y".repeat(bytes));
    fake_directive(&json!({"reply": reply, "chunks": 8, "delayMs": 0}))
}

/// A follower that does not read falls behind by more than its buffer bound: it gets `lagged`
/// (after what it was sent) and its stream ends; reconnecting with `Last-Event-ID` resumes
/// with nothing lost and nothing twice.
#[test]
fn a_slow_follower_is_lagged_and_resumes_losslessly() {
    const TURNS: usize = 24;
    const ENTRY_BYTES: usize = 700 * 1024;
    let _guard = stack().guard();
    let api = stack().client("sam", &unique_name("lagged"));
    let id = api.create_fake_session().id;
    // Opened before the turns; not read until they are over.
    let mut slow = api.follow(&id, "sinceCursor=0&timeoutSeconds=600");
    for turn in 0..TURNS {
        api.enqueue(&id, "followUp", &big_turn(ENTRY_BYTES, turn));
        api.wait_idle(&id, TURN);
    }
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    let total: usize = transcript.iter().map(archive::entry_bytes).sum();
    eprintln!(
        "{} entries, {} MiB of entries, plus as many bytes of deltas",
        transcript.len(),
        total >> 20
    );

    let mut events = Vec::new();
    let deadline = Instant::now() + TURN;
    while let Some(event) = slow
        .next_event(deadline)
        .expect("the slow stream ends by itself")
    {
        events.push(event);
    }
    let lagged: Vec<&SseEvent> = events.iter().filter(|e| e.event == "lagged").collect();
    assert_eq!(
        lagged.len(),
        1,
        "the slow follower was lagged once: {}",
        summarize(&events[events.len().saturating_sub(5)..])
    );
    assert_eq!(
        events.last().map(|e| e.event.as_str()),
        Some("lagged"),
        "lagged is the last event"
    );
    let first: Vec<Entry> = events.iter().filter_map(SseEvent::entry).collect();
    let cursor = lagged[0].data["cursor"]
        .as_u64()
        .expect("lagged carries a cursor");
    assert_eq!(Some(cursor), slow.last_event_id().or(Some(0)));
    assert!(
        (first.len() as u64) < transcript.last().unwrap().cursor,
        "the slow follower did not get everything before it was lagged"
    );

    let mut resumed = api.follow_from(&id, "stopAfterIdle=1", slow.last_event_id());
    let rest: Vec<Entry> = resumed
        .collect_to_end(TURN)
        .iter()
        .filter_map(SseEvent::entry)
        .collect();
    let all: Vec<Entry> = first.into_iter().chain(rest).collect();
    assert_eq!(all.len(), transcript.len(), "lossless and no duplicates");
    assert!(
        all == transcript,
        "the resumed stream differs from the transcript"
    );
}

/// A session accepts `MAX_FOLLOWERS` live followers; one more is refused with 429, and a
/// place frees when a follower goes away.
#[test]
fn followers_per_session_are_capped() {
    let _guard = stack().guard();
    let api = stack().client("cap", &unique_name("cap"));
    let id = api.create_fake_session().id;
    let mut open: Vec<SseStream> = (0..MAX_FOLLOWERS)
        .map(|_| api.follow(&id, "timeoutSeconds=120"))
        .collect();
    let refused = api
        .follow_open(&id, "timeoutSeconds=120", None)
        .expect("connect")
        .expect_rejected();
    let error = refused.expect_error(429);
    assert_eq!(error.code, "too_many_followers", "{}", error.message);
    // A follower whose client went away stops counting (once the server notices the close).
    open.pop().expect("one").close();
    let reopened = wait_for(
        "a follower place to free up",
        Duration::from_secs(60),
        || match api
            .follow_open(&id, "timeoutSeconds=120", None)
            .expect("connect")
        {
            FollowOpen::Stream(stream) => Some(stream),
            FollowOpen::Rejected(response) => {
                assert_eq!(response.status, 429, "{response}");
                None
            }
        },
    );
    drop(reopened);
    drop(open);
}

/// A transcript page stops early when its entries reach the byte budget (always holding one
/// entry), and paging on with `nextCursor` (and a follow backfill) loses nothing.
#[test]
fn pages_are_bounded_in_bytes_and_paging_is_lossless() {
    const ENTRY_BYTES: usize = 900 * 1024;
    let _guard = stack().guard();
    let api = stack().client("paula", &unique_name("pages"));
    let id = api.create_fake_session().id;
    for turn in 0..6 {
        api.enqueue(&id, "followUp", &big_turn(ENTRY_BYTES, turn));
        api.wait_idle(&id, TURN);
    }
    let mut all = Vec::new();
    let mut since = 0;
    let mut pages = 0;
    loop {
        let page = api.session_page(&id, &format!("sinceCursor={since}&limit=1000"));
        pages += 1;
        let sizes: Vec<usize> = page.transcript.iter().map(archive::entry_bytes).collect();
        let bytes: usize = sizes.iter().sum();
        assert!(!page.transcript.is_empty() || page.next_cursor.is_none());
        assert!(
            bytes <= archive::MAX_PAGE_BYTES || sizes.len() == 1,
            "page after {since}: {bytes} bytes in {} entries",
            sizes.len()
        );
        all.extend(page.transcript);
        match page.next_cursor {
            Some(next) => {
                assert_eq!(Some(next), all.last().map(|e| e.cursor));
                // The page stopped early only because the next entry did not fit.
                let next_entry = api.session_page(&id, &format!("sinceCursor={next}&limit=1"));
                let next_bytes = archive::entry_bytes(&next_entry.transcript[0]);
                assert!(
                    bytes + next_bytes > archive::MAX_PAGE_BYTES,
                    "page after {since} stopped at {bytes} bytes; the next entry has {next_bytes}"
                );
                since = next;
            }
            None => break,
        }
    }
    assert!(pages > 2, "{pages} pages");
    assert_contiguous(&all);
    assert_eq!(all.len() as u64, api.session(&id).session.last_cursor);
    let replayed: Vec<Entry> = api
        .follow(&id, "sinceCursor=0&stopAfterIdle=1")
        .collect_to_end(TURN)
        .iter()
        .filter_map(SseEvent::entry)
        .collect();
    assert!(
        replayed == all,
        "the follow backfill differs from the paged read"
    );
}

/// Pages and follow replays read while flushes move entries from the hot tail to segments
/// return contiguous cursors.
#[test]
fn reads_racing_archive_flushes_are_contiguous() {
    const CALLS_PER_TURN: usize = 600;
    const TURNS: usize = 12;
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let _guard = stack.guard();
    let api = stack.client("rita", &unique_name("race"));
    let id = api.create_fake_session().id;
    let calls: Vec<serde_json::Value> = (0..CALLS_PER_TURN)
        .map(|_| json!({"name": "no_such_tool"}))
        .collect();
    let content = fake_directive(&json!({"toolCalls": calls, "afterTools": "done"}));
    let done = AtomicBool::new(false);
    let (reads, checked) = std::thread::scope(|scope| {
        let readers: Vec<_> = [1000usize, 333, 97]
            .into_iter()
            .map(|limit| {
                let (api, id, done) = (&api, id.as_str(), &done);
                scope.spawn(move || {
                    let mut reads = 0;
                    let mut checked = 0;
                    while !done.load(Ordering::Relaxed) {
                        // Start near the hot tail's lower end, where the flush trims.
                        let last = api.session(id).session.last_cursor;
                        let since = last.saturating_sub(1500 + (reads % 7) * 100);
                        let mut cursor = since;
                        loop {
                            let page = api
                                .session_page(id, &format!("sinceCursor={cursor}&limit={limit}"));
                            reads += 1;
                            for entry in &page.transcript {
                                assert_eq!(
                                    entry.cursor,
                                    cursor + 1,
                                    "page after {cursor} (limit {limit}) skipped entries"
                                );
                                cursor = entry.cursor;
                                checked += 1;
                            }
                            if page.next_cursor.is_none() {
                                break;
                            }
                        }
                        if limit == 97 {
                            // A follow replay of the same range.
                            let events = api
                                .follow(id, &format!("sinceCursor={since}&stopAfterIdle=1"))
                                .collect_to_end(TURN);
                            let mut cursor = since;
                            for entry in events.iter().filter_map(SseEvent::entry) {
                                assert_eq!(entry.cursor, cursor + 1, "follow replay skipped");
                                cursor = entry.cursor;
                            }
                        }
                    }
                    (reads, checked)
                })
            })
            .collect();
        for _ in 0..TURNS {
            api.enqueue(&id, "followUp", &content);
            api.wait_idle(&id, Duration::from_secs(120));
        }
        done.store(true, Ordering::Relaxed);
        readers
            .into_iter()
            .map(|r| r.join().expect("reader"))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    });
    eprintln!("{reads} pages read, {checked} entries checked while flushing");
    let transcript = api.transcript(&id);
    assert_contiguous(&transcript);
    assert!(transcript.len() > TURNS * CALLS_PER_TURN);
}
