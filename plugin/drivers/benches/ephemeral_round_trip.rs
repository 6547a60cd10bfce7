//! Ephemeral inline volume round trip, as the kubelet drives it: NodePublishVolume (create + bind mount) then
//! NodeUnpublishVolume (unmount + delete), over the real unix socket. Real mounts when root, else the
//! recording mounter (the figure then excludes mount(2)). Prints figures; asserts no timing.
//!
//! Run: `cargo bench -p inlet-plugin --bench ephemeral_round_trip` (ITERATIONS env var, default 2000).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};
use inlet_plugin::server::serve_csi;
use inlet_proto::csi::v1::{self as csi, node_client::NodeClient};

fn main() {
    let iterations: usize = std::env::var("ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(iterations));
}

async fn run(iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    let real = can_mount();
    let mounter: Arc<dyn MountLayer> = if real {
        Arc::new(LinuxMounter)
    } else {
        Arc::new(RecordingMounter::new())
    };
    let config = LocalConfig {
        name: "local.inlet.dev".into(),
        node_id: "bench".into(),
        state_dir: dir.path().join("state"),
        kubelet_dir: dir.path().join("kubelet"),
        capacity_bytes: 1 << 40,
        max_volume_bytes: 1 << 30,
        default_volume_bytes: 1 << 20,
        enable_attach: false,
        ephemeral_default: false,
        volume_mount_group: false,
    };
    let socket = dir.path().join("csi.sock");
    let service = LocalService::new(LocalDriver::open(config, mounter).unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serve_socket = socket.clone();
    let server = tokio::spawn(async move {
        serve_csi(&serve_socket, service, true, async { drop(stopped.await) }).await
    });
    let channel = loop {
        match inlet_proto::uds::connect(&socket).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    let mut node = NodeClient::new(channel);
    let capability = csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    };
    let context: HashMap<String, String> = [(
        "csi.storage.k8s.io/ephemeral".to_string(),
        "true".to_string(),
    )]
    .into();

    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + 100 {
        let id = format!("csi-{i:064x}");
        // The kubelet creates the volume's parent dir before NodePublishVolume (csi_mounter.go SetUpAt),
        // so that is not part of the driver's round trip.
        let parent = dir
            .path()
            .join(format!("kubelet/pods/{i}/volumes/kubernetes.io~csi/v"));
        std::fs::create_dir_all(&parent).unwrap();
        let target = parent.join("mount").display().to_string();
        let start = Instant::now();
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.clone(),
            volume_capability: Some(capability.clone()),
            volume_context: context.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id,
            target_path: target,
        })
        .await
        .unwrap();
        if i >= 100 {
            samples.push(start.elapsed()); // the first 100 warm up connections and caches
        }
    }
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();

    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "ephemeral publish+unpublish round trip ({} mounts, {iterations} iterations): mean {:?}, p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        if real { "real" } else { "recorded" },
        mean,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        samples[samples.len() - 1]
    );
}
