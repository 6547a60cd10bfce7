//! `SetVolumeOwnership` (`pkg/volume/volume_linux.go`): a volume given to the pod's fsGroup. Every file
//! and directory gets the group and group access (read/write, or read-only for a read-only volume), and
//! directories also the setgid bit and search access, so files made later inherit the group. Like
//! upstream's walk, symlinks are neither followed nor changed. Every change goes through the mount layer,
//! whose recording fake records it.

use std::path::Path;

use inlet_host::mount::MountLayer;

/// `rwMask`, `roMask`, `execMask`.
const READ_WRITE: u32 = 0o660;
const READ_ONLY: u32 = 0o440;
const SEARCH: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// Gives everything below `dir` (itself included) to group `gid`. Blocking: call it on the blocking pool.
pub fn set_volume_ownership(
    mounter: &dyn MountLayer,
    dir: &Path,
    gid: i64,
    read_only: bool,
) -> std::io::Result<()> {
    let gid = u32::try_from(gid).map_err(std::io::Error::other)?;
    let mask = if read_only { READ_ONLY } else { READ_WRITE };
    for entry in walkdir::WalkDir::new(dir).follow_links(false) {
        let entry = entry.map_err(std::io::Error::other)?;
        if entry.path_is_symlink() {
            continue;
        }
        let bits = match entry.file_type().is_dir() {
            true => mask | SETGID | SEARCH,
            false => mask,
        };
        mounter.set_group(entry.path(), gid, bits)?;
    }
    Ok(())
}
