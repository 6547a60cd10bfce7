//! subPath bind mounts, as the kubelet makes them (`pkg/volume/util/subpath/subpath_linux.go`).
//!
//! A volumeMount with `subPath` never hands the runtime a path inside the volume: a container that can write
//! to the volume could swap a directory for a symlink between the kubelet's check and the runtime's mount
//! (CVE-2017-1002101). Instead the kubelet opens the subPath one component at a time without following
//! symlinks, holds the last descriptor, and bind-mounts that descriptor (`/proc/<pid>/fd/<n>`) onto
//! `pods/<uid>/volume-subpaths/<volume>/<container>/<index>`; that bind is what CRI gets. The binds stay
//! until [`clean`] removes them, just before the volume is torn down (`CleanSubPaths`).

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use inlet_host::host_path::{self, Refused};
use inlet_host::mount::{MountFlags, MountLayer};
use nix::sys::stat::{FileStat, SFlag, fstat};

/// The directory of a pod's subPath binds (`containerSubPathDirectoryName`).
pub const DIR: &str = "volume-subpaths";

/// One volumeMount with a subPath (upstream's `subpath.Subpath`).
#[derive(Debug)]
pub struct SubPath<'a> {
    /// The volume's mount dir.
    pub volume_path: &'a Path,
    /// The subPath, relative to the volume (already checked for `..` and absoluteness).
    pub sub_path: &'a str,
    /// The volume spec's name (the PV's name for a claim): the directory under `volume-subpaths`.
    pub volume_name: &'a str,
    /// The container's name.
    pub container: &'a str,
    /// The volumeMount's index among all the container's volumeMounts.
    pub index: usize,
    /// The pod's directory (`pods/<uid>`).
    pub pod_dir: &'a Path,
}

impl SubPath<'_> {
    /// Where the subPath is bound: `pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
    pub fn target(&self) -> PathBuf {
        self.pod_dir
            .join(DIR)
            .join(self.volume_name)
            .join(self.container)
            .join(self.index.to_string())
    }
}

/// Creates the missing directories of `sub` under `base` (`SafeMakeDir`): the part that exists may go through
/// symlinks that stay inside `base`; each new directory is made with `mkdirat` in a directory opened without
/// following symlinks, and gets the mode of the volume's root, as the kubelet gives it.
pub fn safe_make_dir(base: &Path, sub: &str) -> io::Result<()> {
    let base = base.canonicalize()?;
    let mode = fs::metadata(&base)?.permissions().mode() & 0o7777;
    let components: Vec<&str> = sub
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let existing = components
        .iter()
        .take_while({
            let mut path = base.clone();
            move |c| {
                path.push(c);
                path.exists()
            }
        })
        .count();
    let prefix = base.join(components[..existing].join("/")).canonicalize()?;
    outside(&base, &prefix)?;
    let missing: PathBuf = components[existing..].iter().collect();
    host_path::create_dirs(&prefix, &missing, mode)
}

/// Why a subPath bind could not be made or removed (for the log: the user sees upstream's short text).
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    /// A step on the host failed: what it was, with its path.
    #[error("{what}: {source}")]
    Io {
        /// The step, in upstream's words (`error opening subpath /x`).
        what: String,
        /// What the host said.
        #[source]
        source: io::Error,
    },
    /// The subPath resolves outside its volume.
    #[error("subpath {:?} not within volume path {:?}", path.display(), volume.display())]
    Outside {
        /// Where the subPath resolved.
        path: PathBuf,
        /// The volume's path.
        volume: PathBuf,
    },
}

impl SubPathError {
    fn io(what: String) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}

/// Bind-mounts the subPath onto its target and returns the target (`doBindSubPath`). A target already bound
/// to the same file is reused (a restarted container); one bound to anything else is unmounted first. The
/// error is for the log: the kubelet shows the user only that the subPath could not be prepared.
pub fn prepare(mounter: &dyn MountLayer, sub: &SubPath) -> Result<PathBuf, SubPathError> {
    let resolve = |p: &Path| {
        p.canonicalize().map_err(SubPathError::io(format!(
            "error resolving symlinks in {:?}",
            p.display()
        )))
    };
    let volume = resolve(sub.volume_path)?;
    let path = resolve(&sub.volume_path.join(sub.sub_path))?;
    if !path.starts_with(&volume) {
        return Err(SubPathError::Outside { path, volume });
    }
    let fd = safe_open(&volume, &path).map_err(SubPathError::io(format!(
        "error opening subpath {}",
        path.display()
    )))?;
    let source = fstat(fd.as_fd())
        .map_err(|e| SubPathError::io(format!("fstat {}", path.display()))(e.into()))?;
    let target = sub.target();
    if prepare_target(mounter, &target, &source)? {
        tracing::debug!(
            "Skipping bind-mounting subpath {}: already mounted",
            target.display()
        );
        return Ok(target);
    }
    let by_fd = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        fd.as_raw_fd()
    ));
    if let Err(e) = mounter.bind(&by_fd, &target, MountFlags::default()) {
        remove_target(&target, sub.pod_dir);
        return Err(SubPathError::io(format!(
            "error mounting {}",
            target.display()
        ))(e));
    }
    tracing::debug!("Bound SubPath {} into {}", path.display(), target.display());
    Ok(target)
}

/// Unmounts and removes every subPath bind of one volume in a pod (`doCleanSubPaths`), before the volume
/// is torn down. Nothing is removed through a mount: a bind that will not go stays, and the error says so.
pub fn clean(
    mounter: &dyn MountLayer,
    pod_dir: &Path,
    volume_name: &str,
) -> Result<(), SubPathError> {
    let volume_dir = pod_dir.join(DIR).join(volume_name);
    let containers = match fs::read_dir(&volume_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(SubPathError::io(format!(
                "error reading {}",
                volume_dir.display()
            ))(e));
        }
    };
    for container in containers.flatten() {
        let dir = container.path();
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let bind = entry.path();
            let cleanup = || -> io::Result<()> {
                while mounter.is_mount_point(&bind)? {
                    mounter.unmount(&bind)?;
                }
                match entry.file_type()?.is_dir() {
                    true => fs::remove_dir(&bind),
                    false => fs::remove_file(&bind),
                }
            };
            cleanup().map_err(SubPathError::io(format!(
                "error processing {}: error cleaning subpath mount {}",
                bind.display(),
                bind.display()
            )))?;
        }
        fs::remove_dir(&dir).map_err(SubPathError::io(format!(
            "error deleting {}",
            dir.display()
        )))?;
    }
    fs::remove_dir(&volume_dir).map_err(SubPathError::io(format!(
        "error deleting {}",
        volume_dir.display()
    )))?;
    // Other volumes' binds may still be there; then this stays.
    let _ = fs::remove_dir(pod_dir.join(DIR));
    Ok(())
}

/// Opens `path` (resolved, inside `base`, also resolved) one component at a time without following a
/// symlink (`doSafeOpen`): what is opened is what was checked, whatever is renamed meanwhile.
fn safe_open(base: &Path, path: &Path) -> io::Result<OwnedFd> {
    let rel = outside(base, path)?;
    match host_path::open_below(base, rel) {
        Ok(Some(fd)) => Ok(fd),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("cannot open {}: no such file", path.display()),
        )),
        Err(Refused::Symlink(link)) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "unexpected symlink found {}",
                link.file_name().unwrap_or_default().to_string_lossy()
            ),
        )),
        Err(other) => Err(io::Error::other(other.to_string())),
    }
}

/// `path` relative to `base`, or upstream's error when it lies outside.
fn outside<'a>(base: &Path, path: &'a Path) -> io::Result<&'a Path> {
    path.strip_prefix(base).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "path {} is outside of allowed base {}",
                path.display(),
                base.display()
            ),
        )
    })
}

/// Makes the bind target ready (`prepareSubpathTarget`); true when it is already bound to `source`.
fn prepare_target(
    mounter: &dyn MountLayer,
    target: &Path,
    source: &FileStat,
) -> Result<bool, SubPathError> {
    let mounted = mounter
        .is_mount_point(target)
        .map_err(SubPathError::io(format!(
            "error checking path {} for mount",
            target.display()
        )))?;
    if mounted {
        let same = fs::symlink_metadata(target)
            .is_ok_and(|m| m.dev() == source.st_dev && m.ino() == source.st_ino);
        if same {
            return Ok(true);
        }
        // upstream's text, typo included.
        mounter.unmount(target).map_err(SubPathError::io(format!(
            "error ummounting {}",
            target.display()
        )))?;
    }
    if let Some(parent) = target.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(parent)
            .map_err(SubPathError::io(format!(
                "error creating directory {}",
                parent.display()
            )))?;
    }
    let is_dir = SFlag::from_bits_truncate(source.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    let made = if is_dir {
        match fs::DirBuilder::new().mode(0o750).create(target) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && target.is_dir() => Ok(()),
            other => other,
        }
        .map_err(SubPathError::io(format!(
            "error creating directory {}",
            target.display()
        )))
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .open(target)
            .map(drop)
            .map_err(SubPathError::io(format!(
                "error creating file {}",
                target.display()
            )))
    };
    made.map(|()| false)
}

/// Removes a target that could not be bound, and its empty parents up to the pod's directory.
fn remove_target(target: &Path, pod_dir: &Path) {
    let _ = fs::remove_dir(target).or_else(|_| fs::remove_file(target));
    for dir in target.ancestors().skip(1) {
        if dir == pod_dir || fs::remove_dir(dir).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inlet_host::mount::{LinuxMounter, RecordingMounter, can_mount};
    use std::os::unix::fs::symlink;

    struct Pod {
        _dir: tempfile::TempDir,
        volume: PathBuf,
        pod_dir: PathBuf,
    }

    fn pod() -> Pod {
        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("volume");
        let pod_dir = dir.path().join("pod");
        fs::create_dir_all(volume.join("data")).unwrap();
        fs::write(volume.join("data/file"), "in the volume").unwrap();
        fs::create_dir_all(&pod_dir).unwrap();
        symlink("/etc", volume.join("escape")).unwrap();
        symlink("data", volume.join("inside")).unwrap();
        Pod {
            volume,
            pod_dir,
            _dir: dir,
        }
    }

    fn sub<'a>(p: &'a Pod, path: &'a str, index: usize) -> SubPath<'a> {
        SubPath {
            volume_path: &p.volume,
            sub_path: path,
            volume_name: "vol",
            container: "app",
            index,
            pod_dir: &p.pod_dir,
        }
    }

    #[test]
    fn binds_under_volume_subpaths_and_cleans_up() {
        let p = pod();
        let mounter = RecordingMounter::new();
        let target = prepare(&mounter, &sub(&p, "data", 2)).unwrap();
        assert_eq!(target, p.pod_dir.join("volume-subpaths/vol/app/2"));
        assert!(mounter.is_mount_point(&target).unwrap());
        let source = &mounter.mounts()[&target];
        assert!(
            source.starts_with("/proc"),
            "bound by descriptor: {source:?}"
        );
        // A symlink that stays inside the volume is resolved first, as upstream's EvalSymlinks.
        prepare(&mounter, &sub(&p, "inside", 3)).unwrap();
        // A file subPath gets a file target.
        let file = prepare(&mounter, &sub(&p, "data/file", 4)).unwrap();
        assert!(file.is_file());
        clean(&mounter, &p.pod_dir, "vol").unwrap();
        assert!(mounter.mounts().is_empty());
        assert!(!p.pod_dir.join(DIR).exists());
        // Nothing to clean is not an error.
        clean(&mounter, &p.pod_dir, "vol").unwrap();
    }

    #[test]
    fn a_symlink_out_of_the_volume_is_refused() {
        let p = pod();
        let mounter = RecordingMounter::new();
        let err = prepare(&mounter, &sub(&p, "escape", 0)).unwrap_err();
        assert!(err.to_string().contains("not within volume path"), "{err}");
        assert!(mounter.mounts().is_empty());
        assert!(!p.pod_dir.join(DIR).join("vol/app/0").exists());
    }

    #[test]
    fn safe_open_refuses_a_symlink_met_on_the_way() {
        let p = pod();
        let volume = p.volume.canonicalize().unwrap();
        let err = safe_open(&volume, &volume.join("inside/file")).unwrap_err();
        assert!(
            err.to_string().contains("unexpected symlink found inside"),
            "{err}"
        );
        safe_open(&volume, &volume.join("data/file")).unwrap();
    }

    #[test]
    fn safe_make_dir_creates_inside_and_never_through_a_symlink() {
        let p = pod();
        safe_make_dir(&p.volume, "inside/new/deeper").unwrap();
        assert!(p.volume.join("data/new/deeper").is_dir());
        let err = safe_make_dir(&p.volume, "escape/inlet-must-not-exist").unwrap_err();
        assert!(err.to_string().contains("outside of allowed base"), "{err}");
        assert!(!Path::new("/etc/inlet-must-not-exist").exists());
    }

    #[test]
    fn a_restarted_container_reuses_its_bind_and_a_stale_one_is_replaced() {
        if !can_mount() {
            println!("SKIPPED subPath bind by descriptor: needs root for real mounts");
            return;
        }
        let p = pod();
        let mounter = LinuxMounter;
        let target = prepare(&mounter, &sub(&p, "data", 0)).unwrap();
        assert_eq!(
            fs::read_to_string(target.join("file")).unwrap(),
            "in the volume"
        );
        // Swapping the subPath for a symlink after the bind changes nothing the container sees.
        fs::rename(p.volume.join("data"), p.volume.join("moved")).unwrap();
        symlink("/etc", p.volume.join("data")).unwrap();
        assert_eq!(
            fs::read_to_string(target.join("file")).unwrap(),
            "in the volume"
        );
        assert!(
            prepare(&mounter, &sub(&p, "data", 0)).is_err(),
            "now it leads out"
        );
        fs::remove_file(p.volume.join("data")).unwrap();
        fs::create_dir(p.volume.join("data")).unwrap();
        // The target is bound to "moved" now, not the new "data": it is replaced.
        prepare(&mounter, &sub(&p, "data", 0)).unwrap();
        assert!(!target.join("file").exists());
        assert_eq!(prepare(&mounter, &sub(&p, "data", 0)).unwrap(), target);
        clean(&mounter, &p.pod_dir, "vol").unwrap();
        assert!(!mounter.is_mount_point(&target).unwrap());
        assert!(!p.pod_dir.join(DIR).exists());
    }
}
