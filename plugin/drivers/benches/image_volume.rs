//! Warm image volumes through the image driver, as the kubelet drives it, over the real socket with
//! cri-fake as the runtime (its images in containers/storage's layout, read by the real backend):
//!
//! - the first read-only volume of an image already on the node (the shared view is mounted);
//! - each further read-only volume of it (a bind of the shared view), and its unpublish;
//! - a writable volume (its own overlay and upper dir), and its unpublish;
//! - the disk the state dir gains per further read-only volume.
//!
//! Real mounts when root, else the recording mounter (the figure then excludes mount(2)). Prints figures;
//! asserts no timing. Run: `cargo bench -p inlet-plugin --bench image_volume` (ITERATIONS, default 500;
//! LAYERS, default 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cri_fake::FakeRuntime;
use cri_fake::layout::ImageBuilder;
use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_image::{Engine, EngineConfig};
use inlet_plugin::image::{ImageDriverConfig, ImageService};
use inlet_plugin::server::serve_csi;
use inlet_proto::csi::v1::{self as csi, node_client::NodeClient};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run(env("ITERATIONS", 500), env("LAYERS", 5)));
}

async fn wait_for(socket: &std::path::Path) {
    while !socket.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn run(iterations: usize, layers: usize) {
    let dir = tempfile::tempdir().unwrap();
    let real = can_mount();
    let mounter: Arc<dyn MountLayer> = if real {
        Arc::new(LinuxMounter)
    } else {
        Arc::new(RecordingMounter::new())
    };
    let mut image = ImageBuilder::new();
    for layer in 0..layers {
        image = image.layer();
        for file in 0..20 {
            image = image.file(&format!("data/{layer}/{file}.txt"), vec![b'x'; 4096]);
        }
    }
    image
        .write_layout(&dir.path().join("layout"), "v1")
        .unwrap();
    let runtime = Arc::new(FakeRuntime::new(dir.path().join("cri"), Default::default()).unwrap());
    runtime
        .images()
        .import_layout(&dir.path().join("layout"), "bench.inlet.dev/data")
        .unwrap();
    let cri_socket = dir.path().join("cri.sock");
    let (stop_cri, cri_stopped) = tokio::sync::oneshot::channel::<()>();
    let (serving, socket) = (Arc::clone(&runtime), cri_socket.clone());
    tokio::spawn(async move {
        cri_fake::serve(&socket, serving, async { drop(cri_stopped.await) }).await
    });
    wait_for(&cri_socket).await;
    let state = dir.path().join("state");
    let engine = Engine::start(
        &EngineConfig::new(&cri_socket, &state),
        Arc::clone(&mounter),
    )
    .await
    .unwrap();
    let kubelet = dir.path().join("kubelet");
    let config = ImageDriverConfig {
        name: "image.inlet.dev".into(),
        node_id: "bench".into(),
        kubelet_dir: kubelet.clone(),
        state_dir: state.clone(),
        pull_wait: Duration::from_secs(100),
    };
    let csi_socket = dir.path().join("csi.sock");
    let (stop_csi, csi_stopped) = tokio::sync::oneshot::channel::<()>();
    let (service, socket) = (ImageService::new(config, engine), csi_socket.clone());
    tokio::spawn(async move {
        serve_csi(&socket, service, true, async { drop(csi_stopped.await) }).await
    });
    wait_for(&csi_socket).await;
    let mut node = NodeClient::new(inlet_proto::uds::connect(&csi_socket).await.unwrap());

    let request = |name: &str, readonly: bool| {
        let target = kubelet.join("pods").join(name).join("mount");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        csi::NodePublishVolumeRequest {
            volume_id: format!("csi-{name}"),
            target_path: target.display().to_string(),
            readonly,
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
            }),
            volume_context: [
                ("image".to_string(), "bench.inlet.dev/data:v1".to_string()),
                (
                    "csi.storage.k8s.io/ephemeral".to_string(),
                    "true".to_string(),
                ),
            ]
            .into(),
            ..Default::default()
        }
    };
    let unpublish = |r: &csi::NodePublishVolumeRequest| csi::NodeUnpublishVolumeRequest {
        volume_id: r.volume_id.clone(),
        target_path: r.target_path.clone(),
    };

    // The first volume mounts the shared view; it stays for the rest.
    let first = request("first", true);
    let started = Instant::now();
    node.node_publish_volume(first.clone()).await.unwrap();
    let first_ms = started.elapsed().as_secs_f64() * 1e3;
    let disk_before = disk_usage(&state);

    let (mut publish, mut unpub) = (Vec::new(), Vec::new());
    let mut kept = Vec::new();
    for i in 0..iterations {
        let r = request(&format!("ro-{i}"), true);
        let t = Instant::now();
        node.node_publish_volume(r.clone()).await.unwrap();
        publish.push(t.elapsed());
        kept.push(r);
    }
    let disk_after = disk_usage(&state);
    for r in &kept {
        let t = Instant::now();
        node.node_unpublish_volume(unpublish(r)).await.unwrap();
        unpub.push(t.elapsed());
    }
    let (mut rw_publish, mut rw_unpublish) = (Vec::new(), Vec::new());
    for i in 0..iterations.min(200) {
        let r = request(&format!("rw-{i}"), false);
        let t = Instant::now();
        node.node_publish_volume(r.clone()).await.unwrap();
        rw_publish.push(t.elapsed());
        let t = Instant::now();
        node.node_unpublish_volume(unpublish(&r)).await.unwrap();
        rw_unpublish.push(t.elapsed());
    }
    node.node_unpublish_volume(unpublish(&first)).await.unwrap();

    println!(
        "image volumes of a warm {layers}-layer image over the socket, {} mounts, {iterations} iterations",
        if real { "real" } else { "recorded (not root)" }
    );
    println!("  first read-only volume (mounts the shared view): {first_ms:.2} ms");
    report("  further read-only volume, NodePublish", &mut publish);
    report("  further read-only volume, NodeUnpublish", &mut unpub);
    report("  writable volume, NodePublish", &mut rw_publish);
    report("  writable volume, NodeUnpublish", &mut rw_unpublish);
    println!(
        "  state dir growth for {iterations} further read-only volumes: {} bytes ({:.0} bytes each: records)",
        disk_after.saturating_sub(disk_before),
        disk_after.saturating_sub(disk_before) as f64 / iterations as f64
    );
    let _ = (stop_csi.send(()), stop_cri.send(()));
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| ms(samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]);
    let mean = samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64;
    println!(
        "{what}: mean {mean:.2} ms, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        at(0.5),
        at(0.9),
        at(0.99)
    );
}

/// Bytes of the files under `dir` (what a volume costs on disk beyond the shared image).
fn disk_usage(dir: &std::path::Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}
