//! Attach, detach, and device mount (stage) of the CSI plugin (`csi_attacher.go`).
//!
//! Attaching is writing a VolumeAttachment named csi-sha256(handle + driver + node); the external attacher
//! (simulated by kubelet-sim) calls ControllerPublishVolume and marks it attached. For a persistent inline
//! volume the attachment carries a copy of the inline source (as `inlineVolumeSpec`, with the secret
//! references of the PersistentVolume that grants it), so detach works after the pod is gone, and after
//! its namespace is gone.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use inlet_proto::csi::v1::{self as csi, node_service_capability::rpc::Type as NodeCap};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::handle::attachment_name;
use super::mounter::{capability, mount_options_with_label, publish_context, read_secret};
use super::source::{CsiSource, resolve};
use super::vol_data::VolData;
use super::{PLUGIN_NAME, log, spec_driver};
use crate::{
    Attacher, Detacher, DeviceMounter, DeviceUnmounter, PodInfo, SecretRef, Spec, VolumeError,
    VolumeHost,
};
use inlet_proto::csi_call::rpc_error;

/// The annotation that records the namespace of the pod a persistent inline attachment was made for.
pub const INLINE_NAMESPACE_ANNOTATION: &str = "inlet.dev/inline-volume-namespace";

/// Attaches and detaches CSI volumes through VolumeAttachments.
pub struct CsiAttacher {
    pub(super) host: Arc<dyn VolumeHost>,
}

#[async_trait]
impl Attacher for CsiAttacher {
    async fn attach(&self, spec: &Spec, pod: &PodInfo, node: &str) -> Result<String, VolumeError> {
        let source = resolve(self.host.as_ref(), spec, pod).await?;
        let handle = source.require_handle(spec.name())?;
        let name = attachment_name(handle, &source.driver, node);
        let attachment_source = match spec {
            Spec::Persistent { pv, .. } => VolumeAttachmentSource {
                persistent_volume_name: pv.metadata.name.clone(),
                ..Default::default()
            },
            Spec::Inline { .. } => VolumeAttachmentSource {
                inline_volume_spec: Some(inline_copy(&source, handle)),
                ..Default::default()
            },
        };
        let annotations = matches!(spec, Spec::Inline { .. }).then(|| {
            [(
                INLINE_NAMESPACE_ANNOTATION.to_string(),
                pod.namespace.clone(),
            )]
            .into()
        });
        let attachment = VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations,
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: source.driver.clone(),
                node_name: node.to_string(),
                source: attachment_source,
            },
            status: None,
        };
        self.host
            .create_volume_attachment(attachment)
            .await
            .map_err(VolumeError::transient)?;
        Ok(name)
    }

    async fn wait_for_attach(
        &self,
        spec: &Spec,
        pod: &PodInfo,
        node: &str,
    ) -> Result<(), VolumeError> {
        let source = resolve(self.host.as_ref(), spec, pod).await?;
        let name = attachment_name(source.require_handle(spec.name())?, &source.driver, node);
        let attachment = self
            .host
            .volume_attachment(&name)
            .await
            .map_err(VolumeError::transient)?;
        let status = attachment
            .ok_or_else(|| {
                VolumeError::transient(format!(
                    "volumeattachments.storage.k8s.io {name:?} not found"
                ))
            })?
            .status
            .unwrap_or_default();
        match (status.attached, status.attach_error.and_then(|e| e.message)) {
            (true, _) => Ok(()),
            (false, Some(error)) => Err(VolumeError::transient(format!(
                "attachment {name:?} failed: {error}"
            ))),
            (false, None) => Err(VolumeError::transient(format!(
                "volume attachment {name:?} is not attached yet"
            ))),
        }
    }
}

#[async_trait]
impl Detacher for CsiAttacher {
    async fn detach(&self, name: &str) -> Result<(), VolumeError> {
        self.host
            .delete_volume_attachment(name)
            .await
            .map_err(VolumeError::transient)
    }
}

/// The inline source as a PV spec, with the granting PV's secrets: what the attacher needs after the pod is gone.
fn inline_copy(source: &CsiSource, handle: &str) -> PersistentVolumeSpec {
    let reference = |r: &Option<SecretRef>| {
        r.as_ref().map(|r| SecretReference {
            name: Some(r.name.clone()),
            namespace: Some(r.namespace.clone()),
        })
    };
    PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(CSIPersistentVolumeSource {
            driver: source.driver.clone(),
            volume_handle: handle.to_string(),
            read_only: Some(source.read_only),
            fs_type: source.fs_type.clone(),
            volume_attributes: Some(source.attributes.clone()),
            controller_publish_secret_ref: reference(&source.controller_publish_secret),
            node_stage_secret_ref: reference(&source.node_stage_secret),
            node_publish_secret_ref: reference(&source.node_publish_secret),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[async_trait]
impl DeviceMounter for CsiAttacher {
    async fn mount_device(
        &self,
        spec: &Spec,
        pod: &PodInfo,
        path: &Path,
        selinux_label: &str,
    ) -> Result<(), VolumeError> {
        self.stage(spec, pod, path, selinux_label).await
    }
}

impl CsiAttacher {
    async fn stage(
        &self,
        spec: &Spec,
        pod: &PodInfo,
        path: &Path,
        selinux_label: &str,
    ) -> Result<(), VolumeError> {
        let host = self.host.as_ref();
        let driver_name = spec_driver(spec);
        let client = host.csi_client(&driver_name).await.map_err(|e| {
            VolumeError::transient(log(format!(
                "attacher.MountDevice failed to create newCsiDriverClient: {e}"
            )))
        })?;
        let source = resolve(host, spec, pod).await.map_err(|e| {
            e.context(log(
                "attacher.MountDevice failed to get CSIPersistentVolumeSource",
            ))
        })?;
        let handle = source
            .require_handle(spec.name())
            .map_err(|e| e.context(PLUGIN_NAME))?
            .to_string();
        let caps = client
            .node_capabilities()
            .await
            .map_err(|s| VolumeError::transient(rpc_error(&s)))?;
        let stages = caps.contains(&NodeCap::StageUnstageVolume);
        let driver = host
            .csi_driver(&driver_name)
            .await
            .map_err(VolumeError::transient)?;
        let publish_context = publish_context(host, driver.as_ref(), &driver_name, &handle).await?;
        // Secrets are read only when the driver stages.
        let secrets = match stages {
            true => {
                read_secret(
                    host,
                    source.node_stage_secret.as_ref(),
                    "NodeStageSecretRef",
                )
                .await?
            }
            false => Default::default(),
        };
        // The staging dir and its record exist even when the driver does not stage: UnmountDevice needs
        // the record (csi_attacher.go keeps just volumeHandle and driverName there). A block volume's
        // record is the volume's own (`volumeDevices/<pv>/data`).
        let record_dir = match source.block {
            true => super::block::data_dir(host, spec.name()),
            false => path.parent().unwrap_or(path).to_path_buf(),
        };
        let parent = record_dir.as_path();
        std::fs::create_dir_all(path)
            .and_then(|()| std::fs::create_dir_all(parent))
            .map_err(|e| {
                VolumeError::transient(log(format!(
                    "attacher.MountDevice failed to create dir {:?}:  {e}",
                    path.display()
                )))
            })?;
        let (options, selinux_mount_context) =
            mount_options_with_label(host, spec, driver.as_ref(), selinux_label);
        VolData::save_staging(parent, &handle, &driver_name, &selinux_mount_context).map_err(
            |e| VolumeError::final_(log(format!("failed to save volume info data: {e}"))),
        )?;
        if !stages {
            // Upstream: "STAGE_UNSTAGE_VOLUME capability not set. Skipping MountDevice...".
            return Ok(());
        }
        // The same access-mode mapper as NodePublishVolume; fsGroup goes to a driver that applies it
        // itself (VOLUME_MOUNT_GROUP), as MountDevice in csi_attacher.go does.
        let access_mode = source.csi_access_mode(caps.contains(&NodeCap::SingleNodeMultiWriter));
        let volume_mount_group = match (caps.contains(&NodeCap::VolumeMountGroup), pod.fs_group) {
            (true, Some(gid)) => gid.to_string(),
            _ => String::new(),
        };
        let request = csi::NodeStageVolumeRequest {
            volume_id: handle,
            publish_context,
            staging_target_path: path.display().to_string(),
            volume_capability: Some(capability(
                &source,
                access_mode,
                options,
                volume_mount_group,
            )),
            secrets,
            volume_context: source.attributes.clone().into_iter().collect(),
        };
        if let Err(status) = client.node_stage(request).await {
            let err = VolumeError::from_csi(&status, rpc_error(&status));
            if err.class == crate::ErrorClass::Final {
                remove_staging_dir(host, path);
            }
            return Err(err);
        }
        super::check_driver_left_dir(host, "attacher.MountDevice", path).await
    }
}

#[async_trait]
impl DeviceUnmounter for CsiAttacher {
    async fn unmount_device(&self, path: &Path) -> Result<(), VolumeError> {
        let host = self.host.as_ref();
        let record_dir = match super::block::staged_spec_name(host, path) {
            Some(name) => super::block::data_dir(host, &name),
            None => path.parent().unwrap_or(path).to_path_buf(),
        };
        let Ok(data) = VolData::load(&record_dir) else {
            // Never staged through the driver (no data file): only the directory may be left.
            remove_staging_dir(host, path);
            return Ok(());
        };
        let client = host.csi_client(&data.driver_name).await.map_err(|e| {
            VolumeError::transient(format!(
                "{PLUGIN_NAME}: attacher.UnmountDevice failed to get CSI client: {e}"
            ))
        })?;
        let caps = client
            .node_capabilities()
            .await
            .map_err(|s| VolumeError::transient(rpc_error(&s)))?;
        if caps.contains(&NodeCap::StageUnstageVolume) {
            client
                .node_unstage(&data.volume_handle, &path.display().to_string())
                .await
                .map_err(|s| {
                    VolumeError::from_csi(
                        &s,
                        format!(
                            "{PLUGIN_NAME}: attacher.UnmountDevice failed: {}",
                            rpc_error(&s)
                        ),
                    )
                })?;
        }
        remove_staging_dir(host, path);
        Ok(())
    }
}

/// Removes a staging dir (when no longer mounted), its data file and its parent; a block volume's, with
/// its record (`block::remove_staging`).
fn remove_staging_dir(host: &dyn VolumeHost, path: &Path) {
    if let Some(name) = super::block::staged_spec_name(host, path) {
        return super::block::remove_staging(host, &name);
    }
    super::mounter::remove_mount_dir(host, path);
}
