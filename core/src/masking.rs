//! Masking of secrets (issue 32): the one place that decides what of a text is a secret and
//! replaces it, for tool output, transcripts, request logs and snapshots alike.
//!
//! Two layers, applied in this order by [`Masker::mask`]:
//!
//! * **Known secrets** ([`Masker`]): every value the host knows (a tenant's secrets, provider
//!   keys) and its common encodings become [`placeholder`]`(NAME)` (`[secret:NAME]`): the raw
//!   value; its JSON string-literal escapes (`serde_json`'s, and the ASCII-only `\uXXXX` form
//!   of Python's `json.dumps`); URL encodings (every byte but RFC 3986's unreserved ones
//!   percent-encoded; also with `encodeURIComponent`'s `!'()*` kept, and with a form's `+` for
//!   a space; `%2F` and `%2f`); hex (lower and upper); base64 (standard and url-safe, padded or not,
//!   alone or inside a longer base64 text: for each of the three alignments the value can
//!   have inside a base64 stream, the characters that depend on the value's bytes alone, as
//!   GitHub Actions does; so `echo $TOKEN | base64` and `printf 'x%s' $TOKEN | base64` are
//!   caught). A value with surrounding whitespace is also masked trimmed. All patterns of all
//!   secrets are matched in one pass (Aho-Corasick, built once in [`Masker::new`]).
//!   Overlapping matches are merged into one masked region named after its longest match
//!   (ties: the smallest name); a value known under several names is masked as the smallest.
//! * **The detector** ([`mask_generic`], [`detect`]) for secrets Wuhu does not know, replaced
//!   by [`GENERIC_PLACEHOLDER`] (`[secret]`): private-key blocks, the credential after
//!   `Bearer` (and after `Basic` in an `Authorization` header), provider token shapes (see
//!   [`detect`]), JWTs, the password of URL userinfo, AWS secret access keys next to their
//!   label, and high-entropy words ([`is_random_word`]). It is conservative on ordinary tool
//!   output: hex (git SHAs, checksums, UUIDs), paths, npm integrity hashes, providers' ids,
//!   identifiers, words over [`MAX_RANDOM_WORD_LEN`] and wrapped base64 blocks are left alone.
//!
//! [`StreamMasker`] masks text that arrives in pieces (deltas, output chunks): it holds back
//! the end of what it was given until no secret can start in it (with
//! [`StreamMasker::known_only`], until no known secret can: at most [`Masker::longest`]` - 1`
//! bytes).
//!
//! What masking cannot catch: a secret the program transformed in any other way (reversed,
//! split, hashed, compressed, encrypted, another encoding or a nested one: base64 of hex,
//! URL-encoding inside JSON with `\u0025`, …), a known value shorter than [`MIN_MASKED_LEN`],
//! and unknown secrets that look like ordinary words.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use aho_corasick::automaton::Automaton;
use aho_corasick::nfa::contiguous::NFA;
use aho_corasick::{Input, MatchKind};

#[cfg(test)]
mod tests;

/// Shortest value (in bytes) a [`Masker`] masks. Shorter values are left alone: a 1–5
/// character value (`yes`, `1234`, `admin`) also occurs in ordinary text by chance, so masking
/// it would garble output and, by where the placeholders land, tell the value anyway.
pub const MIN_MASKED_LEN: usize = 6;

/// Most secrets one [`Masker`] takes; the rest (after the first `MAX_SECRETS` by name) are not
/// masked and counted in [`Masker::ignored`]. A tenant's secrets are tens.
pub const MAX_SECRETS: usize = 1024;

/// Longest piece of a value patterns are built from, in bytes. A longer value is masked as
/// pieces of at most this length (each with its encodings), so its every part is masked but an
/// occurrence shows as several placeholders. Bounds the hold-back of a [`StreamMasker`]: the
/// longest pattern is a piece URL-encoded, three bytes per byte.
pub const MAX_PIECE_LEN: usize = 4096;

/// Most bytes of all values together a [`Masker`] takes; secrets past it are counted in
/// [`Masker::ignored`]. With [`MAX_SECRETS`] it bounds the automaton (measured natively):
/// 1,024 ASCII values of 40 characters make 8,192 patterns, 4.8 MB, built in about 60 ms;
/// 64 KiB of 4 KB values 6.9 MB, about 65 ms; the worst, short values of punctuation and
/// non-ASCII characters (up to 21 patterns each, URL-encoded at 3 bytes per byte), about 18 MB
/// and half a second.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// What replaces a secret the detector found.
pub const GENERIC_PLACEHOLDER: &str = "[secret]";

/// Shortest word [`is_random_word`] judges.
pub const MIN_RANDOM_WORD_LEN: usize = 20;
/// Longest word [`is_random_word`] judges: longer ones are data (base64 images, minified
/// code), not credentials; credentials longer than this are caught by their shape (prefixes,
/// JWTs) or not at all.
pub const MAX_RANDOM_WORD_LEN: usize = 128;
/// Bits per character (Shannon, over the word's own characters) from which a word counts as
/// random. Random base62 of 20+ characters measures about 4.0+, English words and identifiers
/// stay lower.
pub const MIN_RANDOM_WORD_ENTROPY: f64 = 3.5;

/// Most bytes a [`StreamMasker`] holds back to keep the last words together for the detector
/// (beyond [`Masker::longest`]` - 1` for known secrets): a word (a JWT, a token) or a
/// `Bearer <token>` longer than this may be cut, and its pieces judged apart.
pub const STREAM_WORD_HOLD: usize = 4096;
/// Most bytes a [`StreamMasker`] holds back for a private-key block whose end has not arrived.
pub const STREAM_PEM_HOLD: usize = 16 * 1024;
/// Bytes of already emitted text a [`StreamMasker`] keeps as the detector's context (the word
/// before a token: `Bearer`, a label).
const STREAM_CONTEXT: usize = 256;

/// What replaces a known secret named `name`: `[secret:NAME]`.
pub fn placeholder(name: &str) -> String {
    format!("[secret:{name}]")
}

/// Known secrets and their encodings, matched in one pass; then the detector. Cheap to clone
/// (the automaton is shared). Its `Debug` shows names and counts, never values.
#[derive(Clone, Default)]
pub struct Masker {
    known: Option<Known>,
    names: Vec<String>,
    ignored: usize,
}

#[derive(Clone)]
struct Known {
    /// The contiguous NFA alone, not `AhoCorasick` (which links all three automata into the
    /// Worker): as fast for ~1,000 patterns (what `AhoCorasick` picks there), about 14 KB less
    /// gzip. The noncontiguous NFA alone is 2 KB smaller and a quarter slower.
    automaton: Arc<NFA>,
    /// Per pattern: index into `names`.
    pattern_name: Vec<u32>,
    /// Per pattern: its length in bytes.
    pattern_len: Vec<u32>,
    /// Per name: its placeholder.
    placeholders: Vec<String>,
    longest: usize,
}

impl Known {
    /// The first position at or after `from` where the rest of `text` is the start of a
    /// pattern not complete yet (more text could make it a secret), or `text.len()` when there
    /// is none. Each position is tried with an anchored walk of the automaton, which mostly
    /// dies within a byte or two; past a work budget (a text built to keep walks alive) it
    /// answers `from`, which holds everything that could be a secret's start.
    fn incomplete_from(&self, text: &[u8], from: usize) -> usize {
        let nfa = &*self.automaton;
        let Ok(start) = nfa.start_state(aho_corasick::Anchored::Yes) else {
            return from;
        };
        let mut budget = 64 * (text.len() - from.min(text.len())) + 4096;
        for i in from..text.len() {
            let mut sid = start;
            let mut alive = true;
            for &byte in &text[i..] {
                if budget == 0 {
                    return from;
                }
                budget -= 1;
                sid = nfa.next_state(aho_corasick::Anchored::Yes, sid, byte);
                if nfa.is_dead(sid) {
                    alive = false;
                    break;
                }
            }
            if alive {
                return i;
            }
        }
        text.len()
    }
}

impl fmt::Debug for Masker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masker")
            .field("names", &self.names)
            .field("patterns", &self.patterns())
            .field("longest", &self.longest())
            .field("ignored", &self.ignored)
            .finish()
    }
}

/// A masked region of a text: bytes `range`, masked as `name` (index into the masker's names).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Region {
    range: Range<usize>,
    name: u32,
    /// Length of the longest match in the region (which names it).
    best: usize,
}

impl Masker {
    /// A masker of `secrets` (name, value). Values shorter than [`MIN_MASKED_LEN`] are left
    /// out; past [`MAX_SECRETS`] or [`MAX_SECRET_BYTES`] the rest (by name) are counted in
    /// [`Masker::ignored`]. Builds the automaton: call once per set of secrets.
    pub fn new<I, N, V>(secrets: I) -> Masker
    where
        I: IntoIterator<Item = (N, V)>,
        N: Into<String>,
        V: AsRef<str>,
    {
        let mut pairs: Vec<(String, String)> = secrets
            .into_iter()
            .map(|(n, v)| (n.into(), v.as_ref().to_string()))
            .filter(|(_, v)| v.len() >= MIN_MASKED_LEN)
            .collect();
        pairs.sort();
        pairs.dedup();
        let mut names: Vec<String> = Vec::new();
        let mut ignored = 0;
        let mut total = 0usize;
        // Pattern -> name index; names come in ascending order, so the first (smallest) name
        // of a pattern stays: a value known twice is masked as its smallest name.
        let mut patterns: BTreeMap<String, u32> = BTreeMap::new();
        for (name, value) in pairs {
            let is_new = names.last() != Some(&name);
            if is_new && (names.len() >= MAX_SECRETS || total + value.len() > MAX_SECRET_BYTES) {
                ignored += 1;
                continue;
            }
            if !is_new && total + value.len() > MAX_SECRET_BYTES {
                ignored += 1;
                continue;
            }
            if is_new {
                names.push(name);
            }
            total += value.len();
            let index = (names.len() - 1) as u32;
            let mut values = vec![value.as_str()];
            let trimmed = value.trim();
            if trimmed.len() != value.len() && trimmed.len() >= MIN_MASKED_LEN {
                values.push(trimmed);
            }
            for v in values {
                for piece in pieces(v) {
                    for pattern in encodings(piece) {
                        patterns.entry(pattern).or_insert(index);
                    }
                }
            }
        }
        if patterns.is_empty() {
            return Masker {
                known: None,
                names,
                ignored,
            };
        }
        let automaton = NFA::builder()
            .match_kind(MatchKind::Standard)
            .build(patterns.keys())
            .expect("the patterns are bounded");
        let longest = patterns.keys().map(String::len).max().unwrap_or(0);
        let known = Known {
            automaton: Arc::new(automaton),
            pattern_len: patterns.keys().map(|p| p.len() as u32).collect(),
            pattern_name: patterns.into_values().collect(),
            placeholders: names.iter().map(|n| placeholder(n)).collect(),
            longest,
        };
        Masker {
            known: Some(known),
            names,
            ignored,
        }
    }

    /// Whether no secret is known (the masker still applies the detector).
    pub fn is_empty(&self) -> bool {
        self.known.is_none()
    }

    /// Patterns matched (values and their encodings, without duplicates).
    pub fn patterns(&self) -> usize {
        self.known.as_ref().map_or(0, |k| k.pattern_name.len())
    }

    /// Secrets left out for the bounds ([`MAX_SECRETS`], [`MAX_SECRET_BYTES`]).
    pub fn ignored(&self) -> usize {
        self.ignored
    }

    /// The longest pattern in bytes (0 when none): a [`StreamMasker`] holds back one byte less.
    pub fn longest(&self) -> usize {
        self.known.as_ref().map_or(0, |k| k.longest)
    }

    /// `text` with known values and their encodings replaced by `[secret:NAME]`, then what the
    /// detector finds by `[secret]`.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.mask_known(text) {
            Cow::Borrowed(text) => mask_generic(text),
            Cow::Owned(known) => match mask_generic(&known) {
                Cow::Borrowed(_) => Cow::Owned(known),
                Cow::Owned(masked) => Cow::Owned(masked),
            },
        }
    }

    /// `text` with known values and their encodings replaced by `[secret:NAME]` (no detector).
    pub fn mask_known<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.known.is_none() {
            return Cow::Borrowed(text);
        }
        self.replace_regions(text, &self.regions(text))
    }

    /// `text` with `regions` (of known secrets) replaced by their placeholders.
    fn replace_regions<'a>(&self, text: &'a str, regions: &[Region]) -> Cow<'a, str> {
        let Some(known) = &self.known else {
            return Cow::Borrowed(text);
        };
        if regions.is_empty() {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for region in regions {
            out.push_str(&text[at..region.range.start]);
            out.push_str(&known.placeholders[region.name as usize]);
            at = region.range.end;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// Masks every string in `value` ([`Masker::mask`]), object keys included: a program may
    /// key a map by a token, and JSON shown to people or models must not carry it. Two keys
    /// that mask to the same text keep the later value.
    pub fn mask_json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(text) => {
                if let Cow::Owned(masked) = self.mask(text) {
                    *text = masked;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.mask_json(item)),
            Value::Object(map) => {
                let keys_change = map.keys().any(|k| matches!(self.mask(k), Cow::Owned(_)));
                if keys_change {
                    let old = std::mem::take(map);
                    for (key, mut field) in old {
                        self.mask_json(&mut field);
                        map.insert(self.mask(&key).into_owned(), field);
                    }
                } else {
                    map.values_mut().for_each(|field| self.mask_json(field));
                }
            }
            _ => {}
        }
    }

    /// The regions of known secrets in `text` (in order, disjoint), each with its
    /// placeholder: for a host that masks text it must cut in its own way (a request log's
    /// events).
    pub fn known_regions(&self, text: &str) -> Vec<(Range<usize>, &str)> {
        let Some(known) = &self.known else {
            return Vec::new();
        };
        self.regions(text)
            .into_iter()
            .map(|r| (r.range, known.placeholders[r.name as usize].as_str()))
            .collect()
    }

    /// The merged regions of known secrets in `text`, in order, disjoint.
    fn regions(&self, text: &str) -> Vec<Region> {
        let Some(known) = &self.known else {
            return Vec::new();
        };
        let mut matches: Vec<Region> = known
            .automaton
            .try_find_overlapping_iter(Input::new(text))
            .expect("a standard automaton searches overlapping")
            .map(|m| {
                let p = m.pattern().as_usize();
                Region {
                    range: m.start()..m.end(),
                    name: known.pattern_name[p],
                    best: known.pattern_len[p] as usize,
                }
            })
            .collect();
        if matches.is_empty() {
            return matches;
        }
        matches.sort_by_key(|r| r.range.start);
        let mut merged: Vec<Region> = Vec::with_capacity(matches.len());
        for m in matches {
            match merged.last_mut() {
                Some(last) if m.range.start < last.range.end => {
                    last.range.end = last.range.end.max(m.range.end);
                    if m.best > last.best || (m.best == last.best && m.name < last.name) {
                        last.best = m.best;
                        last.name = m.name;
                    }
                }
                _ => merged.push(m),
            }
        }
        merged
    }
}

/// `value` in pieces of at most [`MAX_PIECE_LEN`] bytes, cut at char boundaries.
fn pieces(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = value;
    while rest.len() > MAX_PIECE_LEN {
        let mut cut = MAX_PIECE_LEN;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        out.push(piece);
        rest = tail;
    }
    if rest.len() >= MIN_MASKED_LEN || out.is_empty() {
        out.push(rest);
    } else if let Some(last) = out.pop() {
        // A short tail would match by chance: it goes with the piece before (which may then
        // exceed the bound by a few bytes).
        let start = last.as_ptr() as usize - value.as_ptr() as usize;
        out.push(&value[start..]);
    }
    out
}

/// The patterns of one value: the value and its encodings, each at least [`MIN_MASKED_LEN`]
/// bytes, without duplicates.
pub fn encodings(value: &str) -> Vec<String> {
    let bytes = value.as_bytes();
    let mut out = vec![value.to_string()];
    // JSON string literal, without the quotes: serde_json's escapes, and ASCII-only.
    let json = serde_json::to_string(value).expect("a string serializes");
    out.push(json[1..json.len() - 1].to_string());
    out.push(json_ascii(value));
    // URL: percent-encoding of all but RFC 3986's unreserved bytes, upper and lower hex; the
    // form encoding (a space as `+`); `encodeURIComponent` (also keeps `!'()*`).
    for upper in [true, false] {
        out.push(percent(bytes, upper, false, b""));
        out.push(percent(bytes, upper, true, b""));
        out.push(percent(bytes, upper, false, b"!'()*"));
    }
    out.push(hex::encode(bytes));
    out.push(hex::encode_upper(bytes));
    for alphabet in [BASE64_STANDARD, BASE64_URL] {
        let full = base64_full(bytes, alphabet);
        out.push(full.trim_end_matches('=').to_string());
        out.push(full);
        for offset in 0..3 {
            out.push(base64_stable(bytes, offset, alphabet));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|p| p.len() >= MIN_MASKED_LEN && seen.insert(p.clone()));
    out
}

fn json_ascii(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out
}

fn percent(bytes: &[u8], upper: bool, plus_for_space: bool, also_keep: &[u8]) -> String {
    const UPPER: &[u8; 16] = b"0123456789ABCDEF";
    const LOWER: &[u8; 16] = b"0123456789abcdef";
    let digits = if upper { UPPER } else { LOWER };
    let mut out = String::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || also_keep.contains(&b)
        {
            out.push(char::from(b));
        } else if b == b' ' && plus_for_space {
            out.push('+');
        } else {
            out.push('%');
            out.push(char::from(digits[usize::from(b >> 4)]));
            out.push(char::from(digits[usize::from(b & 15)]));
        }
    }
    out
}

const BASE64_STANDARD: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 of `bytes` zero-padded to whole groups, one character per 6 bits, no `=`.
fn base64_groups(bytes: &[u8], alphabet: &[u8; 64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for shift in [18, 12, 6, 0] {
            out.push(alphabet[((n >> shift) & 63) as usize]);
        }
    }
    out
}

/// Base64 of `bytes` alone, with `=` padding.
fn base64_full(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut chars = base64_groups(bytes, alphabet);
    let keep = (bytes.len() * 8).div_ceil(6);
    for c in chars.iter_mut().skip(keep) {
        *c = b'=';
    }
    String::from_utf8(chars).expect("base64 is ASCII")
}

/// The base64 characters that depend on `bytes` alone when `offset` (0–2) bytes of a group
/// come before them in a longer base64 text: character `j` covers bits `6j..6j+6` of the
/// stream, and is stable when those bits lie inside the value's.
fn base64_stable(bytes: &[u8], offset: usize, alphabet: &[u8; 64]) -> String {
    let mut stream = vec![0u8; offset];
    stream.extend_from_slice(bytes);
    let chars = base64_groups(&stream, alphabet);
    let first = (8 * offset).div_ceil(6);
    let end = (8 * (offset + bytes.len())) / 6;
    if end <= first {
        return String::new();
    }
    String::from_utf8(chars[first..end].to_vec()).expect("base64 is ASCII")
}

/// `text` with what the detector finds replaced by `[secret]`.
pub fn mask_generic(text: &str) -> Cow<'_, str> {
    mask_generic_with(text, GENERIC_PLACEHOLDER)
}

/// `text` with what the detector finds replaced by `replacement` (request logs keep their
/// `[redacted]`).
pub fn mask_generic_with<'a>(text: &'a str, replacement: &str) -> Cow<'a, str> {
    let spans = detect(text);
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(replace_spans(text, &spans, replacement))
}

/// Whether the detector finds anything in `text`.
pub fn contains_secret(text: &str) -> bool {
    !detect(text).is_empty()
}

fn replace_spans(text: &str, spans: &[Range<usize>], replacement: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for span in spans {
        out.push_str(&text[at..span.start]);
        out.push_str(replacement);
        at = span.end;
    }
    out.push_str(&text[at..]);
    out
}

/// The byte ranges of `text` the detector judges secret, in order, disjoint:
///
/// * a private-key block, `-----BEGIN … PRIVATE KEY-----` to its `-----END …-----` (to the end
///   of the text when it has none);
/// * the word after `Bearer` (when it has a digit or punctuation, mixes cases, is 16+
///   characters, or follows `Authorization:`), and after `Basic` following `Authorization:`;
/// * provider tokens by prefix: `sk-`/`sk_` (OpenAI, Anthropic `sk-ant-`, Stripe), `AKIA`/`ASIA`
///   (AWS access key ids), `ghp_` `gho_` `ghs_` `ghu_` `ghr_` `github_pat_` (GitHub), `glpat-`
///   (GitLab), `xoxb-` `xoxp-` `xoxa-` `xoxs-` `xoxe-` `xapp-` (Slack), `npm_`, `hf_`, `AIza`
///   (Google), each with the length and alphabet of its tail;
/// * JWTs (`eyJ….….…`), Discord bot tokens (three dot parts: the base64 of an id, 6, 27+) and
///   Telegram bot tokens (`123456789:AA…`);
/// * the password of URL userinfo (`https://user:[secret]@host`);
/// * the 40-character key after an `aws_secret_access_key` / `SecretAccessKey` label;
/// * high-entropy words ([`is_random_word`]), except in wrapped base64 blocks.
pub fn detect(text: &str) -> Vec<Range<usize>> {
    detect_within(text, 0..text.len())
}

/// [`detect`] for the words of `text` that touch `within` (the word before them is their
/// context): what a stream judges of its new text, with the text around it as context, without
/// judging that context again. Spans may reach outside `within`.
fn detect_within(text: &str, within: Range<usize>) -> Vec<Range<usize>> {
    let mut spans = pem_blocks(text);
    userinfo(text, &mut spans);
    // From the start of the word before the first word that touches `within`.
    let bytes = text.as_bytes();
    let mut from = within.start.min(bytes.len());
    for _ in 0..2 {
        while from > 0 && is_word_byte(bytes[from - 1]) {
            from -= 1;
        }
        while from > 0 && !is_word_byte(bytes[from - 1]) {
            from -= 1;
        }
    }
    while from < bytes.len() && !is_word_byte(bytes[from]) {
        from += 1;
    }
    let mut to = within.end.min(bytes.len());
    while to < bytes.len() && is_word_byte(bytes[to]) {
        to += 1;
    }
    words_rules(text, from..to, &mut spans);
    spans.sort_by_key(|s| s.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// Private-key blocks (unterminated: to the end of the text).
fn pem_blocks(text: &str) -> Vec<Range<usize>> {
    const BEGIN: &str = "-----BEGIN ";
    const END: &str = "-----END ";
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = find_all(&text[from..], BEGIN).next() {
        let start = from + found;
        let label_from = start + BEGIN.len();
        let Some(label_len) = text[label_from..].find("-----") else {
            break;
        };
        let label = &text[label_from..label_from + label_len];
        if label.len() > 64 || !label.ends_with("PRIVATE KEY") {
            from = label_from;
            continue;
        }
        let after = label_from + label_len + 5;
        let end = text[after..]
            .find(END)
            .and_then(|e| {
                let tail = after + e + END.len();
                text[tail..].find("-----").map(|f| tail + f + 5)
            })
            .unwrap_or(text.len());
        spans.push(start..end);
        from = end;
    }
    spans
}

/// The password of each `scheme://user:password@host`.
fn userinfo(text: &str, spans: &mut Vec<Range<usize>>) {
    for at in find_all(text, "://") {
        let from = at + 3;
        let authority_len = text[from..]
            .find(|c: char| {
                matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`') || c.is_whitespace()
            })
            .unwrap_or(text.len() - from);
        let authority = &text[from..from + authority_len];
        let Some(at_sign) = authority.rfind('@') else {
            continue;
        };
        let Some(colon) = authority[..at_sign].find(':') else {
            continue;
        };
        let password = &authority[colon + 1..at_sign];
        if password.is_empty() || password.starts_with("[secret") || password == "[redacted]" {
            continue;
        }
        spans.push(from + colon + 1..from + at_sign);
    }
}

/// Characters of a word: `A-Z a-z 0-9 + / _ - . ~`.
#[inline]
fn is_word_byte(b: u8) -> bool {
    WORD_BYTES[usize::from(b)]
}

const WORD_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] =
            c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'_' | b'-' | b'.' | b'~');
        b += 1;
    }
    table
};

/// The positions of `needle` in `text` (not overlapping), found by its first byte.
fn find_all<'a>(text: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let bytes = text.as_bytes();
    let first = needle.as_bytes()[0];
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() {
            let p = at + bytes[at..].iter().position(|&b| b == first)?;
            if bytes[p..].starts_with(needle.as_bytes()) {
                at = p + needle.len();
                return Some(p);
            }
            at = p + 1;
        }
        None
    })
}

/// The word runs of `text`: (start, end).
fn word_ranges(text: &str, within: Range<usize>) -> Vec<Range<usize>> {
    let bytes = &text.as_bytes()[..within.end];
    let mut out = Vec::new();
    let mut i = within.start;
    while i < bytes.len() {
        if !is_word_byte(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_word_byte(bytes[i]) {
            i += 1;
        }
        out.push(start..i);
    }
    out
}

/// Whether the word at `at` is on a line of wrapped base64 (two or more lines of the same
/// width, 60+, and the shorter last line): data, not credentials, so not judged by entropy.
fn in_base64_block(text: &str, at: usize) -> bool {
    let line = line_around(text, at);
    let Some(w) = base64_width(&text[line.clone()]) else {
        return false;
    };
    let before = |r: &Range<usize>| (r.start > 0).then(|| line_around(text, r.start - 1));
    let after = |r: &Range<usize>| (r.end < text.len()).then(|| line_around(text, r.end + 1));
    let width = |r: Option<Range<usize>>| r.and_then(|r| base64_width(&text[r]));
    let previous = before(&line);
    let p = width(previous.clone());
    let full = w >= 60 && (p == Some(w) || width(after(&line)) == Some(w));
    let last = p
        .is_some_and(|p| p >= 60 && p >= w && width(previous.as_ref().and_then(before)) == Some(p));
    full || last
}

/// The line (without its `\n`) that holds byte `at`.
fn line_around(text: &str, at: usize) -> Range<usize> {
    let bytes = text.as_bytes();
    let at = at.min(bytes.len());
    let start = bytes[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let end = bytes[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |p| at + p);
    start..end
}

/// The width of a line of base64 (`\r` at its end ignored), if it is one.
fn base64_width(line: &str) -> Option<usize> {
    let content = line.strip_suffix('\r').unwrap_or(line);
    (!content.is_empty()
        && content
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_')))
    .then_some(content.len())
}

struct Prefix {
    prefix: &'static str,
    min_tail: usize,
    tail: fn(u8) -> bool,
    /// The tail must have a digit, or both cases.
    mixed: bool,
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}
fn alnum_underscore(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}
fn alnum_dash(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}
fn alnum_dash_underscore(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}
fn upper_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

const PREFIXES: &[Prefix] = &[
    Prefix {
        prefix: "sk-",
        min_tail: 12,
        tail: alnum_dash_underscore,
        mixed: true,
    },
    Prefix {
        prefix: "sk_",
        min_tail: 12,
        tail: alnum_underscore,
        mixed: true,
    },
    Prefix {
        prefix: "AKIA",
        min_tail: 16,
        tail: upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: "ASIA",
        min_tail: 16,
        tail: upper_digit,
        mixed: false,
    },
    Prefix {
        prefix: "ghp_",
        min_tail: 20,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "gho_",
        min_tail: 20,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "ghs_",
        min_tail: 20,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "ghu_",
        min_tail: 20,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "ghr_",
        min_tail: 20,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "github_pat_",
        min_tail: 22,
        tail: alnum_underscore,
        mixed: false,
    },
    Prefix {
        prefix: "glpat-",
        min_tail: 20,
        tail: alnum_dash_underscore,
        mixed: false,
    },
    Prefix {
        prefix: "xoxb-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "xoxp-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "xoxa-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "xoxs-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "xoxe-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "xapp-",
        min_tail: 10,
        tail: alnum_dash,
        mixed: true,
    },
    Prefix {
        prefix: "npm_",
        min_tail: 30,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "hf_",
        min_tail: 30,
        tail: alnum,
        mixed: false,
    },
    Prefix {
        prefix: "AIza",
        min_tail: 30,
        tail: alnum_dash_underscore,
        mixed: false,
    },
];

/// The length of a provider token at the start of `word`, if one is.
fn prefixed_token(word: &str) -> Option<usize> {
    let bytes = word.as_bytes();
    if !matches!(bytes.first(), Some(b's' | b'A' | b'g' | b'x' | b'n' | b'h')) {
        return None;
    }
    PREFIXES.iter().find_map(|p| {
        if !word.starts_with(p.prefix) {
            return None;
        }
        let tail_len = bytes[p.prefix.len()..]
            .iter()
            .take_while(|&&b| (p.tail)(b))
            .count();
        let tail = &bytes[p.prefix.len()..p.prefix.len() + tail_len];
        let mixed = tail.iter().any(u8::is_ascii_digit)
            || (tail.iter().any(u8::is_ascii_uppercase) && tail.iter().any(u8::is_ascii_lowercase));
        (tail_len >= p.min_tail && (!p.mixed || mixed)).then_some(p.prefix.len() + tail_len)
    })
}

fn is_base64url(part: &str) -> bool {
    !part.is_empty()
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Three non-empty base64url parts separated by dots, the first a JSON object (`eyJ`).
fn is_jwt(word: &str) -> bool {
    word.starts_with("eyJ")
        && three_parts(word).is_some_and(|parts| parts.iter().all(|p| is_base64url(p)))
}

/// The three dot-separated parts of `word`, if it has exactly three.
fn three_parts(word: &str) -> Option<[&str; 3]> {
    let mut parts = word.split('.');
    let out = [parts.next()?, parts.next()?, parts.next()?];
    parts.next().is_none().then_some(out)
}

/// A Discord bot token: base64 of a numeric id (23–28 characters, `M`/`N`/`O` first), a
/// 6-character timestamp, an HMAC of 27+.
fn is_discord_token(word: &str) -> bool {
    if word.len() < 23 + 1 + 6 + 1 + 27 || !word.starts_with(['M', 'N', 'O']) {
        return false;
    }
    let Some(parts) = three_parts(word) else {
        return false;
    };
    (23..=28).contains(&parts[0].len())
        && parts[0].starts_with(['M', 'N', 'O'])
        && parts[1].len() == 6
        && parts[2].len() >= 27
        && parts.iter().all(|p| is_base64url(p))
}

/// Whether `word` looks random: [`MIN_RANDOM_WORD_LEN`] to [`MAX_RANDOM_WORD_LEN`]
/// characters, lowercase and uppercase letters and digits all present, not hex (git SHAs,
/// checksums, UUIDs: hex digits and dashes) nor a label and a hex id (`MARK3f9a1c2e-0001`), not
/// a path (`/`, `.`, `~` first), not an integrity
/// hash (`sha512-…`), a mangled symbol (`_ZN…`) or a provider's id ([`ID_PREFIXES`]), not
/// words run together ([`WORDY_VOWELS`]),
/// and at least [`MIN_RANDOM_WORD_ENTROPY`]
/// bits of entropy per character.
pub fn is_random_word(word: &str) -> bool {
    if !(MIN_RANDOM_WORD_LEN..=MAX_RANDOM_WORD_LEN).contains(&word.len())
        || word.starts_with(['/', '.', '~'])
        || ["sha1-", "sha256-", "sha384-", "sha512-", "_ZN"]
            .iter()
            .chain(ID_PREFIXES)
            .any(|p| word.starts_with(p))
        || word
            .strip_prefix("0x")
            .unwrap_or(word)
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-')
    {
        return false;
    }
    let lower = word.bytes().any(|b| b.is_ascii_lowercase());
    let upper = word.bytes().any(|b| b.is_ascii_uppercase());
    let digit = word.bytes().any(|b| b.is_ascii_digit());
    lower
        && upper
        && digit
        && !is_label_and_hex(word)
        && !is_wordy(word)
        && entropy_per_char(word) >= MIN_RANDOM_WORD_ENTROPY
}

/// Whether `word` is an uppercase label and a lowercase hex id (`MARK3f9a1c2e-00038001`,
/// `BUILD1f2e3d4c_7`): its capitals all lead and the rest is hex, digits, `-` and `_`. A random
/// token's capitals are spread through it.
fn is_label_and_hex(word: &str) -> bool {
    let rest = word.trim_start_matches(|c: char| c.is_ascii_uppercase());
    rest.len() < word.len()
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-' || b == b'_')
}

/// Prefixes of the random ids LLM providers give messages, tool calls and requests
/// (`msg_01X…`, `toolu_01A…`, `call_…`, `chatcmpl-…`): names, not credentials, and what a
/// request log or a transcript is read by; not judged by entropy.
pub const ID_PREFIXES: &[&str] = &[
    "msg_",
    "toolu_",
    "srvtoolu_",
    "req_",
    "call_",
    "chatcmpl-",
    "resp_",
    "fc_",
    "rs_",
    "run_",
    "asst_",
    "thread_",
    "file-",
    "batch_",
];

/// Whether `word` reads like an identifier made of words (`responseHeaderTimeout2`): at least
/// [`WORDY_VOWELS`] of its letters are vowels. Random letters are vowels a fifth of the time.
fn is_wordy(word: &str) -> bool {
    let letters = word.bytes().filter(u8::is_ascii_alphabetic).count();
    let vowels = word
        .bytes()
        .filter(|b| matches!(b.to_ascii_lowercase(), b'a' | b'e' | b'i' | b'o' | b'u'))
        .count();
    vowels as f64 >= WORDY_VOWELS * letters as f64
}

/// Share of vowels among a word's letters from which [`is_random_word`] takes it for words run
/// together (English runs about 0.4; random letters about 0.19, and reach 0.4 in about 2 % of
/// 20-character words).
pub const WORDY_VOWELS: f64 = 0.4;

/// Shannon entropy of the word's byte distribution, in bits per byte.
pub fn entropy_per_char(word: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in word.bytes() {
        counts[usize::from(b)] += 1;
    }
    // H = log2(n) - sum(c log2 c) / n, one log per distinct byte.
    let len = word.len() as f64;
    let sum: f64 = word
        .bytes()
        .filter_map(|b| {
            let c = std::mem::take(&mut counts[usize::from(b)]);
            (c > 0).then(|| f64::from(c) * f64::from(c).log2())
        })
        .sum();
    if word.is_empty() {
        0.0
    } else {
        len.log2() - sum / len
    }
}

/// The rules on words: tokens by shape, the word after `Bearer` or a label, random words.
fn words_rules(text: &str, within: Range<usize>, spans: &mut Vec<Range<usize>>) {
    let words = word_ranges(text, within);
    for (i, range) in words.iter().enumerate() {
        let raw = &text[range.clone()];
        let word = raw.trim_end_matches('.');
        if word.is_empty() {
            continue;
        }
        let start = range.start;
        let end = start + word.len();
        // Tokens by shape: the whole word, or a prefixed token at its start.
        if is_jwt(word) || is_discord_token(word) {
            spans.push(start..end);
            continue;
        }
        if let Some(len) = prefixed_token(word) {
            spans.push(start..start + len);
            continue;
        }
        // Context: the word before and what separates them.
        if let Some(prev) = i.checked_sub(1).map(|p| words[p].clone()) {
            let before = &text[prev.clone()];
            let between = &text[prev.end..start];
            if let Some(span) = after_label(text, prev.start, before, between, word) {
                spans.push(start..start + span);
                continue;
            }
            // Telegram: `<8–10 digits>:AA<33 characters>`.
            if between == ":"
                && (8..=10).contains(&before.len())
                && before.bytes().all(|b| b.is_ascii_digit())
                && word.starts_with("AA")
                && (33..=40).contains(&word.len())
                && is_base64url(word)
            {
                spans.push(prev.start..end);
                continue;
            }
        }
        // Random words, unless in a base64 block.
        if word.len() >= 60 && in_base64_block(text, start) {
            continue;
        }
        let before = spans.len();
        random_segments(word, start, spans);
        if spans.len() > before && in_base64_block(text, start) {
            spans.truncate(before);
        }
    }
}

/// The length of the credential at the start of `word` when `before` (a word at `before_at`)
/// and `between` make it one: `Bearer x`, `Authorization: Basic x`, `aws_secret_access_key=x`.
fn after_label(
    text: &str,
    before_at: usize,
    before: &str,
    between: &str,
    word: &str,
) -> Option<usize> {
    let spaces = !between.is_empty() && between.bytes().all(|b| b == b' ' || b == b'\t');
    let authorization = || {
        text[..before_at]
            .trim_end_matches([' ', '\t', '"', '\''])
            .strip_suffix(':')
            .map(|t| t.trim_end_matches([' ', '\t', '"', '\'']))
            .is_some_and(|t| {
                t.len() >= 13 && t[t.len() - 13..].eq_ignore_ascii_case("authorization")
            })
    };
    if spaces && before.eq_ignore_ascii_case("bearer") {
        let token_like = word.bytes().any(|b| !b.is_ascii_alphabetic())
            || word.len() >= 16
            || word[1..].bytes().any(|b| b.is_ascii_uppercase());
        if token_like || authorization() {
            return Some(word.len());
        }
    }
    if spaces && before.eq_ignore_ascii_case("basic") && authorization() {
        return Some(word.len());
    }
    let label = ["aws_secret_access_key", "secretaccesskey", "aws_secret_key"]
        .iter()
        .any(|l| before.eq_ignore_ascii_case(l));
    if label
        && between.len() <= 6
        && between.contains([':', '='])
        && between
            .bytes()
            .all(|b| matches!(b, b' ' | b'\t' | b'"' | b'\'' | b':' | b'='))
    {
        let len = word
            .bytes()
            .take_while(|&b| b.is_ascii_alphanumeric() || b == b'/' || b == b'+')
            .count();
        if len == 40 {
            return Some(len);
        }
    }
    None
}

/// Spans of the random parts of `word` at `start`: its dot-separated parts, and in a URL's
/// rest (`//host/path`) each path segment's.
fn random_segments(word: &str, start: usize, spans: &mut Vec<Range<usize>>) {
    let mut judge = |part: &str, at: usize| {
        let mut offset = 0;
        for piece in part.split('.') {
            if is_random_word(piece) {
                spans.push(at + offset..at + offset + piece.len());
            }
            offset += piece.len() + 1;
        }
    };
    if word.starts_with("//") {
        let mut offset = 0;
        for segment in word.split('/') {
            judge(segment, start + offset);
            offset += segment.len() + 1;
        }
    } else if !word.starts_with(['/', '~', '.']) {
        judge(word, start);
    }
}

/// Masks text that arrives in pieces: [`StreamMasker::push`] returns what is safe to show now,
/// [`StreamMasker::finish`] the rest. The concatenated output equals [`Masker::mask`] of the
/// whole text, as long as no word the detector judges is longer than [`STREAM_WORD_HOLD`] and
/// no private-key block longer than [`STREAM_PEM_HOLD`].
///
/// It holds back the last [`Masker::longest`]` - 1` bytes (a known secret may start there), the
/// last three words (a token and its `Bearer` or label; at most [`STREAM_WORD_HOLD`] bytes), a
/// private-key block without its end yet (at most [`STREAM_PEM_HOLD`] bytes), and never cuts
/// inside a masked region or a UTF-8 character. [`StreamMasker::known_only`] masks known
/// secrets alone and holds back only for them (a model's reply, `llm::masked_reply`).
#[derive(Clone)]
pub struct StreamMasker {
    masker: Masker,
    /// Whether the detector applies (and so its hold-back of words and key blocks); without it
    /// only known secrets are masked and the hold-back is at most [`Masker::longest`]` - 1`.
    detector: bool,
    pending: String,
    /// The end of what was emitted, known secrets masked, detector not applied.
    context: String,
}

/// Shows the masker and how much is held, never the held text (it may hold a secret).
impl fmt::Debug for StreamMasker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamMasker")
            .field("masker", &self.masker)
            .field("held_bytes", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl StreamMasker {
    /// A stream masked by `masker`: known secrets, then the detector.
    pub fn new(masker: Masker) -> StreamMasker {
        StreamMasker {
            masker,
            detector: true,
            pending: String::new(),
            context: String::new(),
        }
    }

    /// A stream masked of `masker`'s known secrets only ([`Masker::mask_known`]): it holds
    /// back at most [`Masker::longest`]` - 1` bytes (plus the rest of a UTF-8 character, and a
    /// masked region that straddles that point), and nothing when `masker` knows no secret.
    /// The concatenated output equals [`Masker::mask_known`] of the whole text, always.
    pub fn known_only(masker: Masker) -> StreamMasker {
        StreamMasker {
            masker,
            detector: false,
            pending: String::new(),
            context: String::new(),
        }
    }

    /// Takes `chunk`; returns what can be shown now, masked.
    pub fn push(&mut self, chunk: &str) -> String {
        self.pending.push_str(chunk);
        let (cut, mut regions) = self.cut();
        if cut == 0 {
            return String::new();
        }
        let rest = self.pending.split_off(cut);
        let segment = std::mem::replace(&mut self.pending, rest);
        // The cut is never inside a region: those before it are the segment's.
        regions.retain(|r| r.range.end <= cut);
        self.emit(&segment, &regions)
    }

    /// The rest, masked; the stream starts over.
    pub fn finish(&mut self) -> String {
        let segment = std::mem::take(&mut self.pending);
        let regions = self.masker.regions(&segment);
        let out = self.emit(&segment, &regions);
        self.context.clear();
        out
    }

    /// How much of `pending` can go now, and the regions of known secrets in `pending`.
    fn cut(&self) -> (usize, Vec<Region>) {
        let text = self.pending.as_str();
        let len = text.len();
        // Known secrets: none can start before `len - (longest - 1)` and still be incomplete,
        // and only where the rest of the text is the start of one of them.
        let mut cut = floor_char_boundary(
            text,
            len.saturating_sub(self.masker.longest().saturating_sub(1)),
        );
        if let Some(known) = &self.masker.known {
            cut = floor_char_boundary(text, known.incomplete_from(text.as_bytes(), cut));
        }
        if !self.detector {
            return self.cut_outside_regions(cut);
        }
        // The last three words stay together.
        let bytes = text.as_bytes();
        let mut at = len;
        for _ in 0..3 {
            while at > 0 && bytes[at - 1].is_ascii_whitespace() {
                at -= 1;
            }
            while at > 0 && !bytes[at - 1].is_ascii_whitespace() {
                at -= 1;
            }
        }
        let words_cut = if len - at > STREAM_WORD_HOLD {
            floor_char_boundary(text, len - STREAM_WORD_HOLD)
        } else {
            at
        };
        cut = cut.min(words_cut);
        // Not inside a word (the detector judges whole words), unless it is that long.
        let mut word_start = cut;
        while word_start > 0 && !bytes[word_start - 1].is_ascii_whitespace() {
            word_start -= 1;
        }
        if cut < len && !bytes[cut].is_ascii_whitespace() && len - word_start <= STREAM_WORD_HOLD {
            cut = word_start;
        }
        // A private-key block that has not ended, or a start of one.
        let mut blocks: Vec<usize> = pem_blocks(text)
            .into_iter()
            .filter(|b| (b.start < cut && b.end > cut) || b.end == len)
            .map(|b| b.start)
            .collect();
        // A header whose label has not ended yet.
        if let Some(begin) = text.rfind("-----BEGIN")
            && !text[begin + 10..].contains("-----")
        {
            blocks.push(begin);
        }
        for start in blocks {
            if len - start <= STREAM_PEM_HOLD {
                cut = cut.min(start);
            }
        }
        self.cut_outside_regions(cut)
    }

    /// `cut` moved back to the start of a known secret's region it falls inside, and the
    /// regions of known secrets in `pending`.
    fn cut_outside_regions(&self, mut cut: usize) -> (usize, Vec<Region>) {
        let regions = self.masker.regions(&self.pending);
        for region in &regions {
            if region.range.start < cut && cut < region.range.end {
                cut = region.range.start;
            }
        }
        (cut, regions)
    }

    fn emit(&mut self, segment: &str, regions: &[Region]) -> String {
        if segment.is_empty() {
            return String::new();
        }
        let known = self.masker.replace_regions(segment, regions);
        if !self.detector {
            return known.into_owned();
        }
        // The detector sees the context before and the pending text after (its next line
        // tells a base64 block).
        // The next line is enough.
        let next_line_end = self
            .pending
            .match_indices('\n')
            .nth(1)
            .map_or(self.pending.len(), |(at, _)| at);
        let lookahead =
            &self.pending[..floor_char_boundary(&self.pending, next_line_end.min(STREAM_CONTEXT))];
        let mut window = String::with_capacity(self.context.len() + known.len() + lookahead.len());
        window.push_str(&self.context);
        let from = window.len();
        window.push_str(&known);
        let to = window.len();
        window.push_str(lookahead);
        let spans: Vec<Range<usize>> = detect_within(&window, from..to)
            .into_iter()
            .filter(|s| s.end > from && s.start < to)
            .map(|s| s.start.max(from) - from..s.end.min(to) - from)
            .collect();
        let out = replace_spans(&known, &spans, GENERIC_PLACEHOLDER);
        let keep_from = ceil_char_boundary(&window[..to], to.saturating_sub(STREAM_CONTEXT));
        self.context = window[keep_from..to].to_string();
        out
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    while at < text.len() && !text.is_char_boundary(at) {
        at += 1;
    }
    at
}
