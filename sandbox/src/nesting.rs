//! Nesting-depth scans that keep QuickJS's recursive C code off deep inputs.
//!
//! QuickJS's stack check measures the C stack. On wasm32 that is the shadow stack in linear
//! memory, which the recursive parser, `JSON.parse` and `JSON.stringify` barely touch, while
//! each level still costs real (V8) stack. Deep enough input therefore overflows the *host's*
//! stack, a `RangeError` thrown straight through the wasm instance, before QuickJS notices.
//! Measured in workerd and Node.js: about 1 000 nested parentheses crash the parser, and
//! 4 000–8 000 levels crash `JSON.parse`/`JSON.stringify`.
//! The sandbox rejects such input up front: scripts by [`source_depth`], JSON text by
//! [`json_depth_exceeds`], and JS values in the base prelude's `JSON.stringify`.

/// The deepest bracket nesting allowed in a script.
pub(crate) const MAX_SOURCE_DEPTH: usize = 256;

/// The deepest nesting allowed in JSON text and in values passed to `JSON.stringify`.
pub(crate) const MAX_JSON_DEPTH: usize = 512;

/// The deepest bracket nesting in JavaScript source: `(`, `[`, `{` and template `${`, outside
/// strings, comments and (heuristically detected) regular-expression literals.
pub(crate) fn source_depth(code: &str) -> usize {
    #[derive(Clone, Copy, PartialEq)]
    enum Open {
        Bracket,
        TemplateExpression,
    }

    let bytes = code.as_bytes();
    let mut stack: Vec<Open> = Vec::new();
    let mut max_depth = 0;
    // The last significant byte outside comments and whitespace, to tell a regex from a
    // division.
    let mut previous: u8 = b'(';
    let mut previous_word_allows_regex = true;
    let mut i = 0;
    // Inside a template literal's text (not in a `${...}`)?
    let mut in_template = false;
    while i < bytes.len() {
        let byte = bytes[i];
        if in_template {
            match byte {
                b'\\' => i += 1,
                b'`' => {
                    in_template = false;
                    previous = b'`';
                    previous_word_allows_regex = false;
                }
                b'$' if bytes.get(i + 1) == Some(&b'{') => {
                    i += 1;
                    in_template = false;
                    stack.push(Open::TemplateExpression);
                    max_depth = max_depth.max(stack.len());
                    previous = b'{';
                    previous_word_allows_regex = true;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match byte {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
                continue;
            }
            b'/' if previous_word_allows_regex || b"(,=:[!&|?{};+-*%<>~^".contains(&previous) => {
                // A regular-expression literal.
                i += 1;
                let mut in_class = false;
                while i < bytes.len() && bytes[i] != b'\n' {
                    match bytes[i] {
                        b'\\' => i += 1,
                        b'[' => in_class = true,
                        b']' => in_class = false,
                        b'/' if !in_class => break,
                        _ => {}
                    }
                    i += 1;
                }
                previous = b'/';
                previous_word_allows_regex = false;
                i += 1;
                continue;
            }
            b'"' | b'\'' => {
                let quote = byte;
                i += 1;
                while i < bytes.len() && bytes[i] != quote && bytes[i] != b'\n' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                previous = quote;
                previous_word_allows_regex = false;
                i += 1;
                continue;
            }
            b'`' => in_template = true,
            b'(' | b'[' | b'{' => {
                stack.push(Open::Bracket);
                max_depth = max_depth.max(stack.len());
            }
            b')' | b']' => {
                stack.pop();
            }
            // The guard pops either way; only a `${` returns to template text.
            b'}' if stack.pop() == Some(Open::TemplateExpression) => in_template = true,
            _ => {}
        }
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'$' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'$')
            {
                i += 1;
            }
            let word = &bytes[start..i];
            previous_word_allows_regex = matches!(
                word,
                b"return"
                    | b"typeof"
                    | b"case"
                    | b"do"
                    | b"else"
                    | b"in"
                    | b"of"
                    | b"new"
                    | b"delete"
                    | b"void"
                    | b"throw"
                    | b"yield"
                    | b"await"
                    | b"instanceof"
            );
            previous = bytes[i - 1];
            continue;
        }
        if !byte.is_ascii_whitespace() {
            previous = byte;
            previous_word_allows_regex = false;
        }
        i += 1;
    }
    max_depth
}

/// Whether JSON text nests arrays and objects more than `limit` deep.
///
/// Works on any text: it only counts brackets outside strings.
pub(crate) fn json_depth_exceeds(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    let mut depth: usize = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_depth_counts_brackets_outside_strings_comments_and_regexes() {
        assert_eq!(source_depth(""), 0);
        assert_eq!(source_depth("f(a[0], {b: [1]})"), 3);
        assert_eq!(source_depth("'((((' + \"[[[\" // ((((\n /* {{{{ */ 1"), 0);
        assert_eq!(source_depth("x = /[(]{2}\\(/g.test(s); (1)"), 1);
        assert_eq!(source_depth("a / (b / c)"), 1);
        assert_eq!(source_depth("return /((/"), 0);
        assert_eq!(source_depth("`a ${ f(`b ${ [1] }`) } (`"), 4);
        assert_eq!(
            source_depth(&format!("{}1{}", "(".repeat(300), ")".repeat(300))),
            300
        );
        assert_eq!(source_depth("))) ((("), 3);
    }

    #[test]
    fn json_depth() {
        assert!(!json_depth_exceeds(r#"{"a": [1, {"b": "[[[[["}]}"#, 3));
        assert!(json_depth_exceeds(r#"{"a": [1, {"b": [[]]}]}"#, 3));
        assert!(!json_depth_exceeds(r#""\"[[[[""#, 0));
        assert!(json_depth_exceeds(&"[".repeat(513), MAX_JSON_DEPTH));
        assert!(!json_depth_exceeds(&"[".repeat(512), MAX_JSON_DEPTH));
    }
}
