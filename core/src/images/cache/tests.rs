use super::*;
use crate::rng::SplitMix64;

/// One operation on a cache.
#[derive(Clone, Debug)]
enum Op {
    Get(&'static str),
    Insert(&'static str, usize),
    RemovePrefix(&'static str),
}

/// The keys held, least recently used first, and the bytes counted.
fn state(cache: &ByteLru) -> (Vec<&str>, u64) {
    (
        cache.entries.iter().map(|(k, _)| k.as_str()).collect(),
        cache.bytes(),
    )
}

/// Bounds (bytes, per entry, entries), operations, then what the last operation answered and the
/// keys and bytes after it.
type Case = (u64, u64, usize, &'static [Op], &'static str, Held);
type Held = (&'static [&'static str], u64);

#[test]
fn table() {
    use Op::*;
    // Keys of one character (or two): an entry of n bytes costs n + 1 (or n + 2).
    let cases: &[Case] = &[
        // Inserted entries are held, newest last.
        (
            30,
            10,
            8,
            &[Insert("a", 9), Insert("b", 9)],
            "Stored 0",
            (&["a", "b"], 20),
        ),
        // The least recently used entry makes room.
        (
            30,
            10,
            8,
            &[
                Insert("a", 9),
                Insert("b", 9),
                Insert("c", 9),
                Insert("d", 9),
            ],
            "Stored 1",
            (&["b", "c", "d"], 30),
        ),
        // A get makes its entry the most recently used: b goes, not a.
        (
            30,
            10,
            8,
            &[
                Insert("a", 9),
                Insert("b", 9),
                Insert("c", 9),
                Get("a"),
                Insert("d", 9),
            ],
            "Stored 1",
            (&["c", "a", "d"], 30),
        ),
        // As many entries evicted as it takes.
        (
            30,
            20,
            8,
            &[
                Insert("a", 9),
                Insert("b", 9),
                Insert("c", 9),
                Insert("d", 19),
            ],
            "Stored 2",
            (&["c", "d"], 30),
        ),
        // Over the per-entry maximum: refused, nothing evicted.
        (
            30,
            10,
            8,
            &[Insert("a", 9), Insert("b", 11)],
            "TooLarge",
            (&["a"], 10),
        ),
        // Over the whole bound (key included): refused.
        (
            10,
            10,
            8,
            &[Insert("a", 9), Insert("b", 10)],
            "TooLarge",
            (&["a"], 10),
        ),
        // A refused value drops the key's old entry: the key never maps to bytes it no longer has.
        (
            30,
            10,
            8,
            &[Insert("a", 3), Insert("b", 3), Insert("a", 11)],
            "TooLarge",
            (&["b"], 4),
        ),
        // Inserting a held key replaces its bytes and counts them once.
        (
            30,
            10,
            8,
            &[Insert("a", 3), Insert("b", 3), Insert("a", 5)],
            "Stored 0",
            (&["b", "a"], 10),
        ),
        // The entry count is bounded too.
        (
            100,
            10,
            2,
            &[Insert("a", 1), Insert("b", 1), Insert("c", 1)],
            "Stored 1",
            (&["b", "c"], 4),
        ),
        // A miss changes nothing.
        (
            30,
            10,
            8,
            &[Insert("a", 1), Insert("b", 1), Get("z")],
            "miss",
            (&["a", "b"], 4),
        ),
        (
            30,
            10,
            8,
            &[Insert("a", 1), Insert("b", 1), Get("a")],
            "hit 1",
            (&["b", "a"], 4),
        ),
        // A prefix drops its keys and their bytes, nothing else.
        (
            30,
            10,
            8,
            &[
                Insert("a", 1),
                Insert("ab", 1),
                Insert("b", 1),
                RemovePrefix("a"),
            ],
            "removed 2",
            (&["b"], 2),
        ),
    ];
    for (i, (max_bytes, max_entry, max_entries, ops, answer, (keys, bytes))) in
        cases.iter().enumerate()
    {
        let mut cache = ByteLru::new(*max_bytes, *max_entry, *max_entries);
        let mut last = String::new();
        for op in ops.iter() {
            last = apply(&mut cache, op);
        }
        assert_eq!(last, *answer, "case {i}: {ops:?}");
        assert_eq!(state(&cache), (keys.to_vec(), *bytes), "case {i}: {ops:?}");
    }
}

/// Applies `op`, with `key` standing for a key of a session prefix `t/blobs/<session>/`.
fn apply(cache: &mut ByteLru, op: &Op) -> String {
    match *op {
        Op::Get(key) => match cache.get(key) {
            Some(bytes) => format!("hit {}", bytes.len()),
            None => "miss".into(),
        },
        Op::Insert(key, len) => match cache.insert(key.into(), vec![key.as_bytes()[0]; len]) {
            Insert::Stored { evicted } => format!("Stored {evicted}"),
            Insert::TooLarge => "TooLarge".into(),
        },
        Op::RemovePrefix(prefix) => format!("removed {}", cache.remove_prefix(prefix)),
    }
}

#[test]
fn removing_a_session_prefix_drops_only_that_session() {
    let mut cache = ByteLru::for_images();
    let key = |tenant: &str, session: &str, blob: &str| {
        format!("{}{blob}", crate::blobs::session_prefix(tenant, session))
    };
    cache.insert(key("acme", "s1", "b1"), vec![1; 10]);
    cache.insert(key("acme", "s1", "b2"), vec![2; 10]);
    cache.insert(key("acme", "s10", "b3"), vec![3; 10]);
    cache.insert(key("other", "s1", "b4"), vec![4; 10]);
    assert_eq!(
        cache.remove_prefix(&crate::blobs::session_prefix("acme", "s1")),
        2
    );
    assert_eq!(cache.get(&key("acme", "s1", "b1")), None);
    assert_eq!(cache.get(&key("acme", "s10", "b3")), Some(&[3u8; 10][..]));
    assert_eq!(cache.get(&key("other", "s1", "b4")), Some(&[4u8; 10][..]));
    assert_eq!(cache.bytes(), 2 * cost(&key("acme", "s10", "b3"), &[0; 10]));
}

#[test]
fn the_image_bounds() {
    // One request's images fit with room to spare, well under the isolate's 128 MB.
    const {
        assert!(MAX_BYTES > crate::llm::inline_images::MAX_REQUEST_IMAGE_BYTES);
        assert!(MAX_BYTES <= 128 * 1024 * 1024 / 8);
    }
    assert_eq!(MAX_ENTRY_BYTES, crate::images::MAX_IMAGE_BYTES);
    // The largest image is cached.
    let mut cache = ByteLru::for_images();
    let key = "acme/blobs/s/b".to_string();
    let big = vec![0u8; MAX_ENTRY_BYTES as usize];
    assert_eq!(
        cache.insert(key.clone(), big),
        Insert::Stored { evicted: 0 }
    );
    assert_eq!(
        cache.insert(key, vec![0u8; MAX_ENTRY_BYTES as usize + 1]),
        Insert::TooLarge
    );
}

/// Random operation sequences against a model (a map of every key to the bytes last inserted
/// for it): the bound holds after every operation, the counted bytes are the entries' costs,
/// and a hit is always the bytes last inserted for its key.
#[test]
fn random_sequences_keep_the_bound_and_the_bytes() {
    const KEYS: [&str; 12] = [
        "t1/blobs/s1/a",
        "t1/blobs/s1/b",
        "t1/blobs/s1/c",
        "t1/blobs/s2/a",
        "t1/blobs/s2/b",
        "t2/blobs/s1/a",
        "t2/blobs/s1/b",
        "t2/blobs/s3/a",
        "t2/blobs/s3/b",
        "t3/blobs/s1/a",
        "t3/blobs/s4/a",
        "t3/blobs/s4/b",
    ];
    const PREFIXES: [&str; 5] = [
        "t1/blobs/s1/",
        "t1/blobs/s2/",
        "t2/blobs/s1/",
        "t2/blobs/s3/",
        "t3/blobs/s4/",
    ];
    let mut hits = 0;
    for seed in 0..300u64 {
        let mut rng = SplitMix64::new(seed);
        let max_bytes = 20 + rng.next_u64() % 200;
        let max_entry = 1 + rng.next_u64() % 120;
        let max_entries = (rng.next_u64() % 10) as usize;
        let mut cache = ByteLru::new(max_bytes, max_entry, max_entries);
        let mut model: std::collections::HashMap<&str, Vec<u8>> = Default::default();
        for step in 0..400 {
            let key = KEYS[(rng.next_u64() % KEYS.len() as u64) as usize];
            match rng.next_u64() % 10 {
                0..=4 => {
                    let len = (rng.next_u64() % (max_entry + 20)) as usize;
                    let value: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                    model.insert(key, value.clone());
                    cache.insert(key.to_string(), value);
                }
                5..=8 => {
                    if let Some(bytes) = cache.get(key) {
                        hits += 1;
                        assert_eq!(
                            Some(bytes),
                            model.get(key).map(Vec::as_slice),
                            "seed {seed} step {step}: {key} maps to other bytes"
                        );
                    }
                }
                _ => {
                    let prefix = PREFIXES[(rng.next_u64() % PREFIXES.len() as u64) as usize];
                    cache.remove_prefix(prefix);
                    model.retain(|k, _| !k.starts_with(prefix));
                    assert!(
                        cache.entries.iter().all(|(k, _)| !k.starts_with(prefix)),
                        "seed {seed} step {step}"
                    );
                }
            }
            let counted: u64 = cache.entries.iter().map(|(k, v)| cost(k, v)).sum();
            assert_eq!(cache.bytes(), counted, "seed {seed} step {step}");
            assert!(cache.bytes() <= max_bytes, "seed {seed} step {step}");
            assert!(cache.len() <= max_entries, "seed {seed} step {step}");
            assert!(
                cache
                    .entries
                    .iter()
                    .all(|(_, v)| v.len() as u64 <= max_entry),
                "seed {seed} step {step}"
            );
            let mut keys: Vec<&str> = cache.entries.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(
                keys.len(),
                cache.len(),
                "seed {seed} step {step}: a key twice"
            );
        }
    }
    // The sequences are not all misses.
    assert!(hits > 1000, "{hits} hits");
}
