//! The hollow nodes `bench hollow-nodes` measures: all in this process (a [`Simulation`]), or spread over
//! child `kubelet-sim run --kubeconfig` processes, as `deploy/hollow-nodes/` spreads them over pods. Each
//! node holds about a dozen sockets (its runtime's, its driver's, their connections), so a process's
//! open-files limit bounds the nodes it can hold: 20,000 holds about 1,400; 5,000 nodes need several
//! processes wherever the hard limit cannot be raised.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use inlet_host::mount::MountLayer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use tokio::process::{Child, Command};

use super::BenchError;
use crate::api::manifest;
use crate::drivers::DriverArg;
use crate::sim::{SimConfig, Simulation};

/// The hollow nodes a bench runs on a real cluster.
pub struct FleetConfig {
    /// The cluster.
    pub client: kube::Client,
    /// The kubeconfig's path, for the children.
    pub kubeconfig: PathBuf,
    /// Hollow nodes.
    pub nodes: usize,
    /// Processes the nodes are spread over: 1 runs them here; more start `kubelet-sim run --kubeconfig`
    /// children, as a hollow-node Deployment's pods (each process's open-files limit bounds its nodes).
    pub processes: usize,
    /// The driver (`NAME=local`).
    pub driver: DriverArg,
    /// Where node state goes.
    pub root: PathBuf,
    /// The mount layer.
    pub mounter: Arc<dyn MountLayer>,
    /// Whether mounts are real (the children's `--mounter`).
    pub real_mounts: bool,
    /// The longest a step may take, and the nodes' drain when they leave.
    pub limit: Duration,
}

/// Where the nodes run.
pub enum Fleet {
    /// In this process.
    InProcess(Box<Simulation>),
    /// In child processes, each named `<prefix>-p<i>`.
    Children(Vec<Child>),
}

/// What child processes are started with.
struct ChildSpec<'a> {
    /// The cluster's kubeconfig.
    kubeconfig: &'a Path,
    /// The driver, `NAME=local`.
    driver: String,
    /// `linux` or `recording`.
    mounter: &'static str,
    /// Each child's root is `<root>/p<i>`.
    root: &'a Path,
    /// How long a child may take to drain its nodes when stopped.
    limit: Duration,
}

/// How many of `nodes` process `i` of `processes` holds: the first processes take one more when they do
/// not divide evenly.
fn share(nodes: usize, processes: usize, i: usize) -> usize {
    nodes / processes + usize::from(i < nodes % processes)
}

impl Fleet {
    /// The driver's CSIDriver created on the cluster, then the nodes started, named after `prefix`.
    pub async fn join(
        config: &FleetConfig,
        prefix: &str,
    ) -> Result<(Self, Vec<String>), BenchError> {
        create_csidriver(&config.client, &config.driver.name).await?;
        let sim_config = super::sim_config(
            &config.root,
            config.nodes,
            &config.driver,
            &config.mounter,
            prefix,
            Some(config.client.clone()),
        );
        let children = ChildSpec {
            kubeconfig: &config.kubeconfig,
            driver: format!("{}=local", config.driver.name),
            mounter: if config.real_mounts {
                "linux"
            } else {
                "recording"
            },
            root: &config.root,
            limit: config.limit,
        };
        Self::start(sim_config, config.processes, &children).await
    }

    /// Starts `config.nodes` nodes in this process (`processes` 1) or over `processes` children.
    async fn start(
        config: SimConfig,
        processes: usize,
        child: &ChildSpec<'_>,
    ) -> Result<(Self, Vec<String>), BenchError> {
        if processes <= 1 {
            let sim = Simulation::start(config).await?;
            let names = sim.nodes.iter().map(|n| n.config.name.clone()).collect();
            return Ok((Self::InProcess(Box::new(sim)), names));
        }
        let exe = std::env::current_exe().map_err(BenchError::io("this program"))?;
        let (mut children, mut names) = (Vec::new(), Vec::new());
        for i in 0..processes {
            let count = share(config.nodes, processes, i);
            if count == 0 {
                continue;
            }
            let prefix = format!("{}-p{}", config.node_name_prefix, i + 1);
            names.extend((1..=count).map(|n| format!("{prefix}-{n}")));
            let root = child.root.join(format!("p{}", i + 1));
            let log = std::fs::File::create(child.root.join(format!("p{}.log", i + 1)))
                .map_err(BenchError::io("a child's log"))?;
            let log_err = log.try_clone().map_err(BenchError::io("a child's log"))?;
            let spawned = Command::new(&exe)
                .args([
                    "run",
                    "--nodes",
                    &count.to_string(),
                    "--node-name-prefix",
                    &prefix,
                ])
                .arg("--kubeconfig")
                .arg(child.kubeconfig)
                .args(["--driver", &child.driver, "--mounter", child.mounter])
                .arg("--root")
                .arg(&root)
                .args(["--drain-on-exit", "--timeout"])
                .arg(format!("{}s", child.limit.as_secs().max(1)))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                // Only if this bench dies without stopping them: SIGKILL, their nodes left NotReady.
                .kill_on_drop(true)
                .spawn()
                .map_err(BenchError::io("starting a hollow-node process"))?;
            children.push(spawned);
        }
        Ok((Self::Children(children), names))
    }

    /// This process's resident memory, MiB.
    pub fn own_rss_mib() -> f64 {
        mib(inlet_host::metrics::process::resident_bytes())
    }

    /// The resident memory of every process holding nodes, MiB (this one's when they are here).
    pub fn rss_mib(&self) -> f64 {
        match self {
            Self::InProcess(_) => Self::own_rss_mib(),
            Self::Children(children) => mib(self::sum(
                children,
                inlet_host::metrics::process::resident_bytes_of,
            )),
        }
    }

    /// The CPU time of every process holding nodes.
    pub fn cpu_time(&self) -> Duration {
        let seconds = match self {
            Self::InProcess(_) => inlet_host::metrics::process::cpu_seconds(),
            Self::Children(children) => {
                self::sum(children, inlet_host::metrics::process::cpu_seconds_of)
            }
        };
        Duration::from_secs_f64(seconds.unwrap_or(0.0))
    }

    /// The peak resident memory of every process holding nodes (this one's too), MiB: an upper bound of
    /// the fleet's, as the processes peak at different moments.
    pub fn peak_rss_mib(&self) -> u64 {
        let own = super::stats::peak_rss_mib();
        match self {
            Self::InProcess(_) => own,
            Self::Children(children) => {
                let peak = self::sum(
                    children,
                    inlet_host::metrics::process::peak_resident_bytes_of,
                );
                own + peak.unwrap_or(0) / (1 << 20)
            }
        }
    }

    /// Whatever `measured` came to: the bench's pods (`selector`) deleted, then the nodes gone from the
    /// cluster ([`Self::leave`]); the figures, else the first error.
    pub async fn leave_after<T>(
        self,
        measured: Result<T, BenchError>,
        pods: &kube::Api<Pod>,
        selector: &ListParams,
        limit: Duration,
    ) -> Result<T, BenchError> {
        let _ = pods
            .delete_collection(&DeleteParams::default(), selector)
            .await;
        let left = self.leave(limit).await;
        let figures = measured?;
        left?;
        Ok(figures)
    }

    /// The nodes leave the cluster (drained and deleted) and stop: the children on SIGTERM, as a
    /// Deployment scaled down stops its pods, each given `limit` and a little more to drain.
    pub async fn leave(self, limit: Duration) -> Result<(), BenchError> {
        match self {
            Self::InProcess(sim) => {
                let left = sim.leave_cluster(limit).await;
                sim.shutdown().await;
                Ok(left?)
            }
            Self::Children(mut children) => {
                for child in &children {
                    if let Some(pid) = child.id() {
                        let pid = nix::unistd::Pid::from_raw(pid as i32);
                        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                    }
                }
                let mut failed = Vec::new();
                for (i, child) in children.iter_mut().enumerate() {
                    let waited =
                        tokio::time::timeout(limit + Duration::from_secs(30), child.wait());
                    match waited.await {
                        // `run --kubeconfig` without manifests exits 0 after leaving, or 143 on SIGTERM.
                        Ok(Ok(status)) if matches!(status.code(), Some(0) | Some(143)) => {}
                        Ok(Ok(status)) => failed.push(format!("process p{}: {status}", i + 1)),
                        Ok(Err(e)) => failed.push(format!("process p{}: {e}", i + 1)),
                        Err(_) => failed.push(format!("process p{}: did not stop", i + 1)),
                    }
                }
                match failed.is_empty() {
                    true => Ok(()),
                    false => Err(BenchError::Output(format!(
                        "hollow-node processes: {} (their logs: p<i>.log under the root)",
                        failed.join("; ")
                    ))),
                }
            }
        }
    }
}

/// Bytes, when known, in MiB.
fn mib(bytes: Option<u64>) -> f64 {
    bytes.unwrap_or(0) as f64 / (1 << 20) as f64
}

/// The sum of `figure` over the children still running; None when none gave one.
fn sum<T: std::ops::Add<Output = T>>(
    children: &[Child],
    figure: impl Fn(i32) -> Option<T>,
) -> Option<T> {
    let figures = children.iter().filter_map(|c| figure(c.id()? as i32));
    figures.reduce(|a, b| a + b)
}

/// The driver's CSIDriver, so that its inline volumes are allowed (Ephemeral).
async fn create_csidriver(client: &kube::Client, driver: &str) -> Result<(), BenchError> {
    let csidriver = format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\nspec: {{attachRequired: false, volumeLifecycleModes: [Persistent, Ephemeral]}}\n"
    );
    let cluster = crate::cluster::Cluster::new(client.clone());
    for object in
        manifest::parse(&csidriver, "bench").map_err(|e| BenchError::Output(e.to_string()))?
    {
        cluster
            .create(object.object, "")
            .await
            .map_err(|e| BenchError::Output(format!("creating the CSIDriver: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn nodes_are_dealt_out_evenly() {
        let shares: Vec<usize> = (0..3).map(|i| share(10, 3, i)).collect();
        assert_eq!(shares, [4, 3, 3]);
        assert_eq!((0..4).map(|i| share(2, 4, i)).sum::<usize>(), 2);
    }
}
