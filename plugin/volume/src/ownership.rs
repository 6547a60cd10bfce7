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
    // `filepath.Walk` starts with an Lstat of the root too: a volume dir a driver replaced with a symlink
    // is refused here, not walked (walkdir would follow a symlinked root).
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a directory", dir.display()),
        ));
    }
    let walk = walkdir::WalkDir::new(dir)
        .follow_links(false)
        .follow_root_links(false);
    for entry in walk {
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

#[cfg(test)]
mod tests {
    use super::*;
    use inlet_host::mount::RecordingMounter;

    #[test]
    fn a_symlinked_volume_dir_is_refused_and_links_below_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        std::fs::create_dir(&host).unwrap();
        std::fs::write(host.join("shadow"), "").unwrap();
        let volume = dir.path().join("mount");
        std::os::unix::fs::symlink(&host, &volume).unwrap();
        let mounter = RecordingMounter::new();
        let err = set_volume_ownership(&mounter, &volume, 4242, false).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        assert!(mounter.calls().is_empty(), "{:?}", mounter.calls());

        std::fs::remove_file(&volume).unwrap();
        std::fs::create_dir(&volume).unwrap();
        std::os::unix::fs::symlink(&host, volume.join("link")).unwrap();
        set_volume_ownership(&mounter, &volume, 4242, false).unwrap();
        let changed = format!("{:?}", mounter.calls());
        assert!(
            !changed.contains("shadow") && !changed.contains("link"),
            "{changed}"
        );
    }
}
