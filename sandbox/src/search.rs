//! `String.prototype.indexOf`, `lastIndexOf` and `includes` in linear time.
//!
//! QuickJS searches naively (time ∝ length × needle length) and never polls its interrupt
//! handler while doing so, so a search cannot be stopped and its cost cannot be bounded by the
//! step budget. The base prelude charges a search by `length + needle length` and runs it here
//! instead: Rust's `str::find`/`rfind` (Two-Way, linear), with positions and results in
//! UTF-16 code units as JavaScript counts them. Strings that are not valid UTF-16 (a lone
//! surrogate) cannot become Rust strings; for those the prelude falls back to QuickJS's own
//! search, charged at its worst case.

/// Which search, with the position already converted as the specification's
/// `ToIntegerOrInfinity` would (`lastIndexOf`'s `NaN` as `+∞`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `indexOf` and `includes`: the first match at or after the position.
    Forward,
    /// `lastIndexOf`: the last match at or before the position.
    Backward,
}

/// The UTF-16 index of the match, or `None`.
pub(crate) fn find_utf16(
    text: &str,
    needle: &str,
    position: f64,
    direction: Direction,
) -> Option<usize> {
    let len16 = utf16_len(text);
    let start16 = clamp_position(position, len16);
    if needle.is_empty() {
        return Some(start16);
    }
    match direction {
        Direction::Forward => {
            // A match starts on a character; the first character starting at or after the
            // position is where the search begins.
            let (from_byte, from16) = char_at_or_after(text, start16);
            let found = text[from_byte..].find(needle)?;
            Some(from16 + utf16_len(&text[from_byte..from_byte + found]))
        }
        Direction::Backward => {
            // The last character starting at or before the position is the latest start.
            let (last_byte, _) = char_at_or_before(text, start16);
            // A match starting there ends there; one starting earlier ends on a character
            // boundary before it.
            let mut limit = (last_byte + needle.len()).min(text.len());
            while !text.is_char_boundary(limit) {
                limit -= 1;
            }
            let found = text[..limit].rfind(needle)?;
            Some(utf16_len(&text[..found]))
        }
    }
}

fn utf16_len(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

fn clamp_position(position: f64, len16: usize) -> usize {
    if position.is_nan() || position <= 0.0 {
        0
    } else if position >= len16 as f64 {
        len16
    } else {
        position as usize
    }
}

/// The byte offset and UTF-16 index of the first character starting at or after `index16`
/// (the end of the text if none).
fn char_at_or_after(text: &str, index16: usize) -> (usize, usize) {
    let mut at16 = 0;
    for (byte, c) in text.char_indices() {
        if at16 >= index16 {
            return (byte, at16);
        }
        at16 += c.len_utf16();
    }
    (text.len(), at16)
}

/// The byte offset and UTF-16 index of the last character starting at or before `index16`
/// (the end of the text when `index16` is its length).
fn char_at_or_before(text: &str, index16: usize) -> (usize, usize) {
    let mut at16 = 0;
    let mut last = (0, 0);
    for (byte, c) in text.char_indices() {
        if at16 > index16 {
            return last;
        }
        last = (byte, at16);
        at16 += c.len_utf16();
    }
    if at16 <= index16 {
        (text.len(), at16)
    } else {
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The specification's search over UTF-16 code units, naively.
    fn reference(text: &str, needle: &str, position: f64, direction: Direction) -> Option<usize> {
        let t: Vec<u16> = text.encode_utf16().collect();
        let n: Vec<u16> = needle.encode_utf16().collect();
        let start = clamp_position(position, t.len());
        let matches = |k: usize| k + n.len() <= t.len() && t[k..k + n.len()] == n[..];
        match direction {
            Direction::Forward => (start..=t.len()).find(|&k| matches(k)),
            Direction::Backward => (0..=start).rev().find(|&k| matches(k)),
        }
    }

    #[test]
    fn table() {
        use Direction::{Backward, Forward};
        let cases: &[(&str, &str, f64, Direction, Option<usize>)] = &[
            ("hello", "l", 0.0, Forward, Some(2)),
            ("hello", "l", 3.0, Forward, Some(3)),
            ("hello", "l", 4.0, Forward, None),
            ("hello", "", 9.0, Forward, Some(5)),
            ("hello", "", -3.0, Forward, Some(0)),
            ("hello", "l", f64::INFINITY, Backward, Some(3)),
            ("hello", "l", 2.0, Backward, Some(2)),
            ("hello", "l", 1.0, Backward, None),
            ("hello", "", 2.0, Backward, Some(2)),
            ("a😀b😀c", "😀", 0.0, Forward, Some(1)),
            ("a😀b😀c", "😀", 2.0, Forward, Some(4)),
            ("a😀b😀c", "b", 0.0, Forward, Some(3)),
            ("a😀b😀c", "😀", f64::INFINITY, Backward, Some(4)),
            ("a😀b😀c", "😀", 3.0, Backward, Some(1)),
            ("a😀b😀c", "c", 6.0, Forward, Some(6)),
            ("ééé", "éé", f64::INFINITY, Backward, Some(1)),
        ];
        for &(text, needle, position, direction, expected) in cases {
            assert_eq!(
                find_utf16(text, needle, position, direction),
                expected,
                "{text:?}.{direction:?}({needle:?}, {position})"
            );
        }
    }

    /// Every text and needle over a small alphabet with characters of 1, 2 and 4 UTF-8 bytes
    /// (1 and 2 UTF-16 units), at every position: the same answer as the naive search.
    #[test]
    fn agrees_with_the_specification_everywhere() {
        let alphabet = ["a", "é", "😀"];
        let mut strings = vec![String::new()];
        let mut layer = vec![String::new()];
        for _ in 0..5 {
            layer = layer
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            strings.extend(layer.iter().cloned());
        }
        let needles: Vec<&String> = strings.iter().filter(|s| s.chars().count() <= 2).collect();
        let mut checked = 0;
        for text in &strings {
            let len16 = utf16_len(text) as f64;
            for needle in &needles {
                for position in [-1.0, 0.0, 1.0, 2.0, 3.0, len16 - 1.0, len16, len16 + 1.0] {
                    for direction in [Direction::Forward, Direction::Backward] {
                        assert_eq!(
                            find_utf16(text, needle, position, direction),
                            reference(text, needle, position, direction),
                            "{text:?}.{direction:?}({needle:?}, {position})"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 50_000, "{checked}");
    }
}
