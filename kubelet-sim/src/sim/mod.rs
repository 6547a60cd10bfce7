//! A whole simulated cluster in one process: the embedded API, N nodes, their CSI drivers, a CRI runtime
//! (cri-fake in-process, or a real one) and the controllers a control plane would run. The `kubelet-sim
//! run` command, conform, the benches and the BDD scenarios all drive it.
//!
//! # Layout
//! - `mod.rs`: [`Simulation`]: starting and stopping the runtime, nodes and drivers; waiting.
//! - `calls.rs`: [`ReportedCalls`], every CSI call the nodes make, kept deflated for the report.
//! - `apply.rs`: manifests applied as an API server and scheduler would (or created in a real cluster).
//! - `report.rs`: the report now, and whether every pod is where its manifest expects it.
//! - `teardown.rs`: every pod deleted, and the scan for anything left under the root.
//! - `runtimes.rs`: each node's CRI runtime (an in-process cri-fake per node, or `--cri`).
//! - `error.rs`: [`SimError`], why a simulation (or one of its steps) could not run.

mod apply;
mod calls;
mod error;
mod report;
mod runtimes;
mod teardown;

pub use calls::{IN_FLIGHT, ReportedCalls};

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cri_fake::FakeRuntime;
use inlet_host::mount::MountLayer;
use parking_lot::Mutex;

pub use error::SimError;

use crate::api::admission::Admission;
use crate::api::now;
use crate::api::{Api, ApiPod};
use crate::controllers::attach_detach::AttachDetach;
use crate::controllers::scheduler::RoundRobin;
use crate::cri;
use crate::drivers::{Driver, DriverArg, DriverHandle, DriverNode};
pub use crate::images::SimImages;
use crate::node::registry::DriverDirectory;
use crate::node::{BackoffPolicy, ContainerTiming, Kubelet, NodeConfig};
use crate::report::{Rejection, Report};

/// The gates kubelet-sim models that 1.35 turns on by default: `SELinuxMountReadWriteOncePod` and
/// `SELinuxChangePolicy` (both beta). The others it knows (`PersistentInlineCSI`, `CSIVolumeHealth`,
/// `SELinuxMount`) are off by default.
pub fn default_gates() -> BTreeSet<String> {
    use inlet_volume::selinux::{SELINUX_CHANGE_POLICY, SELINUX_MOUNT_READ_WRITE_ONCE_POD};
    [SELINUX_MOUNT_READ_WRITE_ONCE_POD, SELINUX_CHANGE_POLICY]
        .map(String::from)
        .into()
}

/// How a simulation is set up.
#[derive(Clone)]
pub struct SimConfig {
    /// Root dir: `<root>/<node>/` is each node's kubelet root; `<root>/cri-fake/<node>/` its in-process
    /// runtime's.
    pub root: PathBuf,
    /// How many nodes (`node-1` ... `node-N`).
    pub nodes: usize,
    /// The CSI drivers.
    pub drivers: Vec<DriverArg>,
    /// A CRI runtime's socket; None starts a cri-fake in-process for each node.
    pub cri: Option<PathBuf>,
    /// Feature gates that are on (`PersistentInlineCSI`; [`crate::default_gates`] are 1.35's).
    pub gates: BTreeSet<String>,
    /// The nodes run SELinux ([`inlet_host::selinux::enabled`] on a real host): a PV's volume whose
    /// CSIDriver says `seLinuxMount` is mounted with the pod's label.
    pub selinux: bool,
    /// The inline-driver policy (None: every driver allowed).
    pub allowed_inline_drivers: Option<BTreeSet<String>>,
    /// Retry backoff.
    pub backoff: BackoffPolicy,
    /// How long pods wait for volumes before the kubelet's timeout event.
    pub volume_wait_timeout: Duration,
    /// The deadline of one CSI call (`csiTimeout`: [`inlet_volume::csi::CSI_TIMEOUT`], 2 min).
    pub csi_timeout: Duration,
    /// How often `requiresRepublish` volumes are published again.
    pub republish_period: Duration,
    /// How often mounted volumes are asked for their stats (`--volume-stats-agg-period`; zero: never).
    pub volume_stats_agg_period: Duration,
    /// The mount layer (real when root).
    pub mounter: Arc<dyn MountLayer>,
    /// How started containers are followed (relist period, crash-loop back-off).
    pub containers: ContainerTiming,
    /// Where images come from, and how long image volumes wait for pulls.
    pub images: SimImages,
    /// `--plugins-registry`: the dir every node's plugin watcher registers drivers from.
    pub plugins_registry: Option<PathBuf>,
    /// Nodes are named `<prefix>-1` ... `<prefix>-N`.
    pub node_name_prefix: String,
    /// `--kubeconfig`: the nodes join this cluster's API server (see [`crate::cluster`]) instead of
    /// running on the embedded API alone.
    pub cluster: Option<kube::Client>,
}

/// Sockets a node holds open, measured with inlet's local driver: its runtime's listener and connections,
/// each driver's socket, registration and connections; with some to spare.
const OPEN_FILES_PER_NODE: u64 = 12;

/// The open files a run's nodes need and the limit, when the limit is short: such a run is refused before
/// anything starts, where it would stop halfway ("Too many open files" from whichever socket came last).
fn open_files_short(config: &SimConfig) -> Option<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit};
    let (limit, _) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    let per_node = OPEN_FILES_PER_NODE + 2 * config.drivers.len() as u64;
    let needed = 256 + config.nodes as u64 * per_node;
    (needed > limit).then_some((needed, limit))
}

/// A running simulation.
pub struct Simulation {
    /// The API.
    pub api: Arc<Api>,
    /// The nodes.
    pub nodes: Vec<Arc<Kubelet>>,
    /// Every CSI call.
    pub calls: Arc<ReportedCalls>,
    /// Each node's runtime.
    runtimes: runtimes::Runtimes,
    config: SimConfig,
    admission: Admission,
    attach_detach: Arc<AttachDetach>,
    /// Where each node's drivers answer, for the controllers.
    driver_directory: Arc<DriverDirectory>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Each running kubelet's stop signal and task, so one node can restart alone.
    node_runs: BTreeMap<
        String,
        (
            tokio::sync::oneshot::Sender<()>,
            tokio::task::JoinHandle<()>,
        ),
    >,
    drivers: Vec<DriverHandle>,
    rejected: Vec<Rejection>,
    scheduler: RoundRobin,
    /// In a cluster, the pods this run's manifests created (namespace, name).
    created: BTreeSet<(String, String)>,
    /// The pods not yet as their manifests expect (see [`Simulation::pods_as_expected`]).
    unsettled: Mutex<report::Unsettled>,
}

impl Simulation {
    /// Starts the runtime, the nodes, their drivers (registered on every node) and the controllers.
    pub async fn start(config: SimConfig) -> Result<Self, SimError> {
        if let Some((needed, limit)) = open_files_short(&config) {
            return Err(SimError::OpenFiles {
                nodes: config.nodes,
                needed,
                limit,
            });
        }
        std::fs::create_dir_all(&config.root).map_err(|source| SimError::Root {
            path: config.root.clone(),
            source,
        })?;
        let api = Api::new();
        let (stop, _) = tokio::sync::watch::channel(false);
        let names: Vec<String> = (1..=config.nodes.max(1))
            .map(|i| format!("{}-{i}", config.node_name_prefix))
            .collect();
        // Each node dials its runtime itself, as each real kubelet has its own connection: one shared
        // HTTP/2 connection for every simulated node fails calls under load.
        let runtimes =
            runtimes::Runtimes::start(config.cri.as_deref(), &config.root, &names, &config.images)?;
        let calls = Arc::new(ReportedCalls::default());
        let driver_directory = Arc::new(DriverDirectory::default());
        let mut nodes: Vec<Arc<Kubelet>> = Vec::new();
        for name in names {
            let node_config = NodeConfig {
                root: config.root.join(&name),
                name,
                gates: config.gates.clone(),
                selinux: config.selinux,
                backoff: config.backoff,
                volume_wait_timeout: config.volume_wait_timeout,
                csi_timeout: config.csi_timeout,
                republish_period: config.republish_period,
                volume_stats_agg_period: config.volume_stats_agg_period,
                image_pull_wait: config.images.pull_wait,
                containers: config.containers,
                plugins_registry: config.plugins_registry.clone(),
                image_verification: config.images.verification,
                image_allowlist: config.images.allowlist.clone(),
                image_volume_mounts: config.images.volume_mounts,
                image_gc: config.images.gc,
            };
            let cri_socket = runtimes.socket(&node_config.name).to_path_buf();
            let node = new_kubelet(
                node_config,
                &api,
                &cri_socket,
                &config,
                &calls,
                &driver_directory,
            );
            nodes.push(node.await?);
        }
        let attach_detach = AttachDetach::new(
            Arc::clone(&api),
            Arc::clone(&driver_directory),
            &config.gates,
            config.backoff,
        );
        let unsettled_feed = api.pod_feed();
        let mut sim = Self {
            admission: Admission {
                allowed_inline_drivers: config.allowed_inline_drivers.clone(),
                persistent_inline: config
                    .gates
                    .contains(inlet_volume::csi::source::PERSISTENT_INLINE_GATE),
            },
            api,
            nodes,
            calls,
            runtimes,
            attach_detach,
            driver_directory,
            stop,
            tasks: Vec::new(),
            node_runs: BTreeMap::new(),
            drivers: Vec::new(),
            rejected: Vec::new(),
            scheduler: RoundRobin::default(),
            created: BTreeSet::new(),
            unsettled: Mutex::new(report::Unsettled::new(unsettled_feed)),
            config,
        };
        for driver in sim.config.drivers.clone() {
            sim.add_driver(&driver).await?;
        }
        for node in sim.nodes.clone() {
            sim.spawn_node(node);
        }
        match sim.config.cluster.clone() {
            // Attach and detach are the control plane's in a real cluster.
            Some(client) => {
                let names: Vec<String> = sim.nodes.iter().map(|n| n.config.name.clone()).collect();
                let version = cri::runtime_version(sim.runtimes.socket(&names[0])).await;
                let stop = sim.stop.subscribe();
                let tasks = crate::cluster::Cluster::start(
                    client,
                    Arc::clone(&sim.api),
                    names,
                    version,
                    stop,
                )
                .await?;
                sim.tasks.extend(tasks);
            }
            None => {
                let mut stopped = sim.stop.subscribe();
                sim.tasks.push(tokio::spawn(
                    Arc::clone(&sim.attach_detach)
                        .run(async move { drop(stopped.changed().await) }),
                ));
                let claims = crate::controllers::claims::Claims::new(
                    Arc::clone(&sim.api),
                    Arc::clone(&sim.driver_directory),
                    sim.nodes.iter().map(|n| n.config.name.clone()).collect(),
                    sim.config.backoff,
                );
                let mut stopped = sim.stop.subscribe();
                sim.tasks.push(tokio::spawn(
                    claims.run(async move { drop(stopped.changed().await) }),
                ));
            }
        }
        Ok(sim)
    }

    /// Leaves the real cluster the nodes joined (`--drain-on-exit`): see `cluster/leave.rs`.
    pub async fn leave_cluster(&self, deadline: Duration) -> Result<(), SimError> {
        let Some(client) = self.config.cluster.clone() else {
            return Ok(());
        };
        let names: Vec<String> = self.nodes.iter().map(|n| n.config.name.clone()).collect();
        crate::cluster::Cluster::new(client)
            .leave(&self.api, &names, deadline)
            .await?;
        Ok(())
    }

    /// Starts (for `local` and `image`) and registers a driver on every node.
    pub async fn add_driver(&mut self, driver: &DriverArg) -> Result<(), SimError> {
        for node in self.nodes.clone() {
            let socket = match self.start_driver(driver, &node).await? {
                Driver::External(socket) => socket,
                Driver::InProcess(handle) => {
                    if let Some(engine) = &handle.image_engine {
                        node.count_volume_images(engine);
                    }
                    let socket = handle.socket.clone();
                    self.drivers.push(handle);
                    socket
                }
            };
            self.register(&node.config.name, &driver.name, &socket)
                .await?;
        }
        Ok(())
    }

    /// Starts an in-process driver (`local` or `image`) for the first node that registers itself: it
    /// serves its registration socket in `--plugins-registry`, as a DaemonSet's driver with
    /// `--registration-dir` does, and the node's plugin watcher registers it.
    pub async fn add_self_registering_driver(
        &mut self,
        driver: &DriverArg,
    ) -> Result<(), SimError> {
        let dir = self
            .config
            .plugins_registry
            .clone()
            .ok_or(SimError::NoPluginsRegistry)?;
        let node = Arc::clone(&self.nodes[0]);
        let mut handle = match self.start_driver(driver, &node).await? {
            Driver::InProcess(handle) => handle,
            Driver::External(socket) => {
                return Err(SimError::NotStarted {
                    name: driver.name.clone(),
                    socket,
                });
            }
        };
        handle.serve_registration(&dir);
        if let Some(engine) = &handle.image_engine {
            node.count_volume_images(engine);
        }
        self.drivers.push(handle);
        Ok(())
    }

    async fn start_driver(&self, driver: &DriverArg, node: &Kubelet) -> Result<Driver, SimError> {
        let on = DriverNode {
            node: &node.config.name,
            node_root: &node.config.root,
            cri_socket: self.runtimes.socket(&node.config.name),
            images: &self.config.images,
            mounter: Arc::clone(&self.config.mounter),
        };
        Ok(driver.start(on).await?)
    }

    /// Stops serving the in-process runtimes, as a runtime restart does: their sockets go away, what they
    /// run stays (containerd's containers outlive its restarts), and the kubelets' calls fail meanwhile.
    pub async fn stop_runtime(&mut self) {
        self.runtimes.stop().await;
    }

    /// Serves the in-process runtimes again, on the same sockets.
    pub fn start_runtime(&mut self) {
        self.runtimes.serve();
    }

    /// `node`'s in-process cri-fake (None with `--cri`).
    pub fn cri_fake(&self, node: &str) -> Option<&Arc<FakeRuntime>> {
        self.runtimes.fake(node)
    }

    /// Every node's in-process cri-fake, by node name.
    pub fn cri_fakes(&self) -> impl Iterator<Item = (&str, &Arc<FakeRuntime>)> {
        self.runtimes.fakes()
    }

    /// Stops every in-process instance of the driver `name`, as a crash would: its sockets go away, the
    /// kubelets are not told, and their calls fail until the driver is started (and registered) again.
    pub async fn stop_driver(&mut self, name: &str) {
        let (stopping, kept) = std::mem::take(&mut self.drivers)
            .into_iter()
            .partition(|d| d.name == name);
        self.drivers = kept;
        for driver in stopping {
            driver.stop().await;
        }
    }

    /// Registers a driver serving on `socket` with one node (as its plugin watcher would).
    pub async fn register(&self, node: &str, name: &str, socket: &Path) -> Result<(), SimError> {
        let kubelet = self
            .node(node)
            .ok_or_else(|| SimError::NoNode(node.to_string()))?;
        kubelet
            .registry
            .register(name, socket)
            .await
            .map_err(|reason| SimError::Register {
                name: name.to_string(),
                node: node.to_string(),
                reason,
            })?;
        kubelet.wake();
        Ok(())
    }

    fn spawn_node(&mut self, node: Arc<Kubelet>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let name = node.config.name.clone();
        let task = tokio::spawn(node.run(async move { drop(stopped.await) }));
        self.node_runs.insert(name, (stop, task));
    }

    /// Stops one node's kubelet (its mounts, drivers and sandboxes stay, as when a kubelet process dies).
    pub async fn stop_node(&mut self, name: &str) {
        if let Some((stop, task)) = self.node_runs.remove(name) {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Starts a new kubelet for a stopped node, on the same root: it re-registers the node's drivers and
    /// reconstructs its volumes and pods from disk and the runtime.
    pub async fn start_node(&mut self, name: &str) -> Result<(), SimError> {
        let old = self
            .node(name)
            .ok_or_else(|| SimError::NoNode(name.to_string()))?;
        let node = new_kubelet(
            old.config.clone(),
            &self.api,
            self.runtimes.socket(name),
            &self.config,
            &self.calls,
            &self.driver_directory,
        )
        .await?;
        for (driver, socket) in old.registry.endpoints() {
            node.registry
                .register(&driver, &socket)
                .await
                .map_err(SimError::Reregister)?;
        }
        let engines = self.drivers.iter().filter(|d| d.node == name);
        for engine in engines.filter_map(|d| d.image_engine.as_ref()) {
            node.count_volume_images(engine);
        }
        for slot in self.nodes.iter_mut().filter(|n| n.config.name == name) {
            *slot = Arc::clone(&node);
        }
        self.spawn_node(node);
        Ok(())
    }

    /// The socket of `node`'s runtime (its in-process cri-fake's, or `--cri`).
    pub fn cri_socket(&self, node: &str) -> &Path {
        self.runtimes.socket(node)
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<Arc<Kubelet>> {
        self.nodes.iter().find(|n| n.config.name == name).cloned()
    }

    /// Starts deleting a pod (graceful: the node stops it, tears its volumes down, then it leaves the API).
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.api.update::<ApiPod>(namespace, name, |p| {
            p.metadata.deletion_timestamp.get_or_insert_with(now);
        })
    }

    /// Waits until `done` holds for the simulation, or the timeout passes; true when it held. Checks every
    /// 20 ms rather than on every API change: a check may look at every pod, and changes come in thousands.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let checked = Instant::now();
            if done(self) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // Every 20 ms, or less often when a check is slow (it may look at every pod): waiting must not
            // take the CPU from what it waits for.
            let pause = Duration::from_millis(20).max(4 * (now - checked));
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }

    /// Waits until `done` holds for the whole report (convenient, but builds the report on every wake).
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&Report) -> bool) -> bool {
        self.wait_for(timeout, |sim| done(&sim.report())).await
    }

    /// Stops controllers, nodes, drivers and the in-process runtime.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for name in self.node_runs.keys().cloned().collect::<Vec<_>>() {
            self.stop_node(&name).await;
        }
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        for driver in self.drivers.drain(..) {
            driver.stop().await;
        }
        self.stop_runtime().await;
    }
}

/// A kubelet for `config` over the simulation's API and runtime, with its kubelet-side image engine.
async fn new_kubelet(
    config: NodeConfig,
    api: &Arc<Api>,
    cri_socket: &Path,
    sim: &SimConfig,
    calls: &Arc<ReportedCalls>,
    drivers: &Arc<DriverDirectory>,
) -> Result<Arc<Kubelet>, SimError> {
    let timeout = config.containers.runtime_request_timeout;
    let cri = cri::connect_when_up(cri_socket, timeout).await?;
    let images =
        crate::node::image_engine(cri_socket, &config.root, &sim.mounter, &sim.images).await;
    Ok(Kubelet::new(
        config,
        Arc::clone(api),
        cri,
        Arc::clone(&sim.mounter),
        calls.clone(),
        images,
        Arc::clone(drivers),
    ))
}
