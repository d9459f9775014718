//! Text that one person writes and other people read somewhere else: session titles (in every
//! list, `list_sessions`, chat threads) and workspace document paths.
//!
//! Invisible characters let such text say one thing and show another: a bidi control (U+202E
//! RIGHT-TO-LEFT OVERRIDE) shows `evil\u{202e}txt.exe` as `evilexe.txt`, a zero-width space
//! makes two different paths look alike. Both are Unicode *format* characters (general
//! category `Cf`), which `char::is_control` (category `Cc`) does not cover. So:
//!
//! * a path refuses control, format and line/paragraph separator characters
//!   ([`is_hidden`], used by `crate::workspace::normalize_doc_path`);
//! * a title is cleaned ([`clean_title`]): format characters are removed, control characters
//!   and every kind of whitespace become one space, the ends are trimmed; then it is bounded
//!   ([`crate::wire::normalize_title`] refuses a title past its bound, [`bounded_title`] cuts a
//!   title derived from other text, a chat message say).

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// Whether `c` is a format character (general category `Cf`): bidi controls, zero-width
/// spaces and joiners, the byte order mark, soft hyphens, tags.
pub fn is_format(c: char) -> bool {
    c.general_category() == GeneralCategory::Format
}

/// Whether `c` shows nothing where it stands, or breaks the line: a control character (`Cc`),
/// a format character (`Cf`), or a line or paragraph separator (`Zl`, `Zp`).
pub fn is_hidden(c: char) -> bool {
    matches!(
        c.general_category(),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// `text` as a title shows it: format characters removed, every run of control characters
/// and whitespace (newlines and tabs included) one space, the ends trimmed. May be empty.
pub fn clean_title(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        if is_format(c) {
            continue;
        }
        if c.is_whitespace() || is_hidden(c) {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
    out
}

/// A title made from other text (a chat message, a forked session's title): cleaned, and cut
/// to `max_chars` characters, the last of them `…` when something was cut; `None` when nothing
/// visible is left. `max_chars` below 1 is taken as 1.
pub fn bounded_title(text: &str, max_chars: usize) -> Option<String> {
    let max_chars = max_chars.max(1);
    let clean = clean_title(text);
    if clean.is_empty() {
        return None;
    }
    if clean.chars().count() <= max_chars {
        return Some(clean);
    }
    let kept: String = clean.chars().take(max_chars - 1).collect();
    Some(format!("{}…", kept.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_characters_are_told_apart_from_visible_ones() {
        let format = [
            '\u{200B}', // zero-width space
            '\u{200C}', // zero-width non-joiner
            '\u{200D}', // zero-width joiner
            '\u{200E}', // left-to-right mark
            '\u{200F}', // right-to-left mark
            '\u{202A}',
            '\u{202B}',
            '\u{202C}',
            '\u{202D}',
            '\u{202E}', // embeddings, overrides
            '\u{2060}', // word joiner
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',  // isolates
            '\u{FEFF}',  // byte order mark
            '\u{00AD}',  // soft hyphen
            '\u{061C}',  // arabic letter mark
            '\u{E0001}', // language tag
        ];
        for c in format {
            assert!(is_format(c), "U+{:04X} is a format character", c as u32);
            assert!(is_hidden(c), "U+{:04X} is hidden", c as u32);
        }
        for c in [
            '\n', '\r', '\t', '\u{0}', '\u{7F}', '\u{85}', '\u{2028}', '\u{2029}',
        ] {
            assert!(!is_format(c), "U+{:04X}", c as u32);
            assert!(is_hidden(c), "U+{:04X} is hidden", c as u32);
        }
        for c in [
            'a', 'Z', '0', ' ', '-', '.', 'é', 'ß', '中', '🙂', '\u{FE0F}', 'א', 'ي',
        ] {
            assert!(!is_format(c), "{c:?} is visible");
            assert!(!is_hidden(c), "{c:?} is visible");
        }
    }

    #[test]
    fn titles_are_cleaned() {
        let cases = [
            ("plain", "plain"),
            ("  padded  ", "padded"),
            ("two\nlines", "two lines"),
            ("tab\tand\r\nnewline", "tab and newline"),
            ("many   \n\n  spaces", "many spaces"),
            ("evil\u{202E}txt.exe", "eviltxt.exe"),
            ("\u{2067}isolated\u{2069}", "isolated"),
            ("zero\u{200B}width", "zerowidth"),
            ("\u{FEFF}bom", "bom"),
            ("nul\u{0}byte", "nul byte"),
            ("bell\u{7}", "bell"),
            ("line\u{2028}separator", "line separator"),
            ("no-break\u{A0}space", "no-break space"),
            ("café 中文 🙂", "café 中文 🙂"),
            ("עברית", "עברית"),
            ("", ""),
            ("   ", ""),
            ("\u{200B}\u{202E}\u{FEFF}", ""),
            ("\n\t\u{0}", ""),
        ];
        for (text, want) in cases {
            assert_eq!(clean_title(text), want, "{text:?}");
        }
    }

    #[test]
    fn derived_titles_are_cut_at_their_bound_and_at_every_size() {
        for max in [1usize, 2, 3, 80, 200] {
            for len in [0usize, 1, max.saturating_sub(1), max, max + 1, 2 * max + 7] {
                for unit in ["a", "é", "中", "🙂"] {
                    let text = unit.repeat(len);
                    let title = bounded_title(&text, max);
                    match len {
                        0 => assert_eq!(title, None),
                        n if n <= max => assert_eq!(title.as_deref(), Some(text.as_str())),
                        _ => {
                            let title = title.expect("a cut title");
                            assert_eq!(title.chars().count(), max, "{unit} x {len}, max {max}");
                            assert!(title.ends_with('…'), "{title}");
                        }
                    }
                }
            }
        }
        // Invisible characters do not count toward the bound, and a cut never leaves a
        // trailing space before the ellipsis.
        let hidden = "\u{200B}".repeat(500);
        assert_eq!(
            bounded_title(&format!("{hidden}short{hidden}"), 10).as_deref(),
            Some("short")
        );
        assert_eq!(bounded_title("abc def ghi", 5).as_deref(), Some("abc…"));
        assert_eq!(bounded_title("\u{202E}\n", 80), None);
        assert_eq!(bounded_title("x", 0).as_deref(), Some("x"));
    }
}
