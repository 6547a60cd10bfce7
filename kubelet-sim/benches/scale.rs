//! How long a simulated cluster takes to settle: N pods with 2 inline volumes each, over M nodes, each node
//! with inlet's local driver, cri-fake in-process. Prints settle and teardown times and peak memory;
//! asserts no timing. The design figure is 10,000 pods over 100 nodes settled in under 20 s on 2 cores.
//!
//! Run: `PODS=1000 NODES=10 cargo bench -p kubelet-sim --bench scale`. `ROOT` picks the state dir (a
//! tmpfs such as /dev/shm keeps filesystem costs out of the figure); mounts are recorded, not made, so the
//! figure is the simulator's and the driver's own work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_plugin::mount::RecordingMounter;
use kubelet_sim::api::manifest;
use kubelet_sim::node::BackoffPolicy;
use kubelet_sim::sim::{SimConfig, Simulation};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (pods, nodes) = (env("PODS", 1000), env("NODES", 10));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(pods, nodes));
}

async fn run(pods: usize, nodes: usize) {
    let dir = match std::env::var("ROOT") {
        Ok(root) => tempfile::tempdir_in(root).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let mut yaml = String::from(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: local.inlet.dev}\nspec: {volumeLifecycleModes: [Ephemeral], podInfoOnMount: true}\n",
    );
    for i in 0..pods {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}}}\nspec:\n  containers: [{{name: app, image: busybox:1.36, volumeMounts: [{{name: a, mountPath: /a}}, {{name: b, mountPath: /b}}]}}]\n  volumes: [{{name: a, csi: {{driver: local.inlet.dev}}}}, {{name: b, csi: {{driver: local.inlet.dev}}}}]\n"
        ));
    }
    let manifests = manifest::parse(&yaml, "bench").unwrap();
    let config = SimConfig {
        root: dir.path().join("root"),
        nodes,
        drivers: vec!["local.inlet.dev=local".parse().unwrap()],
        cri: None,
        gates: Default::default(),
        allowed_inline_drivers: None,
        backoff: BackoffPolicy::default(),
        volume_wait_timeout: Duration::from_secs(123),
        republish_period: Duration::from_secs(60),
        containers: Default::default(),
        mounter: Arc::new(RecordingMounter::new()),
        images: Default::default(),
        plugins_registry: None,
        node_name_prefix: "node".into(),
        cluster: None,
    };
    let mut sim = Simulation::start(config).await.unwrap();
    let start = Instant::now();
    sim.apply(manifests).await;
    let limit = Duration::from_secs(
        std::env::var("LIMIT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    );
    let settled = sim.wait_for(limit, Simulation::pods_as_expected).await;
    let settle = start.elapsed();
    if !settled {
        // Say why: the most common warnings of the pods that did not get there.
        let mut reasons = std::collections::BTreeMap::<String, usize>::new();
        for pod in sim.report().pods.iter().filter(|p| p.phase != "Running") {
            let last = pod.events.iter().rev().find(|e| e.type_ == "Warning");
            let key = last
                .map(|e| {
                    format!(
                        "{}: {}",
                        e.reason,
                        e.message.chars().take(160).collect::<String>()
                    )
                })
                .unwrap_or_else(|| "no warning".into());
            *reasons.entry(key).or_default() += 1;
        }
        let mut reasons: Vec<_> = reasons.into_iter().collect();
        reasons.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        for (reason, n) in reasons.iter().take(5) {
            println!("not settled: {n} pods: {reason}");
        }
    }
    let start = Instant::now();
    let teardown = sim.teardown(Duration::from_secs(600)).await;
    let torn_down = start.elapsed();
    let calls = sim.calls.calls().len();
    sim.shutdown().await;
    println!(
        "scale: {pods} pods x 2 inline volumes over {nodes} nodes: settled {settled} in {:.2} s, torn down (clean {}) in {:.2} s, {calls} CSI calls, peak RSS {} MiB",
        settle.as_secs_f64(),
        teardown.clean(),
        torn_down.as_secs_f64(),
        peak_rss_mib()
    );
}

/// VmHWM from /proc/self/status.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}
