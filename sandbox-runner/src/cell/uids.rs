//! Each session as its own uid (`--isolate-uids FIRST-LAST`, a runner started as root on
//! Linux; decision 0023, addendum). The rules (ranges, who gets which uid) are
//! [`wuhu_core::cell::uids`]; this keeps the table in a file and changes owners.
//!
//! A session's uid owns its folder-template copy, its home, its logs and each call's temp dir
//! (`0700`); its cells run as that uid and group, and its file tools touch files as them. The
//! directories above those (the isolated base, [`ISOLATED_DIR_MODE`]) may be passed through by
//! every uid but listed by none.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use wuhu_core::cell::uids::{UidRange, UidTable};

/// The mode of the directories above the sessions' own (the isolated base, its `workspaces`,
/// `homes`, `logs`, `calls-*`): others may pass through, not list.
pub const ISOLATED_DIR_MODE: u32 = 0o711;
/// The default isolated base.
pub const DEFAULT_ISOLATED_DIR: &str = "/var/lib/wuhu-runner";

/// The runner's table of session uids, saved in `session-uids.json` of the isolated base.
#[derive(Debug)]
pub struct SessionUids {
    range: UidRange,
    file: PathBuf,
    table: Mutex<UidTable>,
}

impl SessionUids {
    /// Reads the table (a missing file is an empty one); entries outside `range` are dropped
    /// and said on stderr.
    ///
    /// # Errors
    /// When the file exists but cannot be read or parsed.
    pub fn open(file: PathBuf, range: UidRange) -> Result<SessionUids, String> {
        let mut table = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice::<UidTable>(&bytes)
                .map_err(|e| format!("{}: {e}", file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => UidTable::default(),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        for (session, uid) in table.retain_in(range) {
            eprintln!(
                "wuhu-runner: session {session} had uid {uid}, outside --isolate-uids {range} (or shared): it gets a new one"
            );
        }
        Ok(SessionUids {
            range,
            file,
            table: Mutex::new(table),
        })
    }

    /// The range.
    pub fn range(&self) -> UidRange {
        self.range
    }

    /// How many sessions have a uid.
    pub fn in_use(&self) -> usize {
        self.table.lock().map(|t| t.sessions.len()).unwrap_or(0)
    }

    /// `session`'s uid, given (and saved) now if it had none.
    ///
    /// # Errors
    /// The range is full, or the table could not be saved (then the uid is not given).
    pub fn uid_for(&self, session: &str) -> Result<u32, String> {
        let mut table = self
            .table
            .lock()
            .map_err(|_| String::from("the uid table is poisoned"))?;
        let before = table.clone();
        let assigned = table
            .assign(self.range, session)
            .map_err(|e| e.to_string())?;
        if assigned.new
            && let Err(e) = self.save(&table)
        {
            *table = before;
            return Err(e);
        }
        Ok(assigned.uid)
    }

    /// Gives `session`'s uid back (its copies and home were deleted).
    pub fn release(&self, session: &str) {
        let Ok(mut table) = self.table.lock() else {
            return;
        };
        if table.release(session).is_some()
            && let Err(e) = self.save(&table)
        {
            eprintln!("wuhu-runner: {e}");
        }
    }

    /// Written whole to a new file, then renamed over the old one (a crash leaves either).
    fn save(&self, table: &UidTable) -> Result<(), String> {
        let json = serde_json::to_vec(table).map_err(|e| e.to_string())?;
        let temp = self.file.with_extension("json.new");
        let _ = std::fs::remove_file(&temp);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            std::fs::rename(&temp, &self.file)
        };
        write().map_err(|e| format!("saving {}: {e}", self.file.display()))
    }
}

/// Creates `dir` (and its missing parents) owned by this user with [`ISOLATED_DIR_MODE`], or
/// checks an existing one (a directory, not a link, this user's; its mode is set).
///
/// # Errors
/// As [`crate::private_dir::create`].
pub fn create_passable_dir(dir: &Path) -> std::io::Result<()> {
    crate::private_dir::create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(ISOLATED_DIR_MODE))
}

/// Whether every directory from `/` down to `dir` may be passed through by any uid (others
/// have `x`): else a session's uid could not reach its own files below it.
///
/// # Errors
/// The first directory that others may not pass.
pub fn check_passable(dir: &Path) -> Result<(), String> {
    let mut path = PathBuf::from("/");
    for part in dir.components().skip(1) {
        path.push(part);
        let Ok(meta) = std::fs::metadata(&path) else {
            // Not there yet: it is created passable.
            return Ok(());
        };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(format!(
                "{} (mode {:o}) may not be passed through by the sessions' uids: choose a directory below one they may pass (the default is {DEFAULT_ISOLATED_DIR})",
                path.display(),
                meta.permissions().mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// Gives `dir` to `uid` (and its group `uid`), mode `0700`: the session's own directory.
///
/// # Errors
/// When the owner or mode cannot be set.
pub fn give_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.uid() != uid || meta.gid() != uid {
        std::os::unix::fs::lchown(dir, Some(uid), Some(uid))
            .map_err(|e| format!("giving {} to uid {uid}: {e}", dir.display()))?;
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Gives everything below `root` (and `root`, mode `0700`) to `uid` when `root` is not its yet
/// (a copy or a restore the runner made as root). Links are changed themselves, never
/// followed. Returns whether anything was changed.
///
/// # Errors
/// The first entry that could not be changed.
pub fn give_tree(root: &Path, uid: u32) -> Result<bool, String> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    if meta.uid() == uid && meta.gid() == uid {
        return Ok(false);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.is_dir() {
            let entries =
                std::fs::read_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            stack.extend(entries.flatten().map(|e| e.path()));
        }
        if path != root && (meta.uid() != uid || meta.gid() != uid) {
            std::os::unix::fs::lchown(&path, Some(uid), Some(uid))
                .map_err(|e| format!("giving {} to uid {uid}: {e}", path.display()))?;
        }
    }
    // The root last: while it is not the uid's, a crash part-way is done again next time.
    give_dir(root, uid)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_survives_a_restart_and_a_release() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("session-uids.json");
        let range = wuhu_core::cell::uids::parse_uid_range("30000-30001").unwrap();
        let uids = SessionUids::open(file.clone(), range).unwrap();
        assert_eq!(uids.uid_for("a").unwrap(), 30000);
        assert_eq!(uids.uid_for("b").unwrap(), 30001);
        assert!(uids.uid_for("c").unwrap_err().contains("every uid"));
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = SessionUids::open(file.clone(), range).unwrap();
        assert_eq!(again.uid_for("b").unwrap(), 30001);
        again.release("a");
        let third = SessionUids::open(file.clone(), range).unwrap();
        assert_eq!(third.in_use(), 1);
        assert_eq!(third.uid_for("c").unwrap(), 30000);
        std::fs::write(&file, "not json").unwrap();
        assert!(SessionUids::open(file, range).is_err());
    }

    #[test]
    fn passable_paths() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let err = check_passable(&closed.join("below")).unwrap_err();
        assert!(err.contains("may not be passed through"), "{err}");
        let open = dir.path().join("open");
        create_passable_dir(&open.join("a")).unwrap();
        let mode = std::fs::metadata(open.join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, ISOLATED_DIR_MODE);
    }
}
