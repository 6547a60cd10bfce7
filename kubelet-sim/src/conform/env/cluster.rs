//! A check's node that is a real kubelet (`conform --kubeconfig`): the same checks, with the pods created
//! on the cluster's API server and bound to the kubelet's node, the driver registered with that kubelet
//! through the proxy (a registration socket in its `plugins_registry`, as node-driver-registrar serves),
//! and what the checks read (pods, their events, the CSIDriver) watched into local stores, so a check's
//! steps read them as they read the simulation's API.
//!
//! conform runs on the node, as Kubernetes' node e2e tests do: it looks at the kubelet's directory for
//! what a pod left behind (its pod dir, mounts below it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

use super::NAMESPACE;
use crate::api::manifest::Object;
use crate::conform::ConformError;

/// A real node to run the checks on.
#[derive(Clone)]
pub struct ClusterTarget {
    /// The API server's client (`--kubeconfig`).
    pub client: kube::Client,
    /// The node the pods are bound to (`--node`).
    pub node: String,
    /// Its kubelet's version as the node reports it (`v1.20.2`): what the kubelet does by default.
    pub kubelet_version: String,
    /// The kubelet's root directory on this host (`--kubelet-dir`).
    pub kubelet_dir: PathBuf,
    /// The image of the checks' pods (`--pod-image`): it must have `sh` and `sleep`.
    pub pod_image: String,
    /// How to restart the node's kubelet (`--kubelet-restart-command`), for restart/kubelet.
    pub kubelet_restart_command: Option<String>,
}

impl ClusterTarget {
    /// The kubelet's minor version (20 for `v1.20.2`), when the node reports one.
    pub fn kubelet_minor(&self) -> Option<u32> {
        let version = self.kubelet_version.strip_prefix('v')?;
        version.split('.').nth(1)?.parse().ok()
    }

    /// The cluster's CSIDriver `name` before the checks replace it (None: there is none), for
    /// [`ClusterTarget::restore_csi_driver`].
    pub async fn save_csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        kube::Api::<CSIDriver>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(failed("reading the CSIDriver"))
    }

    /// Puts the CSIDriver back as it was before the run: its spec, labels, annotations and owners (a
    /// Helm release's, say), or no CSIDriver at all. Failures are said, not fatal: the run is over.
    pub async fn restore_csi_driver(&self, name: &str, saved: Option<CSIDriver>) {
        if let Err(e) = self.put_back(name, saved).await {
            eprintln!("kubelet-sim conform: the CSIDriver {name} could not be put back: {e}");
        }
    }

    async fn put_back(&self, name: &str, saved: Option<CSIDriver>) -> Result<(), String> {
        let api = kube::Api::<CSIDriver>::all(self.client.clone());
        let deleted = api.delete(name, &DeleteParams::default()).await;
        unless(deleted, 404).map_err(|e| e.to_string())?;
        let Some(mut saved) = saved else {
            return Ok(());
        };
        let meta = &mut saved.metadata;
        (meta.uid, meta.resource_version, meta.creation_timestamp) = (None, None, None);
        (meta.managed_fields, meta.generation) = (None, None);
        // Deletion is not instant: a create can meet the old object for a moment.
        for _ in 0..50 {
            match api.create(&PostParams::default(), &saved).await {
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                created => return created.map(drop).map_err(|e| e.to_string()),
            }
        }
        Err("the old one is still there".into())
    }
}

/// One check's view of the real node.
pub(super) struct ClusterNode {
    client: kube::Client,
    node: String,
    pod_image: String,
    driver: String,
    pods: Store<Pod>,
    events: Store<Event>,
    drivers: Store<CSIDriver>,
    watches: Vec<tokio::task::JoinHandle<()>>,
    registration: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    /// The Secrets this check created (namespace, name, UID), deleted when it finishes.
    secrets: Vec<(String, String, String)>,
}

fn failed(what: &str) -> impl Fn(kube::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl ClusterNode {
    /// Prepares the namespace, gives the cluster the driver's CSIDriver, watches what the checks read,
    /// and registers the driver (at `proxy_socket`) with the node's kubelet.
    pub(super) async fn start(
        target: &ClusterTarget,
        csi_driver: &CSIDriver,
        proxy_socket: &Path,
        wait: Duration,
    ) -> Result<Self, ConformError> {
        let client = target.client.clone();
        let driver = csi_driver.metadata.name.clone().unwrap_or_default();
        let cluster = |e: String| ConformError::Cluster(e);
        ensure_namespace(&client, wait).await.map_err(cluster)?;
        let (pods, pods_task) =
            watch::<Pod>(kube::Api::namespaced(client.clone(), NAMESPACE), None);
        let in_namespace = kube::Api::namespaced(client.clone(), NAMESPACE);
        let (events, events_task) = watch::<Event>(in_namespace, None);
        let by_name = format!("metadata.name={driver}");
        let all = kube::Api::all(client.clone());
        let (drivers, drivers_task) = watch::<CSIDriver>(all, Some(&by_name));
        let mut node = Self {
            client,
            node: target.node.clone(),
            pod_image: target.pod_image.clone(),
            driver,
            pods,
            events,
            drivers,
            watches: vec![pods_task, events_task, drivers_task],
            registration: None,
            secrets: Vec::new(),
        };
        let ready = futures::future::join3(
            node.pods.wait_until_ready(),
            node.events.wait_until_ready(),
            node.drivers.wait_until_ready(),
        );
        {
            if tokio::time::timeout(wait, ready).await.is_err() {
                return Err(cluster(format!(
                    "the API server did not list pods, events and CSIDrivers within {wait:?}"
                )));
            }
        }
        node.replace_csi_driver(csi_driver.clone(), wait)
            .await
            .map_err(cluster)?;
        node.register(&target.kubelet_dir, proxy_socket, wait)
            .await?;
        Ok(node)
    }

    /// Serves the driver's registration socket in the kubelet's `plugins_registry` (pointing it at the
    /// proxy) and waits until the kubelet says it registered the driver.
    async fn register(
        &mut self,
        kubelet_dir: &Path,
        proxy_socket: &Path,
        wait: Duration,
    ) -> Result<(), ConformError> {
        let registrar = inlet_plugin::registration::Registrar::new(&self.driver, proxy_socket);
        let dir = kubelet_dir.join("plugins_registry");
        let socket = registrar.socket(&dir);
        // A registrar of the driver's own would have the kubelet call the driver past the proxy.
        if tokio::net::UnixStream::connect(&socket).await.is_ok() {
            return Err(ConformError::Usage(format!(
                "{} is served already: the driver is registered with this kubelet by its own registrar; \
                 conform registers it through its proxy, so start the driver without one",
                socket.display()
            )));
        }
        let mut outcome = registrar.outcome();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (failed, serve_error) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            if let Err(e) = registrar.serve(&dir, async { drop(stopped.await) }).await {
                tracing::error!("conform's registration socket: {e}");
                let _ = failed.send(e.to_string());
            }
        });
        self.registration = Some((stop, task));
        // A socket that cannot be served fails at once, not after the wait.
        let said = tokio::select! {
            said = tokio::time::timeout(wait, outcome.wait_for(Option::is_some)) => said,
            Ok(e) = serve_error => {
                return Err(ConformError::Cluster(format!(
                    "cannot serve the registration socket {}: {e}",
                    socket.display()
                )));
            }
        };
        match said.ok().and_then(|o| o.ok().and_then(|o| o.clone())) {
            Some(Ok(())) => Ok(()),
            Some(Err(reason)) => Err(ConformError::Cluster(format!(
                "the kubelet refused to register {}: {reason}",
                self.driver
            ))),
            None => Err(ConformError::Cluster(format!(
                "the kubelet did not register {} within {wait:?} (is {} its root directory?)",
                self.driver,
                kubelet_dir.display()
            ))),
        }
    }

    /// Creates the objects in the conform namespace: pods bound to the node, with the run's image. Each
    /// pod's UID goes into `uids` as it is made (what a check deletes, and only that), and the step waits
    /// until the watch has seen them all, so that none is taken for gone before it was seen.
    pub(super) async fn create(
        &mut self,
        objects: Vec<Object>,
        uids: &mut BTreeMap<String, String>,
        wait: Duration,
    ) -> Result<(), String> {
        let mut created = Vec::new();
        for object in objects {
            match object {
                Object::Secret(secret) => {
                    let name = secret.metadata.name.clone().unwrap_or_default();
                    let namespace = secret.metadata.namespace.clone();
                    let namespace = namespace.unwrap_or_else(|| NAMESPACE.into());
                    if namespace != NAMESPACE {
                        create_namespace(&self.client, &namespace).await?;
                    }
                    let made = kube::Api::<Secret>::namespaced(self.client.clone(), &namespace)
                        .create(&PostParams::default(), &secret)
                        .await
                        .map_err(refused)?;
                    let uid = made.metadata.uid.unwrap_or_default();
                    self.secrets.push((namespace, name, uid));
                }
                Object::Pod(pod) => {
                    let pod = self.on_node(*pod);
                    let made = kube::Api::<Pod>::namespaced(self.client.clone(), NAMESPACE)
                        .create(&PostParams::default(), &pod)
                        .await
                        .map_err(refused)?;
                    let uid = made.metadata.uid.unwrap_or_default();
                    uids.insert(made.metadata.name.unwrap_or_default(), uid.clone());
                    created.push(uid);
                }
                _ => {
                    return Err(
                        "conform makes only Pods and Secrets on a real cluster; this check needs \
                         the simulated control plane"
                            .into(),
                    );
                }
            }
        }
        let seen = |uid: &String| {
            let pods = self.pods.state();
            pods.iter().any(|p| p.metadata.uid.as_ref() == Some(uid))
        };
        match poll(wait, || created.iter().all(seen)).await {
            true => Ok(()),
            false => Err(format!("the pods made were not seen within {wait:?}")),
        }
    }

    /// A check's pod as the node runs it: bound to it (no scheduler needed), the run's image, a short
    /// grace period, and nothing the check does not look at that
    /// could warn (no service account token volume; the node's DNS, which needs no cluster DNS).
    fn on_node(&self, mut pod: Pod) -> Pod {
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(self.node.clone());
            spec.termination_grace_period_seconds = Some(1);
            spec.automount_service_account_token = Some(false);
            spec.dns_policy = Some("Default".into());
            for container in &mut spec.containers {
                // `sleep` as PID 1 ignores SIGTERM: a shell that exits on it ends the pod at once.
                container.command = Some(
                    ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
                        .map(String::from)
                        .to_vec(),
                );
                container.image = Some(self.pod_image.clone());
                container.image_pull_policy = Some("IfNotPresent".into());
            }
        }
        pod
    }

    /// Pod `name` as last watched.
    pub(super) fn pod(&self, name: &str) -> Option<Pod> {
        let key = ObjectRef::new(name).within(NAMESPACE);
        self.pods.get(&key).map(|p| (*p).clone())
    }

    /// The names of the pods of the namespace whose UID is one of `uids`' (name → UID): one check's pods,
    /// not those another left.
    pub(super) fn pods_of(&self, uids: &BTreeMap<String, String>) -> Vec<String> {
        let ours = |pod: &&std::sync::Arc<Pod>| {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            uids.values().any(|u| u == uid)
        };
        self.pods
            .state()
            .iter()
            .filter(ours)
            .filter_map(|p| p.metadata.name.clone())
            .collect()
    }

    /// The events about the pod with `uid`.
    pub(super) fn events_for(&self, uid: &str) -> Vec<Event> {
        self.events
            .state()
            .iter()
            .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
            .map(|e| (**e).clone())
            .collect()
    }

    /// Asks the API server to delete pod `name` (the kubelet deletes its object once torn down).
    pub(super) async fn delete_pod(&self, name: &str, uid: &str) -> Result<(), String> {
        let pods = kube::Api::<Pod>::namespaced(self.client.clone(), NAMESPACE);
        let deleted = pods.delete(name, &only(uid)).await;
        // 409: a pod of that name that is not this check's (the UID precondition failed).
        unless(unless(deleted, 404), 409).map_err(|e| format!("deleting pod {name}: {e}"))
    }

    /// Changes the driver's CSIDriver. Its spec is immutable in a 1.20 API server (podInfoOnMount became
    /// mutable, with fsGroupPolicy, in 1.28: kubernetes#116209), so it is deleted and made again; the
    /// kubelet's informer sees both.
    pub(super) async fn edit_csi_driver(
        &self,
        edit: impl FnOnce(&mut CSIDriverSpec),
        wait: Duration,
    ) -> Result<(), String> {
        let key = ObjectRef::new(&self.driver);
        let mut changed = self
            .drivers
            .get(&key)
            .map(|d| (*d).clone())
            .ok_or("the driver's CSIDriver is gone")?;
        edit(&mut changed.spec);
        self.replace_csi_driver(changed, wait).await
    }

    /// Deletes the driver's CSIDriver and waits until the watch no longer has it.
    pub(super) async fn delete_csi_driver(&self, wait: Duration) -> Result<(), String> {
        let drivers = kube::Api::<CSIDriver>::all(self.client.clone());
        let deleted = drivers.delete(&self.driver, &DeleteParams::default()).await;
        unless(deleted, 404).map_err(failed("deleting the CSIDriver"))?;
        let key = ObjectRef::new(&self.driver);
        poll(wait, || self.drivers.get(&key).is_none())
            .await
            .then_some(())
            .ok_or_else(|| format!("the CSIDriver {} was not deleted", self.driver))
    }

    /// Replaces the driver's CSIDriver with `wanted` and waits until the watch has the new one.
    async fn replace_csi_driver(
        &self,
        mut wanted: CSIDriver,
        wait: Duration,
    ) -> Result<(), String> {
        self.delete_csi_driver(wait).await?;
        wanted.metadata = kube::api::ObjectMeta {
            name: Some(self.driver.clone()),
            ..Default::default()
        };
        let made = kube::Api::<CSIDriver>::all(self.client.clone())
            .create(&PostParams::default(), &wanted)
            .await
            .map_err(failed("creating the CSIDriver"))?;
        let key = ObjectRef::new(&self.driver);
        let seen = || {
            self.drivers.get(&key).map(|d| d.metadata.uid.clone())
                == Some(made.metadata.uid.clone())
        };
        if !poll(wait, seen).await {
            return Err(format!("the new CSIDriver {} was not seen", self.driver));
        }
        // The kubelet's CSIDriver informer hears of it from the same watch cache as conform's watch, but
        // cannot be asked: a second of slack before a pod of the check is mounted with it.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }

    /// Removes the check's pods the kubelet did not let go from the API (grace 0), stops registering the
    /// driver (the kubelet deregisters it) and the watches, and deletes the Secrets the check made.
    pub(super) async fn finish(mut self, uids: &BTreeMap<String, String>) {
        // A failed check's pods can stay Terminating for ever (a driver whose unpublish keeps failing):
        // removed from the API at once, so the next check can use their names; the kubelet still tears
        // their volumes down as orphans.
        let pods = kube::Api::<Pod>::namespaced(self.client.clone(), NAMESPACE);
        for name in self.pods_of(uids) {
            tracing::warn!("pod {name} was not torn down: deleting it from the API (grace 0)");
            let uid = uids.get(&name).map(String::as_str).unwrap_or_default();
            if let Err(e) = pods.delete(&name, &only(uid).grace_period(0)).await {
                tracing::warn!("deleting pod {name}: {e}");
            }
        }
        if let Some((stop, task)) = self.registration.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(crate::conform::CLEANUP_WAIT, task).await;
        }
        for (namespace, name, uid) in &self.secrets {
            let secrets = kube::Api::<Secret>::namespaced(self.client.clone(), namespace);
            if let Err(e) = secrets.delete(name, &only(uid)).await {
                tracing::warn!("deleting secret {namespace}/{name}: {e}");
            }
        }
    }
}

impl Drop for ClusterNode {
    /// A check that could not start still stops what it started.
    fn drop(&mut self) {
        if let Some((stop, _)) = self.registration.take() {
            let _ = stop.send(());
        }
        for task in &self.watches {
            task.abort();
        }
    }
}

/// A deletion of the object with `uid` only (never another of the same name).
fn only(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// Done, or the API server's answer `code` (404: already gone, 409: already there).
fn unless<T>(result: Result<T, kube::Error>, code: u16) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == code => Ok(()),
        other => other.map(drop),
    }
}

/// A refused create, as a check reports it (the API server's message names the field).
fn refused(e: kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("refused: {}", status.message),
        e => format!("refused: {e}"),
    }
}

/// A store of what `api` has (with `fields`), kept by a watch until the task is aborted.
fn watch<K>(api: kube::Api<K>, fields: Option<&str>) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    let mut config = watcher::Config::default();
    if let Some(fields) = fields {
        config = config.fields(fields);
    }
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    (store, task)
}

/// Makes namespace `name` unless it exists.
async fn create_namespace(client: &kube::Client, name: &str) -> Result<(), String> {
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = kube::Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    unless(created, 409).map_err(|e| format!("creating namespace {name}: {e}"))
}

/// Makes the conform namespace when it is missing, and waits for its default ServiceAccount (the
/// ServiceAccount admission plugin refuses pods until the controller made it).
async fn ensure_namespace(client: &kube::Client, wait: Duration) -> Result<(), String> {
    create_namespace(client, NAMESPACE).await?;
    let accounts = kube::Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match accounts.get_opt("default").await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok(None) => return Err(format!("no default ServiceAccount in {NAMESPACE}")),
            Err(e) => return Err(format!("reading ServiceAccount {NAMESPACE}/default: {e}")),
        }
    }
}

/// Waits until `done` holds, looking every 50 ms; whether it did within `wait`.
pub(super) async fn poll(wait: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a deleted pod left in the kubelet's directory: its pod dir (the kubelet removes it in its
/// housekeeping, `cleanupOrphanedPodDirs`, once the pod is gone), mounts below it.
pub(super) fn left_in(
    kubelet_dir: &Path,
    uids: &BTreeMap<String, String>,
    mounter: &dyn inlet_host::mount::MountLayer,
) -> Vec<String> {
    let mut left = Vec::new();
    for uid in uids.values() {
        let dir = kubelet_dir.join("pods").join(uid);
        left.extend(
            mounter
                .mounts_under(&dir)
                .unwrap_or_default()
                .iter()
                .map(|m| format!("mount {}", m.display())),
        );
        if dir.exists() {
            left.push(format!("pod dir {}", dir.display()));
        }
    }
    left
}

/// A process of pod `uid` on this host that has `container_path` mounted (its `/proc/<pid>`), and whether
/// that mount is read-only, from its mountinfo. The pod's processes are found by its cgroup (`pod<uid>`
/// under cgroupfs, with underscores under systemd's driver): what the container sees, whatever the
/// runtime. None when no process of the pod has such a mount (it exited, or conform is not root).
fn pod_mount(uid: &str, container_path: &str) -> Option<(PathBuf, bool)> {
    if uid.is_empty() {
        return None;
    }
    let slices = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    let processes = std::fs::read_dir("/proc").ok()?;
    for process in processes.flatten() {
        let dir = process.path();
        let in_pod = std::fs::read_to_string(dir.join("cgroup"))
            .is_ok_and(|cgroup| slices.iter().any(|s| cgroup.contains(s.as_str())));
        if !in_pod {
            continue;
        }
        let Ok(mountinfo) = std::fs::read_to_string(dir.join("mountinfo")) else {
            continue;
        };
        // proc(5): ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS ...; the last mount of a point is the one seen.
        let read_only = mountinfo
            .lines()
            .rev()
            .map(|line| line.split(' ').collect::<Vec<_>>())
            .find(|fields| fields.len() > 5 && fields[4] == container_path)
            .map(|fields| fields[5].split(',').any(|o| o == "ro"));
        if let Some(read_only) = read_only {
            return Some((dir, read_only));
        }
    }
    None
}

/// Whether a container of pod `uid` has `container_path` mounted read-only ([`pod_mount`]).
pub(super) fn container_mount_read_only(uid: &str, container_path: &str) -> Option<bool> {
    pod_mount(uid, container_path).map(|(_, read_only)| read_only)
}

/// `container_path` as a container of pod `uid` sees it, through its process's root
/// (`/proc/<pid>/root/...`): I/O there goes through the container's own mount, as e2e's exec does.
pub(super) fn container_view(uid: &str, container_path: &str) -> Option<PathBuf> {
    let (process, _) = pod_mount(uid, container_path)?;
    Some(
        process
            .join("root")
            .join(container_path.trim_start_matches('/')),
    )
}
