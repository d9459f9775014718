//! `find` and `grep`: walk with the `ignore` crate, so `.gitignore` (and `.ignore`) files are
//! honoured even outside a git repository; `.git` and `node_modules` are always skipped;
//! other hidden files are searched.

use std::io::Read;
use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;
use serde_json::json;
use wuhu_core::tools::truncate_head;

use super::path::{display_path, resolve_path};
use super::text::cut_line;
use super::{ToolContext, ToolOutput, limit_hint};

/// Arguments of `find`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct FindArgs {
    /// Glob: matched against the file name when it has no `/`, else against the path relative
    /// to the search directory (then `*` stays within one directory and `**` crosses them).
    pub pattern: String,
    /// Directory to search (default: the cwd).
    #[serde(default)]
    pub path: Option<String>,
    /// Most results (default [`FIND_DEFAULT_LIMIT`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Arguments of `grep`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct GrepArgs {
    /// Regular expression (Rust `regex` syntax), or literal text with `literal`.
    pub pattern: String,
    /// File or directory to search (default: the cwd).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files matching this glob (same matching rules as `find`).
    #[serde(default)]
    pub glob: Option<String>,
    /// Case-insensitive matching.
    #[serde(default)]
    pub ignore_case: Option<bool>,
    /// Treat `pattern` as literal text.
    #[serde(default)]
    pub literal: Option<bool>,
    /// Lines of context before and after each match.
    #[serde(default)]
    pub context: Option<usize>,
    /// Most matching lines (default [`GREP_DEFAULT_LIMIT`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Default `find` limit.
pub const FIND_DEFAULT_LIMIT: usize = 1000;
/// Default `grep` limit.
pub const GREP_DEFAULT_LIMIT: usize = 100;
/// Files larger than this are not searched by `grep`.
const GREP_MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// `find`: paths matching a glob, sorted, directories with a trailing `/`.
pub fn find(ctx: &ToolContext, args: FindArgs) -> ToolOutput {
    let base = match search_base(ctx, args.path.as_deref()) {
        Ok(b) => b,
        Err(e) => return ToolOutput::error(e),
    };
    if !base.is_dir() {
        return ToolOutput::error(format!("{} is not a directory", display_path(ctx, &base)));
    }
    let matcher = match PathGlob::new(&args.pattern) {
        Ok(m) => m,
        Err(e) => return ToolOutput::error(e),
    };
    let limit = args.limit.unwrap_or(FIND_DEFAULT_LIMIT).max(1);
    let mut found = Vec::new();
    let mut hit_limit = false;
    for entry in walker(&base).build().filter_map(Result::ok) {
        let Ok(rel) = entry.path().strip_prefix(&base) else {
            continue;
        };
        if rel.as_os_str().is_empty() || !matcher.matches(rel) {
            continue;
        }
        if found.len() == limit {
            hit_limit = true;
            break;
        }
        let mut shown = rel.to_string_lossy().into_owned();
        if entry.file_type().is_some_and(|t| t.is_dir()) {
            shown.push('/');
        }
        found.push(shown);
    }
    if found.is_empty() {
        return ToolOutput::ok(format!("No files found matching {}", args.pattern));
    }
    let mut text = found.join("\n");
    text.push('\n');
    let cut = truncate_head(&text);
    let mut content = cut.text;
    if hit_limit {
        content.push_str(&format!(
            "\n[Limit of {limit} results reached. Use a more specific pattern or path, or a larger limit.]"
        ));
    } else if cut.truncated {
        content.push_str(&format!(
            "\n[Showing {} of {} results ({} limit). Use a more specific pattern or path.]",
            cut.lines_kept,
            found.len(),
            limit_hint()
        ));
    }
    ToolOutput::ok(content).with_details(json!({"count": found.len(), "limitReached": hit_limit}))
}

/// `grep`: `path:line:text` for matches and `path-line-text` for context, groups separated by
/// `--`, lines cut at 500 characters.
pub fn grep(ctx: &ToolContext, args: GrepArgs) -> ToolOutput {
    let base = match search_base(ctx, args.path.as_deref()) {
        Ok(b) => b,
        Err(e) => return ToolOutput::error(e),
    };
    let source = if args.literal.unwrap_or(false) {
        regex::escape(&args.pattern)
    } else {
        args.pattern.clone()
    };
    let regex = match regex::RegexBuilder::new(&source)
        .case_insensitive(args.ignore_case.unwrap_or(false))
        .size_limit(16 * 1024 * 1024)
        .build()
    {
        Ok(r) => r,
        Err(e) => return ToolOutput::error(format!("invalid pattern: {e}")),
    };
    let glob = match args.glob.as_deref().map(PathGlob::new).transpose() {
        Ok(g) => g,
        Err(e) => return ToolOutput::error(e),
    };
    let limit = args.limit.unwrap_or(GREP_DEFAULT_LIMIT).max(1);
    let context = args.context.unwrap_or(0).min(100);

    // (display name, path) of every file to search.
    let files: Vec<(String, PathBuf)> = if base.is_file() {
        vec![(display_path(ctx, &base), base.clone())]
    } else if base.is_dir() {
        walker(&base)
            .build()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_some_and(|t| t.is_file()))
            .filter_map(|e| {
                let rel = e.path().strip_prefix(&base).ok()?.to_path_buf();
                if let Some(glob) = &glob
                    && !glob.matches(&rel)
                {
                    return None;
                }
                Some((rel.to_string_lossy().into_owned(), e.into_path()))
            })
            .collect()
    } else {
        return ToolOutput::error(format!("{} does not exist", display_path(ctx, &base)));
    };

    let mut out = String::new();
    let mut matches = 0usize;
    let mut hit_limit = false;
    let mut files_with_matches = 0usize;
    'files: for (shown, path) in files {
        let Some(text) = read_text(&path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let hits: Vec<usize> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| regex.is_match(l))
            .map(|(i, _)| i)
            .collect();
        if hits.is_empty() {
            continue;
        }
        files_with_matches += 1;
        let mut last_printed: Option<usize> = None;
        for &hit in &hits {
            if matches == limit {
                hit_limit = true;
                break 'files;
            }
            matches += 1;
            let from = hit.saturating_sub(context);
            let to = (hit + context).min(lines.len() - 1);
            let from = match last_printed {
                Some(last) if last + 1 >= from => last + 1,
                Some(_) if context > 0 => {
                    out.push_str("--\n");
                    from
                }
                _ => from,
            };
            if let Some(last) = last_printed
                && last >= to
            {
                continue;
            }
            for (i, line) in lines.iter().enumerate().take(to + 1).skip(from) {
                let sep = if hits.binary_search(&i).is_ok() {
                    ':'
                } else {
                    '-'
                };
                out.push_str(&format!("{shown}{sep}{}{sep}{}\n", i + 1, cut_line(line)));
                last_printed = Some(i);
            }
        }
        if context > 0 {
            out.push_str("--\n");
        }
    }
    if matches == 0 {
        return ToolOutput::ok("No matches found");
    }
    if context > 0 && out.ends_with("--\n") {
        out.truncate(out.len() - 3);
    }
    let cut = truncate_head(&out);
    let mut content = cut.text;
    if hit_limit {
        content.push_str(&format!(
            "\n[Limit of {limit} matches reached. Use a more specific pattern, path or glob, or a larger limit.]"
        ));
    } else if cut.truncated {
        content.push_str(&format!(
            "\n[Output truncated ({} limit). Use a more specific pattern, path or glob.]",
            limit_hint()
        ));
    }
    ToolOutput::ok(content).with_details(json!({
        "matches": matches,
        "files": files_with_matches,
        "limitReached": hit_limit,
    }))
}

fn search_base(ctx: &ToolContext, path: Option<&str>) -> Result<PathBuf, String> {
    resolve_path(ctx, path.unwrap_or("."))
}

/// A walker honouring ignore files (also outside git repositories), skipping `.git` and
/// `node_modules`, sorted by name.
fn walker(base: &Path) -> ignore::WalkBuilder {
    let mut builder = ignore::WalkBuilder::new(base);
    builder
        .hidden(false)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(false)
        .require_git(false)
        .ignore(true)
        .parents(true)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|entry| {
            let name = entry.file_name();
            !(name == ".git" || name == "node_modules")
        });
    builder
}

/// A glob matched against the file name (pattern without `/`) or the relative path.
struct PathGlob {
    matcher: GlobMatcher,
    whole_path: bool,
}

impl PathGlob {
    fn new(pattern: &str) -> Result<PathGlob, String> {
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let whole_path = pattern.contains('/');
        let glob = GlobBuilder::new(pattern)
            .literal_separator(whole_path)
            .build()
            .map_err(|e| format!("invalid glob {pattern:?}: {e}"))?;
        Ok(PathGlob {
            matcher: glob.compile_matcher(),
            whole_path,
        })
    }

    fn matches(&self, rel: &Path) -> bool {
        if self.whole_path {
            self.matcher.is_match(rel)
        } else {
            rel.file_name().is_some_and(|n| self.matcher.is_match(n))
        }
    }
}

/// The file as text, or `None` when it is binary (NUL in the first 8 KB), too large or
/// unreadable.
fn read_text(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    if file.metadata().ok()?.len() > GREP_MAX_FILE_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(GREP_MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes[..bytes.len().min(8192)].contains(&0) {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tests::{context, run};
    use serde_json::json;
    use wuhu_core::wire::runner::EnvironmentKind;

    /// A project tree; with `with_git`, also a `.git` directory (which must never be searched).
    fn tree(root: &Path, with_git: bool) {
        let files = [
            (".gitignore", "target/\n*.log\n"),
            ("src/main.rs", "fn main() {\n    println!(\"Hello\");\n}\n"),
            ("src/lib.rs", "// hello world\npub fn x() {}\n"),
            ("src/deep/mod.rs", "HELLO\n"),
            ("target/out.rs", "hello from build output\n"),
            ("debug.log", "hello log\n"),
            ("node_modules/m/index.js", "hello\n"),
            (".git/config", "hello\n"),
            (".env.example", "HELLO=1\n"),
            ("README.md", "Hello readme\n"),
        ];
        for (path, content) in files {
            if path.starts_with(".git/") && !with_git {
                continue;
            }
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
    }

    #[test]
    fn find_honours_gitignore_even_outside_a_repository() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        tree(&ctx.root, false);
        let out = run(&ctx, "find", json!({"pattern": "*.rs"}));
        assert_eq!(out.content, "src/deep/mod.rs\nsrc/lib.rs\nsrc/main.rs\n");
        let out = run(&ctx, "find", json!({"pattern": "src/*.rs"}));
        assert_eq!(out.content, "src/lib.rs\nsrc/main.rs\n");
        let out = run(&ctx, "find", json!({"pattern": "*"}));
        assert_eq!(
            out.content,
            ".env.example\n.gitignore\nREADME.md\nsrc/\nsrc/deep/\nsrc/deep/mod.rs\nsrc/lib.rs\nsrc/main.rs\n"
        );
        let out = run(
            &ctx,
            "find",
            json!({"pattern": "*.rs", "path": "src", "limit": 1}),
        );
        assert_eq!(
            out.content,
            "deep/mod.rs\n\n[Limit of 1 results reached. Use a more specific pattern or path, or a larger limit.]"
        );
        assert_eq!(
            run(&ctx, "find", json!({"pattern": "*.py"})).content,
            "No files found matching *.py"
        );
        assert!(run(&ctx, "find", json!({"pattern": "*", "path": "../"})).is_error);
        assert!(run(&ctx, "find", json!({"pattern": "a[", "path": "."})).is_error);
    }

    #[test]
    fn grep_honours_gitignore_and_options() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        tree(&ctx.root, true);
        let out = run(&ctx, "grep", json!({"pattern": "hello"}));
        assert_eq!(out.content, "src/lib.rs:1:// hello world\n");
        let out = run(
            &ctx,
            "grep",
            json!({"pattern": "hello", "ignoreCase": true}),
        );
        assert_eq!(
            out.content,
            ".env.example:1:HELLO=1\nREADME.md:1:Hello readme\nsrc/deep/mod.rs:1:HELLO\nsrc/lib.rs:1:// hello world\nsrc/main.rs:2:    println!(\"Hello\");\n"
        );
        let out = run(
            &ctx,
            "grep",
            json!({"pattern": "hello", "ignoreCase": true, "glob": "*.rs", "path": "src", "limit": 2}),
        );
        assert_eq!(
            out.content,
            "deep/mod.rs:1:HELLO\nlib.rs:1:// hello world\n\n[Limit of 2 matches reached. Use a more specific pattern, path or glob, or a larger limit.]"
        );
        let out = run(
            &ctx,
            "grep",
            json!({"pattern": "println!(", "literal": true}),
        );
        assert_eq!(out.content, "src/main.rs:2:    println!(\"Hello\");\n");
        assert!(run(&ctx, "grep", json!({"pattern": "println!("})).is_error);
        let out = run(
            &ctx,
            "grep",
            json!({"pattern": "Hello", "path": "src/main.rs", "context": 1}),
        );
        assert_eq!(
            out.content,
            "src/main.rs-1-fn main() {\nsrc/main.rs:2:    println!(\"Hello\");\nsrc/main.rs-3-}\n"
        );
        assert_eq!(
            run(&ctx, "grep", json!({"pattern": "zzz"})).content,
            "No matches found"
        );
        let (_dir2, ctx) = context(EnvironmentKind::Local);
        tree(&ctx.root, false);
        let out = run(&ctx, "grep", json!({"pattern": "hello"}));
        assert_eq!(
            out.content, "src/lib.rs:1:// hello world\n",
            "outside a repository"
        );
    }

    #[test]
    fn grep_context_groups_and_long_lines() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let text: String = (1..=20)
            .map(|i| {
                if i == 3 || i == 4 || i == 15 {
                    format!("match {i}\n")
                } else {
                    format!("line {i}\n")
                }
            })
            .collect();
        std::fs::write(ctx.root.join("f.txt"), text).unwrap();
        let out = run(&ctx, "grep", json!({"pattern": "match", "context": 1}));
        assert_eq!(
            out.content,
            "f.txt-2-line 2\nf.txt:3:match 3\nf.txt:4:match 4\nf.txt-5-line 5\n--\nf.txt-14-line 14\nf.txt:15:match 15\nf.txt-16-line 16\n"
        );
        std::fs::write(
            ctx.root.join("long.txt"),
            format!("{}needle\n", "a".repeat(1000)),
        )
        .unwrap();
        let out = run(
            &ctx,
            "grep",
            json!({"pattern": "needle", "path": "long.txt"}),
        );
        assert!(
            out.content.ends_with("... [line truncated]\n"),
            "{}",
            out.content
        );
        assert!(out.content.len() < 600);
    }
}
