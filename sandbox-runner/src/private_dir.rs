//! Directories only this user may enter (`0700`), for everything the runner keeps while it runs
//! (call temp dirs, logs, job records, proxy sockets): on a shared host nobody else can read
//! them, plant a symbolic link in them, or race the runner to a name in them (security review
//! M12).

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The runner's runtime directory: `$XDG_RUNTIME_DIR/wuhu-runner` when that is set (a per-user
/// tmpfs), else `~/.wuhu/run`.
pub fn runtime_dir(home: Option<&Path>, xdg_runtime_dir: Option<&Path>) -> Option<PathBuf> {
    match xdg_runtime_dir.filter(|d| d.is_absolute() && d.is_dir()) {
        Some(xdg) => Some(xdg.join("wuhu-runner")),
        None => home.map(|h| h.join(".wuhu").join("run")),
    }
}

/// Creates `dir` (and missing parents) as a directory of this user with mode `0700`, or checks
/// an existing one: a real directory (not a symbolic link), owned by this user; its mode is set
/// to `0700`.
///
/// # Errors
/// When it cannot be created, is a symbolic link or not a directory, or belongs to another
/// user.
pub fn create(dir: &Path) -> std::io::Result<()> {
    create_for(dir, None)
}

/// As [`create`], for a directory that may also belong to `session_uid` (a session's own, on a
/// runner that runs each session as its own uid: the runner creates it, then gives it away).
///
/// # Errors
/// As [`create`].
pub fn create_for(dir: &Path, session_uid: Option<u32>) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory (a symbolic link?); remove it",
            dir.display()
        )));
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && Some(meta.uid()) != session_uid {
        return Err(std::io::Error::other(format!(
            "{} belongs to uid {}, not to this user ({me}); remove it or choose another directory",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_are_0700_and_never_a_link() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b");
        create(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // An existing open directory is closed.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        create(&open).unwrap();
        assert_eq!(
            std::fs::metadata(&open).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // A symbolic link planted where the directory goes is refused.
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(create(&link).is_err());
        assert_eq!(
            runtime_dir(Some(Path::new("/home/ana")), None),
            Some(PathBuf::from("/home/ana/.wuhu/run"))
        );
        assert_eq!(
            runtime_dir(Some(Path::new("/home/ana")), Some(base.path())),
            Some(base.path().join("wuhu-runner"))
        );
        assert_eq!(
            runtime_dir(Some(Path::new("/home/ana")), Some(Path::new("relative"))),
            Some(PathBuf::from("/home/ana/.wuhu/run"))
        );
    }
}
