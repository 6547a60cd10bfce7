//! Resolving a [`Spec`] into what the CSI calls need: driver, handle, lifecycle mode, attributes and secret
//! references with their namespaces (upstream `getSourceFromSpec`, `getVolumeLifecycleMode`, `NewMounter`).
//!
//! # Persistent inline volumes (feature gate `PersistentInlineCSI`, off by default)
//! The early KEP-596 draft let an inline `csi` source name a pre-provisioned `volumeHandle` and go through
//! attach, stage and publish like a PV. It left open which mode applies when a driver offers both; inlet
//! decides, with the gate on, by the CSIDriver object and the handle:
//!
//! | CSIDriver `volumeLifecycleModes` | inline source is |
//! |---|---|
//! | no CSIDriver object | Persistent (the draft's default); a missing handle fails at attach |
//! | `[Ephemeral]` | Ephemeral; a `volumeHandle` is ignored, as the draft says |
//! | `[]` or `[Persistent]` | Persistent |
//! | both | Persistent when `volumeHandle` is set, else Ephemeral |
//!
//! With the gate off every inline source is Ephemeral and `volumeHandle` is ignored, as upstream ships.
//! A persistent inline volume must be granted to the pod's namespace by the PV of its handle
//! ([`super::grant`]), whose `controllerPublishSecretRef` and `nodeStageSecretRef` it uses; the inline
//! source may name only its `nodePublishSecretRef`, read in the pod's namespace.

use std::collections::BTreeMap;

use inlet_proto::csi::v1::volume_capability::access_mode::Mode as CsiMode;

use super::handle::ephemeral_volume_handle;
use crate::{PodInfo, SecretRef, Spec, VolumeError, VolumeHost};

/// The feature gate that enables the draft's persistent inline volumes.
pub const PERSISTENT_INLINE_GATE: &str = "PersistentInlineCSI";

/// `Persistent` or `Ephemeral` (`storage/v1` VolumeLifecycleMode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum LifecycleMode {
    /// A PV, or a persistent inline volume.
    Persistent,
    /// An inline volume created on publish and deleted on unpublish.
    Ephemeral,
}

impl LifecycleMode {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Persistent => "Persistent",
            Self::Ephemeral => "Ephemeral",
        }
    }
}

/// Everything the CSI calls need about one volume.
#[derive(Debug, Clone, PartialEq)]
pub struct CsiSource {
    /// The driver's name.
    pub driver: String,
    /// The handle; `None` only for a persistent inline volume whose source has no `volumeHandle`.
    pub handle: Option<String>,
    /// The lifecycle mode.
    pub mode: LifecycleMode,
    /// `readOnly` of the source (inline `csi.readOnly`, or the PV's / claim's).
    pub read_only: bool,
    /// `fsType`.
    pub fs_type: Option<String>,
    /// `volumeAttributes`, the volume context.
    pub attributes: BTreeMap<String, String>,
    /// The Kubernetes access mode the CSI one is mapped from: a PV's first `accessModes` entry, and
    /// `ReadWriteOnce` for inline volumes (see [`CsiSource::csi_access_mode`]).
    pub access_mode: String,
    /// A PV's `accessModes` (None for inline volumes), for the fsGroup decision.
    pub pv_access_modes: Option<Vec<String>>,
    /// `nodePublishSecretRef`, resolved.
    pub node_publish_secret: Option<SecretRef>,
    /// `nodeStageSecretRef`, resolved.
    pub node_stage_secret: Option<SecretRef>,
    /// `controllerPublishSecretRef`, resolved.
    pub controller_publish_secret: Option<SecretRef>,
    /// A PV of `volumeMode: Block`: a raw device for the pod (`csi_block.go`), not a filesystem.
    pub block: bool,
}

impl CsiSource {
    /// The CSI access mode of this volume for a driver with or without the SINGLE_NODE_MULTI_WRITER node
    /// capability: `asCSIAccessModeV1` and `asSingleNodeMultiWriterCapableCSIAccessModeV1` in upstream's
    /// `csi_client.go`, chosen per call by `getNodeV1AccessModeMapper`, so NodeStageVolume and
    /// NodePublishVolume always agree. ReadWriteOncePod becomes SINGLE_NODE_WRITER for drivers without
    /// the capability, so they keep working with it.
    pub fn csi_access_mode(&self, multi_writer_capable: bool) -> CsiMode {
        match (self.access_mode.as_str(), multi_writer_capable) {
            ("ReadWriteOnce", false) | ("ReadWriteOncePod", false) => CsiMode::SingleNodeWriter,
            ("ReadWriteOnce", true) => CsiMode::SingleNodeMultiWriter,
            ("ReadWriteOncePod", true) => CsiMode::SingleNodeSingleWriter,
            ("ReadOnlyMany", _) => CsiMode::MultiNodeReaderOnly,
            ("ReadWriteMany", _) => CsiMode::MultiNodeMultiWriter,
            _ => CsiMode::Unknown,
        }
    }

    /// The handle, or the error a persistent inline volume without one gets.
    pub fn require_handle(&self, spec_name: &str) -> Result<&str, VolumeError> {
        self.handle.as_deref().ok_or_else(|| {
            VolumeError::final_(format!(
                "persistent inline volume {spec_name:?} of driver {} has no volumeHandle: a persistent inline volume must name a pre-provisioned volume",
                self.driver
            ))
        })
    }
}

/// Resolves `spec` as used by `pod`.
pub async fn resolve(
    host: &dyn VolumeHost,
    spec: &Spec,
    pod: &PodInfo,
) -> Result<CsiSource, VolumeError> {
    // The driver's name becomes paths on the node: refused as the API server refuses it, whether the
    // spec came through an API server or not.
    let driver = super::spec_driver(spec);
    let errors = inlet_host::names::csi_driver_name_errors(&driver, "driver");
    if !errors.is_empty() {
        return Err(VolumeError::final_(errors.join(", ")));
    }
    match spec {
        Spec::Inline { volume, csi } => {
            let inline = csi.as_ref().ok_or_else(|| {
                VolumeError::final_(format!("volume {:?} is not a CSI volume", volume.name()))
            })?;
            let source = &inline.source;
            let mode = inline_mode(host, inline).await?;
            let handle = match mode {
                LifecycleMode::Ephemeral => Some(ephemeral_volume_handle(&pod.uid, volume.name())),
                LifecycleMode::Persistent => inline.volume_handle.clone(),
            };
            let (controller_publish_secret, node_stage_secret) = match (mode, &handle) {
                (LifecycleMode::Persistent, Some(handle)) => {
                    granted_secrets(host, inline, handle, volume.name(), pod).await?
                }
                _ => (None, None),
            };
            let in_pod_ns = |name: &Option<String>| {
                name.clone().map(|name| SecretRef {
                    namespace: pod.namespace.clone(),
                    name,
                })
            };
            Ok(CsiSource {
                driver: source.driver.clone(),
                handle,
                mode,
                read_only: source.read_only.unwrap_or(false),
                fs_type: source.fs_type.clone(),
                attributes: source.volume_attributes.clone().unwrap_or_default(),
                // Inline volumes are always ReadWriteOnce (csi_mounter.go).
                access_mode: "ReadWriteOnce".into(),
                pv_access_modes: None,
                node_publish_secret: in_pod_ns(
                    &source
                        .node_publish_secret_ref
                        .as_ref()
                        .map(|r| r.name.clone()),
                ),
                node_stage_secret,
                controller_publish_secret,
                block: false,
            })
        }
        Spec::Persistent { pv, read_only } => {
            let name = pv.metadata.name.clone().unwrap_or_default();
            let pv_spec = pv.spec.as_ref();
            let csi = pv_spec.and_then(|s| s.csi.as_ref()).ok_or_else(|| {
                VolumeError::final_(format!("persistent volume {name:?} has no CSI source"))
            })?;
            let pv_access_modes = pv_spec.and_then(|s| s.access_modes.clone());
            // SetUpAt and MountDevice take the PV's first access mode, ReadWriteOnce when it has none.
            let access_mode = pv_access_modes
                .as_ref()
                .and_then(|m| m.first().cloned())
                .unwrap_or_else(|| "ReadWriteOnce".into());
            Ok(CsiSource {
                driver: csi.driver.clone(),
                handle: Some(csi.volume_handle.clone()),
                mode: LifecycleMode::Persistent,
                // The volume spec's read-only (the claim's `readOnly` in the pod), never
                // `spec.csi.readOnly`: `getReadOnlyFromSpec` in csi_util.go (kubernetes#69843). The
                // container's mount uses the same flag, so the two cannot disagree.
                read_only: *read_only,
                fs_type: csi.fs_type.clone(),
                attributes: csi.volume_attributes.clone().unwrap_or_default(),
                access_mode,
                pv_access_modes,
                node_publish_secret: csi
                    .node_publish_secret_ref
                    .as_ref()
                    .and_then(SecretRef::from_pv),
                node_stage_secret: csi
                    .node_stage_secret_ref
                    .as_ref()
                    .and_then(SecretRef::from_pv),
                controller_publish_secret: csi
                    .controller_publish_secret_ref
                    .as_ref()
                    .and_then(SecretRef::from_pv),
                block: is_block(spec),
            })
        }
    }
}

/// The attach and stage secrets of persistent inline volume `spec_name` (handle `handle`): those of the PV
/// that grants it to the pod's namespace. Not granted, or naming secrets of its own, it is refused.
async fn granted_secrets(
    host: &dyn VolumeHost,
    inline: &crate::InlineCsi,
    handle: &str,
    spec_name: &str,
    pod: &PodInfo,
) -> Result<(Option<SecretRef>, Option<SecretRef>), VolumeError> {
    let driver = &inline.source.driver;
    if inline.controller_publish_secret.is_some() || inline.node_stage_secret.is_some() {
        return Err(VolumeError::final_(format!(
            "persistent inline volume {spec_name:?}: controllerPublishSecretRef and nodeStageSecretRef are the granting PersistentVolume's to name, not the pod's"
        )));
    }
    let pvs = host
        .persistent_volumes_with_handle(driver, handle)
        .await
        .map_err(VolumeError::transient)?;
    let pv = super::grant::granting_pv(&pvs, driver, handle, &pod.namespace)
        .map_err(|e| VolumeError::final_(format!("persistent inline volume {spec_name:?}: {e}")))?;
    let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
    let secret =
        |r: Option<&k8s_openapi::api::core::v1::SecretReference>| r.and_then(SecretRef::from_pv);
    Ok((
        secret(csi.and_then(|c| c.controller_publish_secret_ref.as_ref())),
        secret(csi.and_then(|c| c.node_stage_secret_ref.as_ref())),
    ))
}

/// True for a PV of `volumeMode: Block` (inline volumes are always filesystems).
pub fn is_block(spec: &Spec) -> bool {
    match spec {
        Spec::Persistent { pv, .. } => {
            pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
        }
        Spec::Inline { .. } => false,
    }
}

/// The lifecycle mode of an inline source (see the module doc for the gate's table).
async fn inline_mode(
    host: &dyn VolumeHost,
    inline: &super::super::InlineCsi,
) -> Result<LifecycleMode, VolumeError> {
    if !host.feature_enabled(PERSISTENT_INLINE_GATE) {
        return Ok(LifecycleMode::Ephemeral);
    }
    let driver = host
        .csi_driver(&inline.source.driver)
        .await
        .map_err(VolumeError::transient)?;
    Ok(gated_inline_mode(
        driver.as_ref(),
        inline.volume_handle.is_some(),
    ))
}

/// The mode of an inline source with the gate on, by its driver's CSIDriver object and whether it names a
/// handle (the table in the module doc); admission decides with it too.
pub fn gated_inline_mode(
    driver: Option<&k8s_openapi::api::storage::v1::CSIDriver>,
    has_handle: bool,
) -> LifecycleMode {
    let Some(driver) = driver else {
        return LifecycleMode::Persistent;
    };
    let modes = driver
        .spec
        .volume_lifecycle_modes
        .as_deref()
        .unwrap_or_default();
    let has = |m: &str| modes.iter().any(|x| x == m);
    let persistent = modes.is_empty() || has("Persistent");
    match (persistent, has("Ephemeral")) {
        (true, true) if has_handle => LifecycleMode::Persistent,
        (true, true) => LifecycleMode::Ephemeral,
        (true, false) => LifecycleMode::Persistent,
        (false, _) => LifecycleMode::Ephemeral,
    }
}
