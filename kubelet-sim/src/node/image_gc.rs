//! The image garbage collector (`pkg/kubelet/images/image_gc_manager.go`): every five minutes, images
//! unused for longer than `--image-maximum-gc-age` are removed, then, when the image filesystem is fuller
//! than `--image-gc-high-threshold` percent, the least recently used unused images older than
//! `--image-minimum-gc-age` until it is down to `--image-gc-low-threshold`; afterwards the node's pull
//! records of images the runtime no longer has are pruned (`PruneUnknownRecords`, a post-GC hook).
//!
//! An image is in use while a container of the runtime runs it or mounts it as an image volume (the CRI
//! `Mount.image` its status reports, as `detectImages` reads it since 1.33), and, beyond upstream, while an
//! image volume mounted by inlet's engine holds it: the kubelet-side `kubernetes.io/image` plugin's and
//! the node's in-process image drivers' ([`VolumeImages`]). A real kubelet cannot see a CSI driver's image
//! volumes; kep/image-volumes-through-cri/README.md proposes how it could.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use inlet_image::Engine;
use inlet_proto::runtime::v1 as cri;
use parking_lot::Mutex;

use inlet_proto::csi_call::rpc_error;

use super::Kubelet;
use crate::metrics::METRICS;

/// How often the collector runs (`ImageGCPeriod`).
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// The kubelet's `ImageGCPolicy`, with its flags' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `--image-gc-high-threshold`: the image filesystem's use, in percent, that starts a collection
    /// (100 turns it off).
    pub high_threshold_percent: u8,
    /// `--image-gc-low-threshold`: the use it collects down to.
    pub low_threshold_percent: u8,
    /// `--image-minimum-gc-age`: an image detected more recently is never removed for space.
    pub minimum_gc_age: Duration,
    /// `--image-maximum-gc-age`: an image unused for longer is removed (zero: never).
    pub maximum_gc_age: Duration,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_gc_age: Duration::from_secs(120),
            maximum_gc_age: Duration::ZERO,
        }
    }
}

/// The collector's flags, as the kubelet names them (their KubeletConfiguration fields in brackets).
#[derive(Debug, Clone, clap::Args)]
pub struct ImageGcArgs {
    /// The image filesystem's use, in percent, that starts an image collection; 100 turns it off
    /// (imageGCHighThresholdPercent).
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_high_threshold: u8,
    /// The use, in percent, an image collection frees down to (imageGCLowThresholdPercent).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
    /// How long an image is kept, used or not, before it may be collected for space (imageMinimumGCAge).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub image_minimum_gc_age: Duration,
    /// How long an unused image is kept before it is collected; 0s keeps it (imageMaximumGCAge).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub image_maximum_gc_age: Duration,
}

impl ImageGcArgs {
    /// The policy, checked as the kubelet checks its configuration (`validation.go`).
    pub fn policy(&self) -> Result<ImageGcPolicy, String> {
        let (high, low) = (self.image_gc_high_threshold, self.image_gc_low_threshold);
        if low >= high {
            return Err(format!(
                "invalid configuration: imageGCLowThresholdPercent ({low}) must be less than imageGCHighThresholdPercent ({high})"
            ));
        }
        let (min, max) = (self.image_minimum_gc_age, self.image_maximum_gc_age);
        if !max.is_zero() && max <= min {
            return Err(format!(
                "invalid configuration: imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
                humantime::format_duration(max),
                humantime::format_duration(min)
            ));
        }
        Ok(ImageGcPolicy {
            high_threshold_percent: high,
            low_threshold_percent: low,
            minimum_gc_age: min,
            maximum_gc_age: max,
        })
    }
}

/// The engines whose image volumes keep their images in use: the node's kubelet-side image plugin and
/// its in-process image drivers. Held weakly: a stopped driver's engine holds nothing.
#[derive(Default)]
pub struct VolumeImages(Mutex<Vec<Weak<Engine>>>);

impl VolumeImages {
    /// Counts `engine`'s published volumes from now on.
    pub fn add(&self, engine: &Arc<Engine>) {
        self.0.lock().push(Arc::downgrade(engine));
    }

    /// The image ids held by a published volume.
    fn ids(&self) -> HashSet<String> {
        let mut engines = self.0.lock();
        engines.retain(|e| e.strong_count() > 0);
        engines
            .iter()
            .filter_map(Weak::upgrade)
            .flat_map(|e| e.volumes.published())
            .map(|v| v.image_id)
            .collect()
    }
}

/// What the collector knows of one image (`imageRecord`).
#[derive(Debug, Clone, Copy)]
struct ImageRecord {
    first_detected: Instant,
    /// None until a container or volume is seen using it (the zero time upstream).
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// One node's collector: its records of the runtime's images, and when it started (no image is removed
/// for its age before `maximum_gc_age` has passed since).
pub struct ImageGc {
    policy: ImageGcPolicy,
    began: Instant,
    records: Mutex<HashMap<String, ImageRecord>>,
    /// Image volumes beyond the runtime's containers.
    pub volume_images: VolumeImages,
}

/// What one collection did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// The ids of the images removed.
    pub removed: Vec<String>,
    /// Their sizes, summed.
    pub freed: u64,
    /// The pull records pruned afterwards.
    pub records_pruned: usize,
}

impl ImageGc {
    /// A collector with `policy`, starting now.
    pub fn new(policy: ImageGcPolicy) -> Self {
        Self {
            policy,
            began: Instant::now(),
            records: Mutex::default(),
            volume_images: VolumeImages::default(),
        }
    }
}

impl Kubelet {
    /// Counts the images of `engine`'s volumes (an in-process image driver's) as in use from now on.
    pub fn count_volume_images(&self, engine: &Arc<Engine>) {
        self.image_gc.volume_images.add(engine);
    }

    /// Runs the collector every [`IMAGE_GC_PERIOD`] from the node's start (`StartGarbageCollection`);
    /// a failure is logged, and a repeated one is the node's `ImageGCFailed` event. A high threshold of
    /// 100 without a maximum age turns it off, as upstream.
    pub(super) async fn collect_images_periodically(self: Arc<Self>) {
        let policy = self.image_gc.policy;
        if policy.high_threshold_percent == 100 && policy.maximum_gc_age.is_zero() {
            tracing::info!(node = %self.config.name, "ImageGCHighThresholdPercent is set 100 and ImageMaximumGCAge is 0, Disable image GC");
            return;
        }
        let mut failed_before = false;
        let mut ticks = tokio::time::interval(IMAGE_GC_PERIOD);
        loop {
            ticks.tick().await;
            match self.garbage_collect_images().await {
                Ok(_) => failed_before = false,
                Err(e) if failed_before => {
                    tracing::error!(node = %self.config.name, error = %e, "Image garbage collection failed multiple times in a row");
                    let node = &self.config.name;
                    self.api
                        .record_node_event(node, "Warning", "ImageGCFailed", &e);
                }
                Err(e) => {
                    tracing::error!(node = %self.config.name, error = %e, "Image garbage collection failed once");
                    failed_before = true;
                }
            }
        }
    }

    /// One collection (`GarbageCollect`): images past the maximum age, then space down to the low
    /// threshold, then the pull records of images that are gone. A removal that fails ends the collection
    /// with an error (the next one tries again), as upstream's `freeOldImages` and `freeSpace` do.
    pub async fn garbage_collect_images(&self) -> Result<Collected, String> {
        let gc = &self.image_gc;
        let free_time = Instant::now();
        let until = SystemTime::now();
        let in_use = self.images_in_use().await?;
        let images = self.list_images().await?;
        let mut collected = Collected::default();
        let mut candidates = gc.detect(&images, &in_use, free_time);
        let max_age = gc.policy.maximum_gc_age;
        // Not before the maximum age has passed since the kubelet started: an image it never saw used
        // would otherwise go at once.
        if !max_age.is_zero() && free_time.duration_since(gc.began) > max_age {
            let (old, young): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|(_, r)| {
                r.last_used
                    .is_none_or(|used| free_time.duration_since(used) > max_age)
            });
            let errors = self.remove_images(old, "age", &mut collected).await;
            if !errors.is_empty() {
                return Err(format!(
                    "wanted to free images older than {}, encountered errors in image deletion: {}",
                    humantime::format_duration(max_age),
                    errors.join(", ")
                ));
            }
            candidates = young;
        }
        let (capacity, available) = self.image_fs_space().await?;
        if capacity == 0 {
            let message = "invalid capacity 0 on image filesystem";
            let node = &self.config.name;
            self.api
                .record_node_event(node, "Warning", "InvalidDiskCapacity", message);
            return Err(message.into());
        }
        let available = available.min(capacity);
        let usage_percent = 100 - available * 100 / capacity;
        let mut short = None;
        if usage_percent >= u64::from(gc.policy.high_threshold_percent) {
            let low = u64::from(gc.policy.low_threshold_percent);
            let to_free = (capacity * (100 - low) / 100).saturating_sub(available);
            tracing::info!(node = %self.config.name, usage = usage_percent, amount_to_free = to_free,
                "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold");
            // `freeSpace`: least recently used first, none detected more recently than the minimum age.
            let mut chosen = Vec::new();
            let mut freeing = 0;
            for (id, record) in candidates {
                if freeing >= to_free {
                    break;
                }
                if free_time.duration_since(record.first_detected) >= gc.policy.minimum_gc_age {
                    freeing += record.size;
                    chosen.push((id, record));
                }
            }
            let before = collected.freed;
            let errors = self.remove_images(chosen, "space", &mut collected).await;
            if !errors.is_empty() {
                return Err(format!(
                    "wanted to free {to_free} bytes, but freed {} bytes space with errors in image deletion: {}",
                    collected.freed - before,
                    errors.join(", ")
                ));
            }
            let freed = collected.freed - before;
            if freed < to_free {
                short = Some(format!(
                    "Insufficient free disk space on the node's image filesystem ({usage_percent}% of {} used). Failed to free sufficient space by deleting unused images (freed {freed} bytes). Investigate disk usage, as it could be used by active images, logs, volumes, or other data.",
                    format_size(capacity)
                ));
            }
        }
        // The post-GC hook, after every collection (upstream: after one for space only, before its
        // shortfall is reported).
        let remaining: HashSet<String> = self
            .list_images()
            .await?
            .into_iter()
            .map(|i| i.id)
            .collect();
        collected.records_pruned = match self
            .images
            .puller()
            .prune_unknown_records(remaining, until)
            .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(node = %self.config.name, error = %e, "pruning the image pull records");
                0
            }
        };
        if let Some(message) = short {
            let node = &self.config.name;
            self.api
                .record_node_event(node, "Warning", "FreeDiskSpaceFailed", &message);
            return Err(message);
        }
        Ok(collected)
    }

    /// Removes `images` for `reason` (`age`, `space`); returns the errors of those that stay.
    async fn remove_images(
        &self,
        images: Vec<(String, ImageRecord)>,
        reason: &'static str,
        collected: &mut Collected,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        for (id, record) in images {
            match self.remove_image(&id).await {
                Ok(()) => {
                    METRICS.image_collected(reason);
                    collected.freed += record.size;
                    collected.removed.push(id);
                }
                Err(e) => errors.push(e),
            }
        }
        errors
    }

    /// The ids of images in use: run by a container, mounted by one as an image volume, or held by an
    /// engine's image volume.
    async fn images_in_use(&self) -> Result<HashSet<String>, String> {
        let mut runtime = self.cri.runtime.clone();
        let request = cri::ListContainersRequest { filter: None };
        let containers = runtime
            .list_containers(request)
            .await
            .map_err(|s| format!("failed to list containers: {}", s.message()))?
            .into_inner()
            .containers;
        let mut in_use = self.image_gc.volume_images.ids();
        for container in containers {
            // The image's id, as ListImages names it (`toKubeContainer`): CRI-O's `image_ref` is a
            // digested reference.
            in_use.insert(match container.image_id.is_empty() {
                true => container.image_ref.clone(),
                false => container.image_id.clone(),
            });
            let request = cri::ContainerStatusRequest {
                container_id: container.id.clone(),
                verbose: false,
            };
            let status = match runtime.container_status(request).await {
                Ok(status) => status.into_inner().status.unwrap_or_default(),
                // Removed since the list (a pod torn down meanwhile): it uses nothing any more.
                Err(s) if s.code() == tonic::Code::NotFound => continue,
                Err(s) => return Err(format!("get container status: {}", s.message())),
            };
            let mounted = status.mounts.into_iter().filter_map(|m| m.image);
            in_use.extend(mounted.map(|i| i.image));
        }
        Ok(in_use)
    }

    async fn list_images(&self) -> Result<Vec<cri::Image>, String> {
        let request = cri::ListImagesRequest { filter: None };
        Ok(self
            .cri
            .image
            .clone()
            .list_images(request)
            .await
            .map_err(|s| format!("failed to list images: {}", s.message()))?
            .into_inner()
            .images)
    }

    /// RemoveImage (`freeImage`).
    async fn remove_image(&self, id: &str) -> Result<(), String> {
        tracing::info!(node = %self.config.name, image_id = id, "Removing image to free bytes");
        let request = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: id.to_string(),
                ..Default::default()
            }),
        };
        self.cri
            .image
            .clone()
            .remove_image(request)
            .await
            .map_err(|s| rpc_error(&s))?;
        self.image_gc.records.lock().remove(id);
        Ok(())
    }

    /// The image filesystem's capacity and free bytes: the runtime's ImageFsInfo names its mountpoint,
    /// whose filesystem is asked (as cadvisor does for the kubelet).
    async fn image_fs_space(&self) -> Result<(u64, u64), String> {
        let info = self
            .cri
            .image
            .clone()
            .image_fs_info(cri::ImageFsInfoRequest {})
            .await
            .map_err(|s| format!("failed to get imageFs info: {}", s.message()))?
            .into_inner();
        let mountpoint = info
            .image_filesystems
            .first()
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| id.mountpoint.clone())
            .ok_or("failed to get imageFs info: no image filesystem")?;
        let stat =
            tokio::task::spawn_blocking(move || nix::sys::statvfs::statvfs(mountpoint.as_str()))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("failed to get imageFs info: {e}"))?;
        let block = stat.fragment_size();
        Ok((stat.blocks() * block, stat.blocks_available() * block))
    }
}

impl ImageGc {
    /// `detectImages`: records for new images, `last_used` now for those in use, none for images gone;
    /// returns the unused, unpinned ones, least recently used first (`imagesInEvictionOrder`).
    fn detect(
        &self,
        images: &[cri::Image],
        in_use: &HashSet<String>,
        now: Instant,
    ) -> Vec<(String, ImageRecord)> {
        let listed: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        let mut records = self.records.lock();
        records.retain(|id, _| listed.contains(id.as_str()));
        for image in images {
            let record = records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: None,
                size: image.size,
                pinned: image.pinned,
            });
            record.size = image.size;
            record.pinned = image.pinned;
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
        }
        let mut candidates: Vec<_> = records
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| (id.clone(), *r))
            .collect();
        candidates.sort_by_key(|(_, r)| (r.last_used, r.first_detected));
        candidates
    }
}

/// A size as the kubelet's GC message gives it (`formatSize`): GiB with one decimal.
fn format_size(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}
