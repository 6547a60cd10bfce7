//! A restarted driver answers as if it never stopped: records, attachments, staging and publications survive,
//! and a socket file left by a crash is replaced.

use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

#[tokio::test]
async fn state_survives_a_restart() {
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    let id = f.create_volume_id(create("durable", 4 * MI)).await;
    let snap = csi::CreateSnapshotRequest {
        source_volume_id: id.clone(),
        name: "snap".into(),
        ..Default::default()
    };
    let snap_id = f
        .controller
        .create_snapshot(snap.clone())
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id;
    let attach = csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-1".into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    f.controller
        .controller_publish_volume(attach.clone())
        .await
        .unwrap();
    let staging = f.kubelet_path("plugins/kubernetes.io/csi/local.inlet.dev/d/globalmount");
    let target = f.kubelet_path("pods/p/volumes/kubernetes.io~csi/pv/mount");
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    f.node
        .node_publish_volume(publish(&id, &staging, &target, rwo()))
        .await
        .unwrap();
    let inline_target = f.kubelet_path("pods/p/volumes/kubernetes.io~csi/inline/mount");
    f.node
        .node_publish_volume(publish_ephemeral("csi-inline", &inline_target, &[]))
        .await
        .unwrap();

    let mut f = f.restart().await;

    let again = f
        .controller
        .create_volume(create("durable", 4 * MI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        again.volume_id, id,
        "CreateVolume is still idempotent by name"
    );
    assert_status(
        f.controller.create_volume(create("durable", 8 * MI)).await,
        Code::AlreadyExists,
        "size",
    );
    let snap_again = f
        .controller
        .create_snapshot(snap)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snap_again.snapshot_id, snap_id);
    let get = f
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        get.status.unwrap().published_node_ids,
        ["node-1"],
        "the attachment is remembered"
    );
    f.node
        .node_publish_volume(publish(&id, &staging, &target, rwo()))
        .await
        .expect("the publication is remembered");
    assert_status(
        f.node.node_unstage_volume(unstage(&id, &staging)).await,
        Code::FailedPrecondition,
        "still published",
    );

    f.node
        .node_unpublish_volume(unpublish("csi-inline", &inline_target))
        .await
        .unwrap();
    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
    f.controller
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "node-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    f.controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(f.volume_contents().is_empty());
}

#[tokio::test]
async fn a_stale_socket_from_a_crash_is_replaced() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("before-crash", MI)).await;
    let mut f = f.crash_and_restart().await;
    let listed = f
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries[0].volume.as_ref().unwrap().volume_id, id);
}

#[tokio::test]
async fn a_live_socket_is_not_stolen() {
    let f = Fixture::start().await;
    let err = inlet_proto::uds::listen(&f.socket()).await.unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
}

/// SIGKILL between creating an ephemeral volume's content and writing its record leaves content no record
/// owns. The driver removes it when it starts, and a publish of that id never trips over such a leftover.
#[tokio::test]
async fn content_a_crash_left_without_a_record_is_removed_and_never_blocks_a_publish() {
    let f = Fixture::start().await;
    let id = "csi-1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";
    let leftover = f.state_path(&format!("volumes/{id}"));
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("half-written"), "x").unwrap();
    let snapshot_leftover = f.state_path("snapshots/snap-orphan");
    std::fs::create_dir_all(&snapshot_leftover).unwrap();
    let mut f = f.crash_and_restart().await;
    assert!(
        !leftover.exists(),
        "the orphan volume content is removed at start"
    );
    assert!(
        !snapshot_leftover.exists(),
        "the orphan snapshot content too"
    );

    // Left again while the driver runs (as if recovery had not seen it): the publish still succeeds.
    std::fs::create_dir_all(&leftover).unwrap();
    std::fs::write(leftover.join("half-written"), "x").unwrap();
    let target = f.kubelet_path("pods/uid-9/volumes/kubernetes.io~csi/v/mount");
    f.node
        .node_publish_volume(publish_ephemeral(id, &target, &[]))
        .await
        .unwrap();
    assert!(
        !leftover.join("half-written").exists(),
        "a new volume starts empty"
    );
    f.node
        .node_unpublish_volume(unpublish(id, &target))
        .await
        .unwrap();
    assert!(!leftover.exists());
}
