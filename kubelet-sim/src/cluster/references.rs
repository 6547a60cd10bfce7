//! What a hollow node may read, as the Node authorizer lets a kubelet read it: only the objects its pods
//! refer to, each by a GET of its own (`ResourceChangeDetectionStrategy` aside, no list or watch of
//! these kinds is allowed to a node). Secrets: image pull secrets, `secret` volumes and projected
//! sources, CSI secret references, container environments; ConfigMaps: container environments,
//! `configMap` volumes and projected sources (`kube-root-ca.crt`); PersistentVolumeClaims (claims and
//! generic ephemeral volumes), the PersistentVolumes they are bound to, and the VolumeAttachments of
//! those PVs to the pod's node. Each is read in the namespace its reference names, as the kubelet's
//! secret and configmap managers register a pod's references when the pod arrives (`pkg/kubelet/secret`,
//! `podutil.VisitPodSecretNames`, `VisitPodConfigmapNames`), the populator reads claims and PVs
//! (`desired_state_of_world_populator.go` `getPVCExtractPV`), the CSI plugin a PV's secret references
//! (`csi_mounter.go`, `csi_attacher.go`) and the attacher its VolumeAttachment. An object is read before
//! the pod that needs it is handed to the node, and dropped from the embedded API once no pod of the node
//! refers to it.

use std::collections::BTreeSet;
use std::sync::Arc;

use inlet_volume::InlineVolume;
use inlet_volume::csi::handle::attachment_name;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SecretReference};
use k8s_openapi::api::storage::v1::CSIDriver;

use crate::api::manifest::draft_fields;
use crate::api::{Api, ApiPod, Kind};
use crate::node::all_containers;

/// An object's namespace (empty for cluster-wide kinds) and name.
pub type ObjectKey = (String, String);

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

/// The ConfigMaps `pod`'s containers take environment variables from and its `configMap` volumes and
/// projected sources name, in its namespace.
pub fn referenced_config_maps(pod: &ApiPod) -> BTreeSet<ObjectKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let volumes = pod.volumes().iter().flat_map(|v| {
        let projected = v
            .projected()
            .into_iter()
            .flat_map(|p| p.sources.iter().flatten());
        let sources = projected.filter_map(|p| Some(p.config_map.as_ref()?.name.clone()));
        v.config_map()
            .map(|c| c.name.clone())
            .into_iter()
            .chain(sources)
    });
    env_references(pod, false)
        .into_iter()
        .chain(volumes)
        .filter(|name| !name.is_empty())
        .map(|name| (namespace.clone(), name))
        .collect()
}

/// The Secrets `pod` refers to: its image pull secrets, its `secret` volumes and projected sources, and its
/// inline CSI volumes' `nodePublishSecretRef` (in its own namespace), and the node-side secret references of the CSI PVs its
/// claims are bound to (in the namespaces they name). Claims or PVs not known yet refer to nothing yet.
pub fn referenced_secrets(pod: &ApiPod, api: &Api) -> BTreeSet<ObjectKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut keys = BTreeSet::new();
    let Some(spec) = &pod.spec else { return keys };
    for secret in spec.image_pull_secrets.iter().flatten() {
        keys.insert((namespace.clone(), secret.name.clone()));
    }
    for name in env_references(pod, true) {
        keys.insert((namespace.clone(), name));
    }
    for volume in pod.volumes() {
        if let Some(name) = volume.secret().and_then(|s| s.secret_name.clone()) {
            keys.insert((namespace.clone(), name));
        }
        let projected = volume
            .projected()
            .into_iter()
            .flat_map(|p| p.sources.iter().flatten());
        for secret in projected.filter_map(|p| p.secret.as_ref()) {
            keys.insert((namespace.clone(), secret.name.clone()));
        }
        if let Some(csi) = volume.csi() {
            let publish = csi.node_publish_secret_ref.as_ref().map(|r| r.name.clone());
            // The KEP draft's persistent inline `nodeStageSecretRef`, read by MountDevice.
            let (_, _, stage) = draft_fields(pod, volume.name());
            for name in publish.into_iter().chain(stage) {
                keys.insert((namespace.clone(), name));
            }
        }
    }
    for (_, pv) in referenced_volumes(pod, api) {
        let pv = api.peek::<PersistentVolume>("", &pv);
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

/// The claims `pod` uses: its `persistentVolumeClaim` volumes, and the claim of each generic ephemeral
/// volume (`<pod>-<volume>`).
pub fn referenced_claims(pod: &ApiPod) -> BTreeSet<ObjectKey> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let volumes = pod.volumes().iter().filter_map(InlineVolume::other);
    volumes
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(claim), _) => Some(claim.claim_name.clone()),
            (None, Some(_)) => Some(format!("{name}-{}", v.name)),
            (None, None) => None,
        })
        .map(|claim| (namespace.clone(), claim))
        .collect()
}

/// The PVs `pod`'s claims are bound to, as the embedded API knows the claims.
pub fn referenced_volumes(pod: &ApiPod, api: &Api) -> BTreeSet<ObjectKey> {
    referenced_claims(pod)
        .into_iter()
        .filter_map(|(namespace, claim)| {
            let claim = api.peek::<PersistentVolumeClaim>(&namespace, &claim)?;
            let pv = claim.spec.as_ref()?.volume_name.clone()?;
            Some((String::new(), pv))
        })
        .collect()
}

/// The VolumeAttachments of `pod`'s CSI PVs to its node, unless their driver says it needs none
/// (`attachRequired: false`).
pub fn referenced_attachments(pod: &ApiPod, api: &Api) -> BTreeSet<ObjectKey> {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return BTreeSet::new();
    };
    referenced_volumes(pod, api)
        .into_iter()
        .filter_map(|(_, pv)| {
            let pv = api.peek::<PersistentVolume>("", &pv)?;
            let csi = pv.spec.as_ref()?.csi.as_ref()?;
            let driver = api.peek::<CSIDriver>("", &csi.driver);
            let required = driver.is_none_or(|d| d.spec.attach_required != Some(false));
            required.then(|| {
                let name = attachment_name(&csi.volume_handle, &csi.driver, &node);
                (String::new(), name)
            })
        })
        .collect()
}

/// What every pod in the embedded API refers to, by `references`.
pub fn referenced_by_all(
    api: &Api,
    references: impl Fn(&ApiPod, &Api) -> BTreeSet<ObjectKey>,
) -> BTreeSet<ObjectKey> {
    api.list::<ApiPod>()
        .iter()
        .flat_map(|pod| references(pod, api))
        .collect()
}

/// Reads the objects `keys` from the API server into the embedded API, one GET each (a missing one is
/// removed, and the node reports it as the kubelet does). `objects` gives the API of a namespace (cluster
/// kinds ignore it). Errors are logged, never the objects' data.
pub async fn fetch<T>(
    api: &Arc<Api>,
    keys: &BTreeSet<ObjectKey>,
    objects: impl Fn(&str) -> kube::Api<T>,
) where
    T: Kind + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for (namespace, name) in keys {
        match objects(namespace).get_opt(name).await {
            Ok(Some(object)) => api.put(object),
            Ok(None) => drop(api.remove::<T>(namespace, name)),
            // The Node authorizer answers a VolumeAttachment that does not exist yet with 403 (it
            // knows no edge to it): not made yet, as a 404 would say.
            Err(kube::Error::Api(s)) if s.code == 403 && T::KIND == "VolumeAttachment" => {
                tracing::debug!(
                    name,
                    "VolumeAttachment not made yet (403 from the Node authorizer)"
                );
                drop(api.remove::<T>(namespace, name));
            }
            Err(e) => tracing::warn!(namespace, name, kind = T::KIND, "reading an object: {e}"),
        }
    }
}

/// Drops from the embedded API every object of its kind no pod refers to any more.
pub fn forget_unreferenced<T: Kind>(api: &Api, referenced: &BTreeSet<ObjectKey>) {
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
