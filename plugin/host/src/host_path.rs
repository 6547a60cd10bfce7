//! Target and staging paths under the kubelet dir, walked and created without following a symlink.
//!
//! A CO hands a driver paths to mount on. If a component of one were a symlink, the mount (and the
//! directories created for it) would land wherever the link points, outside the kubelet dir, and the
//! unpublish would later unmount whatever is there. So every component below the kubelet dir is opened with
//! O_NOFOLLOW, one at a time, and must be a real directory; missing ones are made with `mkdirat` inside the
//! directory just opened, as the kubelet's own subpath code does (`pkg/volume/util/subpath/subpath_linux.go`).
//! Where the kernel has `openat2`, it does that walk in one call first, and the walk here runs only to name
//! what it refused.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat, mkdirat};

/// Why a path below the kubelet dir was refused.
#[derive(Debug)]
pub enum Refused {
    /// This component is a symlink.
    Symlink(PathBuf),
    /// This component is not a directory, but more follows it.
    NotADirectory(PathBuf),
    /// The walk failed.
    Io(io::Error),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Symlink(p) => write!(f, "{} is a symlink", p.display()),
            Self::NotADirectory(p) => write!(f, "{} is not a directory", p.display()),
            Self::Io(e) => e.fmt(f),
        }
    }
}

/// `path` as the same path under `root`'s canonical form: `root` itself may be reached through a symlink
/// (a kubelet dir on another disk), what lies below it may not. None when `path` is not below `root`.
pub fn below(root: &Path, path: &Path) -> io::Result<Option<(PathBuf, PathBuf)>> {
    let canonical = canonical(root)?;
    let relative = path
        .strip_prefix(root)
        .or_else(|_| path.strip_prefix(&canonical))
        .ok()
        .filter(|r| r.components().next().is_some())
        .map(Path::to_path_buf);
    Ok(relative.map(|r| (canonical, r)))
}

/// `root.canonicalize()`, remembered for as long as `root` names the same directory (its device and
/// inode, which `stat` reads through any symlink on the way): `realpath` reads every component as a link,
/// five calls or more, and a driver or kubelet asks for its own root dir on every call (1.7 % of the
/// 100,000-pod settle, bench/RESULTS.md). A root replaced or re-pointed meanwhile is another directory and
/// is resolved again; the directory it names is what every walk below opens.
pub fn canonical(root: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    /// Roots are a process's few kubelet and state dirs; a test's many temporary ones are let go.
    const KEPT: usize = 4096;
    /// Each root's device, inode and canonical form.
    type Known = HashMap<PathBuf, (u64, u64, PathBuf)>;
    static KNOWN: std::sync::LazyLock<parking_lot::Mutex<Known>> =
        std::sync::LazyLock::new(Default::default);
    let meta = std::fs::metadata(root)?;
    let id = (meta.dev(), meta.ino());
    if let Some((dev, ino, canonical)) = KNOWN.lock().get(root)
        && (*dev, *ino) == id
    {
        return Ok(canonical.clone());
    }
    let canonical = root.canonicalize()?;
    let mut known = KNOWN.lock();
    if known.len() >= KEPT {
        known.clear();
    }
    known.insert(root.to_path_buf(), (id.0, id.1, canonical.clone()));
    Ok(canonical)
}

/// Checks `relative` below `root` (canonical) without following symlinks: each component that exists must be
/// a real directory, except the last, which may be anything but a symlink. Missing components are fine.
pub fn check(root: &Path, relative: &Path) -> Result<(), Refused> {
    open_below(root, relative).map(drop)
}

/// Opens `relative` below `root` one component at a time with O_NOFOLLOW (an O_PATH descriptor of the last),
/// as [`check`] checks it; None when a component does not exist. What is opened is what was checked,
/// whatever is renamed meanwhile.
pub fn open_below(root: &Path, relative: &Path) -> Result<Option<OwnedFd>, Refused> {
    let mut dir = open_dir(root).map_err(Refused::Io)?;
    let components = normal_components(relative)?;
    // The kernel's walk first (`beneath`); a refusal, or a kernel without `openat2`, walks again below
    // to name the component at fault. A last component that is a symlink is opened itself (O_PATH |
    // O_NOFOLLOW), so its type is checked as the walk checks it.
    if !components.is_empty() {
        match beneath(&dir, relative, rustix::fs::OFlags::empty()) {
            Ok(fd) if file_type(&fd).map_err(Refused::Io)? != SFlag::S_IFLNK => {
                return Ok(Some(fd));
            }
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            _ => {}
        }
    }
    for (i, name) in components.iter().enumerate() {
        let shown = || root.join(components[..=i].iter().collect::<PathBuf>());
        let child = match openat(
            dir.as_fd(),
            *name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Refused::Io(e.into())),
        };
        let kind = file_type(&child).map_err(Refused::Io)?;
        if kind == SFlag::S_IFLNK {
            return Err(Refused::Symlink(shown()));
        }
        let last = i + 1 == components.len();
        if !last && kind != SFlag::S_IFDIR {
            return Err(Refused::NotADirectory(shown()));
        }
        dir = child;
    }
    Ok(Some(dir))
}

/// Creates the missing directories of `relative` below `root` (canonical), each with `mkdirat` in its parent
/// opened without following symlinks, and gives each new one `mode` (set again after the umask); an
/// existing symlink on the way is refused.
pub fn create_dirs(root: &Path, relative: &Path, mode: u32) -> io::Result<()> {
    let mode = Mode::from_bits_truncate(mode);
    let mut dir = open_dir(root)?;
    let mut components =
        normal_components(relative).map_err(|e| io::Error::other(e.to_string()))?;
    // Usually only the last directory is missing (a target path below the pod's volume dir): its parent
    // is opened in one call (`beneath`), and the walk below makes the last alone.
    if let (Some(parent), [.., _]) = (relative.parent(), components.as_slice())
        && let Ok(opened) = beneath(&dir, parent, rustix::fs::OFlags::DIRECTORY)
    {
        dir = opened;
        components.drain(..components.len() - 1);
    }
    for name in components {
        let made = match mkdirat(dir.as_fd(), name, mode) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(e.into()),
        };
        // O_NOFOLLOW | O_DIRECTORY: a symlink (ELOOP) or a file (ENOTDIR) here is refused, not followed.
        dir = openat(
            dir.as_fd(),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        if made {
            fchmod(dir.as_fd(), mode)?;
        }
    }
    Ok(())
}

/// `base/name` for a name that came from outside (an API object, a peer): refused unless `name` is one plain
/// path component, so no name (`..`, `/tmp/x`, `a/../../b`) builds a path outside `base`. The defence in
/// depth behind the validation of such names.
pub fn join_name(base: &Path, name: &str) -> io::Result<PathBuf> {
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(one)), None) if one == name => Ok(base.join(one)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain path component"),
        )),
    }
}

/// Opens the last component of `path` without following it, for a mount through `/proc/self/fd`.
pub fn open_no_follow(path: &Path) -> io::Result<OwnedFd> {
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if file_type(&fd)? == SFlag::S_IFLNK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a symlink", path.display()),
        ));
    }
    Ok(fd)
}

/// `relative` below `dir` opened (O_PATH, plus `flags`) in one `openat2` (Linux 5.6), the walk done by the
/// kernel: it refuses any symlink on the way (`RESOLVE_NO_SYMLINKS`) and anything outside `dir`
/// (`RESOLVE_BENEATH`), where the walk here takes three calls a component (a kubelet's target path has
/// seven, and the reconciler checks one after every publish). Its error does not say which component.
fn beneath(
    dir: &OwnedFd,
    relative: &Path,
    flags: rustix::fs::OFlags,
) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{OFlags, ResolveFlags};
    rustix::fs::openat2(
        dir,
        relative,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC | flags,
        rustix::fs::Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
}

fn open_dir(root: &Path) -> io::Result<OwnedFd> {
    Ok(open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

fn file_type(fd: &OwnedFd) -> io::Result<SFlag> {
    Ok(SFlag::from_bits_truncate(fstat(fd.as_fd())?.st_mode) & SFlag::S_IFMT)
}

fn normal_components(relative: &Path) -> Result<Vec<&std::ffi::OsStr>, Refused> {
    relative
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            other => Err(Refused::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{:?} is not a plain path component", other.as_os_str()),
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_root_pointed_elsewhere_is_resolved_again() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let link = dir.path().join("root");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert_eq!(canonical(&link).unwrap(), a.canonicalize().unwrap());
        assert_eq!(
            canonical(&link).unwrap(),
            a.canonicalize().unwrap(),
            "remembered"
        );
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&b, &link).unwrap();
        assert_eq!(canonical(&link).unwrap(), b.canonicalize().unwrap());
        fs::remove_file(&link).unwrap();
        assert!(
            canonical(&link).is_err(),
            "a root gone is an error, not a memory"
        );
    }

    #[test]
    fn walks_and_creates_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.join("pods/uid")).unwrap();
        symlink(outside.path(), root.join("pods/uid/volumes")).unwrap();
        fs::write(root.join("file"), "").unwrap();

        check(&root, Path::new("pods/uid/new/mount")).unwrap();
        assert!(matches!(
            check(&root, Path::new("pods/uid/volumes/x/mount")),
            Err(Refused::Symlink(p)) if p == root.join("pods/uid/volumes")
        ));
        assert!(matches!(
            check(&root, Path::new("pods/uid/volumes")),
            Err(Refused::Symlink(_))
        ));
        assert!(matches!(
            check(&root, Path::new("file/mount")),
            Err(Refused::NotADirectory(_))
        ));
        check(&root, Path::new("file")).unwrap();
        // What is opened is the path asked for, and a missing one is None, by either walk.
        let opened = open_below(&root, Path::new("pods/uid")).unwrap().unwrap();
        let link = fs::read_link(format!("/proc/self/fd/{}", opened.as_raw_fd())).unwrap();
        assert_eq!(link, root.join("pods/uid"));
        assert!(
            open_below(&root, Path::new("pods/uid/missing/mount"))
                .unwrap()
                .is_none()
        );
        assert!(open_below(&root, Path::new("pods/uid/volumes/missing")).is_err());

        create_dirs(&root, Path::new("pods/uid/new/mount"), 0o750).unwrap();
        assert!(root.join("pods/uid/new/mount").is_dir());
        // The parent there, the last made alone, with its mode; a symlink as the last is refused.
        create_dirs(&root, Path::new("pods/uid/new/other"), 0o705).unwrap();
        let made = fs::metadata(root.join("pods/uid/new/other")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&made.permissions()) & 0o777,
            0o705
        );
        symlink(outside.path(), root.join("pods/uid/new/link")).unwrap();
        assert!(create_dirs(&root, Path::new("pods/uid/new/link"), 0o750).is_err());
        assert!(create_dirs(&root, Path::new("pods/uid/volumes/x/mount"), 0o750).is_err());
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing made outside"
        );
    }

    #[test]
    fn join_name_takes_only_one_plain_component() {
        let base = Path::new("/var/lib/kubelet/plugins");
        assert_eq!(
            join_name(base, "local.inlet.dev").unwrap(),
            base.join("local.inlet.dev")
        );
        for bad in ["", ".", "..", "/tmp/x", "a/b", "../../x", "a/", "./a"] {
            assert!(join_name(base, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn below_accepts_the_root_as_given_or_canonical() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = dir.path().join("kubelet");
        symlink(&real, &link).unwrap();
        let real = real.canonicalize().unwrap();
        let (root, rel) = below(&link, &link.join("pods/a")).unwrap().unwrap();
        assert_eq!(
            (root.as_path(), rel.as_path()),
            (real.as_path(), Path::new("pods/a"))
        );
        assert!(below(&link, &real.join("pods/a")).unwrap().is_some());
        assert!(below(&link, &link).unwrap().is_none());
        assert!(below(&link, Path::new("/etc/passwd")).unwrap().is_none());
    }
}
