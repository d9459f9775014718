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

/// Merges entries from segments and the hot tail: cursor `> since`, sorted, no duplicates,
/// at most `limit`. Returns the page and whether more entries follow it.
pub fn stitch(mut entries: Vec<Entry>, since: u64, limit: usize) -> (Vec<Entry>, bool) {
    entries.retain(|e| e.cursor > since);
    entries.sort_by_key(|e| e.cursor);
    entries.dedup_by_key(|e| e.cursor);
    let more = entries.len() > limit;
    entries.truncate(limit);
    (entries, more)
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

    #[test]
    fn flush_policy() {
        assert!(!should_flush(0, 0, true));
        assert!(should_flush(1, 10, true));
        assert!(!should_flush(10, 10, false));
        assert!(should_flush(FLUSH_ENTRIES, 10, false));
        assert!(should_flush(2, FLUSH_BYTES, false));
    }
}
