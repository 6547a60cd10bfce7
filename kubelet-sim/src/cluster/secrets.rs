//! The Secrets a hollow node may read: only those its pods refer to (image pull secrets, `secret` volumes,
//! CSI secret references), each in the namespace its reference
//! names, as the kubelet's secret manager registers a pod's references when the pod arrives
//! (`pkg/kubelet/secret`, `podutil.VisitPodSecretNames`) and the CSI plugin reads a PV's references
//! (`csi_mounter.go`, `csi_attacher.go`). A Secret is read before the pod that needs it is handed to the
//! node, and dropped from the embedded API once no pod of the node refers to it.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, Secret, SecretReference,
};

use crate::api::Api;
use crate::api::manifest::draft_fields;

/// A Secret's namespace and name.
pub type SecretKey = (String, String);

/// The Secrets `pod` refers to: its image pull secrets, its `secret` volumes and its inline CSI volumes'
/// `nodePublishSecretRef` (in its own namespace), and the node-side secret references of the CSI PVs its
/// claims are bound to (in the namespaces they name). Claims or PVs not known yet refer to nothing yet.
pub fn referenced(pod: &Pod, api: &Api) -> BTreeSet<SecretKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut keys = BTreeSet::new();
    let Some(spec) = &pod.spec else { return keys };
    for secret in spec.image_pull_secrets.iter().flatten() {
        keys.insert((namespace.clone(), secret.name.clone()));
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            keys.insert((namespace.clone(), name));
        }
        if let Some(csi) = &volume.csi {
            let publish = csi.node_publish_secret_ref.as_ref().map(|r| r.name.clone());
            // The KEP draft's persistent inline `nodeStageSecretRef`, read by MountDevice.
            let (_, _, stage) = draft_fields(pod, &volume.name);
            for name in publish.into_iter().chain(stage) {
                keys.insert((namespace.clone(), name));
            }
        }
        let Some(claim) = &volume.persistent_volume_claim else {
            continue;
        };
        let pv = api
            .peek::<PersistentVolumeClaim>(&namespace, &claim.claim_name)
            .and_then(|c| c.spec.as_ref()?.volume_name.clone())
            .and_then(|pv| api.peek::<PersistentVolume>("", &pv));
        let Some(csi) = pv.as_ref().and_then(|pv| pv.spec.as_ref()?.csi.as_ref()) else {
            continue;
        };
        // Not `controllerPublishSecretRef`: attaching is the control plane's, and a node may not read it.
        let refs: [&Option<SecretReference>; 3] = [
            &csi.node_publish_secret_ref,
            &csi.node_stage_secret_ref,
            &csi.node_expand_secret_ref,
        ];
        for r in refs.into_iter().flatten() {
            keys.insert((
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            ));
        }
    }
    keys.retain(|(_, name)| !name.is_empty());
    keys
}

/// Every Secret the pods in the embedded API refer to.
pub fn referenced_by_all(api: &Api) -> BTreeSet<SecretKey> {
    api.list::<Pod>()
        .iter()
        .flat_map(|pod| referenced(pod, api))
        .collect()
}

/// Reads the Secrets `keys` from the API server into the embedded API (one GET each; a missing one is
/// removed, and the node's mount reports it as the kubelet does). Errors are logged, never their data.
pub async fn fetch(client: &kube::Client, api: &Arc<Api>, keys: &BTreeSet<SecretKey>) {
    for (namespace, name) in keys {
        let secrets = kube::Api::<Secret>::namespaced(client.clone(), namespace);
        match secrets.get_opt(name).await {
            Ok(Some(secret)) => api.put(secret),
            Ok(None) => drop(api.remove::<Secret>(namespace, name)),
            Err(e) => tracing::warn!(namespace, name, "reading a secret: {e}"),
        }
    }
}

/// Drops from the embedded API every Secret no pod refers to any more.
pub fn forget_unreferenced(api: &Api, referenced: &BTreeSet<SecretKey>) {
    for secret in api.list::<Secret>() {
        let key = (
            secret.metadata.namespace.clone().unwrap_or_default(),
            secret.metadata.name.clone().unwrap_or_default(),
        );
        if !referenced.contains(&key) {
            api.remove::<Secret>(&key.0, &key.1);
        }
    }
}
