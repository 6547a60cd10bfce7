//! expansion/*: a PV grown while its pod uses it (e2e `testsuites/volume_expand.go`, "should resize volume
//! when PVC is edited while pod is using it"): the external-resizer's ControllerExpandVolume (kubelet-sim
//! runs it), then the kubelet's NodeExpandVolume at the pod's mount path, and the claim's status capacity.

use super::persistent::first_ok;
use super::*;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The expansion/* checks.
pub(super) fn checks() -> Vec<Check> {
    vec![Check {
        id: "expansion/online",
        expects: "a claim of a class with allowVolumeExpansion, grown by 1Gi while its pod runs, \
                  is expanded: ControllerExpandVolume when the driver expands in the controller, \
                  NodeExpandVolume at the pod's mount path when it expands on the node, both answered OK; \
                  the claim's status capacity reaches the request, its FileSystemResizePending condition goes, \
                  and the pod keeps running",
        source: "e2e testsuites/volume_expand.go; external-resizer controller.go; operation_generator.go \
                 GenerateExpandInUseVolumeFunc; csi_expander.go NodeExpand",
        applies: |c| {
            persistent(c)?;
            if c.testdriver.is_some() && !c.declares("onlineExpansion") {
                return Err("--testdriver does not declare onlineExpansion".into());
            }
            match c.info.controller_has("EXPAND_VOLUME") || c.info.node_has("EXPAND_VOLUME") {
                true => Ok(()),
                false => Err("the driver advertises no EXPAND_VOLUME".into()),
            }
        },
        run: |env| Box::pin(online(env)),
    }]
}

/// How much the claim grows, as e2e (`volume_expand.go`: the current size and 1Gi).
const GROWTH: u64 = 1 << 30;

async fn online(env: &mut CheckEnv) -> Outcome {
    let objects = serde_json::from_value::<StorageClass>(json!({
        "metadata": {"name": "conform-class"},
        "provisioner": env.conf.setup.name(),
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true,
    }))
    .map(|c| Object::StorageClass(Box::new(c)));
    let claim = serde_json::from_value::<PersistentVolumeClaim>(json!({
        "metadata": {"name": "conform-claim", "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "conform-class",
                 "resources": {"requests": {"storage": "16Mi"}}},
    }))
    .map(|c| Object::PersistentVolumeClaim(Box::new(c)));
    env.create(vec![
        objects.map_err(|e| e.to_string())?,
        claim.map_err(|e| e.to_string())?,
    ])
    .await?;
    let mut pod = env.pod("grown", &[], json!({}));
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.volumes = serde_json::from_value(json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": "conform-claim"}}
    ]))
    .ok();
    if let Some(container) = spec.containers.first_mut() {
        container.volume_mounts =
            serde_json::from_value(json!([{"name": "data", "mountPath": "/mnt/data"}])).ok();
    }
    env.run_pods(vec![pod]).await?;
    let claim = |env: &CheckEnv| {
        env.sim()
            .ok()?
            .api
            .peek::<PersistentVolumeClaim>(NAMESPACE, "conform-claim")
    };
    let pv_name = claim(env)
        .and_then(|c| c.spec.as_ref()?.volume_name.clone())
        .ok_or("the claim is not bound")?;
    let bytes = |c: &PersistentVolumeClaim| {
        let status = c.status.as_ref()?;
        crate::controllers::resizer::storage_bytes(status.capacity.as_ref())
    };
    let grown = claim(env)
        .and_then(|c| bytes(&c))
        .ok_or("the claim has no capacity")?
        + GROWTH;
    env.sim()?
        .api
        .update::<PersistentVolumeClaim>(NAMESPACE, "conform-claim", |c| {
            let resources = c
                .spec
                .get_or_insert_with(Default::default)
                .resources
                .get_or_insert_with(Default::default);
            resources
                .requests
                .get_or_insert_with(Default::default)
                .insert("storage".into(), Quantity(grown.to_string()));
        });
    let resized = |env: &CheckEnv| {
        claim(env).is_some_and(|c| {
            let status = c.status.clone().unwrap_or_default();
            let pending = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "FileSystemResizePending");
            bytes(&c).is_some_and(|b| b >= grown) && !pending
        })
    };
    if !env.until(resized).await {
        let status = claim(env).and_then(|c| c.status.clone());
        return Err(format!(
            "the claim's status did not reach {grown} bytes: {}{}",
            serde_json::to_string(&status).unwrap_or_default(),
            env.last_failure("grown")
        ));
    }
    let calls = env.calls();
    let handle = env
        .sim()?
        .api
        .peek::<PersistentVolume>("", &pv_name)
        .and_then(|p| Some(p.spec.clone()?.csi?.volume_handle))
        .ok_or("the PV is gone")?;
    let ok = |method: &str| first_ok(&calls, method, &handle).map(|i| &calls[i]);
    if env.conf.info.controller_has("EXPAND_VOLUME") && ok("ControllerExpandVolume").is_none() {
        return Err("no successful ControllerExpandVolume".into());
    }
    if env.conf.info.node_has("EXPAND_VOLUME") {
        let target = env
            .node_root()
            .join("pods")
            .join(env.uid("grown"))
            .join("volumes/kubernetes.io~csi");
        let expanded = calls.iter().any(|c| {
            c.method == "NodeExpandVolume"
                && c.volume_id == handle
                && c.code == "OK"
                && c.target_path.starts_with(&target.display().to_string())
        });
        let requested = calls.iter().any(|c| c.method == "NodeExpandVolume");
        if requested && !expanded {
            return Err("no successful NodeExpandVolume at the pod's mount path".into());
        }
    }
    let on_node = calls.iter().any(|c| c.method == "NodeExpandVolume");
    let note = match (ok("ControllerExpandVolume").is_some(), on_node) {
        (true, true) => "expanded in the controller, then on the node",
        (true, false) => "expanded in the controller; the driver needed no node expansion",
        (false, _) => "expanded on the node only",
    };
    env.running("grown").await?;
    env.delete(&["grown"]).await?;
    env.sim()?
        .api
        .remove::<PersistentVolumeClaim>(NAMESPACE, "conform-claim");
    let gone = |env: &CheckEnv| {
        env.sim()
            .is_ok_and(|sim| sim.api.peek::<PersistentVolume>("", &pv_name).is_none())
    };
    if !env.until(gone).await {
        return Err(format!("the PV {pv_name} was not deleted after its claim"));
    }
    env.nothing_left(&[handle]).await?;
    Ok(note.into())
}
