//! Transcript archive I/O: flushing entries to R2 segments and stitched reads.
//! The policy (names, thresholds, read plans) lives in `wuhu_core::archive`.

use std::rc::Rc;

use wuhu_core::archive::{self, HOT_TAIL_KEEP, SegmentRef, Stitched};
use wuhu_core::wire::Entry;

use super::Actor;
use crate::http::{ApiError, ApiResult};

const BUCKET: &str = "ARCHIVE";

/// Flushes unarchived entries while the policy says so. One flush at a time per actor.
pub(crate) async fn flush(actor: Rc<Actor>) {
    if actor.writes.flushing.replace(true) {
        return;
    }
    if let Err(e) = flush_all(&actor).await {
        worker::console_error!(
            "archive flush failed (will retry at the next idle): {}",
            e.message
        );
    }
    actor.writes.flushing.set(false);
}

async fn flush_all(actor: &Rc<Actor>) -> ApiResult<()> {
    let bucket = actor.env.bucket(BUCKET)?;
    loop {
        let idle = actor.status() != Some(wuhu_core::wire::Status::Running);
        let store = actor.store()?;
        let (n, bytes) = store.unarchived()?;
        if !archive::should_flush(n, bytes, idle) {
            return Ok(());
        }
        let through = store.archived_through()?;
        let mut batch = store.entries_after(through, archive::FLUSH_ENTRIES as usize)?;
        // Keep segments under the byte threshold too.
        let mut size = 0u64;
        let mut keep = 0;
        for entry in &batch {
            size += serde_json::to_string(entry)
                .map(|s| s.len() as u64)
                .unwrap_or(0);
            keep += 1;
            if size >= archive::FLUSH_BYTES {
                break;
            }
        }
        batch.truncate(keep);
        let (Some(first), Some(last)) = (
            batch.first().map(|e| e.cursor),
            batch.last().map(|e| e.cursor),
        ) else {
            return Ok(());
        };
        let key = archive::segment_key(&actor.tenant(), &actor.session_id(), first, last);
        bucket
            .put(key, archive::encode_segment(&batch))
            .execute()
            .await?;
        // Only after the segment is durable are entries trimmed from SQLite.
        actor.store()?.record_segment(first, last, HOT_TAIL_KEEP)?;
        actor.invalidate_unarchived();
    }
}

/// Plans-and-reads attempted before a page that keeps racing flushes gives up (each retry
/// follows a flush that completed, and flushes run one at a time).
const READ_ATTEMPTS: usize = 4;
/// Hot-tail rows read per query, so a page of large entries stops near its byte budget
/// instead of materialising `limit` rows first.
const HOT_BATCH: usize = 32;

/// Entries with cursor > `since`, oldest first, contiguous, at most `limit` entries and about
/// [`archive::MAX_PAGE_BYTES`] of JSON (at least one entry), stitched from archived segments
/// and the hot tail. Returns the page and the cursor to continue from when more follow.
///
/// A flush may move entries from the hot tail to a new segment while the segments are
/// fetched; `archive::stitch` then stops the page before the missing cursor, or asks for a new
/// plan when the page would be empty.
pub(crate) async fn read_page(
    actor: &Rc<Actor>,
    since: u64,
    limit: usize,
) -> ApiResult<(Vec<Entry>, Option<u64>)> {
    let max_bytes = archive::MAX_PAGE_BYTES;
    // A fork's history is the forked session's: read there, never copied.
    if let Some(fork) = actor
        .with_loaded(|l| l.meta.forked_from.clone())
        .flatten()
        .filter(|f| since < f.cursor)
    {
        let page = crate::session_client::prefix(
            &actor.env,
            &actor.tenant(),
            &fork.session_id,
            since,
            limit as u64,
            fork.cursor,
        )
        .await?;
        let last = page.entries.last().map(|e| e.cursor).ok_or_else(|| {
            ApiError::internal(format!(
                "the history after cursor {since} is missing from {}",
                fork.session_id
            ))
        })?;
        // The fork's own entries follow its history.
        return Ok((page.entries, Some(last)));
    }
    for _ in 0..READ_ATTEMPTS {
        let (segments, hot_first) = {
            let store = actor.store()?;
            (store.segments()?, store.hot_first()?)
        };
        let plan = archive::plan_read(since, limit, &segments, hot_first);
        let mut entries = Vec::new();
        if !plan.segments.is_empty() {
            let bucket = actor.env.bucket(BUCKET)?;
            for segment in &plan.segments {
                entries.extend(read_segment(&bucket, actor, *segment).await?);
                if archive::page_is_full(&entries, since, limit, max_bytes) {
                    break;
                }
            }
        }
        // From here on nothing awaits: the hot tail and the last cursor are one snapshot.
        let last_cursor = actor.committed_cursor();
        if plan.read_hot {
            let store = actor.store()?;
            // Continue after the segments read (they end where the hot tail began when
            // planned; if a flush trimmed it since, `stitch` sees the gap).
            let mut after = entries.iter().map(|e| e.cursor).fold(since, u64::max);
            while !archive::page_is_full(&entries, since, limit, max_bytes) {
                let batch = store.entries_after(after, HOT_BATCH)?;
                let Some(last) = batch.last().map(|e| e.cursor) else {
                    break;
                };
                after = last;
                entries.extend(batch);
            }
        }
        match archive::stitch(entries, since, limit, max_bytes, last_cursor) {
            Stitched::Page {
                entries,
                next_cursor,
            } => {
                // Rows and segments hold placeholders for entries stored out of line; the page
                // was cut at their full size (`archive::page_weight`), so putting them back
                // keeps it within its byte budget and reads only the objects it shows.
                let entries = super::blob_io::resolve(
                    &actor.env,
                    &actor.tenant(),
                    &actor.session_id(),
                    entries,
                )
                .await?;
                return Ok((entries, next_cursor));
            }
            Stitched::Gap { missing } => {
                worker::console_log!(
                    "transcript page after {since} raced a flush (cursor {missing} moved); reading again"
                );
            }
        }
    }
    Err(ApiError::new(
        503,
        "unavailable",
        format!("the transcript after cursor {since} kept changing while it was read; retry"),
    ))
}

async fn read_segment(
    bucket: &worker::Bucket,
    actor: &Actor,
    segment: SegmentRef,
) -> ApiResult<Vec<Entry>> {
    let key = archive::segment_key(
        &actor.tenant(),
        &actor.session_id(),
        segment.first,
        segment.last,
    );
    let object = bucket
        .get(&key)
        .execute()
        .await?
        .ok_or_else(|| ApiError::internal(format!("archived segment {key} is missing")))?;
    let text = object
        .body()
        .ok_or_else(|| ApiError::internal(format!("archived segment {key} has no body")))?
        .text()
        .await?;
    archive::decode_segment(&text)
        .map_err(|(line, e)| ApiError::internal(format!("archived segment {key} line {line}: {e}")))
}
