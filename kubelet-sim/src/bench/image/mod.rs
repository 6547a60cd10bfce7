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

mod churn;
mod runtime;
mod volumes;

pub use churn::ChurnFigures;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cri_fake::layout::BuiltImage;
use cri_fake::registry::LocalRegistry;
use inlet_host::mount::MountLayer;
use inlet_proto::runtime::v1 as cri;
use serde::Serialize;

use super::error::BenchError;
use super::stats::Summary;
use crate::cri::Cri;
use crate::drivers::DriverArg;
use crate::signals::Interrupts;
use runtime::{
    build_and_push, filesystems, image_status, pull, remove_image, start_runtime, stop_runtime,
};
use volumes::{copy_baseline, is_empty, measure_drivers, start_driver, unpublish_all};

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
    /// `--churn`: how long read-only volumes are churned while the image is removed (zero: not at all).
    pub churn: Duration,
    /// `--churn-period`: a publish and an unpublish per driver this often.
    pub churn_period: Duration,
    /// Where everything goes (target paths are under `<root>/<driver>/pods/`).
    pub root: PathBuf,
    /// The mount layer of drivers started here.
    pub mounter: Arc<dyn MountLayer>,
    /// SIGINT/SIGTERM: the bench stops, undoes what it made, and fails with the signal.
    pub interrupts: Option<Interrupts>,
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
    /// `--churn`'s run, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn: Option<ChurnFigures>,
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

/// Runs the whole bench; everything started is stopped and everything published unpublished.
pub async fn run(config: &ImageConfig) -> Result<ImageFigures, BenchError> {
    if config.drivers.is_empty() {
        return Err(BenchError::Usage("bench image needs a driver".into()));
    }
    if config.size == 0 || config.layers == 0 || config.volumes == 0 || config.cycles == 0 {
        return Err(BenchError::Usage(
            "--size, --layers, --volumes and --cycles must be at least 1".into(),
        ));
    }
    if !LocalRegistry::available() {
        return Err(BenchError::Usage(format!(
            "bench image pulls from a private registry: {} is not installed (Debian: docker-registry)",
            cri_fake::registry::BINARY
        )));
    }
    std::fs::create_dir_all(&config.root).map_err(BenchError::io(config.root.display()))?;
    let registry = LocalRegistry::start(&config.root.join("registry"), None)
        .map_err(BenchError::io("registry"))?;
    let (image, built, files) = build_and_push(config, &registry.address).await?;
    super::stop_if_interrupted(&config.interrupts)?;
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
        Err(source) => Err(BenchError::Dial {
            what: socket.display().to_string(),
            source,
        }),
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

async fn measure(
    config: &ImageConfig,
    registry: &str,
    socket: &Path,
    cri: &mut Cri,
    image: &str,
    built: &BuiltImage,
    files: usize,
) -> Result<ImageFigures, BenchError> {
    let version = cri
        .runtime
        .version(cri::VersionRequest::default())
        .await
        .map_err(BenchError::rpc("runtime"))?
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
    super::stop_if_interrupted(&config.interrupts)?;
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
    // The churn runs once the figures are taken, with their volumes still published beside it.
    let churned = match (&measured, config.churn.is_zero()) {
        (Ok(_), false) => Some(
            churn::churn(
                &mut targets,
                cri,
                image,
                config.churn,
                config.churn_period,
                &config.interrupts,
            )
            .await,
        ),
        _ => None,
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
    let churn = churned.transpose()?;
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
        churn,
        clean,
    })
}
