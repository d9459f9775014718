//! The Worker's in-memory cache of image blob bytes: what an LLM step would otherwise read from
//! R2 again at every step (decision 0015, images amendment).
//!
//! One cache per isolate (the Worker keeps it in a `thread_local!`: wasm is single-threaded and
//! every Durable Object the isolate hosts shares it), so its bound is a share of the isolate's
//! 128 MB memory limit, whatever the number of sessions. Keys are full R2 object keys
//! (`{tenant}/blobs/{session}/{id}`, [`crate::blobs::object_key`]): an entry is found only by
//! the tenant and session it was read for. Blobs are immutable, so nothing expires; the host
//! drops a deleted session's entries ([`ByteLru::remove_prefix`]) and the least recently used
//! entries make room for new ones.
//!
//! Sans-IO: the host asks [`ByteLru::get`] before reading R2 and offers what it read to
//! [`ByteLru::insert`].

/// Most bytes (keys and values) the Worker's image cache holds per isolate: 16 MiB, an eighth
/// of the isolate's 128 MB. It holds one request's worth of images
/// ([`crate::llm::inline_images::MAX_REQUEST_IMAGE_BYTES`], 10 MiB) with room to spare, so a
/// session showing the most images a request carries reads none of them again at its next step,
/// and leaves the rest of the isolate to the requests themselves (a full request holds its
/// images about three times over while it is built: bytes, base64 and the JSON body).
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Largest entry: the largest image a model is shown ([`crate::images::MAX_IMAGE_BYTES`],
/// 5 MiB); larger values are refused.
pub const MAX_ENTRY_BYTES: u64 = crate::images::MAX_IMAGE_BYTES;

/// Most entries, whatever their size: lookups scan the entries (a list is less wasm than a map),
/// so their number is bounded too.
pub const MAX_ENTRIES: usize = 256;

/// A least-recently-used map from keys to bytes, bounded by the total of its keys' and values'
/// lengths ([`cost`]) and by its number of entries.
///
/// Invariants (tested on random operation sequences): [`ByteLru::bytes`] is the sum of the
/// entries' costs and never exceeds the bound; a key maps to nothing or to the bytes last
/// inserted for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByteLru {
    /// Least recently used first.
    entries: Vec<(String, Vec<u8>)>,
    bytes: u64,
    max_bytes: u64,
    max_entry_bytes: u64,
    max_entries: usize,
}

/// What [`ByteLru::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Insert {
    /// Stored, after evicting this many least recently used entries.
    Stored {
        /// Entries evicted to make room.
        evicted: usize,
    },
    /// Not stored: the entry alone is over the per-entry maximum (or the whole bound). An entry
    /// the key had before is dropped all the same (it is not the key's bytes any more).
    TooLarge,
}

/// What an entry counts against the bound: its key's and its value's lengths.
pub fn cost(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

impl ByteLru {
    /// An empty cache with these bounds.
    pub const fn new(max_bytes: u64, max_entry_bytes: u64, max_entries: usize) -> ByteLru {
        ByteLru {
            entries: Vec::new(),
            bytes: 0,
            max_bytes,
            max_entry_bytes,
            max_entries,
        }
    }

    /// The Worker's image cache: [`MAX_BYTES`], [`MAX_ENTRY_BYTES`], [`MAX_ENTRIES`].
    pub const fn for_images() -> ByteLru {
        ByteLru::new(MAX_BYTES, MAX_ENTRY_BYTES, MAX_ENTRIES)
    }

    /// The bytes of `key`, if held; the entry becomes the most recently used.
    pub fn get(&mut self, key: &str) -> Option<&[u8]> {
        let at = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(at);
        self.entries.push(entry);
        self.entries.last().map(|(_, v)| v.as_slice())
    }

    /// Stores `value` under `key` as the most recently used entry, evicting the least recently
    /// used ones until it fits; refuses a value over the per-entry maximum.
    pub fn insert(&mut self, key: String, value: Vec<u8>) -> Insert {
        self.remove(&key);
        let cost = cost(&key, &value);
        if value.len() as u64 > self.max_entry_bytes
            || cost > self.max_bytes
            || self.max_entries == 0
        {
            return Insert::TooLarge;
        }
        let mut evicted = 0;
        while self.bytes + cost > self.max_bytes || self.entries.len() >= self.max_entries {
            let (k, v) = self.entries.remove(0);
            self.bytes -= self::cost(&k, &v);
            evicted += 1;
        }
        self.bytes += cost;
        self.entries.push((key, value));
        Insert::Stored { evicted }
    }

    /// Drops the entry of `key`; whether there was one.
    pub fn remove(&mut self, key: &str) -> bool {
        let Some(at) = self.entries.iter().position(|(k, _)| k == key) else {
            return false;
        };
        let (k, v) = self.entries.remove(at);
        self.bytes -= cost(&k, &v);
        true
    }

    /// Drops every entry whose key starts with `prefix` (a deleted session's
    /// [`crate::blobs::session_prefix`]); how many.
    pub fn remove_prefix(&mut self, prefix: &str) -> usize {
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|(k, v)| {
            let keep = !k.starts_with(prefix);
            if !keep {
                freed += cost(k, v);
            }
            keep
        });
        self.bytes -= freed;
        before - self.entries.len()
    }

    /// The total cost of the entries held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many entries are held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests;
