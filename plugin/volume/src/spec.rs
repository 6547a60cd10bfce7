//! What a volume is, as the volume manager hands it to plugins (`volume.Spec` upstream): a pod's inline
//! volume, or a PersistentVolume.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, Container, PersistentVolume, Pod, ResourceRequirements, SecretReference,
};

use crate::InlineVolume;

/// The inline CSI source as the early KEP-596 draft had it: the shipped `CSIVolumeSource` plus the draft's
/// `volumeHandle` and controller-publish / node-stage secret references (upstream never shipped these; they
/// are read from the manifest beside the standard fields).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InlineCsi {
    /// The standard source.
    pub source: CSIVolumeSource,
    /// The draft's user-supplied handle. Ignored for ephemeral volumes.
    pub volume_handle: Option<String>,
    /// The draft's `controllerPublishSecretRef` (a name in the pod's namespace).
    pub controller_publish_secret: Option<String>,
    /// The draft's `nodeStageSecretRef` (a name in the pod's namespace).
    pub node_stage_secret: Option<String>,
}

/// One volume, with what plugins need to act on it. Cheap to clone (the objects are shared): the volume
/// manager hands specs around on every pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A volume written in the pod: `spec.volumes[i]`.
    Inline {
        /// The pod's volume (name and source).
        volume: InlineVolume,
        /// The inline CSI source with the draft fields, when the volume is `csi`: shared, as the
        /// volume is, by every copy of the spec (the desired and the actual state each keep one).
        csi: Option<Arc<InlineCsi>>,
    },
    /// A PersistentVolume the pod reaches through a bound claim.
    Persistent {
        /// The PV.
        pv: Arc<PersistentVolume>,
        /// The claim's `readOnly` in the pod.
        read_only: bool,
    },
}

impl Spec {
    /// The spec's name: the pod's volume name, or the PV's name (upstream `Spec.Name()`).
    pub fn name(&self) -> &str {
        match self {
            Spec::Inline { volume, .. } => volume.name(),
            Spec::Persistent { pv, .. } => pv.metadata.name.as_deref().unwrap_or_default(),
        }
    }
}

/// The pod a volume is mounted for: the fields mounters read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.serviceAccountName` (`default` when unset).
    pub service_account: String,
    /// `spec.securityContext.fsGroup`.
    pub fs_group: Option<i64>,
    /// `spec.imagePullSecrets` names (in the pod's namespace).
    pub image_pull_secrets: Vec<String>,
    /// The memory the pod may use, in bytes, when its containers' limits bound it (the pod cgroup's
    /// limit, `ResourceConfigForPod`): a memory-backed emptyDir is no larger.
    pub memory_limit: Option<u64>,
    /// `metadata.labels` and `metadata.annotations`, for the downward API.
    pub labels: BTreeMap<String, String>,
    /// See `labels`.
    pub annotations: BTreeMap<String, String>,
    /// Each container's name and resources (init containers too), for the downward API's
    /// `resourceFieldRef`.
    pub containers: Vec<(String, Option<ResourceRequirements>)>,
}

impl PodInfo {
    /// Reads the fields from a pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_else(|| "default".into()),
            fs_group: spec
                .and_then(|s| s.security_context.as_ref())
                .and_then(|c| c.fs_group),
            image_pull_secrets: spec
                .and_then(|s| s.image_pull_secrets.as_ref())
                .into_iter()
                .flatten()
                .map(|r| r.name.clone())
                .collect(),
            memory_limit: pod_memory_limit(pod),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            containers: container_resources(pod),
        }
    }
}

/// Each container's name and resources, init containers too: what the downward API's
/// `resourceFieldRef` reads.
pub fn container_resources(pod: &Pod) -> Vec<(String, Option<ResourceRequirements>)> {
    let spec = pod.spec.iter();
    spec.flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    })
    .map(|c| (c.name.clone(), c.resources.clone()))
    .collect()
}

/// The pod's memory limit as `ResourceConfigForPod` (`pkg/kubelet/cm/helpers_linux.go`) sets its cgroup's:
/// none unless every container states one; then the regular containers' and sidecars' sum, or an init
/// container's limit (with the sidecars started before it) when that is larger, plus the pod's overhead.
fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| {
        let quantity = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        inlet_host::quantity::parse_bytes(&quantity.0).ok()
    };
    let mut sidecars = 0u64;
    let mut init_peak = 0u64;
    for container in spec.init_containers.iter().flatten() {
        let bytes = limit(container)?;
        if container.restart_policy.as_deref() == Some("Always") {
            sidecars = sidecars.saturating_add(bytes);
        } else {
            init_peak = init_peak.max(sidecars.saturating_add(bytes));
        }
    }
    let mut regular = sidecars;
    for container in &spec.containers {
        regular = regular.saturating_add(limit(container)?);
    }
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|o| o.get("memory"))
        .and_then(|q| inlet_host::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    Some(regular.max(init_peak).saturating_add(overhead))
}

/// A reference to a secret with its namespace resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    /// The namespace the secret is read from.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl SecretRef {
    /// From a PV's `SecretReference` (which names its namespace).
    pub fn from_pv(r: &SecretReference) -> Option<Self> {
        Some(Self {
            namespace: r.namespace.clone().unwrap_or_else(|| "default".into()),
            name: r.name.clone()?,
        })
    }
}
