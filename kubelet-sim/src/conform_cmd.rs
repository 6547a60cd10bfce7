//! `kubelet-sim conform`: the CLI of [`kubelet_sim::conform`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kubelet_sim::conform::{self, ConformOptions, checks};
use kubelet_sim::drivers::DriverArg;
use kubelet_sim::signals::Interrupts;
use kubelet_sim::sim::SimImages;

use crate::MounterKind;

/// `kubelet-sim conform`.
#[derive(clap::Args)]
pub struct ConformArgs {
    /// The driver under test: NAME=unix:///PATH (a driver serving there, its target paths under
    /// --root/<check>/node-1/pods/), or inlet's own NAME=local[:options] or NAME=image, started here.
    #[arg(long, required_unless_present = "list")]
    driver: Option<DriverArg>,
    /// The driver's CSIDriver object (YAML). Without it, conform tests with the one the driver would need,
    /// printed on stderr.
    #[arg(long, value_name = "FILE.yaml")]
    csidriver: Option<PathBuf>,
    /// The driver's definition for Kubernetes' e2e external storage tests (test/e2e/storage/external),
    /// used unchanged: its capabilities and InlineVolumes (attributes, Shared, ReadOnly). What e2e would
    /// ignore in it (a misspelt key or capability) is reported.
    #[arg(long, value_name = "FILE")]
    testdriver: Option<PathBuf>,
    /// Run only the checks whose id matches GLOB (`ephemeral/*`). Repeatable.
    #[arg(long, value_name = "GLOB", value_parser = parse_glob)]
    only: Vec<glob::Pattern>,
    /// Write the JSON report (every check; every CSI call of a failed one) here.
    #[arg(long, value_name = "FILE.json")]
    report: Option<PathBuf>,
    /// Write JUnit XML here, for CI systems.
    #[arg(long, value_name = "FILE.xml")]
    junit: Option<PathBuf>,
    /// Where each check's node lives (`<root>/<group>-<check>/node-1/` is its kubelet root). It must not
    /// hold a previous run. Default: a new temp dir, removed after.
    #[arg(long)]
    root: Option<PathBuf>,
    /// A volume attribute every inline volume carries, KEY=VALUE (what the driver needs, such as an
    /// image). Repeatable.
    #[arg(long = "volume-attribute", value_name = "KEY=VALUE", value_parser = parse_attribute)]
    attributes: Vec<(String, String)>,
    /// A shell command that restarts an external driver (for restart/driver); conform then waits for its
    /// Probe. Without it, that check is skipped for an external driver.
    #[arg(long, value_name = "COMMAND")]
    restart_command: Option<String>,
    /// How long one step of a check waits for the kubelet or the driver [default: 30s; with
    /// --kubeconfig 5m, e2e's PodStart and PodDelete timeouts].
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// Images for the in-process runtime from an OCI layout, REPOSITORY=DIR (for an image driver).
    /// Repeatable.
    #[arg(long = "image-layout", value_parser = cri_fake::images::parse_layout_flag)]
    image_layouts: Vec<(String, PathBuf)>,
    /// Mounts: linux (needs root), recording (a fake that mounts nothing), or auto.
    #[arg(long, value_enum, default_value_t = MounterKind::Auto)]
    mounter: MounterKind,
    /// List the checks (id, what each expects, its source) and exit.
    #[arg(long)]
    list: bool,
    /// Run the checks on a real kubelet of this cluster instead of a simulated node: pods bound to --node,
    /// the driver (serving on a socket on this host) registered with that kubelet through conform's
    /// proxy. conform runs on the node, as root, as Kubernetes' node e2e tests do.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the node whose kubelet runs the pods [default: the cluster's only node].
    #[arg(long, requires = "kubeconfig")]
    node: Option<String>,
    /// With --kubeconfig: that kubelet's root directory (its --root-dir).
    #[arg(long, requires = "kubeconfig", default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// With --kubeconfig: the image of the checks' pods, which must have `sh` and `sleep` (the node must
    /// have it or be able to pull it).
    #[arg(
        long,
        requires = "kubeconfig",
        default_value = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
    )]
    pod_image: String,
    /// With --kubeconfig: a shell command that restarts the node's kubelet and returns once it runs again
    /// (for restart/kubelet). Without it, that check is skipped on a real node.
    #[arg(long, requires = "kubeconfig", value_name = "COMMAND")]
    kubelet_restart_command: Option<String>,
}

fn parse_glob(text: &str) -> Result<glob::Pattern, String> {
    glob::Pattern::new(text).map_err(|e| format!("{text:?}: {e}"))
}

fn parse_attribute(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected KEY=VALUE"))?;
    if key.is_empty() {
        return Err(format!("{text:?}: the key is empty"));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Runs conform: 0 when every applicable check passed, 1 when one failed, 2 when conform could not run,
/// 128+N when stopped by a signal (after the running check's teardown and the reports).
pub async fn run(args: ConformArgs) -> ExitCode {
    if args.list {
        // A closed pipe (`--list | head`) ends the listing quietly.
        let mut out = std::io::stdout().lock();
        for check in checks::catalogue() {
            let (id, expects, source) = (check.id, check.expects, check.source);
            if writeln!(out, "{id}\n  expects: {expects}\n  source:  {source}\n").is_err() {
                break;
            }
        }
        return ExitCode::SUCCESS;
    }
    let Some(driver) = args.driver else {
        eprintln!("kubelet-sim conform: --driver is required");
        return ExitCode::from(2);
    };
    let interrupts = match Interrupts::install(|_| {}) {
        Ok(interrupts) => interrupts,
        Err(e) => {
            eprintln!("kubelet-sim conform: listening for signals: {e}");
            return ExitCode::from(2);
        }
    };
    let cluster = match &args.kubeconfig {
        None => None,
        Some(kubeconfig) => {
            if !matches!(driver.source, kubelet_sim::drivers::DriverSource::Socket(_)) {
                eprintln!(
                    "kubelet-sim conform: --kubeconfig tests a driver serving on a socket of this host \
                     (--driver NAME=unix:///PATH)"
                );
                return ExitCode::from(2);
            }
            if !inlet_host::mount::can_mount() || matches!(args.mounter, MounterKind::Recording) {
                eprintln!(
                    "kubelet-sim conform: --kubeconfig runs on the node as root, with the real mounter: \
                     it looks at the kubelet's mounts and the pods' processes"
                );
                return ExitCode::from(2);
            }
            let target = cluster_target(
                kubeconfig,
                args.node,
                args.kubelet_dir,
                args.pod_image,
                args.kubelet_restart_command,
            );
            match target.await {
                Ok(target) => Some(target),
                Err(e) => {
                    eprintln!("kubelet-sim conform: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    };
    let options = ConformOptions {
        driver,
        csi_driver: args.csidriver,
        testdriver: args.testdriver,
        only: args.only,
        root: args.root,
        attributes: args.attributes.into_iter().collect::<BTreeMap<_, _>>(),
        restart_command: args.restart_command,
        wait: args.timeout.unwrap_or(match cluster {
            // test/e2e/framework/timeouts.go: defaultTimeouts' PodStart and PodDelete are 5 minutes; a
            // real kubelet takes tens of seconds to tear ten pods down (its status sync runs every 10s).
            Some(_) => Duration::from_secs(300),
            None => Duration::from_secs(30),
        }),
        images: SimImages {
            layouts: args.image_layouts,
            ..Default::default()
        },
        mounter: args.mounter.layer(),
        interrupts: Some(interrupts.clone()),
        cluster,
    };
    let report = match conform::run(options, &mut std::io::stdout()).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("kubelet-sim conform: {e}");
            return ExitCode::from(2);
        }
    };
    let written = [
        args.report
            .map(|path| conform::output::write_json(&report, &path)),
        args.junit
            .map(|path| conform::output::write_junit(&report, &path)),
    ];
    let errors: Vec<conform::ConformError> = written
        .into_iter()
        .flatten()
        .filter_map(Result::err)
        .collect();
    for error in &errors {
        eprintln!("kubelet-sim conform: {error}");
    }
    if !errors.is_empty() {
        return ExitCode::from(2);
    }
    if let Some(signal) = interrupts.received() {
        return ExitCode::from(signal.exit_status());
    }
    if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The real node of `--kubeconfig`: `--node`, or the cluster's only node.
async fn cluster_target(
    kubeconfig: &std::path::Path,
    node: Option<String>,
    kubelet_dir: PathBuf,
    pod_image: String,
    kubelet_restart_command: Option<String>,
) -> Result<conform::env::ClusterTarget, String> {
    let client = kubelet_sim::cluster::connect(kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let node = match node {
        Some(name) => nodes
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading node {name}: {e}"))?
            .ok_or_else(|| format!("the cluster has no node {name}"))?,
        None => {
            let mut listed = nodes
                .list(&Default::default())
                .await
                .map_err(|e| format!("listing the cluster's nodes: {e}"))?
                .items;
            if listed.len() != 1 {
                let names: Vec<_> = listed
                    .iter()
                    .filter_map(|n| n.metadata.name.clone())
                    .collect();
                return Err(format!(
                    "the cluster has nodes {names:?}: pick one with --node"
                ));
            }
            listed.remove(0)
        }
    };
    let kubelet_version = node
        .status
        .and_then(|s| s.node_info)
        .map(|i| i.kubelet_version)
        .unwrap_or_default();
    let node = node.metadata.name.unwrap_or_default();
    if !kubelet_dir.join("plugins_registry").is_dir() {
        return Err(format!(
            "{} has no plugins_registry: give the kubelet's root directory with --kubelet-dir",
            kubelet_dir.display()
        ));
    }
    // As the kubelet writes it in target paths, which the checks compare with.
    let kubelet_dir = std::fs::canonicalize(&kubelet_dir)
        .map_err(|e| format!("--kubelet-dir {}: {e}", kubelet_dir.display()))?;
    Ok(conform::env::ClusterTarget {
        client,
        node,
        kubelet_version,
        kubelet_dir,
        pod_image,
        kubelet_restart_command,
    })
}
