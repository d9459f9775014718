//! The workspace knowledge base and `wuhu://` URLs: path rules, frontmatter, URL parsing.
//!
//! The workspace is a per-tenant tree of documents in object storage. Paths are relative,
//! `/`-separated, normalised (no `.`/`..`/empty segments, no backslashes, no control, format or
//! line-separator characters: `crate::text::is_hidden`, so a bidi control or a zero-width space
//! cannot make one path look like another), at most [`MAX_PATH_BYTES`] long. Documents are at most [`MAX_DOC_BYTES`].

use serde_json::Value;

/// Largest document accepted.
pub const MAX_DOC_BYTES: usize = 1024 * 1024;
/// Longest document path.
pub const MAX_PATH_BYTES: usize = 512;

/// Why a path was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty after normalisation.
    #[error("path is empty")]
    Empty,
    /// Starts with `/` (or is a drive path).
    #[error("path must be relative (no leading '/')")]
    Absolute,
    /// Has a `..` segment.
    #[error("path must not contain '..'")]
    ParentSegment,
    /// Has an empty segment (`a//b`) or a trailing `/` where a document is needed.
    #[error("path must not contain empty segments")]
    EmptySegment,
    /// Has a control character or a backslash.
    #[error("path must not contain control characters or backslashes")]
    BadCharacter,
    /// Has an invisible format character (Unicode category Cf: a bidi control, a zero-width
    /// space or joiner, a byte order mark) or a line or paragraph separator.
    #[error(
        "path must not contain invisible characters (U+{0:04X}): bidi controls, zero-width and other format characters are refused"
    )]
    InvisibleCharacter(u32),
    /// Too long.
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
}

/// Normalises a document path: strips `./` segments, refuses everything else that is odd.
///
/// # Errors
/// A [`PathError`] naming the rule.
pub fn normalize_doc_path(path: &str) -> Result<String, PathError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    if path.chars().any(|c| c.is_control() || c == '\\') {
        return Err(PathError::BadCharacter);
    }
    if let Some(c) = path.chars().find(|&c| crate::text::is_hidden(c)) {
        return Err(PathError::InvisibleCharacter(c as u32));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute);
    }
    let mut out: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" => return Err(PathError::EmptySegment),
            "." => {}
            ".." => return Err(PathError::ParentSegment),
            s => out.push(s),
        }
    }
    if out.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(out.join("/"))
}

/// Normalises a listing prefix: like a path, but may be empty or end with `/`.
///
/// # Errors
/// A [`PathError`] naming the rule.
pub fn normalize_prefix(prefix: &str) -> Result<String, PathError> {
    if prefix.is_empty() {
        return Ok(String::new());
    }
    let (body, slash) = match prefix.strip_suffix('/') {
        Some(body) => (body, "/"),
        None => (prefix, ""),
    };
    Ok(format!("{}{slash}", normalize_doc_path(body)?))
}

/// Splits leading YAML frontmatter (`---\n…\n---\n`) from a Markdown document. Returns the
/// parsed frontmatter as JSON (or `None` when there is none) and the body. Frontmatter that is
/// not valid YAML is reported as `Err` with the parser's message, and the body is the whole text.
pub fn split_frontmatter(text: &str) -> (Result<Option<Value>, String>, &str) {
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return (Ok(None), text);
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']) == "---" {
            let yaml = &rest[..offset];
            let body = &rest[offset + line.len()..];
            return match serde_norway::from_str::<Value>(yaml) {
                Ok(Value::Null) => (Ok(Some(Value::Object(Default::default()))), body),
                Ok(value) => (Ok(Some(value)), body),
                Err(e) => (Err(format!("invalid yaml frontmatter: {e}")), text),
            };
        }
        offset += line.len();
    }
    (Ok(None), text)
}

/// A `wuhu://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WuhuUrl {
    /// `wuhu://workspace/<path>`: a workspace document (or prefix when it ends with `/`).
    Workspace(String),
    /// `wuhu://config/<path>`: the tenant's settings, read-only.
    Config(String),
    /// `wuhu://blob/<id>`: a blob of this session (`crate::blobs`), read-only.
    Blob(String),
    /// `wuhu://mcp/<server>/<uri>`: a resource of an MCP server (`crate::mcp_client`), read-only;
    /// `<server>` is a configured server's name or an environment's stdio server
    /// (`<environment>/<server>`).
    Mcp {
        /// The server's name.
        server: String,
        /// The resource's URI, as the server lists it.
        uri: String,
    },
    /// `wuhu://env/<name>/<path>`: a path inside an attached environment.
    Env {
        /// Environment name.
        name: String,
        /// Path below its root (may be empty for the root).
        path: String,
    },
}

/// Why a `wuhu://` URL was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not `wuhu://workspace/`, `wuhu://config/` or `wuhu://env/<name>/`.
    #[error(
        "unknown wuhu:// location {0:?}: use wuhu://workspace/…, wuhu://config/…, wuhu://env/<name>/…, wuhu://blob/<id> or wuhu://mcp/<server>/<uri>"
    )]
    UnknownLocation(String),
    /// The path part is refused.
    #[error("{0}")]
    Path(#[from] PathError),
}

/// `<server>/<uri>` or `<environment>/<server>/<uri>`. A resource's URI begins with its scheme
/// (RFC 3986: `demo://…`, `file:///…`), so a second segment without `:` that names a server is
/// an environment's server.
fn parse_mcp(path: &str) -> Option<WuhuUrl> {
    use crate::mcp_client::documents::valid_server_name;
    let (first, rest) = path.split_once('/')?;
    if let Some((second, uri)) = rest.split_once('/')
        && valid_server_name(second)
        && crate::wire::check_name("environment", first).is_ok()
        && !uri.is_empty()
    {
        return Some(WuhuUrl::Mcp {
            server: crate::wire::runner::mcp::qualified_name(first, second),
            uri: uri.to_string(),
        });
    }
    (valid_server_name(first) && !rest.is_empty()).then(|| WuhuUrl::Mcp {
        server: first.to_string(),
        uri: rest.to_string(),
    })
}

/// Parses a `wuhu://` URL; `None` when `text` is not one (a plain path).
pub fn parse_wuhu_url(text: &str) -> Option<Result<WuhuUrl, UrlError>> {
    let rest = text.strip_prefix("wuhu://")?;
    let (location, path) = rest.split_once('/').unwrap_or((rest, ""));
    Some(match location {
        "workspace" => normalize_prefix(path)
            .map(WuhuUrl::Workspace)
            .map_err(UrlError::from),
        "config" => normalize_prefix(path)
            .map(WuhuUrl::Config)
            .map_err(UrlError::from),
        "blob" => crate::blobs::parse_id(path)
            .map(|id| WuhuUrl::Blob(id.id.to_string()))
            .ok_or_else(|| UrlError::UnknownLocation(text.to_string())),
        "mcp" => parse_mcp(path).ok_or_else(|| UrlError::UnknownLocation(text.to_string())),
        "env" => {
            let (name, path) = path.split_once('/').unwrap_or((path, ""));
            if name.is_empty() {
                Err(UrlError::UnknownLocation(text.to_string()))
            } else {
                normalize_prefix(path)
                    .map(|path| WuhuUrl::Env {
                        name: name.to_string(),
                        path,
                    })
                    .map_err(UrlError::from)
            }
        }
        _ => Err(UrlError::UnknownLocation(text.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_paths() {
        let cases: &[(&str, Result<&str, PathError>)] = &[
            ("notes/a.md", Ok("notes/a.md")),
            ("./notes/./a.md", Ok("notes/a.md")),
            ("../etc/passwd", Err(PathError::ParentSegment)),
            ("notes/../../x", Err(PathError::ParentSegment)),
            ("/etc/passwd", Err(PathError::Absolute)),
            ("a//b", Err(PathError::EmptySegment)),
            ("a/", Err(PathError::EmptySegment)),
            ("", Err(PathError::EmptySegment)),
            (".", Err(PathError::Empty)),
            ("a\u{0}b", Err(PathError::BadCharacter)),
            ("a\\..\\b", Err(PathError::BadCharacter)),
            ("a\nb", Err(PathError::BadCharacter)),
            // Invisible characters: a path must look like what it is.
            (
                "notes/evil\u{202E}dm.exe",
                Err(PathError::InvisibleCharacter(0x202E)),
            ),
            (
                "users/\u{200B}alice/context.md",
                Err(PathError::InvisibleCharacter(0x200B)),
            ),
            ("a\u{200D}b", Err(PathError::InvisibleCharacter(0x200D))),
            ("\u{FEFF}a.md", Err(PathError::InvisibleCharacter(0xFEFF))),
            (
                "a\u{2066}b\u{2069}",
                Err(PathError::InvisibleCharacter(0x2066)),
            ),
            ("soft\u{AD}hyphen", Err(PathError::InvisibleCharacter(0xAD))),
            (
                "line\u{2028}sep",
                Err(PathError::InvisibleCharacter(0x2028)),
            ),
            ("tag\u{E0041}", Err(PathError::InvisibleCharacter(0xE0041))),
            // Visible text of every script stays.
            ("notes/café/中文/🙂.md", Ok("notes/café/中文/🙂.md")),
            ("notes/עברית.md", Ok("notes/עברית.md")),
            ("a b/c d.md", Ok("a b/c d.md")),
        ];
        for (input, want) in cases {
            assert_eq!(
                normalize_doc_path(input).as_deref().map_err(Clone::clone),
                want.clone(),
                "{input:?}"
            );
        }
        // The bound, at every size around it and with characters of every width.
        for unit in ["a", "é", "中", "🙂"] {
            for len in [
                1,
                MAX_PATH_BYTES / 4,
                MAX_PATH_BYTES - 1,
                MAX_PATH_BYTES,
                MAX_PATH_BYTES + 1,
                4 * MAX_PATH_BYTES,
            ] {
                let path = unit.repeat(len.div_ceil(unit.len()));
                let got = normalize_doc_path(&path);
                if path.len() <= MAX_PATH_BYTES {
                    assert_eq!(got.as_deref(), Ok(path.as_str()), "{unit} x {len}");
                } else {
                    assert_eq!(got, Err(PathError::TooLong), "{unit} x {len}");
                }
            }
        }
        // An invisible character anywhere in a path of any size is refused.
        for at in [0, 1, 100, MAX_PATH_BYTES - 3] {
            let mut path = "a".repeat(MAX_PATH_BYTES - 3);
            path.insert(at.min(path.len()), '\u{200B}');
            assert_eq!(
                normalize_doc_path(&path),
                Err(PathError::InvisibleCharacter(0x200B)),
                "at {at}"
            );
        }
        assert_eq!(
            normalize_prefix("notes\u{202E}/"),
            Err(PathError::InvisibleCharacter(0x202E))
        );
        assert_eq!(normalize_prefix("notes/").as_deref(), Ok("notes/"));
        assert_eq!(normalize_prefix("").as_deref(), Ok(""));
        assert_eq!(normalize_prefix("../"), Err(PathError::ParentSegment));
    }

    #[test]
    fn frontmatter() {
        let (fm, body) = split_frontmatter("---\ntitle: Hi\ntags: [a, b]\n---\n# Body\n");
        assert_eq!(
            fm,
            Ok(Some(serde_json::json!({"title": "Hi", "tags": ["a", "b"]})))
        );
        assert_eq!(body, "# Body\n");
        assert_eq!(
            split_frontmatter("# No frontmatter\n"),
            (Ok(None), "# No frontmatter\n")
        );
        assert_eq!(
            split_frontmatter("---\nunterminated\n"),
            (Ok(None), "---\nunterminated\n")
        );
        let (fm, body) = split_frontmatter("---\r\nx: 1\r\n---\r\nbody");
        assert_eq!((fm, body), (Ok(Some(serde_json::json!({"x": 1}))), "body"));
        let (fm, _) = split_frontmatter("---\n: [\n---\nbody");
        assert!(fm.is_err());
    }

    #[test]
    fn urls() {
        let ws = |p: &str| Some(Ok(WuhuUrl::Workspace(p.into())));
        assert_eq!(
            parse_wuhu_url("wuhu://workspace/notes/a.md"),
            ws("notes/a.md")
        );
        assert_eq!(parse_wuhu_url("wuhu://workspace/"), ws(""));
        assert_eq!(
            parse_wuhu_url("wuhu://config/settings.yml"),
            Some(Ok(WuhuUrl::Config("settings.yml".into())))
        );
        assert_eq!(
            parse_wuhu_url("wuhu://env/api/src/main.rs"),
            Some(Ok(WuhuUrl::Env {
                name: "api".into(),
                path: "src/main.rs".into()
            }))
        );
        assert_eq!(parse_wuhu_url("src/main.rs"), None);
        // An MCP resource keeps its URI whole (its own scheme, slashes and query included).
        assert_eq!(
            parse_wuhu_url("wuhu://mcp/every/test://static/resource/1?x=a/b"),
            Some(Ok(WuhuUrl::Mcp {
                server: "every".into(),
                uri: "test://static/resource/1?x=a/b".into()
            }))
        );
        // An environment's stdio server: `<environment>/<server>`, then the URI.
        assert_eq!(
            parse_wuhu_url("wuhu://mcp/api.v2/every/demo://resource/static/document/a.md"),
            Some(Ok(WuhuUrl::Mcp {
                server: "api.v2/every".into(),
                uri: "demo://resource/static/document/a.md".into()
            }))
        );
        assert_eq!(
            parse_wuhu_url("wuhu://mcp/every/file:///guide.md"),
            Some(Ok(WuhuUrl::Mcp {
                server: "every".into(),
                uri: "file:///guide.md".into()
            }))
        );
        for bad in [
            "wuhu://mcp/every",
            "wuhu://mcp/every/",
            "wuhu://mcp/Bad/x",
            "wuhu://mcp//x",
        ] {
            assert!(
                matches!(parse_wuhu_url(bad), Some(Err(UrlError::UnknownLocation(_)))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_wuhu_url("wuhu://workspace/../x"),
            Some(Err(UrlError::Path(PathError::ParentSegment)))
        ));
        assert!(matches!(
            parse_wuhu_url("wuhu://elsewhere/x"),
            Some(Err(UrlError::UnknownLocation(_)))
        ));
    }
}
