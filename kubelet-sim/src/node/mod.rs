//! One simulated node: a kubelet's volume manager and pod workers, over the embedded API, real CSI sockets
//! and a CRI runtime.
//!
//! # Layout
//! - `desired_state.rs`, `actual_state.rs`: what pods want, and what is attached/staged/mounted.
//! - `populator.rs`: pods bound to this node -> desired state (PVCs resolved to their PVs).
//! - `reconciler.rs`: unmount what is unwanted, then attach-check, stage and mount what is missing.
//! - `operations.rs`: one operation per volume at a time, exponential backoff.
//! - `pod_worker.rs`: start pods whose volumes are mounted (CRI), stop and clean up deleted pods.
//! - `containers.rs`: the relist of exited containers, restarts with back-off, Succeeded and Failed.
//! - `subpath.rs`: subPath binds under `volume-subpaths`, made without following symlinks, and their cleanup.
//! - `reconstruct.rs`: after a restart, the actual state from disk and running sandboxes from CRI.
//! - `host.rs`: the `VolumeHost` plugins get; `registry.rs`: registered CSI drivers and the CSI
//!   registration handler; `plugin_watcher.rs`: `--plugins-registry`, drivers registering themselves.

mod actual_state;
mod containers;
mod desired_state;
pub mod host;
pub mod operations;
pub mod plugin_watcher;
mod pod_worker;
mod populator;
mod reconciler;
mod reconstruct;
pub mod registry;
mod subpath;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_image::pull::{Puller, VerificationPolicy};
use inlet_image::{Engine, EngineConfig};
use inlet_volume::VolumePlugin;
use inlet_volume::csi::{CsiObserver, CsiPlugin};
use inlet_volume::empty_dir::EmptyDirPlugin;
use inlet_volume::image::ImagePlugin;
use inlet_volume::secret::SecretPlugin;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use tokio::sync::Notify;

use actual_state::ActualState;
pub use actual_state::MountState;
use desired_state::DesiredState;
use host::NodeHost;
pub use operations::BackoffPolicy;
use operations::Operations;
pub use pod_worker::{ContainerReport, MountReport, PodRuntime};
use registry::DriverRegistry;

use crate::api::Api;
use crate::cri::Cri;

/// The shortest time between two passes of a node's loop (upstream's reconciler and populator sleep
/// 100 ms between passes).
const SYNC_PERIOD: Duration = Duration::from_millis(100);

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// The kubelet root dir of this node.
    pub root: PathBuf,
    /// Feature gates that are on.
    pub gates: BTreeSet<String>,
    /// Retry backoff for volume and pod operations.
    pub backoff: BackoffPolicy,
    /// How long a pod waits for its volumes before the kubelet's "Unable to attach or mount volumes" event
    /// (upstream: 2 min 3 s).
    pub volume_wait_timeout: Duration,
    /// How often volumes of drivers with `requiresRepublish` are published again.
    pub republish_period: Duration,
    /// How long one mount attempt of an image volume waits for its pull (the pull goes on after).
    pub image_pull_wait: Duration,
    /// How containers are followed once started.
    pub containers: ContainerTiming,
    /// The plugin registration dir drivers put their registration sockets in (the kubelet's
    /// `<root-dir>/plugins_registry`); None: only drivers given to kubelet-sim are registered.
    pub plugins_registry: Option<PathBuf>,
    /// Which cached images a pod must prove credentials for (`imagePullCredentialsVerificationPolicy`).
    pub image_verification: VerificationPolicy,
}

/// The kubelet-side image plugin's state dir under a node's root, which also holds the node's one record
/// of which credentials pulled which image: every image puller of the node (container images, in-tree
/// image volumes, the in-process image drivers) shares it.
pub fn image_plugin_dir(node_root: &Path) -> PathBuf {
    node_root.join("plugins/kubernetes.io/image")
}

/// The kubelet-side image engine of a node, over the runtime at `cri_socket`, with its state under the
/// node's `plugins/kubernetes.io/image/`. None (image volumes unsupported on the node) when the runtime's
/// storage cannot be opened.
pub async fn image_engine(
    cri_socket: &Path,
    node_root: &Path,
    mounter: &Arc<dyn MountLayer>,
    verification: VerificationPolicy,
) -> Option<Arc<Engine>> {
    let config = EngineConfig {
        verification,
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
    host: Arc<NodeHost>,
    plugins: Vec<Arc<dyn VolumePlugin>>,
    cri: Cri,
    /// The node's image puller (shared with image volumes): its record of which credentials pulled which
    /// image decides whether a pod may use a cached container image (KEP-2535).
    puller: Option<Arc<Puller>>,
    dsw: Mutex<DesiredState>,
    asw: Mutex<ActualState>,
    ops: Mutex<Operations>,
    pods: Mutex<HashMap<String, PodRuntime>>,
    kick: Notify,
    /// Set once the state left by a previous kubelet is reconstructed; the node is not idle before.
    reconstructed: std::sync::atomic::AtomicBool,
    /// Set by the first populator pass after the API's sources are ready (upstream's `HasAddedPods`):
    /// until then nothing is torn down, no sandbox is stopped and no pod dir removed, since a pod missing
    /// from the desired state may only not be loaded yet (`reconstruct.go`, `readyToUnmount`).
    populator_has_added_pods: std::sync::atomic::AtomicBool,
    /// Set once the sandboxes a previous kubelet left have been adopted or stopped.
    sandboxes_adopted: std::sync::atomic::AtomicBool,
    /// When the runtime was last relisted.
    last_relist: Mutex<Option<Instant>>,
}

impl Kubelet {
    /// A node over `api`, reaching its runtime through `cri`.
    ///
    /// Image volumes (`volumes[].image`) are served when `images` is given; without it such pods fail
    /// with upstream's "no volume plugin matched".
    pub fn new(
        config: NodeConfig,
        api: Arc<Api>,
        cri: Cri,
        mounter: Arc<dyn MountLayer>,
        observer: Arc<dyn CsiObserver>,
        images: Option<Arc<Engine>>,
    ) -> Arc<Self> {
        let registry = Arc::new(DriverRegistry::new(
            &config.name,
            Arc::clone(&api),
            observer,
        ));
        let host = Arc::new(NodeHost {
            node: config.name.clone(),
            root: config.root.clone(),
            api: Arc::clone(&api),
            registry: Arc::clone(&registry),
            mounter,
            gates: config.gates.clone(),
        });
        let mut plugins: Vec<Arc<dyn VolumePlugin>> = vec![
            Arc::new(CsiPlugin::new(host.clone())),
            Arc::new(SecretPlugin::new(host.clone())),
            Arc::new(EmptyDirPlugin::new(host.clone())),
        ];
        // The engine's puller, or (when the runtime's storage cannot be opened for image volumes) one of
        // the node's own over the same record: container images follow the policy either way.
        let puller = match &images {
            Some(engine) => Some(Arc::clone(&engine.puller)),
            None => Puller::new(
                cri.image.clone(),
                &image_plugin_dir(&config.root),
                config.image_verification,
                None,
            )
            .map(Arc::new)
            .inspect_err(
                |e| tracing::error!(node = %config.name, error = %e, "no image pull record"),
            )
            .ok(),
        };
        if let Some(engine) = images {
            plugins.push(Arc::new(ImagePlugin::new(
                host.clone(),
                engine,
                config.image_pull_wait,
            )));
        }
        api.put(Node {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        Arc::new(Self {
            ops: Mutex::new(Operations::new(config.backoff)),
            config,
            api,
            registry,
            host,
            plugins,
            cri,
            puller,
            dsw: Mutex::default(),
            asw: Mutex::default(),
            pods: Mutex::default(),
            kick: Notify::new(),
            reconstructed: std::sync::atomic::AtomicBool::new(false),
            populator_has_added_pods: std::sync::atomic::AtomicBool::new(false),
            sandboxes_adopted: std::sync::atomic::AtomicBool::new(false),
            last_relist: Mutex::new(None),
        })
    }

    /// Runs the node until `stop` resolves: on every API change, finished operation or expired backoff,
    /// the populator, the reconciler and the pod workers each take one pass.
    pub async fn run(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        self.reconstruct().await;
        self.reconstructed.store(true, Ordering::Release);
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
        // Only this node's objects and the cluster's, as a kubelet's pod watch and informers see them.
        let (mut own, mut cluster) = (
            self.api.watch_node(&self.config.name),
            self.api.watch_cluster(),
        );
        loop {
            let synced = Instant::now();
            self.sync().await;
            let mut next = self
                .ops
                .lock()
                .next_retry()
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
        self.populate().await;
        let ready = self.populator_has_added_pods();
        if ready && !self.sandboxes_adopted.swap(true, Ordering::AcqRel) {
            self.adopt_sandboxes().await;
        }
        self.reconcile().await;
        self.sync_pods().await;
        self.relist().await;
        if ready {
            self.clean_orphaned_pod_dirs();
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

    /// True once the populator has added every pod of the API after its sources were ready.
    fn populator_has_added_pods(&self) -> bool {
        self.populator_has_added_pods.load(Ordering::Acquire)
    }

    /// Pods bound to this node.
    fn my_pods(&self) -> Vec<Arc<Pod>> {
        self.api.pods_on(&self.config.name)
    }

    /// `node.status.volumesInUse`: what the attach/detach controller must not detach. Written only when it
    /// changes, so the node does not wake itself.
    ///
    /// Only attachable volumes, as upstream's `GetVolumesInUse`: those the desired state wants attached,
    /// and, until they are unmounted, those already reported that the actual state still holds.
    fn report_volumes_in_use(&self) {
        let current = self
            .api
            .peek::<Node>("", &self.config.name)
            .and_then(|n| n.status.clone())
            .and_then(|s| s.volumes_in_use)
            .unwrap_or_default();
        let mut in_use: BTreeSet<String> = self
            .dsw
            .lock()
            .volumes()
            .iter()
            .filter(|(_, v)| v.attachable)
            .map(|(unique, _)| unique.clone())
            .collect();
        let asw = self.asw.lock();
        in_use.extend(current.iter().filter(|v| asw.volume(v).is_some()).cloned());
        drop(asw);
        let in_use: Vec<String> = in_use.into_iter().collect();
        if current != in_use {
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
        self.reconstructed.load(Ordering::Acquire)
    }

    /// True when nothing is wanted, nothing is attached, staged or mounted, and no operation runs (and
    /// what a previous kubelet left has been looked at).
    pub fn idle(&self) -> bool {
        self.reconstructed.load(Ordering::Acquire)
            && self.sandboxes_adopted.load(Ordering::Acquire)
            && !self.ops.lock().busy()
            && self.dsw.lock().volumes().is_empty()
            && self.asw.lock().volumes().is_empty()
    }

    /// The plugin that handles `spec` on this node.
    pub fn volume_plugin(&self, spec: &inlet_volume::Spec) -> Arc<dyn VolumePlugin> {
        self.plugin_for(spec)
    }

    /// Wakes the node's loop now.
    pub fn wake(&self) {
        self.kick.notify_one();
    }
}

/// Aborts a task when dropped: a kubelet's helpers stop with it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
