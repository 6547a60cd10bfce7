//! Finishing a resize on the node (`operation_generator.go` GenerateExpandInUseVolumeFunc, asked for by
//! the populator's `checkVolumeFSResize`): a PV mounted for a pod whose capacity grew beyond its claim's
//! status capacity (`volumeRequiresFSResize`) is expanded with NodeExpandVolume at the pod's mount path
//! (when the driver expands on the node); then the claim's status capacity is the PV's, its
//! `FileSystemResizePending` condition and `NodeResizePending` status go (`MarkFSResizeFinished`), and the
//! pod gets a `FileSystemResizeSuccessful` event.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use super::VolumeManager;
use super::desired_state::PodVolume;
use super::reconciler::Recorded;
use crate::api::ApiPod;
use crate::controllers::resizer::{FS_RESIZE_PENDING, storage_bytes};
use crate::operations::OpKey;

/// A mounted volume to expand: its claim, fresh PV and the new size.
struct Resize {
    unique: String,
    volume: Arc<PodVolume>,
    path: PathBuf,
    claim: Arc<PersistentVolumeClaim>,
    pv: Arc<PersistentVolume>,
    new_size: i64,
}

impl VolumeManager {
    /// Starts an expansion of every mounted PV volume that needs one.
    pub(super) fn expand_in_use_volumes(self: &Arc<Self>) {
        let mounted: Vec<(String, Arc<PodVolume>, PathBuf)> = {
            let (dsw, asw) = (self.dsw.lock(), self.asw.lock());
            if !dsw.has_persistent() {
                return;
            }
            dsw.volumes()
                .iter()
                .flat_map(|(unique, desired)| {
                    desired.pods.iter().filter_map(|(uid, volume)| {
                        // Only a PV is resized: an inline volume costs no lookup here.
                        if !matches!(volume.spec, inlet_volume::Spec::Persistent { .. }) {
                            return None;
                        }
                        let mount = asw.mounted(unique, uid)?;
                        Some((unique.clone(), Arc::clone(volume), mount.path.clone()))
                    })
                })
                .collect()
        };
        for (unique, volume, path) in mounted {
            let Some(resize) = self.resize_needed(unique, volume, path) else {
                continue;
            };
            // One expansion of a volume at a time on the node, whatever the pods
            // (`pendingOperations.Run(volumeName, "", ...)`).
            let key = OpKey::device(&resize.unique);
            if self.start(&key, "volume_fs_resize") {
                let named = (self.metric_plugin(&resize.volume.spec), "volume_fs_resize");
                self.spawn_op(key, Recorded::Always(named), move |me| me.expand(resize));
            }
        }
    }

    /// The resize a mounted volume needs: its PV's capacity beyond its claim's status capacity.
    fn resize_needed(
        &self,
        unique: String,
        volume: Arc<PodVolume>,
        path: PathBuf,
    ) -> Option<Resize> {
        // A read-only volume is not resized (`checkVolumeFSResize`).
        if volume.read_only {
            return None;
        }
        let pod = self
            .api
            .peek::<ApiPod>(&volume.pod.namespace, &volume.pod.name)?;
        let source = pod.volume(&volume.outer_name)?.other()?;
        let claim_name = match (&source.persistent_volume_claim, &source.ephemeral) {
            (Some(claim), _) => claim.claim_name.clone(),
            (None, Some(_)) => format!("{}-{}", volume.pod.name, volume.outer_name),
            (None, None) => return None,
        };
        let claim = self
            .api
            .peek::<PersistentVolumeClaim>(&volume.pod.namespace, &claim_name)?;
        let pv_name = claim.spec.as_ref()?.volume_name.clone()?;
        let pv = self.api.peek::<PersistentVolume>("", &pv_name)?;
        let has = storage_bytes(claim.status.as_ref()?.capacity.as_ref())?;
        let grown = storage_bytes(pv.spec.as_ref()?.capacity.as_ref())?;
        (grown > has).then(|| Resize {
            unique,
            volume,
            path,
            claim,
            pv,
            new_size: i64::try_from(grown).unwrap_or(i64::MAX),
        })
    }

    /// NodeExpandVolume, then the claim's resize finished and the pod told.
    async fn expand(self: Arc<Self>, resize: Resize) -> bool {
        let host = self.host.as_ref();
        let expanded = inlet_volume::csi::expander::node_expand(
            host,
            &resize.pv,
            &resize.path,
            resize.new_size,
        )
        .await;
        let name = resize.volume.spec.name().to_string();
        let pod = &resize.volume.pod;
        if let Err(e) = expanded {
            let message = format!(
                "NodeExpandVolume.NodeExpandVolume failed for volume {name:?} : {}",
                e.message
            );
            self.warn_as(pod, "VolumeResizeFailed", &message);
            return false;
        }
        let capacity = resize.pv.spec.as_ref().and_then(|s| s.capacity.clone());
        let claim_name = resize.claim.metadata.name.clone().unwrap_or_default();
        self.api
            .update::<PersistentVolumeClaim>(&pod.namespace, &claim_name, |c| {
                let status = c.status.get_or_insert_with(Default::default);
                status.capacity = capacity;
                status.allocated_resource_statuses = None;
                if let Some(conditions) = &mut status.conditions {
                    conditions.retain(|c| c.type_ != FS_RESIZE_PENDING);
                }
            });
        if let Some(object) = self.api.peek::<ApiPod>(&pod.namespace, &pod.name) {
            let message = format!(
                "MountVolume.NodeExpandVolume succeeded for volume {name:?} {}",
                self.node
            );
            self.api
                .record_event(&object, "Normal", "FileSystemResizeSuccessful", &message);
        }
        true
    }
}
