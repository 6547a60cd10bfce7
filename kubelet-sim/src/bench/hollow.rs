//! `kubelet-sim bench hollow-nodes`: what a hollow node costs on a real cluster (`--kubeconfig`): N hollow
//! nodes join it with inlet's local driver and the in-process cri-fake, mounting nothing (the recording
//! mount layer, as in `deploy/hollow-nodes/`); then the process's memory and CPU are measured while the
//! nodes idle (Leases renewed, status computed, watches open), and while pods with an inline CSI volume
//! are created on them and deleted again, round after round. The API server's own cost is not counted.
//! The nodes leave the cluster at the end (drained and deleted).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use serde::Serialize;
use serde_json::json;

use super::hollow_fleet::{Fleet, FleetConfig};
use super::{BenchError, or_interrupted};
use crate::signals::Interrupts;

/// What to run.
pub struct HollowConfig {
    /// The hollow nodes.
    pub fleet: FleetConfig,
    /// Pods per churn round (bound round-robin to the nodes).
    pub pods: usize,
    /// Churn rounds.
    pub rounds: usize,
    /// How long the nodes idle while measured.
    pub idle: Duration,
    /// SIGINT/SIGTERM: the bench stops measuring, its pods are deleted and its nodes leave the cluster
    /// (children stopped with SIGTERM), and it fails with the signal.
    pub interrupts: Option<Interrupts>,
}

/// The figures.
#[derive(Debug, Clone, Serialize)]
pub struct HollowFigures {
    /// Hollow nodes.
    pub nodes: usize,
    /// Processes they ran in (1: this one).
    pub processes: usize,
    /// The process's resident memory before the nodes started, MiB.
    pub baseline_rss_mib: f64,
    /// Resident memory per node while idle, beyond the baseline (in children: all of theirs), MiB.
    pub idle_rss_per_node_mib: f64,
    /// CPU per node while idle, millicores.
    pub idle_cpu_per_node_millicores: f64,
    /// Seconds from the start until every node was Ready in the API.
    pub register_seconds: f64,
    /// Pods per round, rounds.
    pub churn_pods: usize,
    /// See `churn_pods`.
    pub churn_rounds: usize,
    /// Pods started and deleted per second over the churn.
    pub churn_pods_per_second: f64,
    /// CPU per node during the churn, millicores.
    pub churn_cpu_per_node_millicores: f64,
    /// The peak resident memory of the processes holding the nodes, and this one's, MiB.
    pub peak_rss_mib: u64,
}

/// Millicores per node used over `wall`.
fn millicores(cpu: Duration, wall: Duration, nodes: usize) -> f64 {
    cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9) * 1000.0 / nodes.max(1) as f64
}

/// How often the round's pods are listed.
const POD_POLL: Duration = Duration::from_millis(200);

/// Asks `done` every `every` until it says yes, or `limit` has passed.
pub(super) async fn wait(
    what: &str,
    limit: Duration,
    every: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> Result<(), BenchError> {
    let until = Instant::now() + limit;
    while !done().await {
        if Instant::now() > until {
            return Err(BenchError::Output(format!("{what}: not within {limit:?}")));
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// How often the nodes are listed while they register: a list of 5,000 Nodes is megabytes the API
/// server encodes each time, so it is asked less often the more there are (half a second per thousand),
/// and from its watch cache (`resourceVersion=0`).
fn node_poll(nodes: usize) -> Duration {
    Duration::from_millis(200).max(Duration::from_millis(nodes as u64 / 2))
}

/// Waits until every node of `names` is Ready in the API, listing the simulator's nodes from the watch
/// cache every [`node_poll`].
pub(super) async fn wait_nodes_ready(
    client: &kube::Client,
    names: &[String],
    limit: Duration,
) -> Result<(), BenchError> {
    let nodes = kube::Api::<Node>::all(client.clone());
    let hollow = ListParams::default()
        .labels("inlet.dev/kubelet-sim=true")
        .match_any();
    let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    wait(
        "every hollow node Ready",
        limit,
        node_poll(names.len()),
        async || {
            let Ok(list) = nodes.list(&hollow).await else {
                return false;
            };
            let ready = list.items.iter().filter(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                let conditions = n.status.iter().flat_map(|s| s.conditions.iter().flatten());
                wanted.contains(name)
                    && conditions
                        .into_iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            ready.count() == names.len()
        },
    )
    .await
}

/// Runs the nodes, measures, and has them leave.
pub async fn run(config: &HollowConfig) -> Result<HollowFigures, BenchError> {
    // Children start from nothing; nodes here add to what this process already holds.
    let baseline = match config.fleet.processes {
        0 | 1 => Fleet::own_rss_mib(),
        _ => 0.0,
    };
    let started = Instant::now();
    let (fleet, names) = Fleet::join(&config.fleet, "bench-hollow").await?;
    let pods = kube::Api::<Pod>::namespaced(config.fleet.client.clone(), "default");
    let selector = ListParams::default().labels("inlet.dev/bench=hollow-nodes");
    let measured = or_interrupted(
        &config.interrupts,
        measure(config, &fleet, &names, &pods, &selector, started, baseline),
    )
    .await;
    fleet
        .leave_after(measured, &pods, &selector, config.fleet.limit)
        .await
}

/// Waits for the nodes, then measures them idle and under churn.
async fn measure(
    config: &HollowConfig,
    fleet: &Fleet,
    names: &[String],
    pods: &kube::Api<Pod>,
    selector: &ListParams,
    started: Instant,
    baseline: f64,
) -> Result<HollowFigures, BenchError> {
    wait_nodes_ready(&config.fleet.client, names, config.fleet.limit).await?;
    let register_seconds = started.elapsed().as_secs_f64();

    let (cpu, at) = (fleet.cpu_time(), Instant::now());
    tokio::time::sleep(config.idle).await;
    let idle_cpu = millicores(fleet.cpu_time() - cpu, at.elapsed(), config.fleet.nodes);
    let idle_rss = (fleet.rss_mib() - baseline) / config.fleet.nodes.max(1) as f64;

    let (cpu, at) = (fleet.cpu_time(), Instant::now());
    for round in 0..config.rounds {
        for i in 0..config.pods {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("hollow-bench-{round}-{i}"),
                             "labels": {"inlet.dev/bench": "hollow-nodes"}},
                "spec": {
                    "nodeName": names[i % names.len()],
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "app", "image": "busybox",
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                    "volumes": [{"name": "data", "csi": {"driver": config.fleet.driver.name}}]}
            }))
            .map_err(|e| BenchError::Output(e.to_string()))?;
            pods.create(&PostParams::default(), &pod)
                .await
                .map_err(|e| BenchError::Output(format!("creating a pod: {e}")))?;
        }
        wait(
            "the round's pods Running",
            config.fleet.limit,
            POD_POLL,
            async || {
                pods.list(selector).await.is_ok_and(|l| {
                    let running = l.items.iter().filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    });
                    running.count() == config.pods
                })
            },
        )
        .await?;
        pods.delete_collection(&DeleteParams::default(), selector)
            .await
            .map_err(|e| BenchError::Output(format!("deleting the pods: {e}")))?;
        wait(
            "the round's pods gone",
            config.fleet.limit,
            POD_POLL,
            async || pods.list(selector).await.is_ok_and(|l| l.items.is_empty()),
        )
        .await?;
    }
    let churn = at.elapsed();
    let churn_cpu = millicores(fleet.cpu_time() - cpu, churn, config.fleet.nodes);
    Ok(HollowFigures {
        nodes: config.fleet.nodes,
        processes: config.fleet.processes.max(1),
        baseline_rss_mib: baseline,
        idle_rss_per_node_mib: idle_rss,
        idle_cpu_per_node_millicores: idle_cpu,
        register_seconds,
        churn_pods: config.pods,
        churn_rounds: config.rounds,
        churn_pods_per_second: (config.pods * config.rounds) as f64 / churn.as_secs_f64().max(1e-9),
        churn_cpu_per_node_millicores: churn_cpu,
        // Before the children stop: their peaks go with them.
        peak_rss_mib: fleet.peak_rss_mib(),
    })
}
