//! Assistant text for chat platforms: markdown to the platform's dialect, split at its limit.

/// Slack: `chat.postMessage` truncates past 40,000 characters and advises under 4,000.
pub const SLACK_MAX_CHARS: usize = 4_000;
/// Telegram: `sendMessage` text is at most 4,096 characters.
pub const TELEGRAM_MAX_CHARS: usize = 4_096;
/// Discord: message content is at most 2,000 characters.
pub const DISCORD_MAX_CHARS: usize = 2_000;
/// Generic webhooks: one reply POST carries at most this many characters.
pub const GENERIC_MAX_CHARS: usize = 16_000;
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

/// Markdown to Telegram's HTML `parse_mode`: `&`, `<`, `>` escaped; `**bold**` → `<b>`,
/// `~~s~~` → `<s>`, `` `code` `` → `<code>`, fenced blocks → `<pre>`, `[text](url)` →
/// `<a href>` (http and https only), `# Heading` → `<b>`. Every tag opened is closed (Telegram
/// refuses the whole message otherwise), also a fence left open at the end.
pub fn telegram_html(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len() + 16);
    let mut in_fence = false;
    let mut first = true;
    for line in markdown.split('\n') {
        let fence = line.trim_start().starts_with("```");
        if fence {
            if in_fence {
                out.push_str("</pre>");
            } else {
                if !first {
                    out.push('\n');
                }
                out.push_str("<pre>");
            }
            in_fence = !in_fence;
            first = false;
            continue;
        }
        // A line break between lines, except right after `<pre>`.
        let at_block_start = in_fence && out.ends_with("<pre>");
        if !first && !at_block_start {
            out.push('\n');
        }
        first = false;
        if in_fence {
            out.push_str(&escape_html(line));
            continue;
        }
        let trimmed = line.trim_start();
        let heading = trimmed.trim_start_matches('#');
        if trimmed.starts_with('#')
            && heading.starts_with(' ')
            && trimmed.len() - heading.len() <= 6
        {
            out.push_str("<b>");
            out.push_str(&inline_html(heading.trim()));
            out.push_str("</b>");
        } else {
            out.push_str(&inline_html(line));
        }
    }
    if in_fence {
        out.push_str("</pre>");
    }
    out
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn inline_html(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('`')
            && let Some(end) = after.find('`')
        {
            out.push_str(&format!("<code>{}</code>", escape_html(&after[..end])));
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
            && end > 0
        {
            out.push_str(&format!("<b>{}</b>", inline_html(&after[..end])));
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("~~")
            && let Some(end) = after.find("~~")
            && end > 0
        {
            out.push_str(&format!("<s>{}</s>", inline_html(&after[..end])));
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix('[')
            && let Some(close) = after.find("](")
            && let Some(end) = after[close + 2..].find(')')
        {
            let label = &after[..close];
            let url = &after[close + 2..close + 2 + end];
            if url.starts_with("http://") || url.starts_with("https://") {
                out.push_str(&format!(
                    "<a href=\"{}\">{}</a>",
                    escape_html(url),
                    escape_html(label)
                ));
            } else {
                out.push_str(&escape_html(&rest[..close + 3 + end + 1]));
            }
            rest = &after[close + 2 + end + 1..];
        } else {
            let c = rest.chars().next().unwrap_or_default();
            out.push_str(&escape_html(&c.to_string()));
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The reply `markdown` as `platform` shows it: in its dialect (Slack mrkdwn, Telegram HTML;
/// Discord and generic take markdown as it is: Discord's pings are turned off by the request's
/// `allowed_mentions`), in pieces within its length limit. Pieces are cut before conversion,
/// so no tag or link is ever split; when escaping makes a piece too long the cut is redone
/// shorter.
pub fn render(platform: super::Platform, markdown: &str) -> Vec<String> {
    use super::Platform;
    let (max, convert): (usize, fn(&str) -> String) = match platform {
        Platform::Slack => (SLACK_MAX_CHARS, slack_mrkdwn),
        Platform::Telegram => (TELEGRAM_MAX_CHARS, telegram_html),
        Platform::Discord => (DISCORD_MAX_CHARS, str::to_string),
        Platform::Generic => (GENERIC_MAX_CHARS, str::to_string),
    };
    let mut limit = max;
    loop {
        let pieces: Vec<String> = chunk(markdown, limit).iter().map(|p| convert(p)).collect();
        // Escaping at most quintuples a character (`"` → `&quot;` is six, `>` → `&gt;` four):
        // a fifth of the limit always fits.
        if pieces.iter().all(|p| p.chars().count() <= max) || limit <= max / 6 {
            return pieces;
        }
        limit = (limit * 3 / 4).max(max / 6);
    }
}

/// The reply as one piece of `platform`'s dialect, cut to its limit (approval requests,
/// progress lines, notes).
pub fn render_one(platform: super::Platform, markdown: &str) -> String {
    let mut pieces = render(platform, markdown);
    match pieces.len() {
        0 => String::new(),
        1 => pieces.remove(0),
        _ => format!("{}\n…", pieces.remove(0)),
    }
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

    #[test]
    fn telegram_dialect() {
        let cases = [
            ("plain", "plain"),
            (
                "a < b && c > \"d\"",
                "a &lt; b &amp;&amp; c &gt; &quot;d&quot;",
            ),
            ("**bold** and ~~gone~~", "<b>bold</b> and <s>gone</s>"),
            (
                "see [docs](https://x.example/a?b=1&c=2)",
                "see <a href=\"https://x.example/a?b=1&amp;c=2\">docs</a>",
            ),
            ("[x](javascript:alert(1))", "[x](javascript:alert(1))"),
            ("# Title\n## Sub", "<b>Title</b>\n<b>Sub</b>"),
            ("`<b>` **x**", "<code>&lt;b&gt;</code> <b>x</b>"),
            (
                "```\n**not bold** <x>\n```",
                "<pre>**not bold** &lt;x&gt;</pre>",
            ),
            ("a\n```rust\nlet x;\n```\nb", "a\n<pre>let x;</pre>\nb"),
            // A fence left open (a piece cut inside a block) is closed.
            ("```\nopen", "<pre>open</pre>"),
            ("**unclosed", "**unclosed"),
            ("#hashtag", "#hashtag"),
        ];
        for (input, want) in cases {
            assert_eq!(telegram_html(input), want, "{input}");
        }
    }

    /// Whether every tag of Telegram HTML is closed in order (Telegram refuses the message
    /// otherwise).
    fn balanced(html: &str) -> bool {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = html;
        while let Some(i) = rest.find('<') {
            let Some(end) = rest[i..].find('>') else {
                return false;
            };
            let tag = &rest[i + 1..i + end];
            rest = &rest[i + end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if open.pop() != Some(name) {
                    return false;
                }
            } else {
                open.push(tag.split(' ').next().unwrap_or_default());
            }
        }
        open.is_empty()
    }

    #[test]
    fn rendered_pieces_fit_every_platform_and_keep_tags_whole() {
        use crate::channels::Platform;
        let inputs = [
            "<&>\"".repeat(3_000),
            "**bold words** and `code` ".repeat(500),
            format!("```\n{}\n```", "line <x>\n".repeat(1_500)),
            "[a](https://e.example/?q=1&r=2) ".repeat(400),
            "short".to_string(),
            String::new(),
        ];
        for platform in [
            Platform::Slack,
            Platform::Telegram,
            Platform::Discord,
            Platform::Generic,
        ] {
            let max = match platform {
                Platform::Slack => SLACK_MAX_CHARS,
                Platform::Telegram => TELEGRAM_MAX_CHARS,
                Platform::Discord => DISCORD_MAX_CHARS,
                Platform::Generic => GENERIC_MAX_CHARS,
            };
            for input in &inputs {
                let pieces = render(platform, input);
                assert_eq!(pieces.is_empty(), input.is_empty(), "{platform:?}");
                assert!(pieces.len() <= MAX_CHUNKS);
                for piece in &pieces {
                    assert!(
                        piece.chars().count() <= max,
                        "{platform:?}: {}",
                        piece.len()
                    );
                    if platform == Platform::Telegram {
                        assert!(balanced(piece), "unbalanced: {piece}");
                    }
                }
            }
        }
        assert_eq!(render(Platform::Telegram, "**hi**"), vec!["<b>hi</b>"]);
        assert_eq!(render_one(Platform::Slack, "**hi**"), "*hi*");
    }
}
