//! generic-ephemeral/*: a generic ephemeral volume (`volumes[].ephemeral.volumeClaimTemplate`), e2e
//! `testsuites/ephemeral.go` with the GenericEphemeralVolume patterns: the claim `<pod>-<volume>` the
//! ephemeral-volume controller makes, provisioned through the driver (CreateVolume), bound, staged and
//! published as any PV, and deleted with its pod (the garbage collector, then DeleteVolume under the
//! class's `reclaimPolicy: Delete`).

use super::persistent::first_ok;
use super::*;
use k8s_openapi::api::storage::v1::StorageClass;

/// The generic-ephemeral/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "generic-ephemeral/lifecycle",
        expects: "two pods with the same generic ephemeral volume template (a WaitForFirstConsumer class \
                  of the driver) each get a claim <pod>-<volume> they own, provisioned with CreateVolume \
                  (pvc-<claim uid>), bound, and a read/write volume of their own; deleting the pods deletes \
                  the claims, the volumes (DeleteVolume) and the PVs, and leaves nothing",
        source: "e2e testsuites/ephemeral.go (\"Generic Ephemeral-volume (default fs) (late-binding)\": \
                 \"should create read/write inline ephemeral volume\", \"should support two pods which have \
                 the same volume definition\"); pkg/controller/volume/ephemeral; external-provisioner \
                 controller.go; desired_state_of_world_populator.go (VolumeIsForPod)",
        applies: persistent,
        run: |env| Box::pin(lifecycle(env)),
    }]
}

async fn lifecycle(env: &mut CheckEnv) -> Outcome {
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "conform-class"},
        "provisioner": env.conf.setup.name(),
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .map_err(|e| e.to_string())?;
    env.create(vec![Object::StorageClass(Box::new(class))])
        .await?;
    let pods = ["first", "second"].map(|name| {
        let mut pod = env.pod(name, &[], json!({}));
        let spec = pod.spec.get_or_insert_with(Default::default);
        spec.volumes = serde_json::from_value(
            json!([{"name": "data", "ephemeral": {"volumeClaimTemplate": {
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "conform-class",
                     "resources": {"requests": {"storage": "16Mi"}}}}}}]),
        )
        .ok();
        if let Some(container) = spec.containers.first_mut() {
            container.volume_mounts =
                serde_json::from_value(json!([{"name": "data", "mountPath": "/mnt/data"}])).ok();
        }
        pod
    });
    env.run_pods(pods.into()).await?;
    let mut handles = Vec::new();
    for pod in ["first", "second"] {
        let claim_name = format!("{pod}-data");
        let claim = env
            .sim()?
            .api
            .peek::<PersistentVolumeClaim>(NAMESPACE, &claim_name)
            .ok_or_else(|| format!("no claim {claim_name}"))?;
        let owned = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Pod" && o.controller == Some(true) && o.uid == env.uid(pod));
        if !owned {
            return Err(format!(
                "the claim {claim_name} is not controlled by pod {pod}"
            ));
        }
        let pv_name = format!("pvc-{}", claim.metadata.uid.clone().unwrap_or_default());
        let created = env
            .calls()
            .into_iter()
            .any(|c| c.method == "CreateVolume" && c.volume_id == pv_name && c.code == "OK");
        if !created {
            return Err(format!("no successful CreateVolume named {pv_name}"));
        }
        let pv = env
            .sim()?
            .api
            .peek::<PersistentVolume>("", &pv_name)
            .ok_or_else(|| format!("no PV {pv_name}"))?;
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone());
        let handle = handle.ok_or_else(|| format!("PV {pv_name} has no CSI source"))?;
        if first_ok(&env.calls(), "NodePublishVolume", &handle).is_none() {
            return Err(format!(
                "the volume {handle} of pod {pod} was never published"
            ));
        }
        handles.push(handle);
    }
    if handles[0] == handles[1] {
        return Err(format!("both pods got volume {}", handles[0]));
    }
    if env.conf.mounter.1 {
        let target = |pod: &str| {
            env.node_root()
                .join("pods")
                .join(env.uid(pod))
                .join("volumes/kubernetes.io~csi")
        };
        for pod in ["first", "second"] {
            let dirs = std::fs::read_dir(target(pod)).map_err(|e| e.to_string())?;
            for dir in dirs.flatten() {
                try_write(&dir.path().join("mount"))
                    .map_err(|e| format!("pod {pod}'s volume refuses writes: {e}"))?;
            }
        }
    }
    env.delete(&["first", "second"]).await?;
    let gone = |env: &CheckEnv| {
        env.sim().is_ok_and(|sim| {
            sim.api.list::<PersistentVolume>().is_empty()
                && sim.api.list::<PersistentVolumeClaim>().is_empty()
        })
    };
    if !env.until(gone).await {
        return Err(format!(
            "claims or PVs left after the pods: {:?}",
            env.sim()?
                .api
                .list::<PersistentVolume>()
                .iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
        ));
    }
    let deleted = |handle: &String| {
        env.calls()
            .iter()
            .any(|c| c.method == "DeleteVolume" && &c.volume_id == handle && c.code == "OK")
    };
    if let Some(handle) = handles.iter().find(|h| !deleted(h)) {
        return Err(format!("no successful DeleteVolume of {handle}"));
    }
    env.nothing_left(&handles).await?;
    Ok(deletion_note(env))
}
