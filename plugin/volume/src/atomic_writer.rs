//! `AtomicWriter` (`pkg/volume/util/atomic_writer.go`): a set of files projected into a volume so that a
//! reader sees all of one version or all of the next, never a mix. The files live in a hidden timestamped
//! directory (`..2026_12_02_15_04_05.123456789`), `..data` is a symlink to it, and each top-level name the
//! pod sees is a symlink through `..data` (`key -> ..data/key`). An update writes a new timestamped
//! directory and swaps `..data` with one rename, which watchers of `..data` see as one event.
//!
//! Every write happens inside the new timestamped directory this writer made itself, with paths checked
//! as upstream's `validatePath` checks them, and files created without following symlinks.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The symlink to the current timestamped directory.
pub(crate) const DATA_DIR: &str = "..data";
/// The symlink made beside it, then renamed over it.
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_FILE_NAME_LENGTH: usize = 255;
const MAX_PATH_LENGTH: usize = 4096;

/// One file's content and mode (`FileProjection`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// The bytes.
    pub data: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

/// Why a projection failed: a path the pod's spec made (upstream's texts), or the host.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// `validatePath`'s refusal.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// The host refused a step.
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> WriteError {
    move |source| WriteError::Io { step, source }
}

/// `Write`: projects `payload` (relative path -> file) into `target`, an existing directory. Nothing is
/// written when every file already has its content and none is to go. `set_perms` runs on the new
/// timestamped directory before it becomes visible (fsGroup ownership). Returns whether it wrote.
pub fn write(
    target: &Path,
    payload: &BTreeMap<String, FileProjection>,
    set_perms: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<bool, WriteError> {
    // (1) The payload's paths, checked and cleaned.
    let mut clean = BTreeMap::new();
    for (path, file) in payload {
        validate_path(path)?;
        clean.insert(clean_path(path), file);
    }
    // (2) The current timestamped directory, if any.
    let data_dir = target.join(DATA_DIR);
    let old = match std::fs::read_link(&data_dir) {
        Ok(old) => Some(old),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("reading link for data directory")(e)),
    };
    // (3) and (4): what the last version has that this one lacks, and whether anything changed.
    let mut to_remove = BTreeSet::new();
    if let Some(old) = &old {
        let old_dir = target.join(old);
        to_remove = paths_to_remove(&clean, &old_dir);
        let unchanged = clean
            .iter()
            .all(|(path, file)| std::fs::read(old_dir.join(path)).is_ok_and(|d| d == file.data));
        if unchanged && to_remove.is_empty() {
            return Ok(false);
        }
    }
    // (5) A new timestamped directory, 0755 whatever the umask.
    let ts_dir = new_timestamp_dir(target).map_err(io("creating the timestamped directory"))?;
    let abandon = |e: WriteError| {
        let _ = std::fs::remove_dir_all(&ts_dir);
        e
    };
    std::fs::set_permissions(&ts_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io("setting the timestamped directory's mode"))
        .map_err(abandon)?;
    // (6) The payload, then the permissions the caller wants.
    write_payload(&clean, &ts_dir).map_err(abandon)?;
    set_perms(&ts_dir)
        .map_err(io("setting the volume's ownership"))
        .map_err(abandon)?;
    // (7) and (8): `..data_tmp` to the new directory, renamed over `..data` (rename is atomic).
    let ts_name = ts_dir.file_name().map(PathBuf::from).unwrap_or_default();
    let new_data_dir = target.join(NEW_DATA_DIR);
    let _ = std::fs::remove_file(&new_data_dir);
    std::os::unix::fs::symlink(&ts_name, &new_data_dir)
        .map_err(io("creating the symbolic link for the update"))
        .map_err(abandon)?;
    if let Err(e) = std::fs::rename(&new_data_dir, &data_dir) {
        let _ = std::fs::remove_file(&new_data_dir);
        return Err(abandon(io("renaming the data directory link")(e)));
    }
    // (9) The names the pod sees, through `..data`.
    for path in clean.keys() {
        let top = top_level(path);
        let visible = target.join(top);
        // A plain file there (an older writer's) would hide every update: the link replaces it.
        if std::fs::symlink_metadata(&visible).is_ok_and(|m| m.file_type().is_file()) {
            let _ = std::fs::remove_file(&visible);
        }
        if std::fs::symlink_metadata(&visible).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA_DIR).join(top), &visible)
                .map_err(io("creating a visible link"))?;
        }
    }
    // (10) Top-level names the last version had and this one has not; (11) the last version.
    for path in to_remove.iter().filter(|p| !p.contains('/')) {
        let _ = std::fs::remove_file(target.join(path));
    }
    if let Some(old) = old.filter(|o| o != &ts_name) {
        std::fs::remove_dir_all(target.join(old)).map_err(io("removing the old data directory"))?;
    }
    Ok(true)
}

/// `newTimestampDir`: `..<UTC time>.<random>` below `target` (as `os.MkdirTemp` with upstream's prefix).
fn new_timestamp_dir(target: &Path) -> std::io::Result<PathBuf> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = i64::try_from(since_epoch.as_secs()).unwrap_or_default();
    let stamp = k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .strftime("..%Y_%m_%d_%H_%M_%S.")
        .to_string();
    loop {
        let dir = target.join(format!("{stamp}{}", rand_suffix()));
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            result => return result.map(|()| dir),
        }
    }
}

/// Nine decimal digits, as `os.MkdirTemp`'s random part.
fn rand_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:09}", hasher.finish() % 1_000_000_000)
}

/// `validatePath`: relative, no `..` element, not starting with `..`, names of at most 255 bytes and
/// paths of at most 4096.
fn validate_path(path: &str) -> Result<(), WriteError> {
    let invalid = |why: String| Err(WriteError::InvalidPath(why));
    if path.is_empty() {
        return invalid(format!("must not be empty: {path:?}"));
    }
    if path.starts_with('/') {
        return invalid(format!("must be relative path: {path}"));
    }
    if path.len() > MAX_PATH_LENGTH {
        return invalid(format!(
            "must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return invalid(format!("must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return invalid(format!(
                "filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return invalid(format!("must not start with '..': {path}"));
    }
    Ok(())
}

/// `filepath.Clean` for a path that passed [`validate_path`]: no empty or `.` elements.
fn clean_path(path: &str) -> String {
    let parts: Vec<&str> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => name.to_str(),
            _ => None,
        })
        .collect();
    parts.join("/")
}

fn top_level(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

/// `pathsToRemove`: the paths of the old version that neither a new file nor one of its parents has.
fn paths_to_remove(
    payload: &BTreeMap<String, &FileProjection>,
    old_dir: &Path,
) -> BTreeSet<String> {
    let mut keep = BTreeSet::new();
    for path in payload.keys() {
        let mut sub = path.as_str();
        loop {
            keep.insert(sub.to_string());
            match sub.rfind('/') {
                Some(slash) => sub = &sub[..slash],
                None => break,
            }
        }
    }
    walkdir::WalkDir::new(old_dir)
        .min_depth(1)
        .follow_links(false)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let relative = e.path().strip_prefix(old_dir).ok()?;
            Some(relative.to_str()?.to_string())
        })
        .filter(|p| !keep.contains(p))
        .collect()
}

/// `writePayloadToDir`: each file with its mode whatever the umask, its directories made first. The
/// directory is new and this writer's own; files are still created without following a symlink.
fn write_payload(
    payload: &BTreeMap<String, &FileProjection>,
    dir: &Path,
) -> Result<(), WriteError> {
    for (path, file) in payload {
        let full = dir.join(path);
        // A file at the top of the payload (a token, `ca.crt`) goes in `dir`, just made.
        if let Some(parent) = full.parent()
            && parent != dir
        {
            std::fs::create_dir_all(parent).map_err(io("creating a directory"))?;
        }
        // Permission bits only: a payload never makes a setuid, setgid or sticky file.
        let mode = file.mode & 0o777;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&full)
            .map_err(io("writing a file"))?;
        out.write_all(&file.data).map_err(io("writing a file"))?;
        out.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io("setting a file's mode"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str)]) -> BTreeMap<String, FileProjection> {
        files
            .iter()
            .map(|(path, data)| {
                let file = FileProjection {
                    data: data.as_bytes().to_vec(),
                    mode: 0o640,
                };
                (path.to_string(), file)
            })
            .collect()
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("..2"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn files_are_links_through_data_to_one_timestamped_directory() {
        let dir = tempfile::tempdir().unwrap();
        let files = payload(&[("user", "alice"), ("conf/app.yaml", "a: 1")]);
        assert!(write(dir.path(), &files, |_| Ok(())).unwrap());
        assert_eq!(entries(dir.path()), ["..data", "conf", "user"]);
        assert_eq!(
            std::fs::read_link(dir.path().join("user")).unwrap(),
            Path::new("..data/user")
        );
        let ts = std::fs::read_link(dir.path().join("..data")).unwrap();
        assert!(ts.to_string_lossy().starts_with("..2"), "{ts:?}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("conf/app.yaml")).unwrap(),
            "a: 1"
        );
        let mode = std::fs::metadata(dir.path().join("user"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert!(
            !write(dir.path(), &files, |_| panic!("no write")).unwrap(),
            "unchanged"
        );
    }

    #[test]
    fn an_update_swaps_the_whole_set_and_drops_what_went() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &payload(&[("a", "1"), ("b", "2")]), |_| Ok(())).unwrap();
        let first = std::fs::read_link(dir.path().join("..data")).unwrap();
        write(dir.path(), &payload(&[("a", "3")]), |_| Ok(())).unwrap();
        let second = std::fs::read_link(dir.path().join("..data")).unwrap();
        assert_ne!(first, second);
        assert!(!dir.path().join(&first).exists(), "the old version is gone");
        assert_eq!(entries(dir.path()), ["..data", "a"]);
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "3");
    }

    #[test]
    fn paths_are_checked_as_upstream_does() {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in [
            (
                "/etc/passwd",
                "invalid path: must be relative path: /etc/passwd",
            ),
            (
                "a/../../b",
                "invalid path: must not contain '..': a/../../b",
            ),
            (
                "..data/x",
                "invalid path: must not start with '..': ..data/x",
            ),
        ] {
            let e = write(dir.path(), &payload(&[(path, "x")]), |_| Ok(())).unwrap_err();
            assert_eq!(e.to_string(), text);
        }
        assert_eq!(
            entries(dir.path()),
            Vec::<String>::new(),
            "nothing was written"
        );
    }

    #[test]
    fn an_older_plain_file_becomes_a_link_and_modes_keep_only_permission_bits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "old").unwrap();
        let mut files = payload(&[("a", "new")]);
        files.get_mut("a").unwrap().mode = 0o4755;
        write(dir.path(), &files, |_| Ok(())).unwrap();
        assert!(
            std::fs::symlink_metadata(dir.path().join("a"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a")).unwrap(),
            "new"
        );
        let mode = std::fs::metadata(dir.path().join("a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "no setuid bit");
    }

    #[test]
    fn a_failed_permission_step_leaves_the_old_version() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &payload(&[("a", "1")]), |_| Ok(())).unwrap();
        let refused = write(dir.path(), &payload(&[("a", "2")]), |_| {
            Err(std::io::Error::other("chown refused"))
        });
        assert!(refused.is_err());
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "1");
        let stamped = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("..2")
            })
            .count();
        assert_eq!(stamped, 1, "the failed version was removed");
    }
}
