//! `kubelet-sim bench pods`: a simulated cluster at scale: N pods with K inline volumes each over M nodes,
//! through the simulated kubelets, a driver and cri-fake: how long until every pod runs, each pod's start
//! latency (from the manifests' apply to its Ready condition), how long the teardown takes, and the
//! process's peak memory. Mounts are recorded, not made (`--mounter` says otherwise), so the figure is the
//! simulator's and the driver's own work.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use inlet_host::mount::MountLayer;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::stats::{Summary, peak_rss_mib};
use super::{BenchError, stop_if_interrupted};
use crate::api::ApiPod;
use crate::api::manifest;
use crate::drivers::DriverArg;
use crate::signals::Interrupts;
use crate::sim::Simulation;

/// What to run.
pub struct PodsConfig {
    /// Pods.
    pub pods: usize,
    /// Simulated nodes.
    pub nodes: usize,
    /// Inline volumes per pod.
    pub volumes: usize,
    /// The driver (`NAME=local` starts inlet's on every node).
    pub driver: DriverArg,
    /// Where node state goes (a tmpfs such as /dev/shm keeps the filesystem out of the figure).
    pub root: std::path::PathBuf,
    /// The mount layer.
    pub mounter: Arc<dyn MountLayer>,
    /// The longest the pods may take to settle, and then to be torn down.
    pub limit: Duration,
    /// SIGINT/SIGTERM: the bench stops, tears down what it made, and fails with the signal.
    pub interrupts: Option<Interrupts>,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct PodsFigures {
    /// The driver.
    pub driver: String,
    /// Pods.
    pub pods: usize,
    /// Nodes.
    pub nodes: usize,
    /// Inline volumes per pod.
    pub volumes: usize,
    /// Whether every pod ran within the limit.
    pub settled: bool,
    /// Seconds from the apply until every pod ran.
    pub settle_seconds: f64,
    /// Seconds from deleting every pod until they and their volumes were gone.
    pub teardown_seconds: f64,
    /// Whether the teardown left nothing.
    pub teardown_clean: bool,
    /// Each pod's start: from the apply to its Ready condition (`per_second`: pods started per second).
    pub pod_start: Summary,
    /// The process's peak resident memory, in MiB.
    pub peak_rss_mib: u64,
    /// The peak resident memory until every pod ran, before the teardown, in MiB.
    pub settled_peak_rss_mib: u64,
    /// CSI calls made.
    pub csi_calls: usize,
    /// The CSI calls by method, then by code: what the nodes asked of the drivers, and how it went.
    pub csi_calls_by_method: BTreeMap<String, BTreeMap<String, usize>>,
    /// Every pod's start latency, for the chart.
    #[serde(skip)]
    pub samples: Vec<Duration>,
}

/// The CSIDriver and the pods, parsed as `kubelet-sim run` parses manifests, a chunk at a time (a
/// manifest file is held to 100,000 documents).
fn manifests(config: &PodsConfig) -> Result<Vec<manifest::Manifest>, BenchError> {
    let driver = &config.driver.name;
    let csidriver = format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\nspec: {{volumeLifecycleModes: [Ephemeral], podInfoOnMount: true}}\n"
    );
    let mut out =
        manifest::parse(&csidriver, "bench").map_err(|e| BenchError::Output(e.to_string()))?;
    let mounts: Vec<String> = (0..config.volumes)
        .map(|v| format!("{{name: v{v}, mountPath: /v{v}}}"))
        .collect();
    let volumes: Vec<String> = (0..config.volumes)
        .map(|v| format!("{{name: v{v}, csi: {{driver: {driver}}}}}"))
        .collect();
    let pods: Vec<usize> = (0..config.pods).collect();
    for chunk in pods.chunks(10_000) {
        let mut yaml = String::new();
        for i in chunk {
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  containers: [{{name: app, image: busybox:1.36, volumeMounts: [{}]}}]\n  volumes: [{}]\n",
                mounts.join(", "),
                volumes.join(", ")
            ));
        }
        out.extend(manifest::parse(&yaml, "bench").map_err(|e| BenchError::Output(e.to_string()))?);
    }
    Ok(out)
}

/// Runs the pods, then tears them down.
pub async fn run(config: &PodsConfig) -> Result<PodsFigures, BenchError> {
    let manifests = manifests(config)?;
    let sim_config = super::sim_config(
        &config.root,
        config.nodes,
        &config.driver,
        &config.mounter,
        "node",
        None,
    );
    let mut sim = Simulation::start(sim_config).await?;
    let applied_at = SystemTime::now();
    let started = Instant::now();
    // A signal ends the settle phase; the teardown below runs all the same (a second signal exits).
    let mut interrupts = config.interrupts.clone();
    let settled = tokio::select! {
        settled = async {
            sim.apply(manifests).await;
            sim.wait_for(config.limit, Simulation::pods_as_expected).await
        } => settled,
        _ = async {
            match interrupts.as_mut() {
                Some(interrupts) => interrupts.wait().await,
                None => std::future::pending().await,
            }
        } => false,
    };
    let settle = started.elapsed();
    let settled_peak_rss_mib = peak_rss_mib();
    let mut samples: Vec<Duration> = sim
        .api
        .list::<ApiPod>()
        .iter()
        .filter_map(|pod| ready_since(pod, applied_at))
        .collect();
    let pod_start = Summary::of(&mut samples, settle);
    let started = Instant::now();
    let teardown = sim.teardown(config.limit).await;
    let teardown_seconds = started.elapsed().as_secs_f64();
    let csi_calls = sim.calls.returned();
    let csi_calls_by_method = sim.calls.counts();
    sim.shutdown().await;
    stop_if_interrupted(&config.interrupts)?;
    Ok(PodsFigures {
        driver: config.driver.name.clone(),
        pods: config.pods,
        nodes: config.nodes,
        volumes: config.volumes,
        settled,
        settle_seconds: settle.as_secs_f64(),
        teardown_seconds,
        teardown_clean: teardown.clean(),
        pod_start,
        peak_rss_mib: peak_rss_mib(),
        settled_peak_rss_mib,
        csi_calls,
        csi_calls_by_method,
        samples,
    })
}

/// How long after `applied_at` the pod became Ready (to the millisecond the API keeps).
fn ready_since(pod: &Pod, applied_at: SystemTime) -> Option<Duration> {
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()?;
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ready.0.as_millisecond()).ok()?);
    at.duration_since(applied_at).ok()
}
