//! Controller service: clones and snapshots, the CSI spec's rules for CreateVolume from a volume or a
//! snapshot, CreateSnapshot, DeleteSnapshot and ListSnapshots.

use csi::volume_content_source::{SnapshotSource, Type as Source, VolumeSource};
use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

#[tokio::test]
async fn clones_copy_the_source_content() {
    let mut f = Fixture::start().await;
    let src = f.create_volume_id(create("src", MI)).await;
    std::fs::write(
        f.state_path(&format!("volumes/{src}/hello")),
        "from the source",
    )
    .unwrap();
    let clone = csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(Source::Volume(VolumeSource {
                volume_id: src.clone(),
            })),
        }),
        ..create("clone", MI)
    };
    let v = f
        .controller
        .create_volume(clone.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(f.state_path(&format!("volumes/{}/hello", v.volume_id))).unwrap(),
        "from the source"
    );
    assert!(
        v.content_source.is_some(),
        "the response names its content source"
    );
    let missing = csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(Source::Volume(VolumeSource {
                volume_id: "nope".into(),
            })),
        }),
        ..create("clone2", MI)
    };
    assert_status(
        f.controller.create_volume(missing).await,
        Code::NotFound,
        "volume \"nope\"",
    );
}

#[tokio::test]
async fn snapshots_capture_content_and_restore_it() {
    let mut f = Fixture::start().await;
    let src = f.create_volume_id(create("src", 2 * MI)).await;
    let file = f.state_path(&format!("volumes/{src}/data"));
    std::fs::write(&file, "version 1").unwrap();
    let snap_req = csi::CreateSnapshotRequest {
        source_volume_id: src.clone(),
        name: "snap".into(),
        ..Default::default()
    };
    let snap = f
        .controller
        .create_snapshot(snap_req.clone())
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert!(snap.ready_to_use && snap.creation_time.is_some());
    assert_eq!(
        (snap.size_bytes, snap.source_volume_id.as_str()),
        (2 * MI, src.as_str())
    );
    std::fs::write(&file, "version 2").unwrap();

    let again = f
        .controller
        .create_snapshot(snap_req)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        again.snapshot_id, snap.snapshot_id,
        "same name, same source: the same snapshot"
    );
    let other = f.create_volume_id(create("other", MI)).await;
    let clash = csi::CreateSnapshotRequest {
        source_volume_id: other,
        name: "snap".into(),
        ..Default::default()
    };
    assert_status(
        f.controller.create_snapshot(clash).await,
        Code::AlreadyExists,
        "snap",
    );
    let missing = csi::CreateSnapshotRequest {
        source_volume_id: "nope".into(),
        name: "s2".into(),
        ..Default::default()
    };
    assert_status(
        f.controller.create_snapshot(missing).await,
        Code::NotFound,
        "nope",
    );

    let restore = |name: &str, bytes: i64| csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(Source::Snapshot(SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            })),
        }),
        ..create(name, bytes)
    };
    assert_status(
        f.controller.create_volume(restore("small", MI)).await,
        Code::OutOfRange,
        "content source",
    );
    let restored = f
        .controller
        .create_volume(restore("restored", 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        restored.capacity_bytes >= 2 * MI,
        "a restore is at least as big as its snapshot"
    );
    let content =
        std::fs::read_to_string(f.state_path(&format!("volumes/{}/data", restored.volume_id)))
            .unwrap();
    assert_eq!(
        content, "version 1",
        "the snapshot holds the content of when it was taken"
    );

    let delete = || csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    };
    f.controller.delete_snapshot(delete()).await.unwrap();
    f.controller
        .delete_snapshot(delete())
        .await
        .expect("deleting twice is OK");
    assert!(
        std::fs::read_dir(f.state_path("snapshots"))
            .unwrap()
            .next()
            .is_none(),
        "the copy is gone"
    );
}

#[tokio::test]
async fn list_snapshots_filters_and_paginates() {
    let mut f = Fixture::start().await;
    let a = f.create_volume_id(create("a", MI)).await;
    let b = f.create_volume_id(create("b", MI)).await;
    let mut ids = Vec::new();
    for (i, src) in [&a, &a, &b].into_iter().enumerate() {
        let req = csi::CreateSnapshotRequest {
            source_volume_id: src.clone(),
            name: format!("s{i}"),
            ..Default::default()
        };
        ids.push(
            f.controller
                .create_snapshot(req)
                .await
                .unwrap()
                .into_inner()
                .snapshot
                .unwrap()
                .snapshot_id,
        );
    }
    let list = |req: csi::ListSnapshotsRequest| {
        let mut c = f.controller.clone();
        async move { c.list_snapshots(req).await.unwrap().into_inner() }
    };
    let by_source = list(csi::ListSnapshotsRequest {
        source_volume_id: a.clone(),
        ..Default::default()
    })
    .await;
    assert_eq!(by_source.entries.len(), 2);
    let by_id = list(csi::ListSnapshotsRequest {
        snapshot_id: ids[2].clone(),
        ..Default::default()
    })
    .await;
    assert_eq!(
        by_id.entries[0].snapshot.as_ref().unwrap().source_volume_id,
        b
    );
    let unknown = list(csi::ListSnapshotsRequest {
        snapshot_id: "nope".into(),
        ..Default::default()
    })
    .await;
    assert!(
        unknown.entries.is_empty(),
        "an unknown id filters to an empty list, not an error"
    );
    let first = list(csi::ListSnapshotsRequest {
        max_entries: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(
        (first.entries.len(), first.next_token.is_empty()),
        (2, false)
    );
    let rest = list(csi::ListSnapshotsRequest {
        max_entries: 2,
        starting_token: first.next_token,
        ..Default::default()
    })
    .await;
    assert_eq!((rest.entries.len(), rest.next_token.as_str()), (1, ""));
    let bad = csi::ListSnapshotsRequest {
        starting_token: "99".into(),
        ..Default::default()
    };
    assert_status(
        f.controller.list_snapshots(bad).await,
        Code::Aborted,
        "starting_token",
    );
}
