//! `read`, `write`, `edit` and `ls`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use serde::Deserialize;
use serde_json::json;
use wuhu_core::tools::{MAX_OUTPUT_BYTES, MAX_OUTPUT_LINES, truncate_head};

use super::path::{display_path, resolve_path, resolve_writable};
use super::text::unified_diff;
use super::{ToolContext, ToolOutput, limit_hint, push_note};

/// Arguments of `read`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ReadArgs {
    /// File to read.
    pub path: String,
    /// First line to show, 1-based (default 1).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most lines to show (default: up to the output limits).
    #[serde(default)]
    pub limit: Option<u64>,
}

/// Arguments of `write`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct WriteArgs {
    /// File to create or replace; parent directories are created.
    pub path: String,
    /// The whole new content.
    pub content: String,
}

/// Arguments of `edit`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct EditArgs {
    /// File to edit.
    pub path: String,
    /// Exact text to replace; must occur exactly once.
    pub old_text: String,
    /// Replacement.
    pub new_text: String,
}

/// Arguments of `ls`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct LsArgs {
    /// Directory to list (default: the cwd).
    #[serde(default)]
    pub path: Option<String>,
    /// Most entries to show (default [`LS_DEFAULT_LIMIT`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Default `ls` limit.
pub const LS_DEFAULT_LIMIT: usize = 500;

/// Bytes inspected to decide a file is binary (it has a NUL byte).
const BINARY_SNIFF: usize = 8192;

/// `read`: the lines from `offset`, head-truncated; the hint names the offset to continue at.
pub fn read(ctx: &ToolContext, args: ReadArgs) -> ToolOutput {
    let path = match resolve_path(ctx, &args.path) {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(e),
    };
    let shown = display_path(ctx, &path);
    // In a cell the path was resolved (no link in it): a link swapped in at its last name since
    // is not followed.
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if ctx.cell.is_some() {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    let file = match options.open(&path) {
        Ok(f) => f,
        Err(e) => return ToolOutput::error(io_message(&shown, &e)),
    };
    if path.is_dir() {
        return ToolOutput::error(format!("{shown} is a directory; use ls to list it"));
    }
    let offset = args.offset.unwrap_or(1).max(1);
    if args.limit == Some(0) {
        return ToolOutput::error("limit must be at least 1");
    }
    let mut reader = BufReader::new(file);
    let mut sniff = Vec::new();
    if (&mut reader)
        .take(BINARY_SNIFF as u64)
        .read_to_end(&mut sniff)
        .is_err()
    {
        return ToolOutput::error(format!("cannot read {shown}"));
    }
    if let Some(image) = wuhu_core::images::inspect(&sniff) {
        return read_image(&path, &shown, image);
    }
    if sniff.contains(&0) {
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        return ToolOutput::error(format!(
            "{shown} is a binary file ({size} bytes); read shows text only"
        ));
    }
    let mut reader = std::io::Cursor::new(sniff).chain(reader);
    // Collect the requested lines (bounded a little above the limits), count the rest.
    let want = args.limit.unwrap_or(u64::MAX);
    let mut selected = String::new();
    let mut selected_lines = 0u64;
    let mut total_lines = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return ToolOutput::error(io_message(&shown, &e)),
        }
        total_lines += 1;
        if total_lines >= offset
            && selected_lines < want
            && selected_lines <= MAX_OUTPUT_LINES as u64
            && selected.len() <= MAX_OUTPUT_BYTES
        {
            selected.push_str(&String::from_utf8_lossy(&line));
            selected_lines += 1;
        }
    }
    if total_lines == 0 {
        return ToolOutput::ok("(empty file)");
    }
    if offset > total_lines {
        return ToolOutput::error(format!(
            "offset {offset} is beyond the end of {shown} ({total_lines} lines)"
        ));
    }
    let cut = truncate_head(&selected);
    let mut content = cut.text.clone();
    let details = if cut.truncated && cut.lines_kept == 0 {
        push_note(
            &mut content,
            &format!(
                "[Line {offset} is longer than {} KB; showing its start. Use bash (e.g. sed -n '{offset}p' {shown} | cut -c1-N) to see more.]",
                MAX_OUTPUT_BYTES / 1024
            ),
        );
        json!({"truncated": true, "totalLines": total_lines})
    } else {
        let last = offset + cut.lines_kept as u64 - 1;
        if last < total_lines {
            let why = if cut.truncated {
                format!(" ({} limit)", limit_hint())
            } else {
                String::new()
            };
            push_note(
                &mut content,
                &format!(
                    "[Showing lines {offset}-{last} of {total_lines}{why}. Use offset={} to continue.]",
                    last + 1
                ),
            );
        }
        json!({
            "truncated": last < total_lines,
            "totalLines": total_lines,
            "firstLine": offset,
            "lastLine": last,
        })
    };
    ToolOutput::ok(content).with_details(details)
}

/// `read` of an image (by its magic bytes): no text, but a result the runner turns into an
/// image blob (`crate::blob_upload::attach_image`) after the call: `details.image` names the
/// file. Images over [`wuhu_core::images::MAX_IMAGE_BYTES`] are refused here.
fn read_image(path: &Path, shown: &str, image: wuhu_core::images::ImageInfo) -> ToolOutput {
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    if let Some(reason) = wuhu_core::images::refusal(shown, &image, size) {
        return ToolOutput::error(reason);
    }
    ToolOutput::ok(format!("{shown}: {} image, {size} bytes", image.media_type)).with_details(
        json!({"image": {
            "path": path.to_string_lossy(),
            "shown": shown,
            "mediaType": image.media_type,
            "size": size,
        }}),
    )
}

/// `write`: replaces the file atomically (temp file + rename), creating parent directories and
/// keeping an existing file's permissions.
pub fn write(ctx: &ToolContext, args: WriteArgs) -> ToolOutput {
    let path = match resolve_writable(ctx, &args.path) {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(e),
    };
    let shown = display_path(ctx, &path);
    if path.is_dir() {
        return ToolOutput::error(format!("{shown} is a directory"));
    }
    if let Err(e) = write_atomically(&path, args.content.as_bytes()) {
        return ToolOutput::error(io_message(&shown, &e));
    }
    ToolOutput::ok(format!("Wrote {} bytes to {shown}", args.content.len()))
        .with_details(json!({"bytes": args.content.len()}))
}

/// `edit`: replaces the one exact occurrence of `oldText` with `newText` and returns a diff.
pub fn edit(ctx: &ToolContext, args: EditArgs) -> ToolOutput {
    let path = match resolve_writable(ctx, &args.path) {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(e),
    };
    let shown = display_path(ctx, &path);
    if args.old_text.is_empty() {
        return ToolOutput::error("oldText is empty; use write to create or replace a file");
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => return ToolOutput::error(io_message(&shown, &e)),
    };
    let Ok(old_content) = String::from_utf8(bytes) else {
        return ToolOutput::error(format!("{shown} is not UTF-8 text; edit it with bash"));
    };
    // A CRLF file edited with LF text: match and write in the file's convention.
    let crlf = old_content.contains("\r\n") && !args.old_text.contains('\r');
    let (old_text, new_text) = if crlf {
        (
            args.old_text.replace('\n', "\r\n"),
            args.new_text.replace('\n', "\r\n"),
        )
    } else {
        (args.old_text.clone(), args.new_text.clone())
    };
    let Some(at) = old_content.find(&old_text) else {
        return ToolOutput::error(format!(
            "Could not find the exact text in {shown}. oldText must match exactly, including whitespace and line breaks; read the file again and copy the text"
        ));
    };
    let occurrences = count_occurrences(&old_content, &old_text);
    if occurrences > 1 {
        return ToolOutput::error(format!(
            "Found {occurrences} occurrences of oldText in {shown}; it must be unique. Include more surrounding lines to make it unique"
        ));
    }
    if old_text == new_text {
        return ToolOutput::error("oldText and newText are the same; nothing to change");
    }
    let mut new_content = String::with_capacity(old_content.len() + new_text.len());
    new_content.push_str(&old_content[..at]);
    new_content.push_str(&new_text);
    new_content.push_str(&old_content[at + old_text.len()..]);
    if let Err(e) = write_atomically(&path, new_content.as_bytes()) {
        return ToolOutput::error(io_message(&shown, &e));
    }
    let (diff, first_line) = unified_diff(&shown, &old_content, &new_content);
    let shown_diff = truncate_head(&diff);
    let mut content = format!("Edited {shown}.\n{}", shown_diff.text);
    if shown_diff.truncated {
        content.push_str("\n[Diff truncated.]");
    }
    ToolOutput::ok(content).with_details(json!({
        "diff": shown_diff.text,
        "diffTruncated": shown_diff.truncated,
        "firstChangedLine": first_line,
    }))
}

/// `ls`: entries sorted case-insensitively, directories with a trailing `/`, dotfiles included.
pub fn ls(ctx: &ToolContext, args: LsArgs) -> ToolOutput {
    let raw = args.path.unwrap_or_else(|| String::from("."));
    let path = match resolve_path(ctx, &raw) {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(e),
    };
    let shown = display_path(ctx, &path);
    let limit = args.limit.unwrap_or(LS_DEFAULT_LIMIT).max(1);
    let entries = match std::fs::read_dir(&path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory || path.is_file() => {
            return ToolOutput::error(format!("{shown} is not a directory"));
        }
        Err(e) => return ToolOutput::error(io_message(&shown, &e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| {
            let mut name = entry.file_name().to_string_lossy().into_owned();
            // Follows symlinks: a link to a directory lists as a directory.
            if entry.path().is_dir() {
                name.push('/');
            }
            name
        })
        .collect();
    if names.is_empty() {
        return ToolOutput::ok("(empty directory)");
    }
    names.sort_by(|a, b| a.to_lowercase().cmp(&b.to_lowercase()).then(a.cmp(b)));
    let total = names.len();
    names.truncate(limit);
    let mut content = names.join("\n");
    content.push('\n');
    let cut = truncate_head(&content);
    let mut content = cut.text;
    let shown_count = if cut.truncated {
        cut.lines_kept
    } else {
        names.len()
    };
    if shown_count < total {
        content.push_str(&format!(
            "\n[Showing {shown_count} of {total} entries. Use a larger limit or a narrower path to see more.]"
        ));
    }
    ToolOutput::ok(content).with_details(json!({"entries": total, "shown": shown_count}))
}

/// Writes via a temporary sibling and a rename; creates parents; keeps permissions.
pub(crate) fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let parent = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no parent directory"))?;
    std::fs::create_dir_all(parent)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let temp = parent.join(format!(".{name}.wuhu-{}-{nanos}.tmp", std::process::id()));
    let result = (|| {
        // A new file, never through a symbolic link someone planted at its name.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(data)?;
        file.sync_data()?;
        if let Ok(meta) = std::fs::metadata(path) {
            std::fs::set_permissions(&temp, meta.permissions())?;
        }
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Occurrences of `needle`, overlapping ones included.
fn count_occurrences(haystack: &str, needle: &str) -> usize {
    let mut count = 0;
    let mut from = 0;
    while let Some(at) = haystack[from..].find(needle) {
        count += 1;
        let start = from + at;
        from = start + haystack[start..].chars().next().map_or(1, char::len_utf8);
    }
    count
}

fn io_message(shown: &str, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => format!("{shown} does not exist"),
        std::io::ErrorKind::PermissionDenied => format!("permission denied: {shown}"),
        _ => format!("{shown}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::tools::tests::{context, run};
    use serde_json::json;
    use wuhu_core::wire::runner::EnvironmentKind;

    #[test]
    fn read_pages_with_offset_hints() {
        let (_dir, ctx) = context(EnvironmentKind::FolderTemplate);
        let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(ctx.root.join("big.txt"), &text).unwrap();
        let out = run(&ctx, "read", json!({"path": "big.txt"}));
        assert!(!out.is_error);
        assert!(out.content.starts_with("line 1\n"));
        assert!(
            out.content.ends_with(
                "line 2000\n\n[Showing lines 1-2000 of 3000 (2000 lines / 50 KB limit). Use offset=2001 to continue.]"
            ),
            "{}",
            &out.content[out.content.len() - 150..]
        );
        let out = run(&ctx, "read", json!({"path": "big.txt", "offset": 2001}));
        assert!(out.content.starts_with("line 2001\n") && out.content.ends_with("line 3000\n"));
        let out = run(
            &ctx,
            "read",
            json!({"path": "big.txt", "offset": 10, "limit": 2}),
        );
        assert_eq!(
            out.content,
            "line 10\nline 11\n\n[Showing lines 10-11 of 3000. Use offset=12 to continue.]"
        );
        let out = run(&ctx, "read", json!({"path": "big.txt", "offset": 3001}));
        assert!(out.is_error && out.content.contains("beyond the end"));
    }

    #[test]
    fn read_cuts_at_the_byte_limit_and_handles_odd_files() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let line = "x".repeat(99) + "\n";
        std::fs::write(ctx.root.join("wide.txt"), line.repeat(1000)).unwrap();
        let out = run(&ctx, "read", json!({"path": "wide.txt"}));
        assert!(
            out.content
                .ends_with("[Showing lines 1-512 of 1000 (2000 lines / 50 KB limit). Use offset=513 to continue.]"),
            "{}",
            &out.content[out.content.len() - 120..]
        );
        std::fs::write(ctx.root.join("one.txt"), "y".repeat(60_000)).unwrap();
        let out = run(&ctx, "read", json!({"path": "one.txt"}));
        assert!(out.content.contains("[Line 1 is longer than 50 KB"));
        std::fs::write(ctx.root.join("bin"), b"a\0b").unwrap();
        assert!(
            run(&ctx, "read", json!({"path": "bin"}))
                .content
                .contains("binary")
        );
        std::fs::write(ctx.root.join("empty"), b"").unwrap();
        assert_eq!(
            run(&ctx, "read", json!({"path": "empty"})).content,
            "(empty file)"
        );
        std::fs::write(ctx.root.join("small"), "a\nb").unwrap();
        assert_eq!(run(&ctx, "read", json!({"path": "small"})).content, "a\nb");
        let out = run(&ctx, "read", json!({"path": "missing"}));
        assert_eq!(
            (out.content.as_str(), out.is_error),
            ("missing does not exist", true)
        );
    }

    #[test]
    fn read_of_an_image_names_the_file_for_the_upload_by_its_bytes_not_its_name() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x02\0\0\0\x02\x08\x06\0\0\0";
        std::fs::write(ctx.root.join("shot.txt"), png).unwrap();
        let out = run(&ctx, "read", json!({"path": "shot.txt"}));
        assert!(!out.is_error, "{}", out.content);
        let image = &out.details.as_ref().expect("details")["image"];
        assert_eq!(image["mediaType"], "image/png");
        assert_eq!(image["shown"], "shot.txt");
        assert_eq!(image["size"], png.len());
        assert!(image["path"].as_str().unwrap().ends_with("shot.txt"));
        // Over the limit: refused, no upload.
        let big = std::fs::File::create(ctx.root.join("big.png")).unwrap();
        std::io::Write::write_all(&mut &big, png).unwrap();
        big.set_len(wuhu_core::images::MAX_IMAGE_BYTES + 1).unwrap();
        let out = run(&ctx, "read", json!({"path": "big.png"}));
        assert!(out.is_error && out.details.is_none(), "{out:?}");
        assert!(
            out.content.contains("over the 5242880 byte (5 MiB) limit"),
            "{}",
            out.content
        );
        // A file named .png that is not one is read as what it is.
        std::fs::write(ctx.root.join("fake.png"), "not an image\n").unwrap();
        assert_eq!(
            run(&ctx, "read", json!({"path": "fake.png"})).content,
            "not an image\n"
        );
    }

    #[test]
    fn write_creates_parents_and_respects_the_root() {
        let (_dir, ctx) = context(EnvironmentKind::Worktree);
        let out = run(
            &ctx,
            "write",
            json!({"path": "a/b/c.txt", "content": "hello"}),
        );
        assert_eq!(out.content, "Wrote 5 bytes to a/b/c.txt");
        assert_eq!(
            std::fs::read_to_string(ctx.root.join("a/b/c.txt")).unwrap(),
            "hello"
        );
        let out = run(
            &ctx,
            "write",
            json!({"path": "../escape.txt", "content": "x"}),
        );
        assert!(out.is_error && out.content.contains("outside the environment root"));
        assert!(!ctx.root.parent().unwrap().join("escape.txt").exists());
        let outside = ctx.temp_dir.join("abs.txt");
        let out = run(&ctx, "write", json!({"path": outside, "content": "x"}));
        assert!(
            out.is_error,
            "absolute outside the root is refused for worktrees"
        );
        let (_dir2, local) = context(EnvironmentKind::Local);
        let out = run(&local, "write", json!({"path": outside, "content": "x"}));
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "x");
    }

    #[test]
    fn edit_requires_a_unique_exact_match_and_returns_a_diff() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let file = ctx.root.join("f.rs");
        std::fs::write(&file, "fn a() {}\nfn b() {}\nfn a() {}\n").unwrap();
        let out = run(
            &ctx,
            "edit",
            json!({"path": "f.rs", "oldText": "fn a() {}", "newText": "x"}),
        );
        assert!(out.is_error);
        assert!(
            out.content.starts_with("Found 2 occurrences"),
            "{}",
            out.content
        );
        let out = run(
            &ctx,
            "edit",
            json!({"path": "f.rs", "oldText": "fn c() {}", "newText": "x"}),
        );
        assert!(out.is_error && out.content.starts_with("Could not find the exact text"));
        let out = run(
            &ctx,
            "edit",
            json!({"path": "f.rs", "oldText": "fn  b() {}", "newText": "x"}),
        );
        assert!(out.is_error, "whitespace must match exactly");
        let out = run(
            &ctx,
            "edit",
            json!({"path": "f.rs", "oldText": "fn b() {}", "newText": "fn b() {\n    todo!()\n}"}),
        );
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(
            out.content,
            "Edited f.rs.\n--- f.rs\n+++ f.rs\n@@ -1,3 +1,5 @@\n fn a() {}\n-fn b() {}\n+fn b() {\n+    todo!()\n+}\n fn a() {}\n"
        );
        assert_eq!(out.details.unwrap()["firstChangedLine"], 2);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            "fn a() {}\nfn b() {\n    todo!()\n}\nfn a() {}\n"
        );
        std::fs::write(ctx.root.join("o"), "aaa").unwrap();
        let out = run(
            &ctx,
            "edit",
            json!({"path": "o", "oldText": "aa", "newText": "b"}),
        );
        assert!(
            out.content.starts_with("Found 2 occurrences"),
            "overlaps count"
        );
        std::fs::write(ctx.root.join("crlf"), "a\r\nb\r\n").unwrap();
        let out = run(
            &ctx,
            "edit",
            json!({"path": "crlf", "oldText": "a\nb", "newText": "a\nc"}),
        );
        assert!(!out.is_error, "{}", out.content);
        assert_eq!(
            std::fs::read_to_string(ctx.root.join("crlf")).unwrap(),
            "a\r\nc\r\n"
        );
        let out = run(
            &ctx,
            "edit",
            json!({"path": "../x", "oldText": "a", "newText": "b"}),
        );
        assert!(out.is_error && out.content.contains("outside the environment root"));
    }

    #[test]
    fn ls_lists_sorted_with_limit() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        for name in ["b.txt", "A.txt", ".hidden", "c"] {
            std::fs::write(ctx.root.join(name), "").unwrap();
        }
        std::fs::create_dir(ctx.root.join("dir")).unwrap();
        let out = run(&ctx, "ls", json!({}));
        assert_eq!(out.content, ".hidden\nA.txt\nb.txt\nc\ndir/\n");
        let out = run(&ctx, "ls", json!({"path": ".", "limit": 2}));
        assert_eq!(
            out.content,
            ".hidden\nA.txt\n\n[Showing 2 of 5 entries. Use a larger limit or a narrower path to see more.]"
        );
        assert_eq!(
            run(&ctx, "ls", json!({"path": "dir"})).content,
            "(empty directory)"
        );
        assert!(
            run(&ctx, "ls", json!({"path": "c"}))
                .content
                .contains("not a directory")
        );
        assert!(run(&ctx, "ls", json!({"path": ".."})).is_error);
    }
}
