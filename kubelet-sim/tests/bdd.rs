//! The BDD scenarios under `features/`: KEP-596's behaviours, run through the same simulation, plugin,
//! local driver and cri-fake as `kubelet-sim run`, over real sockets (real mounts when root).
//!
//! Steps wait on the API's change notifications with a deadline, never on fixed sleeps. A custom harness
//! (`harness = false`): libtest's flags (`--nocapture`) are accepted and ignored; the last line is
//! `bdd: N passed, N failed, N skipped` for any CI log reader.
//! Above it, each scenario that failed is named with its first error (`FAILED: <feature> › <scenario>
//! (line N): ...`), as CI keeps only the tail of a long run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cucumber::event::ScenarioFinished;
use cucumber::gherkin::Step;
use cucumber::{StatsWriter, World, given, then, when};
use inlet_host::mount::{LinuxMounter, MountCall, MountLayer, RecordingMounter, can_mount};
use inlet_proto::csi_call::CsiCall;
use inlet_volume::csi::handle::{attachment_name, ephemeral_volume_handle};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kubelet_sim::api::ApiPod;
use kubelet_sim::api::manifest;
use kubelet_sim::drivers::DriverArg;
use kubelet_sim::node::{BackoffPolicy, ContainerTiming};
use kubelet_sim::report::{Report, TeardownReport};
use kubelet_sim::sim::{SimConfig, SimImages, Simulation};

#[path = "bdd/claims.rs"]
mod claims;
#[path = "bdd/containers.rs"]
mod containers;
#[path = "bdd/csi_calls.rs"]
mod csi_calls;
#[path = "bdd/grants.rs"]
mod grants;
#[path = "bdd/hooks.rs"]
mod hooks;
#[path = "bdd/images.rs"]
mod images;
#[path = "bdd/node_state.rs"]
mod node_state;
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
        for pod in self.sim().api.list::<ApiPod>() {
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
        .list::<ApiPod>()
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
        !api.list::<ApiPod>()
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
        .list::<ApiPod>()
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(&pod))
        .expect("pod");
    w.sim().api.remove::<ApiPod>(
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
    // The scenarios that failed, with their first error, named again after the summary.
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let failed_into = Arc::clone(&failures);
    let writer = runtime.block_on(
        Sim::cucumber()
            .max_concurrent_scenarios(4)
            .with_default_cli()
            .after(move |feature, _, scenario, finished, world| {
                // An error's first line: the report a step prints with it is above, in the scenario's
                // output.
                let failure = match finished {
                    ScenarioFinished::StepFailed(_, _, error) => Some(error.to_string()),
                    ScenarioFinished::BeforeHookFailed(info) => Some(format!("{info:?}")),
                    _ => None,
                };
                if let Some(error) = failure {
                    let error = error.lines().next().unwrap_or_default();
                    let line = format!(
                        "{} › {} (line {}): {error}",
                        feature.name, scenario.name, scenario.position.line
                    );
                    failed_into.lock().expect("failures").push(line);
                }
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
    for line in failures.lock().expect("failures").iter() {
        println!("FAILED: {line}");
    }
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
