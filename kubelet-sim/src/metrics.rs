//! `kubelet-sim run --metrics-address`: the kubelet's storage metrics, with upstream's names, labels,
//! label values and buckets, recorded by every simulated node of the process into one registry (as one
//! kubelet's `legacyregistry`; with several nodes, each series sums over them):
//!
//! - `storage_operation_duration_seconds{volume_plugin, operation_name, status, migrated}`: each volume
//!   operation the reconcilers ran (`pkg/volume/util/metrics.go` `OperationCompleteHook`: status
//!   `success` or `fail-unknown`, the plugin as `GetFullQualifiedPluginNameForVolume` names it,
//!   `kubernetes.io/csi:<driver>`; operation names from `operation_generator.go`);
//! - `csi_operations_seconds{driver_name, method_name, grpc_status_code, migrated}`: each CSI call, as
//!   `pkg/volume/csi/csi_metrics.go`'s interceptor records it (`/csi.v1.Node/NodePublishVolume`, `OK`);
//! - `volume_manager_total_volumes{plugin_name, state}`: the volumes of the desired and actual states of
//!   world, per pod, counted at each scrape (`pkg/kubelet/volumemanager/metrics/metrics.go`);
//! - `kubelet_image_garbage_collected_total{reason}`: each image the image garbage collector removed, for its
//!   `age` or for `space` (`pkg/kubelet/metrics/metrics.go` ImageGarbageCollectedTotal);
//! - `rest_client_requests_total{code, method, host}`: with `--kubeconfig`, each request to the API
//!   server (`cluster/client_metrics.rs`);
//! - `process_*`.
//!
//! Nothing migrates here (no in-tree plugin is migrated to CSI), so `migrated` is always `false`.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use inlet_proto::csi_call::CsiCall;
use inlet_volume::Spec;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::node::Kubelet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    volume_plugin: String,
    operation_name: &'static str,
    status: &'static str,
    migrated: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CsiLabels {
    driver_name: String,
    method_name: String,
    grpc_status_code: String,
    migrated: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The process's storage metrics.
pub struct KubeletMetrics {
    operations: Histograms<OperationLabels>,
    csi: Histograms<CsiLabels>,
    images_collected: Family<ReasonLabels, Counter>,
}

/// The one set every node of this process records into.
pub static METRICS: LazyLock<KubeletMetrics> = LazyLock::new(|| KubeletMetrics {
    operations: Family::new_with_constructor(inlet_host::metrics::operation_histogram),
    csi: Family::new_with_constructor(inlet_host::metrics::operation_histogram),
    images_collected: Family::default(),
});

impl KubeletMetrics {
    /// A volume operation that ended.
    pub fn operation(&self, plugin: String, operation: &'static str, ok: bool, took: Duration) {
        let labels = OperationLabels {
            volume_plugin: plugin,
            operation_name: operation,
            status: if ok { "success" } else { "fail-unknown" },
            migrated: "false",
        };
        self.operations
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// An image the image garbage collector removed, for `reason`: `age` or `space`.
    pub fn image_collected(&self, reason: &'static str) {
        self.images_collected
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A CSI call that returned. The attach/detach controller's calls (ControllerPublish, made through
    /// the same client here) are not the kubelet's, and are left out.
    pub fn csi_call(&self, call: &CsiCall, took: Duration) {
        if call.method.starts_with("Controller") {
            return;
        }
        let labels = CsiLabels {
            driver_name: call.driver.clone(),
            method_name: format!("/csi.v1.{}/{}", csi_service(&call.method), call.method),
            // The report writes tonic's names. tonic reports its own deadline as `Cancelled` ("Timeout
            // expired", as `csi_call::rpc_error` reads it), where grpc-go says DeadlineExceeded; and it
            // spells Canceled differently.
            grpc_status_code: match (call.code.as_str(), call.message.as_str()) {
                ("Cancelled", "Timeout expired") => "DeadlineExceeded".to_string(),
                ("Cancelled", _) => "Canceled".to_string(),
                (code, _) => code.to_string(),
            },
            migrated: "false",
        };
        self.csi.get_or_create(&labels).observe(took.as_secs_f64());
    }
}

/// The CSI service a method belongs to.
fn csi_service(method: &str) -> &'static str {
    match method {
        "GetPluginInfo" | "GetPluginCapabilities" | "Probe" => "Identity",
        m if m.starts_with("Node") => "Node",
        _ => "Controller",
    }
}

/// The plugin as upstream's metrics name it (`GetFullQualifiedPluginNameForVolume`): a CSI volume's
/// plugin name with its driver, `kubernetes.io/csi:<driver>`.
pub fn plugin_label(plugin: &str, spec: &Spec) -> String {
    let driver = match spec {
        Spec::Inline { csi, .. } => csi.as_ref().map(|c| c.source.driver.as_str()),
        Spec::Persistent { pv, .. } => pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.driver.as_str()),
    };
    match driver {
        Some(driver) => format!("{plugin}:{driver}"),
        None => plugin.to_string(),
    }
}

/// A registry with the storage metrics, `volume_manager_total_volumes` over `nodes`, and `process_*`.
pub fn registry(nodes: Vec<Arc<Kubelet>>) -> Registry {
    let mut registry = Registry::default();
    inlet_host::metrics::process::register(&mut registry);
    registry.register(
        "storage_operation_duration_seconds",
        "Storage operation duration",
        METRICS.operations.clone(),
    );
    registry.register(
        "csi_operations_seconds",
        "Container Storage Interface operation duration with gRPC error code status total",
        METRICS.csi.clone(),
    );
    registry.register(
        "kubelet_image_garbage_collected",
        "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
        METRICS.images_collected.clone(),
    );
    registry.register_collector(Box::new(TotalVolumes(nodes)));
    crate::cluster::register_metrics(&mut registry);
    registry
}

struct TotalVolumes(Vec<Arc<Kubelet>>);

impl std::fmt::Debug for TotalVolumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TotalVolumes({} nodes)", self.0.len())
    }
}

impl Collector for TotalVolumes {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut counts: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        for node in &self.0 {
            for (key, count) in node.volumes.volume_counts() {
                *counts.entry(key).or_default() += count;
            }
        }
        let rows = counts.iter().map(|((plugin, state), count)| {
            let labels = [("plugin_name", plugin.as_str()), ("state", *state)];
            (labels, *count as i64)
        });
        inlet_host::metrics::encode_gauges(
            &mut encoder,
            "volume_manager_total_volumes",
            "Number of volumes in Volume Manager",
            rows,
        )
    }
}
