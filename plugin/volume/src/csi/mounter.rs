//! `SetUpAt` and `TearDownAt` of the CSI plugin, step by step as the kubelet's `csi_mounter.go` (see the
//! reference's order of operations): client, source, lifecycle mode, fsGroup policy, access mode, staging and
//! publish context (persistent only), secrets from the pod's namespace, pod info, tokens, `vol_data.json`,
//! NodePublishVolume, fsGroup.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use inlet_host::mount::MountLayer;
use inlet_proto::csi::v1::{self as csi, node_service_capability::rpc::Type as NodeCap};
use inlet_proto::csi_call::rpc_error;

use super::block;
use super::driver::{
    check_lifecycle_mode, fs_group_policy, pod_info_attributes, service_account_tokens,
    supports_fs_group,
};
use super::handle::attachment_name;
use super::source::{CsiSource, LifecycleMode, is_block, resolve};
use super::vol_data::VolData;
use super::{CsiPlugin, PLUGIN_NAME, device_path_for, log, spec_driver};
use crate::ownership::set_volume_ownership;
use crate::{Mounter, MounterArgs, PodInfo, SecretRef, Spec, Unmounter, VolumeError, VolumeHost};
use k8s_openapi::api::storage::v1::CSIDriver;

/// Mounts one CSI volume for one pod.
pub struct CsiMounter {
    pub(super) host: Arc<dyn VolumeHost>,
    pub(super) spec: Spec,
    pub(super) pod: PodInfo,
}

#[async_trait]
impl Mounter for CsiMounter {
    /// A filesystem's mount dir; for a block volume, the pod's device symlink (`GetPodDeviceMapPath`).
    fn path(&self) -> PathBuf {
        if is_block(&self.spec) {
            return block::pod_device_path(self.host.as_ref(), &self.pod.uid, self.spec.name());
        }
        self.host
            .pod_volume_dir(&self.pod.uid, PLUGIN_NAME, self.spec.name())
            .join("mount")
    }

    async fn set_up_at(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        self.set_up(dir, args).await
    }
}

impl CsiMounter {
    async fn set_up(&self, dir: &Path, args: &MounterArgs) -> Result<(), VolumeError> {
        let host = self.host.as_ref();
        let driver_name = spec_driver(&self.spec);
        // 1. The driver must be registered: checked before anything else, as upstream does.
        let client = host.csi_client(&driver_name).await.map_err(|e| {
            VolumeError::transient(log(format!(
                "mounter.SetUpAt failed to get CSI client: {e}"
            )))
        })?;
        // 3. The source.
        let source = resolve(host, &self.spec, &self.pod)
            .await
            .map_err(|e| e.context(log("mounter.SetupAt failed to get CSI persistent source")))?;
        // 4-5. The CSIDriver object decides the lifecycle modes and the fsGroup policy.
        let driver = host
            .csi_driver(&driver_name)
            .await
            .map_err(|e| VolumeError::transient(log(e)))?;
        check_lifecycle_mode(&driver_name, driver.as_ref(), source.mode).map_err(|e| {
            VolumeError::transient(log(format!(
                "mounter.SetupAt failed to check volume lifecycle mode: {e}"
            )))
        })?;
        let policy = fs_group_policy(driver.as_ref()).map_err(|e| {
            VolumeError::transient(log(format!(
                "mounter.SetupAt failed to check fsGroup policy: {e}"
            )))
        })?;
        let handle = source
            .require_handle(self.spec.name())
            .map_err(|e| e.context(PLUGIN_NAME))?
            .to_string();

        // 6. Access mode, by the mapper the driver's SINGLE_NODE_MULTI_WRITER capability selects.
        let caps = client.node_capabilities().await.map_err(|s| {
            VolumeError::transient(log(format!(
                "mounter.SetUpAt failed to get node capabilities: {}",
                s.message()
            )))
        })?;
        let access_mode = source.csi_access_mode(caps.contains(&NodeCap::SingleNodeMultiWriter));

        // 7. Persistent volumes only: the staging path and the attachment's publish context.
        let (staging_path, publish_context) = match source.mode {
            LifecycleMode::Ephemeral => (String::new(), HashMap::new()),
            LifecycleMode::Persistent => {
                let staging = match caps.contains(&NodeCap::StageUnstageVolume) {
                    true if source.block => block::staging_path(host, self.spec.name())
                        .display()
                        .to_string(),
                    true => device_path_for(host, &driver_name, &handle)?
                        .display()
                        .to_string(),
                    false => String::new(),
                };
                let context = publish_context(host, driver.as_ref(), &driver_name, &handle)
                    .await
                    .map_err(|e| {
                        e.context(log("mounter.SetUpAt failed to fetch publishContext"))
                    })?;
                (staging, context)
            }
        };

        // 8. The volume's parent dir (the driver creates `mount/` itself). A block volume is published
        // to a device file the driver creates below the kubelet's publish dir (`MapPodDevice`), its
        // record kept with the volume's (`volumeDevices/<pv>/data`).
        let target = match source.block {
            true => block::publish_path(host, self.spec.name(), &self.pod.uid),
            false => dir.to_path_buf(),
        };
        let record_dir = match source.block {
            true => block::data_dir(host, self.spec.name()),
            false => dir.parent().unwrap_or(dir).to_path_buf(),
        };
        let parent = target.parent().unwrap_or(&target);
        // A filesystem volume's record dir is the target's parent: made once.
        std::fs::create_dir_all(parent)
            .and_then(|()| match record_dir == parent {
                true => Ok(()),
                false => std::fs::create_dir_all(&record_dir),
            })
            .map_err(|e| {
                VolumeError::transient(log(format!(
                    "mounter.SetUpAt failed to create dir {:?}:  {e}",
                    parent.display()
                )))
            })?;

        // 9. Secrets: only the referenced one, from the namespace the source resolved to.
        let mut secrets = read_secret(
            host,
            source.node_publish_secret.as_ref(),
            "NodePublishSecretRef",
        )
        .await?;

        // 10-11. Volume context: kubelet keys overwrite same-named user attributes (mergeMap).
        let mut context: BTreeMap<String, String> = source.attributes.clone();
        if driver.as_ref().and_then(|d| d.spec.pod_info_on_mount) == Some(true) {
            context.extend(pod_info_attributes(&self.pod, source.mode));
        }
        let tokens = service_account_tokens(host, driver.as_ref(), &self.pod)
            .await
            .map_err(|e| {
                VolumeError::transient(log(format!(
                    "mounter.SetUpAt failed to get service accoount token attributes: {e}"
                )))
            })?;
        // With `serviceAccountTokenInSecrets` (1.35, KEP-5538) the tokens go only in the secrets, under
        // the same key, so drivers and sidecars that log the volume context never see them.
        if let Some(tokens) = tokens {
            let in_secrets = driver
                .as_ref()
                .and_then(|d| d.spec.service_account_token_in_secrets)
                == Some(true);
            match in_secrets {
                true => secrets.insert(inlet_proto::csi_call::TOKENS_KEY.to_string(), tokens),
                false => context.insert(inlet_proto::csi_call::TOKENS_KEY.to_string(), tokens),
            };
        }

        // 12. A driver with VOLUME_MOUNT_GROUP applies fsGroup itself.
        let mount_group = caps.contains(&NodeCap::VolumeMountGroup);
        let volume_mount_group = match (mount_group, args.fs_group) {
            (true, Some(gid)) => gid.to_string(),
            _ => String::new(),
        };

        // 13. The SELinux context, when the driver mounts with one.
        let (options, selinux_mount_context) =
            mount_options_with_label(host, &self.spec, driver.as_ref(), &args.selinux_label);

        // 14. vol_data.json, so the volume can be unmounted (and reconstructed) without the pod.
        let data = VolData {
            selinux_mount_context,
            ..vol_data(host, &self.spec, &driver_name, &handle, source.mode)
        };
        data.save(&record_dir).map_err(|e| {
            VolumeError::transient(log(format!(
                "mounter.SetUpAt failed to save volume info data: {e}"
            )))
        })?;
        inlet_host::crash::point("setup.recorded");

        // 15. NodePublishVolume.
        let request = csi::NodePublishVolumeRequest {
            volume_id: handle.clone(),
            publish_context,
            staging_target_path: staging_path,
            target_path: target.display().to_string(),
            volume_capability: Some(capability(
                &source,
                access_mode,
                options,
                volume_mount_group,
            )),
            readonly: source.read_only,
            secrets,
            volume_context: context.into_iter().collect(),
        };
        // The driver's error is returned as it is, without the plugin's prefix (csi_mounter.go).
        if let Err(status) = client.node_publish(request).await {
            let err = VolumeError::from_csi(&status, rpc_error(&status));
            if err.class == crate::ErrorClass::Final && !args.remount {
                match source.block {
                    true => block::remove_pod_map(host, self.spec.name(), &self.pod.uid),
                    false => remove_mount_dir(host, dir),
                }
            }
            return Err(err);
        }
        inlet_host::crash::point("setup.published");
        if source.block {
            // `MapBlockVolume`: the pod's device is a symlink to the published device file. Block
            // volumes take no fsGroup.
            return map_block_volume(dir, &target);
        }
        super::check_driver_left_dir(host, "mounter.SetUpAt", &target).await?;

        // 17. fsGroup, unless the volume is read-only, the policy says no, or the driver applied it.
        if !mount_group
            && supports_fs_group(
                source.fs_type.as_deref(),
                args.fs_group,
                &policy,
                source.read_only,
                source.pv_access_modes.as_deref(),
            )
        {
            if let Some(gid) = args.fs_group {
                apply_fs_group(self.host.mounter(), dir, gid)
                    .await
                    .map_err(|e| {
                        VolumeError::uncertain(format!("applyFSGroup failed for vol {handle}: {e}"))
                    })?;
            }
        }
        Ok(())
    }
}

/// Points the pod's device symlink `link` at the published device file, replacing a stale link.
fn map_block_volume(link: &Path, device: &Path) -> Result<(), VolumeError> {
    let fail = |e: std::io::Error| {
        VolumeError::transient(log(format!(
            "blockMapper.MapPodDevice failed to map the device {}: {e}",
            link.display()
        )))
    };
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    if std::fs::read_link(link).is_ok_and(|to| to == device) {
        return Ok(());
    }
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(device, link).map_err(fail)
}

/// The publish context of a persistent volume: its VolumeAttachment's `attachmentMetadata`, when the driver
/// needs attaching (`attachRequired` unset or true); a missing attachment is transient (not attached yet).
pub(super) async fn publish_context(
    host: &dyn VolumeHost,
    driver: Option<&CSIDriver>,
    driver_name: &str,
    handle: &str,
) -> Result<HashMap<String, String>, VolumeError> {
    if driver.and_then(|d| d.spec.attach_required) == Some(false) {
        return Ok(HashMap::new());
    }
    let name = attachment_name(handle, driver_name, host.node_name());
    let attachment = host
        .volume_attachment(&name)
        .await
        .map_err(VolumeError::transient)?;
    let attachment = attachment.ok_or_else(|| {
        VolumeError::transient(format!(
            "volumeattachments.storage.k8s.io {name:?} not found"
        ))
    })?;
    Ok(attachment
        .status
        .and_then(|s| s.attachment_metadata)
        .unwrap_or_default()
        .into_iter()
        .collect())
}

/// The `vol_data.json` record of a volume set up (or staged) on this node.
fn vol_data(
    host: &dyn VolumeHost,
    spec: &Spec,
    driver_name: &str,
    handle: &str,
    mode: LifecycleMode,
) -> VolData {
    VolData {
        spec_vol_id: spec.name().to_string(),
        volume_handle: handle.to_string(),
        driver_name: driver_name.to_string(),
        node_name: host.node_name().to_string(),
        attachment_id: attachment_name(handle, driver_name, host.node_name()),
        lifecycle_mode: mode.as_str().to_string(),
        selinux_mount_context: String::new(),
    }
}

/// Unmounts one CSI volume of one pod; needs only what `vol_data.json` recorded.
pub struct CsiUnmounter {
    pub(super) host: Arc<dyn VolumeHost>,
    pub(super) spec_name: String,
    pub(super) pod_uid: String,
    /// A block volume's map (`UnmapPodDevice`), not a mount.
    pub(super) block: bool,
}

#[async_trait]
impl Unmounter for CsiUnmounter {
    fn path(&self) -> PathBuf {
        if self.block {
            return block::pod_device_path(self.host.as_ref(), &self.pod_uid, &self.spec_name);
        }
        self.host
            .pod_volume_dir(&self.pod_uid, PLUGIN_NAME, &self.spec_name)
            .join("mount")
    }

    async fn tear_down_at(&self, dir: &Path) -> Result<(), VolumeError> {
        self.tear_down(dir)
            .await
            .map_err(|e| e.context(PLUGIN_NAME))
    }
}

impl CsiUnmounter {
    async fn tear_down(&self, dir: &Path) -> Result<(), VolumeError> {
        if self.block {
            return self.unmap_pod_device().await;
        }
        let host = self.host.as_ref();
        let parent = dir.parent().unwrap_or(dir);
        let data = match VolData::load(parent) {
            Ok(data) => data,
            // Nothing recorded and nothing mounted: a set-up that never reached the driver. Clean up.
            Err(_) if !host.mounter().is_mount_point(dir).unwrap_or(true) => {
                remove_mount_dir(host, dir);
                return Ok(());
            }
            Err(e) => {
                let file = parent.join(super::vol_data::FILE_NAME);
                return Err(VolumeError::final_(format!(
                    "unmounter failed to load volume data file [{}]: {e}",
                    file.display()
                )));
            }
        };
        unpublish(host, &data, dir, "Unmounter.TearDownAt").await?;
        inlet_host::crash::point("teardown.unpublished");
        remove_mount_dir(host, dir);
        Ok(())
    }
}

impl CsiUnmounter {
    /// `UnmapPodDevice`: NodeUnpublishVolume of the pod's device file, then its symlink and dirs. A map
    /// whose record is gone was never published: only what the kubelet made is removed.
    async fn unmap_pod_device(&self) -> Result<(), VolumeError> {
        let host = self.host.as_ref();
        let publish = block::publish_path(host, &self.spec_name, &self.pod_uid);
        let Ok(data) = VolData::load(&block::data_dir(host, &self.spec_name)) else {
            block::remove_pod_map(host, &self.spec_name, &self.pod_uid);
            return Ok(());
        };
        unpublish(host, &data, &publish, "blockMapper.UnmapPodDevice").await?;
        block::remove_pod_map(host, &self.spec_name, &self.pod_uid);
        Ok(())
    }
}

/// NodeUnpublishVolume of `target` for the volume `data` records; errors name `operation`.
async fn unpublish(
    host: &dyn VolumeHost,
    data: &VolData,
    target: &Path,
    operation: &str,
) -> Result<(), VolumeError> {
    let client = host.csi_client(&data.driver_name).await.map_err(|e| {
        VolumeError::transient(format!("{operation} failed to get CSI client: {e}"))
    })?;
    client
        .node_unpublish(&data.volume_handle, &target.display().to_string())
        .await
        .map_err(|s| VolumeError::from_csi(&s, format!("{operation} failed: {}", rpc_error(&s))))
}

/// The CSI capability for a volume.
pub(super) fn capability(
    source: &CsiSource,
    mode: csi::volume_capability::access_mode::Mode,
    mount_flags: Vec<String>,
    volume_mount_group: String,
) -> csi::VolumeCapability {
    let access_mode = Some(csi::volume_capability::AccessMode { mode: mode as i32 });
    if source.block {
        return csi::VolumeCapability {
            access_mode,
            access_type: Some(csi::volume_capability::AccessType::Block(
                csi::volume_capability::BlockVolume {},
            )),
        };
    }
    csi::VolumeCapability {
        access_mode,
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: source.fs_type.clone().unwrap_or_default(),
                mount_flags,
                volume_mount_group,
            },
        )),
    }
}

/// A PV's `mountOptions`; inline volumes have none.
pub(super) fn mount_options(spec: &Spec) -> Vec<String> {
    match spec {
        Spec::Persistent { pv, .. } => pv
            .spec
            .as_ref()
            .and_then(|s| s.mount_options.clone())
            .unwrap_or_default(),
        Spec::Inline { .. } => Vec::new(),
    }
}

/// The spec's mount options, then `context="<label>"` when the `SELinuxMountReadWriteOncePod` gate is on,
/// the CSIDriver says `seLinuxMount` and the volume manager gave a label (csi_mounter.go SetUpAt,
/// csi_attacher.go MountDevice); with the label mounted with, which `vol_data.json` records as
/// `seLinuxMountContext`.
pub(super) fn mount_options_with_label(
    host: &dyn VolumeHost,
    spec: &Spec,
    driver: Option<&CSIDriver>,
    label: &str,
) -> (Vec<String>, String) {
    let mut options = mount_options(spec);
    let supports = driver.and_then(|d| d.spec.se_linux_mount) == Some(true);
    if !host.feature_enabled(crate::selinux::SELINUX_MOUNT_READ_WRITE_ONCE_POD)
        || !supports
        || label.is_empty()
    {
        return (options, String::new());
    }
    options.push(crate::selinux::mount_option(label));
    (options, label.to_string())
}

/// Reads a referenced secret: every key of `data`, as strings. A missing one is transient: the mount goes
/// through once the secret appears.
pub(super) async fn read_secret(
    host: &dyn VolumeHost,
    reference: Option<&SecretRef>,
    field: &str,
) -> Result<HashMap<String, String>, VolumeError> {
    let Some(r) = reference else {
        return Ok(HashMap::new());
    };
    let fail = |why: String| {
        VolumeError::transient(format!(
            "fetching {field} {}/{} failed: {why}",
            r.namespace, r.name
        ))
    };
    let secret = host.secret(&r.namespace, &r.name).await.map_err(fail)?;
    let secret = secret.ok_or_else(|| fail(format!("secrets {:?} not found", r.name)))?;
    let mut values = HashMap::new();
    for (key, value) in secret.data.unwrap_or_default() {
        values.insert(key, String::from_utf8_lossy(&value.0).into_owned());
    }
    for (key, value) in secret.string_data.unwrap_or_default() {
        values.insert(key, value);
    }
    Ok(values)
}

/// `removeMountDir`: once `dir` is no longer a mount point, removes it, then `vol_data.json`, then the
/// volume dir. A dir still mounted is left alone (the driver did not unmount it).
pub(super) fn remove_mount_dir(host: &dyn VolumeHost, dir: &Path) {
    if host.mounter().is_mount_point(dir).unwrap_or(true) {
        tracing::warn!(dir = %dir.display(), "still a mount point; not removing it");
        return;
    }
    let _ = std::fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = std::fs::remove_file(parent.join(super::vol_data::FILE_NAME));
        let _ = std::fs::remove_dir(parent);
    }
}

/// [`set_volume_ownership`] for a read-write volume, on the blocking pool.
async fn apply_fs_group(mounter: Arc<dyn MountLayer>, dir: &Path, gid: i64) -> std::io::Result<()> {
    let dir = dir.to_path_buf();
    let walk = move || set_volume_ownership(mounter.as_ref(), &dir, gid, false);
    tokio::task::spawn_blocking(walk)
        .await
        .map_err(std::io::Error::other)?
}

impl CsiPlugin {
    /// A mounter (used by `VolumePlugin::new_mounter`).
    pub(super) fn mounter(&self, spec: &Spec, pod: &PodInfo) -> CsiMounter {
        CsiMounter {
            host: Arc::clone(&self.host),
            spec: spec.clone(),
            pod: pod.clone(),
        }
    }
}
