//! The reconciler (`reconciler.go`): each pass first unmounts what no pod wants (TearDown, then
//! UnmountDevice once no pod uses the volume), then makes wanted volumes real (attach check, MountDevice,
//! SetUp). Work is planned under the state locks (`plan.rs`) and run as operations, one per volume at a
//! time, each once it has one of the process's slots.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use inlet_volume::{ErrorClass, MounterArgs, PodInfo, Spec, VolumeError};

use super::VolumeManager;
use super::actual_state::{MountState, MountedPod};
use super::desired_state::PodVolume;
use super::plan::Action;
use crate::api::ApiPod;
use crate::node::subpath;
use crate::operations::OpKey;

/// How many volume operations run at once in the process, over all its simulated nodes.
///
/// A real node's operation executor bounds nothing but one operation per volume (and per pod), and so
/// does each simulated node's table: every pod's SetUp starts at once. But every simulated node shares
/// this process's CPUs. When 10,000 pods land on 100 nodes at once, 20,000 NodePublishVolume calls wait
/// for a CPU with their futures, HTTP/2 streams and the driver's side of the call: about 14 KB each, more
/// than half the process at its peak (bench/RESULTS.md, issue #28's fourteenth and fifteenth passes).
/// An operation started in the table waits for a slot before its future is made, in a few hundred
/// bytes; 2,048 running keep both CPUs busy with calls to spare.
static VOLUME_SLOTS: Semaphore = Semaphore::const_new(2048);

/// Upstream's name of an operation on `spec` (a metric label): the block one for a raw block volume.
fn operation_name(spec: &Spec, fs: &'static str, block: &'static str) -> &'static str {
    match inlet_volume::csi::source::is_block(spec) {
        true => block,
        false => fs,
    }
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
                // torn down, not forgotten with the volume (that SetUp's end marked it for review).
                Action::Forget { unique } => {
                    if !self.ops.lock().volume_busy(&unique) {
                        self.asw.lock().remove_if_unused(&unique);
                    }
                }
                Action::MarkAttached { unique, volume } => {
                    self.asw.lock().mark_attached(&unique, &volume.spec);
                    // Staging and SetUp of this volume are planned on the next pass: ask for it now.
                    self.review(&unique);
                    self.kick.notify_one();
                }
                Action::CheckAttach { unique, volume } => {
                    // Attached: its staging or SetUp is next; else asked again on the next pass.
                    self.review(&unique);
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
                    if self.start(&key, operation) {
                        let plugin = self.metric_plugin(&volume.spec);
                        let named = Recorded::Always((plugin, operation));
                        let counted = SetUpCounted::new(self, &volume.pod.uid);
                        self.spawn_op(key, named, move |me| me.set_up(counted, unique, volume));
                    }
                }
            }
        }
    }

    /// Marks the operation of `key` started, unless one conflicts or backs off. Asked before anything is
    /// prepared for it. One refused is looked at again on the next pass (until its backoff ends).
    pub(super) fn start(&self, key: &OpKey, operation: &'static str) -> bool {
        let started = self.ops.lock().try_start(key, operation);
        if !started && let OpKey::Volume { name, .. } = key {
            self.review(name);
        }
        started
    }

    /// Runs an operation [`Self::start`] started, once it has one of the process's [`VOLUME_SLOTS`];
    /// when it ends, records the outcome (and, as `storage_operation_duration_seconds`, its duration
    /// under `named`) and wakes the loop.
    pub(super) fn spawn_op<F, Fut>(self: &Arc<Self>, key: OpKey, named: Recorded, op: F)
    where
        F: FnOnce(Arc<Self>) -> Fut + Send + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // The slots are never closed, so one always comes.
            let slot = VOLUME_SLOTS.acquire().await.ok();
            let started = std::time::Instant::now();
            // Made once it has its slot, so a waiting operation holds only `op`'s captures; boxed, so
            // the future is not kept twice in the task (once as made, once as awaited).
            let ok = Box::pin(op(Arc::clone(&me))).await;
            drop(slot);
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
            // What it changed (or a retry after its backoff) is for the next pass to see: marked before
            // the table lets it go, so no pass finds it ended and not marked.
            let mut ops = me.ops.lock();
            ops.finish(&key, operation, ok);
            if let OpKey::Volume { name, .. } = &key {
                me.review(name);
            }
            drop(ops);
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

    /// SetUp of one pod's volume, counted as a possible mount of the pod while `_counted` lives.
    async fn set_up(
        self: Arc<Self>,
        _counted: SetUpCounted,
        unique: String,
        volume: Arc<PodVolume>,
    ) -> bool {
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

/// A SetUp counted as a possible mount of its pod from the moment it is started (before it waits for its
/// slot) until it ends or its task is dropped: a pod deleted meanwhile keeps its directory, and the record
/// the driver's mount needs.
struct SetUpCounted(Arc<VolumeManager>, String);

impl SetUpCounted {
    fn new(volumes: &Arc<VolumeManager>, uid: &str) -> Self {
        volumes.asw.lock().begin_set_up(uid);
        Self(Arc::clone(volumes), uid.to_string())
    }
}

impl Drop for SetUpCounted {
    fn drop(&mut self) {
        self.0.asw.lock().end_set_up(&self.1);
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
