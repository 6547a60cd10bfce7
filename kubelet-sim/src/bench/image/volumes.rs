//! The drivers under test in `bench image`: each started or dialed, its volumes published and unpublished
//! as the kubelet does inline ones, timed and weighed; and the copy baseline beside them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_proto::csi::v1::{self as csi, node_client::NodeClient};
use tonic::transport::Channel;

use super::runtime::{Noise, used_bytes};
use super::{CopyFigures, DiskByCount, DriverFigures, ImageConfig, WRITTEN};
use crate::bench::error::BenchError;
use crate::bench::stats::Summary;
use crate::bench::stop_if_interrupted;
use crate::drivers::{Driver, DriverArg, DriverHandle, DriverNode, DriverSource};
use crate::images::SimImages;

/// A driver under test, with the volumes it has published.
pub(super) struct Target {
    pub(super) name: String,
    node: NodeClient<Channel>,
    kubelet_dir: PathBuf,
    pub(super) handle: Option<DriverHandle>,
    pub(super) published: Vec<(String, PathBuf)>,
    /// Volumes made so far (names the next).
    made: usize,
}

/// A channel to a driver's socket.
async fn connect(socket: &Path) -> Result<Channel, BenchError> {
    inlet_proto::uds::connect(socket)
        .await
        .map_err(|source| BenchError::Dial {
            what: socket.display().to_string(),
            source,
        })
}

/// Starts (inlet's) or dials (an external) image driver for the bench's one node.
pub(super) async fn start_driver(
    config: &ImageConfig,
    driver: &DriverArg,
    socket: &Path,
    registry: &str,
) -> Result<Target, BenchError> {
    let kubelet_dir = config.root.join(&driver.name);
    if matches!(driver.source, DriverSource::Local { .. }) {
        return Err(BenchError::Usage(format!(
            "--driver {}=local: bench image measures image drivers (NAME=image or NAME=unix:///PATH)",
            driver.name
        )));
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
    let (endpoint, handle) = match driver.start(on).await? {
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
pub(super) async fn measure_drivers(
    config: &ImageConfig,
    targets: &mut [Target],
    image: &str,
    filesystems: &[PathBuf],
) -> Result<Vec<DriverFigures>, BenchError> {
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
            stop_if_interrupted(&config.interrupts)?;
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
        stop_if_interrupted(&config.interrupts)?;
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
        stop_if_interrupted(&config.interrupts)?;
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
fn next_volume(target: &mut Target) -> Result<(String, PathBuf), BenchError> {
    let n = target.made;
    target.made += 1;
    let id = format!("csi-{n:064x}");
    let path = target.kubelet_dir.join(format!(
        "pods/bench-{n}/volumes/kubernetes.io~csi/data/mount"
    ));
    let parent = path.parent().expect("a target has a parent");
    std::fs::create_dir_all(parent).map_err(BenchError::io(parent.display()))?;
    Ok((id, path))
}

/// Publishes the volume `(id, path)` of `image` as the kubelet does an inline ephemeral one; how long the
/// call took.
async fn publish(
    target: &mut Target,
    (id, path): (String, PathBuf),
    image: &str,
    readonly: bool,
) -> Result<Duration, BenchError> {
    let uid = path
        .ancestors()
        .nth(4)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target_path = path.display().to_string();
    let attributes = [("image", image)];
    let request =
        crate::bench::ephemeral_publish_request(&id, &target_path, &uid, &attributes, readonly);
    let started = Instant::now();
    target
        .node
        .node_publish_volume(request)
        .await
        .map_err(BenchError::rpc(format!(
            "{}: NodePublishVolume",
            target.name
        )))?;
    let took = started.elapsed();
    target.published.push((id, path));
    Ok(took)
}

/// Publishes the next volume of `image`; how long the call took.
pub(super) async fn publish_next(
    target: &mut Target,
    image: &str,
    readonly: bool,
) -> Result<Duration, BenchError> {
    let volume = next_volume(target)?;
    publish(target, volume, image, readonly).await
}

/// Unpublishes the volume `(id, path)`; how long the call took.
pub(super) async fn unpublish(
    target: &mut Target,
    id: &str,
    path: &Path,
) -> Result<Duration, BenchError> {
    let request = csi::NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: path.display().to_string(),
    };
    let started = Instant::now();
    target
        .node
        .node_unpublish_volume(request)
        .await
        .map_err(BenchError::rpc(format!(
            "{}: NodeUnpublishVolume",
            target.name
        )))?;
    let took = started.elapsed();
    // The kubelet removes the pod's dirs after a successful unpublish.
    if let Some(pod) = path.ancestors().nth(4) {
        let _ = std::fs::remove_dir_all(pod);
    }
    Ok(took)
}

/// Unpublishes whatever `target` still has published; whether all went.
pub(super) async fn unpublish_all(target: &mut Target) -> bool {
    let mut clean = true;
    while let Some((id, path)) = target.published.pop() {
        clean &= unpublish(target, &id, &path).await.is_ok();
    }
    clean
}

/// Writes `bytes` of incompressible data into the volume at `dir`, durably.
fn write_into(dir: &Path, bytes: u64) -> Result<(), BenchError> {
    use std::io::Write;
    let path = dir.join(WRITTEN);
    let mut file = std::fs::File::create(&path).map_err(BenchError::io(path.display()))?;
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut left = bytes as usize;
    while left > 0 {
        let chunk = noise.bytes(left.min(1 << 20));
        file.write_all(&chunk)
            .map_err(BenchError::io(path.display()))?;
        left -= chunk.len();
    }
    file.sync_all().map_err(BenchError::io(path.display()))
}

/// The baseline: `copies` copies of the image's files (read from a published read-only volume at
/// `source`), each into a directory of its own, timed, and removed after.
pub(super) fn copy_baseline(
    config: &ImageConfig,
    source: &Path,
    filesystems: &[PathBuf],
) -> Result<CopyFigures, BenchError> {
    eprintln!("copy baseline: {} copies", config.copies);
    let (mut samples, mut disk) = (Vec::new(), Vec::new());
    for i in 0..config.copies {
        let dir = config.root.join(format!("copies/{i}"));
        let before = used_bytes(filesystems);
        let started = Instant::now();
        copy_tree(source, &dir).map_err(BenchError::io(format!("copying {}", source.display())))?;
        samples.push(started.elapsed());
        disk.push(used_bytes(filesystems) - before);
        std::fs::remove_dir_all(&dir).map_err(BenchError::io(dir.display()))?;
    }
    let wall = samples.iter().sum();
    disk.sort_unstable();
    Ok(CopyFigures {
        copy: Summary::of(&mut samples.clone(), wall),
        disk_bytes_each: disk[disk.len() / 2],
        samples,
    })
}

/// True when `dir` has no entries (or cannot be read).
pub(super) fn is_empty(dir: &Path) -> bool {
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
