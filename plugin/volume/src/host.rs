//! [`VolumeHost`]: what the kubelet gives volume plugins. The simulated kubelet implements it over its API;
//! plugins never reach the API or the driver registry any other way, so every read can be recorded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use super::PodInfo;
use super::csi::CsiClient;
use super::fieldpath::NodeAllocatable;
use inlet_host::mount::MountLayer;

/// A service-account token request, as the kubelet makes it for a CSIDriver's `tokenRequests`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequestArgs {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's service account.
    pub service_account: String,
    /// The audience (empty means the API server's default audiences).
    pub audience: String,
    /// Requested lifetime.
    pub expiration_seconds: Option<i64>,
    /// The pod the token is bound to (name, uid).
    pub pod: (String, String),
}

/// What a plugin may ask of the kubelet. Errors are messages in upstream's words.
#[async_trait]
pub trait VolumeHost: Send + Sync {
    /// This node's name.
    fn node_name(&self) -> &str;
    /// The kubelet root dir (`/var/lib/kubelet`).
    fn root_dir(&self) -> &Path;
    /// The mount layer (mount-point checks, fsGroup).
    fn mounter(&self) -> Arc<dyn MountLayer>;
    /// `pods/<uid>/volumes/<escaped plugin>/<name>` under the root dir.
    fn pod_volume_dir(&self, pod_uid: &str, plugin: &str, spec_name: &str) -> PathBuf {
        self.root_dir()
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(plugin.replace('/', "~"))
            .join(spec_name)
    }
    /// True when a kubelet feature gate is on (`PersistentInlineCSI`).
    fn feature_enabled(&self, gate: &str) -> bool;
    /// Reads a secret; `Ok(None)` when it does not exist.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String>;
    /// Reads a ConfigMap; `Ok(None)` when it does not exist.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, String>;
    /// The node's allocatable CPU and memory (`GetNodeAllocatable`): the largest a memory-backed emptyDir
    /// may be, and the downward API's value of a limit a container leaves unset. None where the node cannot
    /// tell.
    fn node_allocatable(&self) -> NodeAllocatable;
    /// Reads a CSIDriver object; `Ok(None)` when it does not exist.
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String>;
    /// The PersistentVolumes of `driver` with volume handle `handle` (the grant of a persistent inline
    /// volume, [`crate::csi::grant`]).
    async fn persistent_volumes_with_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Vec<PersistentVolume>, String>;
    /// A client for a registered CSI driver; the error when it is not registered is upstream's
    /// `driver name X not found in the list of registered CSI drivers`.
    async fn csi_client(&self, driver: &str) -> Result<CsiClient, String>;
    /// A service-account token (value, expiration in RFC 3339).
    async fn service_account_token(
        &self,
        request: TokenRequestArgs,
    ) -> Result<(String, String), String>;
    /// Reads a VolumeAttachment; `Ok(None)` when it does not exist.
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String>;
    /// Creates a VolumeAttachment; one that exists already is left as it is.
    async fn create_volume_attachment(&self, attachment: VolumeAttachment) -> Result<(), String>;
    /// Deletes a VolumeAttachment (the external attacher then detaches); a missing one is OK.
    async fn delete_volume_attachment(&self, name: &str) -> Result<(), String>;
    /// Records an event on a pod (`Normal`/`Warning`, a reason, a message); a pod that is gone is ignored.
    fn pod_event(&self, pod: &PodInfo, type_: &str, reason: &str, message: &str);
}
