//! `kubelet-sim bench`: figures any driver author can reproduce, printed as a table and written as JSON
//! (with the machine and the command) and as an SVG chart of the latency distributions.
//!
//! # Layout
//! - [`csi_ephemeral`]: NodePublish + NodeUnpublish round trips of inline ephemeral volumes against any
//!   CSI endpoints side by side, at each concurrency, with N other volumes published.
//! - [`pods`]: N pods with K inline volumes over M simulated nodes: settle, start latency, teardown, memory.
//! - [`pods_cluster`]: the same pods on a real cluster's hollow nodes (`--kubeconfig`), with the API
//!   server's share read from its `/metrics`.
//! - [`image`]: image volumes on a real runtime: cold pull, warm read-only and writable publishes, disk
//!   per volume, beside copying the image's files.
//! - [`hollow`]: hollow nodes on a real cluster, idle and churning; `hollow_fleet.rs` runs them in this
//!   process or over child processes.
//! - `stats.rs`: percentiles; `chart.rs`: the SVG; `error.rs`: [`BenchError`].

mod chart;
pub mod csi_ephemeral;
mod error;
pub mod hollow;
mod hollow_fleet;
pub mod image;
pub mod pods;
pub mod pods_cluster;
mod stats;

use std::io::Write;
use std::time::Duration;

use inlet_proto::csi::v1::{NodePublishVolumeRequest, VolumeCapability, volume_capability};
use serde::Serialize;

pub use chart::cdf_svg;
pub use error::BenchError;
pub(crate) use error::or_interrupted;
pub(crate) use error::stop_if_interrupted;
pub use hollow_fleet::FleetConfig;
pub use stats::{Summary, peak_rss_mib};

/// Where figures were taken.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs the process may use.
    pub cpus: usize,
    /// The kernel (`uname -r`).
    pub kernel: String,
    /// When (RFC 3339, UTC).
    pub date: String,
    /// Whether mounts were real.
    pub real_mounts: bool,
}

impl Machine {
    /// This machine, now.
    pub fn here(real_mounts: bool) -> Self {
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: nix::sys::utsname::uname()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            real_mounts,
        }
    }
}

/// A bench's JSON: the machine, the command, the figures.
#[derive(Debug, Serialize)]
pub struct Results<T: Serialize> {
    /// Where.
    pub machine: Machine,
    /// The command line.
    pub command: String,
    /// The figures.
    pub figures: T,
}

/// NodePublishVolume as the kubelet sends it for an inline ephemeral volume of the pod whose name and UID
/// are `pod`, with podInfoOnMount, and the volume source's `attributes`.
/// The simulation a bench runs: `nodes` with `driver` each, the in-process cri-fake, the kubelet's
/// defaults, on `cluster` when given (else the embedded API).
fn sim_config(
    root: &std::path::Path,
    nodes: usize,
    driver: &crate::drivers::DriverArg,
    mounter: &std::sync::Arc<dyn inlet_host::mount::MountLayer>,
    node_name_prefix: &str,
    cluster: Option<kube::Client>,
) -> crate::sim::SimConfig {
    crate::sim::SimConfig {
        root: root.to_path_buf(),
        nodes,
        drivers: vec![driver.clone()],
        cri: None,
        gates: crate::sim::default_gates(),
        selinux: false,
        allowed_inline_drivers: None,
        backoff: crate::node::BackoffPolicy::default(),
        volume_wait_timeout: Duration::from_secs(123),
        csi_timeout: inlet_volume::csi::CSI_TIMEOUT,
        republish_period: Duration::from_secs(60),
        volume_stats_agg_period: Duration::from_secs(60),
        containers: Default::default(),
        mounter: std::sync::Arc::clone(mounter),
        images: Default::default(),
        plugins_registry: None,
        node_name_prefix: node_name_prefix.into(),
        cluster,
    }
}

fn ephemeral_publish_request(
    id: &str,
    target: &str,
    pod: &str,
    attributes: &[(&str, &str)],
    readonly: bool,
) -> NodePublishVolumeRequest {
    let pod_info = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", pod),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", pod),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ];
    NodePublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.to_string(),
        readonly,
        volume_capability: Some(VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(volume_capability::AccessType::Mount(Default::default())),
        }),
        volume_context: attributes
            .iter()
            .chain(&pod_info)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

/// Prints csi-ephemeral figures as a table.
pub fn print_ephemeral(
    out: &mut impl Write,
    figures: &[csi_ephemeral::EphemeralFigure],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:>5} {:>9} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "DRIVER", "CONC", "PUBLISHED", "CYCLES", "CYCLES/S", "P50", "P90", "P99", "MAX"
    )?;
    for f in figures {
        let s = &f.summary;
        writeln!(
            out,
            "{:<24} {:>5} {:>9} {:>8} {:>10.0} {:>9} {:>9} {:>9} {:>9}",
            f.driver,
            f.concurrency,
            f.published,
            s.samples,
            s.per_second,
            show(s.p50_us),
            show(s.p90_us),
            show(s.p99_us),
            show(s.max_us)
        )?;
    }
    Ok(())
}

/// How a pods run ended.
fn running(settled: bool) -> &'static str {
    match settled {
        true => "all running",
        false => "NOT all running",
    }
}

/// Prints a pods run's figures.
pub fn print_pods(out: &mut impl Write, f: &pods::PodsFigures) -> std::io::Result<()> {
    writeln!(
        out,
        "{} pods x {} inline volumes over {} nodes ({}): {} in {:.2} s; pod start p50 {} p99 {}; torn down in {:.2} s ({}); peak RSS {} MiB ({} MiB until settled); {} CSI calls",
        f.pods,
        f.volumes,
        f.nodes,
        f.driver,
        running(f.settled),
        f.settle_seconds,
        show(f.pod_start.p50_us),
        show(f.pod_start.p99_us),
        f.teardown_seconds,
        if f.teardown_clean {
            "nothing left"
        } else {
            "something left"
        },
        f.peak_rss_mib,
        f.settled_peak_rss_mib,
        f.csi_calls
    )
}

/// Prints the figures of a pods run on a real cluster.
pub fn print_cluster_pods(
    out: &mut impl Write,
    f: &pods_cluster::ClusterPodsFigures,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{} pods x {} inline volumes over {} hollow nodes in {} process(es) ({}): nodes Ready in {:.1} s; pods created in {:.1} s, {} in {:.1} s; pod start p50 {} p99 {}; deleted in {:.1} s; API server {:.1} CPU s over {:.0} requests ({:.1} s inside it); nodes {:.1} CPU s; peak RSS {} MiB",
        f.pods,
        f.volumes,
        f.nodes,
        f.processes,
        f.driver,
        f.register_seconds,
        f.create_seconds,
        running(f.settled),
        f.settle_seconds,
        show(f.pod_start.p50_us),
        show(f.pod_start.p99_us),
        f.teardown_seconds,
        f.api_server.cpu_seconds,
        f.api_server.requests,
        f.api_server.request_seconds,
        f.nodes_cpu_seconds,
        f.peak_rss_mib
    )
}

/// Prints a hollow-node run's figures.
pub fn print_hollow(out: &mut impl Write, f: &hollow::HollowFigures) -> std::io::Result<()> {
    writeln!(
        out,
        "{} hollow nodes in {} process(es): Ready in {:.1} s; idle {:.2} MiB and {:.2} millicores per node (baseline {:.1} MiB); churn of {} x {} pods: {:.1} pods/s, {:.2} millicores per node; peak RSS {} MiB",
        f.nodes,
        f.processes,
        f.register_seconds,
        f.idle_rss_per_node_mib,
        f.idle_cpu_per_node_millicores,
        f.baseline_rss_mib,
        f.churn_rounds,
        f.churn_pods,
        f.churn_pods_per_second,
        f.churn_cpu_per_node_millicores,
        f.peak_rss_mib
    )
}

/// Prints an image run's figures.
pub fn print_image(out: &mut impl Write, f: &image::ImageFigures) -> std::io::Result<()> {
    writeln!(
        out,
        "{} ({} files, {} layers, {:.1} MiB compressed) on {}: cold pull through CRI {:.2} s; ImageStatus p50 {}",
        f.image,
        f.files,
        f.layers,
        f.compressed_bytes as f64 / (1 << 20) as f64,
        f.runtime,
        f.cold_pull_seconds,
        show(f.image_status.p50_us)
    )?;
    writeln!(
        out,
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>12}",
        "DRIVER",
        "FIRST RO",
        "RO P50",
        "RO P99",
        "RO 1/10",
        "RO 10/10",
        "RW P50",
        "DISK 1ST",
        "DISK 2ND",
        "DISK 10TH",
        "RW DISK"
    )?;
    for d in &f.drivers {
        writeln!(
            out,
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>12}",
            d.driver,
            show(d.first_readonly_us),
            show(d.readonly_publish.p50_us),
            show(d.readonly_publish.p99_us),
            show(d.readonly_publish_p50_first_tenth_us),
            show(d.readonly_publish_p50_last_tenth_us),
            show(d.writable_publish.p50_us),
            d.disk_readonly_bytes.first,
            d.disk_readonly_bytes.second,
            d.disk_readonly_bytes.tenth,
            d.disk_writable_bytes
        )?;
    }
    if let Some(copy) = &f.copy {
        writeln!(
            out,
            "copy baseline: p50 {} per copy, {} bytes of disk each",
            show(copy.copy.p50_us),
            copy.disk_bytes_each
        )?;
        for d in &f.drivers {
            if let Some(speedup) = d.speedup_over_copy {
                writeln!(
                    out,
                    "  {}: a further read-only volume {speedup:.0}x faster than a copy",
                    d.driver
                )?;
            }
        }
    }
    if let Some(c) = &f.churn {
        writeln!(
            out,
            "churn: {:.0} s, {} publishes and {} unpublishes (p50 {}, p99 {}), the image removed {} times \
             meanwhile: {} volumes found empty",
            c.seconds,
            c.publishes,
            c.unpublishes,
            show(c.publish.p50_us),
            show(c.publish.p99_us),
            c.image_removals,
            c.empties
        )?;
    }
    writeln!(
        out,
        "RO: further read-only NodePublish ({} volumes, 1/10 and 10/10: p50 of the first and last tenth); RW: writable NodePublish; DISK: bytes used after the 1st, 2nd, 10th read-only volume, and by a writable volume after {} written; {}",
        f.drivers.first().map_or(0, |d| d.readonly_publish.samples),
        f.drivers.first().map_or(0, |d| d.writable_written_bytes),
        if f.clean {
            "nothing left"
        } else {
            "SOMETHING LEFT"
        }
    )
}

/// A latency in the unit that reads best.
fn show(us: f64) -> String {
    match us {
        us if us < 1000.0 => format!("{us:.0}µs"),
        us if us < 1e6 => format!("{:.2}ms", us / 1e3),
        us => format!("{:.2}s", us / 1e6),
    }
}

/// Writes `results` as JSON to `path`.
pub fn write_json<T: Serialize>(
    path: &std::path::Path,
    results: &Results<T>,
) -> Result<(), BenchError> {
    let json =
        serde_json::to_string_pretty(results).map_err(|e| BenchError::Output(e.to_string()))?;
    std::fs::write(path, json).map_err(BenchError::io(path.display()))
}

/// Writes the chart of `series` to `path`.
pub fn write_svg(
    path: &std::path::Path,
    title: &str,
    series: &[(String, Vec<Duration>)],
) -> Result<(), BenchError> {
    let svg = cdf_svg(title, series)?;
    std::fs::write(path, svg).map_err(BenchError::io(path.display()))
}
