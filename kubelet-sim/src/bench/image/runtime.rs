//! The image and the runtime of `bench image`: the image built with fresh content and pushed to the
//! private registry, the runtime it is pulled through, and the CRI calls timed or weighed on it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cri_fake::containerd::{ContainerdOptions, PrivateContainerd};
use cri_fake::layout::{BuiltImage, ImageBuilder, push};
use inlet_proto::runtime::v1 as cri;
use inlet_proto::runtime::v1::image_service_client::ImageServiceClient;
use tonic::transport::Channel;

use super::{FILE_BYTES, ImageConfig};
use crate::bench::error::BenchError;
use crate::bench::stats::Summary;
use crate::cri::{Cri, RuntimeServer, serve_fake, start_fake};
use crate::images::SimImages;

/// The runtime the image is pulled through.
pub(super) enum Runtime {
    Given,
    Containerd(PrivateContainerd),
    Fake(RuntimeServer),
}

/// Builds the image (fresh content, so the pull is cold) and pushes it.
pub(super) async fn build_and_push(
    config: &ImageConfig,
    registry: &str,
) -> Result<(String, BuiltImage, usize), BenchError> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut noise = Noise(seed);
    let per_layer = config.size.div_ceil(config.layers as u64) as usize;
    let mut builder = ImageBuilder::new();
    let mut files = 0;
    for layer in 0..config.layers {
        builder = builder.layer();
        let mut left = per_layer.min(config.size as usize - layer * per_layer);
        while left > 0 {
            let bytes = left.min(FILE_BYTES);
            builder = builder.file(&format!("data/{layer}/{files}.bin"), noise.bytes(bytes));
            files += 1;
            left -= bytes;
        }
    }
    eprintln!(
        "building a {}, {}-layer image of {files} files",
        inlet_host::quantity::format_bytes(config.size),
        config.layers
    );
    let built = tokio::task::spawn_blocking(move || builder.build())
        .await
        .map_err(|e| BenchError::Output(format!("building the image: {e}")))?
        .map_err(BenchError::io("building the image"))?;
    let image = format!("{registry}/bench/data:{seed:x}");
    let reference = image
        .parse()
        .map_err(|e| BenchError::Output(format!("{image}: {e}")))?;
    push(
        &built,
        &reference,
        &oci_client::secrets::RegistryAuth::Anonymous,
        &[registry.to_string()],
    )
    .await
    .map_err(|e| BenchError::Output(format!("pushing {image}: {e}")))?;
    Ok((image, built, files))
}

/// Incompressible bytes, cheaply (xorshift64).
pub(super) struct Noise(pub(super) u64);

impl Noise {
    pub(super) fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            out.extend_from_slice(&self.0.to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// The runtime the image is pulled through: `--cri`, else a private containerd (as root, when installed),
/// else the in-process cri-fake; and its socket.
pub(super) async fn start_runtime(
    config: &ImageConfig,
    registry: &str,
) -> Result<(Runtime, PathBuf), BenchError> {
    if let Some(socket) = &config.cri {
        return Ok((Runtime::Given, socket.clone()));
    }
    if PrivateContainerd::available() && nix::unistd::Uid::effective().is_root() {
        let options = ContainerdOptions {
            plain_http_registries: vec![registry.to_string()],
            ..Default::default()
        };
        let containerd = PrivateContainerd::launch(&config.root.join("containerd"), &options)
            .await
            .map_err(BenchError::io("containerd"))?;
        let socket = containerd.socket.clone();
        return Ok((Runtime::Containerd(containerd), socket));
    }
    eprintln!("no containerd here (or not root): pulling through the in-process cri-fake");
    let dir = config.root.join("cri-fake");
    let images = SimImages {
        insecure_registries: vec![registry.to_string()],
        ..Default::default()
    };
    let (socket, runtime) =
        start_fake(&dir, &images).map_err(|e| BenchError::Output(e.to_string()))?;
    let server = serve_fake(runtime, &socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((Runtime::Fake(server), socket))
}

/// Stops what [`start_runtime`] started.
pub(super) async fn stop_runtime(runtime: Runtime) {
    match runtime {
        Runtime::Given => {}
        Runtime::Containerd(containerd) => containerd.stop().await,
        Runtime::Fake((stop, task)) => {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

/// A CRI image reference.
pub(super) fn image_spec(image: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

/// PullImage through CRI, saying every few seconds that it goes on (a runtime reports no progress).
pub(super) async fn pull(
    images: &mut ImageServiceClient<Channel>,
    image: &str,
    bytes: u64,
) -> Result<Duration, BenchError> {
    eprintln!(
        "pulling {image} ({:.1} MiB compressed) through CRI",
        bytes as f64 / (1 << 20) as f64
    );
    let request = cri::PullImageRequest {
        image: image_spec(image),
        ..Default::default()
    };
    let started = Instant::now();
    let call = images.pull_image(request);
    tokio::pin!(call);
    let mut ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(5),
        Duration::from_secs(5),
    );
    let reply = loop {
        tokio::select! {
            reply = &mut call => break reply,
            _ = ticks.tick() => eprintln!("  still pulling ({:.0} s)", started.elapsed().as_secs_f64()),
        }
    };
    reply.map_err(BenchError::rpc(format!("pulling {image}")))?;
    let took = started.elapsed();
    eprintln!("pulled in {:.2} s", took.as_secs_f64());
    Ok(took)
}

/// 200 CRI ImageStatus calls for `image`.
pub(super) async fn image_status(
    images: &mut ImageServiceClient<Channel>,
    image: &str,
) -> Result<Summary, BenchError> {
    let mut samples = Vec::new();
    let started = Instant::now();
    for _ in 0..200 {
        let request = cri::ImageStatusRequest {
            image: image_spec(image),
            verbose: false,
        };
        let call = Instant::now();
        images
            .image_status(request)
            .await
            .map_err(BenchError::rpc(format!("ImageStatus {image}")))?;
        samples.push(call.elapsed());
    }
    Ok(Summary::of(&mut samples, started.elapsed()))
}

/// Removes the image from the runtime; whether it went.
pub(super) async fn remove_image(cri: &mut Cri, image: &str) -> bool {
    let request = cri::RemoveImageRequest {
        image: image_spec(image),
    };
    cri.image.remove_image(request).await.is_ok()
}

/// The filesystems whose used blocks count: the bench root's and the runtime's image filesystem.
pub(super) async fn filesystems(
    config: &ImageConfig,
    images: &mut ImageServiceClient<Channel>,
) -> Vec<PathBuf> {
    let mut paths = vec![config.root.clone()];
    if let Ok(info) = images.image_fs_info(cri::ImageFsInfoRequest {}).await {
        paths.extend(
            info.into_inner()
                .image_filesystems
                .iter()
                .filter_map(|fs| fs.fs_id.as_ref())
                .map(|id| PathBuf::from(&id.mountpoint))
                .filter(|p| p.exists()),
        );
    }
    paths
}

/// Bytes used on the filesystems holding `paths`, each counted once.
pub(super) fn used_bytes(paths: &[PathBuf]) -> i64 {
    let mut seen = Vec::new();
    let mut used = 0i64;
    for path in paths {
        let Ok(stat) = nix::sys::statvfs::statvfs(path) else {
            continue;
        };
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let device = std::os::unix::fs::MetadataExt::dev(&meta);
        if seen.contains(&device) {
            continue;
        }
        seen.push(device);
        used += ((stat.blocks() - stat.blocks_free()) * stat.fragment_size()) as i64;
    }
    used
}
