//! `cri-fake`: a fake CRI runtime on a unix socket. See `cri-fake serve --help`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cri_fake::faults::{self, Fault};
use cri_fake::pull::Registries;
use cri_fake::{FakeRuntime, serve};

#[derive(Parser)]
#[command(
    name = "cri-fake",
    version,
    about = "A fake CRI runtime (RuntimeService, ImageService) on a unix socket"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the CRI until SIGTERM or SIGINT.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where to listen: unix:///path/to/cri.sock.
    #[arg(long)]
    listen: String,
    /// Where images are kept (containers/storage's overlay layout); they survive restarts.
    #[arg(long, default_value = "/var/lib/cri-fake")]
    root: PathBuf,
    /// Pull real content over HTTPS from this registry (HOST[:PORT]). Images of registries not named here
    /// or with --insecure-registry are recorded without content. Repeatable.
    #[arg(long = "registry")]
    registries: Vec<String>,
    /// Pull real content over plain HTTP from this registry (HOST[:PORT]). Repeatable.
    #[arg(long = "insecure-registry")]
    insecure_registries: Vec<String>,
    /// Import the images of an OCI layout at start: REPOSITORY=DIR, each tag T becoming REPOSITORY:T.
    /// Repeatable.
    #[arg(long = "image-layout", value_parser = cri_fake::images::parse_layout_flag)]
    image_layouts: Vec<(String, PathBuf)>,
    /// Faults to inject, from a YAML or JSON file: `PullImage: {code: Unavailable, message: ..., delay: 2s, times: 1}`.
    #[arg(long)]
    faults: Option<PathBuf>,
    /// Fail a method: METHOD=CODE[:message], for example PullImage=UNAVAILABLE:registry down. Repeatable.
    #[arg(long = "fault", value_parser = faults::parse_error_flag)]
    fault: Vec<(String, Fault)>,
    /// Delay a method: METHOD=DURATION, for example CreateContainer=500ms. Repeatable.
    #[arg(long = "delay", value_parser = faults::parse_delay_flag)]
    delay: Vec<(String, Duration)>,
}

fn main() -> ExitCode {
    let Command::Serve(args) = Cli::parse().command;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cri-fake: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = inlet_proto::uds::socket_path(&args.listen)?;
    let mut all = match &args.faults {
        Some(path) => faults::load(path)?,
        None => Default::default(),
    };
    all.extend(args.fault);
    for (method, delay) in args.delay {
        all.entry(method).or_default().delay = Some(delay);
    }
    let registries = Registries {
        secure: args.registries,
        insecure: args.insecure_registries,
    };
    let runtime = Arc::new(
        FakeRuntime::with_registries(args.root.clone(), all, registries)
            .map_err(|e| format!("{}: {e}", args.root.display()))?,
    );
    for (repository, dir) in &args.image_layouts {
        runtime
            .images()
            .import_layout(dir, repository)
            .map_err(|e| format!("--image-layout {repository}={}: {e}", dir.display()))?;
    }
    tokio::runtime::Runtime::new()?.block_on(serve(&socket, runtime, shutdown_signal()))?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        },
        Err(_) => drop(tokio::signal::ctrl_c().await),
    }
}
