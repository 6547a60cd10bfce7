//! Symlinks below the kubelet dir never lead the driver out of it (issue #9, item 1): a target that is a
//! symlink, a target under a symlinked directory whose last components do not exist yet, and a published
//! target whose parent was later swapped for a symlink are all refused with INVALID_ARGUMENT, and nothing is
//! created, mounted or unmounted outside.

use std::os::unix::fs::symlink;
use std::path::Path;

use tonic::Code;

use crate::fixture::*;

const HANDLE: &str = "csi-0b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d";

#[tokio::test]
async fn a_target_that_is_a_symlink_is_refused() {
    let mut f = Fixture::start().await;
    let outside = tempfile::tempdir().unwrap();
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    std::fs::create_dir_all(Path::new(&target).parent().unwrap()).unwrap();
    symlink(outside.path(), &target).unwrap();
    let result = f
        .node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await;
    assert_status(result, Code::InvalidArgument, "is a symlink");
    assert!(!f.is_mounted(&outside.path().display().to_string()));
    assert!(f.volume_contents().is_empty(), "no volume was created");
}

#[tokio::test]
async fn a_target_below_a_symlinked_directory_is_refused_and_nothing_is_made_outside() {
    let mut f = Fixture::start().await;
    let outside = tempfile::tempdir().unwrap();
    let pod = f.kubelet_path("pods/uid-1");
    std::fs::create_dir_all(&pod).unwrap();
    symlink(outside.path(), format!("{pod}/volumes")).unwrap();
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    let result = f
        .node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await;
    assert_status(result, Code::InvalidArgument, "is a symlink");
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing made outside"
    );
    // Unpublishing it is refused the same way, not failed forever.
    let result = f
        .node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await;
    assert_status(result, Code::InvalidArgument, "is a symlink");
}

#[tokio::test]
async fn a_published_target_swapped_for_a_symlink_is_not_unmounted_through() {
    let mut f = Fixture::start().await;
    if f.skip_without_root("a swapped target and a foreign mount") {
        return;
    }
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await
        .unwrap();
    // The target's parent is moved away (its mount goes with it) and replaced by a symlink to a directory
    // holding someone else's mount at "mount".
    let parent = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v");
    let moved = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v-moved");
    std::fs::rename(&parent, &moved).unwrap();
    let foreign = tempfile::tempdir().unwrap();
    let foreign_mount = foreign.path().join("mount");
    std::fs::create_dir(&foreign_mount).unwrap();
    f.mounter
        .tmpfs(&foreign_mount, 1 << 20)
        .expect("a foreign mount");
    symlink(foreign.path(), &parent).unwrap();
    let result = f
        .node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await;
    assert_status(result, Code::InvalidArgument, "is a symlink");
    assert!(
        f.is_mounted(&foreign_mount.display().to_string()),
        "the foreign mount stays"
    );
    f.mounter.unmount(&foreign_mount).unwrap();
    // Put back, the volume unpublishes as usual.
    std::fs::remove_file(&parent).unwrap();
    std::fs::rename(&moved, &parent).unwrap();
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .unwrap();
    assert!(!f.is_mounted(&target));
}

#[tokio::test]
async fn a_megabyte_long_path_is_invalid_with_a_short_error() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path(&"a/".repeat(500_000));
    let status = f
        .node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "{}",
        &status.message()[..200]
    );
    assert!(
        status.message().len() < 1024,
        "{} bytes",
        status.message().len()
    );
}
