//! One simulated node: a kubelet's volume manager, pod workers and kuberuntime, over the embedded API,
//! real CSI sockets and a CRI runtime.
//!
//! # Layout
//! - `volumemanager/`: [`VolumeManager`], desired and actual state, the populator, the reconciler and
//!   reconstruction after a restart, behind the kubelet's questions (`volume_manager.go`).
//! - `pod_worker.rs`: each pod's state on the node; start once its volumes are mounted, stop and clean up
//!   deleted pods (the stops of all simulated nodes share the process's slots, far more than a node's
//!   pods).
//! - `status/`: the pod's status (container statuses, `getPhase`, `status/generate.go`'s conditions).
//! - `kuberuntime.rs`: sandboxes and containers through CRI (`computePodActions`: init containers, then
//!   the regular ones; `startContainer`), and the sandboxes a previous kubelet left; `images.rs`: the image
//!   manager (`EnsureImageExists`).
//! - `container_mounts.rs`: a container's CRI mounts (`makeMounts`), subPaths checked and bound.
//! - `env.rs`: a container's environment (`makeEnvironmentVariables`) and `$(VAR)` expansion.
//! - `containers.rs`: the relist of exited containers, restarts with back-off, the next init container.
//! - `subpath.rs`: subPath binds under `volume-subpaths`, made without following symlinks, and their cleanup.
//! - `kubelet_volumes.rs`: orphaned pod directories removed once nothing of theirs is mounted.
//! - `volume_stats.rs`: the stats calculator, which polls mounted volumes' metrics (and health events).
//! - `host.rs`: the `VolumeHost` plugins get; `registry.rs`: registered CSI drivers and the CSI
//!   registration handler; `plugin_watcher.rs`: `--plugins-registry`, drivers registering themselves.

mod container_config;
mod container_mounts;
mod containers;
mod env;
pub mod host;
mod image_gc;
mod image_volumes;
mod images;
mod kill;
mod kubelet_volumes;
mod kuberuntime;
mod lifecycle;
pub mod plugin_watcher;
mod pod_worker;
pub mod registry;
mod sandbox_config;
mod status;
mod subpath;
pub mod token_manager;
mod volume_stats;
pub mod volumemanager;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_image::pull::{Puller, VerificationPolicy};
use inlet_image::{Engine, EngineConfig};
use inlet_volume::VolumePlugin;
use inlet_volume::config_map::ConfigMapPlugin;
use inlet_volume::csi::{CsiObserver, CsiPlugin};
use inlet_volume::downward_api::DownwardApiPlugin;
use inlet_volume::empty_dir::EmptyDirPlugin;
use inlet_volume::image::{ImagePlugin, RuntimeImagePlugin};
use inlet_volume::projected::ProjectedPlugin;
use inlet_volume::secret::SecretPlugin;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use tokio::sync::Notify;

use host::NodeHost;
pub use image_gc::{Collected, ImageGcArgs, ImageGcPolicy};
pub use image_volumes::ImageVolumeMounts;
use images::ImageManager;
pub(crate) use kuberuntime::all_containers;
pub use kuberuntime::{ContainerReport, ContainerState, MountReport, TerminatedRun};
pub use pod_worker::PodRuntime;
use registry::{DriverDirectory, DriverRegistry};
use token_manager::TokenManager;
use volumemanager::VolumeManagerConfig;
pub use volumemanager::{MountState, VolumeManager};

use crate::api::{Api, ApiPod};
use crate::cri::Cri;
pub use crate::operations::BackoffPolicy;
use crate::operations::Operations;

/// The shortest time between two passes of a node's loop (upstream's reconciler and populator sleep
/// 100 ms between passes).
const SYNC_PERIOD: Duration = Duration::from_millis(100);

/// How often orphaned pod directories are looked for (`housekeepingPeriod`, kubelet.go: 2 s): it reads the
/// node's pods dir, which every pass would read for nothing.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// How often the log dirs of pods that are gone are looked for: with the containers' garbage collection
/// (`ContainerGCPeriod`, kubelet.go: 1 min), first at the node's start (`StartGarbageCollection`).
const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// The kubelet root dir of this node.
    pub root: PathBuf,
    /// Feature gates that are on.
    pub gates: BTreeSet<String>,
    /// The node runs SELinux: volumes whose plugin supports it are mounted with the pod's label.
    pub selinux: bool,
    /// Retry backoff for volume and pod operations.
    pub backoff: BackoffPolicy,
    /// How long a pod waits for its volumes before the kubelet logs "Unable to attach or mount volumes"
    /// (upstream: 2 min 3 s; no event since 1.28).
    pub volume_wait_timeout: Duration,
    /// The deadline of one CSI call.
    pub csi_timeout: Duration,
    /// How often volumes of drivers with `requiresRepublish` are published again.
    pub republish_period: Duration,
    /// How often mounted volumes are asked for their stats (`--volume-stats-agg-period`; zero: never).
    pub volume_stats_agg_period: Duration,
    /// How long one mount attempt of an image volume waits for its pull (the pull goes on after).
    pub image_pull_wait: Duration,
    /// How containers are followed once started.
    pub containers: ContainerTiming,
    /// The plugin registration dir drivers put their registration sockets in (the kubelet's
    /// `<root-dir>/plugins_registry`); None: only drivers given to kubelet-sim are registered.
    pub plugins_registry: Option<PathBuf>,
    /// Which cached images a pod must prove credentials for (`imagePullCredentialsVerificationPolicy`).
    pub image_verification: VerificationPolicy,
    /// The images `NeverVerifyAllowlistedImages` exempts (`preloadedImagesVerificationAllowlist`).
    pub image_allowlist: inlet_image::allowlist::Allowlist,
    /// Who mounts `volumes[].image`: the runtime (KEP-4639) or the kubelet side.
    pub image_volume_mounts: ImageVolumeMounts,
    /// When the image garbage collector removes images.
    pub image_gc: ImageGcPolicy,
}

/// The kubelet-side image plugin's state dir under a node's root.
pub fn image_plugin_dir(node_root: &Path) -> PathBuf {
    node_root.join("plugins/kubernetes.io/image")
}

/// The node's record of which credentials pulled which image (KEP-2535), where the kubelet keeps it
/// (`<root>/image_manager`, in its format): every image puller of the node shares it.
pub fn pull_records_dir(node_root: &Path) -> PathBuf {
    node_root.join("image_manager")
}

/// The kubelet-side image engine of a node, over the runtime at `cri_socket`, with its state under the
/// node's `plugins/kubernetes.io/image/`. None (image volumes unsupported on the node) when the runtime's
/// storage cannot be opened.
pub async fn image_engine(
    cri_socket: &Path,
    node_root: &Path,
    mounter: &Arc<dyn MountLayer>,
    images: &crate::images::SimImages,
) -> Option<Arc<Engine>> {
    let config = EngineConfig {
        verification: images.verification,
        preloaded_allowlist: images.allowlist.clone(),
        pull_records_dir: Some(pull_records_dir(node_root)),
        ..EngineConfig::new(cri_socket, &image_plugin_dir(node_root))
    };
    match Engine::start(&config, Arc::clone(mounter)).await {
        Ok(engine) => Some(Arc::new(engine)),
        Err(e) => {
            tracing::warn!(node_root = %node_root.display(), error = %e, "image volumes are unavailable");
            None
        }
    }
}

/// How the kubelet follows started containers.
#[derive(Debug, Clone, Copy)]
pub struct ContainerTiming {
    /// How often the runtime is relisted for containers that exited (the PLEG's period).
    pub relist_period: Duration,
    /// The crash-loop back-off between restarts of a container.
    pub backoff: BackoffPolicy,
    /// How long a RuntimeService call may take before it is abandoned as failed (the kubelet's
    /// `runtimeRequestTimeout`). Image pulls have none, as upstream's.
    pub runtime_request_timeout: Duration,
}

impl Default for ContainerTiming {
    /// Upstream's: a relist every second, a back-off of 10 s doubling to 5 min, runtime calls of 2 min.
    fn default() -> Self {
        Self {
            relist_period: Duration::from_secs(1),
            backoff: BackoffPolicy {
                initial: Duration::from_secs(10),
                max: Duration::from_secs(300),
            },
            runtime_request_timeout: Duration::from_secs(120),
        }
    }
}

/// A simulated kubelet.
pub struct Kubelet {
    /// Its config.
    pub config: NodeConfig,
    /// The API.
    pub api: Arc<Api>,
    /// The registered CSI drivers.
    pub registry: Arc<DriverRegistry>,
    /// The volume manager: what the pods want mounted and what is.
    pub volumes: Arc<VolumeManager>,
    /// The service-account tokens of its pods.
    tokens: Arc<TokenManager>,
    cri: Cri,
    /// The image manager, over the node's image puller (shared with image volumes): its record of which
    /// credentials pulled which image decides whether a pod may use a cached container image (KEP-2535).
    images: ImageManager,
    /// Whether the runtime mounts image volumes (CRI `Mount.image`) instead of the kubelet side.
    runtime_mounts_images: bool,
    /// The image garbage collector.
    image_gc: image_gc::ImageGc,
    /// The image manager's puller is an engine's, which settled the pull intents at its start.
    puller_settled: bool,
    /// What the pod workers know of each pod, by UID. Looked up for every pod on every pass, as are the
    /// volume manager's maps by pod UID: foldhash rather than SipHash, which took 4 % of the 100,000-pod
    /// settle (bench/RESULTS.md, issue #28's sixteenth pass). The keys are UIDs the API server made.
    pods: Mutex<foldhash::HashMap<String, PodRuntime>>,
    /// The pod workers' operations (start, stop), one at a time per pod, with backoff.
    pod_ops: Mutex<Operations>,
    /// Wakes the node's loop: an operation ended, a driver registered.
    kick: Arc<Notify>,
    /// Set once the sandboxes a previous kubelet left have been adopted or stopped.
    sandboxes_adopted: AtomicBool,
    /// When the runtime was last relisted.
    last_relist: Mutex<Option<Instant>>,
    /// When orphaned pod directories were last looked for.
    last_housekeeping: Mutex<Option<Instant>>,
    /// When the log dirs of pods that are gone were last looked for.
    last_container_gc: Mutex<Option<Instant>>,
    /// The node's pod membership when the pod workers last found no pod that left the API
    /// (`stop_removed_pods`).
    removed_looked: Mutex<Option<u64>>,
    /// The last volume stats, by pod UID and the pod's name for the volume.
    volume_stats: Mutex<HashMap<String, volume_stats::PodVolumeStats>>,
}

impl Kubelet {
    /// A node over `api`, reaching its runtime through `cri`.
    ///
    /// Image volumes (`volumes[].image`) are served when `images` is given; without it such pods fail
    /// with upstream's "no volume plugin matched". The node's drivers are published in `directory`, for
    /// the controllers.
    pub fn new(
        config: NodeConfig,
        api: Arc<Api>,
        cri: Cri,
        mounter: Arc<dyn MountLayer>,
        observer: Arc<dyn CsiObserver>,
        images: Option<Arc<Engine>>,
        directory: Arc<DriverDirectory>,
    ) -> Arc<Self> {
        let registry = Arc::new(DriverRegistry::new(
            &config.name,
            Arc::clone(&api),
            observer,
            directory,
            config.csi_timeout,
        ));
        let tokens = Arc::new(TokenManager::new(Arc::clone(&api)));
        let host = Arc::new(NodeHost {
            node: config.name.clone(),
            root: config.root.clone(),
            api: Arc::clone(&api),
            registry: Some(Arc::clone(&registry)),
            mounter,
            gates: config.gates.clone(),
            selinux: config.selinux,
            tokens: Arc::clone(&tokens),
        });
        let mut plugins: Vec<Arc<dyn VolumePlugin>> = vec![
            Arc::new(CsiPlugin::new(host.clone())),
            Arc::new(SecretPlugin::new(host.clone())),
            Arc::new(ConfigMapPlugin::new(host.clone())),
            Arc::new(DownwardApiPlugin::new(host.clone())),
            Arc::new(ProjectedPlugin::new(host.clone())),
            Arc::new(EmptyDirPlugin::new(host.clone())),
        ];
        // The engine's puller, or (when the runtime's storage cannot be opened for image volumes) one of
        // the node's own over the same record: container images follow the policy either way.
        let puller = match &images {
            Some(engine) => Arc::clone(&engine.puller),
            None => Arc::new(
                Puller::new(
                    cri.image.clone(),
                    &pull_records_dir(&config.root),
                    config.image_verification,
                    None,
                )
                .and_then(|puller| {
                    puller.import_legacy(&image_plugin_dir(&config.root))?;
                    Ok(puller)
                })
                .unwrap_or_else(|e| {
                    tracing::error!(node = %config.name, error = %e, "no image pull record");
                    Puller::unrecorded(cri.image.clone(), config.image_verification)
                })
                .with_allowlist(config.image_allowlist.clone()),
            ),
        };
        let puller_settled = images.is_some();
        let image_gc = image_gc::ImageGc::new(config.image_gc);
        if let Some(engine) = &images {
            image_gc.volume_images.add(engine);
        }
        let runtime_mounts_images = config
            .image_volume_mounts
            .by_runtime(&cri.runtime_name, &cri.runtime_version);
        let kubelet_side =
            images.map(|engine| ImagePlugin::new(host.clone(), engine, config.image_pull_wait));
        if runtime_mounts_images {
            plugins.push(Arc::new(RuntimeImagePlugin::new(
                host.clone(),
                kubelet_side,
            )));
        } else if let Some(plugin) = kubelet_side {
            plugins.push(Arc::new(plugin));
        }
        api.put(Node {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        let kick = Arc::new(Notify::new());
        let volumes = VolumeManager::new(
            VolumeManagerConfig {
                node: config.name.clone(),
                root: config.root.clone(),
                backoff: config.backoff,
                republish_period: config.republish_period,
            },
            Arc::clone(&api),
            host,
            plugins,
            Arc::clone(&kick),
        );
        Arc::new(Self {
            pod_ops: Mutex::new(Operations::new(config.backoff)),
            images: ImageManager::new(
                Arc::clone(&api),
                cri.image.clone(),
                puller,
                config.containers.backoff,
            ),
            volumes: Arc::new(volumes),
            tokens,
            config,
            api,
            registry,
            cri,
            pods: Mutex::default(),
            kick,
            runtime_mounts_images,
            image_gc,
            puller_settled,
            sandboxes_adopted: AtomicBool::new(false),
            last_relist: Mutex::new(None),
            last_housekeeping: Mutex::new(None),
            last_container_gc: Mutex::new(None),
            removed_looked: Mutex::new(None),
            volume_stats: Mutex::default(),
        })
    }

    /// Runs the node until `stop` resolves: on every API change, finished operation or expired backoff,
    /// the populator, the reconciler and the pod workers each take one pass.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        // Reading the previous kubelet's state walks the pods' dirs: off the async workers.
        let (volumes, pods) = (Arc::clone(&self.volumes), self.my_pods_by_uid());
        let _ = tokio::task::spawn_blocking(move || volumes.reconstruct(&pods)).await;
        // Pulls that ended while no one recorded them (upstream's pull manager `initialize`); an engine's
        // puller did so when the engine started.
        if !self.puller_settled {
            if let Err(e) = self.images.puller().settle_intents().await {
                tracing::warn!(node = %self.config.name, error = %e, "settling pull intents");
            }
        }
        // The plugin manager lives as long as this kubelet (aborted with it).
        let _plugin_manager = self.config.plugins_registry.as_ref().map(|dir| {
            let node = Arc::clone(&self);
            let watcher = plugin_watcher::PluginWatcher::new(
                dir,
                Arc::clone(&self.registry),
                self.config.backoff,
            );
            AbortOnDrop(tokio::spawn(watcher.run(move || node.wake())))
        });
        let _stats = AbortOnDrop(tokio::spawn(Arc::clone(&self).calculate_volume_stats()));
        let _image_gc = AbortOnDrop(tokio::spawn(
            Arc::clone(&self).collect_images_periodically(),
        ));
        // Only this node's objects and the cluster's, as a kubelet's pod watch and informers see them.
        let (mut own, mut cluster) = (
            self.api.watch_node(&self.config.name),
            self.api.watch_cluster(),
        );
        loop {
            let synced = Instant::now();
            self.sync().await;
            let retries = [self.volumes.next_retry(), self.pod_ops.lock().next_retry()];
            let mut next = retries
                .into_iter()
                .flatten()
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            // Running pods are relisted on time, so their containers' exits are seen.
            if self.has_running_pods() {
                next = next.min(Instant::now() + self.config.containers.relist_period);
            }
            tokio::select! {
                _ = own.changed() => {}
                _ = cluster.changed() => {}
                _ = self.kick.notified() => {}
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = &mut stop => return,
            }
            // At most one pass per loop period, as upstream's volume manager loops run
            // (`reconcilerLoopSleepPeriod`, volume_manager.go): changes and finished operations that
            // come meanwhile are handled together, so a node's work does not grow with their number.
            tokio::select! {
                _ = tokio::time::sleep_until((synced + SYNC_PERIOD).into()) => {}
                _ = &mut stop => return,
            }
        }
    }

    async fn sync(self: &Arc<Self>) {
        // Read before listing pods: a pass that began before the sources were ready may have missed some,
        // and one that read the membership before a pod left sees it change at the next.
        let sources_ready = self.api.sources_ready();
        let membership = self.api.pod_membership(&self.config.name);
        let terminated: foldhash::HashSet<String> = self
            .pods
            .lock()
            .iter()
            .filter(|(_, rt)| rt.terminated())
            .map(|(uid, _)| uid.clone())
            .collect();
        // The list is let go as soon as the populator is done with it: a pod held past an await makes
        // the API copy it (7 KB or more) on each status write meanwhile (see `Api::update`).
        let pods = self.my_pods();
        self.volumes
            .populate(sources_ready, &pods, membership, &terminated)
            .await;
        drop(pods);
        let ready = self.volumes.populator_has_added_pods();
        if ready && !self.sandboxes_adopted.swap(true, Ordering::AcqRel) {
            self.adopt_sandboxes().await;
        }
        self.volumes.reconcile().await;
        self.sync_pods().await;
        self.relist().await;
        if ready && due(&self.last_housekeeping, HOUSEKEEPING_PERIOD) {
            self.clean_orphaned_pod_dirs();
        }
        if ready && due(&self.last_container_gc, CONTAINER_GC_PERIOD) {
            self.evict_pod_logs_dirs();
        }
        self.report_volumes_in_use();
    }

    /// True when some pod's containers run (and may exit).
    fn has_running_pods(&self) -> bool {
        self.pods
            .lock()
            .values()
            .any(|r| r.state == pod_worker::PodState::Running)
    }

    /// Pods bound to this node.
    fn my_pods(&self) -> Vec<Arc<ApiPod>> {
        self.api.pods_on(&self.config.name)
    }

    /// This node's pods by UID.
    fn my_pods_by_uid(&self) -> HashMap<String, Arc<ApiPod>> {
        self.my_pods()
            .into_iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
            .collect()
    }

    /// `node.status.volumesInUse` from the volume manager, written only when it changes, so the node does
    /// not wake itself.
    fn report_volumes_in_use(&self) {
        let in_use = {
            let node = self.api.peek::<Node>("", &self.config.name);
            let status = node.as_ref().and_then(|n| n.status.as_ref());
            let current = status.and_then(|s| s.volumes_in_use.as_deref());
            let in_use = self.volumes.volumes_in_use(current.unwrap_or_default());
            (current.unwrap_or_default() != in_use).then_some(in_use)
        };
        if let Some(in_use) = in_use {
            self.api.update::<Node>("", &self.config.name, |n| {
                n.status
                    .get_or_insert_with(NodeStatus::default)
                    .volumes_in_use = Some(in_use)
            });
        }
    }

    /// What the pod workers know of a pod (None before its first sync).
    pub fn pod_runtime(&self, uid: &str) -> Option<PodRuntime> {
        self.pods.lock().get(uid).cloned()
    }

    /// True once this kubelet has looked at what a previous one left on disk (its reconstruction).
    pub fn reconstructed(&self) -> bool {
        self.volumes.reconstructed()
    }

    /// True when nothing is wanted, nothing is attached, staged or mounted, and no operation runs (and
    /// what a previous kubelet left has been looked at).
    pub fn idle(&self) -> bool {
        self.volumes.idle()
            && self.sandboxes_adopted.load(Ordering::Acquire)
            && !self.pod_ops.lock().busy()
    }

    /// Wakes the node's loop now.
    pub fn wake(&self) {
        self.kick.notify_one();
    }
}

/// True, and `last` set to now, when `period` has passed since `last` (or it was never set): work the
/// node's loop does on a period of its own, however often it passes.
fn due(last: &Mutex<Option<Instant>>, period: Duration) -> bool {
    let mut last = last.lock();
    if last.is_some_and(|at| at.elapsed() < period) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

/// Aborts a task when dropped: a kubelet's helpers stop with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
