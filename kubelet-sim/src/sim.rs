//! A whole simulated cluster in one process: the embedded API, N nodes, their CSI drivers, a CRI runtime
//! (cri-fake in-process, or a real one), the attach/detach controller and a trivial scheduler. The
//! `kubelet-sim run` command and the BDD scenarios both drive it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cri_fake::FakeRuntime;
use cri_fake::pull::Registries;
use inlet_host::mount::MountLayer;
use inlet_image::pull::VerificationPolicy;
use inlet_image::{Engine, EngineConfig};
use inlet_proto::csi::v1 as csi_proto;
use inlet_proto::csi_call::CsiCall;
use inlet_volume::csi::CsiObserver;
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod, PodStatus,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use parking_lot::Mutex;

use crate::api::admission::Admission;
use crate::api::manifest::{EXPECTED_PHASE_ANNOTATION, Manifest, Object};
use crate::api::{Api, now};
use crate::controllers::attach_detach::AttachDetach;
use crate::cri::Cri;
use crate::drivers::{DriverArg, DriverHandle, DriverSource};
use crate::node::{BackoffPolicy, ContainerTiming, Kubelet, NodeConfig};
use crate::report::{EventReport, PodReport, Rejection, Report, TeardownReport};

/// How a simulation is set up.
#[derive(Clone)]
pub struct SimConfig {
    /// Root dir: `<root>/<node>/` is each node's kubelet root; `<root>/cri-fake/` the in-process runtime's.
    pub root: PathBuf,
    /// How many nodes (`node-1` ... `node-N`).
    pub nodes: usize,
    /// The CSI drivers.
    pub drivers: Vec<DriverArg>,
    /// A CRI runtime's socket; None starts cri-fake in-process.
    pub cri: Option<PathBuf>,
    /// Feature gates that are on (`PersistentInlineCSI`).
    pub gates: BTreeSet<String>,
    /// The inline-driver policy (None: every driver allowed).
    pub allowed_inline_drivers: Option<BTreeSet<String>>,
    /// Retry backoff.
    pub backoff: BackoffPolicy,
    /// How long pods wait for volumes before the kubelet's timeout event.
    pub volume_wait_timeout: Duration,
    /// How often `requiresRepublish` volumes are published again.
    pub republish_period: Duration,
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

/// Images in a simulation.
#[derive(Debug, Clone)]
pub struct SimImages {
    /// OCI layouts the in-process cri-fake imports at start: `(repository, dir)`.
    pub layouts: Vec<(String, PathBuf)>,
    /// Registries the in-process cri-fake pulls real content from over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// How long one mount attempt of an image volume (in-tree, or the `image` driver's NodePublish) waits
    /// for its pull before retrying later while the pull goes on.
    pub pull_wait: Duration,
    /// Which cached images a pod must prove credentials for (the kubelet's
    /// `imagePullCredentialsVerificationPolicy`): container images, in-tree image volumes and the
    /// in-process image drivers alike.
    pub verification: VerificationPolicy,
}

impl Default for SimImages {
    fn default() -> Self {
        Self {
            layouts: Vec::new(),
            insecure_registries: Vec::new(),
            // The kubelet's CSI timeout (two minutes) less the driver's margin.
            pull_wait: Duration::from_secs(100),
            verification: VerificationPolicy::default(),
        }
    }
}

/// Collects every CSI call for the report.
#[derive(Default)]
pub struct CallLog(Mutex<Vec<CsiCall>>);

impl CsiObserver for CallLog {
    fn observe(&self, call: CsiCall) {
        self.0.lock().push(call);
    }
}

impl CallLog {
    /// Every call so far.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.0.lock().clone()
    }
}

/// A running simulation.
pub struct Simulation {
    /// The API.
    pub api: Arc<Api>,
    /// The nodes.
    pub nodes: Vec<Arc<Kubelet>>,
    /// Every CSI call.
    pub calls: Arc<CallLog>,
    /// The in-process runtime, when no `--cri` was given.
    pub cri_fake: Option<Arc<FakeRuntime>>,
    /// Its server on the runtime socket, while it serves.
    cri_server: Option<RuntimeServer>,
    config: SimConfig,
    admission: Admission,
    attach_detach: Arc<AttachDetach>,
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
    /// The runtime's socket; each node dials it.
    cri_socket: PathBuf,
    drivers: Vec<DriverHandle>,
    rejected: Vec<Rejection>,
    next_node: usize,
    /// In a cluster, the pods this run's manifests created (namespace, name).
    created: BTreeSet<(String, String)>,
}

impl Simulation {
    /// Starts the runtime, the nodes, their drivers (registered on every node) and the controllers.
    pub async fn start(config: SimConfig) -> Result<Self, String> {
        std::fs::create_dir_all(&config.root)
            .map_err(|e| format!("{}: {e}", config.root.display()))?;
        let api = Api::new();
        let (stop, _) = tokio::sync::watch::channel(false);
        let tasks = Vec::new();
        // Each node dials the runtime itself, as each real kubelet has its own connection: one shared
        // HTTP/2 connection for every simulated node fails calls under load.
        let (cri_socket, cri_fake) = match &config.cri {
            Some(socket) => (socket.clone(), None),
            None => {
                let root = config.root.join("cri-fake");
                let registries = Registries {
                    secure: Vec::new(),
                    insecure: config.images.insecure_registries.clone(),
                };
                let runtime = Arc::new(
                    FakeRuntime::with_registries(root.clone(), Default::default(), registries)
                        .map_err(|e| format!("cri-fake: {e}"))?,
                );
                for (repository, dir) in &config.images.layouts {
                    runtime
                        .images()
                        .import_layout(dir, repository)
                        .map_err(|e| format!("image layout {repository}={}: {e}", dir.display()))?;
                }
                let socket = root.join("cri.sock");
                (socket, Some(runtime))
            }
        };
        let cri_server = cri_fake
            .as_ref()
            .map(|runtime| serve_runtime(Arc::clone(runtime), &cri_socket));
        let calls = Arc::new(CallLog::default());
        let mut nodes: Vec<Arc<Kubelet>> = Vec::new();
        for i in 1..=config.nodes.max(1) {
            let name = format!("{}-{i}", config.node_name_prefix);
            let node_config = NodeConfig {
                root: config.root.join(&name),
                name,
                gates: config.gates.clone(),
                backoff: config.backoff,
                volume_wait_timeout: config.volume_wait_timeout,
                republish_period: config.republish_period,
                image_pull_wait: config.images.pull_wait,
                containers: config.containers,
                plugins_registry: config.plugins_registry.clone(),
                image_verification: config.images.verification,
            };
            let timeout = config.containers.runtime_request_timeout;
            let cri = connect_cri(&cri_socket, timeout).await?;
            let images = image_engine(
                &cri_socket,
                &node_config.root,
                &config.mounter,
                config.images.verification,
            )
            .await;
            nodes.push(Kubelet::new(
                node_config,
                Arc::clone(&api),
                cri,
                Arc::clone(&config.mounter),
                calls.clone(),
                images,
            ));
        }
        let attach_detach = AttachDetach::new(Arc::clone(&api), &nodes, config.backoff);
        let mut sim = Self {
            admission: Admission {
                allowed_inline_drivers: config.allowed_inline_drivers.clone(),
            },
            api,
            nodes,
            calls,
            cri_fake,
            cri_server,
            attach_detach,
            stop,
            tasks,
            node_runs: BTreeMap::new(),
            cri_socket,
            drivers: Vec::new(),
            rejected: Vec::new(),
            next_node: 0,
            created: BTreeSet::new(),
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
                let names = sim.nodes.iter().map(|n| n.config.name.clone()).collect();
                let version = runtime_version(&sim.cri_socket).await;
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
            }
        }
        Ok(sim)
    }

    /// Starts (for `local` and `image`) and registers a driver on every node.
    pub async fn add_driver(&mut self, driver: &DriverArg) -> Result<(), String> {
        for node in self.nodes.clone() {
            let socket = match &driver.source {
                DriverSource::Socket(path) => path.clone(),
                _ => {
                    let handle = self.start_in_process(driver, &node).await?;
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
    pub async fn add_self_registering_driver(&mut self, driver: &DriverArg) -> Result<(), String> {
        let dir = self
            .config
            .plugins_registry
            .clone()
            .ok_or("no plugins registry to register through (--plugins-registry)")?;
        let node = Arc::clone(&self.nodes[0]);
        let mut handle = self.start_in_process(driver, &node).await?;
        handle.serve_registration(&dir);
        self.drivers.push(handle);
        Ok(())
    }

    async fn start_in_process(
        &self,
        driver: &DriverArg,
        node: &Kubelet,
    ) -> Result<DriverHandle, String> {
        let (name, root) = (&node.config.name, &node.config.root);
        let mounter = Arc::clone(&self.config.mounter);
        match &driver.source {
            DriverSource::Local {
                attach,
                mount_group,
            } => {
                DriverHandle::start_local(
                    &driver.name,
                    name,
                    root,
                    (*attach, *mount_group),
                    mounter,
                )
                .await
            }
            DriverSource::Image => {
                let images = &self.config.images;
                DriverHandle::start_image(
                    &driver.name,
                    name,
                    root,
                    &self.cri_socket,
                    images,
                    mounter,
                )
                .await
            }
            DriverSource::Socket(path) => Err(format!(
                "driver {}: {} is not started by kubelet-sim",
                driver.name,
                path.display()
            )),
        }
    }

    /// Stops serving the in-process runtime, as a runtime restart does: its socket goes away, what it runs
    /// stays (containerd's containers outlive its restarts), and the kubelets' calls fail meanwhile.
    pub async fn stop_runtime(&mut self) {
        if let Some((stop, task)) = self.cri_server.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Serves the in-process runtime again, on the same socket.
    pub fn start_runtime(&mut self) {
        if let (None, Some(runtime)) = (&self.cri_server, &self.cri_fake) {
            self.cri_server = Some(serve_runtime(Arc::clone(runtime), &self.cri_socket));
        }
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
    pub async fn register(&self, node: &str, name: &str, socket: &Path) -> Result<(), String> {
        let kubelet = self.node(node).ok_or_else(|| format!("no node {node:?}"))?;
        kubelet
            .registry
            .register(name, socket)
            .await
            .map_err(|e| format!("driver {name} on {node}: {e}"))?;
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
    pub async fn start_node(&mut self, name: &str) -> Result<(), String> {
        let old = self.node(name).ok_or_else(|| format!("no node {name:?}"))?;
        let images = image_engine(
            &self.cri_socket,
            &old.config.root,
            &self.config.mounter,
            self.config.images.verification,
        )
        .await;
        let node = Kubelet::new(
            old.config.clone(),
            Arc::clone(&self.api),
            connect_cri(
                &self.cri_socket,
                old.config.containers.runtime_request_timeout,
            )
            .await?,
            Arc::clone(&self.config.mounter),
            self.calls.clone(),
            images,
        );
        for (driver, socket) in old.registry.endpoints() {
            node.registry.register(&driver, &socket).await?;
        }
        for slot in self.nodes.iter_mut().filter(|n| n.config.name == name) {
            *slot = Arc::clone(&node);
        }
        self.attach_detach.replace_node(Arc::clone(&node));
        self.spawn_node(node);
        Ok(())
    }

    /// The runtime's socket (the in-process cri-fake's, or `--cri`).
    pub fn cri_socket(&self) -> &Path {
        &self.cri_socket
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<Arc<Kubelet>> {
        self.nodes.iter().find(|n| n.config.name == name).cloned()
    }

    /// Applies manifests: everything but pods first (so pods find their drivers, secrets and claims), then
    /// pods, each admitted and bound to a node. Refused objects are kept for the report. PVs of a `local`
    /// driver are pre-provisioned first, as an administrator would (see [`Self::provision`]).
    pub async fn apply(&mut self, manifests: Vec<Manifest>) {
        let mut admitted = Vec::with_capacity(manifests.len());
        for manifest in manifests {
            if let Object::PersistentVolume(pv) = &manifest.object {
                // Validated first: a PV the API server would refuse is neither provisioned nor stored.
                if let Err(e) = self.admission.validate_persistent_volume(pv) {
                    tracing::warn!(origin = manifest.origin, "{e}");
                    self.rejected.push(Rejection {
                        origin: manifest.origin,
                        message: e.0,
                        expected: false,
                    });
                    continue;
                }
                if let Err(message) = self.provision(pv).await {
                    self.rejected.push(Rejection {
                        origin: manifest.origin.clone(),
                        message,
                        expected: false,
                    });
                }
            }
            admitted.push(manifest);
        }
        let (pods, others): (Vec<_>, Vec<_>) = admitted
            .into_iter()
            .partition(|m| matches!(m.object, Object::Pod(_)));
        if let Some(client) = self.config.cluster.clone() {
            return self
                .create_in_cluster(client, others.into_iter().chain(pods))
                .await;
        }
        for manifest in others.into_iter().chain(pods) {
            let expected = match &manifest.object {
                Object::Pod(pod) => pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION))
                    .is_some_and(|e| e == "Rejected"),
                _ => false,
            };
            if let Err(message) = self.apply_one(manifest.object) {
                tracing::warn!(origin = manifest.origin, "{message}");
                self.rejected.push(Rejection {
                    origin: manifest.origin,
                    message,
                    expected,
                });
            }
        }
        self.bind_claims();
        self.api.mark_sources_ready();
    }

    fn apply_one(&mut self, object: Object) -> Result<(), String> {
        match object {
            Object::Pod(pod) => {
                let mut pod = self.admission.admit_pod(&self.api, *pod).map_err(|e| e.0)?;
                let spec = pod.spec.get_or_insert_with(Default::default);
                let node = match &spec.node_name {
                    Some(node) => node.clone(),
                    None => {
                        // The scheduler: round robin over the nodes.
                        let node = self.nodes[self.next_node % self.nodes.len()]
                            .config
                            .name
                            .clone();
                        self.next_node += 1;
                        spec.node_name = Some(node.clone());
                        node
                    }
                };
                pod.status = Some(PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                });
                let (namespace, name) = (
                    pod.metadata.namespace.clone().unwrap_or_default(),
                    pod.metadata.name.clone().unwrap_or_default(),
                );
                if self.api.peek::<Pod>(&namespace, &name).is_some() {
                    return Err(format!("pods {name:?} already exists"));
                }
                self.api.put(pod.clone());
                self.api.record_event(
                    &pod,
                    "Normal",
                    "Scheduled",
                    &format!("Successfully assigned {namespace}/{name} to {node}"),
                );
            }
            Object::Secret(secret) => self
                .api
                .put(self.admission.admit_secret(*secret).map_err(|e| e.0)?),
            Object::CsiDriver(driver) => self
                .api
                .put(self.admission.admit_csi_driver(*driver).map_err(|e| e.0)?),
            // Validated in `apply`, before provisioning.
            Object::PersistentVolume(pv) => self.api.put(*pv),
            Object::PersistentVolumeClaim(mut pvc) => {
                pvc.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                self.api.put(*pvc);
            }
            Object::ServiceAccount(mut sa) => {
                sa.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                self.api.put(*sa);
            }
            Object::Namespace(_) => {}
        }
        Ok(())
    }

    /// The PV controller, for pre-bound volumes only (no provisioning): a claim naming a PV, or a PV whose
    /// claimRef names a claim, binds both.
    fn bind_claims(&self) {
        for pvc in self.api.list::<PersistentVolumeClaim>() {
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                continue;
            }
            let (namespace, name) = (
                pvc.metadata.namespace.clone().unwrap_or_default(),
                pvc.metadata.name.clone().unwrap_or_default(),
            );
            let claimed_by = |pv: &Arc<PersistentVolume>| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .is_some_and(|r| {
                        r.name.as_deref() == Some(&name)
                            && r.namespace.as_deref() == Some(&namespace)
                    })
            };
            let named = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
            let pv = match named {
                Some(pv_name) => self.api.peek::<PersistentVolume>("", &pv_name),
                None => self
                    .api
                    .list::<PersistentVolume>()
                    .into_iter()
                    .find(claimed_by),
            };
            let Some(pv) = pv else { continue };
            let pv_name = pv.metadata.name.clone().unwrap_or_default();
            self.api
                .update::<PersistentVolumeClaim>(&namespace, &name, |c| {
                    c.spec.get_or_insert_with(Default::default).volume_name = Some(pv_name.clone());
                    c.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
                });
            self.api.update::<PersistentVolume>("", &pv_name, |p| {
                let spec = p.spec.get_or_insert_with(Default::default);
                spec.claim_ref.get_or_insert_with(|| ObjectReference {
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                });
                p.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
            });
        }
    }

    /// Pre-provisions a PV's volume on every node's `local` driver (CreateVolume named by the PV's handle,
    /// of the PV's capacity): the step an administrator takes before writing a static PV. Volumes of other
    /// drivers are the user's to create.
    async fn provision(&self, pv: &PersistentVolume) -> Result<(), String> {
        let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
            return Ok(());
        };
        let local = self
            .config
            .drivers
            .iter()
            .any(|d| d.name == csi.driver && matches!(d.source, DriverSource::Local { .. }));
        if !local {
            return Ok(());
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        let storage = pv
            .spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone())
            .unwrap_or_else(|| "1Gi".into());
        let bytes = inlet_host::quantity::parse_bytes(&storage)
            .map_err(|e| format!("PersistentVolume {name:?}: spec.capacity.storage: {e}"))?;
        for handle in self.drivers.iter().filter(|h| h.name == csi.driver) {
            let channel = inlet_proto::uds::connect(&handle.socket)
                .await
                .map_err(|e| e.to_string())?;
            let request = csi_proto::CreateVolumeRequest {
                name: csi.volume_handle.clone(),
                capacity_range: Some(csi_proto::CapacityRange {
                    required_bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![csi_proto::VolumeCapability {
                    access_mode: Some(csi_proto::volume_capability::AccessMode {
                        mode: csi_proto::volume_capability::access_mode::Mode::SingleNodeWriter
                            as i32,
                    }),
                    access_type: Some(csi_proto::volume_capability::AccessType::Mount(
                        Default::default(),
                    )),
                }],
                ..Default::default()
            };
            csi_proto::controller_client::ControllerClient::new(channel)
                .create_volume(request)
                .await
                .map_err(|s| {
                    format!(
                        "pre-provisioning PersistentVolume {name:?} on {}: {}",
                        handle.node,
                        s.message()
                    )
                })?;
        }
        Ok(())
    }

    /// Creates the objects in the cluster's API server, which admits them; pods are bound to these nodes
    /// round robin unless they name one. The API server's refusals are kept for the report.
    async fn create_in_cluster(
        &mut self,
        client: kube::Client,
        manifests: impl Iterator<Item = Manifest>,
    ) {
        let cluster = crate::cluster::Cluster::new(client);
        let mut created = Vec::new();
        for manifest in manifests {
            let node = self.nodes[self.next_node % self.nodes.len()]
                .config
                .name
                .clone();
            let pod = match &manifest.object {
                Object::Pod(pod) => {
                    self.next_node += 1;
                    let meta = &pod.metadata;
                    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
                    Some((namespace, meta.name.clone().unwrap_or_default()))
                }
                _ => None,
            };
            match cluster.create(manifest.object, &node).await {
                Ok(()) => created.extend(pod),
                Err(message) => {
                    tracing::warn!(origin = manifest.origin, "{message}");
                    self.rejected.push(Rejection {
                        origin: manifest.origin,
                        message,
                        expected: false,
                    });
                }
            }
        }
        // The pods reach the nodes by their watches: settling starts once they are all there.
        let arrived = |sim: &Self| {
            created
                .iter()
                .all(|(namespace, name)| sim.api.peek::<Pod>(namespace, name).is_some())
        };
        if !self.wait_for(Duration::from_secs(60), arrived).await {
            tracing::warn!("not every pod created reached its node's watch within 60 s");
        }
        self.created.extend(created);
    }

    /// Starts deleting a pod (graceful: the node stops it, tears its volumes down, then it leaves the API).
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.api.update::<Pod>(namespace, name, |p| {
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

    /// True when every pod is where its manifest expects it.
    pub fn pods_as_expected(&self) -> bool {
        self.run_pods().iter().all(|p| {
            let expected = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION));
            match expected.map(String::as_str) {
                // The common case, checked without building the pod's report (its events).
                None | Some("Running") => {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                }
                Some(_) => self.pod_report(p).as_expected(),
            }
        })
    }

    /// The pods this run is about: in a cluster, those its manifests created (other pods may run on its
    /// nodes: DaemonSets tolerate any taint); alone, every pod.
    fn run_pods(&self) -> Vec<Arc<Pod>> {
        let pods = self.api.list::<Pod>();
        if self.config.cluster.is_none() || self.created.is_empty() {
            return pods;
        }
        let created = |p: &Arc<Pod>| {
            let meta = &p.metadata;
            self.created.contains(&(
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            ))
        };
        pods.into_iter().filter(created).collect()
    }

    /// The report now.
    pub fn report(&self) -> Report {
        let mut pods: Vec<PodReport> = self
            .api
            .list::<Pod>()
            .iter()
            .map(|p| self.pod_report(p))
            .collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Report {
            pods,
            csi_calls: self.calls.calls(),
            api_reads: self.api.reads(),
            volume_attachments: self.attach_detach.report(),
            rejected: self.rejected.clone(),
            teardown: None,
        }
    }

    fn pod_report(&self, pod: &Pod) -> PodReport {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let containers = self
            .node(&node)
            .and_then(|n| n.pod_runtime(&uid))
            .map(|r| r.containers)
            .unwrap_or_default();
        PodReport {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            phase: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
            expected_phase: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(EXPECTED_PHASE_ANNOTATION).cloned())
                .unwrap_or_else(|| "Running".into()),
            volumes: pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .map(|v| v.iter().map(|v| v.name.clone()).collect())
                .unwrap_or_default(),
            events: self
                .api
                .events_for(&uid)
                .into_iter()
                .map(|e| EventReport {
                    type_: e.type_.unwrap_or_default(),
                    reason: e.reason.unwrap_or_default(),
                    message: e.message.unwrap_or_default(),
                    count: e.count.unwrap_or(1),
                })
                .collect(),
            containers,
            uid,
            node,
        }
    }

    /// Deletes every pod and waits until they, their volumes and their attachments are gone; then looks
    /// for anything left under the root.
    pub async fn teardown(&self, timeout: Duration) -> TeardownReport {
        let started = Instant::now();
        let cluster = self
            .config
            .cluster
            .clone()
            .map(crate::cluster::Cluster::new);
        let mut deleted = Vec::new();
        for pod in self.run_pods() {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            deleted.push((namespace.to_string(), name.to_string(), uid));
            match &cluster {
                // Through the API server: the deletion comes back by the watch, as any other would.
                Some(cluster) => {
                    if let Err(e) = cluster.delete_pod(namespace, name).await {
                        tracing::warn!(pod = name, "deleting: {e}");
                    }
                }
                None => drop(self.delete_pod(namespace, name)),
            }
        }
        let gone = || {
            let deleted_gone = deleted.iter().all(|(namespace, name, uid)| {
                self.api
                    .peek::<Pod>(namespace, name)
                    .is_none_or(|p| p.metadata.uid.as_deref() != Some(uid))
            });
            // A pod leaves only once its volumes are torn down; when no other pod remains, the nodes
            // must also be idle (unstaged, detached) and have removed the pod directories a previous
            // kubelet left (their orphan cleanup runs in the pass after the last teardown).
            let no_pod_dirs = |n: &Kubelet| {
                std::fs::read_dir(n.config.root.join("pods"))
                    .map_or(true, |mut entries| entries.next().is_none())
            };
            deleted_gone
                && (!self.api.list::<Pod>().is_empty()
                    || (self.api.list::<VolumeAttachment>().is_empty()
                        && self.nodes.iter().all(|n| n.idle() && no_pod_dirs(n))))
        };
        let mut complete = self.wait_for(timeout, |_| gone()).await;
        // In a cluster, the pods' objects go with their nodes' final deletes.
        if let Some(cluster) = &cluster {
            while complete && !cluster.pods_gone(&deleted).await {
                complete = started.elapsed() < timeout;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let mut leftover_mounts = Vec::new();
        let mut leftover_pod_dirs = Vec::new();
        for node in &self.nodes {
            let pods_dir = node.config.root.join("pods");
            for entry in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
                leftover_pod_dirs.push(entry.path().display().to_string());
            }
            let mut stack = vec![node.config.root.clone()];
            while let Some(dir) = stack.pop() {
                if self.config.mounter.is_mount_point(&dir).unwrap_or(false) {
                    // A running local driver's own mount of its content dir is not a leftover.
                    if !inlet_plugin::local::content_mount::is_own(&dir) {
                        leftover_mounts.push(dir.display().to_string());
                    }
                    continue;
                }
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(entry.path());
                    }
                }
            }
        }
        let mut leftover_image_state = Vec::new();
        for node in &self.nodes {
            let plugins = node.config.root.join("plugins");
            let mut dirs = vec![plugins.join("kubernetes.io/image")];
            dirs.extend(
                self.drivers
                    .iter()
                    .filter(|d| d.node == node.config.name)
                    .filter_map(|d| d.image_state.clone()),
            );
            for dir in dirs {
                leftover_image_state.extend(
                    inlet_image::leftovers(&dir)
                        .into_iter()
                        .map(|p| p.display().to_string()),
                );
            }
        }
        let leftover_attachments = self
            .api
            .list::<VolumeAttachment>()
            .into_iter()
            .filter_map(|v| v.metadata.name.clone())
            .collect();
        TeardownReport {
            complete,
            leftover_mounts,
            leftover_pod_dirs,
            leftover_attachments,
            leftover_image_state,
        }
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

/// The in-process runtime's server: its stop signal and task.
pub(crate) type RuntimeServer = (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Serves `runtime` on `socket` in the background.
pub(crate) fn serve_runtime(runtime: Arc<FakeRuntime>, socket: &Path) -> RuntimeServer {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let path = socket.to_path_buf();
    let task = tokio::spawn(async move {
        let _ = cri_fake::serve(&path, runtime, async move { drop(stopped.await) }).await;
    });
    (stop, task)
}

/// The runtime as a Node reports it: `<name>://<version>` (CRI Version).
async fn runtime_version(socket: &Path) -> String {
    let Ok(mut cri) = Cri::connect(socket, Duration::from_secs(10)).await else {
        return String::new();
    };
    let request = inlet_proto::runtime::v1::VersionRequest {
        version: "v1".into(),
    };
    match cri.runtime.version(request).await {
        Ok(v) => {
            let v = v.into_inner();
            format!("{}://{}", v.runtime_name, v.runtime_version)
        }
        Err(_) => String::new(),
    }
}

async fn connect_cri(socket: &Path, runtime_timeout: Duration) -> Result<Cri, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Cri::connect(socket, runtime_timeout).await {
            Ok(cri) => return Ok(cri),
            Err(e) if Instant::now() >= deadline => return Err(format!("CRI runtime: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// The kubelet-side image engine of a node, over the runtime at `cri_socket`, with its state under the
/// node's `plugins/kubernetes.io/image/`. None (image volumes unsupported on the node) when the runtime's
/// storage cannot be opened.
async fn image_engine(
    cri_socket: &Path,
    node_root: &Path,
    mounter: &Arc<dyn MountLayer>,
    verification: VerificationPolicy,
) -> Option<Arc<Engine>> {
    let config = EngineConfig {
        verification,
        ..EngineConfig::new(cri_socket, &crate::node::image_plugin_dir(node_root))
    };
    match Engine::start(&config, Arc::clone(mounter)).await {
        Ok(engine) => Some(Arc::new(engine)),
        Err(e) => {
            tracing::warn!(node_root = %node_root.display(), error = %e, "image volumes are unavailable");
            None
        }
    }
}
