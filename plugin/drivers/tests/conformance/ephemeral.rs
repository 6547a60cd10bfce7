//! KEP-596 ephemeral inline volumes: NodePublishVolume with `csi.storage.k8s.io/ephemeral: "true"` creates the
//! volume (no staging, no attach); NodeUnpublishVolume deletes it. Failures leave nothing behind.

use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

/// The handle the kubelet makes for an inline volume: `csi-` + sha256(podUID + volume name).
const HANDLE: &str = "csi-5d1b3f8a0c2e4f6a8b0d1e3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c";

#[tokio::test]
async fn publish_creates_the_volume_and_unpublish_deletes_it() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/scratch/mount");
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await
        .unwrap();
    assert_eq!(
        f.volume_contents(),
        [HANDLE],
        "the backing directory exists"
    );
    assert!(f.is_mounted(&target));
    if !f.skip_without_root("an ephemeral volume is writable through its target") {
        std::fs::write(format!("{target}/scratch"), "tmp").unwrap();
        assert!(f.state_path(&format!("volumes/{HANDLE}/scratch")).exists());
    }
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await
        .expect("publishing twice is OK");

    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .unwrap();
    assert!(
        f.volume_contents().is_empty(),
        "the backing directory is deleted"
    );
    assert!(
        !std::path::Path::new(&target).exists(),
        "the target is removed"
    );
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .expect("unpublishing after deletion is OK");
    let listed = f
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
}

#[tokio::test]
async fn the_size_attribute_sets_the_allocation() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/big/mount");
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[("size", "64Mi")]))
        .await
        .unwrap();
    let free = f
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(
        free,
        GI - 64 * MI,
        "the ephemeral volume is counted against capacity"
    );
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .unwrap();
    let free = f
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(free, GI, "and released when it is deleted");
}

#[tokio::test]
async fn the_default_size_applies_and_kubelet_keys_are_accepted() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    let pod_info = [
        ("csi.storage.k8s.io/pod.name", "web"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", "uid-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ];
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &pod_info))
        .await
        .unwrap();
    let free = f
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(free, GI - 16 * MI, "the configured default size");
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_attributes_are_named_and_leave_nothing_behind() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[("size", "lots")], "volume_context[\"size\"]"),
        (&[("size", "-1Gi")], "negative"),
        (&[("size", "0")], "larger than zero"),
        (
            &[("colour", "blue")],
            "volume_context[\"colour\"]: unknown attribute",
        ),
        (&[("size", "512Mi")], "maximum volume size"),
    ];
    for (attributes, needle) in cases {
        let result = f
            .node
            .node_publish_volume(publish_ephemeral(HANDLE, &target, attributes))
            .await;
        let code = if needle.contains("maximum") {
            Code::OutOfRange
        } else {
            Code::InvalidArgument
        };
        assert_status(result, code, needle);
    }
    let mut bad_flag = publish_ephemeral(HANDLE, &target, &[]);
    bad_flag
        .volume_context
        .insert("csi.storage.k8s.io/ephemeral".into(), "yes".into());
    assert_status(
        f.node.node_publish_volume(bad_flag).await,
        Code::InvalidArgument,
        "ephemeral",
    );
    let mut block = publish_ephemeral(HANDLE, &target, &[]);
    block.volume_capability = Some(block_cap(
        csi::volume_capability::access_mode::Mode::SingleNodeWriter,
    ));
    assert_status(
        f.node.node_publish_volume(block).await,
        Code::InvalidArgument,
        "mount access",
    );
    assert!(f.volume_contents().is_empty(), "no volume was created");
    assert!(
        !std::path::Path::new(&target).exists(),
        "no target was created"
    );
}

#[tokio::test]
async fn a_failed_mount_deletes_the_volume_it_created() {
    let mut f = Fixture::start().await;
    // A file sits where the target directory should be made (a parent that is a file is refused earlier,
    // as INVALID_ARGUMENT, before any volume is created).
    let parent = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v");
    std::fs::create_dir_all(&parent).unwrap();
    let target = format!("{parent}/mount");
    std::fs::write(&target, "in the way").unwrap();
    let result = f
        .node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[]))
        .await;
    assert_status(result, Code::Internal, "creating");
    assert!(
        f.volume_contents().is_empty(),
        "the ephemeral volume was deleted again"
    );
    let free = f
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner()
        .available_capacity;
    assert_eq!(free, GI, "and its capacity released");
}

#[tokio::test]
async fn two_targets_share_one_ephemeral_volume_until_the_last_unpublish() {
    let mut f = Fixture::start().await;
    let (a, b) = (
        f.kubelet_path("pods/uid-1/volumes/x/a"),
        f.kubelet_path("pods/uid-1/volumes/x/b"),
    );
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &a, &[]))
        .await
        .unwrap();
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &b, &[]))
        .await
        .unwrap();
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &a))
        .await
        .unwrap();
    assert_eq!(f.volume_contents(), [HANDLE], "still published at b");
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &b))
        .await
        .unwrap();
    assert!(f.volume_contents().is_empty());
}

#[tokio::test]
async fn an_ephemeral_id_cannot_take_over_a_persistent_volume() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("pv", MI)).await;
    let target = f.kubelet_path("pods/uid-1/volumes/x/mount");
    assert_status(
        f.node
            .node_publish_volume(publish_ephemeral(&id, &target, &[]))
            .await,
        Code::AlreadyExists,
        "persistent",
    );
    assert_eq!(f.volume_contents(), [id]);
}

#[tokio::test]
async fn the_same_id_with_another_size_is_already_exists() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[("size", "8Mi")]))
        .await
        .unwrap();
    // Retried as it was: OK.
    f.node
        .node_publish_volume(publish_ephemeral(HANDLE, &target, &[("size", "8Mi")]))
        .await
        .unwrap();
    let other = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/w/mount");
    assert_status(
        f.node
            .node_publish_volume(publish_ephemeral(HANDLE, &other, &[("size", "16Mi")]))
            .await,
        Code::AlreadyExists,
        "exists with size 8Mi, not 16Mi",
    );
    f.node
        .node_unpublish_volume(unpublish(HANDLE, &target))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_full_disk_is_resource_exhausted_and_leaves_nothing_half_made() {
    if !inlet_host::mount::can_mount() {
        eprintln!("SKIPPED full disk: needs root for a small tmpfs");
        return;
    }
    let mut f = Fixture::on_small_disk(256 << 10).await;
    // Fill the state dir's disk.
    let filler = f.state_path("filler");
    let fill = std::fs::write(&filler, vec![0u8; 512 << 10]);
    assert!(fill.is_err(), "the disk is full");
    let target = f.kubelet_path("pods/uid-1/volumes/kubernetes.io~csi/v/mount");
    let mut full = Vec::new();
    for i in 0..64 {
        // Records take a little space each: some creates may still fit; then the disk refuses.
        let handle = format!("csi-{i:064x}");
        let t = format!("{target}-{i}");
        match f
            .node
            .node_publish_volume(publish_ephemeral(&handle, &t, &[]))
            .await
        {
            Ok(_) => {}
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(!std::path::Path::new(&t).exists(), "no target is left");
                assert!(
                    !f.state_path(&format!("volumes/{handle}")).exists(),
                    "no content is left"
                );
                full.push(handle);
            }
        }
    }
    assert!(!full.is_empty(), "the disk never filled");
    // Space freed, the same publish goes through.
    std::fs::remove_file(&filler).unwrap();
    let t = format!("{target}-retry");
    f.node
        .node_publish_volume(publish_ephemeral(&full[0], &t, &[]))
        .await
        .unwrap();
    f.node
        .node_unpublish_volume(unpublish(&full[0], &t))
        .await
        .unwrap();
}
