//! A pod volume as a plugin [`Spec`]: inline sources as written (with the KEP draft's fields), claims as
//! their bound PVs. Shared by the node's populator and the attach/detach controller.

use inlet_volume::{InlineCsi, InlineVolume, PodInfo, Spec, VolumeSource};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};

use crate::api::Api;
use crate::api::manifest::draft_fields;

/// How a caller reads the API: a node's direct reads are recorded for the report; a controller's come from
/// its informer cache and are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// `Api::get_recorded`.
    Recorded,
    /// `Api::peek`, not recorded.
    Cached,
}

fn read<T: crate::api::store::Kind>(
    api: &Api,
    reads: Reads,
    namespace: &str,
    name: &str,
) -> Option<std::sync::Arc<T>> {
    match reads {
        Reads::Recorded => api.get_recorded(namespace, name),
        Reads::Cached => api.peek(namespace, name),
    }
}

/// A claim's volume is a filesystem for volumeMounts and a device for volumeDevices, as its PV's
/// `volumeMode` says (`createVolumeSpec` in desired_state_of_world_populator.go; Filesystem when unset).
fn check_volume_mode(pod: &Pod, name: &str, pv: &PersistentVolume) -> Result<(), String> {
    let mode = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let containers = crate::node::all_containers(pod);
    let (mut mounted, mut mapped) = (false, false);
    for c in containers {
        mounted |= c.volume_mounts.iter().flatten().any(|m| m.name == name);
        mapped |= c.volume_devices.iter().flatten().any(|d| d.name == name);
    }
    if mounted && mode != "Filesystem" {
        return Err(format!(
            "volume {name} has volumeMode {mode}, but is specified in volumeMounts"
        ));
    }
    if mapped && mode != "Block" {
        return Err(format!(
            "volume {name} has volumeMode {mode}, but is specified in volumeDevices"
        ));
    }
    Ok(())
}

/// The spec of one pod volume, and the volume's own read-only flag. Errors are in upstream's words.
pub fn volume_spec(
    api: &Api,
    reads: Reads,
    pod: &Pod,
    info: &PodInfo,
    volume: &InlineVolume,
) -> Result<(Spec, bool), String> {
    let name = volume.name();
    if let Some(source) = volume.csi().cloned() {
        let (volume_handle, controller_publish_secret, node_stage_secret) = draft_fields(pod, name);
        let read_only = source.read_only.unwrap_or(false);
        let csi = InlineCsi {
            source,
            volume_handle,
            controller_publish_secret,
            node_stage_secret,
        };
        return Ok((
            Spec::Inline {
                volume: volume.clone(),
                csi: Some(std::sync::Arc::new(csi)),
            },
            read_only,
        ));
    }
    // A generic ephemeral volume is its claim `<pod>-<volume>`, which the pod must own
    // (desired_state_of_world_populator.go createVolumeSpec, `ephemeral.VolumeIsForPod`).
    let claim = match volume
        .other()
        .map(|v| (&v.persistent_volume_claim, &v.ephemeral))
    {
        Some((Some(claim), _)) => Some((
            claim.claim_name.clone(),
            claim.read_only.unwrap_or(false),
            false,
        )),
        Some((None, Some(_))) => Some((format!("{}-{name}", info.name), false, true)),
        _ => None,
    };
    if let Some((claim_name, read_only, ephemeral)) = claim {
        let pvc = read::<PersistentVolumeClaim>(api, reads, &info.namespace, &claim_name)
            .ok_or_else(|| format!("persistentvolumeclaim {claim_name:?} not found"))?;
        let owned = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref());
        if ephemeral && !owned {
            return Err(format!(
                "PVC {}/{claim_name} was not created for pod {}/{} (pod is not owner)",
                info.namespace, info.namespace, info.name
            ));
        }
        let phase = pvc
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let pv_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if phase != "Bound" || pv_name.is_empty() {
            return Err(format!(
                "PVC {}/{claim_name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({pv_name:?})",
                info.namespace
            ));
        }
        let pv = read::<PersistentVolume>(api, reads, "", &pv_name)
            .ok_or_else(|| format!("persistentvolume {pv_name:?} not found"))?;
        check_volume_mode(pod, name, &pv)?;
        return Ok((Spec::Persistent { pv, read_only }, read_only));
    }
    // Image volumes are read-only by definition (KEP-4639), whatever the volumeMount says; so are secret,
    // configMap, downwardAPI and projected volumes, whose mounters' attributes say ReadOnly (`makeMounts`'
    // mustMountRO).
    let read_only = matches!(
        volume.source(),
        VolumeSource::Image(_)
            | VolumeSource::Secret(_)
            | VolumeSource::ConfigMap(_)
            | VolumeSource::DownwardApi(_)
            | VolumeSource::Projected(_)
    );
    Ok((
        Spec::Inline {
            volume: volume.clone(),
            csi: None,
        },
        read_only,
    ))
}
