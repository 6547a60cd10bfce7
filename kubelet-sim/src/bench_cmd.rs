//! `kubelet-sim bench`: the CLI of [`kubelet_sim::bench`].

use std::path::PathBuf;
use std::time::Duration;

use kubelet_sim::bench::{self, Machine, Results, csi_ephemeral, pods};
use kubelet_sim::drivers::DriverArg;

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
    #[command(flatten)]
    output: Output,
}

/// Runs a workload, prints its figures, writes JSON and SVG as asked.
pub async fn run(bench: Bench) -> Result<(), String> {
    match bench {
        Bench::CsiEphemeral(args) => {
            let (root, _temp) = root(&args.output)?;
            let (mounter, real) = args.output.mounter.layer();
            let config = csi_ephemeral::EphemeralConfig {
                drivers: args.drivers,
                cycles: args.cycles,
                concurrency: args.concurrency,
                published: args.published,
                root,
                mounter,
            };
            let figures = csi_ephemeral::run(&config).await?;
            bench::print_ephemeral(&mut std::io::stdout(), &figures).map_err(|e| e.to_string())?;
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
        Bench::Pods(args) => {
            let (root, _temp) = root(&args.output)?;
            let (mounter, real) = args.output.mounter.layer();
            let config = pods::PodsConfig {
                pods: args.pods,
                nodes: args.nodes,
                volumes: args.volumes,
                driver: args.driver,
                root,
                mounter,
                limit: args.timeout,
            };
            let figures = pods::run(&config).await?;
            bench::print_pods(&mut std::io::stdout(), &figures).map_err(|e| e.to_string())?;
            let name = format!("{} pods over {} nodes", figures.pods, figures.nodes);
            let series = [(name, figures.samples.clone())];
            write(&args.output, real, figures, "Pod start latency", &series)
        }
    }
}

/// Writes the chart of `series` and the JSON of `figures`, as `output` asks.
fn write<T: serde::Serialize>(
    output: &Output,
    real_mounts: bool,
    figures: T,
    title: &str,
    series: &[(String, Vec<Duration>)],
) -> Result<(), String> {
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

/// The root to work in, and the temp dir that holds it when none was given (removed when dropped).
fn root(output: &Output) -> Result<(PathBuf, Option<tempfile::TempDir>), String> {
    match &output.root {
        Some(root) => Ok((root.clone(), None)),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("kubelet-sim-bench-")
                .tempdir()
                .map_err(|e| format!("temp dir: {e}"))?;
            Ok((temp.path().to_path_buf(), Some(temp)))
        }
    }
}
