//! The reconciler (`reconciler.go`): each pass first unmounts what no pod wants (TearDown, then
//! UnmountDevice once no pod uses the volume), then makes wanted volumes real (attach check, MountDevice,
//! SetUp). Work is planned under the state locks and run as operations, one per volume at a time.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use inlet_volume::{ErrorClass, MounterArgs, PodInfo, Spec, VolumeError};

use super::VolumeManager;
use super::actual_state::{MountState, MountedPod};
use super::desired_state::PodVolume;
use crate::api::ApiPod;
use crate::node::subpath;
use crate::operations::OpKey;

/// Upstream's name of an operation on `spec` (a metric label): the block one for a raw block volume.
fn operation_name(spec: &Spec, fs: &'static str, block: &'static str) -> &'static str {
    match inlet_volume::csi::source::is_block(spec) {
        true => block,
        false => fs,
    }
}

/// Each entry of `a` with the entry of `b` under the same key, in one ordered walk of both: a pass pairs
/// its node's desired and actual volumes without looking each up by its (long) unique name.
fn paired<'a, A, B>(
    a: &'a BTreeMap<String, A>,
    b: &'a BTreeMap<String, B>,
) -> impl Iterator<Item = (&'a String, &'a A, Option<&'a B>)> {
    let mut others = b.iter().peekable();
    a.iter().map(move |(key, value)| {
        while others.next_if(|(other, _)| *other < key).is_some() {}
        let other = others.next_if(|(other, _)| *other == key).map(|(_, v)| v);
        (key, value, other)
    })
}

/// One piece of work a pass decided on.
enum Action {
    TearDown {
        unique: String,
        /// Boxed: the largest action by far, and the rarest.
        mount: Box<MountedPod>,
        spec: Spec,
    },
    UnmountDevice {
        unique: String,
        spec: Spec,
        path: PathBuf,
    },
    Forget {
        unique: String,
    },
    CheckAttach {
        unique: String,
        volume: Arc<PodVolume>,
    },
    MarkAttached {
        unique: String,
        volume: Arc<PodVolume>,
    },
    MountDevice {
        unique: String,
        volume: Arc<PodVolume>,
        waiting: Vec<Arc<PodVolume>>,
    },
    SetUp {
        unique: String,
        volume: Arc<PodVolume>,
        /// One mount of the volume at a time, for every pod (`operation_executor.go` MountVolume keys an
        /// attachable or device-mountable volume's mounts by the volume alone, so a ReadWriteOncePod check
        /// sees the other pod's mount); else one per pod.
        per_volume: bool,
    },
}

/// How an operation counts in `storage_operation_duration_seconds`: its plugin and operation name, and
/// whether it is recorded whatever its outcome, or only when it fails (staging, which upstream's
/// `volume_mount` includes).
pub(super) enum Recorded {
    Always((String, &'static str)),
    Failure((String, &'static str)),
}

impl VolumeManager {
    /// One pass: plans under the state locks, then starts each action as an operation.
    pub async fn reconcile(self: &Arc<Self>) {
        self.expand_in_use_volumes();
        for action in self.plan() {
            match action {
                // Not while an operation runs on the volume (upstream's reconciler asks
                // `IsOperationPending` first, `reconciler_common.go`), and only if it is still unused
                // now: a SetUp that ended since the plan was made has recorded a mount, which must be
                // torn down, not forgotten with the volume.
                Action::Forget { unique } => {
                    if !self.ops.lock().volume_busy(&unique) {
                        self.asw.lock().remove_if_unused(&unique);
                    }
                }
                Action::MarkAttached { unique, volume } => {
                    self.asw.lock().mark_attached(&unique, &volume.spec);
                    // Staging and SetUp of this volume are planned on the next pass: ask for it now.
                    self.kick.notify_one();
                }
                Action::CheckAttach { unique, volume } => {
                    let owner = self.plugin_for(&volume.spec);
                    let Some(attacher) = owner.attachable().map(|a| a.new_attacher()) else {
                        continue;
                    };
                    if attacher
                        .wait_for_attach(&volume.spec, &volume.pod, &self.node)
                        .await
                        .is_ok()
                    {
                        self.asw.lock().mark_attached(&unique, &volume.spec);
                        self.kick.notify_one();
                    }
                }
                Action::TearDown {
                    unique,
                    mount,
                    spec,
                } => {
                    let key = OpKey::volume(&unique, &mount.pod.uid);
                    let operation = operation_name(&spec, "volume_unmount", "unmap_volume");
                    if self.start(&key, operation) {
                        let named = Recorded::Always((self.metric_plugin(&spec), operation));
                        self.spawn_op(key, named, move |me| me.tear_down(unique, *mount, spec));
                    }
                }
                Action::UnmountDevice { unique, spec, path } => {
                    let key = OpKey::device(&unique);
                    let operation = operation_name(&spec, "unmount_device", "unmap_device");
                    if self.start(&key, operation) {
                        let named = Recorded::Always((self.metric_plugin(&spec), operation));
                        self.spawn_op(key, named, move |me| me.unmount_device(unique, spec, path));
                    }
                }
                Action::MountDevice {
                    unique,
                    volume,
                    waiting,
                } => {
                    // Upstream stages inside its mount operation: a staging that fails ends that
                    // `volume_mount` (`map_volume`); one that succeeds is counted with the SetUp after it.
                    let key = OpKey::device(&unique);
                    let operation = operation_name(&volume.spec, "volume_mount", "map_volume");
                    if self.start(&key, operation) {
                        let plugin = self.metric_plugin(&volume.spec);
                        let named = Recorded::Failure((plugin, operation));
                        self.spawn_op(key, named, move |me| {
                            me.mount_device(unique, volume, waiting)
                        });
                    }
                }
                Action::SetUp {
                    unique,
                    volume,
                    per_volume,
                } => {
                    let key = match per_volume {
                        true => OpKey::device(&unique),
                        false => OpKey::volume(&unique, &volume.pod.uid),
                    };
                    let operation = operation_name(&volume.spec, "volume_mount", "map_volume");
                    // An operation in flight is planned again on every pass: nothing is built for it
                    // before it is known to start.
                    if self.start(&key, operation) {
                        let plugin = self.metric_plugin(&volume.spec);
                        let named = Recorded::Always((plugin, operation));
                        self.spawn_op(key, named, move |me| me.set_up(unique, volume));
                    }
                }
            }
        }
    }

    fn plan(&self) -> Vec<Action> {
        let dsw = self.dsw.lock();
        let asw = self.asw.lock();
        let mut actions = Vec::new();
        // Unmount first: mounts no pod wants, then staging no pod uses, then forget what is gone. Not
        // before the populator has added the API's pods: a volume reconstructed after a restart may
        // belong to a pod not loaded yet, and tearing it down would delete an ephemeral volume's data
        // (upstream's `readyToUnmount`, reconstruct.go).
        let ready_to_unmount = self.populator_has_added_pods();
        for (unique, actual, wanted) in paired(asw.volumes(), dsw.volumes()) {
            if !ready_to_unmount {
                break;
            }
            for (uid, mount) in &actual.pods {
                if wanted.is_none_or(|w| !w.pods.contains_key(uid)) {
                    actions.push(Action::TearDown {
                        unique: unique.clone(),
                        mount: mount.clone(),
                        spec: actual.spec.clone(),
                    });
                }
            }
            if actual.pods.is_empty() && wanted.is_none() {
                actions.push(match &actual.device {
                    Some((path, _)) => Action::UnmountDevice {
                        unique: unique.clone(),
                        spec: actual.spec.clone(),
                        path: path.clone(),
                    },
                    None => Action::Forget {
                        unique: unique.clone(),
                    },
                });
            }
        }
        // Then mount what is wanted.
        for (unique, desired, actual) in paired(dsw.volumes(), asw.volumes()) {
            let Some(first) = desired.pods.values().next() else {
                continue;
            };
            let Some(actual) = actual else {
                actions.push(match desired.attachable {
                    true => Action::CheckAttach {
                        unique: unique.clone(),
                        volume: first.clone(),
                    },
                    false => Action::MarkAttached {
                        unique: unique.clone(),
                        volume: first.clone(),
                    },
                });
                continue;
            };
            if desired.device_mountable
                && actual.device.as_ref().map(|(_, s)| *s) != Some(MountState::Mounted)
            {
                let waiting = desired.pods.values().cloned().collect();
                actions.push(Action::MountDevice {
                    unique: unique.clone(),
                    volume: first.clone(),
                    waiting,
                });
                continue;
            }
            for (uid, volume) in &desired.pods {
                let mounted = actual.mounted(uid);
                let republish_due = mounted.is_some_and(|m| {
                    volume.requires_republish && m.published_at.elapsed() >= self.republish_period
                });
                if mounted.is_none() || republish_due {
                    actions.push(Action::SetUp {
                        unique: unique.clone(),
                        volume: volume.clone(),
                        per_volume: desired.attachable || desired.device_mountable,
                    });
                }
            }
        }
        actions
    }

    /// Marks the operation of `key` started, unless one conflicts or backs off. Asked before anything is
    /// prepared for it: the loop plans the same actions again on each pass while their operations run.
    pub(super) fn start(&self, key: &OpKey, operation: &'static str) -> bool {
        self.ops.lock().try_start(key, operation)
    }

    /// Runs an operation [`Self::start`] started; when it ends, records the outcome (and, as
    /// `storage_operation_duration_seconds`, its duration under `named`) and wakes the loop.
    pub(super) fn spawn_op<F, Fut>(self: &Arc<Self>, key: OpKey, named: Recorded, op: F)
    where
        F: FnOnce(Arc<Self>) -> Fut,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let me = Arc::clone(self);
        // Boxed: a future awaited from inside the spawned block is kept twice in the task (once as
        // captured, once as awaited), and a node mounts all its pods' volumes at once.
        let run = Box::pin(op(Arc::clone(self)));
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let ok = run.await;
            let took = started.elapsed();
            let operation = match named {
                Recorded::Always((plugin, operation)) => {
                    crate::metrics::METRICS.operation(plugin, operation, ok, took);
                    operation
                }
                Recorded::Failure((plugin, operation)) => {
                    if !ok {
                        crate::metrics::METRICS.operation(plugin, operation, false, took);
                    }
                    operation
                }
            };
            me.ops.lock().finish(&key, operation, ok);
            me.kick.notify_one();
        });
    }

    fn pod_object(&self, pod: &PodInfo) -> Option<Arc<ApiPod>> {
        self.api
            .peek::<ApiPod>(&pod.namespace, &pod.name)
            .filter(|p| p.metadata.uid.as_deref() == Some(&pod.uid))
    }

    pub(super) fn warn_as(&self, pod: &PodInfo, reason: &str, message: &str) {
        match self.pod_object(pod) {
            Some(object) => self.api.record_event(&object, "Warning", reason, message),
            None => tracing::warn!(node = %self.node, pod = %pod.name, "{message}"),
        }
    }

    /// SetUp of one pod's volume, counted as a possible mount of the pod from the moment it is started
    /// until it ends (or its task is dropped): a pod deleted meanwhile keeps its directory, and the record
    /// the driver's mount needs.
    fn set_up(
        self: Arc<Self>,
        unique: String,
        volume: Arc<PodVolume>,
    ) -> impl Future<Output = bool> + Send + 'static {
        struct Counted(Arc<VolumeManager>, String);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.asw.lock().end_set_up(&self.1);
            }
        }
        self.asw.lock().begin_set_up(&volume.pod.uid);
        let counted = Counted(Arc::clone(&self), volume.pod.uid.clone());
        async move {
            let _counted = counted;
            self.set_up_counted(unique, volume).await
        }
    }

    async fn set_up_counted(self: Arc<Self>, unique: String, volume: Arc<PodVolume>) -> bool {
        if self.read_write_once_pod_conflict(&unique, &volume) {
            let e = VolumeError::transient(
                "volume uses the ReadWriteOncePod access mode and is already in use by another pod",
            );
            return self.failed(&volume, "MountVolume.SetUp", &e);
        }
        let plugin = self.plugin_for(&volume.spec);
        let mounter = match plugin.new_mounter(&volume.spec, &volume.pod) {
            Ok(m) => m,
            Err(e) => return self.failed(&volume, "MountVolume.NewMounter", &e),
        };
        let path = mounter.path();
        let args = MounterArgs {
            fs_group: volume.pod.fs_group,
            remount: self.asw.lock().is_remount(&unique, &volume.pod.uid),
            selinux_label: volume.selinux.mount.clone(),
        };
        match mounter.set_up_at(&path, &args).await {
            Ok(()) => {
                self.asw
                    .lock()
                    .set_pod(&unique, mounted(&volume, path, MountState::Mounted));
                true
            }
            Err(e) => {
                if e.class == ErrorClass::Uncertain
                    && self.asw.lock().mounted(&unique, &volume.pod.uid).is_none()
                {
                    self.asw
                        .lock()
                        .set_pod(&unique, mounted(&volume, path, MountState::Uncertain));
                }
                self.failed(&volume, "MountVolume.SetUp", &e)
            }
        }
    }

    async fn tear_down(self: Arc<Self>, unique: String, mount: MountedPod, spec: Spec) -> bool {
        // The pod's subPath binds of this volume go first (`operation_generator.go` calls CleanSubPaths
        // before TearDown); while one stays, the volume is not torn down. No event, as upstream.
        let pod_dir = self.root.join("pods").join(&mount.pod.uid);
        if let Err(e) = subpath::clean(&*self.host.mounter, &pod_dir, &mount.spec_name) {
            tracing::warn!(
                node = %self.node,
                pod = %mount.pod.uid,
                "UnmountVolume failed for volume {:?}: error cleaning subPath mounts: {e}",
                mount.outer_name
            );
            return false;
        }
        let plugin = self.plugin_for(&spec);
        let result = match plugin.new_unmounter(&mount.spec_name, &mount.pod.uid) {
            Ok(unmounter) => unmounter.tear_down_at(&mount.path).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                self.asw.lock().remove_pod(&unique, &mount.pod.uid);
                true
            }
            Err(e) => {
                // No event (upstream's recorder is nil here); the mount may be half torn down, so it is
                // uncertain until a retry succeeds, and SetUp runs again for a pod that still wants it
                // (operation_generator.go, GenerateUnmountVolumeFunc).
                tracing::warn!(
                    node = %self.node,
                    pod = %mount.pod.uid,
                    "UnmountVolume.TearDown failed for volume {:?} : {}",
                    mount.outer_name,
                    e.message
                );
                let mut uncertain = mount;
                uncertain.state = MountState::Uncertain;
                self.asw.lock().set_pod(&unique, uncertain);
                false
            }
        }
    }

    async fn mount_device(
        self: Arc<Self>,
        unique: String,
        volume: Arc<PodVolume>,
        waiting: Vec<Arc<PodVolume>>,
    ) -> bool {
        let owner = self.plugin_for(&volume.spec);
        let Some(plugin) = owner.device_mountable() else {
            return true;
        };
        let mounter = plugin.new_device_mounter();
        let result = match plugin.device_mount_path(&volume.spec, &volume.pod).await {
            Ok(path) => mounter
                .mount_device(&volume.spec, &volume.pod, &path, &volume.selinux.mount)
                .await
                .map(|()| path),
            Err(e) => Err(e),
        };
        match result {
            Ok(path) => {
                self.asw
                    .lock()
                    .set_device(&unique, Some((path, MountState::Mounted)));
                true
            }
            Err(e) => {
                if e.class == ErrorClass::Uncertain {
                    if let Ok(path) = plugin.device_mount_path(&volume.spec, &volume.pod).await {
                        self.asw
                            .lock()
                            .set_device(&unique, Some((path, MountState::Uncertain)));
                    }
                }
                for pod in &waiting {
                    self.failed(pod, "MountVolume.MountDevice", &e);
                }
                false
            }
        }
    }

    async fn unmount_device(self: Arc<Self>, unique: String, spec: Spec, path: PathBuf) -> bool {
        let owner = self.plugin_for(&spec);
        let Some(unmounter) = owner.device_mountable().map(|d| d.new_device_unmounter()) else {
            return true;
        };
        match unmounter.unmount_device(&path).await {
            Ok(()) => {
                self.asw.lock().set_device(&unique, None);
                true
            }
            Err(e) => {
                tracing::warn!(node = %self.node, volume = unique, "UnmountDevice failed: {}", e.message);
                false
            }
        }
    }

    /// A failed mount operation as a FailedMount event: `GenerateError` of operation_executor.go names
    /// the volume spec (a claim's PV), not the pod's volume.
    /// A block volume's operations are MapVolume's, `FailedMapVolume` events (`GenerateMapVolumeFunc`):
    /// SetUpDevice for the staging, MapPodDevice for the publish, NewBlockVolumeMapper.
    fn failed(&self, volume: &PodVolume, operation: &str, e: &VolumeError) -> bool {
        let block = inlet_volume::csi::source::is_block(&volume.spec);
        let (reason, operation) = match (block, operation) {
            (false, _) => ("FailedMount", operation),
            (true, "MountVolume.MountDevice") => ("FailedMapVolume", "MapVolume.SetUpDevice"),
            (true, "MountVolume.NewMounter") => {
                ("FailedMapVolume", "MapVolume.NewBlockVolumeMapper")
            }
            (true, _) => ("FailedMapVolume", "MapVolume.MapPodDevice"),
        };
        self.warn_as(
            &volume.pod,
            reason,
            &format!(
                "{operation} failed for volume {:?} : {}",
                volume.spec.name(),
                e.message
            ),
        );
        false
    }

    /// A PV whose only access mode is ReadWriteOncePod, mounted (or possibly mounted) for another pod of
    /// the node: the kubelet refuses the second pod before any CSI call (operation_generator.go,
    /// `IsVolumeMountedElsewhere`; several access modes leave the intent unknown, so they are not checked).
    fn read_write_once_pod_conflict(&self, unique: &str, volume: &PodVolume) -> bool {
        let Spec::Persistent { pv, .. } = &volume.spec else {
            return false;
        };
        let modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_deref());
        if modes != Some(&["ReadWriteOncePod".to_string()][..]) {
            return false;
        }
        self.asw
            .lock()
            .volume(unique)
            .is_some_and(|v| v.pods.keys().any(|uid| *uid != volume.pod.uid))
    }
}

fn mounted(volume: &PodVolume, path: PathBuf, state: MountState) -> MountedPod {
    MountedPod {
        pod: volume.pod.clone(),
        outer_name: volume.outer_name.clone(),
        spec_name: volume.spec.name().to_string(),
        path,
        state,
        published_at: Instant::now(),
        reconstructed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_gives_each_entry_its_match_or_none() {
        let map = |keys: &[&str]| -> BTreeMap<String, usize> {
            keys.iter()
                .enumerate()
                .map(|(i, k)| (k.to_string(), i))
                .collect()
        };
        let (a, b) = (map(&["b", "c", "e", "f"]), map(&["a", "c", "d", "f", "g"]));
        let pairs: Vec<(&str, Option<usize>)> = paired(&a, &b)
            .map(|(k, _, other)| (k.as_str(), other.copied()))
            .collect();
        assert_eq!(
            pairs,
            [("b", None), ("c", Some(1)), ("e", None), ("f", Some(3))]
        );
        assert_eq!(paired(&a, &BTreeMap::<String, ()>::new()).count(), 4);
    }
}
