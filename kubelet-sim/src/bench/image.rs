//! `kubelet-sim bench image`: what an image volume costs, on a real runtime when there is one.
//!
//! The harness builds an image of the given size and layer count (incompressible files, new content every
//! run so the pull is cold), pushes it to a private `docker-registry`, and pulls it through the runtime's
//! CRI (containerd given with `--cri`, else a private containerd started here when installed, else the
//! in-process cri-fake). Then, for each driver, measured side by side:
//! - the first read-only volume (inlet mounts the image's shared view), and the disk the 1st, 2nd and 10th
//!   read-only volumes use;
//! - each further read-only volume's NodePublish with up to N published, and each NodeUnpublish;
//! - writable volumes' NodePublish + NodeUnpublish, and the disk a writable volume uses after X bytes
//!   are written into it.
//!
//! The baseline is what the first image-volume driver (kubernetes-csi/csi-driver-image-populator) amounts
//! to when each volume gets its own files: the image's files copied into a directory per volume.
//!
//! Disk is the growth of the used blocks (`statvfs`) of the filesystems holding the runtime's images and
//! the drivers' state, so it counts whatever a volume costs: snapshots, upper dirs, records, metadata.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cri_fake::FakeRuntime;
use cri_fake::containerd::{ContainerdOptions, PrivateContainerd};
use cri_fake::layout::{BuiltImage, ImageBuilder, push};
use cri_fake::pull::Registries;
use cri_fake::registry::LocalRegistry;
use inlet_host::mount::MountLayer;
use inlet_proto::csi::v1::{self as csi, node_client::NodeClient};
use inlet_proto::runtime::v1 as cri;
use inlet_proto::runtime::v1::image_service_client::ImageServiceClient;
use serde::Serialize;
use tonic::transport::Channel;

use super::stats::Summary;
use crate::cri::Cri;
use crate::cri::{RuntimeServer, serve_fake};
use crate::drivers::{Driver, DriverArg, DriverHandle, DriverNode, DriverSource};
use crate::images::SimImages;

/// How long a RuntimeService call may take (the kubelet's default `runtimeRequestTimeout`).
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(120);

/// The file written into a writable volume.
const WRITTEN: &str = "written.bin";

/// The files each layer is made of (the last one smaller).
const FILE_BYTES: usize = 256 << 10;

/// What to measure.
pub struct ImageConfig {
    /// The drivers: `NAME=image` (inlet's, started here) or `NAME=unix:///PATH` (any image driver taking
    /// the `image` volume attribute).
    pub drivers: Vec<DriverArg>,
    /// A CRI runtime's socket; without it a private containerd (or cri-fake) is started here.
    pub cri: Option<PathBuf>,
    /// The image's total file size.
    pub size: u64,
    /// Its layers.
    pub layers: usize,
    /// Further read-only volumes published per driver (kept published while measured).
    pub volumes: usize,
    /// Writable volume publish + unpublish cycles per driver.
    pub cycles: usize,
    /// Bytes written into a writable volume to see what it then uses.
    pub write: u64,
    /// Copies of the image made for the baseline.
    pub copies: usize,
    /// Where everything goes (target paths are under `<root>/<driver>/pods/`).
    pub root: PathBuf,
    /// The mount layer of drivers started here.
    pub mounter: Arc<dyn MountLayer>,
}

/// Every figure of a run.
#[derive(Debug, Serialize)]
pub struct ImageFigures {
    /// The runtime (`<name> <version>`, and whether it was started here).
    pub runtime: String,
    /// The image pulled.
    pub image: String,
    /// Its files' total size.
    pub size_bytes: u64,
    /// Its layers.
    pub layers: usize,
    /// Its files.
    pub files: usize,
    /// Its compressed layers' total size (what a pull downloads).
    pub compressed_bytes: u64,
    /// The cold pull through CRI (PullImage of an image the runtime has never seen).
    pub cold_pull_seconds: f64,
    /// One CRI ImageStatus of the image: the floor of a publish that checks the image is present (as the
    /// kubelet's IfNotPresent does and inlet's image driver does on every publish).
    pub image_status: Summary,
    /// Per driver.
    pub drivers: Vec<DriverFigures>,
    /// The baseline: the image's files copied into a directory per volume.
    pub copy: Option<CopyFigures>,
    /// Nothing was left: every volume unpublished, every driver started here with empty state, the image
    /// removed from the runtime.
    pub clean: bool,
}

/// One driver's figures.
#[derive(Debug, Serialize)]
pub struct DriverFigures {
    /// The driver.
    pub driver: String,
    /// The first read-only volume's NodePublish (the image already pulled).
    pub first_readonly_us: f64,
    /// Each further read-only volume's NodePublish, with up to `volumes` published.
    pub readonly_publish: Summary,
    /// The median of the first tenth of them, and of the last tenth (flat when the cost does not grow
    /// with the volumes published).
    pub readonly_publish_p50_first_tenth_us: f64,
    /// See `readonly_publish_p50_first_tenth_us`.
    pub readonly_publish_p50_last_tenth_us: f64,
    /// Their NodeUnpublish.
    pub readonly_unpublish: Summary,
    /// A writable volume's NodePublish.
    pub writable_publish: Summary,
    /// Its NodeUnpublish.
    pub writable_unpublish: Summary,
    /// Disk used once the 1st, 2nd and 10th read-only volumes are published.
    pub disk_readonly_bytes: DiskByCount,
    /// Disk a writable volume uses after `writable_written_bytes` are written into it.
    pub disk_writable_bytes: i64,
    /// What was written.
    pub writable_written_bytes: u64,
    /// The copy baseline's p50 over this driver's further read-only publish p50.
    pub speedup_over_copy: Option<f64>,
    /// Further read-only publishes, for the chart.
    #[serde(skip)]
    pub readonly_samples: Vec<Duration>,
    /// Writable publishes, for the chart.
    #[serde(skip)]
    pub writable_samples: Vec<Duration>,
}

/// Disk used after the 1st, 2nd and 10th volume, from before the first.
#[derive(Debug, Default, Serialize)]
pub struct DiskByCount {
    /// After the first.
    pub first: i64,
    /// After the second.
    pub second: i64,
    /// After the tenth.
    pub tenth: i64,
}

/// The copy baseline.
#[derive(Debug, Serialize)]
pub struct CopyFigures {
    /// One copy of the image's files.
    pub copy: Summary,
    /// Disk each copy uses.
    pub disk_bytes_each: i64,
    /// Every copy, for the chart.
    #[serde(skip)]
    pub samples: Vec<Duration>,
}

/// The runtime the image is pulled through.
enum Runtime {
    Given,
    Containerd(PrivateContainerd),
    Fake(RuntimeServer),
}

/// A driver under test, with the volumes it has published.
struct Target {
    name: String,
    node: NodeClient<Channel>,
    kubelet_dir: PathBuf,
    handle: Option<DriverHandle>,
    published: Vec<(String, PathBuf)>,
    /// Volumes made so far (names the next).
    made: usize,
}

/// Runs the whole bench; everything started is stopped and everything published unpublished.
pub async fn run(config: &ImageConfig) -> Result<ImageFigures, String> {
    if config.drivers.is_empty() {
        return Err("bench image needs a driver".into());
    }
    if config.size == 0 || config.layers == 0 || config.volumes == 0 || config.cycles == 0 {
        return Err("--size, --layers, --volumes and --cycles must be at least 1".into());
    }
    if !LocalRegistry::available() {
        return Err(format!(
            "bench image pulls from a private registry: {} is not installed (Debian: docker-registry)",
            cri_fake::registry::BINARY
        ));
    }
    std::fs::create_dir_all(&config.root).map_err(|e| format!("{}: {e}", config.root.display()))?;
    let registry = LocalRegistry::start(&config.root.join("registry"), None)
        .map_err(|e| format!("registry: {e}"))?;
    let (image, built, files) = build_and_push(config, &registry.address).await?;
    let (runtime, socket) = start_runtime(config, &registry.address).await?;
    let result = match Cri::connect(&socket, RUNTIME_TIMEOUT).await {
        Ok(mut cri) => {
            let result = measure(
                config,
                &registry.address,
                &socket,
                &mut cri,
                &image,
                &built,
                files,
            )
            .await;
            let removed = remove_image(&mut cri, &image).await;
            result.map(|figures| ImageFigures {
                clean: figures.clean && removed,
                ..figures
            })
        }
        Err(e) => Err(format!("{}: {e}", socket.display())),
    };
    stop_runtime(runtime).await;
    drop(registry);
    // What the run made under the root: the registry's and runtime's data are the image, twice over.
    let made = ["registry", "containerd", "cri-fake", "copies"].into_iter();
    for dir in made.chain(config.drivers.iter().map(|d| d.name.as_str())) {
        let _ = std::fs::remove_dir_all(config.root.join(dir));
    }
    result
}

/// Builds the image (fresh content, so the pull is cold) and pushes it.
async fn build_and_push(
    config: &ImageConfig,
    registry: &str,
) -> Result<(String, BuiltImage, usize), String> {
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
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("building the image: {e}"))?;
    let image = format!("{registry}/bench/data:{seed:x}");
    let reference = image.parse().map_err(|e| format!("{image}: {e}"))?;
    push(
        &built,
        &reference,
        &oci_client::secrets::RegistryAuth::Anonymous,
        &[registry.to_string()],
    )
    .await
    .map_err(|e| format!("pushing {image}: {e}"))?;
    Ok((image, built, files))
}

/// Incompressible bytes, cheaply (xorshift64).
struct Noise(u64);

impl Noise {
    fn bytes(&mut self, len: usize) -> Vec<u8> {
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

async fn start_runtime(config: &ImageConfig, registry: &str) -> Result<(Runtime, PathBuf), String> {
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
            .map_err(|e| format!("containerd: {e}"))?;
        let socket = containerd.socket.clone();
        return Ok((Runtime::Containerd(containerd), socket));
    }
    eprintln!("no containerd here (or not root): pulling through the in-process cri-fake");
    let dir = config.root.join("cri-fake");
    let registries = Registries {
        secure: Vec::new(),
        insecure: vec![registry.to_string()],
    };
    let runtime = FakeRuntime::with_registries(dir.clone(), Default::default(), registries)
        .map_err(|e| format!("cri-fake: {e}"))?;
    let socket = dir.join("cri.sock");
    let server = serve_fake(Arc::new(runtime), &socket);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((Runtime::Fake(server), socket))
}

async fn stop_runtime(runtime: Runtime) {
    match runtime {
        Runtime::Given => {}
        Runtime::Containerd(containerd) => containerd.stop().await,
        Runtime::Fake((stop, task)) => {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
}

async fn measure(
    config: &ImageConfig,
    registry: &str,
    socket: &Path,
    cri: &mut Cri,
    image: &str,
    built: &BuiltImage,
    files: usize,
) -> Result<ImageFigures, String> {
    let version = cri
        .runtime
        .version(cri::VersionRequest::default())
        .await
        .map_err(|s| format!("runtime: {}", s.message()))?
        .into_inner();
    let started_here = if config.cri.is_some() {
        ""
    } else {
        ", started here"
    };
    let runtime = format!(
        "{} {}{started_here}",
        version.runtime_name, version.runtime_version
    );
    let compressed_bytes: u64 = built.layers.iter().map(|l| l.len() as u64).sum();
    let cold = pull(&mut cri.image, image, compressed_bytes).await?;
    let image_status = image_status(&mut cri.image, image).await?;
    let filesystems = filesystems(config, &mut cri.image).await;

    let mut targets = Vec::new();
    for driver in &config.drivers {
        targets.push(start_driver(config, driver, socket, registry).await?);
    }
    let measured = measure_drivers(config, &mut targets, image, &filesystems).await;
    // The baseline copies what the first driver's first volume shows; it is taken before the volumes
    // go, and its error reported after.
    let copy = match &measured {
        Ok(_) if config.copies > 0 => match targets[0].published.first() {
            Some((_, source)) if is_empty(source) => {
                eprintln!(
                    "no copy baseline: the read-only volume shows no files (mounts were not real)"
                );
                Ok(None)
            }
            Some((_, source)) => copy_baseline(config, source, &filesystems).map(Some),
            None => Ok(None),
        },
        _ => Ok(None),
    };
    let mut clean = true;
    for target in &mut targets {
        clean &= unpublish_all(target).await;
        if let Some(handle) = target.handle.take() {
            let state = handle.image_state.clone();
            handle.stop().await;
            if let Some(state) = state {
                clean &= inlet_image::leftovers(&state).is_empty();
            }
        }
    }
    let (mut drivers, copy) = (measured?, copy?);
    if let Some(copy) = &copy {
        for figures in &mut drivers {
            figures.speedup_over_copy =
                Some(copy.copy.p50_us / figures.readonly_publish.p50_us.max(f64::EPSILON));
        }
    }
    Ok(ImageFigures {
        runtime,
        image: image.to_string(),
        size_bytes: config.size,
        layers: config.layers,
        files,
        compressed_bytes,
        cold_pull_seconds: cold.as_secs_f64(),
        image_status,
        drivers,
        copy,
        clean,
    })
}

/// A CRI image reference.
fn image_spec(image: &str) -> Option<cri::ImageSpec> {
    Some(cri::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

async fn connect(socket: &Path) -> Result<Channel, String> {
    inlet_proto::uds::connect(socket)
        .await
        .map_err(|e| format!("{}: {e}", socket.display()))
}

/// PullImage through CRI, saying every few seconds that it goes on (a runtime reports no progress).
async fn pull(
    images: &mut ImageServiceClient<Channel>,
    image: &str,
    bytes: u64,
) -> Result<Duration, String> {
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
    reply.map_err(|s| format!("pulling {image}: {}", s.message()))?;
    let took = started.elapsed();
    eprintln!("pulled in {:.2} s", took.as_secs_f64());
    Ok(took)
}

/// 200 CRI ImageStatus calls for `image`.
async fn image_status(
    images: &mut ImageServiceClient<Channel>,
    image: &str,
) -> Result<Summary, String> {
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
            .map_err(|s| format!("ImageStatus {image}: {}", s.message()))?;
        samples.push(call.elapsed());
    }
    Ok(Summary::of(&mut samples, started.elapsed()))
}

/// Removes the image from the runtime; whether it went.
async fn remove_image(cri: &mut Cri, image: &str) -> bool {
    let request = cri::RemoveImageRequest {
        image: image_spec(image),
    };
    cri.image.remove_image(request).await.is_ok()
}

/// The filesystems whose used blocks count: the bench root's and the runtime's image filesystem.
async fn filesystems(
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
fn used_bytes(paths: &[PathBuf]) -> i64 {
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

async fn start_driver(
    config: &ImageConfig,
    driver: &DriverArg,
    socket: &Path,
    registry: &str,
) -> Result<Target, String> {
    let kubelet_dir = config.root.join(&driver.name);
    if matches!(driver.source, DriverSource::Local { .. }) {
        return Err(format!(
            "--driver {}=local: bench image measures image drivers (NAME=image or NAME=unix:///PATH)",
            driver.name
        ));
    }
    let images = SimImages {
        insecure_registries: vec![registry.to_string()],
        ..Default::default()
    };
    let on = DriverNode {
        node: "bench",
        node_root: &kubelet_dir,
        cri_socket: socket,
        images: &images,
        mounter: Arc::clone(&config.mounter),
    };
    let (endpoint, handle) = match driver.start(on).await.map_err(|e| e.to_string())? {
        Driver::InProcess(handle) => (handle.socket.clone(), Some(handle)),
        Driver::External(socket) => (socket, None),
    };
    Ok(Target {
        name: driver.name.clone(),
        node: NodeClient::new(connect(&endpoint).await?),
        kubelet_dir,
        handle,
        published: Vec::new(),
        made: 0,
    })
}

/// The drivers' figures: disk per driver in turn (so each is attributed), latencies interleaved.
async fn measure_drivers(
    config: &ImageConfig,
    targets: &mut [Target],
    image: &str,
    filesystems: &[PathBuf],
) -> Result<Vec<DriverFigures>, String> {
    let mut firsts = Vec::new();
    for target in targets.iter_mut() {
        eprintln!("{}: first read-only volumes", target.name);
        let volumes = (0..10)
            .map(|_| next_volume(target))
            .collect::<Result<Vec<_>, _>>()?;
        let before = used_bytes(filesystems);
        let mut disk = DiskByCount::default();
        let mut first = Duration::ZERO;
        for (count, volume) in (1..).zip(volumes) {
            let took = publish(target, volume, image, true).await?;
            match count {
                1 => (first, disk.first) = (took, used_bytes(filesystems) - before),
                2 => disk.second = used_bytes(filesystems) - before,
                10 => disk.tenth = used_bytes(filesystems) - before,
                _ => {}
            }
        }
        let volume = next_volume(target)?;
        let before = used_bytes(filesystems);
        publish(target, volume, image, false).await?;
        let (id, path) = target.published.pop().expect("published above");
        write_into(&path, config.write)?;
        let writable_disk = used_bytes(filesystems) - before;
        // Gone with the volume anyway; removed so that a fake mount's target dir is left empty too.
        let _ = std::fs::remove_file(path.join(WRITTEN));
        unpublish(target, &id, &path).await?;
        firsts.push((first, disk, writable_disk));
    }

    eprintln!("further read-only volumes: {} per driver", config.volumes);
    let n = targets.len();
    let (mut publishes, mut walls) = (vec![Vec::new(); n], vec![Duration::ZERO; n]);
    for _ in 0..config.volumes {
        for (i, target) in targets.iter_mut().enumerate() {
            let took = publish_next(target, image, true).await?;
            publishes[i].push(took);
            walls[i] += took;
        }
    }
    let mut unpublishes = vec![Vec::new(); n];
    // Unpublish the further volumes, newest first; the first ten stay (the copy baseline reads the first).
    for _ in 0..config.volumes {
        for (i, target) in targets.iter_mut().enumerate() {
            let (id, path) = target.published.pop().expect("published above");
            unpublishes[i].push(unpublish(target, &id, &path).await?);
        }
    }
    eprintln!("writable volumes: {} cycles per driver", config.cycles);
    let (mut rw_publish, mut rw_unpublish) = (vec![Vec::new(); n], vec![Vec::new(); n]);
    for _ in 0..config.cycles {
        for (i, target) in targets.iter_mut().enumerate() {
            rw_publish[i].push(publish_next(target, image, false).await?);
            let (id, path) = target.published.pop().expect("published above");
            rw_unpublish[i].push(unpublish(target, &id, &path).await?);
        }
    }
    let mut figures = Vec::new();
    for (i, (target, (first, disk, writable_disk))) in targets.iter().zip(firsts).enumerate() {
        let tenth = (publishes[i].len() / 10).max(1);
        let p50 = |samples: &[Duration]| Summary::of(&mut samples.to_vec(), Duration::ZERO).p50_us;
        let first_tenth = p50(&publishes[i][..tenth]);
        let last_tenth = p50(&publishes[i][publishes[i].len().saturating_sub(tenth)..]);
        let readonly_samples = publishes[i].clone();
        let writable_samples = rw_publish[i].clone();
        let rw_wall = rw_publish[i].iter().chain(&rw_unpublish[i]).sum();
        let unpublish_wall = unpublishes[i].iter().sum();
        figures.push(DriverFigures {
            driver: target.name.clone(),
            first_readonly_us: first.as_secs_f64() * 1e6,
            readonly_publish: Summary::of(&mut publishes[i], walls[i]),
            readonly_publish_p50_first_tenth_us: first_tenth,
            readonly_publish_p50_last_tenth_us: last_tenth,
            readonly_unpublish: Summary::of(&mut unpublishes[i], unpublish_wall),
            writable_publish: Summary::of(&mut rw_publish[i], rw_wall),
            writable_unpublish: Summary::of(&mut rw_unpublish[i], rw_wall),
            disk_readonly_bytes: disk,
            disk_writable_bytes: writable_disk,
            writable_written_bytes: config.write,
            speedup_over_copy: None,
            readonly_samples,
            writable_samples,
        });
    }
    Ok(figures)
}

/// The next volume's id and target path, its parent made as the kubelet makes it before NodePublish
/// (outside what is timed or weighed).
fn next_volume(target: &mut Target) -> Result<(String, PathBuf), String> {
    let n = target.made;
    target.made += 1;
    let id = format!("csi-{n:064x}");
    let path = target.kubelet_dir.join(format!(
        "pods/bench-{n}/volumes/kubernetes.io~csi/data/mount"
    ));
    let parent = path.parent().expect("a target has a parent");
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    Ok((id, path))
}

/// Publishes the volume `(id, path)` of `image` as the kubelet does an inline ephemeral one; how long the
/// call took.
async fn publish(
    target: &mut Target,
    (id, path): (String, PathBuf),
    image: &str,
    readonly: bool,
) -> Result<Duration, String> {
    let uid = path
        .ancestors()
        .nth(4)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target_path = path.display().to_string();
    let attributes = [("image", image)];
    let request = super::ephemeral_publish_request(&id, &target_path, &uid, &attributes, readonly);
    let started = Instant::now();
    target
        .node
        .node_publish_volume(request)
        .await
        .map_err(|s| failed(&target.name, &s))?;
    let took = started.elapsed();
    target.published.push((id, path));
    Ok(took)
}

/// Publishes the next volume of `image`; how long the call took.
async fn publish_next(
    target: &mut Target,
    image: &str,
    readonly: bool,
) -> Result<Duration, String> {
    let volume = next_volume(target)?;
    publish(target, volume, image, readonly).await
}

/// Unpublishes the volume `(id, path)`; how long the call took.
async fn unpublish(target: &mut Target, id: &str, path: &Path) -> Result<Duration, String> {
    let request = csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: path.display().to_string(),
    };
    let started = Instant::now();
    target
        .node
        .node_unpublish_volume(request)
        .await
        .map_err(|s| failed(&target.name, &s))?;
    let took = started.elapsed();
    // The kubelet removes the pod's dirs after a successful unpublish.
    if let Some(pod) = path.ancestors().nth(4) {
        let _ = std::fs::remove_dir_all(pod);
    }
    Ok(took)
}

/// A driver's failed call, as the bench reports it.
fn failed(driver: &str, status: &tonic::Status) -> String {
    format!("{driver}: {}", inlet_proto::csi_call::rpc_error(status))
}

/// Unpublishes whatever `target` still has published; whether all went.
async fn unpublish_all(target: &mut Target) -> bool {
    let mut clean = true;
    while let Some((id, path)) = target.published.pop() {
        clean &= unpublish(target, &id, &path).await.is_ok();
    }
    clean
}

/// Writes `bytes` of incompressible data into the volume at `dir`, durably.
fn write_into(dir: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let path = dir.join(WRITTEN);
    let mut file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut left = bytes as usize;
    while left > 0 {
        let chunk = noise.bytes(left.min(1 << 20));
        file.write_all(&chunk)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        left -= chunk.len();
    }
    file.sync_all()
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The baseline: `copies` copies of the image's files (read from a published read-only volume at
/// `source`), each into a directory of its own, timed, and removed after.
fn copy_baseline(
    config: &ImageConfig,
    source: &Path,
    filesystems: &[PathBuf],
) -> Result<CopyFigures, String> {
    eprintln!("copy baseline: {} copies", config.copies);
    let (mut samples, mut disk) = (Vec::new(), Vec::new());
    for i in 0..config.copies {
        let dir = config.root.join(format!("copies/{i}"));
        let before = used_bytes(filesystems);
        let started = Instant::now();
        copy_tree(source, &dir).map_err(|e| format!("copying {}: {e}", source.display()))?;
        samples.push(started.elapsed());
        disk.push(used_bytes(filesystems) - before);
        std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let wall = samples.iter().sum();
    disk.sort_unstable();
    Ok(CopyFigures {
        copy: Summary::of(&mut samples.clone(), wall),
        disk_bytes_each: disk[disk.len() / 2],
        samples,
    })
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map_or(true, |mut entries| entries.next().is_none())
}

/// Copies the files, directories and symlinks under `from` into `to`.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in walkdir::WalkDir::new(from).same_file_system(true) {
        let entry = entry.map_err(std::io::Error::other)?;
        let dest = to.join(
            entry
                .path()
                .strip_prefix(from)
                .map_err(std::io::Error::other)?,
        );
        let kind = entry.file_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&dest)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &dest)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &dest)?;
        }
    }
    Ok(())
}
