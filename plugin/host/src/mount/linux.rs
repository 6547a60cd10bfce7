//! The real mount layer, for Linux.
//!
//! A mount point is told by one `statx` (STATX_ATTR_MOUNT_ROOT), not by comparing device numbers (a bind
//! mount on the same filesystem has its parent's device, which is why upstream `mount-utils`'
//! `IsLikelyNotMountPoint` misses bind mounts) nor by scanning `/proc/self/mountinfo`, whose cost grows with
//! every mount on the node; the scan remains only for kernels before 5.8. Loop devices are handled by `losetup`, as the kubelet's
//! `pkg/volume/util/volumepathhandler` does.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::{MountFlags, MountLayer, Overlay};
use crate::host_path;

/// The mount layer that changes the host. Needs root (CAP_SYS_ADMIN).
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxMounter;

/// Whether `path` is the root of a mount, from one `statx` (STATX_ATTR_MOUNT_ROOT, Linux 5.8+): no table
/// scan, so the cost does not grow with the node's mounts. The last component is not followed (a symlink is
/// never a mount point); a missing path, or one under a file, is not a mount point. None when the kernel
/// does not report the attribute.
fn mount_root(path: &Path) -> io::Result<Option<bool>> {
    use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
    match statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::empty(),
    ) {
        Ok(stat) => {
            let known = stat
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT);
            Ok(known.then(|| stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)))
        }
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(Some(false)),
        Err(rustix::io::Errno::NOSYS) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The fallback for kernels before 5.8: `path` (resolved) among `/proc/self/mountinfo`'s mount points.
/// A bind mount on the same filesystem has its parent's device, which is why device numbers do not do.
fn in_mount_table(path: &Path) -> io::Result<bool> {
    let path = match path.canonicalize() {
        Ok(p) => p,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mount_points(&mountinfo).any(|mp| mp == path))
}

/// Mounts reach their target through a descriptor opened with O_NOFOLLOW (`/proc/self/fd/<n>`), and
/// unmounts use UMOUNT_NOFOLLOW: a target swapped for a symlink is refused, never followed to a foreign place.
fn by_fd(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

impl MountLayer for LinuxMounter {
    fn bind(&self, source: &Path, target: &Path, flags: MountFlags) -> io::Result<()> {
        let fd = host_path::open_no_follow(target)?;
        mount(
            Some(source),
            &by_fd(&fd),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        if flags.needs_remount() {
            // Linux ignores per-mount flags on the first MS_BIND; they take effect on a bind remount, of the
            // new mount (opened again: the first descriptor is of the directory under it).
            let remount = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | ms_flags(flags);
            let mounted = host_path::open_no_follow(target)?;
            let remounted = mount(
                None::<&str>,
                &by_fd(&mounted),
                None::<&str>,
                remount,
                None::<&str>,
            );
            drop(mounted);
            if let Err(err) = remounted {
                let _ = umount2(target, MntFlags::UMOUNT_NOFOLLOW);
                return Err(err.into());
            }
        }
        Ok(())
    }

    fn tmpfs(&self, target: &Path, size_bytes: u64) -> io::Result<()> {
        // No size: the kernel's default, half the RAM (`size=0` would mean no limit at all).
        let options = match size_bytes {
            0 => "mode=0755".to_string(),
            size => format!("size={size},mode=0755"),
        };
        let fd = host_path::open_no_follow(target)?;
        mount(
            Some("tmpfs"),
            &by_fd(&fd),
            Some("tmpfs"),
            MsFlags::empty(),
            Some(options.as_str()),
        )?;
        Ok(())
    }

    fn overlay(&self, overlay: &Overlay, target: &Path) -> io::Result<()> {
        let lower: Vec<String> = overlay
            .lower
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let mut options = format!("lowerdir={}", lower.join(":"));
        let mut flags = MsFlags::empty();
        match &overlay.upper {
            Some((upper, work)) => options.push_str(&format!(
                ",upperdir={},workdir={}",
                upper.display(),
                work.display()
            )),
            None => flags |= MsFlags::MS_RDONLY,
        }
        let fd = host_path::open_no_follow(target)?;
        mount(
            Some("overlay"),
            &by_fd(&fd),
            Some("overlay"),
            flags,
            Some(options.as_str()),
        )?;
        Ok(())
    }

    fn remount_read_only(&self, target: &Path) -> io::Result<()> {
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        let fd = host_path::open_no_follow(target)?;
        mount(None::<&str>, &by_fd(&fd), None::<&str>, flags, None::<&str>)?;
        Ok(())
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        // Not through a descriptor: one held open on the mount would keep it busy. UMOUNT_NOFOLLOW refuses
        // a target that is a symlink; the components above it were checked by the caller.
        umount2(target, MntFlags::UMOUNT_NOFOLLOW)?;
        Ok(())
    }

    fn is_mount_point(&self, path: &Path) -> io::Result<bool> {
        match mount_root(path)? {
            Some(answer) => Ok(answer),
            None => in_mount_table(path),
        }
    }

    fn mounts_under(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        // A walk with one statx per entry, not a read of the mount table: its cost is the entries under
        // `dir`, whatever the node's other mounts. Symlinks are not followed, mounts not entered; an
        // entry that cannot be looked at counts as mounted, so no caller removes what it cannot see.
        let mut found = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(path) = stack.pop() {
            if self.is_mount_point(&path).unwrap_or(true) {
                found.push(path);
                continue;
            }
            let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
            if !is_dir {
                continue;
            }
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                stack.push(entry.path());
            }
        }
        found.sort();
        Ok(found)
    }

    fn set_group(&self, path: &Path, gid: u32, mode_bits: u32) -> io::Result<()> {
        use nix::fcntl::AtFlags;
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::symlink_metadata(path)?;
        if meta.file_type().is_symlink() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a symlink", path.display()),
            ));
        }
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            None,
            Some(nix::unistd::Gid::from_raw(gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        let mode = meta.permissions().mode() | mode_bits;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    fn attach_loop(&self, file: &Path) -> io::Result<PathBuf> {
        let out = losetup(&["--find", "--show", &file.display().to_string()])?;
        Ok(PathBuf::from(out.trim()))
    }

    fn find_loop(&self, file: &Path) -> io::Result<Option<PathBuf>> {
        // `losetup -j FILE` prints `/dev/loop0: [2049]:1234 (/path/to/file)`, one line per device.
        let out = losetup(&["-j", &file.display().to_string()])?;
        Ok(out
            .lines()
            .next()
            .and_then(|l| l.split(':').next())
            .map(PathBuf::from))
    }

    fn refresh_loop(&self, device: &Path) -> io::Result<()> {
        losetup(&["-c", &device.display().to_string()]).map(drop)
    }

    fn detach_loop(&self, device: &Path) -> io::Result<()> {
        losetup(&["-d", &device.display().to_string()]).map(drop)
    }
}

fn ms_flags(flags: MountFlags) -> MsFlags {
    let mut ms = MsFlags::empty();
    for (set, flag) in [
        (flags.read_only, MsFlags::MS_RDONLY),
        (flags.no_exec, MsFlags::MS_NOEXEC),
        (flags.no_suid, MsFlags::MS_NOSUID),
        (flags.no_dev, MsFlags::MS_NODEV),
        (flags.no_atime, MsFlags::MS_NOATIME),
    ] {
        if set {
            ms |= flag;
        }
    }
    ms
}

/// The mount points listed in a mountinfo text (field 5), with the kernel's octal escapes undone.
pub(crate) fn mount_points(mountinfo: &str) -> impl Iterator<Item = PathBuf> + '_ {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_octal)
}

/// mountinfo escapes space, tab, newline and backslash as `\040`-style octal.
fn unescape_octal(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok());
        match (bytes[i], octal.and_then(|d| u8::from_str_radix(d, 8).ok())) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

fn losetup(args: &[&str]) -> io::Result<String> {
    let out = Command::new("losetup").args(args).output()?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "losetup {}: {}",
            args.join(" "),
            stderr.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mount_points_with_escapes() {
        let info = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                    90 27 8:1 /data /var/lib/kubelet/pods/a/my\\040vol rw - ext4 /dev/sda1 rw\n";
        let points: Vec<PathBuf> = mount_points(info).collect();
        assert_eq!(
            points,
            [
                PathBuf::from("/proc"),
                PathBuf::from("/var/lib/kubelet/pods/a/my vol")
            ]
        );
    }

    #[test]
    fn a_missing_path_is_not_a_mount_point() {
        assert!(
            !LinuxMounter
                .is_mount_point(Path::new("/nonexistent/inlet/x"))
                .unwrap()
        );
        assert!(LinuxMounter.is_mount_point(Path::new("/proc")).unwrap());
    }

    /// Real mounts need root; the message says so instead of passing silently.
    #[test]
    fn bind_read_only_tmpfs_and_overlay_when_root() {
        if !super::super::can_mount() {
            eprintln!(
                "SKIPPED bind_read_only_tmpfs_and_overlay_when_root: needs root for real mounts"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("f"), "x").unwrap();
        let m = LinuxMounter;
        m.bind(
            &src,
            &dst,
            MountFlags {
                read_only: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(m.is_mount_point(&dst).unwrap());
        assert_eq!(std::fs::read_to_string(dst.join("f")).unwrap(), "x");
        assert!(
            std::fs::write(dst.join("g"), "y").is_err(),
            "read-only bind must refuse writes"
        );
        m.unmount(&dst).unwrap();
        assert!(!m.is_mount_point(&dst).unwrap());
        assert!(
            m.unmount(&dst).is_err(),
            "unmounting twice fails as on Linux"
        );

        m.tmpfs(&dst, 1 << 20).unwrap();
        std::fs::write(dst.join("t"), "tmp").unwrap();
        m.unmount(&dst).unwrap();
        assert!(!dst.join("t").exists());

        let (upper, work) = (dir.path().join("upper"), dir.path().join("work"));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let overlay = Overlay {
            lower: vec![src.clone()],
            upper: Some((upper.clone(), work)),
        };
        m.overlay(&overlay, &dst).unwrap();
        std::fs::write(dst.join("new"), "copy-on-write").unwrap();
        m.unmount(&dst).unwrap();
        assert!(upper.join("new").exists() && !src.join("new").exists());

        // A target that is a symlink is neither mounted through nor unmounted through.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        assert!(m.bind(&src, &link, MountFlags::default()).is_err());
        assert!(!m.is_mount_point(&elsewhere).unwrap());
        m.bind(&src, &elsewhere, MountFlags::default()).unwrap();
        assert!(
            m.unmount(&link).is_err(),
            "the mount behind a symlink stays"
        );
        assert!(m.is_mount_point(&elsewhere).unwrap());
        m.unmount(&elsewhere).unwrap();
    }
}
