//! `kubelet-sim`: runs pods' volumes through what a kubelet does, against real CSI drivers, without a
//! cluster (`run`), and measures drivers and the simulator (`bench`, in `bench_cmd.rs`). See `--help` and
//! `kubelet-sim/README.md`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_image::pull::VerificationPolicy;
use kubelet_sim::api::manifest;
use kubelet_sim::drivers::DriverArg;
use kubelet_sim::node::{BackoffPolicy, ImageGcArgs, ImageVolumeMounts};
use kubelet_sim::signals::{Interrupts, Signal};
use kubelet_sim::sim::{SimConfig, SimImages, Simulation};

mod bench_cmd;
mod conform_cmd;

// jemalloc instead of glibc's malloc: the simulated nodes make many small, short-lived allocations on
// every thread (gRPC frames, futures, API objects), and glibc spent about a quarter of the CPU of a
// 10,000-pod run in malloc and free; jemalloc also keeps the peak lower than mimalloc did (bench/RESULTS.md,
// issue #28).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Threads for blocking work (host syscalls, the in-process drivers' calls): a few per core, with room for
/// calls that wait on the kernel (a mount behind the mount-table lock, a slow filesystem).
const BLOCKING_THREADS: usize = 32;

#[derive(Parser)]
#[command(
    name = "kubelet-sim",
    version,
    about = "A simulated kubelet for CSI inline (KEP-596) and persistent volumes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply manifests, run every pod until it is Running (or as its manifest expects), report.
    #[command(
        after_help = "Exit status: 0 when every pod is as expected (and, with --teardown, nothing is \
        left); 1 otherwise, or on an error; 130 or 143 when stopped by SIGINT or SIGTERM, after the report \
        and a teardown of what was mounted (a second signal exits at once). With --kubeconfig and no \
        --manifests, kubelet-sim serves as hollow nodes until SIGTERM or SIGINT, then exits 0 after the \
        report, leaving its pods and mounts to the cluster (a restart on the same --root takes them up)."
    )]
    Run(RunArgs),
    /// Measure: CSI round trips of inline ephemeral volumes against any drivers side by side, pods at
    /// scale over simulated nodes, or image volumes on a real runtime. Prints figures; never fails on
    /// slowness.
    #[command(subcommand)]
    Bench(bench_cmd::Bench),
    /// A kubelet-level conformance suite for a CSI driver's inline-volume support: runs the driver through
    /// what a kubelet does (pods on a simulated node, real sockets, real mounts as root) and reports each
    /// check as pass, fail or skip, as a table, JSON and JUnit XML.
    #[command(
        after_help = "Exit status: 0 when every applicable check passed; 1 when one failed; 2 when \
        conform could not run (a bad flag, an unreachable driver, a CSIDriver file without the driver). \
        The checks, what each expects and its upstream source: --list, and conform.md beside kubelet-sim."
    )]
    Conform(conform_cmd::ConformArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Kubernetes YAML files or directories: Pods, Secrets, CSIDrivers, PVs, PVCs, ServiceAccounts. With
    /// --kubeconfig they are created in that cluster (pods bound to these nodes); optional there.
    #[arg(long, required_unless_present_any = ["kubeconfig", "in_cluster"], num_args = 1..)]
    manifests: Vec<PathBuf>,
    /// Join the cluster of this kubeconfig as hollow nodes (as kubemark's, with real volume logic):
    /// register the Nodes and their Leases, run the pods bound to them, post their status and events.
    /// Without --manifests, run until SIGTERM or SIGINT. The embedded API is the default.
    #[arg(long, value_name = "FILE", conflicts_with = "in_cluster")]
    kubeconfig: Option<PathBuf>,
    /// As --kubeconfig, with the pod's own service account (kubelet-sim running as a pod of the cluster it
    /// joins, deploy/hollow-nodes/), or the file KUBECONFIG names.
    #[arg(long)]
    in_cluster: bool,
    /// With --kubeconfig or --in-cluster: at SIGTERM or SIGINT, leave the cluster (the nodes report
    /// NotReady and are cordoned, their pods are deleted and torn down here, then the Nodes are deleted),
    /// waiting at most --timeout for the pods. For hollow nodes whose Deployment is scaled down.
    #[arg(long)]
    drain_on_exit: bool,
    /// Nodes are named PREFIX-1 ... PREFIX-N [default: node; with --kubeconfig, hollow-node].
    #[arg(long, value_name = "PREFIX")]
    node_name_prefix: Option<String>,
    /// A CSI driver: NAME=local starts inlet's local driver on every node (NAME=local:attach with
    /// ControllerPublish enabled); NAME=image starts inlet's image driver on every node; NAME=unix:///PATH
    /// uses a driver serving there. Repeatable.
    #[arg(long = "driver")]
    drivers: Vec<DriverArg>,
    /// Watch DIR for drivers' registration sockets (`<name>-reg.sock`, served by node-driver-registrar or
    /// `inlet-plugin serve --registration-dir DIR`) and register them on every node, as the kubelet's
    /// plugin watcher does with `/var/lib/kubelet/plugins_registry`; a socket removed deregisters its driver.
    #[arg(long, value_name = "DIR")]
    plugins_registry: Option<PathBuf>,
    /// A CRI runtime's socket (for example containerd's). Without it, cri-fake runs in-process.
    #[arg(long)]
    cri: Option<String>,
    /// Where node state lives (`<root>/node-N/` is each kubelet's root). Default: a new temp dir.
    #[arg(long)]
    root: Option<PathBuf>,
    /// How many simulated nodes.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Feature gates, KEY=true|false,...: PersistentInlineCSI, CSIVolumeHealth, SELinuxMount (default
    /// false); SELinuxMountReadWriteOncePod, SELinuxChangePolicy (default true, as in 1.35).
    /// CSIVolumeHealth makes the stats calculator read volumes' conditions, and record an abnormal one
    /// as a VolumeConditionAbnormal event.
    #[arg(long, value_parser = parse_gates, default_value = "")]
    feature_gates: BTreeSet<String>,
    /// Whether the nodes run SELinux: host (as this machine does), enabled (a simulated SELinux node:
    /// drivers whose CSIDriver says seLinuxMount get `-o context=` for a pod's ReadWriteOncePod PVs), or
    /// disabled.
    #[arg(long, value_enum, default_value_t = SelinuxMode::Host)]
    selinux: SelinuxMode,
    /// How often the kubelet's stats calculator asks each mounted volume for its metrics
    /// (NodeGetVolumeStats), jittered by up to as long again (`--volume-stats-agg-period`). 0 turns it off.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    volume_stats_agg_period: Duration,
    /// Drivers allowed in inline csi volumes, comma-separated. Unset: all allowed. Set but empty: none.
    #[arg(long)]
    allowed_inline_drivers: Option<String>,
    /// After the pods settle, delete them all and run until their volumes are gone.
    #[arg(long)]
    teardown: bool,
    /// The deadline for pods to settle, from the start of the run (and again for teardown): operations still
    /// running then are left behind and the report is written.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Mounts: linux (needs root), recording (a fake that mounts nothing), or auto.
    #[arg(long, value_enum, default_value_t = MounterKind::Auto)]
    mounter: MounterKind,
    /// Images for each node's in-process cri-fake from an OCI layout: REPOSITORY=DIR, each tag T becoming
    /// REPOSITORY:T. Repeatable.
    #[arg(long = "image-layout", value_parser = cri_fake::images::parse_layout_flag)]
    image_layouts: Vec<(String, PathBuf)>,
    /// A registry the nodes' in-process cri-fakes pull real images from over plain HTTP (HOST:PORT).
    /// Repeatable.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// Which cached images a pod must prove credentials for (the kubelet's
    /// imagePullCredentialsVerificationPolicy, KEP-2535): applied to container images, image volumes and
    /// the image drivers started here, which share one record per node of who pulled what.
    #[arg(long, value_enum, default_value_t = VerificationPolicy::NeverVerifyPreloadedImages)]
    image_pull_credentials_verification_policy: VerificationPolicy,
    /// The images NeverVerifyAllowlistedImages hands to any pod without proof, comma-separated: full names
    /// without tag or digest (`registry.example/team/tool`), or prefixes ending in `/*` (the kubelet's
    /// preloadedImagesVerificationAllowlist).
    #[arg(long, value_delimiter = ',', value_parser = inlet_image::allowlist::allowlist_entry)]
    preloaded_images_verification_allowlist: Vec<String>,
    /// Who mounts a pod's `volumes[].image`: the runtime, as upstream's kubelet asks it (CRI Mount.image,
    /// KEP-4639); the kubelet side (inlet's engine, for runtimes without image mounts); or auto, the
    /// runtime when its CRI Version is CRI-O 1.33+ or containerd 2.2+ (older ones drop image_sub_path).
    #[arg(long, value_enum, default_value_t = ImageVolumeMounts::Auto)]
    image_volume_mounts: ImageVolumeMounts,
    #[command(flatten)]
    image_gc: ImageGcArgs,
    /// Serve the kubelet's storage metrics at http://HOST:PORT/metrics (`:PORT` for every interface) while
    /// the run lasts: `storage_operation_duration_seconds`, `csi_operations_seconds`,
    /// `volume_manager_total_volumes`, `process_*`, with upstream's names and labels.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum SelinuxMode {
    Host,
    Enabled,
    Disabled,
}

#[derive(Clone, Copy, ValueEnum)]
enum MounterKind {
    Auto,
    Linux,
    Recording,
}

impl MounterKind {
    /// The mount layer, and whether its mounts are real. `auto` without root says so on stderr.
    fn layer(self) -> (Arc<dyn MountLayer>, bool) {
        match (self, can_mount()) {
            (MounterKind::Linux, _) | (MounterKind::Auto, true) => (Arc::new(LinuxMounter), true),
            (MounterKind::Recording, _) | (MounterKind::Auto, false) => {
                if matches!(self, MounterKind::Auto) {
                    eprintln!(
                        "kubelet-sim: not root: using the recording mounter, nothing will really be mounted"
                    );
                }
                (Arc::new(RecordingMounter::new()), false)
            }
        }
    }
}

fn parse_gates(text: &str) -> Result<BTreeSet<String>, String> {
    let mut on = kubelet_sim::sim::default_gates();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?}: expected KEY=true|false"))?;
        use inlet_volume::selinux::{
            SELINUX_CHANGE_POLICY, SELINUX_MOUNT, SELINUX_MOUNT_READ_WRITE_ONCE_POD,
        };
        const KNOWN: [&str; 5] = [
            inlet_volume::csi::source::PERSISTENT_INLINE_GATE,
            inlet_volume::csi::metrics::CSI_VOLUME_HEALTH,
            SELINUX_MOUNT,
            SELINUX_MOUNT_READ_WRITE_ONCE_POD,
            SELINUX_CHANGE_POLICY,
        ];
        if !KNOWN.contains(&key) {
            return Err(format!(
                "unknown feature gate {key:?} (known: {})",
                KNOWN.join(", ")
            ));
        }
        match value {
            "true" => on.insert(key.to_string()),
            "false" => on.remove(key),
            _ => return Err(format!("{pair:?}: the value must be true or false")),
        };
    }
    Ok(on)
}

/// Raises the soft limit on open files to the hard one, as every Go program does at start (Go 1.19's `os`
/// package, so the kubelet too): each simulated node holds about a dozen sockets (its runtime's, its drivers',
/// their connections), and the usual soft limit of 1,024 would stop a run at a hundred nodes.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!("cannot raise the open files limit from {soft} to {hard}: {e}");
    }
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // kube's TLS: the one process-wide rustls provider, chosen before any client exists.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // conform provokes drivers' failures on purpose: their warnings would bury its table.
    let default_level = match command {
        Command::Conform(_) => "error",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    raise_open_files_limit();
    // tokio's default of 512 blocking threads: the in-process drivers run each CSI call on the blocking pool,
    // so a simulated cluster that publishes thousands of volumes at once started hundreds of threads on two
    // cores, which only queued in the kernel and held their stacks and allocator caches (bench/RESULTS.md).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet-sim: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = match command {
        Command::Run(args) => args,
        Command::Conform(args) => return runtime.block_on(conform_cmd::run(args)),
        Command::Bench(bench) => {
            return match runtime.block_on(bench_cmd::run(bench)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e @ kubelet_sim::bench::BenchError::Interrupted(signal)) => {
                    eprintln!("kubelet-sim bench: {e}");
                    ExitCode::from(signal.exit_status())
                }
                Err(e) => {
                    eprintln!("kubelet-sim bench: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    match runtime.block_on(run(args)) {
        Ok(Outcome::AsExpected) => ExitCode::SUCCESS,
        Ok(Outcome::NotAsExpected) => ExitCode::FAILURE,
        Ok(Outcome::Interrupted(signal)) => ExitCode::from(signal.exit_status()),
        Err(e) => {
            eprintln!("kubelet-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How a run ended; the exit status says which.
enum Outcome {
    /// Every pod as its manifest expected, and (with `--teardown`) nothing left: 0.
    AsExpected,
    /// A pod was not as expected by the deadline, or teardown left something: 1.
    NotAsExpected,
    /// Stopped by a signal, after the report and the teardown: 128 + the signal's number.
    Interrupted(Signal),
}

async fn run(args: RunArgs) -> Result<Outcome, String> {
    let manifests = manifest::load(&args.manifests).map_err(|e| e.to_string())?;
    let cluster = match (&args.kubeconfig, args.in_cluster) {
        (Some(path), _) => Some(kubelet_sim::cluster::connect(path).await),
        (None, true) => Some(kubelet_sim::cluster::connect_in_cluster().await),
        (None, false) => None,
    }
    .transpose()
    .map_err(|e| e.to_string())?;
    if args.drain_on_exit && cluster.is_none() {
        return Err("--drain-on-exit needs --kubeconfig or --in-cluster".into());
    }
    let hollow = cluster.is_some();
    // A node daemon of a real cluster: no manifests to settle, it serves until stopped.
    let serve_until_stopped = cluster.is_some() && manifests.is_empty();
    let node_name_prefix = args.node_name_prefix.unwrap_or_else(|| {
        if cluster.is_some() {
            "hollow-node"
        } else {
            "node"
        }
        .to_string()
    });
    let (mounter, _) = args.mounter.layer();
    let temp_root = args.root.is_none();
    let root = match args.root {
        Some(root) => root,
        None => tempfile::Builder::new()
            .prefix("kubelet-sim-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?
            .keep(),
    };
    let cri = cri_socket(args.cri.as_deref())?;
    // Bound before anything starts, so a port in use ends the run before it changes anything.
    let metrics = match &args.metrics_address {
        Some(address) => Some(
            inlet_host::metrics::bind(address)
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let allowed = args.allowed_inline_drivers.map(|list| {
        list.split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect()
    });
    let config = SimConfig {
        root: root.clone(),
        nodes: args.nodes,
        drivers: args.drivers,
        cri,
        gates: args.feature_gates,
        selinux: match args.selinux {
            SelinuxMode::Host => inlet_host::selinux::enabled(),
            SelinuxMode::Enabled => true,
            SelinuxMode::Disabled => false,
        },
        allowed_inline_drivers: allowed,
        backoff: BackoffPolicy::default(),
        volume_wait_timeout: Duration::from_secs(123),
        csi_timeout: inlet_volume::csi::CSI_TIMEOUT,
        republish_period: Duration::from_secs(60),
        volume_stats_agg_period: args.volume_stats_agg_period,
        containers: Default::default(),
        mounter,
        images: SimImages {
            layouts: args.image_layouts,
            insecure_registries: args.insecure_registries,
            verification: args.image_pull_credentials_verification_policy,
            allowlist: inlet_image::allowlist::Allowlist::parse(
                &args.preloaded_images_verification_allowlist,
            )?,
            volume_mounts: args.image_volume_mounts,
            gc: args.image_gc.policy()?,
            ..SimImages::default()
        },
        plugins_registry: args.plugins_registry,
        node_name_prefix,
        cluster,
    };
    let kept = root.clone();
    let mut interrupts = Interrupts::install(move |second| {
        eprintln!(
            "kubelet-sim: {second} again: exiting now; state kept in {}",
            kept.display()
        );
    })
    .map_err(|e| format!("listening for signals: {e}"))?;
    let mut sim = Simulation::start(config).await.map_err(|e| e.to_string())?;
    let _metrics = metrics.map(|listener| {
        let registry = kubelet_sim::metrics::registry(sim.nodes.clone());
        listener.serve(Arc::new(registry))
    });
    // `--timeout` bounds the whole settle phase: at the deadline (or a signal) the operations still running
    // are left behind, the report is written, and teardown (if asked, or after a signal) gets its own.
    let settled = if serve_until_stopped {
        interrupts.wait().await;
        if args.drain_on_exit {
            if let Err(e) = sim.leave_cluster(args.timeout).await {
                eprintln!("kubelet-sim: leaving the cluster: {e}");
            }
        }
        true
    } else {
        tokio::select! {
            settled = async {
                sim.apply(manifests).await;
                sim.wait_for(args.timeout, Simulation::pods_as_expected).await
            } => settled,
            _ = tokio::time::sleep(args.timeout) => false,
            _ = interrupts.wait() => false,
        }
    };
    let mut report = sim.report();
    if !settled && interrupts.received().is_none() {
        eprintln!(
            "kubelet-sim: not every pod reached its expected state within {}",
            humantime::format_duration(args.timeout)
        );
    }
    // A hollow node stopped by a signal leaves its pods to the cluster (as a kubelet that stops does);
    // alone, kubelet-sim tears down what it mounted.
    let teardown_on_signal = interrupts.received().is_some() && !hollow;
    if args.teardown || teardown_on_signal {
        let teardown = sim.teardown(args.timeout).await;
        let after = sim.report();
        report.csi_calls = after.csi_calls;
        report.api_reads = after.api_reads;
        report.volume_attachments = after.volume_attachments;
        report.teardown = Some(teardown);
    }
    sim.shutdown().await;
    let mut stdout = std::io::stdout();
    report
        .write_summary(&mut stdout)
        .map_err(|e| e.to_string())?;
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let clean = report.teardown.as_ref().is_some_and(|t| t.clean());
    if temp_root && clean {
        let _ = std::fs::remove_dir_all(&root);
    } else {
        println!("state kept in {}", root.display());
    }
    Ok(match interrupts.received() {
        // A node daemon's normal end.
        Some(_) if serve_until_stopped => Outcome::AsExpected,
        Some(signal) => Outcome::Interrupted(signal),
        None if report.as_expected() => Outcome::AsExpected,
        None => Outcome::NotAsExpected,
    })
}

/// `--cri unix:///PATH`: the runtime's socket.
fn cri_socket(endpoint: Option<&str>) -> Result<Option<PathBuf>, String> {
    endpoint
        .map(inlet_proto::uds::socket_path)
        .transpose()
        .map_err(|e| format!("--cri: {e}"))
}
