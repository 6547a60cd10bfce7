//! The mount layer: every change a driver makes to the host's mount table or loop devices goes through
//! [`MountLayer`], so driver logic can be tested without root against [`RecordingMounter`].
//!
//! - [`LinuxMounter`]: the real thing (mount(2) through nix, `/proc/self/mountinfo`, `losetup`).
//! - [`RecordingMounter`]: a fake that records each call as a typed [`MountCall`] and keeps a consistent view
//!   of what is mounted, so "unmount what is not mounted" fails as it would on Linux.

mod linux;
mod recording;

use std::io;
use std::path::{Path, PathBuf};

pub use linux::LinuxMounter;
pub use recording::{MountCall, RecordingMounter};

/// Per-mount options a CSI `mount_flags` list may ask for on a bind mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountFlags {
    /// `ro`: the mount is read-only.
    pub read_only: bool,
    /// `noexec`.
    pub no_exec: bool,
    /// `nosuid`.
    pub no_suid: bool,
    /// `nodev`.
    pub no_dev: bool,
    /// `noatime`.
    pub no_atime: bool,
}

impl MountFlags {
    /// Parses CSI `mount_flags` (`["ro", "noexec"]`); an unknown flag is returned as the error.
    pub fn parse<'a>(flags: impl IntoIterator<Item = &'a String>) -> Result<Self, String> {
        let mut parsed = Self::default();
        for flag in flags {
            match flag.as_str() {
                "ro" => parsed.read_only = true,
                "rw" | "defaults" | "bind" => {}
                "noexec" => parsed.no_exec = true,
                "nosuid" => parsed.no_suid = true,
                "nodev" => parsed.no_dev = true,
                "noatime" => parsed.no_atime = true,
                other => return Err(other.to_string()),
            }
        }
        Ok(parsed)
    }

    /// True when a bind needs a second, remounting step to apply these flags (Linux ignores them on MS_BIND).
    pub fn needs_remount(&self) -> bool {
        *self != Self::default()
    }
}

/// An overlay mount: read-only lower layers (top first), and an upper/work pair for a writable overlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    /// Lower directories, the topmost first (overlayfs `lowerdir` order).
    pub lower: Vec<PathBuf>,
    /// `(upperdir, workdir)` for a writable overlay; `None` mounts read-only.
    pub upper: Option<(PathBuf, PathBuf)>,
}

/// What a driver may do to the host's mounts and loop devices. Every method is idempotent where Linux allows
/// (see each doc); callers check [`MountLayer::is_mount_point`] before mounting to make repeats cheap.
pub trait MountLayer: Send + Sync + std::fmt::Debug {
    /// Bind-mounts `source` (a directory or a device file) onto `target`, then applies `flags` by remounting.
    fn bind(&self, source: &Path, target: &Path, flags: MountFlags) -> io::Result<()>;
    /// Mounts a tmpfs of `size_bytes` at `target` (0: the kernel's default size, half the RAM).
    fn tmpfs(&self, target: &Path, size_bytes: u64) -> io::Result<()>;
    /// Mounts an overlay at `target`.
    fn overlay(&self, overlay: &Overlay, target: &Path) -> io::Result<()>;
    /// Remounts an existing bind mount read-only, leaving its other flags alone.
    fn remount_read_only(&self, target: &Path) -> io::Result<()>;
    /// Unmounts `target` (one layer). Fails with EINVAL when nothing is mounted there.
    fn unmount(&self, target: &Path) -> io::Result<()>;
    /// True when `path` is itself a mount point (including a bind mount on the same filesystem).
    /// A path that does not exist is not a mount point.
    fn is_mount_point(&self, path: &Path) -> io::Result<bool>;
    /// Every mount point at or below `dir` (directories and files), sorted; mounts inside another are not
    /// listed, and symlinks are not followed; an entry that cannot be looked at is listed. What every "is
    /// anything left mounted here" check asks. The cost is the entries under `dir`, never the node's mount
    /// table.
    fn mounts_under(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    /// True when something is (or may be: the walk failed) mounted at or under `dir`: what must hold
    /// before a directory is removed, so nothing is removed through a mount.
    fn anything_mounted_under(&self, dir: &Path) -> bool {
        self.mounts_under(dir).map_or(true, |m| !m.is_empty())
    }
    /// Gives `path` itself (a symlink is refused, never followed) to group `gid` and adds `mode_bits`
    /// (`0o060`, the setgid bit `0o2000`...) to its mode: the fsGroup step (`SetVolumeOwnership`) and a
    /// driver's VOLUME_MOUNT_GROUP. The owner is left alone.
    fn set_group(&self, path: &Path, gid: u32, mode_bits: u32) -> io::Result<()>;
    /// Attaches `file` to a free loop device and returns the device path.
    fn attach_loop(&self, file: &Path) -> io::Result<PathBuf>;
    /// The loop device `file` is attached to, if any.
    fn find_loop(&self, file: &Path) -> io::Result<Option<PathBuf>>;
    /// Makes a loop device re-read the size of its backing file (after the file grew).
    fn refresh_loop(&self, device: &Path) -> io::Result<()>;
    /// Detaches a loop device.
    fn detach_loop(&self, device: &Path) -> io::Result<()>;
}

/// True when this process may change the host's mounts (it is root). Tests use it to choose a mount layer.
pub fn can_mount() -> bool {
    nix::unistd::Uid::effective().is_root()
}
