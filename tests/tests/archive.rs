//! A session with more than 10,000 entries: archived to R2 as JSONL segments, read back
//! stitched (archive + hot tail) through paged GETs and through a follow replay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use wuhu_core::wire::Entry;
use wuhu_e2e::entries::{assert_contiguous, fake_directive};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Stack, StackOptions, wait_for};

const TARGET_ENTRIES: u64 = 10_000;
/// Tool calls per turn: each turn appends calls + 3 entries (user, assistant, results, reply).
const CALLS_PER_TURN: usize = 200;

#[test]
fn ten_thousand_entries_are_archived_and_read_back_stitched() {
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let api = stack.client("alice", &unique_name("archive"));
    let session = api.create_fake_session();
    let id = session.id.as_str();

    let calls: Vec<_> = (0..CALLS_PER_TURN)
        .map(|_| json!({"name": "list_sessions", "arguments": {"limit": 1}}))
        .collect();
    let started = Instant::now();
    let mut turns = 0;
    let mut last_cursor = session.last_cursor;
    while last_cursor < TARGET_ENTRIES {
        turns += 1;
        let content = fake_directive(
            &json!({"toolCalls": calls, "afterTools": format!("turn {turns} done")}),
        );
        api.enqueue(id, "followUp", &content);
        last_cursor = api
            .wait_idle(id, Duration::from_secs(120))
            .session
            .last_cursor;
    }
    eprintln!(
        "{last_cursor} entries in {turns} turns, {:?}",
        started.elapsed()
    );

    // Paged reads: full pages of 1000 linked by nextCursor, contiguous cursors 1..=N.
    let mut entries: Vec<Entry> = Vec::new();
    let mut since = 0;
    loop {
        let page = api.session_page(id, &format!("sinceCursor={since}&limit=1000"));
        match page.next_cursor {
            Some(next) => {
                assert_eq!(
                    page.transcript.len(),
                    1000,
                    "a page before the last one is full"
                );
                assert_eq!(Some(next), page.transcript.last().map(|e| e.cursor));
                since = next;
                entries.extend(page.transcript);
            }
            None => {
                entries.extend(page.transcript);
                break;
            }
        }
    }
    assert_contiguous(&entries);
    assert_eq!(entries.len() as u64, last_cursor);
    assert_eq!(entries, api.transcript(id), "reads are stable");

    // A page from the middle of the archive.
    let middle = api.session_page(id, "sinceCursor=4321&limit=10");
    let cursors: Vec<u64> = middle.transcript.iter().map(|e| e.cursor).collect();
    assert_eq!(cursors, (4322..=4331).collect::<Vec<_>>());
    assert_eq!(middle.next_cursor, Some(4331));

    // The segments are plain JSONL in the R2 store, disjoint and in order, and once the session
    // is idle they cover every entry.
    let segments = wait_for(
        "the archive to cover every entry",
        Duration::from_secs(60),
        || {
            let segments = find_segments(stack.persist_dir());
            let covered = segments.values().map(Vec::len).sum::<usize>();
            (covered == entries.len()).then_some(segments)
        },
    );
    let mut next = 1;
    for ((first, last), segment) in &segments {
        assert_eq!(
            *first,
            next,
            "segments must be contiguous: {:?}",
            segments.keys().collect::<Vec<_>>()
        );
        assert_eq!(segment.len() as u64, last - first + 1);
        assert_eq!(
            segment[..],
            entries[(first - 1) as usize..*last as usize],
            "segment {first}-{last} differs from the API"
        );
        next = last + 1;
    }
    assert!(
        segments.len() > 1,
        "a long transcript is archived in several segments"
    );
    eprintln!(
        "{} segments; session SQLite files: {:?}",
        segments.len(),
        sqlite_sizes(stack.persist_dir())
    );

    // A follow replay from the start streams every entry once, then idle and done.
    let mut follow = api.follow(id, "sinceCursor=0&stopAfterIdle=1");
    let events = follow.collect_to_end(Duration::from_secs(120));
    let replayed: Vec<Entry> = events.iter().filter_map(|e| e.entry()).collect();
    assert_eq!(replayed.len(), entries.len());
    assert!(
        replayed == entries,
        "the follow replay differs from the paged read"
    );
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
}

/// Every file under `dir` whose content is JSONL entries, keyed by (first, last) cursor
/// (the state dir holds one session). Identical copies of one segment count once.
fn find_segments(dir: &Path) -> BTreeMap<(u64, u64), Vec<Entry>> {
    let mut segments: BTreeMap<(u64, u64), Vec<Entry>> = BTreeMap::new();
    for path in files_under(dir) {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if !bytes.starts_with(b"{\"cursor\":") {
            continue;
        }
        let text = String::from_utf8(bytes)
            .unwrap_or_else(|_| panic!("segment {} is not UTF-8", path.display()));
        let parsed: Vec<Entry> = text
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("segment {} line {line:?}: {e}", path.display()))
            })
            .collect();
        let (Some(first), Some(last)) = (parsed.first(), parsed.last()) else {
            continue;
        };
        let key = (first.cursor, last.cursor);
        if let Some(existing) = segments.get(&key) {
            assert_eq!(existing, &parsed, "two different segments for {key:?}");
            continue;
        }
        segments.insert(key, parsed);
    }
    let keys: Vec<_> = segments.keys().copied().collect();
    for pair in keys.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "overlapping segments {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    segments
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in read.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

fn sqlite_sizes(dir: &Path) -> Vec<(String, u64)> {
    files_under(dir)
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("SessionActor")
                && p.extension().is_some_and(|e| e == "sqlite")
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                p.metadata().map(|m| m.len()).unwrap_or(0),
            )
        })
        .collect()
}
