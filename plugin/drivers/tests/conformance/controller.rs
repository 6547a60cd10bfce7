//! Controller service: the CSI spec's rules for each call the local driver implements.

use csi::controller_service_capability::{Type, rpc::Type as Cap};
use csi::volume_capability::access_mode::Mode;
use inlet_proto::csi::v1 as csi;
use tonic::Code;

use crate::fixture::*;

async fn capabilities(f: &mut Fixture) -> Vec<Cap> {
    let reply = f
        .controller
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap();
    reply
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(Type::Rpc(rpc)) => Cap::try_from(rpc.r#type).ok(),
            None => None,
        })
        .collect()
}

#[tokio::test]
async fn capabilities_list_what_is_implemented_and_attach_only_when_enabled() {
    let mut f = Fixture::start().await;
    let caps = capabilities(&mut f).await;
    for cap in [
        Cap::CreateDeleteVolume,
        Cap::CreateDeleteSnapshot,
        Cap::ListVolumes,
        Cap::ListSnapshots,
        Cap::GetCapacity,
        Cap::CloneVolume,
        Cap::ExpandVolume,
    ] {
        assert!(caps.contains(&cap), "{cap:?} missing from {caps:?}");
    }
    assert!(!caps.contains(&Cap::PublishUnpublishVolume));
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    assert!(
        capabilities(&mut f)
            .await
            .contains(&Cap::PublishUnpublishVolume)
    );
}

#[tokio::test]
async fn create_volume_requires_a_name_and_capabilities() {
    let mut f = Fixture::start().await;
    assert_status(
        f.controller.create_volume(create("", MI)).await,
        Code::InvalidArgument,
        "name: required",
    );
    let no_caps = csi::CreateVolumeRequest {
        volume_capabilities: vec![],
        ..create("v", MI)
    };
    assert_status(
        f.controller.create_volume(no_caps).await,
        Code::InvalidArgument,
        "volume_capabilities",
    );
    let no_type = csi::CreateVolumeRequest {
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: None,
            ..rwo()
        }],
        ..create("v", MI)
    };
    assert_status(
        f.controller.create_volume(no_type).await,
        Code::InvalidArgument,
        "access_type",
    );
    let unknown_param = csi::CreateVolumeRequest {
        parameters: [("speed".into(), "fast".into())].into(),
        ..create("v", MI)
    };
    assert_status(
        f.controller.create_volume(unknown_param).await,
        Code::InvalidArgument,
        "\"speed\"",
    );
    assert!(
        f.volume_contents().is_empty(),
        "nothing is created for a rejected request"
    );
}

#[tokio::test]
async fn create_volume_is_idempotent_by_name() {
    let mut f = Fixture::start().await;
    let first = f
        .controller
        .create_volume(create("data", 8 * MI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(first.capacity_bytes, 8 * MI);
    let again = f
        .controller
        .create_volume(create("data", 8 * MI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, first.volume_id);
    assert_status(
        f.controller.create_volume(create("data", 16 * MI)).await,
        Code::AlreadyExists,
        "different size",
    );
    assert_eq!(f.volume_contents(), [first.volume_id]);
}

#[tokio::test]
async fn create_volume_uses_the_default_size_and_respects_the_limit() {
    let mut f = Fixture::start().await;
    let v = f
        .controller
        .create_volume(create("default", 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        v.capacity_bytes,
        16 * MI,
        "no capacity range: the configured default"
    );
    let capped = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 0,
            limit_bytes: 4 * MI,
        }),
        ..create("capped", 0)
    };
    let v = f
        .controller
        .create_volume(capped)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        v.capacity_bytes,
        4 * MI,
        "the default is capped by limit_bytes"
    );
    let inverted = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 8 * MI,
            limit_bytes: 4 * MI,
        }),
        ..create("inverted", 0)
    };
    assert_status(
        f.controller.create_volume(inverted).await,
        Code::InvalidArgument,
        "capacity_range",
    );
}

#[tokio::test]
async fn capacity_is_checked_and_reported() {
    let mut f = Fixture::with(Options {
        capacity: 64 << 20,
        max_volume: 48 << 20,
        ..Default::default()
    })
    .await;
    let free = |r: csi::GetCapacityResponse| r.available_capacity;
    let before = free(
        f.controller
            .get_capacity(csi::GetCapacityRequest::default())
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(before, 64 * MI);
    assert_status(
        f.controller.create_volume(create("too-big", 49 * MI)).await,
        Code::OutOfRange,
        "maximum volume size",
    );
    f.controller
        .create_volume(create("a", 40 * MI))
        .await
        .unwrap();
    let after = f
        .controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.available_capacity, 24 * MI);
    assert_eq!(
        after.maximum_volume_size,
        Some(24 * MI),
        "no volume larger than what is free"
    );
    assert_status(
        f.controller.create_volume(create("b", 32 * MI)).await,
        Code::ResourceExhausted,
        "free",
    );
    let multi = csi::GetCapacityRequest {
        volume_capabilities: vec![mount_cap(Mode::MultiNodeMultiWriter)],
        ..Default::default()
    };
    assert_eq!(
        f.controller
            .get_capacity(multi)
            .await
            .unwrap()
            .into_inner()
            .available_capacity,
        0
    );
}

#[tokio::test]
async fn delete_volume_is_idempotent_and_removes_the_content() {
    let mut f = Fixture::start().await;
    let v = f
        .controller
        .create_volume(create("gone", MI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let delete = || csi::DeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    f.controller.delete_volume(delete()).await.unwrap();
    assert!(f.volume_contents().is_empty());
    f.controller
        .delete_volume(delete())
        .await
        .expect("deleting twice is OK");
    let unknown = csi::DeleteVolumeRequest {
        volume_id: "never-existed".into(),
        ..Default::default()
    };
    f.controller
        .delete_volume(unknown)
        .await
        .expect("an unknown id is already deleted");
    assert_status(
        f.controller
            .delete_volume(csi::DeleteVolumeRequest::default())
            .await,
        Code::InvalidArgument,
        "volume_id",
    );
}

#[tokio::test]
async fn delete_volume_in_use_fails_the_precondition() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("busy", MI)).await;
    let staging = f.kubelet_path("plugins/kubernetes.io/csi/local.inlet.dev/x/globalmount");
    f.node
        .node_stage_volume(stage(&id, &staging, rwo()))
        .await
        .unwrap();
    let delete = csi::DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    assert_status(
        f.controller.delete_volume(delete.clone()).await,
        Code::FailedPrecondition,
        "in use",
    );
    f.node
        .node_unstage_volume(unstage(&id, &staging))
        .await
        .unwrap();
    f.controller.delete_volume(delete).await.unwrap();
}

#[tokio::test]
async fn list_volumes_paginates_over_every_volume_once() {
    let mut f = Fixture::start().await;
    let mut created = Vec::new();
    for i in 0..5 {
        created.push(
            f.controller
                .create_volume(create(&format!("v{i}"), MI))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap()
                .volume_id,
        );
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = f
            .controller
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .into_iter()
                .map(|e| e.volume.unwrap().volume_id),
        );
        pages += 1;
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 3);
    created.sort();
    assert_eq!(seen, created);
    let all = f
        .controller
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!((all.entries.len(), all.next_token.as_str()), (5, ""));
    let bad_token = csi::ListVolumesRequest {
        max_entries: 1,
        starting_token: "not-a-token".into(),
    };
    assert_status(
        f.controller.list_volumes(bad_token).await,
        Code::Aborted,
        "starting_token",
    );
    let negative = csi::ListVolumesRequest {
        max_entries: -1,
        starting_token: String::new(),
    };
    assert_status(
        f.controller.list_volumes(negative).await,
        Code::InvalidArgument,
        "max_entries",
    );
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_only_what_the_volume_supports() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("v", MI)).await;
    let validate = |caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
        volume_id: id.clone(),
        volume_capabilities: caps,
        ..Default::default()
    };
    let ok = f
        .controller
        .validate_volume_capabilities(validate(vec![rwo()]))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some(), "{}", ok.message);
    let block = f
        .controller
        .validate_volume_capabilities(validate(vec![block_cap(Mode::SingleNodeWriter)]))
        .await
        .unwrap()
        .into_inner();
    assert!(
        block.confirmed.is_none() && block.message.contains("Mount volume"),
        "{}",
        block.message
    );
    let multi = f
        .controller
        .validate_volume_capabilities(validate(vec![mount_cap(Mode::MultiNodeReaderOnly)]))
        .await
        .unwrap()
        .into_inner();
    assert!(multi.confirmed.is_none() && multi.message.contains("MULTI_NODE_READER_ONLY"));
    assert_status(
        f.controller
            .validate_volume_capabilities(validate(vec![]))
            .await,
        Code::InvalidArgument,
        "volume_capabilities",
    );
    let unknown = csi::ValidateVolumeCapabilitiesRequest {
        volume_id: "nope".into(),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    };
    assert_status(
        f.controller.validate_volume_capabilities(unknown).await,
        Code::NotFound,
        "nope",
    );
}

#[tokio::test]
async fn expand_grows_never_shrinks_and_respects_the_maximum() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("grow", 4 * MI)).await;
    let expand = |bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = f
        .controller
        .controller_expand_volume(expand(8 * MI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (grown.capacity_bytes, grown.node_expansion_required),
        (8 * MI, false)
    );
    let same = f
        .controller
        .controller_expand_volume(expand(2 * MI))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        same.capacity_bytes,
        8 * MI,
        "a smaller request keeps the size"
    );
    assert_status(
        f.controller.controller_expand_volume(expand(GI)).await,
        Code::OutOfRange,
        "maximum",
    );
    let no_range = csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    assert_status(
        f.controller.controller_expand_volume(no_range).await,
        Code::InvalidArgument,
        "capacity_range",
    );
    let unknown = csi::ControllerExpandVolumeRequest {
        volume_id: "nope".into(),
        ..expand(8 * MI)
    };
    assert_status(
        f.controller.controller_expand_volume(unknown).await,
        Code::NotFound,
        "nope",
    );
    let listed = f
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.volume.unwrap().capacity_bytes, 8 * MI);
}

#[tokio::test]
async fn controller_publish_is_unimplemented_without_attach() {
    let mut f = Fixture::start().await;
    let id = f.create_volume_id(create("v", MI)).await;
    let req = csi::ControllerPublishVolumeRequest {
        volume_id: id,
        node_id: "node-1".into(),
        volume_capability: Some(rwo()),
        ..Default::default()
    };
    assert_status(
        f.controller.controller_publish_volume(req).await,
        Code::Unimplemented,
        "--enable-attach",
    );
}

#[tokio::test]
async fn controller_publish_attaches_to_this_node_idempotently() {
    let mut f = Fixture::with(Options {
        enable_attach: true,
        ..Default::default()
    })
    .await;
    let id = f.create_volume_id(create("v", MI)).await;
    let attach = |node: &str, readonly: bool| csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node.into(),
        volume_capability: Some(rwo()),
        readonly,
        ..Default::default()
    };
    f.controller
        .controller_publish_volume(attach("node-1", false))
        .await
        .unwrap();
    f.controller
        .controller_publish_volume(attach("node-1", false))
        .await
        .expect("repeat is OK");
    assert_status(
        f.controller
            .controller_publish_volume(attach("node-1", true))
            .await,
        Code::AlreadyExists,
        "readonly",
    );
    assert_status(
        f.controller
            .controller_publish_volume(attach("node-9", false))
            .await,
        Code::NotFound,
        "node-9",
    );
    let unknown = csi::ControllerPublishVolumeRequest {
        volume_id: "nope".into(),
        ..attach("node-1", false)
    };
    assert_status(
        f.controller.controller_publish_volume(unknown).await,
        Code::NotFound,
        "nope",
    );
    let no_node = attach("", false);
    assert_status(
        f.controller.controller_publish_volume(no_node).await,
        Code::InvalidArgument,
        "node_id",
    );

    let get = f
        .controller
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(get.status.unwrap().published_node_ids, ["node-1"]);
    let delete = csi::DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    };
    assert_status(
        f.controller.delete_volume(delete.clone()).await,
        Code::FailedPrecondition,
        "node-1",
    );

    let detach = csi::ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-1".into(),
        ..Default::default()
    };
    f.controller
        .controller_unpublish_volume(detach.clone())
        .await
        .unwrap();
    f.controller
        .controller_unpublish_volume(detach)
        .await
        .expect("repeat is OK");
    let unknown = csi::ControllerUnpublishVolumeRequest {
        volume_id: "nope".into(),
        node_id: "node-1".into(),
        ..Default::default()
    };
    f.controller
        .controller_unpublish_volume(unknown)
        .await
        .expect("unknown volume: already unpublished");
    f.controller.delete_volume(delete).await.unwrap();
}
