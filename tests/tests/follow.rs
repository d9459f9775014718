//! The follow stream is lossless, consistent and bounded.
//!
//! The main invariant: every follower sees every entry of a turn before that turn's `idle`,
//! in cursor order, exactly once, whenever it connected.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::wire::{Entry, Status};
use wuhu_e2e::entries::{assert_contiguous, assistant, describe};
use wuhu_e2e::sse::summarize;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Reply, SseEvent, SseStream, Stack, wait_for};

const TURN: Duration = Duration::from_secs(60);
/// Every follower of the invariant test stops at the first idle it reaches.
const FOLLOW_TO_IDLE: &str = "sinceCursor=0&stopAfterIdle=1&timeoutSeconds=120";

fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(Stack::start)
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
