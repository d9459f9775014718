//! Assistant text for chat platforms: markdown to the platform's dialect, split at its limit.

/// Slack: `chat.postMessage` truncates past 40,000 characters and advises under 4,000.
pub const SLACK_MAX_CHARS: usize = 4_000;
/// Telegram: `sendMessage` text is at most 4,096 characters.
pub const TELEGRAM_MAX_CHARS: usize = 4_096;
/// Discord: message content is at most 2,000 characters.
pub const DISCORD_MAX_CHARS: usize = 2_000;
/// Most chunks one reply is posted as; the rest is cut with a note (a runaway answer must not
/// flood a channel).
pub const MAX_CHUNKS: usize = 10;

/// Splits `text` into pieces of at most `max_chars` characters, preferring to cut at a blank
/// line, then a line end, then a space; never inside a character. At most [`MAX_CHUNKS`]
/// pieces: the last then ends with `…(truncated)`. Empty text gives no pieces.
pub fn chunk(text: &str, max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(32);
    let mut pieces = Vec::new();
    let mut rest: &str = text.trim();
    while !rest.is_empty() {
        if pieces.len() + 1 == MAX_CHUNKS && rest.chars().count() > max_chars {
            const NOTE: &str = "\n…(truncated)";
            let keep = max_chars - NOTE.chars().count();
            let end = byte_index(rest, keep);
            pieces.push(format!("{}{NOTE}", rest[..end].trim_end()));
            break;
        }
        if rest.chars().count() <= max_chars {
            pieces.push(rest.to_string());
            break;
        }
        let limit = byte_index(rest, max_chars);
        let window = &rest[..limit];
        // A cut in the first half would make tiny pieces: then cut hard at the limit.
        let half = limit / 2;
        let cut = [window.rfind("\n\n"), window.rfind('\n'), window.rfind(' ')]
            .into_iter()
            .flatten()
            .find(|&i| i > half)
            .unwrap_or(limit);
        pieces.push(rest[..cut].trim_end().to_string());
        rest = rest[cut..].trim_start();
    }
    pieces
}

/// The byte index of character `n` of `text` (its length if shorter).
fn byte_index(text: &str, n: usize) -> usize {
    text.char_indices().nth(n).map_or(text.len(), |(i, _)| i)
}

/// Markdown to Slack `mrkdwn`: `&`, `<`, `>` escaped; `**bold**` → `*bold*`;
/// `[text](url)` → `<url|text>`; `# Heading` → `*Heading*`. Code spans and blocks unchanged
/// (escaped only).
pub fn slack_mrkdwn(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut in_fence = false;
    for (i, line) in markdown.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            out.push_str(&escape_slack(line));
            continue;
        }
        if in_fence {
            out.push_str(&escape_slack(line));
            continue;
        }
        let trimmed = line.trim_start();
        let heading = trimmed.trim_start_matches('#');
        if trimmed.starts_with('#')
            && heading.starts_with(' ')
            && trimmed.len() - heading.len() <= 6
        {
            out.push('*');
            out.push_str(&inline_slack(heading.trim()));
            out.push('*');
        } else {
            out.push_str(&inline_slack(line));
        }
    }
    out
}

fn escape_slack(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn inline_slack(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('`')
            && let Some(end) = after.find('`')
        {
            out.push('`');
            out.push_str(&escape_slack(&after[..end]));
            out.push('`');
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
            && end > 0
        {
            out.push('*');
            out.push_str(&escape_slack(&after[..end]));
            out.push('*');
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix('[')
            && let Some(close) = after.find("](")
            && let Some(end) = after[close + 2..].find(')')
        {
            let label = &after[..close];
            let url = &after[close + 2..close + 2 + end];
            if url.starts_with("http://") || url.starts_with("https://") {
                out.push_str(&format!("<{}|{}>", escape_slack(url), escape_slack(label)));
            } else {
                out.push_str(&escape_slack(&rest[..close + 3 + end + 1]));
            }
            rest = &after[close + 2 + end + 1..];
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push_str(&escape_slack(&c.to_string()));
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_the_limit_and_keep_every_character() {
        let words: Vec<String> = (0..3000).map(|i| format!("w{i}")).collect();
        let inputs = [
            String::new(),
            "short".to_string(),
            "é".repeat(4_000),
            "é".repeat(4_001),
            words.join(" "),
            words.join("\n"),
            words
                .chunks(50)
                .map(|c| c.join(" "))
                .collect::<Vec<_>>()
                .join("\n\n"),
            "x".repeat(12_345),
        ];
        for input in &inputs {
            for limit in [SLACK_MAX_CHARS, TELEGRAM_MAX_CHARS, DISCORD_MAX_CHARS, 100] {
                let pieces = chunk(input, limit);
                assert!(pieces.len() <= MAX_CHUNKS);
                for piece in &pieces {
                    let n = piece.chars().count();
                    assert!(n <= limit && n > 0, "{n} > {limit}");
                }
                let truncated = pieces.last().is_some_and(|p| p.ends_with("…(truncated)"));
                if !truncated {
                    let joined: String = pieces.concat();
                    let strip =
                        |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
                    assert_eq!(strip(&joined), strip(input), "limit {limit}");
                }
            }
        }
        assert_eq!(chunk("é".repeat(4_000).as_str(), 4_000).len(), 1);
        assert_eq!(chunk("é".repeat(4_001).as_str(), 4_000).len(), 2);
        assert_eq!(chunk("a b", 4_000), vec!["a b"]);
        // Cuts at a blank line when one is in the second half.
        let text = format!("{}\n\n{}", "a".repeat(60), "b".repeat(60));
        assert_eq!(chunk(&text, 100), vec!["a".repeat(60), "b".repeat(60)]);
        // A huge answer is cut after MAX_CHUNKS pieces.
        let pieces = chunk(&"y".repeat(100 * 1000), 1000);
        assert_eq!(pieces.len(), MAX_CHUNKS);
        assert!(pieces[MAX_CHUNKS - 1].ends_with("…(truncated)"));
    }

    #[test]
    fn slack_dialect() {
        let cases = [
            ("plain", "plain"),
            ("a < b && c > d", "a &lt; b &amp;&amp; c &gt; d"),
            ("**bold** and *it*", "*bold* and *it*"),
            (
                "see [docs](https://x.example/a?b=1&c=2)",
                "see <https://x.example/a?b=1&amp;c=2|docs>",
            ),
            ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
            ("# Title\n## Sub", "*Title*\n*Sub*"),
            ("`<b>` **x**", "`&lt;b&gt;` *x*"),
            (
                "```\n**not bold** <x>\n```",
                "```\n**not bold** &lt;x&gt;\n```",
            ),
            ("#hashtag", "#hashtag"),
            ("<@U123> hi", "&lt;@U123&gt; hi"),
        ];
        for (input, want) in cases {
            assert_eq!(slack_mrkdwn(input), want, "{input}");
        }
    }
}
