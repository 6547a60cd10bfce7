//! One check's environment: a fresh node, the driver under test behind a [`FaultProxy`], and the steps
//! checks are written in (apply a pod, wait until it runs, delete it, look for what is left). Each step
//! fails with a message that says what the kubelet saw.
//!
//! The node is a simulation of one node under the check's own root (`sim.rs`), or, with `--kubeconfig`,
//! a real kubelet's node of a cluster (`cluster.rs`); the steps read both the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inlet_proto::csi::v1::{controller_client::ControllerClient, node_client::NodeClient};
use inlet_proto::csi_call::CsiCall;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use serde_json::json;

use super::ConformError;
use super::driver::DriverRun;
use super::proxy::{FaultProxy, INJECTED_DEADLINE};
use crate::api::ApiPod;
use crate::api::manifest::{Manifest, Object};
use crate::report::EventReport;
use crate::sim::Simulation;

mod cluster;
mod leftovers;
mod settings;
mod sim;

use cluster::ClusterNode;
pub use cluster::ClusterTarget;
pub use settings::{Conformance, InlineVolume, inline_volumes};

/// The simulated node every check runs on (on a real cluster, `--node`).
pub const NODE: &str = "node-1";
/// The namespace of every check's pods.
pub const NAMESPACE: &str = "conform";
/// Where the secrets check puts a Secret of the same name that no pod of [`NAMESPACE`] may get.
pub const OTHER_NAMESPACE: &str = "conform-other";
/// Why a step that needs the simulated kubelet cannot run on a real node.
const ON_A_CLUSTER: &str = "needs the simulated kubelet, not a real node";
/// A failed attempt counted this many times in one event fails a step at once: the kubelet keeps
/// retrying, and the driver's answer will not change.
const FAILED_ATTEMPTS: i32 = 3;
/// As many failed NodeUnpublishVolume calls in a row fail a deletion at once (they are retried with a
/// longer back-off, and make no event).
const TEARDOWN_FAILURES: usize = 2;

/// Where a check's node is.
enum Backend {
    /// Simulated in-process.
    Sim(Box<Simulation>),
    /// A real kubelet's.
    Cluster(Box<ClusterNode>),
}

/// A running check: its node, proxy and driver.
pub struct CheckEnv {
    /// The run's settings.
    pub conf: Arc<Conformance>,
    backend: Backend,
    /// The proxy the kubelet reaches the driver through.
    pub proxy: FaultProxy,
    proxy_stop: tokio::sync::oneshot::Sender<()>,
    proxy_task: tokio::task::JoinHandle<()>,
    driver: DriverRun,
    driver_socket: PathBuf,
    root: PathBuf,
    /// Pod name -> UID, kept after the pod is gone.
    uids: BTreeMap<String, String>,
}

impl CheckEnv {
    /// Starts a node (under `<root>/<name>/` when simulated), the driver, and the proxy; registers the
    /// driver through the proxy.
    pub async fn start(conf: Arc<Conformance>, name: &str) -> Result<Self, ConformError> {
        let root = conf.root.join(name.replace('/', "-"));
        // A previous run's state under the same root would make this run see its volumes.
        if root.exists() {
            return Err(ConformError::Usage(format!(
                "{} exists: give conform an empty --root (or none)",
                root.display()
            )));
        }
        std::fs::create_dir_all(&root).map_err(ConformError::io(root.display()))?;
        let mut sim = match &conf.cluster {
            Some(_) => None,
            None => Some(sim::start(&conf, &root).await?),
        };
        let node_root = match &conf.cluster {
            Some(target) => target.kubelet_dir.clone(),
            None => root.join(NODE),
        };
        // An external driver has its own runtime, if any: only the simulation's is given.
        let cri = sim.as_ref().map(|s| s.cri_socket(NODE).to_path_buf());
        let (driver_socket, driver) = conf
            .setup
            .start(NODE, &node_root, cri.as_deref().unwrap_or(Path::new("")))
            .await?;
        // The kubelet's deadline: the simulated one's, or a real one's csiTimeout (2 minutes), whichever
        // is shorter, so the proxy never holds a call its kubelet gave up.
        let deadline = sim::csi_timeout(&conf).min(inlet_volume::csi::CSI_TIMEOUT);
        let proxy = FaultProxy::new(conf.setup.name(), &driver_socket, deadline);
        let proxy_socket = root.join("proxy.sock");
        let incoming = inlet_proto::uds::listen(&proxy_socket)
            .await
            .map_err(|source| ConformError::Endpoint {
                what: "the proxy".into(),
                source,
            })?;
        let (proxy_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (service, socket) = (proxy.clone(), proxy_socket.clone());
        let proxy_task = tokio::spawn(async move {
            let shutdown = async { drop(stopped.await) };
            if let Err(e) =
                inlet_plugin::server::serve_csi_on(incoming, &socket, service, true, None, shutdown)
                    .await
            {
                tracing::error!("the conform proxy stopped: {e}");
            }
        });
        let backend = match (sim.take(), &conf.cluster) {
            (Some(mut sim), _) => {
                sim::register(&mut sim, &conf, &proxy_socket).await?;
                Backend::Sim(Box::new(sim))
            }
            (None, target) => {
                let target = target
                    .as_ref()
                    .ok_or_else(|| ConformError::Usage(ON_A_CLUSTER.into()))?;
                let csi_driver = &conf.info.csi_driver;
                let node = ClusterNode::start(target, csi_driver, &proxy_socket, conf.wait).await;
                Backend::Cluster(Box::new(node?))
            }
        };
        Ok(Self {
            conf,
            backend,
            proxy,
            proxy_stop,
            proxy_task,
            driver,
            driver_socket,
            root,
            uids: BTreeMap::new(),
        })
    }

    /// The simulated node's simulation; an error on a real node (checks that need it apply only to the
    /// simulated node).
    pub fn sim(&self) -> Result<&Simulation, String> {
        match &self.backend {
            Backend::Sim(sim) => Ok(sim),
            Backend::Cluster(_) => Err(ON_A_CLUSTER.into()),
        }
    }

    /// The simulation, to change it.
    pub fn sim_mut(&mut self) -> Result<&mut Simulation, String> {
        match &mut self.backend {
            Backend::Sim(sim) => Ok(sim),
            Backend::Cluster(_) => Err(ON_A_CLUSTER.into()),
        }
    }

    /// The node's kubelet root.
    pub fn node_root(&self) -> PathBuf {
        match &self.conf.cluster {
            Some(target) => target.kubelet_dir.clone(),
            None => self.root.join(NODE),
        }
    }

    /// A pod `name` in the conform namespace whose one container mounts each volume at `/mnt/<volume>`;
    /// `spec` is merged into the pod's spec (a securityContext, a nodeName). Volume `i` is the run's
    /// inline definition `i` ([`Conformance::inline`]).
    pub fn pod(&self, name: &str, volumes: &[InlineVolume], spec: serde_json::Value) -> Pod {
        let driver = self.conf.setup.name();
        let pod_volumes: Vec<_> = volumes
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut attributes = self.conf.inline(i).attributes.clone();
                attributes.extend(v.extra_attributes.clone());
                let mut source = json!({"driver": driver, "readOnly": v.read_only});
                if !attributes.is_empty() {
                    source["volumeAttributes"] = json!(attributes);
                }
                if let Some(secret) = &v.secret {
                    source["nodePublishSecretRef"] = json!({"name": secret});
                }
                if let Some(fs_type) = &v.fs_type {
                    source["fsType"] = json!(fs_type);
                }
                json!({"name": v.name, "csi": source})
            })
            .collect();
        let mounts: Vec<_> = volumes
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let read_only = v.mount_read_only || self.conf.inline(i).read_only;
                // volume_dir's path in the container.
                json!({"name": v.name, "mountPath": format!("/mnt/{}", v.name), "readOnly": read_only})
            })
            .collect();
        let mut pod = json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "containers": [{
                    "name": "tester",
                    "image": "conform.inlet.dev/pause:1",
                    "command": ["sleep", "3600"],
                    "volumeMounts": mounts,
                }],
                "volumes": pod_volumes,
            },
        });
        if let (Some(into), serde_json::Value::Object(extra)) = (pod["spec"].as_object_mut(), spec)
        {
            into.extend(extra);
        }
        serde_json::from_value(pod).unwrap_or_default()
    }

    /// A Secret `name` in the conform namespace (or `namespace`) with one key.
    pub fn secret(namespace: &str, name: &str, key: &str, value: &str) -> Secret {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {key: value},
        }))
        .unwrap_or_default()
    }

    /// Changes the driver's CSIDriver object in the API, as an administrator would on a live cluster
    /// (the kubelet reads it at each SetUp).
    pub async fn edit_csi_driver(
        &self,
        edit: impl FnOnce(&mut CSIDriverSpec),
    ) -> Result<(), String> {
        let name = self.conf.setup.name();
        match &self.backend {
            Backend::Sim(sim) => {
                sim.api.update::<CSIDriver>("", name, |d| edit(&mut d.spec));
                Ok(())
            }
            Backend::Cluster(node) => node.edit_csi_driver(edit, self.conf.wait).await,
        }
    }

    /// Deletes the driver's CSIDriver object.
    pub async fn delete_csi_driver(&self) -> Result<(), String> {
        match &self.backend {
            Backend::Sim(sim) => {
                sim.api.remove::<CSIDriver>("", self.conf.setup.name());
                Ok(())
            }
            Backend::Cluster(node) => node.delete_csi_driver(self.conf.wait).await,
        }
    }

    /// Waits until `done` holds or the step's wait is over; says which.
    pub async fn until(&self, done: impl Fn(&Self) -> bool) -> bool {
        match &self.backend {
            // The simulation's own wait backs off, so polling does not starve it.
            Backend::Sim(sim) => sim.wait_for(self.conf.wait, |_| done(self)).await,
            Backend::Cluster(_) => cluster::poll(self.conf.wait, || done(self)).await,
        }
    }

    /// Creates objects (pods after the rest, as `kubelet-sim run` does); a refused one fails the step.
    pub async fn create(&mut self, objects: Vec<Object>) -> Result<(), String> {
        let sim = match &mut self.backend {
            Backend::Sim(sim) => sim,
            Backend::Cluster(node) => {
                return node.create(objects, &mut self.uids, self.conf.wait).await;
            }
        };
        let refused_before = sim.report().rejected.len();
        let manifests = objects
            .into_iter()
            .map(|object| Manifest {
                origin: "conform".into(),
                object,
            })
            .collect();
        sim.apply(manifests).await;
        if let Some(refused) = sim.report().rejected.get(refused_before) {
            return Err(format!("refused: {}", refused.message));
        }
        for pod in sim.api.list::<ApiPod>() {
            self.uids.insert(
                pod.metadata.name.clone().unwrap_or_default(),
                pod.metadata.uid.clone().unwrap_or_default(),
            );
        }
        Ok(())
    }

    /// Creates pods and waits until all of them are Running.
    pub async fn run_pods(&mut self, pods: Vec<Pod>) -> Result<(), String> {
        let names: Vec<String> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        self.create(pods.into_iter().map(|p| Object::Pod(Box::new(p))).collect())
            .await?;
        for name in names {
            self.running(&name).await?;
        }
        Ok(())
    }

    /// Pod `name`'s phase, if it has one.
    pub fn phase(&self, name: &str) -> Option<String> {
        self.pod_object(name)?.status?.phase
    }

    /// Pod `name` as the API has it now (None once deleted).
    fn pod_object(&self, name: &str) -> Option<Pod> {
        match &self.backend {
            Backend::Sim(sim) => sim.api.peek::<ApiPod>(NAMESPACE, name).map(|p| p.to_pod()),
            Backend::Cluster(node) => node.pod(name),
        }
    }

    /// Waits until pod `name` is Running. Fails on a warning the kubelet repeated (the driver keeps
    /// answering the same), or when the wait is over, with the pod's warnings.
    pub async fn running(&self, name: &str) -> Result<(), String> {
        let done = |env: &Self| {
            env.phase(name).as_deref() == Some("Running")
                || env
                    .warnings(name)
                    .iter()
                    .any(|e| e.count >= FAILED_ATTEMPTS)
        };
        self.until(done).await;
        let phase = self.phase(name);
        if phase.as_deref() == Some("Running") {
            return Ok(());
        }
        Err(format!(
            "pod {name} is not Running (phase {}){}",
            phase.unwrap_or_else(|| "unknown".into()),
            self.warnings_text(name)
        ))
    }

    /// The Warning events of pod `name`.
    pub fn warnings(&self, name: &str) -> Vec<EventReport> {
        let uid = self.uid(name);
        let events = match &self.backend {
            Backend::Sim(sim) => sim.api.events_for(&uid),
            Backend::Cluster(node) => node.events_for(&uid),
        };
        events
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(EventReport::from)
            .collect()
    }

    fn warnings_text(&self, name: &str) -> String {
        self.warnings(name)
            .iter()
            .map(|e| format!("; {} (x{}): {}", e.reason, e.count, e.message))
            .collect()
    }

    /// Deletes pods and waits until they are gone, which the kubelet allows only once their volumes are
    /// torn down.
    pub async fn delete(&self, names: &[&str]) -> Result<(), String> {
        for name in names {
            self.delete_pod(name).await?;
        }
        let gone = |env: &Self| names.iter().all(|n| env.pod_object(n).is_none());
        let stuck = |env: &Self| names.iter().any(|n| env.teardown_keeps_failing(n));
        self.until(|env| gone(env) || stuck(env)).await;
        if gone(self) {
            return Ok(());
        }
        let left: Vec<String> = names
            .iter()
            .filter(|n| self.pod_object(n).is_some())
            .map(|n| format!("{n}{}{}", self.warnings_text(n), self.last_failure(n)))
            .collect();
        let why = if names.iter().any(|n| self.teardown_keeps_failing(n)) {
            "not torn down: the driver keeps failing NodeUnpublishVolume".to_string()
        } else {
            format!("not torn down within {:?}", self.conf.wait)
        };
        Err(format!("{why}: {}", left.join(", ")))
    }

    /// Asks for pod `name`'s deletion.
    pub async fn delete_pod(&self, name: &str) -> Result<(), String> {
        match &self.backend {
            Backend::Sim(sim) => {
                sim.delete_pod(NAMESPACE, name);
                Ok(())
            }
            Backend::Cluster(node) => node.delete_pod(name, &self.uid(name)).await,
        }
    }

    /// Whether the driver answered the last few NodeUnpublishVolume calls for pod `name` with an error
    /// (not one the proxy injected): the kubelet retries for ever, and the answer will not change.
    fn teardown_keeps_failing(&self, name: &str) -> bool {
        let dir = format!("/pods/{}/", self.uid(name));
        let calls = self.calls();
        let unpublishes: Vec<&CsiCall> = calls
            .iter()
            .filter(|c| c.method == "NodeUnpublishVolume" && c.target_path.contains(&dir))
            .collect();
        let last = &unpublishes[unpublishes.len().saturating_sub(TEARDOWN_FAILURES)..];
        last.len() == TEARDOWN_FAILURES
            && last
                .iter()
                .all(|c| c.code != "OK" && c.message != INJECTED_DEADLINE)
    }

    /// The last CSI call for pod `name`'s volumes that failed, as `; Method Code: message` (a teardown's
    /// failures are not pod events, as upstream's are not).
    pub fn last_failure(&self, name: &str) -> String {
        let dir = format!("/pods/{}/", self.uid(name));
        self.calls()
            .into_iter()
            .rev()
            .find(|c| c.code != "OK" && c.target_path.contains(&dir))
            .map(|c| format!("; {} {}: {}", c.method, c.code, c.message))
            .unwrap_or_default()
    }

    /// Whether the runtime mounts `container_path` read-only in pod `name`'s container: the CRI mount in
    /// the simulation, the container's mountinfo on a real node; None where that cannot be seen.
    pub async fn container_mount_read_only(
        &self,
        name: &str,
        container_path: &str,
    ) -> Option<bool> {
        let sim = match &self.backend {
            Backend::Sim(sim) => sim,
            Backend::Cluster(_) => {
                let (uid, path) = (self.uid(name), container_path.to_string());
                let scan = move || cluster::container_mount_read_only(&uid, &path);
                return tokio::task::spawn_blocking(scan).await.ok().flatten();
            }
        };
        let runtime = sim.node(NODE).and_then(|n| n.pod_runtime(&self.uid(name)));
        Some(runtime.is_some_and(|r| {
            r.containers
                .iter()
                .flat_map(|c| &c.mounts)
                .any(|m| m.container_path == container_path && m.readonly)
        }))
    }

    /// Where a check does I/O in volume `volume` of pod `pod`: on a real node the container's view of it
    /// (`/mnt/<volume>` through its process's root, as e2e writes from inside the pod), else the target path
    /// the kubelet published it at.
    pub async fn volume_dir(&self, pod: &str, volume: &str) -> PathBuf {
        let in_container = match &self.backend {
            Backend::Sim(_) => None,
            Backend::Cluster(_) => {
                let (uid, path) = (self.uid(pod), format!("/mnt/{volume}"));
                let scan = move || cluster::container_view(&uid, &path);
                tokio::task::spawn_blocking(scan).await.ok().flatten()
            }
        };
        match in_container {
            Some(dir) => {
                tracing::debug!(pod, volume, "I/O in the container at {}", dir.display());
                dir
            }
            None => self.target(pod, volume),
        }
    }

    /// The pod's UID.
    pub fn uid(&self, pod: &str) -> String {
        self.uids.get(pod).cloned().unwrap_or_default()
    }

    /// The target path the kubelet publishes volume `volume` of pod `pod` at.
    pub fn target(&self, pod: &str, volume: &str) -> PathBuf {
        self.node_root().join(format!(
            "pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
            self.uid(pod)
        ))
    }

    /// Every CSI call the kubelet made so far: as the simulated kubelet saw them, or as the proxy
    /// passed them on to a real kubelet.
    pub fn calls(&self) -> Vec<CsiCall> {
        match &self.backend {
            Backend::Sim(sim) => sim.calls.calls(),
            Backend::Cluster(_) => self.proxy.calls(),
        }
    }

    /// The calls still without an answer (a driver that hangs), where the kubelet's side is seen.
    pub fn calls_in_flight(&self) -> Vec<CsiCall> {
        match &self.backend {
            Backend::Sim(sim) => sim.calls.in_flight(),
            Backend::Cluster(_) => Vec::new(),
        }
    }

    /// The calls of `method` at the target of one pod volume.
    pub fn calls_at(&self, method: &str, pod: &str, volume: &str) -> Vec<CsiCall> {
        let target = self.target(pod, volume).display().to_string();
        self.calls()
            .into_iter()
            .filter(|c| c.method == method && c.target_path == target)
            .collect()
    }

    /// The successful NodePublishVolume of one pod volume.
    pub fn published(&self, pod: &str, volume: &str) -> Result<CsiCall, String> {
        self.calls_at("NodePublishVolume", pod, volume)
            .into_iter()
            .find(|c| c.code == "OK")
            .ok_or_else(|| format!("no successful NodePublishVolume for {pod}/{volume}"))
    }

    /// A Controller client straight to the driver (for what an administrator or provisioner does, such as
    /// creating the volume a PV names).
    pub async fn controller(&self) -> Result<ControllerClient<tonic::transport::Channel>, String> {
        Ok(ControllerClient::new(self.channel().await?))
    }

    /// A Node client straight to the driver, for the call-level checks.
    pub async fn node(&self) -> Result<NodeClient<tonic::transport::Channel>, String> {
        Ok(NodeClient::new(self.channel().await?))
    }

    async fn channel(&self) -> Result<tonic::transport::Channel, String> {
        inlet_proto::uds::connect(&self.driver_socket)
            .await
            .map_err(|e| format!("the driver's socket: {e}"))
    }

    /// Stops the node's kubelet and starts a new one on the same root (reconstruction).
    pub async fn restart_kubelet(&mut self) -> Result<(), String> {
        if let Some(target) = &self.conf.cluster {
            let command = target
                .kubelet_restart_command
                .as_deref()
                .ok_or("no --kubelet-restart-command to restart the node's kubelet with")?;
            let run =
                super::driver::run_restart("kubelet-restart-command", command, self.conf.wait);
            return run.await.map_err(|e| e.to_string());
        }
        self.stop_kubelet().await?;
        self.start_kubelet().await
    }

    /// Stops the node's kubelet; its mounts, the driver and the pods' sandboxes stay.
    pub async fn stop_kubelet(&mut self) -> Result<(), String> {
        self.sim_mut()?.stop_node(NODE).await;
        Ok(())
    }

    /// Starts a new kubelet on the node's root, which reconstructs what the last one left.
    pub async fn start_kubelet(&mut self) -> Result<(), String> {
        let sim = self.sim_mut()?;
        sim.start_node(NODE).await.map_err(|e| e.to_string())
    }

    /// Stops the driver and starts it again on the same state, its socket served again.
    pub async fn restart_driver(&mut self) -> Result<(), String> {
        let cri = match &self.backend {
            Backend::Sim(sim) => sim.cri_socket(NODE).to_path_buf(),
            Backend::Cluster(_) => PathBuf::new(),
        };
        let node_root = self.node_root();
        self.conf
            .setup
            .restart(&mut self.driver, NODE, &node_root, &cri)
            .await
            .map_err(|e| e.to_string())
    }

    /// Stops everything; the check's root is removed when nothing is mounted below it.
    pub async fn finish(self) {
        match self.backend {
            Backend::Sim(sim) => sim.shutdown().await,
            Backend::Cluster(node) => node.finish(&self.uids).await,
        }
        let _ = self.proxy_stop.send(());
        // The proxy stops gracefully, after its calls in flight: bounded, as a hung driver's call is.
        let mut proxy_task = self.proxy_task;
        if tokio::time::timeout(super::CLEANUP_WAIT, &mut proxy_task)
            .await
            .is_err()
        {
            proxy_task.abort();
        }
        self.conf.setup.stop(self.driver).await;
        // Removing a dir with something mounted below would reach into the volumes: it is left to look at.
        if !self.conf.mounter.0.anything_mounted_under(&self.root) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
