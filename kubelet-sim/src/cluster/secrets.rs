//! The Secrets and ConfigMaps a hollow node may read: only those its pods refer to (Secrets: image pull
//! secrets, `secret` volumes, CSI secret references, container environments; ConfigMaps: container
//! environments and `configMap` volumes), each in the namespace its reference names, as the kubelet's
//! secret and configmap managers register a pod's references when the pod arrives (`pkg/kubelet/secret`,
//! `podutil.VisitPodSecretNames`, `VisitPodConfigmapNames`) and the CSI plugin reads a PV's references
//! (`csi_mounter.go`, `csi_attacher.go`). An object is read before the pod that needs it is handed to the
//! node, and dropped from the embedded API once no pod of the node refers to it.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SecretReference};

use crate::api::manifest::draft_fields;
use crate::api::{Api, Kind};
use crate::node::all_containers;

/// An object's namespace and name.
pub type SecretKey = (String, String);

/// The Secrets (`secrets`) or ConfigMaps its containers take environment variables from (`envFrom`,
/// `secretKeyRef`, `configMapKeyRef`), by name.
fn env_references(pod: &Pod, secrets: bool) -> Vec<String> {
    let mut names = Vec::new();
    for container in all_containers(pod) {
        for from in container.env_from.iter().flatten() {
            let name = match secrets {
                true => from.secret_ref.as_ref().map(|r| r.name.clone()),
                false => from.config_map_ref.as_ref().map(|r| r.name.clone()),
            };
            names.extend(name);
        }
        for source in container
            .env
            .iter()
            .flatten()
            .filter_map(|e| e.value_from.as_ref())
        {
            let name = match secrets {
                true => source.secret_key_ref.as_ref().map(|r| r.name.clone()),
                false => source.config_map_key_ref.as_ref().map(|r| r.name.clone()),
            };
            names.extend(name);
        }
    }
    names
}

/// The ConfigMaps `pod`'s containers take environment variables from and its `configMap` volumes name,
/// in its namespace.
pub fn referenced_config_maps(pod: &Pod) -> BTreeSet<SecretKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let volumes = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.config_map.as_ref()?.name.clone()));
    env_references(pod, false)
        .into_iter()
        .chain(volumes)
        .filter(|name| !name.is_empty())
        .map(|name| (namespace.clone(), name))
        .collect()
}

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
    for name in env_references(pod, true) {
        keys.insert((namespace.clone(), name));
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

/// Every ConfigMap the pods in the embedded API refer to.
pub fn config_maps_referenced_by_all(api: &Api) -> BTreeSet<SecretKey> {
    api.list::<Pod>()
        .iter()
        .flat_map(|pod| referenced_config_maps(pod))
        .collect()
}

/// Reads the objects `keys` (Secrets or ConfigMaps) from the API server into the embedded API (one GET
/// each; a missing one is removed, and the node reports it as the kubelet does). Errors are logged, never
/// their data.
pub async fn fetch<T>(client: &kube::Client, api: &Arc<Api>, keys: &BTreeSet<SecretKey>)
where
    T: Kind
        + kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    for (namespace, name) in keys {
        let objects = kube::Api::<T>::namespaced(client.clone(), namespace);
        match objects.get_opt(name).await {
            Ok(Some(object)) => api.put(object),
            Ok(None) => drop(api.remove::<T>(namespace, name)),
            Err(e) => tracing::warn!(namespace, name, kind = T::KIND, "reading an object: {e}"),
        }
    }
}

/// Drops from the embedded API every object of its kind no pod refers to any more.
pub fn forget_unreferenced<T: Kind>(api: &Api, referenced: &BTreeSet<SecretKey>) {
    for object in api.list::<T>() {
        let meta = object.metadata();
        let key = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        if !referenced.contains(&key) {
            api.remove::<T>(&key.0, &key.1);
        }
    }
}
