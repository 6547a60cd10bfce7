//! Node service: staging, publishing (mount and block), stats, expansion. Real mounts when root.

use std::os::unix::fs::FileTypeExt;

use csi::volume_capability::access_mode::Mode;
use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

const STAGING: &str = "plugins/kubernetes.io/csi/local.inlet.dev/vol/globalmount";

async fn new_volume(f: &mut Fixture, name: &str, cap: csi::VolumeCapability) -> String {
    let req = csi::CreateVolumeRequest {
        volume_capabilities: vec![cap],
        ..create(name, 8 * MI)
    };
    f.controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

#[tokio::test]
async fn node_info_and_capabilities() {
    let mut f = Fixture::start().await;
    let info = f
        .node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    let caps = f
        .node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use csi::node_service_capability::{Type, rpc::Type as Cap};
    let has = |cap: Cap| {
        caps.capabilities
            .iter()
            .any(|c| matches!(&c.r#type, Some(Type::Rpc(r)) if r.r#type == cap as i32))
    };
    assert!(has(Cap::StageUnstageVolume) && has(Cap::GetVolumeStats) && has(Cap::ExpandVolume));
}

#[tokio::test]
async fn stage_publish_unpublish_unstage_round_trip() {
    let mut f = Fixture::start().await;
    let id = new_volume(&mut f, "rt", rwo()).await;
    let staging = f.kubelet_path(STAGING);
    let target = f.kubelet_path("pods/pod-a/volumes/kubernetes.io~csi/pv/mount");

    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .expect("staging twice is OK");
    assert!(f.is_mounted(&staging));
    let elsewhere = f.kubelet_path("plugins/other/globalmount");
    assert_status(
        f.node
            .node_stage_volume(stage(&id, &elsewhere, rwo()))
            .await,
        Code::FailedPrecondition,
        "already staged",
    );

    f.node
        .node_publish_volume(publish(&id, &staging, &target, rwo()))
        .await
        .unwrap();
    f.node
        .node_publish_volume(publish(&id, &staging, &target, rwo()))
        .await
        .expect("publishing twice is OK");
    assert!(f.is_mounted(&target));
    if !f.skip_without_root("data written through the target reaches the volume") {
        std::fs::write(format!("{target}/file"), "written by a pod").unwrap();
        let stored = std::fs::read_to_string(f.state_path(&format!("volumes/{id}/file"))).unwrap();
        assert_eq!(stored, "written by a pod");
    }
    assert_status(
        f.node.node_unstage_volume(unstage(&id, &staging)).await,
        Code::FailedPrecondition,
        "still published",
    );

    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    assert!(
        !f.is_mounted(&target) && !std::path::Path::new(&target).exists(),
        "the target is unmounted and removed"
    );
    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .expect("unpublishing twice is OK");
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .expect("unstaging twice is OK");
    assert!(!f.is_mounted(&staging));
}

/// A staging path that holds another volume's mount is refused: staging there would record it for the
/// second volume, whose publish would then hand out the first one's content.
#[tokio::test]
async fn a_staging_path_held_by_another_volume_is_refused() {
    let mut f = Fixture::start().await;
    let (first, second) = (
        new_volume(&mut f, "first", rwo()).await,
        new_volume(&mut f, "second", rwo()).await,
    );
    let staging = f.kubelet_path(STAGING);
    f.node
        .node_stage_volume(stage(&first, &staging, rwo()))
        .await
        .unwrap();
    assert_status(
        f.node
            .node_stage_volume(stage(&second, &staging, rwo()))
            .await,
        Code::AlreadyExists,
        "already holds another mount",
    );
    f.node
        .node_unstage_volume(unstage(&second, &staging))
        .await
        .expect("the refused volume was never staged");
    assert!(f.is_mounted(&staging), "the first volume stays staged");
    f.node
        .node_unstage_volume(unstage(&first, &staging))
        .await
        .unwrap();
    assert!(!f.is_mounted(&staging));
}

#[tokio::test]
async fn publish_requires_staging_first() {
    let mut f = Fixture::start().await;
    let id = new_volume(&mut f, "unstaged", rwo()).await;
    let staging = f.kubelet_path(STAGING);
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    assert_status(
        f.node
            .node_publish_volume(publish(&id, &staging, &target, rwo()))
            .await,
        Code::FailedPrecondition,
        "must be staged",
    );
    assert_status(
        f.node
            .node_publish_volume(publish(&id, "", &target, rwo()))
            .await,
        Code::InvalidArgument,
        "staging_target_path",
    );
    assert!(
        !std::path::Path::new(&target).exists(),
        "a refused publish creates no target"
    );
}

#[tokio::test]
async fn read_only_publish_refuses_writes_and_conflicting_options_already_exist() {
    let mut f = Fixture::start().await;
    let id = new_volume(&mut f, "ro", rwo()).await;
    let staging = f.kubelet_path(STAGING);
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    let read_only = csi::NodePublishVolumeRequest {
        readonly: true,
        ..publish(&id, &staging, &target, rwo())
    };
    f.node.node_publish_volume(read_only).await.unwrap();
    assert_status(
        f.node
            .node_publish_volume(publish(&id, &staging, &target, rwo()))
            .await,
        Code::AlreadyExists,
        "other options",
    );
    if !f.skip_without_root("a read-only target refuses writes") {
        assert!(std::fs::write(format!("{target}/x"), "no").is_err());
    }
    // A reader-only access mode and the "ro" mount flag are read-only too.
    let reader = f.kubelet_path("pods/q/volumes/v/mount");
    f.node
        .node_publish_volume(publish(
            &id,
            &staging,
            &reader,
            mount_cap(Mode::SingleNodeReaderOnly),
        ))
        .await
        .unwrap();
    let flagged = f.kubelet_path("pods/r/volumes/v/mount");
    f.node
        .node_publish_volume(publish(
            &id,
            &staging,
            &flagged,
            mount_cap_flags(Mode::SingleNodeWriter, &["ro", "noexec"]),
        ))
        .await
        .unwrap();
    if !f.skip_without_root("reader-only and ro-flag targets refuse writes") {
        assert!(std::fs::write(format!("{reader}/x"), "no").is_err());
        assert!(std::fs::write(format!("{flagged}/x"), "no").is_err());
    }
    for t in [&target, &reader, &flagged] {
        f.node
            .node_unpublish_volume(unpublish(&id, t))
            .await
            .unwrap();
    }
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn single_node_single_writer_is_published_at_one_target_only() {
    let mut f = Fixture::start().await;
    let sw = mount_cap(Mode::SingleNodeSingleWriter);
    let id = new_volume(&mut f, "sw", sw.clone()).await;
    let staging = f.kubelet_path(STAGING);
    f.node
        .node_stage_volume(stage(&id, &staging, sw.clone()))
        .await
        .unwrap();
    let (a, b) = (
        f.kubelet_path("pods/a/volumes/v/mount"),
        f.kubelet_path("pods/b/volumes/v/mount"),
    );
    f.node
        .node_publish_volume(publish(&id, &staging, &a, sw.clone()))
        .await
        .unwrap();
    assert_status(
        f.node
            .node_publish_volume(publish(&id, &staging, &b, sw))
            .await,
        Code::FailedPrecondition,
        "SINGLE_NODE_SINGLE_WRITER",
    );
    f.node
        .node_unpublish_volume(unpublish(&id, &a))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn stage_requires_controller_publish_when_attach_is_enabled() {
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    let id = new_volume(&mut f, "att", rwo()).await;
    let staging = f.kubelet_path(STAGING);
    assert_status(
        f.node.node_stage_volume(stage(&id, &staging, rwo())).await,
        Code::FailedPrecondition,
        "ControllerPublishVolume",
    );
    let attach = csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-1".into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    f.controller
        .controller_publish_volume(attach)
        .await
        .unwrap();
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn volume_stats_report_usage_at_published_paths_only() {
    let mut f = Fixture::start().await;
    let id = new_volume(&mut f, "stats", rwo()).await;
    let staging = f.kubelet_path(STAGING);
    let target = f.kubelet_path("pods/p/volumes/v/mount");
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    f.node
        .node_publish_volume(publish(&id, &staging, &target, rwo()))
        .await
        .unwrap();
    std::fs::write(f.state_path(&format!("volumes/{id}/blob")), vec![7u8; 4096]).unwrap();

    let stats = |path: &str| csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    };
    let reply = f
        .node
        .node_get_volume_stats(stats(&target))
        .await
        .unwrap()
        .into_inner();
    let bytes = reply
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .unwrap();
    assert_eq!(bytes.total, 8 * MI);
    assert!(
        bytes.used >= 4096 && bytes.available == bytes.total - bytes.used,
        "{bytes:?}"
    );
    let inodes = reply
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Inodes as i32)
        .unwrap();
    assert!(inodes.used >= 2, "the directory and the file: {inodes:?}");
    assert!(!reply.volume_condition.unwrap().abnormal);

    // At the staging path too, and at the target however its separators are spelled.
    for path in [staging.clone(), target.replace("/pods/", "//pods/") + "/"] {
        let reply = f.node.node_get_volume_stats(stats(&path)).await;
        assert!(reply.is_ok(), "{path}: {reply:?}");
    }
    let elsewhere = f.kubelet_path("pods/other/volumes/v/mount");
    for path in [elsewhere.as_str(), "/tmp/outside", "relative/path"] {
        assert_status(
            f.node.node_get_volume_stats(stats(path)).await,
            Code::NotFound,
            "at",
        );
    }
    let unknown = csi::NodeGetVolumeStatsRequest {
        volume_id: "nope".into(),
        ..stats(&target)
    };
    assert_status(
        f.node.node_get_volume_stats(unknown).await,
        Code::NotFound,
        "nope",
    );
    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
}

#[tokio::test]
async fn block_volumes_publish_a_loop_device_and_expand_online() {
    let mut f = Fixture::start().await;
    let block = block_cap(Mode::SingleNodeWriter);
    let id = new_volume(&mut f, "blk", block.clone()).await;
    let staging = f.kubelet_path("plugins/kubernetes.io/csi/volumeDevices/staging/blk");
    let target = f.kubelet_path("plugins/kubernetes.io/csi/volumeDevices/publish/blk/pod-uid");
    assert_status(
        f.node.node_stage_volume(stage(&id, &staging, rwo())).await,
        Code::InvalidArgument,
        "Block volume",
    );
    f.node
        .node_stage_volume(stage(&id, &staging, block.clone()))
        .await
        .unwrap();
    f.node
        .node_publish_volume(publish(&id, &staging, &target, block.clone()))
        .await
        .unwrap();
    assert!(f.is_mounted(&target));
    if !f.skip_without_root("the target is a block device of the volume's size") {
        let meta = std::fs::metadata(&target).unwrap();
        assert!(
            meta.file_type().is_block_device(),
            "{target} is not a block device"
        );
    }

    let expand = csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 * MI,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = f
        .controller
        .controller_expand_volume(expand)
        .await
        .unwrap()
        .into_inner();
    assert!(
        grown.node_expansion_required,
        "a loop device must re-read its size on the node"
    );
    let node_expand = csi::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: target.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 * MI,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let reply = f
        .node
        .node_expand_volume(node_expand)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.capacity_bytes, 16 * MI);
    if !f.skip_without_root("the loop device sees the new size") {
        let device = std::fs::canonicalize(&target).ok();
        let size = device_size(&f, &id);
        assert_eq!(size, Some(16 * MI as u64), "device {device:?}");
    }

    f.node
        .node_unpublish_volume(unpublish(&id, &target))
        .await
        .unwrap();
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
    assert!(!std::path::Path::new(&target).exists());
    if !f.skip_without_root("unstaging detaches the loop device") {
        assert_eq!(loop_of(&f, &id), None);
    }
    f.controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
}

fn loop_of(f: &Fixture, id: &str) -> Option<String> {
    let file = f.state_path(&format!("volumes/{id}.img"));
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(&file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.split(':').next())
        .map(String::from)
}

fn device_size(f: &Fixture, id: &str) -> Option<u64> {
    let device = loop_of(f, id)?;
    let name = device.trim_start_matches("/dev/");
    let sectors: u64 = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(sectors * 512)
}
