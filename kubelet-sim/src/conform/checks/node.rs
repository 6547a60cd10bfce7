//! node/*: the Node service call by call, for every driver, a node-only one included: csi-sanity's node
//! suite creates its volumes with CreateVolume, so it cannot test a driver without a controller
//! (kubernetes-csi/csi-test#214, #595). These checks publish their own volume as the kubelet publishes an
//! inline one, and ask for what the CSI spec requires of each RPC: its required fields refused with
//! INVALID_ARGUMENT, idempotence, and the target path left as it was found.

use std::collections::HashMap;

use super::*;
use inlet_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use tonic::Code;

/// The node/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "node/get-info",
            expects: "NodeGetInfo answers a node_id (the kubelet stores it in CSINode and the Node's \
                      csi.volume.kubernetes.io/nodeid annotation) and max_volumes_per_node is not negative",
            source: "CSI spec, NodeGetInfo (\"node_id ... This field is REQUIRED\"); \
                     nodeinfomanager.go InstallCSIDriver",
            applies: |_| Ok(()),
            run: |env| Box::pin(get_info(env)),
        },
        Check {
            id: "node/get-capabilities",
            expects: "NodeGetCapabilities answers only capabilities the CSI spec defines",
            source: "CSI spec, NodeGetCapabilities; csi_client.go (the kubelet asks for it before it \
                     stages, mounts a group or reads stats)",
            applies: |_| Ok(()),
            run: |env| Box::pin(get_capabilities(env)),
        },
        Check {
            id: "node/publish-required-fields",
            expects: "NodePublishVolume without volume_id, without target_path, or without \
                      volume_capability is refused with INVALID_ARGUMENT, and nothing is mounted",
            source: "CSI spec, NodePublishVolume (REQUIRED fields) and Error Scheme; csi-sanity node.go \
                     \"should fail when no volume id is provided\" and the like",
            applies: |_| Ok(()),
            run: |env| Box::pin(publish_required_fields(env)),
        },
        Check {
            id: "node/unpublish-required-fields",
            expects: "NodeUnpublishVolume without volume_id or without target_path is refused with \
                      INVALID_ARGUMENT",
            source: "CSI spec, NodeUnpublishVolume (REQUIRED fields) and Error Scheme",
            applies: |_| Ok(()),
            run: |env| Box::pin(unpublish_required_fields(env)),
        },
        Check {
            id: "node/publish-unpublish-idempotent",
            expects: "an inline volume published twice with the same request is answered OK twice and \
                      mounted once; unpublished twice, OK, then OK or NOT_FOUND (noted: the kubelet \
                      retries NOT_FOUND, kubernetes#90752); the target path is gone afterwards",
            source: "CSI spec, Idempotency, NodePublishVolume (\"already published at the specified \
                     target_path\": OK), NodeUnpublishVolume (\"MUST delete the file or directory it \
                     created\")",
            applies: ephemeral,
            run: |env| Box::pin(publish_unpublish_idempotent(env)),
        },
        Check {
            id: "node/stage-required-fields",
            expects: "NodeStageVolume without volume_id, staging_target_path or volume_capability, and \
                      NodeUnstageVolume without volume_id or staging_target_path, are refused with \
                      INVALID_ARGUMENT",
            source: "CSI spec, NodeStageVolume and NodeUnstageVolume (REQUIRED fields)",
            applies: |c| match c.info.node_has("STAGE_UNSTAGE_VOLUME") {
                true => Ok(()),
                false => Err("the driver does not advertise STAGE_UNSTAGE_VOLUME".into()),
            },
            run: |env| Box::pin(stage_required_fields(env)),
        },
        Check {
            id: "node/get-volume-stats",
            expects: "NodeGetVolumeStats on a published volume answers its usage; without volume_id or \
                      volume_path it answers INVALID_ARGUMENT, for a path where nothing is published \
                      NOT_FOUND",
            source: "CSI spec, NodeGetVolumeStats (REQUIRED fields, \"Volume does not exist\": NOT_FOUND); \
                     metrics_csi.go (the kubelet's stats provider)",
            applies: |c| {
                ephemeral(c)?;
                match c.info.node_has("GET_VOLUME_STATS") {
                    true => Ok(()),
                    false => Err("the driver does not advertise GET_VOLUME_STATS".into()),
                }
            },
            run: |env| Box::pin(get_volume_stats(env)),
        },
    ]
}

/// The volume the node checks publish: its id and target, where the kubelet would put an inline one.
struct Published {
    request: csi::NodePublishVolumeRequest,
    target: PathBuf,
}

use std::path::PathBuf;

/// A NodePublishVolumeRequest for an inline volume as the kubelet makes it (ephemeral, with pod info when
/// the CSIDriver asks for it), its target's parent created as the kubelet creates it.
fn inline_request(env: &CheckEnv, name: &str) -> Result<Published, String> {
    let dir = env
        .node_root()
        .join("pods/conform-node-calls/volumes/kubernetes.io~csi")
        .join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let target = dir.join("mount");
    let mut context: HashMap<String, String> =
        env.conf.inline(0).attributes.clone().into_iter().collect();
    if env.conf.info.csi_driver.spec.pod_info_on_mount == Some(true) {
        for (key, value) in [
            ("pod.name", "conform-node-calls"),
            ("pod.namespace", NAMESPACE),
            ("pod.uid", "conform-node-calls"),
            ("serviceAccount.name", "default"),
            ("ephemeral", "true"),
        ] {
            context.insert(format!("csi.storage.k8s.io/{key}"), value.into());
        }
    }
    let request = csi::NodePublishVolumeRequest {
        volume_id: format!("csi-conform-{name}"),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_capability()),
        readonly: false,
        volume_context: context,
        ..Default::default()
    };
    Ok(Published { request, target })
}

fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

/// Fails unless `answer` is an error with `code`; `what` names the request.
fn expect_code<T>(what: &str, answer: Result<T, tonic::Status>, code: Code) -> Result<(), String> {
    match answer {
        Err(status) if status.code() == code => Ok(()),
        Err(status) => Err(format!(
            "{what}: {:?} ({}), expected {code:?}",
            status.code(),
            status.message()
        )),
        Ok(_) => Err(format!("{what}: OK, expected {code:?}")),
    }
}

/// Passes with no failures, else fails with them all.
fn verdict(failed: Vec<String>) -> Outcome {
    match failed.is_empty() {
        true => Ok(String::new()),
        false => Err(failed.join("; ")),
    }
}

/// Removes the parent directories `inline_request` made (the driver owns the target itself).
fn remove_calls_dir(env: &CheckEnv) {
    let _ = std::fs::remove_dir_all(env.node_root().join("pods/conform-node-calls"));
}

async fn get_info(env: &mut CheckEnv) -> Outcome {
    let info = env
        .node()
        .await?
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .map_err(|s| format!("NodeGetInfo: {:?} ({})", s.code(), s.message()))?
        .into_inner();
    if info.node_id.is_empty() {
        return Err("NodeGetInfo answered an empty node_id".into());
    }
    if info.max_volumes_per_node < 0 {
        return Err(format!(
            "max_volumes_per_node is {}",
            info.max_volumes_per_node
        ));
    }
    Ok(String::new())
}

async fn get_capabilities(env: &mut CheckEnv) -> Outcome {
    use csi::node_service_capability::{Rpc, Type, rpc::Type as RpcType};
    let answer = env
        .node()
        .await?
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .map_err(|s| format!("NodeGetCapabilities: {:?} ({})", s.code(), s.message()))?
        .into_inner();
    for capability in answer.capabilities {
        match capability.r#type {
            Some(Type::Rpc(Rpc { r#type })) => match RpcType::try_from(r#type) {
                Ok(RpcType::Unknown) | Err(_) => {
                    return Err(format!(
                        "an RPC capability the spec does not define: {type}"
                    ));
                }
                Ok(_) => {}
            },
            None => return Err("a capability without a type".into()),
        }
    }
    Ok(String::new())
}

async fn publish_required_fields(env: &mut CheckEnv) -> Outcome {
    let base = inline_request(env, "required")?;
    let mut node = env.node().await?;
    let cases = [
        (
            "without volume_id",
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..base.request.clone()
            },
        ),
        (
            "without target_path",
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..base.request.clone()
            },
        ),
        (
            "without volume_capability",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..base.request.clone()
            },
        ),
    ];
    let mut failed = Vec::new();
    for (what, request) in cases {
        let answer = node.node_publish_volume(request).await;
        failed.extend(
            expect_code(
                &format!("NodePublishVolume {what}"),
                answer,
                Code::InvalidArgument,
            )
            .err(),
        );
    }
    let mounted = env.conf.mounter.1 && mounts_at(&base.target) > 0;
    // Whatever a wrong answer published goes again.
    let _ = node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: base.request.volume_id.clone(),
            target_path: base.request.target_path.clone(),
        })
        .await;
    remove_calls_dir(env);
    if mounted {
        failed.push(format!("{} was mounted", base.target.display()));
    }
    verdict(failed)
}

async fn unpublish_required_fields(env: &mut CheckEnv) -> Outcome {
    let mut node = env.node().await?;
    let target = env
        .node_root()
        .join("pods/conform-node-calls/volumes/kubernetes.io~csi/none/mount");
    let cases = [
        (
            "without volume_id",
            String::new(),
            target.display().to_string(),
        ),
        (
            "without target_path",
            "csi-conform-none".to_string(),
            String::new(),
        ),
    ];
    let mut failed = Vec::new();
    for (what, volume_id, target_path) in cases {
        let answer = node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id,
                target_path,
            })
            .await;
        failed.extend(
            expect_code(
                &format!("NodeUnpublishVolume {what}"),
                answer,
                Code::InvalidArgument,
            )
            .err(),
        );
    }
    verdict(failed)
}

async fn publish_unpublish_idempotent(env: &mut CheckEnv) -> Outcome {
    let published = inline_request(env, "idempotent")?;
    let mut node = env.node().await?;
    for attempt in ["first", "second"] {
        node.node_publish_volume(published.request.clone())
            .await
            .map_err(|s| {
                format!(
                    "the {attempt} NodePublishVolume: {:?} ({})",
                    s.code(),
                    s.message()
                )
            })?;
    }
    let target = &published.target;
    let mounts = mounts_at(target);
    // A driver may publish without mounting (a populated directory), never mount twice.
    if env.conf.mounter.1 && mounts > 1 {
        return Err(format!(
            "published twice, {} is mounted {mounts} times",
            target.display()
        ));
    }
    let unpublish = csi::NodeUnpublishVolumeRequest {
        volume_id: published.request.volume_id.clone(),
        target_path: published.request.target_path.clone(),
    };
    node.node_unpublish_volume(unpublish.clone())
        .await
        .map_err(|s| format!("NodeUnpublishVolume: {:?} ({})", s.code(), s.message()))?;
    let note = match node.node_unpublish_volume(unpublish).await {
        Ok(_) => String::new(),
        Err(s) if s.code() == Code::NotFound => {
            "note: the repeated NodeUnpublishVolume answered NOT_FOUND, which the spec allows and the \
             kubelet retries for ever (kubernetes#90752)"
                .into()
        }
        Err(s) => {
            return Err(format!("the repeated NodeUnpublishVolume: {:?} ({})", s.code(), s.message()));
        }
    };
    let left = target.exists();
    remove_calls_dir(env);
    if left {
        return Err(format!(
            "{} is still there after NodeUnpublishVolume",
            target.display()
        ));
    }
    Ok(note)
}

async fn stage_required_fields(env: &mut CheckEnv) -> Outcome {
    let mut node = env.node().await?;
    let staging = env
        .node_root()
        .join("plugins/kubernetes.io/csi/conform/globalmount");
    let base = csi::NodeStageVolumeRequest {
        volume_id: "csi-conform-stage".into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_capability()),
        ..Default::default()
    };
    let stages = [
        (
            "without volume_id",
            csi::NodeStageVolumeRequest {
                volume_id: String::new(),
                ..base.clone()
            },
        ),
        (
            "without staging_target_path",
            csi::NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..base.clone()
            },
        ),
        (
            "without volume_capability",
            csi::NodeStageVolumeRequest {
                volume_capability: None,
                ..base.clone()
            },
        ),
    ];
    let mut failed = Vec::new();
    for (what, request) in stages {
        let answer = node.node_stage_volume(request).await;
        failed.extend(
            expect_code(
                &format!("NodeStageVolume {what}"),
                answer,
                Code::InvalidArgument,
            )
            .err(),
        );
    }
    let unstages = [
        (
            "without volume_id",
            String::new(),
            base.staging_target_path.clone(),
        ),
        (
            "without staging_target_path",
            base.volume_id.clone(),
            String::new(),
        ),
    ];
    for (what, volume_id, staging_target_path) in unstages {
        let answer = node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id,
                staging_target_path,
            })
            .await;
        failed.extend(
            expect_code(
                &format!("NodeUnstageVolume {what}"),
                answer,
                Code::InvalidArgument,
            )
            .err(),
        );
    }
    verdict(failed)
}

async fn get_volume_stats(env: &mut CheckEnv) -> Outcome {
    let published = inline_request(env, "stats")?;
    let mut node = env.node().await?;
    node.node_publish_volume(published.request.clone())
        .await
        .map_err(|s| format!("NodePublishVolume: {:?} ({})", s.code(), s.message()))?;
    let volume_id = published.request.volume_id.clone();
    let path = published.request.target_path.clone();
    let stats = |volume_id: &str, volume_path: &str| csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: volume_path.into(),
        staging_target_path: String::new(),
    };
    let mut failed = Vec::new();
    match node.node_get_volume_stats(stats(&volume_id, &path)).await {
        Ok(answer) if answer.get_ref().usage.is_empty() => {
            failed.push("NodeGetVolumeStats answered no usage".to_string())
        }
        Ok(_) => {}
        Err(s) => failed.push(format!(
            "NodeGetVolumeStats: {:?} ({})",
            s.code(),
            s.message()
        )),
    }
    let elsewhere = env.node_root().join("pods/conform-node-calls/nothing-here");
    let cases = [
        ("without volume_id", stats("", &path), Code::InvalidArgument),
        (
            "without volume_path",
            stats(&volume_id, ""),
            Code::InvalidArgument,
        ),
        (
            "for a path where nothing is published",
            stats(&volume_id, &elsewhere.display().to_string()),
            Code::NotFound,
        ),
    ];
    for (what, request, code) in cases {
        let answer = node.node_get_volume_stats(request).await;
        failed.extend(expect_code(&format!("NodeGetVolumeStats {what}"), answer, code).err());
    }
    let unpublished = node
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id,
            target_path: path,
        })
        .await;
    remove_calls_dir(env);
    if let Err(s) = unpublished {
        failed.push(format!(
            "NodeUnpublishVolume: {:?} ({})",
            s.code(),
            s.message()
        ));
    }
    verdict(failed)
}
