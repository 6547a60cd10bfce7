//! Actual state of world: what is attached, staged and mounted on this node, including what may be
//! mounted after an uncertain failure (`actual_state_of_world.go`). Changed only by finished operations,
//! but for the notes of pods found waiting for a mount, which the populator clears too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use inlet_volume::{PodInfo, Spec};
use litemap::LiteMap;

/// Whether a mount surely exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountState {
    /// The operation succeeded.
    Mounted,
    /// The operation failed in a way that may have left it mounted: tear it down if no longer wanted.
    Uncertain,
}

/// One pod's mount of a volume.
#[derive(Debug, Clone)]
pub struct MountedPod {
    /// The pod.
    pub pod: Arc<PodInfo>,
    /// The pod's name for the volume.
    pub outer_name: String,
    /// The spec's name (the pod's volume name, or the PV's), which names the mount dir.
    pub spec_name: String,
    /// The mount dir.
    pub path: PathBuf,
    /// Mounted or uncertain.
    pub state: MountState,
    /// When it was last (re)published, for `requiresRepublish`.
    pub published_at: Instant,
    /// Read back from disk after a restart, not yet set up by this kubelet.
    pub reconstructed: bool,
}

/// A volume known on this node.
#[derive(Debug, Clone)]
pub struct ActualVolume {
    /// The spec it was set up from.
    pub spec: Spec,
    /// Attached (or needs no attach).
    pub attached: bool,
    /// The staging path and its state, once staged (or possibly staged).
    pub device: Option<(PathBuf, MountState)>,
    /// The pods it is mounted for: mostly one, so a sorted vector sized for one (a `BTreeMap` allocates
    /// a node of eleven entries for the first), each boxed so that the vector stays small.
    pub pods: LiteMap<String, Box<MountedPod>>,
}

impl ActualVolume {
    /// The pod's mount of this volume, if surely mounted.
    pub fn mounted(&self, uid: &str) -> Option<&MountedPod> {
        self.pods
            .get(uid)
            .map(Box::as_ref)
            .filter(|m| m.state == MountState::Mounted)
    }
}

/// What is on this node.
#[derive(Debug, Default)]
pub struct ActualState {
    volumes: BTreeMap<String, ActualVolume>,
    /// How many volumes are (possibly) mounted for each pod, SetUps in flight included, so asking costs
    /// nothing per volume.
    mounts_by_pod: foldhash::HashMap<String, usize>,
    /// Pods found waiting for a mount that nothing of theirs changed since (see
    /// [`Self::known_not_mounted`]).
    not_mounted: foldhash::HashSet<String>,
}

impl ActualState {
    /// Records a volume as attached (creating its entry).
    pub fn mark_attached(&mut self, unique: &str, spec: &Spec) {
        self.volumes
            .entry(unique.to_string())
            .or_insert_with(|| ActualVolume {
                spec: spec.clone(),
                attached: true,
                device: None,
                pods: LiteMap::with_capacity(1),
            })
            .attached = true;
    }

    /// Records the staging state.
    pub fn set_device(&mut self, unique: &str, device: Option<(PathBuf, MountState)>) {
        if let Some(v) = self.volumes.get_mut(unique) {
            v.device = device;
        }
    }

    /// Records a pod's mount.
    pub fn set_pod(&mut self, unique: &str, mount: MountedPod) {
        if let Some(v) = self.volumes.get_mut(unique) {
            let uid = mount.pod.uid.clone();
            self.not_mounted.remove(&uid);
            if v.pods.insert(uid.clone(), Box::new(mount)).is_none() {
                *self.mounts_by_pod.entry(uid).or_default() += 1;
            }
        }
    }

    /// Forgets a pod's mount.
    pub fn remove_pod(&mut self, unique: &str, uid: &str) {
        if let Some(v) = self.volumes.get_mut(unique)
            && v.pods.remove(uid).is_some()
        {
            self.forget_mount(uid);
        }
        self.not_mounted.remove(uid);
    }

    /// True when the pod was found waiting for a mount ([`Self::note_not_mounted`]) and none of its
    /// mounts, nor its wanted volumes ([`Self::pod_changed`]), changed since: the pod workers ask for
    /// every waiting pod on every pass, and the answer can turn only when one of those does.
    pub fn known_not_mounted(&self, uid: &str) -> bool {
        self.not_mounted.contains(uid)
    }

    /// The pod waits for a mount (see [`Self::known_not_mounted`]).
    pub fn note_not_mounted(&mut self, uid: &str) {
        self.not_mounted.insert(uid.to_string());
    }

    /// What the pod wants changed: it is looked at again.
    pub fn pod_changed(&mut self, uid: &str) {
        self.not_mounted.remove(uid);
    }

    /// Forgets a volume that no pod has mounted and that is not staged.
    pub fn remove_if_unused(&mut self, unique: &str) {
        if self
            .volumes
            .get(unique)
            .is_some_and(|v| v.pods.is_empty() && v.device.is_none())
        {
            self.volumes.remove(unique);
        }
    }

    /// A SetUp of one of the pod's volumes starts: until it ends the pod counts as having mounts (what it
    /// publishes may be mounted before it is recorded), so its directory is not removed under it.
    pub fn begin_set_up(&mut self, uid: &str) {
        *self.mounts_by_pod.entry(uid.to_string()).or_default() += 1;
    }

    /// The SetUp [`Self::begin_set_up`] counted ended (its mount, if any, is recorded by now).
    pub fn end_set_up(&mut self, uid: &str) {
        self.forget_mount(uid);
    }

    fn forget_mount(&mut self, uid: &str) {
        if let Some(count) = self.mounts_by_pod.get_mut(uid) {
            *count -= 1;
            if *count == 0 {
                self.mounts_by_pod.remove(uid);
            }
        }
    }

    /// All volumes.
    pub fn volumes(&self) -> &BTreeMap<String, ActualVolume> {
        &self.volumes
    }

    /// One volume.
    pub fn volume(&self, unique: &str) -> Option<&ActualVolume> {
        self.volumes.get(unique)
    }

    /// The pod's mount of a volume, if surely mounted.
    pub fn mounted(&self, unique: &str, uid: &str) -> Option<&MountedPod> {
        self.volumes.get(unique)?.mounted(uid)
    }

    /// Every pod's mount that succeeded, with its volume.
    pub fn mounted_pods(&self) -> impl Iterator<Item = (&ActualVolume, &MountedPod)> {
        self.volumes.values().flat_map(|v| {
            v.pods
                .values()
                .filter(|m| m.state == MountState::Mounted)
                .map(move |m| (v, m.as_ref()))
        })
    }

    /// Whether a SetUp of the pod's volume now is a remount: it is mounted (a republish), or was
    /// reconstructed from disk (not a mount a timeout left uncertain).
    pub fn is_remount(&self, unique: &str, uid: &str) -> bool {
        let mount = self.volumes.get(unique).and_then(|v| v.pods.get(uid));
        mount.is_some_and(|m| m.state == MountState::Mounted || m.reconstructed)
    }

    /// Whether the pod has a volume (possibly) mounted, or one being set up.
    pub fn pod_has_mounts(&self, uid: &str) -> bool {
        self.mounts_by_pod.contains_key(uid)
    }
}
