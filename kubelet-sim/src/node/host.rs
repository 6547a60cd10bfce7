//! [`NodeHost`]: the [`VolumeHost`] a simulated node gives its volume plugins, over the embedded API and the
//! node's driver registry. Reads go through `Api::get_recorded`, so each one is in the report.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use inlet_host::mount::MountLayer;
use inlet_volume::csi::CsiClient;
use inlet_volume::fieldpath::NodeAllocatable;
use inlet_volume::{PodInfo, TokenRequestArgs, VolumeHost};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use super::registry::DriverRegistry;
use super::token_manager::TokenManager;
use crate::api::{Api, ApiPod, now};

/// A node's host for volume plugins; also the attach/detach controller's, with its own name and no
/// drivers (it writes VolumeAttachments and never calls a driver, as upstream's controller-side host).
pub struct NodeHost {
    /// The node's name.
    pub node: String,
    /// The kubelet root dir.
    pub root: PathBuf,
    /// The API.
    pub api: Arc<Api>,
    /// The node's registered drivers (None for the attach/detach controller).
    pub registry: Option<Arc<DriverRegistry>>,
    /// The mount layer.
    pub mounter: Arc<dyn MountLayer>,
    /// Feature gates that are on.
    pub gates: BTreeSet<String>,
    /// The node runs SELinux (`SELinuxLabelTranslator.SELinuxEnabled`): volumes may be mounted with a
    /// context.
    pub selinux: bool,
    /// The node's service-account tokens.
    pub tokens: Arc<TokenManager>,
}

#[async_trait]
impl VolumeHost for NodeHost {
    fn node_name(&self) -> &str {
        &self.node
    }

    fn root_dir(&self) -> &Path {
        &self.root
    }

    fn mounter(&self) -> Arc<dyn MountLayer> {
        Arc::clone(&self.mounter)
    }

    fn feature_enabled(&self, gate: &str) -> bool {
        self.gates.contains(gate)
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String> {
        Ok(self
            .api
            .get_recorded::<Secret>(namespace, name)
            .map(Arc::unwrap_or_clone))
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, String> {
        Ok(self
            .api
            .get_recorded::<ConfigMap>(namespace, name)
            .map(Arc::unwrap_or_clone))
    }

    fn node_allocatable(&self) -> NodeAllocatable {
        allocatable()
    }

    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        Ok(self
            .api
            .get_recorded::<CSIDriver>("", name)
            .map(Arc::unwrap_or_clone))
    }

    async fn persistent_volumes_with_handle(
        &self,
        driver: &str,
        handle: &str,
    ) -> Result<Vec<PersistentVolume>, String> {
        Ok(self
            .api
            .list::<PersistentVolume>()
            .into_iter()
            .filter(|pv| {
                let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
                csi.is_some_and(|c| c.driver == driver && c.volume_handle == handle)
            })
            .map(Arc::unwrap_or_clone)
            .collect())
    }

    async fn csi_client(&self, driver: &str) -> Result<CsiClient, String> {
        if driver.is_empty() {
            return Err("driver name is empty".into());
        }
        let registered = self.registry.as_ref().and_then(|r| r.get(driver));
        registered.map(|r| r.client).ok_or_else(|| {
            format!("driver name {driver} not found in the list of registered CSI drivers")
        })
    }

    async fn service_account_token(
        &self,
        request: TokenRequestArgs,
    ) -> Result<(String, String), String> {
        let token = self.tokens.get(&request).await?;
        // `metav1.Time` marshals as RFC 3339 in UTC with whole seconds.
        let expires =
            k8s_openapi::jiff::Timestamp::try_from(token.expires).map_err(|e| e.to_string())?;
        Ok((token.token, expires.to_string()))
    }

    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String> {
        Ok(self
            .api
            .get_recorded::<VolumeAttachment>("", name)
            .map(Arc::unwrap_or_clone))
    }

    async fn create_volume_attachment(&self, attachment: VolumeAttachment) -> Result<(), String> {
        let name = attachment.metadata.name.clone().unwrap_or_default();
        if self.api.peek::<VolumeAttachment>("", &name).is_none() {
            self.api.put(attachment);
        }
        Ok(())
    }

    fn pod_event(&self, pod: &PodInfo, type_: &str, reason: &str, message: &str) {
        if let Some(object) = self
            .api
            .peek::<ApiPod>(&pod.namespace, &pod.name)
            .filter(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()))
        {
            self.api.record_event(&object, type_, reason, message);
        }
    }

    async fn delete_volume_attachment(&self, name: &str) -> Result<(), String> {
        // Deletion is graceful: the external attacher's finalizer keeps the object until ControllerUnpublish.
        self.api.update::<VolumeAttachment>("", name, |va| {
            va.metadata.deletion_timestamp.get_or_insert_with(now);
        });
        Ok(())
    }
}

/// The node's allocatable CPU and memory, as a kubelet with no reservations reports them: the host's CPUs,
/// and its memory less the default hard eviction threshold (`memory.available<100Mi`).
pub fn allocatable() -> NodeAllocatable {
    static ALLOCATABLE: std::sync::OnceLock<NodeAllocatable> = std::sync::OnceLock::new();
    ALLOCATABLE
        .get_or_init(|| NodeAllocatable {
            cpu_millis: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u64 * 1000),
            memory: nix::sys::sysinfo::sysinfo()
                .ok()
                .map(|info| info.ram_total().saturating_sub(100 << 20)),
        })
        .clone()
}
