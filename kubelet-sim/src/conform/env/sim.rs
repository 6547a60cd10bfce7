//! A check's node simulated in-process: a [`Simulation`] of one node under the check's root, with the
//! timings a check wants (fast retries, a CSI timeout within a step's wait, stats polled every 500 ms).

use std::sync::Arc;
use std::time::Duration;

use super::{Conformance, NODE};
use crate::conform::ConformError;
use crate::node::{BackoffPolicy, ContainerTiming};
use crate::sim::{SimConfig, Simulation};

/// The simulation's settings for a check under `root`.
pub(super) fn config(conf: &Conformance, root: &std::path::Path) -> SimConfig {
    SimConfig {
        root: root.to_path_buf(),
        nodes: 1,
        drivers: Vec::new(),
        cri: None,
        // stats/volume-condition reads volumes' conditions, as a kubelet with the alpha gate does.
        gates: {
            let mut gates = crate::sim::default_gates();
            gates.insert(inlet_volume::csi::metrics::CSI_VOLUME_HEALTH.to_string());
            gates
        },
        // The host's own answer: a driver is only given contexts where its mounts can take them.
        selinux: inlet_host::selinux::enabled(),
        allowed_inline_drivers: None,
        // Fast retries: a check waits on what the kubelet does, not on upstream's back-off.
        backoff: BackoffPolicy {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(500),
        },
        volume_wait_timeout: conf.wait,
        // A CSI call gets no more than a step of the check can wait: a driver that never answers fails
        // the call (DEADLINE_EXCEEDED, a FailedMount event) within the check's --timeout, as upstream's
        // 2 min CSI timeout falls within its 2 min 3 s volume wait.
        csi_timeout: csi_timeout(conf),
        republish_period: Duration::from_millis(300),
        // The stats provider polls every volume, as a kubelet's does every minute.
        volume_stats_agg_period: Duration::from_millis(500),
        containers: ContainerTiming {
            relist_period: Duration::from_millis(100),
            backoff: BackoffPolicy {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(1),
            },
            runtime_request_timeout: Duration::from_secs(10),
        },
        mounter: Arc::clone(&conf.mounter.0),
        images: conf.images.clone(),
        plugins_registry: None,
        node_name_prefix: "node".into(),
        cluster: None,
    }
}

/// How long the kubelet (and the proxy) give one CSI call.
pub(super) fn csi_timeout(conf: &Conformance) -> Duration {
    conf.wait * 4 / 5
}

/// Starts the simulated node; the driver is registered once it runs ([`register`]).
pub(super) async fn start(
    conf: &Conformance,
    root: &std::path::Path,
) -> Result<Simulation, ConformError> {
    Ok(Simulation::start(config(conf, root)).await?)
}

/// Gives the simulated node the driver's CSIDriver and registers the driver at the proxy's socket.
pub(super) async fn register(
    sim: &mut Simulation,
    conf: &Conformance,
    proxy_socket: &std::path::Path,
) -> Result<(), ConformError> {
    use crate::api::manifest::{Manifest, Object};
    sim.apply(vec![Manifest {
        origin: "conform".into(),
        object: Object::CsiDriver(Box::new(conf.info.csi_driver.clone())),
    }])
    .await;
    sim.register(NODE, conf.setup.name(), proxy_socket).await?;
    Ok(())
}
