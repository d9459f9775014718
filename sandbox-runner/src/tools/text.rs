//! Text helpers shared by the tools: long-line cutting and the diff `edit` returns.
//! Output truncation (head and tail) is in [`wuhu_core::tools`].

/// Longest line `grep` shows, in characters.
pub const GREP_MAX_LINE_CHARS: usize = 500;

/// Cuts `line` to [`GREP_MAX_LINE_CHARS`] characters, marking the cut.
pub fn cut_line(line: &str) -> String {
    match line.char_indices().nth(GREP_MAX_LINE_CHARS) {
        Some((at, _)) => format!("{}... [line truncated]", &line[..at]),
        None => line.to_string(),
    }
}

/// Lines of context around a change in [`unified_diff`].
const DIFF_CONTEXT: usize = 3;

/// A unified diff of one contiguous change between `old` and `new`, labelled `path`, with
/// three lines of context. Returns the diff and the first changed line (1-based, in
/// `new`); an empty diff when the texts are equal.
pub fn unified_diff(path: &str, old: &str, new: &str) -> (String, usize) {
    let old_lines: Vec<&str> = old.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new.split_inclusive('\n').collect();
    let prefix = old_lines
        .iter()
        .zip(&new_lines)
        .take_while(|(a, b)| a == b)
        .count();
    if prefix == old_lines.len() && prefix == new_lines.len() {
        return (String::new(), 0);
    }
    let max_suffix = old_lines.len().min(new_lines.len()) - prefix;
    let suffix = old_lines
        .iter()
        .rev()
        .zip(new_lines.iter().rev())
        .take(max_suffix)
        .take_while(|(a, b)| a == b)
        .count();
    let old_changed = &old_lines[prefix..old_lines.len() - suffix];
    let new_changed = &new_lines[prefix..new_lines.len() - suffix];
    let context_start = prefix.saturating_sub(DIFF_CONTEXT);
    let before = &old_lines[context_start..prefix];
    let after_end = (old_lines.len() - suffix + DIFF_CONTEXT).min(old_lines.len());
    let after = &old_lines[old_lines.len() - suffix..after_end];
    let old_count = before.len() + old_changed.len() + after.len();
    let new_count = before.len() + new_changed.len() + after.len();
    let range = |start: usize, count: usize| {
        // Unified diff convention: an empty range names the line before it.
        let first = if count == 0 { start } else { start + 1 };
        format!("{first},{count}")
    };
    let mut out = format!(
        "--- {path}\n+++ {path}\n@@ -{} +{} @@\n",
        range(context_start, old_count),
        range(context_start, new_count)
    );
    let mut push = |mark: char, line: &str| {
        out.push(mark);
        out.push_str(line.strip_suffix('\n').unwrap_or(line));
        out.push('\n');
        if !line.ends_with('\n') {
            out.push_str("\\ No newline at end of file\n");
        }
    };
    before.iter().for_each(|l| push(' ', l));
    old_changed.iter().for_each(|l| push('-', l));
    new_changed.iter().for_each(|l| push('+', l));
    after.iter().for_each(|l| push(' ', l));
    (out, prefix + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut() {
        assert_eq!(cut_line("short"), "short");
        let long = "é".repeat(600);
        let cut = cut_line(&long);
        assert!(cut.ends_with("... [line truncated]"));
        assert_eq!(cut.chars().filter(|c| *c == 'é').count(), 500);
    }

    #[test]
    fn diffs() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        let (diff, first) = unified_diff("f.txt", old, new);
        assert_eq!(first, 5);
        assert_eq!(
            diff,
            "--- f.txt\n+++ f.txt\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
        let (diff, _) = unified_diff("f", "a\nb\n", "a\nx\ny\nb\n");
        assert_eq!(diff, "--- f\n+++ f\n@@ -1,2 +1,4 @@\n a\n+x\n+y\n b\n");
        let (diff, _) = unified_diff("f", "a", "b");
        assert_eq!(
            diff,
            "--- f\n+++ f\n@@ -1,1 +1,1 @@\n-a\n\\ No newline at end of file\n+b\n\\ No newline at end of file\n"
        );
        assert_eq!(unified_diff("f", "same", "same").0, "");
    }
}
