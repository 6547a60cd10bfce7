//! The BDD scenarios under `features/`: KEP-596's behaviours, run through the same simulation, plugin,
//! local driver and cri-fake as `kubelet-sim run`, over real sockets (real mounts when root).
//!
//! Steps wait on the API's change notifications with a deadline, never on fixed sleeps. A custom harness
//! (`harness = false`): libtest's flags (`--nocapture`) are accepted and ignored; the last line is
//! `bdd: N passed, N failed, N skipped` for any CI log reader.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cucumber::gherkin::Step;
use cucumber::{StatsWriter, World, given, then, when};
use inlet_host::mount::{LinuxMounter, MountCall, MountLayer, RecordingMounter, can_mount};
use inlet_proto::csi_call::CsiCall;
use inlet_volume::csi::handle::{attachment_name, ephemeral_volume_handle};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kubelet_sim::api::manifest;
use kubelet_sim::drivers::DriverArg;
use kubelet_sim::node::{BackoffPolicy, ContainerTiming};
use kubelet_sim::report::{Report, TeardownReport};
use kubelet_sim::sim::{SimConfig, SimImages, Simulation};

#[path = "bdd/claims.rs"]
mod claims;
#[path = "bdd/grants.rs"]
mod grants;
#[path = "bdd/hooks.rs"]
mod hooks;
#[path = "bdd/images.rs"]
mod images;
#[path = "bdd/pod_status.rs"]
mod pod_status;
#[path = "bdd/registration.rs"]
mod registration;
#[path = "bdd/runtime_images.rs"]
mod runtime_images;
#[path = "bdd/selinux.rs"]
mod selinux;
#[path = "bdd/tokens.rs"]
mod tokens;
#[path = "bdd/volume_files.rs"]
mod volume_files;
#[path = "bdd/volume_health.rs"]
mod volume_health;

/// How long a step waits for the simulation to reach a state.
const WAIT: Duration = Duration::from_secs(15);

#[derive(World)]
#[world(init = Self::new)]
struct Sim {
    dir: tempfile::TempDir,
    drivers: Vec<DriverArg>,
    manifests: Vec<String>,
    gates: BTreeSet<String>,
    /// The nodes run SELinux.
    selinux: bool,
    allowed: Option<BTreeSet<String>>,
    nodes: usize,
    sim: Option<Simulation>,
    /// Pod name -> UID, kept after pods are deleted.
    uids: BTreeMap<String, String>,
    teardown: Option<TeardownReport>,
    images: SimImages,
    /// A private registry, with its user and password.
    registry: Option<(cri_fake::registry::LocalRegistry, String, String)>,
    /// Faults cri-fake injects once it runs: (CRI method, fault).
    faults: Vec<(String, cri_fake::faults::Fault)>,
    /// The config the simulation started with, to start it again on the same root.
    config: Option<SimConfig>,
    /// Files a process holds open in a volume (an unmount of it fails with EBUSY meanwhile).
    held: Vec<std::fs::File>,
    /// The plugins registry dir the kubelets watch, when a scenario has one.
    plugins_registry: Option<PathBuf>,
    /// Registration sockets offered by a scenario: what the kubelet told each, and its server.
    offered: BTreeMap<String, registration::Offered>,
    /// The runtime's images before the last image collection, and what it did.
    image_gc: Option<runtime_images::GcRun>,
    /// The recording mount layer, when not root: what the host would have been told.
    recording: Option<Arc<RecordingMounter>>,
    /// How long a pod waits for its volumes before the kubelet gives up on this wait.
    volume_wait: Duration,
    /// The request lines an HTTP server of the scenario's got (`hooks.rs`).
    http_requests: Arc<parking_lot::Mutex<Vec<String>>>,
    /// A service-account token a step noted, to compare with a later one (`tokens.rs`).
    noted_token: Option<String>,
    /// How often the stats provider asks for volume stats (`volume_health.rs`).
    stats_period: Duration,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("root", &self.dir.path())
            .field("drivers", &self.drivers)
            .finish()
    }
}

impl Sim {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            drivers: Vec::new(),
            manifests: Vec::new(),
            gates: kubelet_sim::sim::default_gates(),
            selinux: false,
            allowed: None,
            nodes: 1,
            sim: None,
            uids: BTreeMap::new(),
            teardown: None,
            images: SimImages::default(),
            registry: None,
            faults: Vec::new(),
            config: None,
            held: Vec::new(),
            plugins_registry: None,
            offered: BTreeMap::new(),
            image_gc: None,
            recording: None,
            volume_wait: Duration::from_secs(60),
            http_requests: Default::default(),
            noted_token: None,
            stats_period: Duration::from_secs(60),
        }
    }

    fn sim(&self) -> &Simulation {
        self.sim
            .as_ref()
            .expect("the simulation runs (add the step \"When the simulation runs\")")
    }

    fn report(&self) -> Report {
        self.sim().report()
    }

    fn uid(&self, pod: &str) -> String {
        self.uids
            .get(pod)
            .cloned()
            .unwrap_or_else(|| panic!("no pod {pod:?} was seen"))
    }

    fn remember_uids(&mut self) {
        for pod in self.sim().api.list::<Pod>() {
            self.uids.insert(
                pod.metadata.name.clone().unwrap_or_default(),
                pod.metadata.uid.clone().unwrap_or_default(),
            );
        }
    }

    /// The calls of a method for one pod volume (matched by its mount dir, or for stage calls by handle).
    fn calls_for(&self, method: &str, pod: &str, volume: &str) -> Vec<CsiCall> {
        let dir = format!(
            "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
            self.uid(pod)
        );
        self.report()
            .csi_calls
            .into_iter()
            .filter(|c| c.method == method && c.target_path.ends_with(&dir))
            .collect()
    }

    fn publish_of(&self, pod: &str, volume: &str) -> CsiCall {
        self.calls_for("NodePublishVolume", pod, volume)
            .into_iter()
            .find(|c| c.code == "OK")
            .unwrap_or_else(|| {
                panic!(
                    "no successful NodePublishVolume for {pod}/{volume}: {:#?}",
                    self.report().csi_calls
                )
            })
    }

    async fn apply(&mut self, yaml: &str) {
        let yaml = images::resolve(self, yaml);
        let manifests = manifest::parse(&yaml, "scenario").expect("the scenario's YAML parses");
        let sim = self.sim.as_mut().expect("running");
        sim.apply(manifests).await;
        self.remember_uids();
    }

    async fn wait(&self, what: &str, done: impl Fn(&Report) -> bool) {
        if !self.sim().wait_until(WAIT, &done).await {
            panic!(
                "timed out waiting until {what}; report: {}",
                serde_json::to_string_pretty(&self.report()).unwrap_or_default()
            );
        }
    }
}

// ---- Given ----

#[given(
    regex = r#"^the local driver "([^"]+)"(?: with (attach|mount group|attach and mount group))?$"#
)]
fn local_driver(w: &mut Sim, name: String, options: String) {
    let source = match options.as_str() {
        "" => "local",
        "attach" => "local:attach",
        "mount group" => "local:mount-group",
        _ => "local:attach,mount-group",
    };
    w.drivers
        .push(format!("{name}={source}").parse().expect("driver"));
}

#[given(regex = r#"^a CSIDriver "([^"]+)" with:$"#)]
fn csi_driver(w: &mut Sim, name: String, step: &Step) {
    let spec = step.docstring.clone().unwrap_or_default();
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    w.manifests.push(format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    ));
}

#[given(regex = r#"^no CSIDriver object for "([^"]+)"$"#)]
fn no_csi_driver(_w: &mut Sim, _name: String) {}

#[given(regex = r"^the manifests:$")]
fn manifests(w: &mut Sim, step: &Step) {
    w.manifests.push(step.docstring.clone().unwrap_or_default());
}

#[given(regex = r#"^the feature gate "(PersistentInlineCSI|CSIVolumeHealth|SELinuxMount)" is on$"#)]
fn gate_on(w: &mut Sim, gate: String) {
    w.gates.insert(gate);
}

#[given(regex = r#"^inline CSI drivers are limited to "([^"]*)"$"#)]
fn limited(w: &mut Sim, list: String) {
    w.allowed = Some(
        list.split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect(),
    );
}

#[given(regex = r"^(\d+) nodes$")]
fn nodes(w: &mut Sim, n: usize) {
    w.nodes = n;
}

// ---- When ----

/// Starts the simulation and applies the manifests; waits until every pod is Running or has a warning.
#[when(regex = r"^the simulation runs$")]
async fn runs(w: &mut Sim) {
    let mounter: Arc<dyn MountLayer> = if can_mount() {
        Arc::new(LinuxMounter)
    } else {
        let recording = Arc::new(RecordingMounter::new());
        w.recording = Some(Arc::clone(&recording));
        recording
    };
    let config = SimConfig {
        root: w.dir.path().join("root"),
        nodes: w.nodes,
        drivers: w.drivers.clone(),
        cri: None,
        gates: w.gates.clone(),
        selinux: w.selinux,
        allowed_inline_drivers: w.allowed.clone(),
        backoff: BackoffPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        volume_wait_timeout: w.volume_wait,
        csi_timeout: inlet_volume::csi::CSI_TIMEOUT,
        republish_period: Duration::from_millis(300),
        volume_stats_agg_period: w.stats_period,
        containers: ContainerTiming {
            relist_period: Duration::from_millis(50),
            backoff: BackoffPolicy {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(1),
            },
            runtime_request_timeout: Duration::from_millis(500),
        },
        mounter,
        images: w.images.clone(),
        plugins_registry: w.plugins_registry.clone(),
        node_name_prefix: "node".into(),
        cluster: None,
    };
    w.config = Some(config.clone());
    w.sim = Some(
        Simulation::start(config)
            .await
            .expect("the simulation starts"),
    );
    images::after_start(w);
    let yaml = w.manifests.join("\n---\n");
    w.apply(&yaml).await;
    settle(w).await;
}

async fn settle(w: &Sim) {
    w.wait("every pod is Running (or ended) or has a warning", |r| {
        r.pods.iter().all(|p| {
            ["Running", "Succeeded", "Failed"].contains(&p.phase.as_str())
                || p.events.iter().any(|e| e.type_ == "Warning")
        })
    })
    .await;
}

/// The whole `kubelet-sim` process restarts on the same root (mounts, driver state and runtime state stay),
/// and its manifests reach the new API only after a delay: a slow start, as a real kubelet's API sources
/// may be. Nothing must be torn down meanwhile.
#[when(regex = r"^kubelet-sim restarts on the same root, its manifests applied (\d+) ms later$")]
async fn sim_restarts(w: &mut Sim, delay: u64) {
    w.sim.take().expect("running").shutdown().await;
    let config = w.config.clone().expect("the simulation ran");
    w.sim = Some(
        Simulation::start(config)
            .await
            .expect("the simulation starts again"),
    );
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let yaml = w.manifests.join("\n---\n");
    w.apply(&yaml).await;
    settle(w).await;
}

#[when(regex = r"^these manifests are applied:$")]
async fn applied(w: &mut Sim, step: &Step) {
    w.apply(&step.docstring.clone().unwrap_or_default()).await;
}

#[when(regex = r#"^the local driver "([^"]+)" registers$"#)]
async fn registers(w: &mut Sim, name: String) {
    let driver: DriverArg = format!("{name}=local").parse().expect("driver");
    w.sim
        .as_mut()
        .expect("running")
        .add_driver(&driver)
        .await
        .expect("registration succeeds");
}

#[when(regex = r#"^the local driver "([^"]+)" stops$"#)]
async fn driver_stops(w: &mut Sim, name: String) {
    w.sim.as_mut().expect("running").stop_driver(&name).await;
}

#[when(regex = r"^the runtime stops$")]
async fn runtime_stops(w: &mut Sim) {
    w.sim.as_mut().expect("running").stop_runtime().await;
}

#[when(regex = r"^the runtime starts again$")]
fn runtime_starts(w: &mut Sim) {
    w.sim.as_mut().expect("running").start_runtime();
}

#[when(regex = r#"^pod "([^"]+)" is deleted$"#)]
async fn pod_deleted(w: &mut Sim, pod: String) {
    let namespace = w
        .sim()
        .api
        .list::<Pod>()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(&pod))
        .and_then(|p| p.metadata.namespace.clone());
    assert!(
        w.sim()
            .delete_pod(namespace.as_deref().unwrap_or("default"), &pod),
        "pod {pod} exists"
    );
    let api = Arc::clone(&w.sim().api);
    w.wait(&format!("pod {pod} is gone"), |_| {
        !api.list::<Pod>()
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some(&pod))
    })
    .await;
}

#[when(regex = r#"^pod "([^"]+)" is being deleted$"#)]
fn pod_being_deleted(w: &mut Sim, pod: String) {
    assert!(w.sim().delete_pod("default", &pod), "pod {pod} exists");
}

#[when(regex = r"^all pods are deleted$")]
async fn all_deleted(w: &mut Sim) {
    w.teardown = Some(w.sim().teardown(WAIT).await);
}

#[when(regex = r#"^the kubelet of "([^"]+)" stops$"#)]
async fn kubelet_stops(w: &mut Sim, node: String) {
    w.sim.as_mut().expect("running").stop_node(&node).await;
}

#[when(regex = r#"^the kubelet of "([^"]+)" starts again$"#)]
async fn kubelet_starts(w: &mut Sim, node: String) {
    w.sim
        .as_mut()
        .expect("running")
        .start_node(&node)
        .await
        .expect("the kubelet starts");
}

#[when(regex = r#"^pod "([^"]+)" is force-deleted$"#)]
fn force_deleted(w: &mut Sim, pod: String) {
    let found = w
        .sim()
        .api
        .list::<Pod>()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(&pod))
        .expect("pod");
    w.sim().api.remove::<Pod>(
        found.metadata.namespace.as_deref().unwrap_or_default(),
        &pod,
    );
}

#[when(regex = r#"^the secret "([^"/]+)/([^"]+)" is deleted$"#)]
fn secret_deleted(w: &mut Sim, namespace: String, name: String) {
    assert!(
        w.sim()
            .api
            .remove::<k8s_openapi::api::core::v1::Secret>(&namespace, &name)
            .is_some(),
        "secret {namespace}/{name} exists"
    );
}

// ---- Then: pods and events ----

#[then(regex = r#"^pods "([^"]+)" and "([^"]+)" run on different nodes$"#)]
fn different_nodes(w: &mut Sim, a: String, b: String) {
    let report = w.report();
    let node = |name: &str| {
        report
            .pods
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.node.clone())
            .expect("pod")
    };
    assert_ne!(node(&a), node(&b));
}

#[then(regex = r#"^nothing is left of pod "([^"]+)" on "([^"]+)"$"#)]
async fn nothing_left_of(w: &mut Sim, pod: String, node: String) {
    let dir = w
        .dir
        .path()
        .join("root")
        .join(&node)
        .join("pods")
        .join(w.uid(&pod));
    let uid = w.uid(&pod);
    let runtime = w.sim().cri_fake(&node).cloned().expect("cri-fake");
    w.wait(
        &format!("{} is gone and no sandbox of {pod} is left", dir.display()),
        |_| {
            !dir.exists()
                && !runtime
                    .sandboxes()
                    .iter()
                    .any(|s| s.sandbox.labels.get("io.kubernetes.pod.uid") == Some(&uid))
        },
    )
    .await;
}

#[then(regex = r#"^the mount dir of "([^"]+)" in pod "([^"]+)" (has|does not have) group (\d+)$"#)]
fn mount_group(w: &mut Sim, volume: String, pod: String, has: String, gid: u32) {
    use std::os::unix::fs::MetadataExt;
    let target = w.publish_of(&pod, &volume).target_path;
    // Without root, what the mount layer was asked to do stands in for the file's group.
    if let Some(recording) = &w.recording {
        let given = recording.calls().iter().any(|c| {
            matches!(c, MountCall::SetGroup { path, gid: g, .. } if path.as_os_str() == target.as_str() && *g == gid)
        });
        assert_eq!(given, has == "has", "{target}: {:#?}", recording.calls());
        return;
    }
    let group = std::fs::metadata(&target).expect("the mount dir").gid();
    assert_eq!(group == gid, has == "has", "{target} has group {group}");
}

#[then(regex = r#"^pod "([^"]+)" (?:is|becomes|ends) (Running|Pending|Succeeded|Failed)$"#)]
async fn pod_phase(w: &mut Sim, pod: String, phase: String) {
    w.wait(&format!("pod {pod} is {phase}"), |r| {
        r.pods.iter().any(|p| p.name == pod && p.phase == phase)
    })
    .await;
}

#[then(regex = r#"^pod "([^"]+)" has a (Normal|Warning) "([^"]+)" event saying "(.*)"$"#)]
async fn pod_event(w: &mut Sim, pod: String, type_: String, reason: String, text: String) {
    // From the API's events, which outlive the pod.
    let api = Arc::clone(&w.sim().api);
    let uid = w.uid(&pod);
    w.wait(
        &format!("pod {pod} has a {type_} {reason} event saying {text:?}"),
        |_| {
            api.events_for(&uid).iter().any(|e| {
                e.type_.as_deref() == Some(type_.as_str())
                    && e.reason.as_deref() == Some(reason.as_str())
                    && e.message.as_deref().unwrap_or_default().contains(&text)
            })
        },
    )
    .await;
}

#[then(regex = r#"^pod "([^"]+)" was rejected with "(.*)"$"#)]
fn rejected(w: &mut Sim, pod: String, text: String) {
    let report = w.report();
    assert!(
        !report.pods.iter().any(|p| p.name == pod),
        "pod {pod} was admitted"
    );
    assert!(
        report.rejected.iter().any(|r| r.message.contains(&text)),
        "no rejection saying {text:?}: {:#?}",
        report.rejected
    );
}

#[then(regex = r#"^creating pod "([^"]+)" again was rejected with "(.*)"$"#)]
fn rejected_again(w: &mut Sim, pod: String, text: String) {
    let report = w.report();
    let named = format!("pods {pod:?}");
    assert!(
        report
            .rejected
            .iter()
            .any(|r| r.message.contains(&named) && r.message.contains(&text)),
        "no rejection of {pod} saying {text:?}: {:#?}",
        report.rejected
    );
}

#[then(regex = r#"^the PersistentVolume "([^"]+)" was rejected with "(.*)"$"#)]
fn pv_rejected(w: &mut Sim, pv: String, text: String) {
    assert!(
        w.sim()
            .api
            .peek::<k8s_openapi::api::core::v1::PersistentVolume>("", &pv)
            .is_none(),
        "PersistentVolume {pv} was admitted"
    );
    let report = w.report();
    assert!(
        report.rejected.iter().any(|r| r.message == text),
        "no rejection saying {text:?}: {:#?}",
        report.rejected
    );
}

/// The mount at `path` of a container, with the pod's directory on its node.
fn container_mount_at(
    w: &Sim,
    pod: &str,
    container: &str,
    path: &str,
) -> (kubelet_sim::node::MountReport, std::path::PathBuf) {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    let pod_dir = w
        .dir
        .path()
        .join("root")
        .join(&pod.node)
        .join("pods")
        .join(&pod.uid);
    let mount = container_of(pod, container)
        .mounts
        .iter()
        .find(|m| m.container_path == path)
        .cloned()
        .unwrap_or_else(|| panic!("no mount at {path}"));
    (mount, pod_dir)
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" mounts "([^"]+)" (read-only|read-write)$"#)]
fn container_mount(w: &mut Sim, container: String, pod: String, path: String, mode: String) {
    let (mount, _) = container_mount_at(w, &pod, &container, &path);
    assert_eq!(mount.readonly, mode == "read-only", "{mount:?}");
    assert!(
        std::path::Path::new(&mount.host_path).exists(),
        "the host path exists: {}",
        mount.host_path
    );
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" mounts "([^"]+)" from its pod's "([^"]+)"$"#
)]
fn container_mount_from(w: &mut Sim, name: String, pod: String, path: String, from: String) {
    let (mount, pod_dir) = container_mount_at(w, &pod, &name, &path);
    assert_eq!(
        std::path::Path::new(&mount.host_path),
        pod_dir.join(from),
        "{mount:?}"
    );
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" waits with reason "([^"]+)"$"#)]
fn container_waits(w: &mut Sim, name: String, pod: String, reason: String) {
    let c = container(w, &pod, &name);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("waiting", reason.as_str()),
        "{c:#?}"
    );
}

fn container(w: &Sim, pod: &str, container: &str) -> kubelet_sim::node::ContainerReport {
    let report = w.report();
    let pod = report.pods.iter().find(|p| p.name == pod).expect("pod");
    container_of(pod, container).clone()
}

fn container_of<'a>(
    pod: &'a kubelet_sim::report::PodReport,
    container: &str,
) -> &'a kubelet_sim::node::ContainerReport {
    pod.containers
        .iter()
        .chain(&pod.init_containers)
        .find(|c| c.name == container)
        .unwrap_or_else(|| panic!("no container {container}: {:#?}", pod.containers))
}

#[then(
    regex = r#"^container "([^"]+)" of pod "([^"]+)" ended with exit code (\d+) and reason "([^"]*)"$"#
)]
fn container_ended(w: &mut Sim, name: String, pod: String, code: i32, reason: String) {
    let c = container(w, &pod, &name);
    assert_eq!(
        (c.state.as_str(), c.exit_code, c.reason.as_str()),
        ("terminated", Some(code), reason.as_str()),
        "{c:#?}"
    );
}

#[then(regex = r#"^the log of container "([^"]+)" of pod "([^"]+)" says "(.*)"$"#)]
fn container_log(w: &mut Sim, name: String, pod: String, line: String) {
    let c = container(w, &pod, &name);
    assert!(c.logs.contains(&line), "{:?}", c.logs);
}

#[then(regex = r#"^container "([^"]+)" of pod "([^"]+)" is restarted at least (\d+) times$"#)]
async fn container_restarts(w: &mut Sim, name: String, pod: String, times: u32) {
    w.wait(&format!("{pod}/{name} restarted {times} times"), |r| {
        r.pods.iter().any(|p| {
            p.name == pod
                && p.containers
                    .iter()
                    .chain(&p.init_containers)
                    .any(|c| c.name == name && c.restart_count >= times)
        })
    })
    .await;
}

// ---- Then: CSI calls ----

#[then(regex = r#"^the driver got (\w+) for volume "([^"]+)" of pod "([^"]+)"$"#)]
async fn got_call(w: &mut Sim, method: String, volume: String, pod: String) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{method} for {pod}/{volume}"), |r| {
        r.csi_calls
            .iter()
            .any(|c| c.method == method && c.target_path.ends_with(&dir))
    })
    .await;
}

#[then(
    regex = r#"^the driver got (\w+) for volume "([^"]+)" of pod "([^"]+)" at least (\d+) times$"#
)]
async fn got_calls(w: &mut Sim, method: String, volume: String, pod: String, times: usize) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{times} {method} for {pod}/{volume}"), |r| {
        r.csi_calls
            .iter()
            .filter(|c| c.method == method && c.target_path.ends_with(&dir))
            .count()
            >= times
    })
    .await;
}

#[then(regex = r#"^pod "([^"]+)" got no Warning event$"#)]
fn no_warning(w: &mut Sim, pod: String) {
    let events = w.sim().api.events_for(&w.uid(&pod));
    let warnings: Vec<_> = events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| (&e.reason, &e.message))
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[then(regex = r#"^the driver got no (\w+) for volume "([^"]+)" of pod "([^"]+)"$"#)]
fn got_no_call(w: &mut Sim, method: String, volume: String, pod: String) {
    let calls = w.calls_for(&method, &pod, &volume);
    assert!(calls.is_empty(), "unexpected {method}: {calls:#?}");
}

#[then(regex = r#"^the driver got no (\w+) calls?$"#)]
fn no_call(w: &mut Sim, method: String) {
    let calls: Vec<CsiCall> = w
        .report()
        .csi_calls
        .into_iter()
        .filter(|c| c.method == method)
        .collect();
    assert!(calls.is_empty(), "unexpected {method}: {calls:#?}");
}

#[then(regex = r#"^the driver got (\w+) for handle "([^"]+)" (\d+) times?$"#)]
fn call_count(w: &mut Sim, method: String, handle: String, times: usize) {
    let n = w
        .report()
        .csi_calls
        .iter()
        .filter(|c| c.method == method && c.volume_id == handle && c.code == "OK")
        .count();
    assert_eq!(
        n,
        times,
        "{method} for {handle}: {:#?}",
        w.report().csi_calls
    );
}

#[then(
    regex = r#"^every (\w+) call for handle "([^"]+)" has (access mode|volume mount group) "([^"]*)"$"#
)]
fn call_capability(w: &mut Sim, method: String, handle: String, field: String, value: String) {
    let calls: Vec<CsiCall> = w
        .report()
        .csi_calls
        .into_iter()
        .filter(|c| c.method == method && c.volume_id == handle)
        .collect();
    assert!(!calls.is_empty(), "no {method} for {handle}");
    for call in &calls {
        let got = match field.as_str() {
            "access mode" => &call.access_mode,
            _ => &call.volume_mount_group,
        };
        assert_eq!(got, &value, "{field} of {call:#?}");
    }
}

#[then(regex = r#"^the driver published "([^"]+)" of pod "([^"]+)" at least (\d+) times$"#)]
async fn published_times(w: &mut Sim, volume: String, pod: String, times: usize) {
    let dir = format!(
        "/pods/{}/volumes/kubernetes.io~csi/{volume}/mount",
        w.uid(&pod)
    );
    w.wait(&format!("{pod}/{volume} published {times} times"), |r| {
        r.csi_calls
            .iter()
            .filter(|c| {
                c.method == "NodePublishVolume" && c.code == "OK" && c.target_path.ends_with(&dir)
            })
            .count()
            >= times
    })
    .await;
}

#[then(
    regex = r#"^the volume id of "([^"]+)" in pod "([^"]+)" is csi- and the sha256 of the pod UID and the volume name$"#
)]
fn handle_formula(w: &mut Sim, volume: String, pod: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(
        call.volume_id,
        ephemeral_volume_handle(&w.uid(&pod), &volume)
    );
    assert_eq!(call.volume_id.len(), 68);
}

#[then(regex = r#"^pods "([^"]+)" and "([^"]+)" got different volume ids for "([^"]+)"$"#)]
fn different_handles(w: &mut Sim, a: String, b: String, volume: String) {
    assert_ne!(
        w.publish_of(&a, &volume).volume_id,
        w.publish_of(&b, &volume).volume_id
    );
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has volume context "([^"]+)" = "([^"]*)"$"#
)]
fn context_has(w: &mut Sim, volume: String, pod: String, key: String, value: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(
        call.volume_context.get(&key),
        Some(&value),
        "{:#?}",
        call.volume_context
    );
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has no volume context key starting with "([^"]+)"$"#
)]
fn context_lacks(w: &mut Sim, volume: String, pod: String, prefix: String) {
    let call = w.publish_of(&pod, &volume);
    assert!(
        !call.volume_context.keys().any(|k| k.starts_with(&prefix)),
        "{:#?}",
        call.volume_context
    );
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" is (read-only|read-write)$"#)]
fn publish_readonly(w: &mut Sim, volume: String, pod: String, mode: String) {
    assert_eq!(w.publish_of(&pod, &volume).readonly, mode == "read-only");
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has the staging path (empty|set)$"#)]
fn publish_staging(w: &mut Sim, volume: String, pod: String, state: String) {
    let call = w.publish_of(&pod, &volume);
    assert_eq!(call.staging_path.is_empty(), state == "empty", "{call:#?}");
    if state == "empty" {
        assert!(
            call.publish_context.is_empty(),
            "an ephemeral publish has no publish context"
        );
    }
}

#[then(regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has secret keys "([^"]*)"$"#)]
fn publish_secret_keys(w: &mut Sim, volume: String, pod: String, keys: String) {
    let expected: Vec<String> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(w.publish_of(&pod, &volume).secret_keys, expected);
}

#[then(
    regex = r#"^the publish of "([^"]+)" in pod "([^"]+)" has a token for audience "([^"]*)" expiring on a whole second, RFC 3339 in UTC$"#
)]
fn token_expiry(w: &mut Sim, volume: String, pod: String, audience: String) {
    let call = w.publish_of(&pod, &volume);
    let tokens = &call.volume_context["csi.storage.k8s.io/serviceAccount.tokens"];
    let tokens: serde_json::Value = serde_json::from_str(tokens).expect("tokens are JSON");
    assert_eq!(tokens[&audience]["token"], "<redacted>", "{tokens}");
    let expiry = tokens[&audience]["expirationTimestamp"]
        .as_str()
        .expect("an expirationTimestamp");
    // `2026-12-01T16:00:00Z`: no fraction, UTC.
    let parsed = expiry.parse::<k8s_openapi::jiff::Timestamp>();
    assert!(
        parsed.is_ok() && expiry.len() == 20 && expiry.ends_with('Z'),
        "{expiry} is not metav1.Time's form"
    );
}

#[then(regex = r"^no report, log or call carries a secret value$")]
fn no_secret_values(w: &mut Sim) {
    let report = serde_json::to_string(&w.report()).expect("json");
    for value in ["s3cr3t-password", "sim-token-"] {
        assert!(!report.contains(value), "the report contains {value:?}");
    }
}

#[then(regex = r#"^the (\w+) call for handle "([^"]+)" has secret keys "([^"]*)"$"#)]
fn call_secret_keys(w: &mut Sim, method: String, handle: String, keys: String) {
    let expected: Vec<String> = keys
        .split(',')
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    let report = w.report();
    let call = report
        .csi_calls
        .iter()
        .find(|c| c.method == method && c.volume_id == handle && c.code == "OK");
    assert_eq!(
        call.map(|c| c.secret_keys.clone()),
        Some(expected),
        "{:#?}",
        report.csi_calls
    );
}

// ---- Then: API reads ----

#[then(regex = r#"^the only secrets read were "([^"]*)"$"#)]
fn secrets_read(w: &mut Sim, list: String) {
    let read = w.report().secrets_read();
    let expected: BTreeSet<String> = list
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(read, expected);
}

// ---- Then: attachments ----

#[then(
    regex = r#"^a VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" is attached$"#
)]
async fn attached(w: &mut Sim, handle: String, driver: String, node: String) {
    let name = attachment_name(&handle, &driver, &node);
    let api = Arc::clone(&w.sim().api);
    w.wait(&format!("{name} is attached"), |_| {
        api.peek::<VolumeAttachment>("", &name)
            .and_then(|v| v.status.clone())
            .is_some_and(|s| s.attached)
    })
    .await;
}

#[then(regex = r#"^there (?:is|are) (\d+) VolumeAttachments?$"#)]
fn attachment_count(w: &mut Sim, n: usize) {
    assert_eq!(w.sim().api.list::<VolumeAttachment>().len(), n);
}

#[then(
    regex = r#"^the VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" carries the inline source for namespace "([^"]+)"$"#
)]
fn attachment_copy(w: &mut Sim, handle: String, driver: String, node: String, namespace: String) {
    let va = w
        .sim()
        .api
        .peek::<VolumeAttachment>("", &attachment_name(&handle, &driver, &node))
        .expect("attachment");
    let va = std::sync::Arc::unwrap_or_clone(va);
    let csi = va
        .spec
        .source
        .inline_volume_spec
        .clone()
        .and_then(|s| s.csi)
        .expect("an inline copy");
    assert_eq!(
        (csi.driver.as_str(), csi.volume_handle.as_str()),
        (driver.as_str(), handle.as_str())
    );
    let annotation = va
        .metadata
        .annotations
        .and_then(|a| a.get("inlet.dev/inline-volume-namespace").cloned());
    assert_eq!(annotation.as_deref(), Some(namespace.as_str()));
}

#[then(
    regex = r#"^the VolumeAttachment for handle "([^"]+)" of "([^"]+)" on "([^"]+)" has a detach error saying "(.*)"$"#
)]
async fn detach_error(w: &mut Sim, handle: String, driver: String, node: String, text: String) {
    let name = attachment_name(&handle, &driver, &node);
    let api = Arc::clone(&w.sim().api);
    w.wait(
        &format!("{name} has a detach error saying {text:?}"),
        |_| {
            api.peek::<VolumeAttachment>("", &name)
                .and_then(|v| v.status.clone())
                .and_then(|s| s.detach_error)
                .and_then(|e| e.message)
                .is_some_and(|m| m.contains(&text))
        },
    )
    .await;
}

#[then(regex = r"^no VolumeAttachment is left$")]
async fn no_attachments(w: &mut Sim) {
    let api = Arc::clone(&w.sim().api);
    w.wait("no VolumeAttachment is left", |_| {
        api.list::<VolumeAttachment>().is_empty()
    })
    .await;
}

// ---- Then: the node ----

#[then(regex = r#"^the staging record of handle "([^"]+)" on "([^"]+)" is exactly (\{.*\})$"#)]
fn staging_record(w: &mut Sim, handle: String, node: String, expected: String) {
    let plugin = w
        .dir
        .path()
        .join("root")
        .join(&node)
        .join("plugins/kubernetes.io/csi");
    let records: Vec<String> = walkdir::WalkDir::new(&plugin)
        .into_iter()
        .flatten()
        .filter(|e| e.file_name() == "vol_data.json")
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .collect();
    let record = records
        .iter()
        .find(|r| r.contains(&format!("{handle:?}")))
        .unwrap_or_else(|| panic!("no staging record of {handle} under {}", plugin.display()));
    assert_eq!(record, &format!("{expected}\n"));
}

#[then(regex = r"^nothing is left on the node$")]
fn nothing_left(w: &mut Sim) {
    let teardown = w
        .teardown
        .clone()
        .expect("run \"When all pods are deleted\" first");
    assert!(teardown.clean(), "{teardown:#?}");
}

#[then(
    regex = r#"^the vol_data.json of "([^"]+)" in pod "([^"]+)" records mode "(\w+)" and driver "([^"]+)"$"#
)]
fn vol_data(w: &mut Sim, volume: String, pod: String, mode: String, driver: String) {
    let node = w
        .report()
        .pods
        .iter()
        .find(|p| p.name == pod)
        .map(|p| p.node.clone())
        .expect("pod");
    let dir: PathBuf = w
        .dir
        .path()
        .join("root")
        .join(node)
        .join("pods")
        .join(w.uid(&pod))
        .join("volumes/kubernetes.io~csi")
        .join(&volume);
    let data = inlet_volume::csi::vol_data::VolData::load(&dir).expect("vol_data.json");
    assert_eq!(
        (data.lifecycle_mode.as_str(), data.driver_name.as_str()),
        (mode.as_str(), driver.as_str())
    );
    assert_eq!(data.volume_handle, w.publish_of(&pod, &volume).volume_id);
}

fn main() {
    let features = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../features");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // Scenarios tagged @registry need Debian's docker-registry (CI installs it), those tagged @mounts need
    // real mounts (root); elsewhere they are counted as skipped, and say so.
    let registry = images::registry_available();
    let filtered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&filtered);
    let writer = runtime.block_on(
        Sim::cucumber()
            .max_concurrent_scenarios(4)
            .with_default_cli()
            .after(|_, _, _, _, world| {
                Box::pin(async move {
                    if let Some(w) = world {
                        if let Some(sim) = w.sim.take() {
                            sim.teardown(WAIT).await;
                            sim.shutdown().await;
                        }
                    }
                })
            })
            .filter_run(features, move |feature, _, scenario| {
                let tagged =
                    |tag: &str| feature.tags.iter().chain(&scenario.tags).any(|t| t == tag);
                let missing = if tagged("registry") && !registry {
                    Some(format!("{} is not installed", cri_fake::registry::BINARY))
                } else if tagged("mounts") && !can_mount() {
                    Some("not root: it needs real mounts".to_string())
                } else {
                    None
                };
                if let Some(why) = missing {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    println!("SKIPPED ({why}): {}", scenario.name);
                    return false;
                }
                true
            }),
    );
    let stats = writer.scenarios_stats();
    let failed = stats.failed + writer.parsing_errors() + writer.hook_errors();
    println!(
        "bdd: {} passed, {} failed, {} skipped",
        stats.passed,
        failed,
        stats.skipped + filtered.load(std::sync::atomic::Ordering::Relaxed)
    );
    if failed > 0 || stats.skipped > 0 {
        std::process::exit(1);
    }
}
