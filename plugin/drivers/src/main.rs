//! `inlet-plugin`: serves inlet's CSI drivers on a unix socket. See `inlet-plugin serve --help`.

mod startup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_host::quantity::parse_bytes;
use inlet_image::allowlist::{Allowlist, allowlist_entry};
use inlet_image::{Engine, EngineConfig, StorageKind, VerificationPolicy};
use inlet_plugin::call_log::CallLog;
use inlet_plugin::image::{ImageDriverConfig, ImageService};
use inlet_plugin::local::content_mount::ContentMount;
use inlet_plugin::local::{LocalConfig, LocalDriver, LocalService};
use inlet_plugin::metrics::{CsiMetrics, PublishedVolumes, register_published};
use inlet_plugin::registration::Registrar;
use inlet_plugin::server::{ServeOptions, serve_csi_with};
use inlet_proto::csi::v1::{
    controller_server::Controller, identity_server::Identity, node_server::Node,
};
use prometheus_client::registry::Registry;

#[derive(Parser)]
#[command(
    name = "inlet-plugin",
    version,
    about = "inlet's CSI drivers, served on a unix socket"
)]
struct Cli {
    /// Log format on stderr. The level comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a CSI driver (Identity, Controller, Node) until SIGTERM or SIGINT.
    Serve(Box<ServeArgs>),
    /// Ask a CSI driver whether it is ready (Identity.Probe), as a liveness check: exit 0 when it answers
    /// ready, 1 otherwise, saying why on stderr. What the livenessprobe sidecar does, without a sidecar.
    Probe(ProbeArgs),
}

#[derive(clap::Args)]
struct ProbeArgs {
    /// The driver's socket: unix:///path/to/csi.sock.
    #[arg(long)]
    endpoint: String,
    /// How long the probe may take (the livenessprobe sidecar's default is 1 s; a kubelet exec probe's
    /// timeoutSeconds should be longer).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Which driver to serve.
    #[arg(long, value_enum)]
    driver: DriverKind,
    /// The CSI driver name reported by GetPluginInfo, in domain-name form (for example local.inlet.dev).
    #[arg(long, value_parser = parse_driver_name)]
    name: String,
    /// Where to listen: unix:///path/to/csi.sock. A stale socket file from a crash is replaced.
    #[arg(long)]
    endpoint: String,
    /// This node's id, reported by NodeGetInfo and the only node ControllerPublishVolume accepts.
    /// Default: $NODE_NAME (a DaemonSet sets it from spec.nodeName), else the host's name.
    #[arg(long, env = "NODE_NAME")]
    node_id: Option<String>,
    /// Where volume records and content are kept; they survive restarts.
    #[arg(long)]
    state_dir: PathBuf,
    /// Offer ControllerPublish/Unpublish (attach) and require it before NodeStageVolume.
    #[arg(long)]
    enable_attach: bool,
    /// Total size all volumes may allocate, as a Kubernetes quantity.
    #[arg(long, default_value = "10Gi", value_parser = parse_bytes)]
    capacity: u64,
    /// Largest single volume, as a Kubernetes quantity (default: the whole --capacity).
    #[arg(long, value_parser = parse_bytes)]
    max_volume_size: Option<u64>,
    /// Size of a volume whose request names none: CreateVolume without a capacity range, or an ephemeral
    /// inline volume without a `size` attribute.
    #[arg(long, default_value = "100Mi", value_parser = parse_bytes)]
    default_volume_size: u64,
    /// Treat a NodePublishVolume without the csi.storage.k8s.io/ephemeral key (the kubelet sends it only
    /// with podInfoOnMount: true), without a staging path, of an unknown volume as ephemeral.
    #[arg(long)]
    ephemeral: bool,
    /// Advertise VOLUME_MOUNT_GROUP and give each volume to the group the kubelet sends (the pod's
    /// fsGroup) instead of letting the kubelet change its ownership.
    #[arg(long)]
    volume_mount_group: bool,
    /// Target and staging paths must be inside this directory (the kubelet's root dir).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Register with the kubelet's plugin watcher through this directory (the kubelet's
    /// `plugins_registry`), as node-driver-registrar would: serves `DIR/<name>-reg.sock`.
    #[arg(long, value_name = "DIR")]
    registration_dir: Option<PathBuf>,
    /// Append every Node call received to this file, one JSON line each (secrets by key name only,
    /// service-account tokens redacted): what the kubelet sent, to compare or debug.
    #[arg(long, value_name = "FILE")]
    call_log: Option<PathBuf>,
    /// How to mount: `linux` (real mounts, needs root), `recording` (a fake that records calls and mounts
    /// nothing), or `auto` (linux when root, else recording with a warning).
    #[arg(long, value_enum, default_value_t = MounterKind::Auto)]
    mounter: MounterKind,
    /// `image` driver: the container runtime's CRI socket (unix:///run/containerd/containerd.sock),
    /// which pulls every image.
    #[arg(long, required_if_eq("driver", "image"))]
    runtime_endpoint: Option<String>,
    /// `image` driver: where the runtime keeps images.
    #[arg(long, value_enum, default_value_t = StorageKind::Auto)]
    storage: StorageKind,
    /// `image` driver: containers/storage's root (default: the runtime's image filesystem).
    #[arg(long)]
    storage_root: Option<PathBuf>,
    /// `image` driver: containerd's snapshotter.
    #[arg(long, default_value = "overlayfs")]
    snapshotter: String,
    /// `image` driver: the longest a NodePublishVolume waits for a pull before answering ABORTED while
    /// the pull goes on (less when the caller's deadline is shorter).
    #[arg(long, default_value = "100s", value_parser = humantime::parse_duration)]
    pull_wait: std::time::Duration,
    /// `image` driver: which cached images a volume must prove credentials for (KEP-2535's policy).
    #[arg(long, value_enum, default_value_t = VerificationPolicy::NeverVerifyPreloadedImages)]
    image_pull_credentials_verification_policy: VerificationPolicy,
    /// `image` driver: the images NeverVerifyAllowlistedImages hands out without proof, comma-separated:
    /// full names without tag or digest (`registry.example/team/tool`), or prefixes ending in `/*` (the
    /// kubelet's preloadedImagesVerificationAllowlist).
    #[arg(long, value_delimiter = ',', value_parser = allowlist_entry)]
    preloaded_images_verification_allowlist: Vec<String>,
    /// `image` driver: the dir of the node's record of which credentials pulled which image (KEP-2535),
    /// in the kubelet's format and shared with the node's other pullers (the kubelet itself, kubelet-sim),
    /// so an image one pulled with credentials is not taken for preloaded by another. Default: the
    /// kubelet's, `<kubelet-dir>/image_manager`.
    #[arg(long, value_name = "DIR")]
    pull_records_dir: Option<PathBuf>,
    /// `image` driver: a registry OCI artifacts (`artifact: "true"` volumes, fetched without the runtime)
    /// may be fetched from over plain HTTP (HOST:PORT). Repeatable.
    #[arg(long = "artifact-insecure-registry")]
    artifact_insecure_registries: Vec<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (`:PORT` for every interface):
    /// `csi_operations_seconds`, the published volumes by mode, the image driver's pulls, `process_*`;
    /// and the liveness check at /healthz: 200 `ok` when the driver answers Probe on its own socket
    /// ready, 500 with the reason otherwise (the livenessprobe sidecar's endpoint, without a sidecar).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<String>,
    /// How long /healthz may take to connect to the driver's socket and call Probe, both together (the
    /// livenessprobe sidecar's flag and default). Keep it under the liveness probe's timeoutSeconds.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    probe_timeout: std::time::Duration,
}

#[derive(Clone, Copy, ValueEnum)]
enum DriverKind {
    /// Directories (or loop-attached files for raw block) under --state-dir.
    Local,
    /// Container images as volumes, pulled through the runtime at --runtime-endpoint.
    Image,
}

#[derive(Clone, Copy, ValueEnum)]
enum MounterKind {
    Auto,
    Linux,
    Recording,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The CSI spec's rule for plugin names (at most 63 characters, alphanumerics, '-', '.' and '_', beginning
/// and ending with an alphanumeric) and the API server's for a CSIDriver's (`ValidateCSIDriverName`: a
/// DNS-1123 subdomain once lowercased, so no '_'): the name is a directory on the node, and a driver the
/// API cannot name cannot be used.
fn parse_driver_name(name: &str) -> Result<String, String> {
    let errors = inlet_host::names::csi_driver_name_errors(name, "--name");
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(name.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("inlet-plugin: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let done = match cli.command {
        Command::Serve(args) => check_paths(&args).and_then(|()| runtime.block_on(serve(*args))),
        Command::Probe(args) => runtime.block_on(probe(args)),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("inlet-plugin: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The host paths the driver is given, checked before it starts (see [`startup`]).
fn check_paths(args: &ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    use startup::{Expect, check};
    check(
        "--kubelet-dir",
        &args.kubelet_dir,
        Expect::Directory,
        "the kubelet's root dir, mounted at its host path",
    )?;
    if let Some(dir) = &args.registration_dir {
        check(
            "--registration-dir",
            dir,
            Expect::Directory,
            "the kubelet's plugins_registry dir (<kubelet root>/plugins_registry)",
        )?;
    }
    check(
        "--state-dir",
        &args.state_dir,
        Expect::CreatedDirectory,
        "a writable directory for the driver's records",
    )?;
    if let Some(endpoint) = &args.runtime_endpoint {
        let socket = inlet_proto::uds::socket_path(endpoint)
            .map_err(|e| format!("--runtime-endpoint: {e}"))?;
        check(
            "--runtime-endpoint",
            &socket,
            Expect::Socket,
            "the container runtime's CRI socket (mount its directory into the driver)",
        )?;
    }
    Ok(())
}

async fn probe(args: ProbeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = inlet_proto::uds::socket_path(&args.endpoint)?;
    Ok(inlet_plugin::health::check(&socket, args.timeout).await?)
}

async fn serve(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = inlet_proto::uds::socket_path(&args.endpoint)?;
    // Bound before anything is mounted or served, so a port in use stops the start cleanly.
    let metrics = match &args.metrics_address {
        Some(address) => Some(inlet_host::metrics::bind(address).await?),
        None => None,
    };
    let mounter: Arc<dyn MountLayer> = match (args.mounter, can_mount()) {
        (MounterKind::Linux, _) | (MounterKind::Auto, true) => Arc::new(LinuxMounter),
        (MounterKind::Recording, _) => Arc::new(RecordingMounter::new()),
        (MounterKind::Auto, false) => {
            tracing::warn!("not root: using the recording mounter, nothing will really be mounted");
            Arc::new(RecordingMounter::new())
        }
    };
    let call_log = match &args.call_log {
        Some(path) => {
            Some(Arc::new(CallLog::open(path, &args.name).map_err(|e| {
                format!("--call-log {}: {e}", path.display())
            })?))
        }
        None => None,
    };
    // One stop for every server: SIGTERM or SIGINT.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let serving = Serving {
        registration: args
            .registration_dir
            .clone()
            .map(|dir| (dir, Registrar::new(&args.name, &socket))),
        stopping,
        call_log,
        metrics,
        probe_timeout: args.probe_timeout,
        driver_name: args.name.clone(),
    };
    if let DriverKind::Image = args.driver {
        return serve_image(args, &socket, mounter, serving).await;
    }
    let config = LocalConfig {
        name: args.name,
        node_id: node_id(args.node_id)?,
        state_dir: args.state_dir,
        kubelet_dir: args.kubelet_dir,
        capacity_bytes: args.capacity,
        max_volume_bytes: args.max_volume_size.unwrap_or(args.capacity),
        default_volume_bytes: args.default_volume_size,
        enable_attach: args.enable_attach,
        ephemeral_default: args.ephemeral,
        volume_mount_group: args.volume_mount_group,
    };
    tracing::info!(driver = %config.name, node_id = %config.node_id, state_dir = %config.state_dir.display(), "starting local driver");
    let state_dir = config.state_dir.clone();
    let driver = LocalDriver::open(config, Arc::clone(&mounter))?;
    // Held while serving; undone at exit.
    let _content = ContentMount::bind(&state_dir, mounter)?;
    serving
        .serve(&socket, LocalService::new(driver), |_| {})
        .await
}

async fn serve_image(
    args: ServeArgs,
    socket: &std::path::Path,
    mounter: Arc<dyn MountLayer>,
    serving: Serving,
) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = args.runtime_endpoint.unwrap_or_default();
    let engine_config = EngineConfig {
        runtime_endpoint: inlet_proto::uds::socket_path(&runtime)?,
        storage: args.storage,
        storage_root: args.storage_root,
        snapshotter: args.snapshotter,
        state_dir: args.state_dir.clone(),
        verification: args.image_pull_credentials_verification_policy,
        preloaded_allowlist: Allowlist::parse(&args.preloaded_images_verification_allowlist)?,
        pull_records_dir: Some(
            args.pull_records_dir
                .unwrap_or_else(|| args.kubelet_dir.join("image_manager")),
        ),
        artifact_insecure_registries: args.artifact_insecure_registries,
    };
    tracing::info!(driver = %args.name, runtime, "starting image driver");
    let engine = Engine::start(&engine_config, mounter).await?;
    let config = ImageDriverConfig {
        name: args.name,
        node_id: node_id(args.node_id)?,
        kubelet_dir: args.kubelet_dir,
        state_dir: args.state_dir,
        pull_wait: args.pull_wait,
    };
    let image_metrics = engine.puller.metrics().clone();
    let service = ImageService::new(config, engine);
    serving
        .serve(socket, service, |registry| image_metrics.register(registry))
        .await
}

/// How a driver is served: its registration with the kubelet (if asked), the stop signal, the call log,
/// the metrics endpoint (bound, not yet serving) and its /healthz deadline.
struct Serving {
    registration: Option<(PathBuf, Registrar)>,
    stopping: tokio::sync::watch::Receiver<bool>,
    call_log: Option<Arc<CallLog>>,
    metrics: Option<inlet_host::metrics::MetricsListener>,
    probe_timeout: std::time::Duration,
    driver_name: String,
}

impl Serving {
    /// Listens on the CSI socket, registers once it accepts (the kubelet calls NodeGetInfo at once), and
    /// serves until stopped; then both sockets are removed. The metrics endpoint serves the driver's
    /// families, the process's, and those `more` registers, and /healthz.
    async fn serve<S>(
        self,
        socket: &std::path::Path,
        service: S,
        more: impl FnOnce(&mut Registry),
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        S: Identity + Controller + Node + PublishedVolumes + Clone,
    {
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        // The socket exists before /healthz is served, so a liveness probe at the container's start does
        // not find it missing; its connections wait in the backlog until the CSI server below serves.
        let incoming = inlet_proto::uds::listen(socket).await?;
        let csi_metrics = CsiMetrics::new(&self.driver_name);
        let endpoint = self.metrics.map(|listener| {
            let mut registry = Registry::default();
            inlet_host::metrics::process::register(&mut registry);
            csi_metrics.register(&mut registry);
            register_published(&mut registry, &self.driver_name, service.clone());
            more(&mut registry);
            let health =
                inlet_plugin::health::health_check(socket.to_path_buf(), self.probe_timeout);
            listener.serve_with_health(Arc::new(registry), Some(health))
        });
        let registration = self.registration.map(|(dir, registrar)| {
            let stop = stopped(self.stopping.clone());
            tokio::spawn(async move { registrar.serve(&dir, stop).await })
        });
        let options = ServeOptions {
            with_controller: true,
            call_log: self.call_log,
            metrics: endpoint.is_some().then_some(csi_metrics),
        };
        let csi = serve_csi_with(incoming, socket, service, options, stopped(self.stopping));
        csi.await?;
        if let Some(registration) = registration {
            registration.await??;
        }
        Ok(())
    }
}

/// `--node-id`, else the host's name.
fn node_id(flag: Option<String>) -> Result<String, String> {
    match flag {
        Some(id) => Ok(id),
        None => nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .map_err(|e| format!("--node-id is not set and the host's name cannot be read: {e}")),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colour only for a person at a terminal; files and log collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
