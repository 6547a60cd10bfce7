//! The kubelet-side volume plugin framework, shaped like the kubelet's `pkg/volume`: a [`VolumePlugin`] is a
//! factory plus capability queries; per-volume objects ([`Mounter`], [`Unmounter`], [`Attacher`], ...) do
//! the work; optional powers (attach, device mount) are separate traits reached through `Option`, so asking
//! a plugin for a power it lacks yields "absent", never an error. Every operation is idempotent: the volume
//! manager calls it again after any failure or restart.
//!
//! # Layout
//! - `error.rs`: [`VolumeError`] and its three classes (transient, uncertain, final).
//! - `spec.rs`: [`Spec`] (an inline volume or a PV), [`PodInfo`], [`SecretRef`]; `inline_volume.rs`:
//!   [`InlineVolume`], a pod volume's name and its one source, as a spec keeps it.
//! - `host.rs`: [`VolumeHost`], what the kubelet gives plugins (secrets, CSIDriver objects, CSI clients,
//!   tokens, VolumeAttachments, paths, the mount layer).
//! - [`csi`]: the `kubernetes.io/csi` plugin, carrying the KEP-596 inline contract.
//! - [`image`]: the `kubernetes.io/image` plugin: `volumes[].image` (KEP-4639) mounted kubelet-side.
//! - [`selinux`]: the label a volume is mounted with for a pod (`-o context=`, KEP-1710).
//! - [`secret`], [`config_map`], [`downward_api`], [`projected`], [`empty_dir`]: `secret`, `configMap`,
//!   `downwardAPI`, `projected` and `emptyDir` volumes, as a real cluster's pods carry them (a 1.21+ API
//!   server adds a projected `kube-api-access-*` volume to every pod, a 1.20 one a token `secret`); all but
//!   the last written by `atomic_writer.rs` (`AtomicWriter`), given to the pod's fsGroup by `ownership.rs`
//!   (`SetVolumeOwnership`, which the CSI plugin uses too). `fieldpath.rs`: the downward API's values.

mod atomic_writer;
pub mod config_map;
pub mod csi;
pub mod downward_api;
pub mod empty_dir;
mod error;
pub mod fieldpath;
mod host;
pub mod image;
mod inline_volume;
mod ownership;
pub mod projected;
pub mod secret;
pub mod selinux;
mod spec;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

pub use error::{ErrorClass, VolumeError, aggregate};
pub use host::{TokenRequestArgs, VolumeHost};
pub use inline_volume::{InlineVolume, VolumeSource};
pub use spec::{InlineCsi, PodInfo, SecretRef, Spec, container_resources};

/// A kind of volume. One instance serves every volume of its kind on a node.
#[async_trait]
pub trait VolumePlugin: Send + Sync {
    /// The plugin's name, `kubernetes.io/csi`.
    fn name(&self) -> &'static str;
    /// True when this plugin handles `spec`.
    fn can_support(&self, spec: &Spec) -> bool;
    /// The name the volume manager tracks the volume by: shared by every pod that uses the same volume on a
    /// node when the plugin can attach or device-mount it, else unique to the pod.
    async fn unique_volume_name(&self, spec: &Spec, pod: &PodInfo) -> Result<String, VolumeError>;
    /// A mounter for `spec` in `pod`.
    fn new_mounter(&self, spec: &Spec, pod: &PodInfo) -> Result<Box<dyn Mounter>, VolumeError>;
    /// An unmounter for the pod's volume `spec_name` (it reads what it needs from disk, so it works after a
    /// restart without the pod).
    fn new_unmounter(
        &self,
        spec_name: &str,
        pod_uid: &str,
    ) -> Result<Box<dyn Unmounter>, VolumeError>;
    /// Rebuilds a spec from what is on disk after a restart (upstream `ConstructVolumeSpec`).
    fn construct_volume_spec(&self, spec_name: &str, pod_uid: &str) -> Result<Spec, VolumeError>;
    /// True when the volume must be mounted again periodically (CSIDriver `requiresRepublish`).
    async fn requires_remount(&self, spec: &Spec, pod: &PodInfo) -> bool;
    /// True when the plugin mounts the volume with `-o context=` given a label
    /// (`SupportsSELinuxContextMount`); most plugins leave labelling to the runtime.
    async fn supports_selinux_context_mount(&self, _spec: &Spec) -> Result<bool, VolumeError> {
        Ok(false)
    }
    /// The usage and condition of the pod's mounted volume `spec_name` (`MetricsProvider.GetMetrics`, which
    /// the kubelet's stats provider polls); `Ok(None)` when the plugin or its driver cannot say.
    async fn metrics(
        &self,
        _spec_name: &str,
        _pod_uid: &str,
    ) -> Result<Option<Metrics>, VolumeError> {
        Ok(None)
    }
    /// The attach power, if this plugin has it.
    fn attachable(&self) -> Option<&dyn AttachableVolumePlugin>;
    /// The device-mount (stage) power, if this plugin has it.
    fn device_mountable(&self) -> Option<&dyn DeviceMountableVolumePlugin>;
}

/// A plugin whose volumes are attached to a node before use (ControllerPublish through a VolumeAttachment).
#[async_trait]
pub trait AttachableVolumePlugin: Send + Sync {
    /// True when this spec needs attaching (false for ephemeral volumes and `attachRequired: false`).
    async fn can_attach(&self, spec: &Spec, pod: &PodInfo) -> Result<bool, VolumeError>;
    /// An attacher.
    fn new_attacher(&self) -> Box<dyn Attacher>;
    /// A detacher.
    fn new_detacher(&self) -> Box<dyn Detacher>;
}

/// A plugin whose volumes are mounted once per node at a global path before pods use them (NodeStage).
#[async_trait]
pub trait DeviceMountableVolumePlugin: Send + Sync {
    /// True when this spec is device-mounted (false for ephemeral volumes; a driver without STAGE_UNSTAGE
    /// makes the device mount a no-op, as upstream's `MountDevice` does).
    async fn can_device_mount(&self, spec: &Spec, pod: &PodInfo) -> Result<bool, VolumeError>;
    /// The node-global path the volume is staged at.
    async fn device_mount_path(&self, spec: &Spec, pod: &PodInfo) -> Result<PathBuf, VolumeError>;
    /// A device mounter.
    fn new_device_mounter(&self) -> Box<dyn DeviceMounter>;
    /// A device unmounter.
    fn new_device_unmounter(&self) -> Box<dyn DeviceUnmounter>;
}

/// A volume's usage and condition (upstream `volume.Metrics`): bytes and inodes as the driver counts them,
/// and, with the `CSIVolumeHealth` gate, whether the driver finds it abnormal and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Metrics {
    /// Bytes used.
    pub used: Option<i64>,
    /// Bytes in all.
    pub capacity: Option<i64>,
    /// Bytes left.
    pub available: Option<i64>,
    /// Inodes used.
    pub inodes_used: Option<i64>,
    /// Inodes in all.
    pub inodes: Option<i64>,
    /// Inodes left.
    pub inodes_free: Option<i64>,
    /// The driver's VolumeCondition: abnormal or not.
    pub abnormal: Option<bool>,
    /// The driver's VolumeCondition message.
    pub message: Option<String>,
}

/// What `set_up_at` is given besides the directory.
#[derive(Debug, Clone, Default)]
pub struct MounterArgs {
    /// The pod's fsGroup, applied when the plugin's policy says so.
    pub fs_group: Option<i64>,
    /// The volume is already set up for the pod: a republish, or one reconstructed after a restart. A
    /// failed SetUp then leaves the directory, the record and what the pod sees where they are
    /// (`MounterArgs.IsRemount` and `ReconstructedVolume`, 1.35 patch releases: kubernetes/kubernetes#121271,
    /// #136591). A mount a timeout left uncertain is not one: its final failure cleans up, as upstream's.
    pub remount: bool,
    /// The SELinux label to mount with (`-o context=`), when the plugin supports it; empty: none
    /// ([`selinux::labels`]).
    pub selinux_label: String,
}

/// Mounts one volume for one pod.
#[async_trait]
pub trait Mounter: Send + Sync {
    /// The directory the volume is mounted at for the pod (`.../volumes/kubernetes.io~csi/<name>/mount`).
    fn path(&self) -> PathBuf;
    /// Mounts the volume at `dir`. Idempotent.
    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError>;
}

/// Unmounts one volume for one pod.
#[async_trait]
pub trait Unmounter: Send + Sync {
    /// The directory the volume is mounted at.
    fn path(&self) -> PathBuf;
    /// Unmounts the volume at `dir` and removes what the mounter created. Idempotent.
    async fn tear_down_at(&self, dir: &Path) -> Result<(), VolumeError>;
}

/// Attaches volumes to nodes (run by the attach/detach controller).
#[async_trait]
pub trait Attacher: Send + Sync {
    /// Starts attaching `spec` to `node` and returns the attachment's name. Idempotent.
    async fn attach(&self, spec: &Spec, pod: &PodInfo, node: &str) -> Result<String, VolumeError>;
    /// Ok once the attachment is complete; a transient error while it is pending, the attach error otherwise.
    async fn wait_for_attach(
        &self,
        spec: &Spec,
        pod: &PodInfo,
        node: &str,
    ) -> Result<(), VolumeError>;
}

/// Detaches volumes from nodes.
#[async_trait]
pub trait Detacher: Send + Sync {
    /// Starts detaching the attachment `name`. Idempotent: a missing attachment is detached.
    async fn detach(&self, name: &str) -> Result<(), VolumeError>;
}

/// Mounts a volume at its node-global path (NodeStageVolume).
#[async_trait]
pub trait DeviceMounter: Send + Sync {
    /// Stages `spec` at `path` for `pod` (whose namespace resolves secret references), with the SELinux
    /// label `selinux_label` when not empty (`DeviceMounterArgs`). Idempotent.
    async fn mount_device(
        &self,
        spec: &Spec,
        pod: &PodInfo,
        path: &Path,
        selinux_label: &str,
    ) -> Result<(), VolumeError>;
}

/// Unmounts a volume from its node-global path (NodeUnstageVolume).
#[async_trait]
pub trait DeviceUnmounter: Send + Sync {
    /// Unstages the volume at `path`. Idempotent.
    async fn unmount_device(&self, path: &Path) -> Result<(), VolumeError>;
}
