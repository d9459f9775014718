//! The transcript archive: immutable JSONL segments in object storage plus a hot tail in the
//! actor's SQLite, stitched together on read.
//!
//! A segment holds consecutive entries `first..=last` and is named
//! `{tenant}/sessions/{session}/entries/{first:020}-{last:020}.jsonl`, one JSON entry per line,
//! so a person can read it with `wrangler r2 object get --local`. Segments are never rewritten:
//! writing one twice writes the same bytes.

use crate::wire::Entry;

/// Flush when this many entries are not archived yet...
pub const FLUSH_ENTRIES: u64 = 512;
/// ...or when they add up to this many bytes of JSON.
pub const FLUSH_BYTES: u64 = 512 * 1024;
/// Archived entries the actor keeps in SQLite for context and recent reads.
pub const HOT_TAIL_KEEP: u64 = 1024;
/// Most entries one transcript page returns.
pub const MAX_PAGE: usize = 1000;

/// Object key of a segment.
pub fn segment_key(tenant: &str, session_id: &str, first: u64, last: u64) -> String {
    format!(
        "{}{first:020}-{last:020}.jsonl",
        segment_prefix(tenant, session_id)
    )
}

/// Key prefix of a session's segments.
pub fn segment_prefix(tenant: &str, session_id: &str) -> String {
    format!("{tenant}/sessions/{session_id}/entries/")
}

/// Parses `first` and `last` back out of a segment key.
pub fn parse_segment_key(key: &str) -> Option<(u64, u64)> {
    let name = key.rsplit('/').next()?.strip_suffix(".jsonl")?;
    let (first, last) = name.split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

/// Whether the unarchived entries should be flushed now.
pub fn should_flush(unarchived_entries: u64, unarchived_bytes: u64, session_idle: bool) -> bool {
    unarchived_entries > 0
        && (session_idle || unarchived_entries >= FLUSH_ENTRIES || unarchived_bytes >= FLUSH_BYTES)
}

/// Encodes entries as JSONL.
pub fn encode_segment(entries: &[Entry]) -> String {
    let mut out = String::new();
    for entry in entries {
        if let Ok(line) = serde_json::to_string(entry) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Decodes a JSONL segment.
///
/// # Errors
/// The 1-based line number and the problem, for a line that is not an entry.
pub fn decode_segment(text: &str) -> Result<Vec<Entry>, (usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| (i + 1, e.to_string())))
        .collect()
}

/// A segment the actor knows about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRef {
    /// First cursor in it.
    pub first: u64,
    /// Last cursor in it.
    pub last: u64,
}

/// Where the entries of one page come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    /// Segments to fetch, oldest first.
    pub segments: Vec<SegmentRef>,
    /// Whether the hot tail (SQLite) is read too, from `since` on.
    pub read_hot: bool,
}

/// Plans reading entries with cursor `> since`. `segments` are sorted and contiguous;
/// `hot_first` is the oldest cursor still in SQLite (`None` when SQLite holds none).
/// Segments are added until they cover `limit` entries; the hot tail is read only when the
/// segments do not already fill the page.
pub fn plan_read(
    since: u64,
    limit: usize,
    segments: &[SegmentRef],
    hot_first: Option<u64>,
) -> ReadPlan {
    let mut plan = ReadPlan {
        segments: Vec::new(),
        read_hot: true,
    };
    let mut covered: u64 = 0;
    for segment in segments.iter().filter(|s| s.last > since) {
        if hot_first.is_some_and(|hot| segment.first >= hot) {
            break; // Everything from here on is in SQLite too.
        }
        if covered >= limit as u64 {
            plan.read_hot = false;
            return plan;
        }
        plan.segments.push(*segment);
        covered += segment.last - segment.first.max(since + 1) + 1;
    }
    plan.read_hot = covered < limit as u64;
    plan
}

/// Most bytes of entry JSON one transcript page (or follow backfill page) holds; a page always
/// holds at least one entry, so one entry larger than this is still readable.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Bytes of an entry's JSON, counted without building the text.
pub fn entry_bytes(entry: &Entry) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, entry);
    count.0
}

/// What `entry` weighs in a page: its JSON bytes as the API shows it. A placeholder of an entry
/// stored out of line weighs what the entry it stands for weighs (its reference's `bytes`),
/// because reads put that entry back: a page of placeholders must stop where the page of
/// entries would, before their objects are read.
pub fn page_weight(entry: &Entry) -> usize {
    match crate::out_of_line::reference(entry) {
        Some(reference) => usize::try_from(reference.bytes).unwrap_or(usize::MAX),
        None => entry_bytes(entry),
    }
}

/// Whether `entries` (read so far, in any order, possibly with older ones) already fill a page
/// after `since`, so further reads can be skipped.
pub fn page_is_full(entries: &[Entry], since: u64, limit: usize, max_bytes: usize) -> bool {
    let mut count = 0;
    let mut bytes = 0usize;
    for entry in entries.iter().filter(|e| e.cursor > since) {
        count += 1;
        bytes = bytes.saturating_add(page_weight(entry));
        if count >= limit || bytes >= max_bytes {
            return true;
        }
    }
    false
}

/// The outcome of stitching one page.
#[derive(Clone, Debug, PartialEq)]
pub enum Stitched {
    /// Contiguous entries `since+1, since+2, …` (possibly none), and the cursor to continue
    /// from when more entries exist.
    Page {
        /// The entries.
        entries: Vec<Entry>,
        /// `Some(last cursor of the page)` when the session has later entries.
        next_cursor: Option<u64>,
    },
    /// The entry right after `since` is missing from what was read although the session has
    /// it: a concurrent flush moved it from the hot tail to a segment between planning and
    /// reading. Plan and read again.
    Gap {
        /// The missing cursor.
        missing: u64,
    },
}

/// Merges entries from segments and the hot tail into one page: cursors `> since` in order, no
/// duplicates, **contiguous** (it stops before the first missing cursor, so a read that raced
/// a flush never skips entries), at most `limit` entries and `max_bytes` bytes of JSON (at
/// least one entry; out-of-line entries count at their full size, see [`page_weight`]). `last_cursor` is the session's last cursor when the hot tail was read.
pub fn stitch(
    mut entries: Vec<Entry>,
    since: u64,
    limit: usize,
    max_bytes: usize,
    last_cursor: u64,
) -> Stitched {
    entries.retain(|e| e.cursor > since);
    entries.sort_by_key(|e| e.cursor);
    entries.dedup_by_key(|e| e.cursor);
    let mut bytes = 0usize;
    let mut keep = 0;
    for (i, entry) in entries.iter().enumerate() {
        if entry.cursor != since + 1 + i as u64 || keep >= limit {
            break;
        }
        bytes = bytes.saturating_add(page_weight(entry));
        if keep > 0 && bytes > max_bytes {
            break;
        }
        keep += 1;
    }
    entries.truncate(keep);
    let last = entries.last().map_or(since, |e| e.cursor);
    if entries.is_empty() && last_cursor > since {
        return Stitched::Gap { missing: since + 1 };
    }
    Stitched::Page {
        next_cursor: (last < last_cursor).then_some(last),
        entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let key = segment_key("acme", "s1", 1, 512);
        assert_eq!(
            key,
            "acme/sessions/s1/entries/00000000000000000001-00000000000000000512.jsonl"
        );
        assert_eq!(parse_segment_key(&key), Some((1, 512)));
        assert_eq!(parse_segment_key("acme/x.json"), None);
    }

    #[test]
    fn read_plans() {
        let segs = [
            SegmentRef {
                first: 1,
                last: 100,
            },
            SegmentRef {
                first: 101,
                last: 200,
            },
            SegmentRef {
                first: 201,
                last: 300,
            },
        ];
        // (since, limit, hot_first, segment firsts, read_hot)
        type Case<'a> = (u64, usize, Option<u64>, &'a [u64], bool);
        let cases: &[Case] = &[
            // since, limit, hot_first, segment firsts, read_hot
            (0, 1000, Some(301), &[1, 101, 201], true),
            (0, 150, Some(301), &[1, 101], false),
            (150, 1000, Some(301), &[101, 201], true),
            (0, 1000, Some(201), &[1, 101], true),
            (250, 10, Some(201), &[], true),
            (300, 10, Some(301), &[], true),
            (0, 50, None, &[1], false),
        ];
        for (since, limit, hot, want, want_hot) in cases {
            let plan = plan_read(*since, *limit, &segs, *hot);
            let firsts: Vec<u64> = plan.segments.iter().map(|s| s.first).collect();
            assert_eq!(
                (firsts.as_slice(), plan.read_hot),
                (*want, *want_hot),
                "since {since} limit {limit} hot {hot:?}"
            );
        }
    }

    fn entry(cursor: u64, text_bytes: usize) -> Entry {
        Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: 0,
            payload: crate::wire::EntryPayload::Custom {
                custom_type: "t".into(),
                data: serde_json::Value::String("x".repeat(text_bytes)),
            },
        }
    }

    fn render(stitched: &Stitched) -> String {
        match stitched {
            Stitched::Page {
                entries,
                next_cursor,
            } => {
                let cursors: Vec<String> = entries.iter().map(|e| e.cursor.to_string()).collect();
                format!("[{}] next {next_cursor:?}", cursors.join(","))
            }
            Stitched::Gap { missing } => format!("gap {missing}"),
        }
    }

    #[test]
    fn stitched_pages_are_contiguous_and_bounded() {
        let one = entry_bytes(&entry(1, 100));
        // (read cursors, since, limit, max_bytes, last_cursor, expected)
        type Case<'a> = (&'a [u64], u64, usize, usize, u64, &'a str);
        let cases: &[Case] = &[
            (&[3, 1, 2, 2, 4], 0, 10, 1 << 20, 4, "[1,2,3,4] next None"),
            (&[1, 2, 3, 4], 0, 2, 1 << 20, 4, "[1,2] next Some(2)"),
            (&[1, 2, 3, 4], 1, 10, 1 << 20, 9, "[2,3,4] next Some(4)"),
            // A flush trimmed 3 and 4 from the hot tail after the plan: stop before the gap.
            (&[1, 2, 5, 6], 0, 10, 1 << 20, 6, "[1,2] next Some(2)"),
            // Nothing contiguous after `since`, though the session has more: read again.
            (&[5, 6], 2, 10, 1 << 20, 6, "gap 3"),
            (&[], 2, 10, 1 << 20, 6, "gap 3"),
            // Nothing after `since` and nothing more: an empty last page.
            (&[], 6, 10, 1 << 20, 6, "[] next None"),
            (&[1, 2], 2, 10, 1 << 20, 2, "[] next None"),
            // Bytes: stop before the entry that crosses the budget...
            (&[1, 2, 3, 4], 0, 10, 2 * one, 4, "[1,2] next Some(2)"),
            (&[1, 2, 3, 4], 0, 10, 2 * one + 1, 4, "[1,2] next Some(2)"),
            (&[1, 2, 3, 4], 0, 10, 2 * one - 1, 4, "[1] next Some(1)"),
            // ...but always hold one entry.
            (&[1, 2], 0, 10, 1, 2, "[1] next Some(1)"),
        ];
        for (cursors, since, limit, max_bytes, last, want) in cases {
            let entries = cursors.iter().map(|c| entry(*c, 100)).collect();
            let got = render(&stitch(entries, *since, *limit, *max_bytes, *last));
            assert_eq!(
                &got, want,
                "cursors {cursors:?} since {since} limit {limit} bytes {max_bytes} last {last}"
            );
        }
    }

    #[test]
    fn page_fullness() {
        let entries: Vec<Entry> = (1..=5).map(|c| entry(c, 100)).collect();
        let one = entry_bytes(&entries[0]);
        assert!(!page_is_full(&entries, 0, 10, 1 << 20));
        assert!(page_is_full(&entries, 0, 5, 1 << 20));
        assert!(!page_is_full(&entries, 1, 5, 1 << 20));
        assert!(page_is_full(&entries, 0, 10, 5 * one));
        assert!(!page_is_full(&entries, 0, 10, 5 * one + 1));
        assert_eq!(one, serde_json::to_string(&entries[0]).unwrap().len());
    }

    /// A placeholder of an out-of-line entry of `bytes` bytes, as rows and segments hold it.
    fn placeholder(cursor: u64, bytes: usize) -> Entry {
        let big = entry(cursor, bytes);
        let stored = crate::out_of_line::store(&big, "t", "s");
        assert!(stored.blob.is_some(), "{bytes} bytes must go out of line");
        serde_json::from_str(&stored.row).unwrap()
    }

    #[test]
    fn out_of_line_entries_weigh_their_full_size_in_a_page() {
        const MIB: usize = 1024 * 1024;
        let big = placeholder(1, MIB);
        assert!(entry_bytes(&big) < 1024, "a placeholder row is small");
        assert_eq!(page_weight(&big), entry_bytes(&entry(1, MIB)));
        assert_eq!(page_weight(&entry(2, 10)), entry_bytes(&entry(2, 10)));
        // Nine placeholders of 1 MiB entries: a 4 MiB page holds three of them (the fourth
        // would cross the budget by its JSON framing), however small the rows are.
        let read: Vec<Entry> = (1..=9).map(|c| placeholder(c, MIB)).collect();
        let page = stitch(read.clone(), 0, 1000, 4 * MIB, 9);
        assert_eq!(render(&page), "[1,2,3] next Some(3)");
        assert!(page_is_full(&read[..4], 0, 1000, 4 * MIB));
        assert!(!page_is_full(&read[..3], 0, 1000, 4 * MIB));
        // Mixed with small entries, and one entry above the budget comes alone.
        let mixed = vec![entry(1, 10), placeholder(2, 5 * MIB), entry(3, 10)];
        assert_eq!(
            render(&stitch(mixed.clone(), 0, 1000, 4 * MIB, 3)),
            "[1] next Some(1)"
        );
        assert_eq!(
            render(&stitch(mixed, 1, 1000, 4 * MIB, 3)),
            "[2] next Some(2)"
        );
    }

    #[test]
    fn flush_policy() {
        assert!(!should_flush(0, 0, true));
        assert!(should_flush(1, 10, true));
        assert!(!should_flush(10, 10, false));
        assert!(should_flush(FLUSH_ENTRIES, 10, false));
        assert!(should_flush(2, FLUSH_BYTES, false));
    }
}
