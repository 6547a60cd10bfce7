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

/// Creates a 16 MiB mount volume through the driver's controller; returns its id and context.
pub(super) async fn create_volume(env: &CheckEnv, name: &str) -> Result<csi::Volume, String> {
    let mut controller = env.controller().await?;
    let request = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability()],
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

/// A PV of the created volume, a claim bound to it, and pods using the claim; runs the pods.
pub(super) async fn run_on_pv(
    env: &mut CheckEnv,
    volume: &csi::Volume,
    pods: &[&str],
) -> Result<(), String> {
    let driver = env.conf.setup.name().to_string();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "conform-pv"},
        "spec": {
            "capacity": {"storage": "16Mi"},
            "accessModes": ["ReadWriteOnce"],
            "claimRef": {"name": "conform-claim", "namespace": NAMESPACE},
            "csi": {"driver": driver, "volumeHandle": volume.volume_id,
                    "volumeAttributes": volume.volume_context},
        },
    }))
    .map_err(|e| e.to_string())?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "conform-claim", "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "conform-pv",
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
                let mut pod = env.pod(name, &[], json!({}));
                let spec = pod.spec.get_or_insert_with(Default::default);
                spec.volumes =
                    Some(vec![serde_json::from_value(json!(
                {"name": "data", "persistentVolumeClaim": {"claimName": "conform-claim"}}
            ))
            .unwrap_or_default()]);
                if let Some(container) = spec.containers.first_mut() {
                    container.volume_mounts = Some(vec![
                        serde_json::from_value(json!(
                            {"name": "data", "mountPath": "/mnt/data"}
                        ))
                        .unwrap_or_default(),
                    ]);
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
    let volume = create_volume(env, "conform-stage-publish").await?;
    let outcome = stage_publish_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

pub(super) async fn stage_publish_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["staged"]).await?;
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
    let volume = create_volume(env, "conform-shared-staging").await?;
    let outcome = shared_staging_on(env, &volume).await;
    let deleted = delete_volume(env, &volume.volume_id).await;
    outcome.and_then(|note| deleted.map(|()| note))
}

pub(super) async fn shared_staging_on(env: &mut CheckEnv, volume: &csi::Volume) -> Outcome {
    let handle = volume.volume_id.as_str();
    run_on_pv(env, volume, &["first", "second"]).await?;
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
