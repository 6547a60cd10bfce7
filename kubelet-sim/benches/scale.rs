//! A thin wrapper over `kubelet-sim bench pods` (see `kubelet_sim::bench::pods`), kept for `cargo bench`:
//! `PODS=1000 NODES=10 cargo bench -p kubelet-sim --bench scale`; `ROOT` picks the state dir (a tmpfs such
//! as /dev/shm keeps filesystem costs out of the figure). Mounts are recorded, not made. Prints figures;
//! asserts no timing.

use std::sync::Arc;
use std::time::Duration;

use inlet_host::mount::RecordingMounter;
use kubelet_sim::bench::{pods, print_pods};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let dir = match std::env::var("ROOT") {
        Ok(root) => tempfile::tempdir_in(root).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let config = pods::PodsConfig {
        pods: env("PODS", 1000),
        nodes: env("NODES", 10),
        volumes: 2,
        driver: "local.inlet.dev=local".parse().unwrap(),
        root: dir.path().join("root"),
        mounter: Arc::new(RecordingMounter::new()),
        limit: Duration::from_secs(env("LIMIT_SECS", 600) as u64),
        interrupts: None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let figures = runtime.block_on(pods::run(&config)).unwrap();
    print_pods(&mut std::io::stdout(), &figures).unwrap();
}
