//! The path policy of the file tools: paths resolve against the snapshot's cwd. In a cell the
//! resolved path (after normalising `..` and resolving symlinks where the path exists) must be
//! one the cell may reach ([`wuhu_core::cell::CellPolicy::access`]): the root and the call's temp
//! dir to write, the system, the definition's read-only paths and the session's logs to read;
//! on Linux the kernel checks again (the tool's thread is confined by Landlock). With cells off
//! (`--sandbox off`) a path must stay inside the environment root, unless the environment is
//! `local` and the path is absolute.

use std::path::{Component, Path, PathBuf};

use wuhu_core::cell::Access;
use wuhu_core::wire::runner::EnvironmentKind;

use super::ToolContext;

/// Resolves `raw` for a file tool that reads.
///
/// `~` and `~/...` expand with the snapshot's `HOME` (and then count as absolute).
///
/// # Errors
///
/// A message for the model when the path is empty or leaves what the tool may reach.
pub fn resolve_path(ctx: &ToolContext, raw: &str) -> Result<PathBuf, String> {
    resolve(ctx, raw, false)
}

/// Resolves `raw` for a file tool that writes: in a cell, only below the root or the call's
/// temp dir.
///
/// # Errors
///
/// As [`resolve_path`], and for a path the cell may only read.
pub fn resolve_writable(ctx: &ToolContext, raw: &str) -> Result<PathBuf, String> {
    resolve(ctx, raw, true)
}

fn resolve(ctx: &ToolContext, raw: &str, write: bool) -> Result<PathBuf, String> {
    if raw.is_empty() {
        return Err(String::from("path is empty"));
    }
    if raw.contains('\0') {
        return Err(String::from("path contains a NUL byte"));
    }
    let expanded = match (raw, ctx.env.get("HOME")) {
        ("~", Some(home)) => PathBuf::from(home),
        (r, Some(home)) if r.starts_with("~/") => Path::new(home).join(&r[2..]),
        (r, _) => PathBuf::from(r),
    };
    let absolute_input = expanded.is_absolute();
    let joined = if absolute_input {
        expanded
    } else {
        ctx.cwd.join(expanded)
    };
    let normal = normalize_lexically(&joined);
    if let Some(cell) = &ctx.cell {
        let resolved = resolve_existing_prefix(&normal);
        let text = resolved.to_string_lossy();
        return match (cell.policy.access(&text), write) {
            (Access::ReadWrite, _) | (Access::ReadOnly, false) => Ok(resolved),
            (Access::ReadOnly, true) => Err(format!(
                "path {raw} is read-only in this session's cell (it may write below the environment root {} and its temp dir)",
                ctx.root.display()
            )),
            (Access::None, _) => Err(format!(
                "path {raw} is outside this session's cell{} (it may write below the environment root {} and its temp dir, and read the system directories and the definition's readOnlyPaths)",
                if text != raw {
                    format!(" ({text})")
                } else {
                    String::new()
                },
                ctx.root.display()
            )),
        };
    }
    if absolute_input && ctx.kind == EnvironmentKind::Local {
        return Ok(normal);
    }
    let resolved = resolve_existing_prefix(&normal);
    let job_log = absolute_input
        && ctx
            .job_logs
            .as_ref()
            .is_some_and(|logs| resolved.starts_with(resolve_existing_prefix(logs)));
    if resolved.starts_with(&ctx.root) || job_log {
        Ok(resolved)
    } else {
        let why = if absolute_input {
            "only local environments accept absolute paths outside the root"
        } else {
            "relative paths must stay inside the root"
        };
        Err(format!(
            "path {raw} is outside the environment root {} ({why})",
            ctx.root.display()
        ))
    }
}

/// `path` relative to the cwd when inside it, otherwise unchanged; for display.
pub fn display_path(ctx: &ToolContext, path: &Path) -> String {
    match path.strip_prefix(&ctx.cwd) {
        Ok(rel) if rel.as_os_str().is_empty() => String::from("."),
        Ok(rel) => rel.to_string_lossy().into_owned(),
        Err(_) => path.to_string_lossy().into_owned(),
    }
}

/// Removes `.` and resolves `..` without touching the file system (`..` at the root stays at
/// the root).
pub fn normalize_lexically(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Prefix(p) => out.push(p.as_os_str()),
            Component::RootDir => out.push(Component::RootDir.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
        }
    }
    out
}

/// Canonicalises the longest existing ancestor of `path` (resolving symlinks) and appends the
/// rest.
pub(crate) fn resolve_existing_prefix(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            let mut out = canonical;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tests::context;

    #[test]
    fn lexical_normalisation() {
        let cases = [
            ("/a/b/../c", "/a/c"),
            ("/a/./b/", "/a/b"),
            ("/../..", "/"),
            ("/a/b/../../..", "/"),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_lexically(Path::new(input)), PathBuf::from(want));
        }
    }

    #[test]
    fn policy() {
        let outside = tempfile::tempdir().unwrap();
        let outside_path = outside.path().canonicalize().unwrap();
        for kind in [
            EnvironmentKind::Local,
            EnvironmentKind::FolderTemplate,
            EnvironmentKind::Worktree,
        ] {
            let (_dir, ctx) = context(kind);
            std::fs::create_dir(ctx.root.join("sub")).unwrap();
            std::os::unix::fs::symlink(&outside_path, ctx.root.join("escape")).unwrap();
            let root = ctx.root.clone();
            assert_eq!(resolve_path(&ctx, "a.txt").unwrap(), root.join("a.txt"));
            assert_eq!(resolve_path(&ctx, "sub/../b").unwrap(), root.join("b"));
            assert_eq!(
                resolve_path(&ctx, "new/dir/f").unwrap(),
                root.join("new/dir/f")
            );
            assert_eq!(
                resolve_path(&ctx, &root.join("x").to_string_lossy()).unwrap(),
                root.join("x")
            );
            for bad in ["../x", "sub/../../x", "escape/f", "escape"] {
                assert!(resolve_path(&ctx, bad).is_err(), "{kind:?} {bad}");
            }
            let abs_outside = outside_path.join("f").to_string_lossy().into_owned();
            assert_eq!(
                resolve_path(&ctx, &abs_outside).is_ok(),
                kind == EnvironmentKind::Local,
                "{kind:?}"
            );
            assert_eq!(
                resolve_path(&ctx, "/etc/passwd").is_ok(),
                kind == EnvironmentKind::Local
            );
            assert!(resolve_path(&ctx, "").is_err());
        }
    }
}
