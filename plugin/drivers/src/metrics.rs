//! `inlet-plugin serve --metrics-address`: what the driver exposes to Prometheus.
//!
//! - `csi_operations_seconds{driver_name, method_name, grpc_status_code}`: every CSI call the driver
//!   answered, timed from its arrival to its answer, with the kubelet's (and the CSI sidecars') name,
//!   labels, label values and buckets (`pkg/volume/util/metrics.go`, csi-lib-utils `metrics.go`): the
//!   method as gRPC's full name (`/csi.v1.Node/NodePublishVolume`), the code as grpc-go prints it (`OK`).
//!   Recorded by [`CsiMetricsLayer`] around the tonic services, so a call the driver refuses before its
//!   code runs (an unknown method) is counted too.
//! - `inlet_volumes_published{driver_name, mode}`: targets published now, `ephemeral` (KEP-596 inline
//!   volumes) or `persistent` (PVs), read from the driver's records at each scrape.
//! - the image engine's pulls and KEP-2535 decisions (`inlet_image::metrics`), and `process_*`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `csi_operations_seconds`' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The driver's name.
    pub driver_name: String,
    /// `/csi.v1.<Service>/<Method>`, or `unknown-method` for a path that is not a CSI method.
    pub method_name: String,
    /// `OK`, `DeadlineExceeded`, ...
    pub grpc_status_code: String,
}

type Histograms = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// The driver's `csi_operations_seconds`: recorded into whether or not a registry exposes it.
#[derive(Clone, Debug)]
pub struct CsiMetrics {
    driver_name: Arc<str>,
    operations: Histograms,
}

impl CsiMetrics {
    /// The family for the driver `driver_name`.
    pub fn new(driver_name: &str) -> Self {
        Self {
            driver_name: driver_name.into(),
            operations: Family::new_with_constructor(inlet_host::metrics::operation_histogram),
        }
    }

    /// Exposes the family in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "csi_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            self.operations.clone(),
        );
    }

    fn labels(&self, method: &str, code: tonic::Code) -> OperationLabels {
        OperationLabels {
            driver_name: self.driver_name.to_string(),
            method_name: method_label(method).to_string(),
            grpc_status_code: inlet_host::metrics::grpc_code_name(code).to_string(),
        }
    }

    fn observe(&self, method: &str, code: tonic::Code, seconds: f64) {
        self.operations
            .get_or_create(&self.labels(method, code))
            .observe(seconds);
    }
}

/// Every CSI v1 method, by gRPC's full name. A label takes only these (or `unknown-method`): the path is
/// the caller's to choose, and a label's values must stay few.
const CSI_METHODS: [&str; 28] = [
    "/csi.v1.Identity/GetPluginInfo",
    "/csi.v1.Identity/GetPluginCapabilities",
    "/csi.v1.Identity/Probe",
    "/csi.v1.Controller/CreateVolume",
    "/csi.v1.Controller/DeleteVolume",
    "/csi.v1.Controller/ControllerPublishVolume",
    "/csi.v1.Controller/ControllerUnpublishVolume",
    "/csi.v1.Controller/ValidateVolumeCapabilities",
    "/csi.v1.Controller/ListVolumes",
    "/csi.v1.Controller/GetCapacity",
    "/csi.v1.Controller/ControllerGetCapabilities",
    "/csi.v1.Controller/CreateSnapshot",
    "/csi.v1.Controller/DeleteSnapshot",
    "/csi.v1.Controller/ListSnapshots",
    "/csi.v1.Controller/GetSnapshot",
    "/csi.v1.Controller/ControllerExpandVolume",
    "/csi.v1.Controller/ControllerGetVolume",
    "/csi.v1.Controller/ControllerModifyVolume",
    "/csi.v1.Node/NodeStageVolume",
    "/csi.v1.Node/NodeUnstageVolume",
    "/csi.v1.Node/NodePublishVolume",
    "/csi.v1.Node/NodeUnpublishVolume",
    "/csi.v1.Node/NodeGetVolumeStats",
    "/csi.v1.Node/NodeExpandVolume",
    "/csi.v1.Node/NodeGetCapabilities",
    "/csi.v1.Node/NodeGetInfo",
    "/csi.v1.GroupController/GroupControllerGetCapabilities",
    "/csi.v1.SnapshotMetadata/GetMetadataAllocated",
];

fn method_label(path: &str) -> &str {
    CSI_METHODS
        .iter()
        .find(|m| **m == path)
        .copied()
        .unwrap_or("unknown-method")
}

/// A tower layer timing each call into [`CsiMetrics`].
#[derive(Clone, Debug)]
pub struct CsiMetricsLayer(pub CsiMetrics);

impl<S> tower::Layer<S> for CsiMetricsLayer {
    type Service = Timed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Timed {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// [`CsiMetricsLayer`]'s service.
#[derive(Clone, Debug)]
pub struct Timed<S> {
    inner: S,
    metrics: CsiMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for Timed<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut pending = Pending {
            metrics: self.metrics.clone(),
            method: request.uri().path().to_string(),
            started: Instant::now(),
            deadline: request
                .headers()
                .get("grpc-timeout")
                .and_then(|v| grpc_timeout(v.to_str().ok()?)),
            answered: false,
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            pending.answered = true;
            // A unary call that fails is answered trailers-only: its status is in the headers. An answer
            // without one carries a message, and `OK` in its trailers.
            let code = match &answer {
                Ok(response) => response
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map_or(tonic::Code::Ok, tonic::Code::from_i32),
                Err(_) => tonic::Code::Unknown,
            };
            let seconds = pending.started.elapsed().as_secs_f64();
            pending.metrics.observe(&pending.method, code, seconds);
            answer
        })
    }
}

/// A call not answered yet. Dropped unanswered (tonic drops the call at its `grpc-timeout`, or when the
/// client goes away), it counts as `DeadlineExceeded` past its deadline, `Canceled` before: the calls an
/// operator most needs to see.
struct Pending {
    metrics: CsiMetrics,
    method: String,
    started: Instant,
    deadline: Option<std::time::Duration>,
    answered: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let elapsed = self.started.elapsed();
        let code = match self.deadline {
            Some(deadline) if elapsed >= deadline => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::Cancelled,
        };
        self.metrics
            .observe(&self.method, code, elapsed.as_secs_f64());
    }
}

/// gRPC's `grpc-timeout` header: digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn grpc_timeout(value: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A driver's published targets, each by mode (`ephemeral` or `persistent`), read at each scrape.
pub trait PublishedVolumes: Send + Sync + 'static {
    /// One mode per published target.
    fn published_modes(&self) -> Vec<&'static str>;
}

/// `inlet_volumes_published{driver_name, mode}`.
pub fn register_published<P: PublishedVolumes>(
    registry: &mut Registry,
    driver_name: &str,
    volumes: P,
) {
    registry.register_collector(Box::new(PublishedCollector {
        driver_name: driver_name.to_string(),
        volumes: Box::new(volumes),
    }));
}

struct PublishedCollector {
    driver_name: String,
    volumes: Box<dyn PublishedVolumes>,
}

impl std::fmt::Debug for PublishedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishedCollector")
            .field("driver_name", &self.driver_name)
            .finish()
    }
}

impl Collector for PublishedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let modes = self.volumes.published_modes();
        let rows = ["ephemeral", "persistent"].map(|mode| {
            let count = modes.iter().filter(|m| **m == mode).count();
            let labels = [("driver_name", self.driver_name.as_str()), ("mode", mode)];
            (labels, count as i64)
        });
        inlet_host::metrics::encode_gauges(
            &mut encoder,
            "inlet_volumes_published",
            "Volume targets the driver has published now, by mode: ephemeral (CSI inline) or persistent (PV).",
            rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_in_their_units() {
        use std::time::Duration;
        assert_eq!(grpc_timeout("120S"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(grpc_timeout("99m"), Some(Duration::from_millis(99)));
        assert_eq!(grpc_timeout("5x"), None);
        assert_eq!(grpc_timeout(""), None);
    }

    #[test]
    fn a_call_dropped_unanswered_counts_by_its_deadline() {
        let metrics = CsiMetrics::new("local.inlet.dev");
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        for deadline in [Some(std::time::Duration::ZERO), None] {
            drop(Pending {
                metrics: metrics.clone(),
                method: "/csi.v1.Node/NodePublishVolume".into(),
                started: Instant::now(),
                deadline,
                answered: false,
            });
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for code in ["DeadlineExceeded", "Canceled"] {
            let line = format!(
                "csi_operations_seconds_count{{driver_name=\"local.inlet.dev\",method_name=\"/csi.v1.Node/NodePublishVolume\",grpc_status_code=\"{code}\"}} 1"
            );
            assert!(text.contains(&line), "{code}: {text}");
        }
    }
}
