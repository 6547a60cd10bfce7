//! Desired state of world: the volumes this node's pods want, by unique volume name, with the pods that
//! want each (`pkg/kubelet/volumemanager/cache/desired_state_of_world.go`). Filled by the populator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use inlet_volume::selinux::Labels;
use inlet_volume::{PodInfo, Spec};
use litemap::LiteMap;

/// One pod's use of a volume.
#[derive(Debug, Clone)]
pub struct PodVolume {
    /// The pod.
    pub pod: Arc<PodInfo>,
    /// The pod's name for the volume (`spec.volumes[i].name`): what events and volumeMounts use.
    pub outer_name: String,
    /// The volume as the plugin sees it (for a PVC: the bound PV).
    pub spec: Spec,
    /// The volume's own read-only flag (inline `csi.readOnly`, the PV's or the claim's): the CRI mount is
    /// read-only when this or the volumeMount says so.
    pub read_only: bool,
    /// The driver asks to be published again periodically (CSIDriver `requiresRepublish`).
    pub requires_republish: bool,
    /// The SELinux labels of the volume for the pod; once added, `mount` is the volume's, which the first
    /// pod that added it set (`effectiveSELinuxMountFileLabel`): what it is mounted with (`-o context=`).
    pub selinux: Labels,
}

/// A volume some pods want.
#[derive(Debug, Clone)]
pub struct DesiredVolume {
    /// Must be attached (VolumeAttachment) before use.
    pub attachable: bool,
    /// Must be staged (NodeStage) before use.
    pub device_mountable: bool,
    /// The pods that want it, by UID: mostly one (an inline volume is its pod's own), so a sorted vector
    /// sized for one (a `BTreeMap` allocates a node of eleven entries for the first). Shared: the
    /// reconciler's actions and operations hold them too.
    pub pods: LiteMap<String, Arc<PodVolume>>,
    /// The SELinux labels of the first pod that added it.
    pub selinux: Labels,
}

/// The volumes wanted on this node.
#[derive(Debug, Default)]
pub struct DesiredState {
    volumes: BTreeMap<String, DesiredVolume>,
    /// The unique names of each pod's volumes, so a pod's questions cost its own volumes, not the node's.
    by_pod: foldhash::HashMap<String, BTreeSet<String>>,
    /// How many pods' volumes are PVs: none, and a pass has no resize to look for.
    persistent: usize,
    /// The volumes that must be attached: what `node.status.volumesInUse` reports, asked on every pass.
    attachable: BTreeSet<String>,
}

impl DesiredState {
    /// Adds a pod's use of a volume. A pod whose SELinux label differs from the one the volume is mounted
    /// with, where the volume takes one, is refused in upstream's words (`AddPodToVolume`).
    pub fn add(
        &mut self,
        unique: &str,
        attachable: bool,
        device_mountable: bool,
        mut volume: PodVolume,
    ) -> Result<(), String> {
        if attachable && !self.volumes.contains_key(unique) {
            self.attachable.insert(unique.to_string());
        }
        let entry = self
            .volumes
            .entry(unique.to_string())
            .or_insert_with(|| DesiredVolume {
                attachable,
                device_mountable,
                pods: LiteMap::with_capacity(1),
                selinux: volume.selinux.clone(),
            });
        let theirs = &entry.selinux.original;
        let new_pod = !entry.pods.contains_key(&volume.pod.uid);
        if new_pod && volume.selinux.supported && *theirs != volume.selinux.original {
            return Err(format!(
                "conflicting SELinux labels of volume {}: {theirs:?} and {:?}",
                volume.spec.name(),
                volume.selinux.original
            ));
        }
        volume.selinux.mount = entry.selinux.mount.clone();
        if new_pod && matches!(volume.spec, Spec::Persistent { .. }) {
            self.persistent += 1;
        }
        self.by_pod
            .entry(volume.pod.uid.clone())
            .or_default()
            .insert(unique.to_string());
        entry.pods.insert(volume.pod.uid.clone(), Arc::new(volume));
        Ok(())
    }

    /// Removes every volume use of a pod; volumes no pod wants any more go. Returns the pod's volumes.
    pub fn remove_pod(&mut self, uid: &str) -> BTreeSet<String> {
        let volumes = self.by_pod.remove(uid).unwrap_or_default();
        for unique in &volumes {
            if let Some(volume) = self.volumes.get_mut(unique) {
                let removed = volume.pods.remove(uid);
                if removed.is_some_and(|v| matches!(v.spec, Spec::Persistent { .. })) {
                    self.persistent -= 1;
                }
                if volume.pods.is_empty() {
                    self.volumes.remove(unique);
                    self.attachable.remove(unique);
                }
            }
        }
        volumes
    }

    /// The volumes that must be attached, by unique name.
    pub fn attachable(&self) -> &BTreeSet<String> {
        &self.attachable
    }

    /// The UIDs of the pods with volumes added.
    pub fn pods(&self) -> impl Iterator<Item = &String> {
        self.by_pod.keys()
    }

    /// True when the pod's volumes have been added.
    pub fn has_pod(&self, uid: &str) -> bool {
        self.by_pod.contains_key(uid)
    }

    /// A pod's volumes: (unique name, its use by the pod). Nothing is copied: the pod workers ask for
    /// each waiting pod on every pass.
    pub fn pod_volumes<'a>(
        &'a self,
        uid: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Arc<PodVolume>)> + 'a {
        self.by_pod
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(move |unique| {
                let volume = self.volumes.get(unique)?.pods.get(uid)?;
                Some((unique.as_str(), volume))
            })
    }

    /// True when some pod's volume is a PV.
    pub fn has_persistent(&self) -> bool {
        self.persistent > 0
    }

    /// All wanted volumes.
    pub fn volumes(&self) -> &BTreeMap<String, DesiredVolume> {
        &self.volumes
    }

    /// One volume.
    pub fn volume(&self, unique: &str) -> Option<&DesiredVolume> {
        self.volumes.get(unique)
    }
}
