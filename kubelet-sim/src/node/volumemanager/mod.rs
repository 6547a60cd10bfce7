//! The volume manager (`pkg/kubelet/volumemanager/volume_manager.go`): what this node's pods want mounted
//! and what is, kept behind one type that answers the kubelet's questions. The pod workers ask it
//! ([`VolumeManager::wait_for_attach_and_mount`], [`VolumeManager::mounted_volumes_for_pod`]); the node
//! status asks [`VolumeManager::volumes_in_use`]; nothing outside this module touches its state.
//!
//! # Layout
//! - `desired_state.rs`, `actual_state.rs`: what pods want, and what is attached, staged and mounted
//!   (`cache/desired_state_of_world.go`, `cache/actual_state_of_world.go`).
//! - `populator.rs`: pods bound to this node -> desired state (`desired_state_of_world_populator.go`).
//! - `reconciler.rs`: unmount what is unwanted, then attach-check, stage and mount what is missing
//!   (`reconciler/reconciler.go`), each step an operation with backoff (`crate::operations`); `plan.rs`:
//!   what a pass starts, found among the volumes whose state changed.
//! - `reconstruct.rs`: after a restart, the actual state read back from disk (`reconstruct.go`).
//! - `expand.rs`: mounted PVs expanded on the node after a resize (GenerateExpandInUseVolumeFunc).

mod actual_state;
mod desired_state;
mod expand;
mod plan;
mod populator;
mod reconciler;
mod reconstruct;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_volume::image::PLUGIN_NAME as IMAGE_PLUGIN;
use inlet_volume::{PodInfo, Spec, VolumePlugin};
use parking_lot::Mutex;
use tokio::sync::Notify;

use actual_state::ActualState;
pub use actual_state::MountState;
use desired_state::DesiredState;

use super::host::NodeHost;
use crate::api::Api;
use crate::operations::{BackoffPolicy, Operations};

/// A volume mounted for a pod, as its containers' mounts need it (`GetMountedVolumesForPod`).
#[derive(Debug, Clone)]
pub struct MountedVolume {
    /// Where the volume is mounted for the pod (the host path of its CRI mounts).
    pub path: PathBuf,
    /// The volume's spec name (the PV's name for a claim): its subPath binds are kept under it.
    pub spec_name: String,
    /// The volume itself is read-only (inline `readOnly`, the PV's or the claim's).
    pub read_only: bool,
    /// An image volume (`volumes[].image`): a subPath must already exist in it.
    pub image: bool,
}

/// Why a pod cannot start yet: its volumes that are not mounted, and those not attached, by the pod's
/// names for them (`WaitForAttachAndMount`'s error).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumesNotReady {
    /// Volumes not mounted for the pod.
    pub unmounted: Vec<String>,
    /// Volumes that must be attached and are not.
    pub unattached: Vec<String>,
}

/// A volume mounted for a pod, for its stats: the pod, its name for the volume, the spec's name, the plugin.
pub type VolumeInUse = (Arc<PodInfo>, String, String, Arc<dyn VolumePlugin>);

/// What the volume manager is set up with.
pub struct VolumeManagerConfig {
    /// The node's name.
    pub node: String,
    /// The kubelet's root dir.
    pub root: PathBuf,
    /// Retry backoff for volume operations.
    pub backoff: BackoffPolicy,
    /// How often volumes of drivers with `requiresRepublish` are published again.
    pub republish_period: Duration,
}

/// One node's volume manager.
pub struct VolumeManager {
    node: String,
    root: PathBuf,
    republish_period: Duration,
    api: Arc<Api>,
    host: Arc<NodeHost>,
    /// The node's volume plugins, the CSI plugin first (reconstruction's fallback).
    plugins: Vec<Arc<dyn VolumePlugin>>,
    dsw: Mutex<DesiredState>,
    asw: Mutex<ActualState>,
    ops: Mutex<Operations>,
    /// The volumes the reconciler's passes look at (`plan.rs`): taken after the other locks.
    review: Mutex<plan::Review>,
    /// Pods whose volumes the populator added (upstream's `processedPods`), with the fingerprint of the
    /// labels and annotations they were added with: not looked at again until the pod workers forget the
    /// pod, or those change (upstream reprocesses a pod on each of its syncs, so the downward API sees them).
    processed: Mutex<foldhash::HashMap<String, u64>>,
    /// The node's pod membership and the terminated pods at the populator's last look for pods that are
    /// gone (`populator.rs`).
    gone_looked: Mutex<Option<(u64, foldhash::HashSet<String>)>>,
    /// Set once the state left by a previous kubelet is reconstructed; the node is not idle before.
    reconstructed: AtomicBool,
    /// Set by the first populator pass after the API's sources are ready (upstream's `HasAddedPods`):
    /// until then nothing is torn down, since a pod missing from the desired state may only not be
    /// loaded yet (`reconstruct.go`, `readyToUnmount`).
    populator_has_added_pods: AtomicBool,
    /// Wakes the node's loop when an operation ends.
    kick: Arc<Notify>,
}

impl VolumeManager {
    /// The volumes of the desired and actual states of world, one per pod each, by plugin as upstream's
    /// metrics name it (`volume_manager_total_volumes`, `metrics.go`'s `totalVolumesCollector`).
    pub fn volume_counts(&self) -> BTreeMap<(String, &'static str), u64> {
        let mut counts = BTreeMap::new();
        let mut add = |spec: &Spec, state: &'static str, n: usize| {
            if n == 0 {
                return;
            }
            let plugin = self.metric_plugin(spec);
            *counts.entry((plugin, state)).or_default() += n as u64;
        };
        for volume in self.dsw.lock().volumes().values() {
            for pod in volume.pods.values() {
                add(&pod.spec, "desired_state_of_world", 1);
            }
        }
        // Upstream's `GetMountedVolumes`: mounts known to be there, not uncertain ones.
        for volume in self.asw.lock().volumes().values() {
            let mounted = volume
                .pods
                .values()
                .filter(|p| p.state == MountState::Mounted);
            add(&volume.spec, "actual_state_of_world", mounted.count());
        }
        counts
    }

    /// The plugin of `spec` as upstream's metrics name it (`kubernetes.io/csi:<driver>`).
    pub(crate) fn metric_plugin(&self, spec: &Spec) -> String {
        crate::metrics::plugin_label(self.plugin_for(spec).name(), spec)
    }

    /// A volume manager over the node's plugins (the CSI plugin first).
    pub fn new(
        config: VolumeManagerConfig,
        api: Arc<Api>,
        host: Arc<NodeHost>,
        plugins: Vec<Arc<dyn VolumePlugin>>,
        kick: Arc<Notify>,
    ) -> Self {
        Self {
            node: config.node,
            root: config.root,
            republish_period: config.republish_period,
            api,
            host,
            plugins,
            dsw: Mutex::default(),
            asw: Mutex::default(),
            ops: Mutex::new(Operations::new(config.backoff)),
            review: Mutex::default(),
            processed: Mutex::default(),
            gone_looked: Mutex::default(),
            reconstructed: AtomicBool::new(false),
            populator_has_added_pods: AtomicBool::new(false),
            kick,
        }
    }

    /// True once every volume of the pod is mounted for it (`WaitForAttachAndMount`; a volume that must
    /// be attached is mounted only once it is). It does not block: the pod workers ask on each pass, and
    /// log upstream's timeout error themselves, with [`Self::missing_volumes`].
    pub fn wait_for_attach_and_mount(&self, uid: &str) -> bool {
        if !self.processed.lock().contains_key(uid) {
            return false;
        }
        let dsw = self.dsw.lock();
        let mut asw = self.asw.lock();
        let all_mounted = |asw: &ActualState| {
            dsw.pod_volumes(uid)
                .all(|(unique, _)| asw.mounted(unique, uid).is_some())
        };
        if asw.known_not_mounted(uid) {
            debug_assert!(!all_mounted(&asw), "pod {uid} was mounted unnoticed");
            return false;
        }
        let mounted = all_mounted(&asw);
        if !mounted {
            asw.note_not_mounted(uid);
        }
        mounted
    }

    /// The pod's volumes that are not mounted or not attached, by the pod's names for them.
    pub fn missing_volumes(&self, uid: &str) -> VolumesNotReady {
        let dsw = self.dsw.lock();
        let asw = self.asw.lock();
        let mut missing = VolumesNotReady::default();
        for (unique, volume) in dsw.pod_volumes(uid) {
            if asw.mounted(unique, uid).is_none() {
                missing.unmounted.push(volume.outer_name.clone());
            }
            if dsw.volume(unique).is_some_and(|v| v.attachable)
                && !asw.volume(unique).is_some_and(|v| v.attached)
            {
                missing.unattached.push(volume.outer_name.clone());
            }
        }
        missing
    }

    /// The pod's volumes mounted for it, by the pod's names for them.
    pub fn mounted_volumes_for_pod(&self, uid: &str) -> HashMap<String, MountedVolume> {
        let dsw = self.dsw.lock();
        let asw = self.asw.lock();
        dsw.pod_volumes(uid)
            .filter_map(|(unique, v)| {
                let mounted = asw.mounted(unique, uid)?;
                let volume = MountedVolume {
                    path: mounted.path.clone(),
                    spec_name: v.spec.name().to_string(),
                    read_only: v.read_only,
                    image: unique.starts_with(IMAGE_PLUGIN),
                };
                Some((v.outer_name.clone(), volume))
            })
            .collect()
    }

    /// `node.status.volumesInUse`: what the attach/detach controller must not detach. Only attachable
    /// volumes, as upstream's `GetVolumesInUse`: those the desired state wants attached, and, until they
    /// are unmounted, those of `reported` (what the node reported last) the actual state still holds.
    pub fn volumes_in_use(&self, reported: &[String]) -> Vec<String> {
        let mut in_use = self.dsw.lock().attachable().clone();
        let asw = self.asw.lock();
        in_use.extend(reported.iter().filter(|v| asw.volume(v).is_some()).cloned());
        in_use.into_iter().collect()
    }

    /// True while the pod has volumes wanted or (possibly) mounted: its directory must stay
    /// (`podVolumesExist`).
    pub fn pod_volumes_exist(&self, uid: &str) -> bool {
        // One lock at a time (the reconciler takes dsw, then asw): a guard in the left side of `||` would
        // live across the right side.
        let mounted = self.asw.lock().pod_has_mounts(uid);
        mounted || self.dsw.lock().has_pod(uid)
    }

    /// Forgets that the populator added the pod's volumes: the pod workers are done with it.
    pub fn forget_pod(&self, uid: &str) {
        self.processed.lock().remove(uid);
        self.asw.lock().pod_changed(uid);
    }

    /// True when nothing is wanted, nothing is attached, staged or mounted, and no operation runs (and
    /// what a previous kubelet left has been looked at).
    pub fn idle(&self) -> bool {
        // One lock at a time: a guard in the first operand of `&&` lives to the end of the expression,
        // and the reconciler takes dsw, asw, then ops.
        let busy = self.ops.lock().busy();
        self.reconstructed.load(Ordering::Acquire)
            && !busy
            && self.dsw.lock().volumes().is_empty()
            && self.asw.lock().volumes().is_empty()
    }

    /// True once the state a previous kubelet left on disk has been read back.
    pub fn reconstructed(&self) -> bool {
        self.reconstructed.load(Ordering::Acquire)
    }

    /// True once the populator has added every pod of the API after its sources were ready.
    pub fn populator_has_added_pods(&self) -> bool {
        self.populator_has_added_pods.load(Ordering::Acquire)
    }

    /// When the earliest backed-off operation may run again.
    pub fn next_retry(&self) -> Option<Instant> {
        self.ops.lock().next_retry()
    }

    /// The plugin that handles `spec` (the populator only adds specs some plugin supports).
    pub fn plugin_for(&self, spec: &Spec) -> Arc<dyn VolumePlugin> {
        Arc::clone(
            self.plugins
                .iter()
                .find(|p| p.can_support(spec))
                .unwrap_or(&self.plugins[0]),
        )
    }

    /// Every volume mounted (not uncertain) for a pod: the pod, its name for the volume, the spec's name
    /// and the plugin (`GetMountedVolumesForPod`, for the stats calculator).
    pub fn mounted_volumes(&self) -> Vec<VolumeInUse> {
        let asw = self.asw.lock();
        asw.mounted_pods()
            .map(|(volume, m)| {
                let plugin = self.plugin_for(&volume.spec);
                (
                    m.pod.clone(),
                    m.outer_name.clone(),
                    m.spec_name.clone(),
                    plugin,
                )
            })
            .collect()
    }

    /// The node's mount layer.
    pub fn mounter(&self) -> Arc<dyn MountLayer> {
        Arc::clone(&self.host.mounter)
    }
}
