//! `kubelet-sim bench csi-ephemeral`: what an inline ephemeral volume costs a driver, call for call as the
//! kubelet makes them: NodePublishVolume with the ephemeral flag and pod info, then NodeUnpublishVolume,
//! over the driver's unix socket, at each concurrency, with N other volumes already published on the node
//! (to show whether the cost grows with the node's mounts). Several drivers are measured side by side:
//! each round runs a batch on every driver in turn, so a machine's drift hits them all alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_proto::csi::v1::{self as csi, node_client::NodeClient};
use serde::Serialize;
use tonic::transport::Channel;

use super::stats::Summary;
use super::{BenchError, stop_if_interrupted};
use crate::drivers::{Driver, DriverArg, DriverHandle, DriverNode, DriverSource};
use crate::images::SimImages;
use crate::signals::Interrupts;

/// Rounds each figure's cycles are split into, drivers taking turns.
const ROUNDS: usize = 5;

/// What to measure.
pub struct EphemeralConfig {
    /// The drivers: `NAME=local` (inlet's, started here) or `NAME=unix:///PATH`.
    pub drivers: Vec<DriverArg>,
    /// Publish + unpublish cycles per figure.
    pub cycles: usize,
    /// The concurrencies.
    pub concurrency: Vec<usize>,
    /// How many other volumes are published on the node meanwhile.
    pub published: Vec<usize>,
    /// Where target paths go: `<root>/<driver>/pods/...` (a driver started elsewhere must accept them).
    pub root: PathBuf,
    /// The mount layer of drivers started here.
    pub mounter: Arc<dyn MountLayer>,
    /// SIGINT/SIGTERM: the bench stops, undoes what it made, and fails with the signal.
    pub interrupts: Option<Interrupts>,
}

/// One figure: a driver at a concurrency with a number of other volumes published.
#[derive(Debug, Clone, Serialize)]
pub struct EphemeralFigure {
    /// The driver.
    pub driver: String,
    /// Cycles in flight at once.
    pub concurrency: usize,
    /// Other volumes published on the node meanwhile.
    pub published: usize,
    /// The round trips' figures (`per_second`: cycles per second).
    #[serde(flatten)]
    pub summary: Summary,
    /// Every round trip, for the chart.
    #[serde(skip)]
    pub samples: Vec<Duration>,
}

/// A driver under test.
struct Target {
    name: String,
    node: NodeClient<Channel>,
    /// The kubelet dir its target paths are under.
    kubelet_dir: PathBuf,
    /// Volumes published besides the measured ones.
    background: usize,
    handle: Option<DriverHandle>,
}

/// Runs every figure; the drivers started here are stopped, and every volume published is unpublished.
pub async fn run(config: &EphemeralConfig) -> Result<Vec<EphemeralFigure>, BenchError> {
    let mut targets = Vec::new();
    for driver in &config.drivers {
        targets.push(connect(driver, config).await?);
    }
    let mut figures = Vec::new();
    let result = measure(config, &mut targets, &mut figures).await;
    for target in &mut targets {
        let _ = set_background(target, 0, &None).await;
        if let Some(handle) = target.handle.take() {
            handle.stop().await;
        }
    }
    result.map(|()| figures)
}

async fn measure(
    config: &EphemeralConfig,
    targets: &mut [Target],
    figures: &mut Vec<EphemeralFigure>,
) -> Result<(), BenchError> {
    let mut next_id = 0u64;
    for &published in &config.published {
        for target in targets.iter_mut() {
            set_background(target, published, &config.interrupts).await?;
        }
        for &concurrency in &config.concurrency {
            let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); targets.len()];
            let mut walls = vec![Duration::ZERO; targets.len()];
            let per_round = config.cycles.div_ceil(ROUNDS).max(concurrency);
            for _ in 0..ROUNDS {
                for (i, target) in targets.iter().enumerate() {
                    stop_if_interrupted(&config.interrupts)?;
                    let started = Instant::now();
                    let batch = batch(
                        target,
                        concurrency,
                        per_round,
                        &mut next_id,
                        &config.interrupts,
                    )
                    .await?;
                    stop_if_interrupted(&config.interrupts)?;
                    walls[i] += started.elapsed();
                    samples[i].extend(batch);
                }
            }
            for (i, target) in targets.iter().enumerate() {
                let mut taken = std::mem::take(&mut samples[i]);
                let summary = Summary::of(&mut taken, walls[i]);
                figures.push(EphemeralFigure {
                    driver: target.name.clone(),
                    concurrency,
                    published,
                    summary,
                    samples: taken,
                });
            }
        }
    }
    Ok(())
}

async fn connect(driver: &DriverArg, config: &EphemeralConfig) -> Result<Target, BenchError> {
    let kubelet_dir = config.root.join(&driver.name);
    if driver.source == DriverSource::Image {
        return Err(BenchError::Usage(format!(
            "--driver {}=image: csi-ephemeral measures volume drivers (NAME=local or NAME=unix:///PATH)",
            driver.name
        )));
    }
    let on = DriverNode {
        node: "bench",
        node_root: &kubelet_dir,
        cri_socket: Path::new(""),
        images: &SimImages::default(),
        mounter: Arc::clone(&config.mounter),
    };
    let (socket, handle) = match driver.start(on).await? {
        Driver::InProcess(handle) => (handle.socket.clone(), Some(handle)),
        Driver::External(socket) => (socket, None),
    };
    let channel = inlet_proto::uds::connect(&socket)
        .await
        .map_err(|source| BenchError::Dial {
            what: format!("--driver {}", driver.name),
            source,
        })?;
    Ok(Target {
        name: driver.name.clone(),
        node: NodeClient::new(channel),
        kubelet_dir,
        background: 0,
        handle,
    })
}

/// `count` cycles, `concurrency` at a time; the round trip of each. A signal ends each worker after its
/// cycle in flight (a publish is always followed by its unpublish).
async fn batch(
    target: &Target,
    concurrency: usize,
    count: usize,
    next_id: &mut u64,
    interrupts: &Option<Interrupts>,
) -> Result<Vec<Duration>, BenchError> {
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let cycles = count / concurrency + usize::from(worker < count % concurrency);
        let first = *next_id;
        *next_id += cycles as u64;
        let mut node = target.node.clone();
        let name = target.name.clone();
        let dir = target.kubelet_dir.join(format!(
            "pods/bench-{worker}/volumes/kubernetes.io~csi/data"
        ));
        let interrupts = interrupts.clone();
        workers.spawn(async move {
            // The kubelet makes the target's parent before NodePublishVolume (csi_mounter.go SetUpAt):
            // not part of the driver's round trip.
            std::fs::create_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
            let target = dir.join("mount").display().to_string();
            let mut samples = Vec::with_capacity(cycles);
            for n in first..first + cycles as u64 {
                if stop_if_interrupted(&interrupts).is_err() {
                    break;
                }
                let started = Instant::now();
                let id = format!("csi-{n:064x}");
                publish(&mut node, &id, &target, &format!("bench-{worker}"))
                    .await
                    .map_err(BenchError::rpc(format!("{name}: NodePublishVolume")))?;
                unpublish(&mut node, &id, &target)
                    .await
                    .map_err(BenchError::rpc(format!("{name}: NodeUnpublishVolume")))?;
                samples.push(started.elapsed());
            }
            Ok::<_, BenchError>(samples)
        });
    }
    let mut all = Vec::with_capacity(count);
    while let Some(done) = workers.join_next().await {
        all.extend(done.map_err(|e| BenchError::Output(e.to_string()))??);
    }
    Ok(all)
}

/// Publishes or unpublishes background volumes until `count` are published, 16 at a time, the newest
/// unpublished first, so that those published are always `0..target.background`: a signal between two
/// chunks (checked while publishing) leaves nothing the cleanup does not know of.
async fn set_background(
    target: &mut Target,
    count: usize,
    interrupts: &Option<Interrupts>,
) -> Result<(), BenchError> {
    let publishing = count > target.background;
    let range: Vec<usize> = if publishing {
        (target.background..count).collect()
    } else {
        (count..target.background).rev().collect()
    };
    for chunk in range.chunks(16) {
        if publishing {
            stop_if_interrupted(interrupts)?;
        }
        let mut calls = tokio::task::JoinSet::new();
        for &i in chunk {
            let mut node = target.node.clone();
            let (id, path) = background_volume(&target.kubelet_dir, i);
            calls.spawn(async move {
                let target = path.join("mount").display().to_string();
                if publishing {
                    std::fs::create_dir_all(&path).map_err(BenchError::io(path.display()))?;
                    publish(&mut node, &id, &target, "bench-background")
                        .await
                        .map_err(BenchError::rpc("background volume: NodePublishVolume"))
                } else {
                    unpublish(&mut node, &id, &target)
                        .await
                        .map_err(BenchError::rpc("background volume: NodeUnpublishVolume"))
                }
            });
        }
        // A publish is counted before its answer (one that failed is unpublished anyway, idempotent), an
        // unpublish after: what the cleanup unpublishes always covers what may be published. Every call
        // of the chunk is awaited before an error is returned.
        if publishing {
            target.background = chunk[chunk.len() - 1] + 1;
        }
        let mut failed = None;
        while let Some(done) = calls.join_next().await {
            let result = done
                .map_err(|e| BenchError::Output(e.to_string()))
                .and_then(|r| r);
            failed = failed.or(result.err());
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if !publishing {
            target.background = chunk[chunk.len() - 1];
        }
    }
    target.background = count;
    Ok(())
}

fn background_volume(kubelet_dir: &Path, i: usize) -> (String, PathBuf) {
    let id = format!("csi-bg{i:062x}");
    let dir = kubelet_dir.join(format!(
        "pods/bench-background/volumes/kubernetes.io~csi/v{i}"
    ));
    (id, dir)
}

/// NodePublishVolume of an inline ephemeral volume.
async fn publish(
    node: &mut NodeClient<Channel>,
    id: &str,
    target: &str,
    pod: &str,
) -> Result<(), tonic::Status> {
    let request = super::ephemeral_publish_request(id, target, pod, &[], false);
    node.node_publish_volume(request).await.map(drop)
}

async fn unpublish(
    node: &mut NodeClient<Channel>,
    id: &str,
    target: &str,
) -> Result<(), tonic::Status> {
    let request = csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.to_string(),
    };
    node.node_unpublish_volume(request).await.map(drop)
}
