//! `kubelet-sim bench`: the CLI of [`kubelet_sim::bench`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inlet_host::mount::MountLayer;
use kubelet_sim::bench::{
    self, BenchError, FleetConfig, Machine, Results, csi_ephemeral, hollow, image, pods,
    pods_cluster,
};
use kubelet_sim::drivers::DriverArg;
use kubelet_sim::signals::Interrupts;

use crate::MounterKind;

/// The workloads.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Ephemeral inline volumes against CSI drivers side by side: NodePublishVolume + NodeUnpublishVolume
    /// round trips at each concurrency, with N other volumes published meanwhile.
    CsiEphemeral(EphemeralArgs),
    /// N pods with K inline volumes over M simulated nodes: time to all Running, pod start latency,
    /// teardown time, peak memory.
    Pods(PodsArgs),
    /// Image volumes on a real runtime (containerd when installed): the cold pull through CRI, warm
    /// read-only and writable publishes, the disk each volume uses, beside copying the image's files.
    Image(ImageArgs),
    /// Hollow nodes on a real cluster (--kubeconfig): memory and CPU per node while idle and while pods
    /// with an inline volume are created and deleted on them.
    HollowNodes(HollowArgs),
}

/// `bench hollow-nodes`.
#[derive(clap::Args)]
pub struct HollowArgs {
    /// The cluster the hollow nodes join (they leave it at the end: drained and deleted).
    #[arg(long, value_name = "FILE")]
    kubeconfig: PathBuf,
    /// Hollow nodes.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Pods per churn round, bound round-robin to the nodes.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Churn rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// How long the nodes idle while measured.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// The driver: NAME=local (inlet's, on every node).
    #[arg(long, default_value = "local.inlet.dev=local")]
    driver: DriverArg,
    /// The longest a step may take.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Processes to spread the nodes over: 1 runs them in this one; more start `kubelet-sim run
    /// --kubeconfig` children (each node holds about a dozen sockets, and a process's open-files limit
    /// bounds how many nodes it can hold).
    #[arg(long, default_value_t = 1)]
    processes: usize,
    #[command(flatten)]
    output: Output,
}

/// Where figures go.
#[derive(clap::Args)]
pub struct Output {
    /// Write the figures, the machine and the command as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a chart of the latency distributions (SVG) here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Where volumes and node state go. Default: a new temp dir, removed after.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Mounts: linux (needs root), recording (a fake that mounts nothing), or auto.
    #[arg(long, value_enum, default_value_t = MounterKind::Auto)]
    mounter: MounterKind,
}

/// `bench csi-ephemeral`.
#[derive(clap::Args)]
pub struct EphemeralArgs {
    /// A driver: NAME=local (inlet's local driver, started here) or NAME=unix:///PATH (any driver serving
    /// there; its target paths are under --root/NAME/pods/). Repeatable: measured side by side.
    #[arg(long = "driver", required = true)]
    drivers: Vec<DriverArg>,
    /// Round trips per figure.
    #[arg(long, default_value_t = 2000)]
    cycles: usize,
    /// Round trips in flight at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Other volumes published on the node meanwhile, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1000,10000")]
    published: Vec<usize>,
    #[command(flatten)]
    output: Output,
}

/// `bench pods`.
#[derive(clap::Args)]
pub struct PodsArgs {
    /// Pods.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// Simulated nodes.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Inline volumes per pod.
    #[arg(long, default_value_t = 2)]
    volumes: usize,
    /// The driver: NAME=local (inlet's, on every node) or NAME=unix:///PATH.
    #[arg(long, default_value = "local.inlet.dev=local")]
    driver: DriverArg,
    /// The longest the pods may take to settle, and then to be torn down.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// A real cluster: the nodes join it as hollow nodes (they leave it at the end), the pods are created
    /// through its API server, and its share of the time is read from its /metrics. The driver must be
    /// NAME=local.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: processes to spread the nodes over, as `bench hollow-nodes --processes`.
    #[arg(long, default_value_t = 1, requires = "kubeconfig")]
    processes: usize,
    #[command(flatten)]
    output: Output,
}

/// `bench image`.
#[derive(clap::Args)]
pub struct ImageArgs {
    /// A driver: NAME=image (inlet's image driver, started here) or NAME=unix:///PATH (any image driver
    /// taking the `image` volume attribute, pulling through the same runtime). Repeatable.
    #[arg(long = "driver", default_value = "image.inlet.dev=image")]
    drivers: Vec<DriverArg>,
    /// The runtime's CRI socket (unix:///PATH). Default: a private containerd started here when it is
    /// installed and we are root, else the in-process cri-fake.
    #[arg(long, value_name = "ENDPOINT")]
    cri: Option<String>,
    /// The image's total file size (a Kubernetes quantity).
    #[arg(long, default_value = "200Mi", value_parser = inlet_host::quantity::parse_bytes)]
    size: u64,
    /// The image's layers.
    #[arg(long, default_value_t = 10)]
    layers: usize,
    /// Further read-only volumes per driver, all kept published while measured.
    #[arg(long, default_value_t = 1000)]
    volumes: usize,
    /// Writable volume publish + unpublish cycles per driver.
    #[arg(long, default_value_t = 200)]
    cycles: usize,
    /// Bytes written into a writable volume before its disk use is measured (a quantity).
    #[arg(long, default_value = "64Mi", value_parser = inlet_host::quantity::parse_bytes)]
    write: u64,
    /// Copies of the image's files for the baseline (0: none).
    #[arg(long, default_value_t = 5)]
    copies: usize,
    /// After the figures, churn read-only volumes this long (a publish and an unpublish per driver each
    /// --churn-period) while the image is removed from the runtime every second, counting volumes found
    /// empty (0: no churn).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    churn: Duration,
    /// How often the churn publishes and unpublishes.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    churn_period: Duration,
    #[command(flatten)]
    output: Output,
}

/// Runs a workload, prints its figures, writes JSON and SVG as asked.
pub async fn run(bench: Bench) -> Result<(), BenchError> {
    // SIGINT/SIGTERM: the workload stops between two steps and undoes what it made (a second signal
    // exits at once); the temp root is removed once nothing is mounted below it.
    let interrupts = Interrupts::install(|signal| {
        eprintln!("kubelet-sim bench: {signal} again: exiting without cleaning up")
    })
    .map_err(BenchError::io("signal handlers"))?;
    let interrupts = Some(interrupts);
    match bench {
        Bench::CsiEphemeral(args) => {
            let (mounter, real) = args.output.mounter.layer();
            let (root, _temp) = root(&args.output, &mounter)?;
            let config = csi_ephemeral::EphemeralConfig {
                drivers: args.drivers,
                cycles: args.cycles,
                concurrency: args.concurrency,
                published: args.published,
                root,
                mounter,
                interrupts,
            };
            let figures = csi_ephemeral::run(&config).await?;
            bench::print_ephemeral(&mut std::io::stdout(), &figures)
                .map_err(BenchError::io("stdout"))?;
            let series: Vec<_> = figures
                .iter()
                .map(|f| {
                    let name =
                        format!("{} c={} published={}", f.driver, f.concurrency, f.published);
                    (name, f.samples.clone())
                })
                .collect();
            let title = "Ephemeral NodePublish + NodeUnpublish round trip";
            write(&args.output, real, figures, title, &series)
        }
        Bench::Pods(args) if args.kubeconfig.is_some() => pods_on_a_cluster(args, interrupts).await,
        Bench::Pods(args) => {
            let (mounter, real) = args.output.mounter.layer();
            let (root, _temp) = root(&args.output, &mounter)?;
            let config = pods::PodsConfig {
                pods: args.pods,
                nodes: args.nodes,
                volumes: args.volumes,
                driver: args.driver,
                root,
                mounter,
                limit: args.timeout,
                interrupts,
            };
            let figures = pods::run(&config).await?;
            bench::print_pods(&mut std::io::stdout(), &figures)
                .map_err(BenchError::io("stdout"))?;
            let name = format!("{} pods over {} nodes", figures.pods, figures.nodes);
            let series = [(name, figures.samples.clone())];
            write(&args.output, real, figures, "Pod start latency", &series)
        }
        Bench::HollowNodes(args) => {
            let (fleet, _temp) = fleet(
                &args.output,
                &args.kubeconfig,
                (args.nodes, args.processes),
                args.driver,
                args.timeout,
            )
            .await?;
            let real = fleet.real_mounts;
            let config = hollow::HollowConfig {
                fleet,
                pods: args.pods,
                rounds: args.rounds,
                idle: args.idle,
                interrupts,
            };
            let figures = hollow::run(&config).await?;
            bench::print_hollow(&mut std::io::stdout(), &figures)
                .map_err(BenchError::io("stdout"))?;
            write(&args.output, real, figures, "Hollow nodes", &[])
        }
        Bench::Image(args) => {
            let (mounter, real) = args.output.mounter.layer();
            let (root, _temp) = root(&args.output, &mounter)?;
            let cri = crate::cri_socket(args.cri.as_deref()).map_err(BenchError::Usage)?;
            let config = image::ImageConfig {
                drivers: args.drivers,
                cri,
                size: args.size,
                layers: args.layers,
                volumes: args.volumes,
                cycles: args.cycles,
                write: args.write,
                copies: args.copies,
                churn: args.churn,
                churn_period: args.churn_period,
                root,
                mounter,
                interrupts,
            };
            let figures = image::run(&config).await?;
            bench::print_image(&mut std::io::stdout(), &figures)
                .map_err(BenchError::io("stdout"))?;
            let mut series = Vec::new();
            for d in &figures.drivers {
                series.push((
                    format!("{} further read-only", d.driver),
                    d.readonly_samples.clone(),
                ));
                series.push((format!("{} writable", d.driver), d.writable_samples.clone()));
            }
            if let Some(copy) = &figures.copy {
                series.push((
                    "copy of the image's files".to_string(),
                    copy.samples.clone(),
                ));
            }
            let title = "Image volume NodePublish, beside a copy of the image";
            write(&args.output, real, figures, title, &series)
        }
    }
}

/// `bench pods --kubeconfig`: the pods on a real cluster's hollow nodes.
async fn pods_on_a_cluster(
    args: PodsArgs,
    interrupts: Option<Interrupts>,
) -> Result<(), BenchError> {
    let kubeconfig = args.kubeconfig.clone().unwrap_or_default();
    let (fleet, _temp) = fleet(
        &args.output,
        &kubeconfig,
        (args.nodes, args.processes),
        args.driver,
        args.timeout,
    )
    .await?;
    let real = fleet.real_mounts;
    let config = pods_cluster::ClusterPodsConfig {
        fleet,
        pods: args.pods,
        volumes: args.volumes,
        interrupts,
    };
    let figures = pods_cluster::run(&config).await?;
    bench::print_cluster_pods(&mut std::io::stdout(), &figures)
        .map_err(BenchError::io("stdout"))?;
    let name = format!("{} pods over {} hollow nodes", figures.pods, figures.nodes);
    let series = [(name, figures.samples.clone())];
    write(&args.output, real, figures, "Pod start latency", &series)
}

/// The hollow nodes of a `--kubeconfig` bench (`nodes` over `processes`), and the temp root they use when
/// `--root` was not given (kept until the bench ends).
async fn fleet(
    output: &Output,
    kubeconfig: &std::path::Path,
    (nodes, processes): (usize, usize),
    driver: DriverArg,
    limit: Duration,
) -> Result<(FleetConfig, Option<TempRoot>), BenchError> {
    let (mounter, real_mounts) = output.mounter.layer();
    let (root, temp) = root(output, &mounter)?;
    let client = kubelet_sim::cluster::connect(kubeconfig)
        .await
        .map_err(|e| BenchError::Usage(e.to_string()))?;
    let fleet = FleetConfig {
        client,
        kubeconfig: kubeconfig.to_path_buf(),
        nodes,
        processes,
        driver,
        root,
        mounter,
        real_mounts,
        limit,
    };
    Ok((fleet, temp))
}

/// Writes the chart of `series` and the JSON of `figures`, as `output` asks.
fn write<T: serde::Serialize>(
    output: &Output,
    real_mounts: bool,
    figures: T,
    title: &str,
    series: &[(String, Vec<Duration>)],
) -> Result<(), BenchError> {
    if let Some(path) = &output.svg {
        bench::write_svg(path, title, series)?;
    }
    if let Some(path) = &output.json {
        let results = Results {
            machine: Machine::here(real_mounts),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            figures,
        };
        bench::write_json(path, &results)?;
    }
    Ok(())
}

/// The root to work in, and the temp dir that holds it when none was given.
fn root(
    output: &Output,
    mounter: &Arc<dyn MountLayer>,
) -> Result<(PathBuf, Option<TempRoot>), BenchError> {
    match &output.root {
        Some(root) => Ok((root.clone(), None)),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("kubelet-sim-bench-")
                .tempdir()
                .map_err(BenchError::io("temp dir"))?;
            let root = temp.path().to_path_buf();
            let temp = TempRoot {
                dir: Some(temp),
                mounter: Arc::clone(mounter),
            };
            Ok((root, Some(temp)))
        }
    }
}

/// A temp root, removed when dropped unless something is still mounted below it (removing it would reach
/// into the mounts): then it is left, and named.
struct TempRoot {
    dir: Option<tempfile::TempDir>,
    mounter: Arc<dyn MountLayer>,
}

impl Drop for TempRoot {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if self.mounter.anything_mounted_under(dir.path()) {
            let kept = dir.keep();
            eprintln!(
                "kubelet-sim bench: something is still mounted under {}: left in place",
                kept.display()
            );
        }
    }
}
