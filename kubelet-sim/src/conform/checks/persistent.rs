//! persistent/*: PVs of the driver (made with CreateVolume): attach, stage, publish, shared staging.

use super::*;

/// The persistent/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![
        Check {
            id: "persistent/stage-publish",
            expects: "a PV of the driver is attached (ControllerPublishVolume when the CSIDriver requires \
                  attach and the driver has PUBLISH_UNPUBLISH_VOLUME), staged, then published with that \
                  staging path; on deletion unpublished before it is unstaged",
            source: "operation_generator.go (MountDevice before SetUp, UnmountDevice after the last \
                 TearDown); csi_attacher.go MountDevice; external-attacher main.go (a trivial handler \
                 for a driver without ControllerPublishUnpublish); CSI spec, Volume Lifecycle",
            applies: persistent,
            run: |env| Box::pin(persistent::stage_publish(env)),
        },
        Check {
            id: "persistent/raw-block",
            expects: "a PV of volumeMode: Block is staged (with STAGE_UNSTAGE_VOLUME) and published with the \
                      Block access type at csi_block.go's paths (volumeDevices/staging/<pv>, \
                      volumeDevices/publish/<pv>/<pod uid>), the pod gets it as a device, and its deletion \
                      unpublishes, then unstages, leaving nothing",
            source: "csi_block.go (SetUpDevice, MapPodDevice, getStagingPath, getPublishPath); e2e \
                     testsuites/volumemode.go; --testdriver Capabilities.block",
            applies: |c| {
                persistent(c)?;
                match c.declares("block") {
                    true => Ok(()),
                    false => Err("--testdriver does not declare the block capability".into()),
                }
            },
            run: |env| Box::pin(persistent::raw_block(env)),
        },
        Check {
            id: "persistent/shared-staging",
            expects: "two pods using one PV on a node share one NodeStageVolume; it is unstaged only after \
                  the second pod's unpublish",
            source: "operation_generator.go GenerateUnmountDeviceFunc (unmounted once no pod uses the \
                 device); csi_attacher.go",
            applies: |c| {
                persistent(c)?;
                if !c.info.node_has("STAGE_UNSTAGE_VOLUME") {
                    return Err("the driver does not advertise STAGE_UNSTAGE_VOLUME".into());
                }
                // Without it the kubelet sends SINGLE_NODE_WRITER, and the CSI spec lets a driver refuse
                // a second target path (FAILED_PRECONDITION).
                if !c.info.node_has("SINGLE_NODE_MULTI_WRITER") {
                    return Err("the driver does not advertise SINGLE_NODE_MULTI_WRITER".into());
                }
                Ok(())
            },
            run: |env| Box::pin(persistent::shared_staging(env)),
        },
    ]
}

/// Creates a 16 MiB volume (a filesystem, or a raw `block` device) through the driver's controller;
/// returns its id and context.
pub(super) async fn create_volume(
    env: &CheckEnv,
    name: &str,
    block: bool,
) -> Result<csi::Volume, String> {
    let mut controller = env.controller().await?;
    let mut capability = mount_capability();
    if block {
        capability.access_type =
            Some(csi::volume_capability::AccessType::Block(Default::default()));
    }
    let request = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability],
        ..Default::default()
    };
    controller
        .create_volume(request)
        .await
        .map_err(|s| format!("CreateVolume: {} {}", s.code(), s.message()))?
        .into_inner()
        .volume
        .ok_or_else(|| "CreateVolume returned no volume".into())
}

pub(super) async fn delete_volume(env: &CheckEnv, id: &str) -> Result<(), String> {
    let mut controller = env.controller().await?;
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.to_string(),
            secrets: Default::default(),
        })
        .await
        .map_err(|s| format!("DeleteVolume {id}: {} {}", s.code(), s.message()))?;
    Ok(())
}

pub(super) fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    }
}

/// A PV of the created volume with the one access mode `access_mode`, a claim bound to it, and pods
/// (with `pod_spec` merged into their spec) using the claim (as a filesystem at `/mnt/data`, or as the raw
/// `block` device `/dev/xvda`); runs the pods.
pub(super) async fn run_on_pv(
    env: &mut CheckEnv,
    volume: &csi::Volume,
    pods: &[&str],
    block: bool,
    access_mode: &str,
    pod_spec: serde_json::Value,
) -> Result<(), String> {
    let driver = env.conf.setup.name().to_string();
    let mode = if block { "Block" } else { "Filesystem" };
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "conform-pv"},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "volumeMode": mode,
            "accessModes": [access_mode],
            "claimRef": {"name": "conform-claim", "namespace": NAMESPACE},
            "csi": {"driver": driver, "volumeHandle": volume.volume_id,
                    "volumeAttributes": volume.volume_context},
        },
    }))
    .map_err(|e| e.to_string())?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "conform-claim", "namespace": NAMESPACE},
        "spec": {"accessModes": [access_mode], "volumeName": "conform-pv", "volumeMode": mode,
                 "resources": {"requests": {"storage": "16Mi"}}},
    }))
    .map_err(|e| e.to_string())?;
    env.create(vec![
        Object::PersistentVolume(Box::new(pv)),
        Object::PersistentVolumeClaim(Box::new(claim)),
    ])
    .await?;
    let pods =
        pods.iter()
            .map(|name| {
                let mut pod = env.pod(name, &[], pod_spec.clone());
                let spec = pod.spec.get_or_insert_with(Default::default);
                spec.volumes =
                    Some(vec![serde_json::from_value(json!(
                {"name": "data", "persistentVolumeClaim": {"claimName": "conform-claim"}}
            ))
            .unwrap_or_default()]);
                if let Some(container) = spec.containers.first_mut() {
                    match block {
                        true => {
                            container.volume_devices = Some(vec![
                                serde_json::from_value(json!(
                                    {"name": "data", "devicePath": "/dev/xvda"}
                                ))
                                .unwrap_or_default(),
                            ])
                        }
                        false => {
                            container.volume_mounts = Some(vec![
                                serde_json::from_value(json!(
                                    {"name": "data", "mountPath": "/mnt/data"}
                                ))
                                .unwrap_or_default(),
                            ])
                        }
                    }
                }
                pod
            })
            .collect();
    env.run_pods(pods).await
}

/// The position of the first call of `method` for `handle` that was answered OK.
pub(super) fn first_ok(calls: &[CsiCall], method: &str, handle: &str) -> Option<usize> {
    calls
        .iter()
        .position(|c| c.method == method && c.volume_id == handle && c.code == "OK")
}

/// The position of the last call of `method` for `handle` that was answered OK.
pub(super) fn last_ok(calls: &[CsiCall], method: &str, handle: &str) -> Option<usize> {
    calls
        .iter()
        .rposition(|c| c.method == method && c.volume_id == handle && c.code == "OK")
}

pub(super) async fn stage_publish(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-stage-publish", false).await?;
    let outcome = stage_publish_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

pub(super) async fn stage_publish_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["staged"], false, "ReadWriteOnce", json!({})).await?;
    let calls = env.calls();
    let published = first_ok(&calls, "NodePublishVolume", handle);
    let publish = &calls[published.ok_or("no successful NodePublishVolume")?];
    // Attach is required unless the CSIDriver says otherwise; external-attacher calls
    // ControllerPublishVolume only for a driver with PUBLISH_UNPUBLISH_VOLUME (else it marks the
    // VolumeAttachment attached itself).
    if env.conf.info.csi_driver.spec.attach_required != Some(false)
        && env.conf.info.controller_has("PUBLISH_UNPUBLISH_VOLUME")
    {
        let attached = first_ok(&calls, "ControllerPublishVolume", handle);
        if attached.is_none() || attached > published {
            return Err(
                "NodePublishVolume came before a successful ControllerPublishVolume".into(),
            );
        }
    }
    let staging = env.conf.info.node_has("STAGE_UNSTAGE_VOLUME");
    if staging {
        let staged = first_ok(&calls, "NodeStageVolume", handle);
        let Some(stage) = staged.map(|i| &calls[i]) else {
            return Err("a driver with STAGE_UNSTAGE_VOLUME was never staged".into());
        };
        if staged > published || publish.staging_path != stage.staging_path {
            return Err(format!(
                "NodePublishVolume's staging path {:?} is not the staged {:?}",
                publish.staging_path, stage.staging_path
            ));
        }
    }
    env.delete(&["staged"]).await?;
    env.nothing_left(&[]).await?;
    let calls = env.calls();
    if staging {
        let unpublished = last_ok(&calls, "NodeUnpublishVolume", handle);
        let unstaged = last_ok(&calls, "NodeUnstageVolume", handle);
        if unstaged.is_none() || unstaged < unpublished {
            return Err("the volume was not unstaged after its unpublish".into());
        }
    }
    Ok(String::new())
}

pub(super) async fn shared_staging(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-shared-staging", false).await?;
    let outcome = shared_staging_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

pub(super) async fn shared_staging_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(
        env,
        volume,
        &["first", "second"],
        false,
        "ReadWriteOnce",
        json!({}),
    )
    .await?;
    let count = |env: &CheckEnv, method: &str| {
        env.calls()
            .iter()
            .filter(|c| c.method == method && c.volume_id == handle && c.code == "OK")
            .count()
    };
    if count(env, "NodeStageVolume") != 1 || count(env, "NodePublishVolume") != 2 {
        return Err(format!(
            "two pods made {} NodeStageVolume and {} NodePublishVolume, expected 1 and 2",
            count(env, "NodeStageVolume"),
            count(env, "NodePublishVolume")
        ));
    }
    env.delete(&["first"]).await?;
    if count(env, "NodeUnstageVolume") != 0 {
        return Err("the volume was unstaged while the second pod still used it".into());
    }
    env.delete(&["second"]).await?;
    env.nothing_left(&[]).await?;
    if count(env, "NodeUnstageVolume") != 1 {
        return Err("the volume was not unstaged after the last pod".into());
    }
    Ok(String::new())
}

pub(super) async fn raw_block(env: &mut CheckEnv) -> Outcome {
    let volume = create_volume(env, "conform-raw-block", true).await?;
    let outcome = raw_block_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

async fn raw_block_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["block"], true, "ReadWriteOnce", json!({})).await?;
    let devices = env
        .node_root()
        .join("plugins/kubernetes.io/csi/volumeDevices");
    let publish_path = devices.join("publish/conform-pv").join(env.uid("block"));
    let calls = env.calls();
    let publish = &calls
        [first_ok(&calls, "NodePublishVolume", handle).ok_or("no successful NodePublishVolume")?];
    if publish.access_type != "Block" || publish.target_path != publish_path.display().to_string() {
        return Err(format!(
            "NodePublishVolume was {} at {}, expected Block at {}",
            publish.access_type,
            publish.target_path,
            publish_path.display()
        ));
    }
    if env.conf.info.node_has("STAGE_UNSTAGE_VOLUME") {
        let staging = devices.join("staging/conform-pv").display().to_string();
        let stage = first_ok(&calls, "NodeStageVolume", handle).map(|i| &calls[i]);
        if stage.is_none_or(|s| s.access_type != "Block" || s.staging_path != staging) {
            return Err(format!("no Block NodeStageVolume at {staging}"));
        }
    }
    let device = env
        .node_root()
        .join("pods")
        .join(env.uid("block"))
        .join("volumeDevices/kubernetes.io~csi/conform-pv");
    match std::fs::read_link(&device) {
        Ok(to) if to == publish_path => {}
        Ok(to) => {
            return Err(format!(
                "the pod's device {} points at {}",
                device.display(),
                to.display()
            ));
        }
        Err(e) => return Err(format!("the pod's device {}: {e}", device.display())),
    }
    env.delete(&["block"]).await?;
    env.nothing_left(&[]).await?;
    let calls = env.calls();
    if env.conf.info.node_has("STAGE_UNSTAGE_VOLUME")
        && last_ok(&calls, "NodeUnstageVolume", handle)
            < last_ok(&calls, "NodeUnpublishVolume", handle)
    {
        return Err("the volume was not unstaged after its unpublish".into());
    }
    Ok(String::new())
}
