//! Entries too large for a row are stored out of line, in object storage.
//!
//! Durable Object SQLite refuses a row over 2 MB, and transcript pages, archive segments and
//! the actor's memory should not carry megabytes per entry. So an entry whose JSON exceeds
//! [`INLINE_MAX_BYTES`] is written, exactly as its JSON, to the object
//! `{tenant}/sessions/{session}/blobs/{cursor:020}.json` ([`blob_key`]), **before** the row
//! that refers to it. Its row (and later its archive segment line) holds a placeholder: an
//! entry with the same `cursor`, `id` and `createdAt` whose payload is
//! `{"type":"custom","customType":"wuhu_out_of_line_v1","data":{"key":…,"bytes":…}}`.
//! Every read puts the entry back ([`resolve`]); the API never returns a placeholder.
//!
//! Because the placeholder is itself an entry, code that stores, archives or pages rows needs
//! no second type; only the last step of a read resolves.

use serde::Deserialize;

use crate::wire::{Entry, EntryPayload, custom_types};

/// Largest entry JSON kept in its row. Well under the 2 MB row limit of Durable Object
/// SQLite, so a row with its columns always fits, and small enough that a page of ordinary
/// entries stays small.
pub const INLINE_MAX_BYTES: usize = 256 * 1024;

/// Key prefix of a session's out-of-line entries.
pub fn blob_prefix(tenant: &str, session_id: &str) -> String {
    format!("{tenant}/sessions/{session_id}/blobs/")
}

/// Object key of the entry with `cursor`.
pub fn blob_key(tenant: &str, session_id: &str, cursor: u64) -> String {
    format!("{}{cursor:020}.json", blob_prefix(tenant, session_id))
}

/// An object to write before the row that refers to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    /// Object key ([`blob_key`]).
    pub key: String,
    /// The entry's JSON.
    pub body: String,
}

/// How one entry is stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The row: the entry's JSON, or its placeholder's.
    pub row: String,
    /// The object to write first, for an entry stored out of line.
    pub blob: Option<Blob>,
    /// Bytes of the entry's own JSON (what it weighs in memory and in an API reply).
    pub entry_bytes: usize,
}

/// Decides how `entry` of session `session_id` of `tenant` is stored.
pub fn store(entry: &Entry, tenant: &str, session_id: &str) -> Stored {
    // Serialising an entry cannot fail: every field is a string, number or JSON value.
    let json = serde_json::to_string(entry).unwrap_or_default();
    if json.len() <= INLINE_MAX_BYTES {
        return Stored {
            entry_bytes: json.len(),
            row: json,
            blob: None,
        };
    }
    let key = blob_key(tenant, session_id, entry.cursor);
    let placeholder = Entry {
        cursor: entry.cursor,
        id: entry.id.clone(),
        created_at: entry.created_at,
        payload: EntryPayload::Custom {
            custom_type: custom_types::OUT_OF_LINE.into(),
            data: serde_json::json!({"key": key, "bytes": json.len()}),
        },
    };
    Stored {
        row: serde_json::to_string(&placeholder).unwrap_or_default(),
        entry_bytes: json.len(),
        blob: Some(Blob { key, body: json }),
    }
}

/// What a placeholder refers to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Reference {
    /// Object key.
    pub key: String,
    /// Bytes of the entry's JSON.
    pub bytes: u64,
}

/// Whether `entry` is a placeholder (whatever its data): reads must resolve it.
pub fn is_placeholder(entry: &Entry) -> bool {
    matches!(&entry.payload, EntryPayload::Custom { custom_type, .. } if custom_type == custom_types::OUT_OF_LINE)
}

/// The reference of a placeholder; `None` for an ordinary entry or a malformed placeholder.
pub fn reference(entry: &Entry) -> Option<Reference> {
    match &entry.payload {
        EntryPayload::Custom { custom_type, data } if custom_type == custom_types::OUT_OF_LINE => {
            serde_json::from_value(data.clone()).ok()
        }
        _ => None,
    }
}

/// Why a placeholder could not be put back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The placeholder's data is not a reference.
    #[error("entry {cursor} is an out-of-line placeholder without a valid reference")]
    BadReference {
        /// Cursor of the placeholder.
        cursor: u64,
    },
    /// The reference names another key than this session's for this cursor.
    #[error("entry {cursor} refers to {found}, not to {expected}")]
    WrongKey {
        /// Cursor of the placeholder.
        cursor: u64,
        /// The key this session and cursor use.
        expected: String,
        /// The key in the placeholder.
        found: String,
    },
    /// The object is not the entry the placeholder stands for.
    #[error("the object of entry {cursor} does not hold that entry: {problem}")]
    Mismatch {
        /// Cursor of the placeholder.
        cursor: u64,
        /// What is wrong.
        problem: String,
    },
}

/// The key to read for `placeholder`, checked against the session: a placeholder can only
/// name its own session's object for its own cursor.
///
/// # Errors
/// [`ResolveError::BadReference`] or [`ResolveError::WrongKey`].
pub fn key_to_read(
    placeholder: &Entry,
    tenant: &str,
    session_id: &str,
) -> Result<String, ResolveError> {
    let cursor = placeholder.cursor;
    let reference = reference(placeholder).ok_or(ResolveError::BadReference { cursor })?;
    let expected = blob_key(tenant, session_id, cursor);
    if reference.key != expected {
        return Err(ResolveError::WrongKey {
            cursor,
            expected,
            found: reference.key,
        });
    }
    Ok(expected)
}

/// Puts back the entry `placeholder` stands for, from its object's `body`.
///
/// # Errors
/// [`ResolveError::Mismatch`] when the body is not that entry (another cursor or id, another
/// size, not an entry).
pub fn resolve(placeholder: &Entry, body: &str) -> Result<Entry, ResolveError> {
    let cursor = placeholder.cursor;
    let mismatch = |problem: String| ResolveError::Mismatch { cursor, problem };
    let reference = reference(placeholder).ok_or(ResolveError::BadReference { cursor })?;
    if body.len() as u64 != reference.bytes {
        return Err(mismatch(format!(
            "{} bytes, expected {}",
            body.len(),
            reference.bytes
        )));
    }
    let entry: Entry = serde_json::from_str(body).map_err(|e| mismatch(e.to_string()))?;
    if entry.cursor != cursor || entry.id != placeholder.id {
        return Err(mismatch(format!(
            "it holds entry {} ({})",
            entry.cursor, entry.id
        )));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Message, ToolResult};

    fn tool_result(cursor: u64, content: String) -> Entry {
        Entry {
            cursor,
            id: format!("id-{cursor}"),
            created_at: 1_700_000_000,
            payload: EntryPayload::Message {
                message: Message::ToolResult(ToolResult {
                    tool_call_id: "c1".into(),
                    tool_name: "bash".into(),
                    content,
                    is_error: false,
                    blobs: Vec::new(),
                }),
            },
        }
    }

    /// The JSON of `tool_result(cursor, "x" * n)` minus `n`.
    fn overhead(cursor: u64) -> usize {
        serde_json::to_string(&tool_result(cursor, String::new()))
            .unwrap()
            .len()
    }

    #[test]
    fn keys() {
        assert_eq!(
            blob_key("acme", "s1", 42),
            "acme/sessions/s1/blobs/00000000000000000042.json"
        );
        assert!(blob_key("acme", "s1", 42).starts_with(&blob_prefix("acme", "s1")));
    }

    #[test]
    fn entries_up_to_the_limit_stay_inline_and_one_byte_more_goes_out_of_line() {
        let fits = tool_result(7, "x".repeat(INLINE_MAX_BYTES - overhead(7)));
        let stored = store(&fits, "acme", "s1");
        assert_eq!(stored.row.len(), INLINE_MAX_BYTES);
        assert_eq!(stored.blob, None);
        assert_eq!(serde_json::from_str::<Entry>(&stored.row).unwrap(), fits);
        assert_eq!(reference(&fits), None);
        assert!(!is_placeholder(&fits));

        let over = tool_result(7, "x".repeat(INLINE_MAX_BYTES - overhead(7) + 1));
        let stored = store(&over, "acme", "s1");
        let blob = stored.blob.clone().expect("stored out of line");
        assert_eq!(blob.key, blob_key("acme", "s1", 7));
        assert_eq!(blob.body.len(), INLINE_MAX_BYTES + 1);
        assert_eq!(stored.entry_bytes, INLINE_MAX_BYTES + 1);
        assert!(stored.row.len() < 512, "placeholder row: {}", stored.row);

        let placeholder: Entry = serde_json::from_str(&stored.row).unwrap();
        assert!(is_placeholder(&placeholder));
        assert_eq!(
            (placeholder.cursor, &placeholder.id, placeholder.created_at),
            (7, &over.id, over.created_at)
        );
        assert_eq!(
            key_to_read(&placeholder, "acme", "s1").unwrap(),
            blob.key.as_str()
        );
        assert_eq!(resolve(&placeholder, &blob.body).unwrap(), over);
    }

    #[test]
    fn escaping_counts_towards_the_limit() {
        // Quotes double in JSON: 150 KiB of them is over 256 KiB of JSON.
        let quotes = tool_result(3, "\"".repeat(150 * 1024));
        assert!(store(&quotes, "t", "s").blob.is_some());
    }

    #[test]
    fn a_placeholder_only_reads_its_own_sessions_object_for_its_own_cursor() {
        let over = tool_result(9, "y".repeat(INLINE_MAX_BYTES));
        let stored = store(&over, "acme", "s1");
        let placeholder: Entry = serde_json::from_str(&stored.row).unwrap();
        assert!(matches!(
            key_to_read(&placeholder, "evil", "s1"),
            Err(ResolveError::WrongKey { .. })
        ));
        assert!(matches!(
            key_to_read(&placeholder, "acme", "s2"),
            Err(ResolveError::WrongKey { .. })
        ));
        let mut moved = placeholder.clone();
        moved.cursor = 10;
        assert!(matches!(
            key_to_read(&moved, "acme", "s1"),
            Err(ResolveError::WrongKey { .. })
        ));
        let not_a_reference = Entry {
            payload: EntryPayload::Custom {
                custom_type: custom_types::OUT_OF_LINE.into(),
                data: serde_json::json!({"oops": true}),
            },
            ..placeholder.clone()
        };
        assert_eq!(
            key_to_read(&not_a_reference, "acme", "s1"),
            Err(ResolveError::BadReference { cursor: 9 })
        );
    }

    #[test]
    fn an_object_that_is_not_the_entry_is_refused() {
        let a = tool_result(9, "a".repeat(INLINE_MAX_BYTES));
        let b = tool_result(10, "b".repeat(INLINE_MAX_BYTES));
        let stored_a = store(&a, "t", "s");
        let stored_b = store(&b, "t", "s");
        let placeholder_a: Entry = serde_json::from_str(&stored_a.row).unwrap();
        let body_b = stored_b.blob.unwrap().body;
        assert!(matches!(
            resolve(&placeholder_a, &body_b),
            Err(ResolveError::Mismatch { .. })
        ));
        let body_a = stored_a.blob.unwrap().body;
        assert!(matches!(
            resolve(&placeholder_a, &body_a[..body_a.len() - 1]),
            Err(ResolveError::Mismatch { .. })
        ));
        assert!(matches!(
            resolve(&a, &body_a),
            Err(ResolveError::BadReference { cursor: 9 })
        ));
    }
}
