//! The `kubernetes.io/csi` volume plugin: CSI volumes, inline (KEP-596) and persistent, as the kubelet's
//! `pkg/volume/csi` runs them.
//!
//! - `source.rs`: spec -> driver, handle, lifecycle mode, secret refs (and the persistent-inline gate).
//! - `driver.rs`: CSIDriver-driven policy (lifecycle modes, fsGroup, pod info, tokens), upstream texts.
//! - `mounter.rs`: SetUpAt / TearDownAt (NodePublish / NodeUnpublish).
//! - `attacher.rs`: attach and detach (VolumeAttachments), MountDevice / UnmountDevice (NodeStage / NodeUnstage).
//! - `block.rs`: raw block volumes' paths (`csi_block.go`): staged and published with the Block access
//!   type by the same device mounter and mounter, and given to the pod as a device symlink.
//! - `client.rs`: the CSI client with the kubelet's timeout and a call observer; `connection.rs`: its
//!   connection, dialed for each burst of calls and closed after it (upstream dials for each call);
//!   `handle.rs`: the names; `vol_data.rs`: the data file beside each mount; `expander.rs`:
//!   NodeExpandVolume of a mounted PV; `metrics.rs`: a mounted volume's usage and condition
//!   (NodeGetVolumeStats), for the stats provider.
//!
//! The plugin's own file work on the kubelet dir (a few `mkdir`s, `vol_data.json`, the removals after a
//! teardown) runs where it is called, as in upstream's Go code; the walks that can be long (fsGroup, the
//! check of what a driver left) go to the blocking pool. Sending every such call there was measured:
//! 10–22 % longer to settle 100,000 pods, 45–85 s more CPU (bench/RESULTS.md, issue #28's eighth pass).

pub mod attacher;
mod block;
mod client;
mod connection;
pub mod driver;
pub mod expander;
pub mod grant;
pub mod handle;
pub mod metrics;
mod mounter;
pub mod source;
pub mod vol_data;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{InlineVolume, VolumeSource};

pub use client::{Answer, CSI_TIMEOUT, CsiClient, CsiObserver};
pub use mounter::{CsiMounter, CsiUnmounter};
use source::{LifecycleMode, resolve};
use vol_data::VolData;

use super::{
    AttachableVolumePlugin, Attacher, Detacher, DeviceMountableVolumePlugin, DeviceMounter,
    DeviceUnmounter, InlineCsi, Metrics, Mounter, PodInfo, Spec, Unmounter, VolumeError,
    VolumeHost, VolumePlugin,
};

/// `CSIPluginName`.
pub const PLUGIN_NAME: &str = "kubernetes.io/csi";

/// `log(msg)` of upstream's `csi_plugin.go`: the plugin's prefix on the errors it makes itself. What the
/// driver or the API answered (a NodePublishVolume or NodeStageVolume failure, a secret lookup) reaches
/// the event unwrapped, as upstream returns it.
pub(crate) fn log(message: impl std::fmt::Display) -> String {
    format!("{PLUGIN_NAME}: {message}")
}

/// The CSI plugin. One per node; shares the node's [`VolumeHost`].
pub struct CsiPlugin {
    host: Arc<dyn VolumeHost>,
}

impl CsiPlugin {
    /// A plugin over `host`.
    pub fn new(host: Arc<dyn VolumeHost>) -> Self {
        Self { host }
    }

    fn attacher(&self) -> attacher::CsiAttacher {
        attacher::CsiAttacher {
            host: Arc::clone(&self.host),
        }
    }
}

/// The driver a spec names, without any lookup.
pub(crate) fn spec_driver(spec: &Spec) -> String {
    match spec {
        Spec::Inline { csi, .. } => csi
            .as_ref()
            .map(|c| c.source.driver.clone())
            .unwrap_or_default(),
        Spec::Persistent { pv, .. } => pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.driver.clone())
            .unwrap_or_default(),
    }
}

/// The registered driver's client and its node capabilities (what the stats provider and the expander
/// ask before they call).
pub(crate) async fn client_with_capabilities(
    host: &dyn VolumeHost,
    driver: &str,
) -> Result<
    (
        CsiClient,
        Vec<inlet_proto::csi::v1::node_service_capability::rpc::Type>,
    ),
    VolumeError,
> {
    let client = host
        .csi_client(driver)
        .await
        .map_err(VolumeError::transient)?;
    let capabilities = client
        .node_capabilities()
        .await
        .map_err(|s| VolumeError::from_csi(&s, inlet_proto::csi_call::rpc_error(&s)))?;
    Ok((client, capabilities))
}

/// `plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount` under the root dir; a driver name that
/// is not one path component is refused (it cannot leave the root, whatever admission let through).
pub(crate) fn device_path_for(
    host: &dyn VolumeHost,
    driver: &str,
    handle: &str,
) -> Result<PathBuf, VolumeError> {
    let csi_dir = host.root_dir().join("plugins").join(PLUGIN_NAME);
    let driver_dir = inlet_host::host_path::join_name(&csi_dir, driver)
        .map_err(|e| VolumeError::final_(format!("driver name {e}")))?;
    Ok(driver_dir
        .join(handle::staging_dir_name(handle))
        .join("globalmount"))
}

/// Checks what a driver left at `path`, a target or staging path the kubelet gave it: below the kubelet
/// dir, reached without a symlink, and a directory (when there is anything). A driver that put a symlink in
/// its place would lead the fsGroup walk, the container's bind and the teardown out of the kubelet dir.
/// Upstream trusts the driver here; this defence is inlet's (`kep/upstream-differences.md`). The volume is
/// left uncertain, so it is unpublished (or unstaged) as any other.
pub(crate) async fn check_driver_left_dir(
    host: &dyn VolumeHost,
    step: &str,
    path: &Path,
) -> Result<(), VolumeError> {
    let (root, path) = (host.root_dir().to_path_buf(), path.to_path_buf());
    let shown = path.display().to_string();
    let check = move || -> Result<(), String> {
        let (root, relative) = inlet_host::host_path::below(&root, &path)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "it is not below the kubelet dir".to_string())?;
        let Some(fd) =
            inlet_host::host_path::open_below(&root, &relative).map_err(|e| e.to_string())?
        else {
            return Ok(());
        };
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| e.to_string())?;
        match nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode)
            & nix::sys::stat::SFlag::S_IFMT
        {
            nix::sys::stat::SFlag::S_IFDIR => Ok(()),
            _ => Err(format!("{} is not a directory", path.display())),
        }
    };
    let checked = tokio::task::spawn_blocking(check)
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    checked.map_err(|why| {
        VolumeError::uncertain(log(format!(
            "{step} refused the path the driver left at {shown}: {why}"
        )))
    })
}

#[async_trait]
impl VolumePlugin for CsiPlugin {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn can_support(&self, spec: &Spec) -> bool {
        match spec {
            Spec::Inline { csi, .. } => csi.is_some(),
            Spec::Persistent { pv, .. } => pv.spec.as_ref().is_some_and(|s| s.csi.is_some()),
        }
    }

    /// Ephemeral: `kubernetes.io/csi/<podUID>-<volume>` (one per pod). Persistent: `kubernetes.io/csi/<driver>^<handle>`
    /// (shared by every pod on the node that uses the handle).
    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError> {
        let source = resolve(self.host.as_ref(), spec, pod).await?;
        Ok(match (source.mode, &source.handle) {
            (LifecycleMode::Persistent, Some(handle)) => {
                format!("{PLUGIN_NAME}/{}^{handle}", source.driver)
            }
            _ => format!("{PLUGIN_NAME}/{}-{}", pod.uid, spec.name()),
        })
    }

    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError> {
        Ok(Box::new(self.mounter(spec, pod)))
    }

    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError> {
        // A block volume's map is known by what its MapPodDevice left: the pod's device symlink, or a
        // publish path made before the symlink was.
        let host = self.host.as_ref();
        let block = block::pod_device_path(host, pod_uid, spec_name)
            .symlink_metadata()
            .is_ok()
            || block::publish_path(host, spec_name, pod_uid)
                .symlink_metadata()
                .is_ok();
        Ok(Box::new(CsiUnmounter {
            host: Arc::clone(&self.host),
            spec_name: spec_name.to_string(),
            pod_uid: pod_uid.to_string(),
            block,
        }))
    }

    /// From `vol_data.json` (see [`spec_from_vol_data`]).
    fn construct_volume_spec(&self, spec_name: &str, pod_uid: &str) -> Result<Spec, VolumeError> {
        let dir = self.host.pod_volume_dir(pod_uid, PLUGIN_NAME, spec_name);
        let data = VolData::load(&dir).map_err(|e| {
            VolumeError::final_(format!(
                "failed to load {}: {e}",
                dir.join(vol_data::FILE_NAME).display()
            ))
        })?;
        Ok(spec_from_vol_data(&data))
    }

    async fn metrics(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Option<Metrics>, VolumeError> {
        metrics::get(self.host.as_ref(), spec_name, pod_uid).await
    }

    async fn requires_remount(&self, spec: &Spec, _pod: &PodInfo) -> bool {
        let driver = self
            .host
            .csi_driver(&spec_driver(spec))
            .await
            .ok()
            .flatten();
        driver
            .and_then(|d| d.spec.requires_republish)
            .unwrap_or(false)
    }

    /// `csiPlugin.SupportsSELinuxContextMount`: the CSIDriver's `seLinuxMount`; no CSIDriver is no.
    async fn supports_selinux_context_mount(&self, spec: &Spec) -> Result<bool, VolumeError> {
        let driver = self
            .host
            .csi_driver(&spec_driver(spec))
            .await
            .map_err(VolumeError::transient)?;
        Ok(driver.and_then(|d| d.spec.se_linux_mount) == Some(true))
    }

    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin> {
        Some(self)
    }

    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin> {
        Some(self)
    }
}

/// The spec a `vol_data.json` describes (pod volumes and staging dirs alike): an ephemeral volume comes
/// back as an inline source with only its driver (its attributes are lost, as upstream); a persistent one
/// as a PV with driver and handle.
pub fn spec_from_vol_data(data: &VolData) -> Spec {
    let name = data.spec_vol_id.clone();
    let source = CSIVolumeSource {
        driver: data.driver_name.clone(),
        ..Default::default()
    };
    match data.lifecycle_mode.as_str() {
        "Ephemeral" => Spec::Inline {
            volume: InlineVolume::new(name, VolumeSource::Csi(source.clone())),
            csi: Some(Arc::new(InlineCsi {
                source,
                ..Default::default()
            })),
        },
        _ => Spec::Persistent {
            pv: Arc::new(PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(name),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    csi: Some(CSIPersistentVolumeSource {
                        driver: data.driver_name.clone(),
                        volume_handle: data.volume_handle.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                status: None,
            }),
            read_only: false,
        },
    }
}

#[async_trait]
impl AttachableVolumePlugin for CsiPlugin {
    /// Never for ephemeral volumes (checked before `attachRequired`, as upstream); a missing CSIDriver means
    /// attach is required.
    async fn can_attach(&self, spec: &Spec, pod: &PodInfo) -> Result<bool, VolumeError> {
        if resolve(self.host.as_ref(), spec, pod).await?.mode == LifecycleMode::Ephemeral {
            return Ok(false);
        }
        let driver = self
            .host
            .csi_driver(&spec_driver(spec))
            .await
            .map_err(VolumeError::transient)?;
        Ok(driver.and_then(|d| d.spec.attach_required) != Some(false))
    }

    fn new_attacher(&self) -> Box<dyn Attacher> {
        Box::new(self.attacher())
    }

    fn new_detacher(&self) -> Box<dyn Detacher> {
        Box::new(self.attacher())
    }
}

#[async_trait]
impl DeviceMountableVolumePlugin for CsiPlugin {
    /// Never for ephemeral volumes: no NodeStage, whatever the driver advertises.
    async fn can_device_mount(&self, spec: &Spec, pod: &PodInfo) -> Result<bool, VolumeError> {
        Ok(resolve(self.host.as_ref(), spec, pod).await?.mode == LifecycleMode::Persistent)
    }

    async fn device_mount_path(&self, spec: &Spec, pod: &PodInfo) -> Result<PathBuf, VolumeError> {
        let source = resolve(self.host.as_ref(), spec, pod).await?;
        if source.block {
            return Ok(block::staging_path(self.host.as_ref(), spec.name()));
        }
        device_path_for(
            self.host.as_ref(),
            &source.driver,
            source.require_handle(spec.name())?,
        )
    }

    fn new_device_mounter(&self) -> Box<dyn DeviceMounter> {
        Box::new(self.attacher())
    }

    fn new_device_unmounter(&self) -> Box<dyn DeviceUnmounter> {
        Box::new(self.attacher())
    }
}
