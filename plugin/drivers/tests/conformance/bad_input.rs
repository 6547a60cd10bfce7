//! Bad input never panics and never escapes the state dir: each bad field gets INVALID_ARGUMENT (or NOT_FOUND
//! for an unknown id) with a message that names it, and nothing is created anywhere.

use csi::volume_capability::AccessMode;
use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

/// Ids that would escape the state dir or exceed the CSI limit.
fn bad_ids() -> Vec<String> {
    vec![
        "../escape".into(),
        "a/b".into(),
        "..".into(),
        "nul\0byte".into(),
        "x".repeat(129),
    ]
}

#[tokio::test]
async fn bad_ids_are_refused_by_every_call_that_takes_one() {
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    let staging = f.kubelet_path("plugins/x/globalmount");
    for id in bad_ids() {
        let c = &mut f.controller;
        assert_status(
            c.create_volume(create(&id, MI)).await,
            Code::InvalidArgument,
            "name:",
        );
        assert_status(
            c.delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
            "volume_id:",
        );
        let snap = csi::CreateSnapshotRequest {
            source_volume_id: "v".into(),
            name: id.clone(),
            ..Default::default()
        };
        assert_status(
            c.create_snapshot(snap).await,
            Code::InvalidArgument,
            "name:",
        );
        let snap = csi::CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "s".into(),
            ..Default::default()
        };
        assert_status(
            c.create_snapshot(snap).await,
            Code::InvalidArgument,
            "source_volume_id:",
        );
        assert_status(
            c.delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: id.clone(),
                ..Default::default()
            })
            .await,
            Code::InvalidArgument,
            "snapshot_id:",
        );
        let attach = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: "node-1".into(),
            volume_capability: Some(rwo()),
            ..Default::default()
        };
        assert_status(
            c.controller_publish_volume(attach).await,
            Code::InvalidArgument,
            "volume_id:",
        );
        let n = &mut f.node;
        assert_status(
            n.node_stage_volume(stage(&id, &staging, rwo())).await,
            Code::InvalidArgument,
            "volume_id:",
        );
        assert_status(
            n.node_publish_volume(publish_ephemeral(&id, &target, &[]))
                .await,
            Code::InvalidArgument,
            "volume_id:",
        );
        assert_status(
            n.node_unpublish_volume(unpublish(&id, &target)).await,
            Code::InvalidArgument,
            "volume_id:",
        );
        assert_status(
            n.node_unstage_volume(unstage(&id, &staging)).await,
            Code::InvalidArgument,
            "volume_id:",
        );
    }
    assert_nothing_created(&f);
}

#[tokio::test]
async fn paths_outside_the_kubelet_dir_or_inside_the_state_dir_are_refused() {
    let mut f = Fixture::start().await;
    let inside_state = f.state_path("volumes/hijack").display().to_string();
    let traversal = f.kubelet_path("pods/../../../etc/inlet-test");
    for (path, needle) in [
        ("relative/mount".to_string(), "not an absolute path"),
        ("/etc/inlet-test".into(), "outside the kubelet dir"),
        (traversal, "'..'"),
        (inside_state, "outside the kubelet dir"),
        (String::new(), "required"),
    ] {
        let result = f
            .node
            .node_publish_volume(publish_ephemeral("csi-x", &path, &[]))
            .await;
        assert_status(result, Code::InvalidArgument, "target_path:");
        let result = f
            .node
            .node_publish_volume(publish_ephemeral("csi-x", &path, &[]))
            .await;
        assert_status(result, Code::InvalidArgument, needle);
        assert_status(
            f.node
                .node_unpublish_volume(unpublish("csi-x", &path))
                .await,
            Code::InvalidArgument,
            "target_path:",
        );
        assert_status(
            f.node.node_stage_volume(stage("v", &path, rwo())).await,
            Code::InvalidArgument,
            "staging_target_path:",
        );
    }
    assert!(!std::path::Path::new("/etc/inlet-test").exists());
    assert_nothing_created(&f);
}

#[tokio::test]
async fn missing_or_unknown_capabilities_are_refused() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    let mut no_cap = publish_ephemeral("csi-x", &target, &[]);
    no_cap.volume_capability = None;
    assert_status(
        f.node.node_publish_volume(no_cap).await,
        Code::InvalidArgument,
        "volume_capability: required",
    );
    for mode in [0, 99, -1] {
        let mut req = publish_ephemeral("csi-x", &target, &[]);
        req.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode });
        assert_status(
            f.node.node_publish_volume(req).await,
            Code::InvalidArgument,
            "volume_capability.access_mode: unknown access mode",
        );
        let create = csi::CreateVolumeRequest {
            volume_capabilities: vec![csi::VolumeCapability {
                access_mode: Some(AccessMode { mode }),
                ..rwo()
            }],
            ..create("v", MI)
        };
        assert_status(
            f.controller.create_volume(create).await,
            Code::InvalidArgument,
            "access_mode",
        );
    }
    let mut no_mode = publish_ephemeral("csi-x", &target, &[]);
    no_mode.volume_capability.as_mut().unwrap().access_mode = None;
    assert_status(
        f.node.node_publish_volume(no_mode).await,
        Code::InvalidArgument,
        "access_mode: required",
    );
    let mut flags = publish_ephemeral("csi-x", &target, &[]);
    flags.volume_capability = Some(mount_cap_flags(
        csi::volume_capability::access_mode::Mode::SingleNodeWriter,
        &["suid,exec"],
    ));
    assert_status(
        f.node.node_publish_volume(flags).await,
        Code::InvalidArgument,
        "mount_flags",
    );
    assert_nothing_created(&f);
}

#[tokio::test]
async fn unknown_volumes_are_not_found() {
    let mut f = Fixture::start().await;
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    let staging = f.kubelet_path("plugins/x/globalmount");
    assert_status(
        f.node
            .node_stage_volume(stage("nope", &staging, rwo()))
            .await,
        Code::NotFound,
        "volume \"nope\"",
    );
    assert_status(
        f.node
            .node_publish_volume(publish("nope", &staging, &target, rwo()))
            .await,
        Code::NotFound,
        "nope",
    );
    let expand = csi::NodeExpandVolumeRequest {
        volume_id: "nope".into(),
        volume_path: target.clone(),
        ..Default::default()
    };
    assert_status(
        f.node.node_expand_volume(expand).await,
        Code::NotFound,
        "nope",
    );
    let get = csi::ControllerGetVolumeRequest {
        volume_id: "nope".into(),
    };
    assert_status(
        f.controller.controller_get_volume(get).await,
        Code::NotFound,
        "nope",
    );
    // Unpublish and unstage of an unknown volume with nothing mounted: already done (OK).
    f.node
        .node_unpublish_volume(unpublish("nope", &target))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage("nope", &staging))
        .await
        .unwrap();
    assert_nothing_created(&f);
}

#[tokio::test]
async fn a_foreign_mount_is_never_unmounted() {
    let mut f = Fixture::start().await;
    if f.skip_without_root("a mount the driver did not make is left alone") {
        return;
    }
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    std::fs::create_dir_all(&target).unwrap();
    let foreign = f.dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    f.mounter
        .bind(&foreign, std::path::Path::new(&target), Default::default())
        .unwrap();
    assert_status(
        f.node
            .node_unpublish_volume(unpublish("someone-else", &target))
            .await,
        Code::NotFound,
        "something else is mounted",
    );
    assert!(f.is_mounted(&target), "still mounted");
    f.mounter.unmount(std::path::Path::new(&target)).unwrap();
}

/// No volume content, and nothing under the kubelet dir.
fn assert_nothing_created(f: &Fixture) {
    assert!(
        f.volume_contents().is_empty(),
        "volume content was created: {:?}",
        f.volume_contents()
    );
    let kubelet = f.dir.path().join("kubelet");
    let leftovers: Vec<_> = walkdir::WalkDir::new(&kubelet)
        .min_depth(1)
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| e.path().to_path_buf())
        .collect();
    assert!(
        leftovers.is_empty(),
        "left in the kubelet dir: {leftovers:?}"
    );
}
