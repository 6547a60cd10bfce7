//! `kubelet-sim conform`: a kubelet-level conformance suite for any CSI driver's inline-volume support.
//!
//! csi-sanity checks a driver's answers one gRPC call at a time; conform runs the driver through what a
//! kubelet does with inline volumes (pod info, the ephemeral flag, retries after a deadline, republish,
//! a kubelet restart, a driver restart, many pods at once, staging for PVs, secrets), as pods on a
//! simulated node, over real sockets (real mounts as root), or (`--kubeconfig`) on a real cluster's node.
//! Laid out as:
//!
//! ```text
//! driver.rs   the driver under test: identity, capabilities, its CSIDriver (given or suggested); where it
//!             runs (in-process, or on a socket) and how it restarts
//! testdriver.rs  --testdriver: e2e's external driver definition (capabilities, InlineVolumes)
//! proxy.rs    FaultProxy: between the kubelet and the driver, records every call and turns chosen OK
//!             answers into deadlines
//! env/        CheckEnv: one check's node, driver and proxy, and the steps checks are written in; the node
//!             a fresh simulation (sim.rs) or a real cluster's (cluster.rs); leftovers.rs what is left
//! checks/     the catalogue (mod.rs: id, what it expects, its upstream source, when it applies), and
//!             each group's checks in a file of its own
//! output.rs   the table, the JSON report (every CSI call of a failed check), JUnit XML
//! ```
//!
//! `conform.md` beside this crate documents each check and how to run conform in a driver's CI.

pub mod checks;
pub mod driver;
pub mod env;
mod error;
pub mod output;
pub mod proxy;
pub mod testdriver;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inlet_host::mount::MountLayer;
use inlet_proto::csi_call::CsiCall;

use crate::drivers::{DriverArg, DriverSource};
use crate::signals::Interrupts;
use crate::sim::{SimConfig, SimImages, Simulation};
use checks::Check;
use driver::{DriverInfo, DriverSetup};
use env::{CheckEnv, Conformance};
pub use error::ConformError;
use testdriver::TestDriver;

/// How conform is run.
pub struct ConformOptions {
    /// The driver under test.
    pub driver: DriverArg,
    /// `--csidriver`: the CSIDriver object's YAML file; None uses the suggested one.
    pub csi_driver: Option<PathBuf>,
    /// `--testdriver`: e2e's driver definition file.
    pub testdriver: Option<PathBuf>,
    /// `--only`: the checks whose id matches one of these globs; empty runs them all.
    pub only: Vec<glob::Pattern>,
    /// `--root`: where each check's node lives; None uses a temp dir removed afterwards.
    pub root: Option<PathBuf>,
    /// `--volume-attribute`: what every inline volume carries.
    pub attributes: BTreeMap<String, String>,
    /// `--restart-command`: restarts an external driver.
    pub restart_command: Option<String>,
    /// How long one step of a check waits.
    pub wait: Duration,
    /// Images for the in-process runtime (an in-process image driver pulls from it).
    pub images: SimImages,
    /// The mount layer, and whether its mounts are real.
    pub mounter: (Arc<dyn MountLayer>, bool),
    /// SIGINT/SIGTERM: the running check stops and tears down, the rest are not run.
    pub interrupts: Option<Interrupts>,
    /// `--kubeconfig`: run the checks on this real node (the driver serving on a socket).
    pub cluster: Option<env::ClusterTarget>,
}

/// A check's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It passed.
    Pass,
    /// It failed.
    Fail,
    /// It does not apply to this driver.
    Skip,
}

/// One row of the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckResult {
    /// The check's id.
    pub id: String,
    /// pass, fail or skip.
    pub result: Verdict,
    /// Why it failed or was skipped, or what a pass could not observe.
    pub reason: String,
    /// How long it took, setup included.
    pub seconds: f64,
    /// What the driver must do.
    pub expects: String,
    /// Where that comes from.
    pub source: String,
    /// Answers the proxy replaced with a deadline.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub injected_deadlines: Vec<String>,
    /// Every CSI call the kubelet made in a failed check, as evidence.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub csi_calls: Vec<CsiCall>,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConformReport {
    /// What the driver says of itself.
    pub driver: DriverInfo,
    /// The CSIDriver object the checks ran with.
    pub csi_driver: k8s_openapi::api::storage::v1::CSIDriver,
    /// `--testdriver`'s definition, with what e2e would have ignored in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub testdriver: Option<TestDriver>,
    /// Every selected check.
    pub checks: Vec<CheckResult>,
    /// How many passed.
    pub passed: usize,
    /// How many failed.
    pub failed: usize,
    /// How many were skipped.
    pub skipped: usize,
}

/// How long a failed check's teardown is waited for (and conform's own tasks to stop).
pub(crate) const CLEANUP_WAIT: Duration = Duration::from_secs(5);

/// The same on a real node, whose kubelet takes 10 to 20 s to let a pod go (its status manager syncs
/// every 10 s): long enough for an orderly teardown before the pods are removed from the API.
const CLUSTER_CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// How long a whole check may take, whatever its steps' waits: a hung driver call cannot stall the run.
fn check_deadline(wait: Duration) -> Duration {
    wait * 6
}

/// Runs every selected check, printing each row to `table` as it ends.
pub async fn run(
    options: ConformOptions,
    table: &mut impl Write,
) -> Result<ConformReport, ConformError> {
    let catalogue: Vec<Check> = checks::catalogue()
        .into_iter()
        .filter(|c| options.only.is_empty() || options.only.iter().any(|g| g.matches(c.id)))
        .collect();
    if catalogue.is_empty() {
        let known: Vec<&str> = checks::catalogue().iter().map(|c| c.id).collect();
        return Err(ConformError::Usage(format!(
            "--only matches no check (the checks: {})",
            known.join(", ")
        )));
    }
    let temp = match &options.root {
        Some(_) => None,
        None => Some(tempfile::tempdir().map_err(ConformError::io("a temp dir"))?),
    };
    let root = options
        .root
        .clone()
        .or_else(|| temp.as_ref().map(|t| t.path().to_path_buf()))
        .unwrap_or_default();
    std::fs::create_dir_all(&root).map_err(ConformError::io(root.display()))?;
    let setup = DriverSetup {
        arg: options.driver.clone(),
        restart_command: options.restart_command.clone(),
        images: options.images.clone(),
        mounter: Arc::clone(&options.mounter.0),
    };
    let mut info = describe(&setup, &root, &options).await?;
    let csi_driver_yaml = match &options.csi_driver {
        Some(path) => {
            info.csi_driver_source = path.display().to_string();
            std::fs::read_to_string(path).map_err(ConformError::io(path.display()))?
        }
        None => {
            let yaml = driver::suggested_csi_driver(&info);
            eprintln!(
                "kubelet-sim conform: no --csidriver given: testing with the CSIDriver this driver would \
                 need (save it and pass it with --csidriver to test another):\n{yaml}"
            );
            info.csi_driver_source = "suggested".into();
            yaml
        }
    };
    info.csi_driver =
        driver::csi_driver_from(&csi_driver_yaml, &info.csi_driver_source, &info.name)?;
    let testdriver = options
        .testdriver
        .as_deref()
        .map(|path| load_testdriver(path, &info.name))
        .transpose()?;
    let conf = Arc::new(Conformance {
        setup,
        info: info.clone(),
        root: root.clone(),
        inline_volumes: env::inline_volumes(testdriver.as_ref(), &options.attributes),
        testdriver: testdriver.clone(),
        wait: options.wait,
        images: options.images.clone(),
        mounter: options.mounter.clone(),
        cluster: options.cluster.clone(),
    });
    // On a real cluster the checks replace the driver's CSIDriver: what was there is put back after.
    let saved_csi_driver = match &conf.cluster {
        Some(target) => Some(
            target
                .save_csi_driver(&info.name)
                .await
                .map_err(ConformError::Cluster)?,
        ),
        None => None,
    };
    output::write_header(table, &info).map_err(ConformError::io("the table"))?;
    let mut results = Vec::new();
    let mut interrupts = options.interrupts;
    for check in &catalogue {
        if let Some(signal) = interrupts.as_ref().and_then(Interrupts::received) {
            eprintln!("kubelet-sim conform: {signal}: the remaining checks are not run");
            break;
        }
        let result = run_check(check, &conf, &mut interrupts).await;
        output::write_row(table, &result).map_err(ConformError::io("the table"))?;
        results.push(result);
    }
    if let (Some(target), Some(saved)) = (&conf.cluster, saved_csi_driver) {
        target.restore_csi_driver(&info.name, saved).await;
    }
    let count = |v: Verdict| results.iter().filter(|r| r.result == v).count();
    let report = ConformReport {
        csi_driver: info.csi_driver.clone(),
        testdriver,
        driver: info,
        passed: count(Verdict::Pass),
        failed: count(Verdict::Fail),
        skipped: count(Verdict::Skip),
        checks: results,
    };
    output::write_footer(table, &report).map_err(ConformError::io("the table"))?;
    // A temp root is removed, unless something is still mounted below it: removing it would reach into
    // the mounted volumes.
    if let Some(temp) = temp
        && conf.mounter.0.anything_mounted_under(&root)
    {
        eprintln!(
            "kubelet-sim conform: mounts are left under {}: kept for a look",
            temp.keep().display()
        );
    }
    Ok(report)
}

/// Reads `--testdriver`: it must describe the driver under test; what e2e would ignore in it is said.
fn load_testdriver(path: &std::path::Path, name: &str) -> Result<TestDriver, ConformError> {
    let testdriver = TestDriver::load(path)?;
    if testdriver.name != name {
        return Err(ConformError::Usage(format!(
            "{}: DriverInfo.Name is {:?}, but the driver under test is {name:?}",
            path.display(),
            testdriver.name
        )));
    }
    for ignored in &testdriver.ignored {
        eprintln!(
            "kubelet-sim conform: {}: {ignored}: unknown, e2e would ignore it",
            path.display()
        );
    }
    Ok(testdriver)
}

/// Starts the driver once (an in-process one on a node of its own) and asks it who it is.
async fn describe(
    setup: &DriverSetup,
    root: &std::path::Path,
    options: &ConformOptions,
) -> Result<DriverInfo, ConformError> {
    if let DriverSource::Socket(socket) = &setup.arg.source {
        return driver::describe(socket, setup.name()).await;
    }
    // An in-process driver (an image driver pulls through the simulation's runtime).
    let describe_root = root.join("describe");
    let sim = Simulation::start(SimConfig {
        root: describe_root.clone(),
        nodes: 1,
        drivers: Vec::new(),
        cri: None,
        gates: Default::default(),
        selinux: false,
        allowed_inline_drivers: None,
        backoff: Default::default(),
        volume_wait_timeout: options.wait,
        csi_timeout: inlet_volume::csi::CSI_TIMEOUT,
        republish_period: Duration::from_secs(60),
        volume_stats_agg_period: Duration::from_secs(60),
        containers: Default::default(),
        mounter: Arc::clone(&options.mounter.0),
        images: options.images.clone(),
        plugins_registry: None,
        node_name_prefix: "node".into(),
        cluster: None,
    })
    .await?;
    let started = setup
        .start(
            env::NODE,
            &describe_root.join(env::NODE),
            sim.cri_socket(env::NODE),
        )
        .await;
    let described = match started {
        Ok((socket, run)) => {
            let described = driver::describe(&socket, setup.name()).await;
            setup.stop(run).await;
            described
        }
        Err(e) => Err(e),
    };
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&describe_root);
    described
}

/// `text` without the values of the Secrets conform made, should a driver have echoed one.
fn redact(text: String) -> String {
    checks::SECRET_VALUES
        .iter()
        .fold(text, |text, value| text.replace(value, "<redacted>"))
}

/// Runs one check in a fresh environment, within its deadline (or until a signal). A check that did not
/// pass is torn down before its environment stops, so that it leaves nothing either.
async fn run_check(
    check: &Check,
    conf: &Arc<Conformance>,
    interrupts: &mut Option<Interrupts>,
) -> CheckResult {
    let started = Instant::now();
    let mut result = CheckResult {
        id: check.id.to_string(),
        result: Verdict::Skip,
        reason: String::new(),
        seconds: 0.0,
        expects: check.expects.to_string(),
        source: check.source.to_string(),
        injected_deadlines: Vec::new(),
        csi_calls: Vec::new(),
    };
    if let Err(reason) = (check.applies)(conf) {
        result.reason = reason;
        return result;
    }
    let outcome = match CheckEnv::start(Arc::clone(conf), check.id).await {
        Ok(mut env) => {
            let deadline = check_deadline(conf.wait);
            let signal = async {
                match interrupts {
                    Some(interrupts) => interrupts.wait().await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(deadline, (check.run)(&mut env)) => match outcome {
                    Ok(outcome) => outcome,
                    Err(_) => Err(format!("the check did not finish within {deadline:?}")),
                },
                signal = signal => Err(format!("interrupted by {signal}")),
            };
            result.injected_deadlines =
                env.proxy.injected().iter().map(|m| m.to_string()).collect();
            if outcome.is_err() {
                // The calls that returned, then those still without an answer (a driver that hangs).
                result.csi_calls = env.calls();
                result.csi_calls.extend(env.calls_in_flight());
                // Best effort, and briefly: a driver that failed may never let its pods go.
                let wait = match conf.cluster {
                    Some(_) => CLUSTER_CLEANUP_WAIT,
                    None => CLEANUP_WAIT,
                };
                let cleanup = tokio::time::timeout(wait.min(conf.wait), env.nothing_left(&[]));
                match cleanup.await {
                    Ok(Ok(())) => {}
                    Ok(Err(left)) => tracing::warn!(check = check.id, "after the failure: {left}"),
                    Err(_) => tracing::warn!(check = check.id, "after the failure: pods left"),
                }
            }
            env.finish().await;
            outcome
        }
        Err(e) => Err(format!("could not start: {e}")),
    };
    (result.result, result.reason) = match outcome {
        Ok(note) => (Verdict::Pass, redact(note)),
        Err(reason) => (Verdict::Fail, redact(reason)),
    };
    for call in &mut result.csi_calls {
        call.message = redact(std::mem::take(&mut call.message));
    }
    result.seconds = started.elapsed().as_secs_f64();
    result
}
